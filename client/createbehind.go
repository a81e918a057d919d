package client

import (
	"context"
	"errors"
	"sync"
	"syscall"
	"time"

	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/internal/posixacl"
	"github.com/leasefs/leasefs/wire"
)

// Creates behind the caller. Under the X lock of a directory whose entries
// it knows, a mount makes a new regular file in its cache at once (with an
// inode number the server handed it ahead, OpAllocInos), opens it, takes
// the new file's X lock itself (nobody else can know the file yet) and
// returns; the create (wire.CreateIno) goes to the server behind the
// caller, in the same per-directory queue and batches as removals, so that
// it stays in order with them. It waits there a little (createHold): the
// close of a small file just written sends its data in the create's batch.
// Until it is there, whatever could observe
// the file waits for it like for a removal (behind.go): any request naming
// the directory or the new inode (the flush of the data written to it,
// above all), a lookup of the name, a revocation of either lock, fsync,
// unmount. A server in a cluster hands out no numbers (a new inode's owner
// acquires it as it makes it): there creates wait for the server.

// inoRange is how many numbers a mount asks for at a time; it asks again
// when fewer than a quarter are left.
const inoRange = 256

// inoPool holds the inode numbers the server handed this mount.
type inoPool struct {
	mu        sync.Mutex
	ranges    [][2]ids.Ino // [first, end): one, or two while a refill arrived early
	refilling bool
	refused   bool // the server hands out none
}

// takeIno returns a number the server handed out, or false.
func (b *behind) takeIno() (ids.Ino, bool) {
	p := &b.numbers
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.refused {
		return 0, false
	}
	left := 0
	for _, r := range p.ranges {
		left += int(r[1] - r[0])
	}
	if left < inoRange/4 {
		b.askInosLocked()
	}
	if left == 0 {
		return 0, false
	}
	r := &p.ranges[0]
	ino := r[0]
	if r[0]++; r[0] == r[1] {
		p.ranges = p.ranges[1:]
	}
	return ino, true
}

// resetInos forgets the numbers handed out so far and asks again, after a
// lost session: the server may have restarted as another kind (a cluster
// member hands out none, and takes no create with one).
func (b *behind) resetInos() {
	p := &b.numbers
	p.mu.Lock()
	defer p.mu.Unlock()
	p.ranges, p.refused = nil, false
	b.askInosLocked()
}

// askInos asks the server for more numbers unless that is under way.
func (b *behind) askInos() {
	b.numbers.mu.Lock()
	b.askInosLocked()
	b.numbers.mu.Unlock()
}

// askInosLocked asks the server for more numbers unless that is under way;
// called with b.numbers.mu held.
func (b *behind) askInosLocked() {
	if !b.numbers.refilling {
		b.numbers.refilling = true
		go b.refillInos()
	}
}

func (b *behind) refillInos() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rep, err := b.c.Call(ctx, &wire.Request{Op: wire.OpAllocInos, Size: inoRange})
	var first ids.Ino
	var n uint32
	if err == nil {
		first, n, err = wire.ParseInoRange(rep.Data)
	}
	p := &b.numbers
	p.mu.Lock()
	defer p.mu.Unlock()
	p.refilling = false
	switch {
	case errors.Is(err, wire.Err(wire.CodeInvalid)), errors.Is(err, wire.Err(wire.CodeBadMessage)):
		// a cluster, or a server older than OpAllocInos
		p.refused = true
		b.c.log.Info("the server hands out no inode numbers; creates wait for it", "err", err)
	case err != nil:
		b.c.log.Debug("asking for inode numbers", "err", err) // asked again at the next create
	default:
		p.ranges = append(p.ranges, [2]ids.Ino{first, first + ids.Ino(n)})
	}
}

// create makes parent/name, a regular file, in the cache and opens
// it, and sends the create behind the caller, if the client holds parent's
// X lock, knows the name is free and that parent has no default ACL (the
// new file's mode is then the creator's less umask, and it inherits no
// ACL), and has an inode number; false if the create must be sent and
// waited for. It fails only if ctx ends while it waits for a slot.
func (b *behind) create(ctx context.Context, parent ids.Ino, name string, mode, umask, uid, gid uint32) (*wire.Attr, bool, error) {
	if t := mode & syscall.S_IFMT; t != 0 && t != syscall.S_IFREG || len(name) > 255 /* NAME_MAX: the server's error then */ ||
		b.c.spaceShort() {
		return nil, false, nil
	}
	if err := b.opWait(ctx, b.reserve); err != nil {
		return nil, false, err
	}
	b.c.mu.Lock()
	pmode, _ := b.c.cache.Mode(parent)
	cur, known := b.c.cache.Entry(parent, name)
	dir, cached := b.c.cache.Attr(parent)
	var ino ids.Ino
	def, defKnown := b.c.cache.Xattr(parent, posixacl.DefaultName)
	ok := pmode == wire.LockExclusive && b.c.leasesValid(b.c.clk.Now()) && known && cur == 0 && cached &&
		defKnown && def == nil
	if ok {
		ino, ok = b.takeIno() // last: a number taken is used
	}
	if !ok {
		b.c.mu.Unlock()
		b.unreserve()
		return nil, false, nil
	}
	// what the server will make of it (Store.CreateAs), times included:
	// the request carries them
	t := time.Now().UnixNano()
	a := &wire.Attr{Ino: ino, Mode: syscall.S_IFREG | mode&^syscall.S_IFMT&^(umask&0o777), Nlink: 1, Uid: uid, Gid: gid,
		Atime: t, Mtime: t, Ctime: t}
	if dir.Mode&syscall.S_ISGID != 0 {
		a.Gid = dir.Gid // BSD group semantics of setgid directories
	}
	b.c.cache.Predict(parent, func(dir *wire.Attr) { dir.Mtime, dir.Ctime = t, t })
	// The X lock is the client's from here; the server grants it (with a
	// sequence number) in the create's reply.
	b.c.cache.Granted(wire.Grant{Ino: ino, Mode: wire.LockExclusive})
	b.c.takeEvictedLocked() // a grant may push another lock out
	b.c.cache.SetAttr(a)
	b.c.cache.SetNoXattrs(ino) // new: the kernel's security.capability questions need no server
	b.c.cache.OpenLocally(ino)
	b.c.cache.SetEntry(parent, name, ino)
	b.start(parent, ino, name)
	b.c.Counters.CreatedBehind.Add(1)
	b.c.mu.Unlock()
	b.queue(parent, &wire.Request{Op: wire.OpCreate, Parent: parent, Name: name, Ino: ino, Mode: a.Mode,
		Umask: umask, Uid: uid, Gid: gid, Mtime: t, Flags: wire.CreateOpen | wire.CreateIno}, true)
	cp := *a
	return &cp, true, nil
}
