package client

import (
	"context"
	"sync"
	"syscall"
	"time"

	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/wire"
)

// Removals behind the caller. Under the X lock of a directory the mount
// knows its entries, and nobody else can see or change them: it removes a
// name from its cache at once, returns, and sends the removal to the server
// behind the caller (rm -rf then costs a FUSE round trip per file, not a
// server round trip). An empty directory's removal does not wait for the
// removals in it either: its sender sends it once they reached the server.
// (Creates go the same way: createbehind.go.) Everything that could observe
// the removal waits for it to reach the server first: any request naming the
// directory or the removed inode (a listing, a create or rename there, a
// stat of the removed file), a lookup of the removed name, a revocation of
// either lock, fsync, close of the mount. The request says which inode it
// removes (wire.RemoveIfIno), so a resend after a NACK never removes a file
// created under that name since. A removal that fails at the server (it should not,
// under the lock) is logged and the directory read again.

// maxBehind bounds the removals in flight: more wait for a slot. Two
// batches' worth: one fills while the other is at the server.
const maxBehind = 2 * wire.MaxBatch

type behind struct {
	mu    sync.Mutex
	cond  sync.Cond
	total int
	inos  map[ids.Ino]int // changes in flight per directory and per inode removed or made
	names map[dirName]int // and per name
	in    map[ids.Ino]int // and per directory they change
	// lost holds files whose create sent behind failed at the server:
	// what was written to them must fail, not pass for a removed file's
	lost map[ids.Ino]bool
	// queued holds removals not yet sent, per directory; a directory with
	// an entry has a sender (sendBehind) running, which sends what queued
	// up while its last batch was at the server as the next batch.
	queued map[ids.Ino][]*wire.Request
}

type dirName struct {
	dir  ids.Ino
	name string
}

func (b *behind) init() {
	b.cond.L = &b.mu
	b.inos = map[ids.Ino]int{}
	b.names = map[dirName]int{}
	b.in = map[ids.Ino]int{}
	b.lost = map[ids.Ino]bool{}
	b.queued = map[ids.Ino][]*wire.Request{}
}

// reserve waits for a slot.
func (b *behind) reserve() {
	b.mu.Lock()
	for b.total >= maxBehind {
		b.cond.Wait()
	}
	b.total++
	b.mu.Unlock()
}

// unreserve gives back a slot nothing used.
func (b *behind) unreserve() {
	b.mu.Lock()
	b.total--
	b.mu.Unlock()
	b.cond.Broadcast()
}

// start records a removal in a reserved slot.
func (b *behind) start(dir, child ids.Ino, name string) {
	b.mu.Lock()
	b.inos[dir]++
	b.inos[child]++
	b.names[dirName{dir, name}]++
	b.in[dir]++
	b.mu.Unlock()
}

// done ends a removal and frees its slot.
func (b *behind) done(dir, child ids.Ino, name string) {
	b.mu.Lock()
	for _, ino := range []ids.Ino{dir, child} {
		if b.inos[ino]--; b.inos[ino] == 0 {
			delete(b.inos, ino)
		}
	}
	k := dirName{dir, name}
	if b.names[k]--; b.names[k] == 0 {
		delete(b.names, k)
	}
	if b.in[dir]--; b.in[dir] == 0 {
		delete(b.in, dir)
	}
	b.total--
	b.mu.Unlock()
	b.cond.Broadcast()
}

// wait returns once no change of or in any of inos is in flight.
func (b *behind) wait(inos ...ids.Ino) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for b.pending(inos) {
		b.cond.Wait()
	}
}

// busy reports whether a change of or in ino is in flight.
func (b *behind) busy(ino ids.Ino) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.pending([]ids.Ino{ino})
}

// failed records that the create of ino sent behind failed at the server.
func (b *behind) failed(ino ids.Ino) {
	b.mu.Lock()
	b.lost[ino] = true
	b.mu.Unlock()
}

// isLost reports whether ino's create sent behind failed at the server.
func (b *behind) isLost(ino ids.Ino) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.lost[ino]
}

func (b *behind) pending(inos []ids.Ino) bool {
	for _, ino := range inos {
		if ino != 0 && b.inos[ino] > 0 {
			return true
		}
	}
	return false
}

// waitEmptied returns once no change in dir is in flight.
func (b *behind) waitEmptied(dir ids.Ino) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for b.in[dir] > 0 {
		b.cond.Wait()
	}
}

// waitName returns once no removal of dir/name is in flight.
func (b *behind) waitName(dir ids.Ino, name string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for b.names[dirName{dir, name}] > 0 {
		b.cond.Wait()
	}
}

// waitAll returns once no change is in flight.
func (b *behind) waitAll() {
	b.mu.Lock()
	defer b.mu.Unlock()
	for b.total > 0 {
		b.cond.Wait()
	}
}

// waitFor makes a request wait for the removals it could observe.
func (c *Client) waitFor(req *wire.Request) {
	switch req.Op {
	case wire.OpRenew, wire.OpGoodbye, wire.OpOpenSession, wire.OpStatFs:
		return
	case wire.OpLookup:
		// other names of the directory are not affected
		c.behind.waitName(req.Parent, req.Name)
		c.behind.wait(req.Ino)
		return
	}
	c.behind.wait(req.Ino, req.Parent, req.NewPar)
}

