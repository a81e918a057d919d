package client

import (
	"cmp"
	"context"
	"syscall"
	"time"

	"github.com/leasefs/leasefs/cache"
	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/internal/posixacl"
	"github.com/leasefs/leasefs/wire"
)

func (c *Client) attrCall(ctx context.Context, req *wire.Request) (*wire.Attr, error) {
	rep, err := c.Call(ctx, req)
	if err != nil {
		return nil, err
	}
	if rep.Attr == nil {
		return nil, wire.Errf(wire.CodeIO, "%v reply without attributes", req.Op)
	}
	return c.newest(rep.Attr), nil
}

// newest is what the kernel gets of attributes a reply carried: the
// cache's if newer (cache.Newest), with this mount's buffered changes.
func (c *Client) newest(a *wire.Attr) *wire.Attr {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cache.Newest(a)
}

// unsent reports whether ino has changes of this mount that the server
// may not have and that no cached attributes account for: sent behind the
// caller and not yet there, or buffered while a recovery dropped the
// cache.
func (c *Client) unsent(ino ids.Ino) bool {
	if c.behind.busy(ino) {
		return true
	}
	if !c.wb.holds(ino) {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cache.LocalFields(ino) == 0
}

// Lookup finds name in parent, from the cache when locks cover the entry
// and the child's attributes.
func (c *Client) Lookup(ctx context.Context, parent ids.Ino, name string) (*wire.Attr, error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	if attr, negative, ok := c.lookupCached(parent, name); ok {
		if negative {
			return nil, wire.Err(wire.CodeNotFound)
		}
		return attr, nil
	}
	for attempt := 0; ; attempt++ {
		rep, err := c.call(ctx, &wire.Request{Op: wire.OpLookup, Parent: parent, Name: name},
			func(ch *cache.Cache, rep *wire.Reply) {
				switch {
				case rep.Code == wire.CodeOK && rep.Attr != nil:
					ch.SetEntry(parent, name, rep.Attr.Ino)
				case rep.Code == wire.CodeNotFound:
					ch.SetEntry(parent, name, 0)
				}
			})
		if err != nil {
			return nil, err
		}
		if rep.Attr == nil {
			return nil, wire.Errf(wire.CodeIO, "lookup reply without attributes")
		}
		// The name does not say which inode it is, so the request
		// could not wait for that inode's changes sent behind (removals
		// in a directory, one link of a file) as a request naming it
		// does: what the server said may lack them. Send them, ask again.
		if ino := rep.Attr.Ino; attempt < 2 && c.unsent(ino) {
			if err := c.behind.opWait(ctx, func(ctx context.Context) error { return c.behind.wait(ctx, ino) }); err != nil {
				return nil, err
			}
			if err := c.Flush(ctx, ino); err != nil {
				return nil, err
			}
			continue
		}
		return c.newest(rep.Attr), nil
	}
}

// lookupCached is Lookup from the cache only; ok is false if the cache
// cannot tell.
func (c *Client) lookupCached(parent ids.Ino, name string) (attr *wire.Attr, negative, ok bool) {
	ok = c.cached(func(ch *cache.Cache) bool {
		child, known := ch.Entry(parent, name)
		if !known {
			return false
		}
		if child == 0 {
			negative = true
			return true
		}
		attr, known = ch.Attr(child)
		return known
	})
	return attr, negative, ok
}

// GetAttr returns an inode's attributes, from the cache under a lock.
func (c *Client) GetAttr(ctx context.Context, ino ids.Ino) (*wire.Attr, error) {
	var attr *wire.Attr
	if c.cached(func(ch *cache.Cache) bool {
		var ok bool
		attr, ok = ch.Attr(ino)
		return ok
	}) {
		return attr, nil
	}
	// what this client buffered first (a lock evicted, a lease lapsed):
	// the server's attributes lack it
	if err := c.Flush(ctx, ino); err != nil {
		return nil, err
	}
	return c.attrCall(ctx, &wire.Request{Op: wire.OpGetAttr, Ino: ino})
}

// withCache runs fn on the cache under the client's lock.
func (c *Client) withCache(fn func(*cache.Cache)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	fn(c.cache)
}

// forget drops cached attributes of inodes an operation changed and, for
// directories, their entries: the fallback when the outcome is unknown.
func (c *Client) forget(inos ...ids.Ino) {
	c.withCache(func(ch *cache.Cache) {
		for _, ino := range inos {
			ch.InvalidateDir(ino)
		}
	})
}

// entryChanged records, under the X lock the reply granted on dir, that
// dir/name now names child (0: nothing) and that dir's times changed: to
// dirAttr, the attributes the server read after the change, if it sent
// them.
func entryChanged(ch *cache.Cache, dir ids.Ino, name string, child ids.Ino, dirAttr *wire.Attr) {
	if dirAttr != nil && dirAttr.Ino == dir {
		ch.SetAttr(dirAttr)
	} else {
		ch.InvalidateAttr(dir)
	}
	ch.SetEntry(dir, name, child)
}

// createCall runs a create-like request and caches the new entry.
func (c *Client) createCall(ctx context.Context, req *wire.Request) (*wire.Attr, error) {
	if err := checkName(req.Name); err != nil {
		return nil, err
	}
	openedLocally := false
	rep, err := c.call(ctx, req, func(ch *cache.Cache, rep *wire.Reply) {
		if rep.Code == wire.CodeOK && rep.Attr != nil {
			if req.Flags&wire.CreateOpen != 0 && grants(rep, rep.Attr.Ino) {
				_, openedLocally = ch.OpenLocally(rep.Attr.Ino)
			}
			entryChanged(ch, req.Parent, req.Name, rep.Attr.Ino, rep.Attr2)
			if rep.Flags&wire.DirNoDefaultACL != 0 {
				ch.SetXattr(req.Parent, posixacl.DefaultName, nil)
				// new, inheriting no ACL, and ours under X: the
				// kernel asks for security.capability before each
				// write, and need not ask the server
				ch.SetNoXattrs(rep.Attr.Ino)
			}
			if req.Op == wire.OpMkdir {
				ch.MarkComplete(rep.Attr.Ino) // empty, and ours under X
			}
		}
	})
	if err != nil {
		c.forget(req.Parent)
		return nil, err
	}
	if rep.Attr == nil {
		return nil, wire.Errf(wire.CodeIO, "%v reply without attributes", req.Op)
	}
	if req.Flags&wire.CreateOpen != 0 && grants(rep, rep.Attr.Ino) && !openedLocally {
		// The server left counting the open to us, but a revocation
		// overtook the grant: the server must count it after all.
		if _, err := c.Call(ctx, &wire.Request{Op: wire.OpOpen, Ino: rep.Attr.Ino}); err != nil {
			return nil, err
		}
	}
	return rep.Attr, nil
}

// grants reports whether rep grants a lock on ino.
func grants(rep *wire.Reply, ino ids.Ino) bool {
	for _, g := range rep.Grants {
		if g.Ino == ino {
			return true
		}
	}
	return false
}

// SetAttr changes attributes; req carries Valid and the values. A change
// of mode, owner or times is buffered like a write under an X lock.
func (c *Client) SetAttr(ctx context.Context, req *wire.Request) (*wire.Attr, error) {
	if req.Valid&wire.SetSize != 0 && req.Size > wire.MaxFileSize {
		return nil, wire.Errf(wire.CodeTooBig, "size %d: files end at %d", req.Size, uint64(wire.MaxFileSize))
	}
	if req.Valid != 0 && req.Valid&^bufferedAttrs == 0 {
		if a, err := c.wb.bufferAttr(ctx, req); a != nil || err != nil {
			return a, err
		}
	}
	if err := c.Flush(ctx, req.Ino); err != nil {
		return nil, err
	}
	req.Op = wire.OpSetAttr
	if req.Valid&wire.SetSize != 0 {
		defer c.changingData(req.Ino)()
	}
	if req.Valid&wire.SetMode != 0 {
		defer c.withCache(func(ch *cache.Cache) { ch.ModeChanged(req.Ino) }) // an access ACL follows the mode
	}
	return c.attrCall(ctx, req)
}

// Create makes a regular file, device, fifo or socket. Mode comes
// without umask applied: the server applies it where parent has no default
// ACL, and the default ACL's instead where it has one (wire.Request.Umask).
func (c *Client) Create(ctx context.Context, parent ids.Ino, name string, mode, umask, uid, gid, rdev uint32) (*wire.Attr, error) {
	return c.createCall(ctx, &wire.Request{Op: wire.OpCreate, Parent: parent, Name: name, Mode: mode, Umask: umask,
		Uid: uid, Gid: gid, Rdev: rdev})
}

// CreateOpen makes a regular file and opens it in one round trip (mode
// and umask as Create); the caller releases it like any opened file.
func (c *Client) CreateOpen(ctx context.Context, parent ids.Ino, name string, mode, umask, uid, gid uint32) (*wire.Attr, error) {
	if a, ok, err := c.behind.create(ctx, parent, name, mode, umask, uid, gid); ok || err != nil {
		return a, err
	}
	return c.createCall(ctx, &wire.Request{Op: wire.OpCreate, Parent: parent, Name: name, Mode: mode, Umask: umask,
		Uid: uid, Gid: gid, Flags: wire.CreateOpen})
}

// Mkdir makes a directory (mode and umask as Create).
func (c *Client) Mkdir(ctx context.Context, parent ids.Ino, name string, mode, umask, uid, gid uint32) (*wire.Attr, error) {
	return c.createCall(ctx, &wire.Request{Op: wire.OpMkdir, Parent: parent, Name: name, Mode: mode, Umask: umask,
		Uid: uid, Gid: gid})
}

// Symlink makes a symbolic link.
func (c *Client) Symlink(ctx context.Context, parent ids.Ino, name, target string, uid, gid uint32) (*wire.Attr, error) {
	return c.createCall(ctx, &wire.Request{Op: wire.OpSymlink, Parent: parent, Name: name, Target: target, Uid: uid, Gid: gid})
}

// Readlink returns a symlink's target.
func (c *Client) Readlink(ctx context.Context, ino ids.Ino) (string, error) {
	rep, err := c.Call(ctx, &wire.Request{Op: wire.OpReadlink, Ino: ino})
	if err != nil {
		return "", err
	}
	return string(rep.Data), nil
}

// Link adds a hard link to ino.
func (c *Client) Link(ctx context.Context, ino, newParent ids.Ino, name string) (*wire.Attr, error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	rep, err := c.call(ctx, &wire.Request{Op: wire.OpLink, Ino: ino, NewPar: newParent, Name: name},
		func(ch *cache.Cache, rep *wire.Reply) {
			if rep.Code == wire.CodeOK {
				entryChanged(ch, newParent, name, ino, rep.Attr2)
			}
		})
	if err != nil {
		c.forget(ino, newParent)
		return nil, err
	}
	if rep.Attr == nil {
		c.forget(ino)
		return nil, wire.Errf(wire.CodeIO, "link reply without attributes")
	}
	// the file's attributes after the link, cached with the reply's grant
	return c.newest(rep.Attr), nil
}

// Unlink removes a non-directory entry.
func (c *Client) Unlink(ctx context.Context, parent ids.Ino, name string) error {
	if err := checkName(name); err != nil {
		return err
	}
	child, _ := c.Lookup(ctx, parent, name)
	if child != nil {
		if ok, err := c.behind.remove(ctx, parent, name, child, wire.OpUnlink); ok || err != nil {
			return err
		}
	}
	req := &wire.Request{Op: wire.OpUnlink, Parent: parent, Name: name}
	if child != nil {
		defer c.removing(req, child.Ino)()
	}
	_, err := c.call(ctx, req,
		func(ch *cache.Cache, rep *wire.Reply) {
			if rep.Code == wire.CodeOK {
				entryChanged(ch, parent, name, 0, rep.Attr2)
			}
		})
	if err != nil {
		c.forget(parent)
	}
	if child != nil {
		c.forget(child.Ino) // its link count changed
	}
	return err
}

// removing makes req, which may remove ino's last link, tell the server of
// the handles this client opened on ino locally, and opens none until the
// function it returns is called.
func (c *Client) removing(req *wire.Request, ino ids.Ino) func() {
	c.mu.Lock()
	defer c.mu.Unlock()
	req.Ino, req.Opens = ino, c.cache.BeginRemove(ino)
	return func() {
		c.mu.Lock()
		c.cache.EndRemove(ino)
		c.mu.Unlock()
	}
}

// Rmdir removes an empty directory.
func (c *Client) Rmdir(ctx context.Context, parent ids.Ino, name string) error {
	if err := checkName(name); err != nil {
		return err
	}
	req := &wire.Request{Op: wire.OpRmdir, Parent: parent, Name: name}
	if child, _, ok := c.lookupCached(parent, name); ok && child != nil {
		if ok, err := c.behind.remove(ctx, parent, name, child, wire.OpRmdir); ok || err != nil {
			return err
		}
		req.Ino = child.Ino // waits for the removals sent behind in it
	} else if err := c.behind.opWait(ctx, c.behind.waitAll); err != nil {
		return err // which directory it is, the cache cannot tell: all
	}
	_, err := c.call(ctx, req,
		func(ch *cache.Cache, rep *wire.Reply) {
			if rep.Code == wire.CodeOK {
				entryChanged(ch, parent, name, 0, rep.Attr2)
			}
		})
	if err != nil {
		c.forget(parent)
	}
	return err
}

// Rename moves an entry, replacing an existing target as POSIX says.
func (c *Client) Rename(ctx context.Context, parent ids.Ino, name string, newParent ids.Ino, newName string, flags uint32) error {
	if err := cmp.Or(checkName(name), checkName(newName)); err != nil {
		return err
	}
	moved, _ := c.Lookup(ctx, parent, name)
	target, _ := c.Lookup(ctx, newParent, newName)
	const renameExchange = 2 // RENAME_EXCHANGE
	req := &wire.Request{Op: wire.OpRename, Parent: parent, Name: name, NewPar: newParent, NewName: newName, Flags: flags}
	if target != nil && flags&renameExchange == 0 {
		defer c.removing(req, target.Ino)()
	}
	_, err := c.call(ctx, req,
		func(ch *cache.Cache, rep *wire.Reply) {
			if rep.Code != wire.CodeOK {
				return
			}
			if moved == nil || (flags&renameExchange != 0 && target == nil) {
				ch.InvalidateDir(parent)
				ch.InvalidateDir(newParent)
				return
			}
			var back ids.Ino // what the old name names afterwards
			if flags&renameExchange != 0 {
				back = target.Ino
			}
			entryChanged(ch, parent, name, back, nil)
			entryChanged(ch, newParent, newName, moved.Ino, nil)
		})
	if err != nil {
		c.forget(parent, newParent)
	}
	for _, a := range []*wire.Attr{moved, target} {
		if a != nil {
			c.forget(a.Ino) // ctime, link count, a directory's ".."
		}
	}
	return err
}

// CachedListing returns every entry of dir from the cache (cache.Listing),
// if it holds them all: under the directory's lock nobody else can change
// them, and this client's own changes are in the cache at once.
func (c *Client) CachedListing(dir ids.Ino) ([]wire.DirEntry, bool) {
	var ents []wire.DirEntry
	ok := c.cached(func(ch *cache.Cache) bool {
		var ok bool
		ents, ok = ch.Listing(dir)
		return ok
	})
	return ents, ok
}

// ListingByName returns every entry of dir in name order: from the cache
// (CachedListing), or else the server's whole listing, sorted.
func (c *Client) ListingByName(ctx context.Context, dir ids.Ino) ([]wire.DirEntry, error) {
	if ents, ok := c.CachedListing(dir); ok {
		return ents, nil
	}
	var all []wire.DirEntry
	for after := uint64(0); ; {
		ents, err := c.ReadDir(ctx, dir, after, ReadDirPage)
		if err != nil {
			return nil, err
		}
		all = append(all, ents...)
		if len(ents) < ReadDirPage {
			wire.SortByName(all)
			return all, nil
		}
		after = ents[len(ents)-1].Off
	}
}

// ReadDirPage is how many entries one listing request asks for.
const ReadDirPage = 512

// ReadDir lists at most max entries of dir after cookie after, in cookie
// order; fewer only at the end.
func (c *Client) ReadDir(ctx context.Context, dir ids.Ino, after uint64, max int) ([]wire.DirEntry, error) {
	rep, err := c.Call(ctx, &wire.Request{Op: wire.OpReadDir, Ino: dir, Off: after, Size: uint64(max)})
	if err != nil {
		return nil, err
	}
	return rep.Entries, nil
}

// Open opens ino. The server counts open handles (so an unlinked open
// file keeps its data), but need not hear of an open made under a lock the
// client holds: nobody can remove the file without revoking the lock, and
// the client reports such opens when it gives the lock up
// (cache.OpenLocally).
func (c *Client) Open(ctx context.Context, ino ids.Ino, flags uint32) (*wire.Attr, error) {
	if flags&syscall.O_TRUNC == 0 {
		var a *wire.Attr
		if c.cached(func(ch *cache.Cache) (ok bool) {
			a, ok = ch.OpenLocally(ino)
			return ok
		}) {
			return a, nil
		}
	} else {
		// what this client buffered came before the truncation
		if err := c.Flush(ctx, ino); err != nil {
			return nil, err
		}
		defer c.changingData(ino)()
	}
	return c.attrCall(ctx, &wire.Request{Op: wire.OpOpen, Ino: ino, Flags: flags})
}

// Release drops an open handle.
func (c *Client) Release(ctx context.Context, ino ids.Ino) error {
	c.mu.Lock()
	local := c.cache.CloseLocally(ino)
	c.mu.Unlock()
	if local {
		return nil
	}
	_, err := c.Call(ctx, &wire.Request{Op: wire.OpRelease, Ino: ino})
	return err
}

// Read reads into buf the bytes at off, fewer at the end of the file, after
// sending this client's buffered writes of the file, and returns how many.
func (c *Client) Read(ctx context.Context, ino ids.Ino, off uint64, buf []byte) (int, error) {
	n, _, err := c.read(ctx, ino, off, buf, c.Flush)
	return n, err
}

// readInfo is what read tells besides the data (ReadPage).
type readInfo struct {
	cached  bool   // from the cache: under a lock the client holds
	grant   uint64 // else the sequence number of the grant the server read it under (0: none)
	version uint64 // the file's version the data is of (0: unknown)
}

// read is Read after flush (what of the client's writes the server must
// have first).
func (c *Client) read(ctx context.Context, ino ids.Ino, off uint64, buf []byte,
	flush func(context.Context, ids.Ino) error) (n int, info readInfo, _ error) {
	// The generation before the flush: a write buffered after it (not in
	// what the server returns) makes the fetched data uncacheable.
	var gen uint64
	c.withCache(func(ch *cache.Cache) { gen = ch.DataGen() })
	if err := flush(ctx, ino); err != nil {
		return 0, info, err
	}
	fromCache := func() bool {
		return c.cached(func(ch *cache.Cache) bool {
			var ok bool
			if n, ok = ch.ReadData(ino, off, buf); ok {
				if a, known := ch.Attr(ino); known {
					info.version = a.Version
				}
			}
			return ok
		})
	}
	fromPrefetch := func() (ok bool) {
		n, info.version, ok = c.ra.take(ino, off, buf)
		return ok
	}
	if fromCache() || c.ra.wait(ctx, ino, off) && (fromCache() || fromPrefetch()) {
		c.ra.readDone(ino, off, n)
		info.cached = true
		return n, info, nil
	}
	// Whole pages, so that what comes back can be cached.
	size := uint64(len(buf))
	start := off &^ (cache.PageSize - 1)
	end := (off + size + cache.PageSize - 1) &^ (cache.PageSize - 1)
	if c.readAround(ino) {
		start = off &^ (readAroundSize - 1)
		end = max(end, start+readAroundSize)
	}
	f, err := c.fetch(ctx, ino, start, end, gen, true)
	if err != nil {
		return 0, readInfo{}, err
	}
	n = copy(buf, f.data[min(off-start, uint64(len(f.data))):])
	f.recycle() // the cache and buf have their copies
	info.grant, info.version, info.cached = f.info.grant, f.info.version, f.info.cached
	c.ra.readDone(ino, off, n)
	return n, info, nil
}

// readAroundSize is what a read missing the cache fetches at least: the
// server's chunk, which the server reads whole for any part of it.
const readAroundSize = 64 << 10

// readAround reports whether a read of ino that missed the cache should
// fetch the whole aligned readAroundSize around it: when the file fits in
// half the data cache, so that random reads of it soon hit the cache. (Of
// a larger file, the pages around a random read would be evicted before
// their turn came.)
func (c *Client) readAround(ino ids.Ino) bool {
	var a *wire.Attr
	c.withCache(func(ch *cache.Cache) { a, _ = ch.Attr(ino) })
	return a != nil && c.cfg.CacheBytes > 0 && int64(a.Size) <= c.cfg.CacheBytes/2
}

// Fsync returns once everything written so far is durable on the server.
func (c *Client) Fsync(ctx context.Context, ino ids.Ino) error {
	if err := c.Flush(ctx, ino); err != nil {
		return err
	}
	_, err := c.Call(ctx, &wire.Request{Op: wire.OpFsync, Ino: ino})
	return err
}

// Seek is lseek's SEEK_DATA or SEEK_HOLE (wire.SeekData, wire.SeekHole)
// from off in ino, after sending this client's buffered writes of the
// file, so that the server's answer covers them: ENXIO (wire.CodeNXIO)
// at or past the end of the file, or when no data follows off.
func (c *Client) Seek(ctx context.Context, ino ids.Ino, off uint64, whence uint32) (uint64, error) {
	if err := c.Flush(ctx, ino); err != nil {
		return 0, err
	}
	rep, err := c.Call(ctx, &wire.Request{Op: wire.OpSeek, Ino: ino, Off: off, Flags: whence})
	if err != nil {
		return 0, err
	}
	return wire.ParseOffset(rep.Data)
}

// Punch is fallocate's PUNCH_HOLE or ZERO_RANGE (flags: wire.PunchHole,
// wire.PunchZeroRange, wire.PunchKeepSize) of length bytes from off in
// ino. This client's buffered writes of the file go first, lest they land
// on the zeros later, and its cached pages of the file go with the change.
// A range longer than wire.MaxPunch goes in pieces, each applied once.
func (c *Client) Punch(ctx context.Context, ino ids.Ino, off, length uint64, flags uint32) (*wire.Attr, error) {
	if err := c.Flush(ctx, ino); err != nil {
		return nil, err
	}
	defer c.changingData(ino)()
	var a *wire.Attr
	for pos, end := off, off+length; pos < end || a == nil; {
		n := min(end-pos, wire.MaxPunch)
		if a != nil && pos >= a.Size {
			if flags&wire.PunchKeepSize != 0 {
				break
			}
			n = end - pos // past the end: the server only grows the file
		}
		var err error
		a, err = c.attrCall(ctx, &wire.Request{Op: wire.OpPunch, Ino: ino, Off: pos, Size: n, Flags: flags})
		if err != nil {
			return nil, err
		}
		pos += n
	}
	return a, nil
}

// GetXattr returns an extended attribute's value, from the cache under a
// lock (its absence too: the kernel asks for security.selinux and
// system.posix_acl_access at every ls -l).
func (c *Client) GetXattr(ctx context.Context, ino ids.Ino, name string) ([]byte, error) {
	if err := checkXattrName(name); err != nil {
		return nil, err
	}
	var v []byte
	if c.cached(func(ch *cache.Cache) (ok bool) {
		v, ok = ch.Xattr(ino, name)
		return ok
	}) {
		if v == nil {
			return nil, wire.Err(wire.CodeNoData)
		}
		return v, nil
	}
	switch name {
	case cache.ACLAccess:
		// the server's access ACL follows the mode: a chmod this mount
		// holds back goes first
		if err := c.flushMode(ctx, ino); err != nil {
			return nil, err
		}
	case cache.Capability:
		// a write this mount holds back drops the file's capabilities
		// when it reaches the server: it goes first
		if err := c.Flush(ctx, ino); err != nil {
			return nil, err
		}
	}
	rep, err := c.call(ctx, &wire.Request{Op: wire.OpGetXattr, Ino: ino, Name: name}, func(ch *cache.Cache, rep *wire.Reply) {
		switch rep.Code {
		case wire.CodeOK:
			ch.SetXattr(ino, name, rep.Data)
		case wire.CodeNoData:
			ch.SetXattr(ino, name, nil)
		}
	})
	if err != nil {
		return nil, err
	}
	return rep.Data, nil
}

// flushMode sends ino's buffered mode change, if any.
func (c *Client) flushMode(ctx context.Context, ino ids.Ino) error {
	var buffered bool
	c.withCache(func(ch *cache.Cache) { buffered = ch.LocalFields(ino)&wire.SetMode != 0 })
	if !buffered {
		return nil
	}
	return c.Flush(ctx, ino)
}

// SetXattr sets an extended attribute, after this mount's buffered changes
// of the inode (the server applies them in the order they were made).
func (c *Client) SetXattr(ctx context.Context, ino ids.Ino, name string, value []byte, flags uint32) error {
	if err := checkXattrName(name); err != nil {
		return err
	}
	if err := c.Flush(ctx, ino); err != nil {
		return err
	}
	defer c.xattrChanged(ino)
	_, err := c.Call(ctx, &wire.Request{Op: wire.OpSetXattr, Ino: ino, Name: name, Data: value, Flags: flags})
	return err
}

// xattrChanged drops ino's cached extended attributes and attributes
// after this mount changed one (with POSIX ACLs, the mode may follow),
// whatever the outcome.
func (c *Client) xattrChanged(ino ids.Ino) {
	c.withCache(func(ch *cache.Cache) {
		ch.DropXattrs(ino)
		ch.InvalidateAttr(ino)
	})
}

// ListXattr lists extended attribute names, from the cache under a lock.
func (c *Client) ListXattr(ctx context.Context, ino ids.Ino) ([]string, error) {
	var names []string
	if c.cached(func(ch *cache.Cache) (ok bool) {
		names, ok = ch.XattrNames(ino)
		return ok
	}) {
		return names, nil
	}
	rep, err := c.call(ctx, &wire.Request{Op: wire.OpListXattr, Ino: ino}, func(ch *cache.Cache, rep *wire.Reply) {
		if rep.Code == wire.CodeOK {
			ch.SetXattrNames(ino, rep.Names)
		}
	})
	if err != nil {
		return nil, err
	}
	return rep.Names, nil
}

// RemoveXattr removes an extended attribute, after this mount's buffered
// changes of the inode.
func (c *Client) RemoveXattr(ctx context.Context, ino ids.Ino, name string) error {
	if err := checkXattrName(name); err != nil {
		return err
	}
	if err := c.Flush(ctx, ino); err != nil {
		return err
	}
	defer c.xattrChanged(ino)
	_, err := c.Call(ctx, &wire.Request{Op: wire.OpRemoveXattr, Ino: ino, Name: name})
	return err
}

// PosixLock sets, tests or waits for a POSIX advisory lock.
func (c *Client) PosixLock(ctx context.Context, ino ids.Ino, lk wire.PosixLk) (*wire.PosixLk, error) {
	rep, err := c.Call(ctx, &wire.Request{Op: wire.OpPosixLock, Ino: ino, Lk: lk})
	if err != nil {
		return nil, err
	}
	return rep.Lk, nil
}

// ReleaseLockOwner drops every POSIX and flock lock of owner on ino.
func (c *Client) ReleaseLockOwner(ctx context.Context, ino ids.Ino, owner uint64) error {
	_, err := c.Call(ctx, &wire.Request{Op: wire.OpPosixLock, Ino: ino, Flags: wire.PosixReleaseOwner, Lk: wire.PosixLk{Owner: owner}})
	return err
}

// KernelTTL is how long the kernel may keep names and attributes the
// client gave it under a lock. It is long because nothing waits for it to
// run out: a revocation drops them at once (Invalidate), and a lease about
// to lapse drops them all (kernelLoop, Hooks.DropKernel). It bounds only
// how long a stopped mount process (SIGSTOP, a debugger) leaves its
// kernel answering stat and path lookups from what it cached.
const KernelTTL = 10 * time.Minute

// AttrTTL is how long the kernel may cache ino's attributes (and the names
// of a directory ino): KernelTTL while the client holds a lock on ino and
// its leases are not in their renewal margin, else zero. A reply handed out
// with a TTL reaches the kernel well before kernelLoop could drop the
// kernel's caches for a lapsing lease, at half the margin. (The kernel
// itself discards attributes that a concurrent invalidation overtook:
// FUSE's attr_version; and names looked up before an epoch bump.)
func (c *Client) AttrTTL(ino ids.Ino) time.Duration {
	var ttl time.Duration
	c.cached(func(ch *cache.Cache) bool {
		if mode, _ := ch.Mode(ino); mode != wire.LockNone && c.leaseRemaining(c.clk.Now()) >= c.renewMargin {
			ttl = KernelTTL
			c.kernelCaches = true
		}
		return true
	})
	return ttl
}

// NameMax and XattrNameMax are Linux's limits on a name in a directory and
// an extended attribute's name: the client answers for names its cache
// could otherwise answer wrongly (a directory it holds whole has no entry
// of 300 bytes, but that is ENAMETOOLONG, not ENOENT).
const (
	NameMax      = 255
	XattrNameMax = 255
)

func checkName(name string) error {
	if len(name) > NameMax {
		return wire.Errf(wire.CodeNameTooLong, "name of %d bytes", len(name))
	}
	return nil
}

// checkXattrName: Linux answers ERANGE for an empty or too long name.
func checkXattrName(name string) error {
	if name == "" || len(name) > XattrNameMax {
		return wire.Errf(wire.CodeRange, "xattr name of %d bytes", len(name))
	}
	return nil
}