// removeBehind removes parent/name (the inode child; a directory for
// OpRmdir) in the cache and sends the removal behind the caller, if the
// client holds parent's X lock and knows the removal succeeds; false if it
// must be sent and waited for.
func (c *Client) removeBehind(parent ids.Ino, name string, child *wire.Attr, op wire.Op) bool {
	isDir := child.Mode&syscall.S_IFMT == syscall.S_IFDIR
	if isDir != (op == wire.OpRmdir) {
		return false
	}
	c.behind.reserve()
	c.mu.Lock()
	now := c.clk.Now()
	mode, _ := c.cache.Mode(parent)
	ok := mode == wire.LockExclusive && c.leasesValid(now) && c.cache.Opens(child.Ino) == 0 &&
		(!isDir || c.cache.Empty(child.Ino))
	if ok {
		if cur, known := c.cache.Entry(parent, name); !known || cur != child.Ino {
			ok = false
		}
	}
	if !ok {
		c.mu.Unlock()
		c.behind.unreserve()
		return false
	}
	c.behind.start(parent, child.Ino, name)
	c.Counters.RemovedBehind.Add(1)
	if a, cached := c.cache.Attr(parent); cached {
		// the times the server will give it, near enough; its next
		// reply about the directory corrects them
		t := time.Now().UnixNano()
		a.Mtime, a.Ctime = t, t
		if isDir {
			a.Nlink--
		}
		c.cache.SetAttr(a)
	}
	c.cache.SetEntry(parent, name, 0)
	c.cache.InvalidateDir(child.Ino) // its link count changed; a directory is gone
	c.mu.Unlock()
	c.queueBehind(parent, &wire.Request{Op: op, Parent: parent, Name: name, Ino: child.Ino, Flags: wire.RemoveIfIno})
	return true
}

// queueBehind queues a change of dir that was started (behind.start) to be
// sent behind the caller.
func (c *Client) queueBehind(dir ids.Ino, req *wire.Request) {
	c.behind.mu.Lock()
	q, running := c.behind.queued[dir]
	c.behind.queued[dir] = append(q, req)
	c.behind.mu.Unlock()
	if !running {
		go c.sendBehind(dir)
	}
}

// sendBehind sends the removals queued for dir, in batches of what queued
// up meanwhile, until none is left.
func (c *Client) sendBehind(dir ids.Ino) {
	for {
		c.behind.mu.Lock()
		q := c.behind.queued[dir]
		if len(q) == 0 {
			delete(c.behind.queued, dir)
			c.behind.mu.Unlock()
			return
		}
		n := min(len(q), wire.MaxBatch)
		reqs := q[:n:n]
		c.behind.queued[dir] = q[n:]
		c.behind.mu.Unlock()
		for _, req := range reqs {
			if req.Op == wire.OpRmdir {
				// the server must find it empty: its own removals
				// go first (by its sender; the caller did not wait)
				c.behind.waitEmptied(req.Ino)
			}
		}
		errs := c.sendBatch(context.Background(), dir, reqs)
		for i, req := range reqs {
			switch err := errs[i]; {
			case err == nil:
			case req.Op == wire.OpCreate:
				// (it should not, under the lock): what the caller
				// writes to it fails to reach the server and is
				// reported at close or fsync
				c.log.Warn("a create sent behind failed at the server; the file is lost",
					"path", c.PathOf(dir), "name", req.Name, "ino", req.Ino, "err", err)
				c.Counters.DataLost.Add(1)
				c.behind.failed(req.Ino)
				c.forget(dir, req.Ino)
			case gone(err):
				c.log.Debug("a removal sent behind found the name gone", "dir", dir, "name", req.Name, "err", err)
			default:
				c.log.Warn("a removal sent behind failed at the server; the directory is read again",
					"path", c.PathOf(dir), "name", req.Name, "err", err)
				c.forget(dir)
			}
			c.behind.done(dir, req.Ino, req.Name)
		}
	}
}

// sendBatch sends changes of dir as one request (wire.OpBatch; a single
// change as itself) and returns each one's error.
func (c *Client) sendBatch(ctx context.Context, dir ids.Ino, reqs []*wire.Request) []error {
	errs := make([]error, len(reqs))
	if len(reqs) == 1 {
		_, errs[0] = c.send(ctx, reqs[0], nil, false, nil, 0)
		return errs
	}
	// numbered as send numbers a change, each its own: the server
	// applies none twice when the batch is sent again
	for _, r := range reqs {
		r.Oldest = c.inFlight.add(&r.ReqID)
	}
	defer func() {
		for _, r := range reqs {
			c.inFlight.done(r.ReqID)
		}
	}()
	c.Counters.BehindBatches.Add(1)
	rep, err := c.send(ctx, &wire.Request{Op: wire.OpBatch, Parent: dir, Data: wire.AppendBatch(nil, reqs)}, nil, false, nil, 0)
	var reps []*wire.Reply
	if err == nil {
		reps, err = wire.ParseBatchReplies(rep.Data, len(reqs))
	}
	for i := range reqs {
		if err != nil {
			errs[i] = err
		} else {
			errs[i] = reps[i].Err()
		}
	}
	return errs
}
