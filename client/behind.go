package client

import (
	"context"
	"errors"
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

// createHold is how long a create sent behind may wait in its queue before
// it is sent: long enough for the usual create, write, close of a small
// file (tar, cp, an editor's save), whose flush then takes the create along
// in its own batch (Client.flushWithCreate): one round trip and one server
// request per file instead of two. Whatever needs the create sooner (a
// flush, a lookup, a revocation: every wait) sends it at once.
const createHold = 20 * time.Millisecond

// behind is the client's changes sent behind the caller: their queues per
// directory, their senders, what waits for them, and the inode numbers
// creates take (createbehind.go). It sends through its Client and keeps
// the cache under c.mu (lock order: doc.go).
type behind struct {
	c       *Client
	numbers inoPool // inode numbers for creates behind the caller
	mu      sync.Mutex
	// changed, if not nil, is closed at the next change of the counts
	// below: what waiters wait on (a channel, not a sync.Cond, so that a
	// wait gives up when its context ends).
	changed chan struct{}
	total   int
	inos    map[ids.Ino]int // changes in flight per directory and per inode removed or made
	names   map[dirName]int // and per name
	in      map[ids.Ino]int // and per directory they change
	// lost holds files whose create sent behind failed at the server,
	// with its error: what was written to them must fail with it, not
	// pass for a removed file's
	lost map[ids.Ino]error
	// queued holds changes not yet sent, per directory. A directory in
	// sending has a batch at the server (sent by its sender, sendQueued,
	// which sends what queued up meanwhile as the next batch, or by a
	// flush); one that is not is held (createHold), until holdTimer or a
	// wait starts its sender.
	queued    map[ids.Ino][]*wire.Request
	sending   map[ids.Ino]bool
	holdTimer *time.Timer
	holding   bool              // holdTimer runs
	send      func(dir ids.Ino) // sendQueued
}

type dirName struct {
	dir  ids.Ino
	name string
}

func newBehind(c *Client) *behind {
	b := &behind{c: c}
	b.init(b.sendQueued)
	return b
}

func (b *behind) init(send func(dir ids.Ino)) {
	b.send = send
	b.holdTimer = time.AfterFunc(time.Hour, b.release)
	b.holdTimer.Stop()
	b.inos = map[ids.Ino]int{}
	b.names = map[dirName]int{}
	b.in = map[ids.Ino]int{}
	b.lost = map[ids.Ino]error{}
	b.queued = map[ids.Ino][]*wire.Request{}
	b.sending = map[ids.Ino]bool{}
}

// queue queues a started change of dir (start). It is sent at once if a
// batch of dir's is not at the server already (then it goes in the next),
// unless hold: then it waits up to createHold for a flush to take it along
// or for more to fill the batch.
func (b *behind) queue(dir ids.Ino, req *wire.Request, hold bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.queued[dir] = append(b.queued[dir], req)
	switch {
	case b.sending[dir]:
	case hold && len(b.queued[dir]) < wire.MaxBatch:
		if !b.holding {
			// not pushed back by later creates: none waits longer
			b.holding = true
			b.holdTimer.Reset(createHold)
		}
	default:
		b.startLocked(dir)
	}
}

// startLocked starts dir's sender; called with b.mu held, dir not sending.
func (b *behind) startLocked(dir ids.Ino) {
	b.sending[dir] = true
	go b.send(dir)
}

// releaseLocked starts the sender of every held queue: something waits for
// a change, and which queue holds it need not be worked out.
func (b *behind) releaseLocked() {
	for dir := range b.queued {
		if !b.sending[dir] {
			b.startLocked(dir)
		}
	}
}

func (b *behind) release() {
	b.mu.Lock()
	b.holding = false
	b.releaseLocked()
	b.mu.Unlock()
}

// next takes dir's next batch for its sender, or ends the sender (false)
// when none is queued.
func (b *behind) next(dir ids.Ino) ([]*wire.Request, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	q := b.queued[dir]
	if len(q) == 0 {
		delete(b.queued, dir)
		delete(b.sending, dir)
		return nil, false
	}
	n := min(len(q), wire.MaxBatch)
	b.queued[dir] = q[n:]
	return q[:n:n], true
}

// takeHeld takes the held queue that ends with the create of ino, if it
// leaves room for one more change in its batch: the caller sends it, and
// then calls sent. Only the last create of a queue: a queue holds nothing
// the caller's change would have to wait behind but what goes in its
// batch before it.
func (b *behind) takeHeld(ino ids.Ino) (ids.Ino, []*wire.Request, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for dir, q := range b.queued {
		if len(q) == 0 || b.sending[dir] {
			continue
		}
		if last := q[len(q)-1]; last.Op == wire.OpCreate && last.Ino == ino && len(q) < wire.MaxBatch {
			delete(b.queued, dir)
			b.sending[dir] = true
			if b.holding && !b.anyHeldLocked() {
				// the next create's hold starts afresh
				b.holdTimer.Stop()
				b.holding = false
			}
			return dir, q, true
		}
	}
	return 0, nil, false
}

func (b *behind) anyHeldLocked() bool {
	for dir, q := range b.queued {
		if len(q) > 0 && !b.sending[dir] {
			return true
		}
	}
	return false
}

// sent ends a batch of dir's a flush sent (takeHeld): what queued up
// meanwhile goes now.
func (b *behind) sent(dir ids.Ino) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.sending, dir)
	if len(b.queued[dir]) > 0 {
		b.startLocked(dir)
	} else {
		delete(b.queued, dir)
	}
}

// reserve waits for a slot; it fails only when ctx ends.
func (b *behind) reserve(ctx context.Context) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.waitLocked(ctx, func() bool { return b.total >= maxBehind }); err != nil {
		return err
	}
	b.total++
	return nil
}

// unreserve gives back a slot nothing used.
func (b *behind) unreserve() {
	b.mu.Lock()
	b.total--
	b.broadcastLocked()
	b.mu.Unlock()
}

// waitLocked returns once blocked reports false, starting the senders of
// held queues meanwhile (something waits for a change, and which queue
// holds it need not be worked out), or with ctx's error once ctx ends.
// Called with b.mu held; it is released while waiting.
func (b *behind) waitLocked(ctx context.Context, blocked func() bool) error {
	for blocked() {
		b.releaseLocked()
		if b.changed == nil {
			b.changed = make(chan struct{})
		}
		ch := b.changed
		b.mu.Unlock()
		select {
		case <-ch:
			b.mu.Lock()
		case <-ctx.Done():
			b.mu.Lock()
			return ctx.Err()
		}
	}
	return nil
}

// broadcastLocked wakes every waiter to look again. Called with b.mu held.
func (b *behind) broadcastLocked() {
	if b.changed != nil {
		close(b.changed)
		b.changed = nil
	}
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
	b.broadcastLocked()
	b.mu.Unlock()
}

// wait returns once no change of or in any of inos is in flight, or with
// ctx's error.
func (b *behind) wait(ctx context.Context, inos ...ids.Ino) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.waitLocked(ctx, func() bool { return b.pending(inos) })
}

// busy reports whether a change of or in ino is in flight.
func (b *behind) busy(ino ids.Ino) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.pending([]ids.Ino{ino})
}

// failed records that the create of ino sent behind failed at the server
// with err.
func (b *behind) failed(ino ids.Ino, err error) {
	b.mu.Lock()
	b.lost[ino] = err
	b.mu.Unlock()
}

// isLost reports whether ino's create sent behind failed at the server.
func (b *behind) isLost(ino ids.Ino) bool { return b.lostErr(ino) != nil }

// lostErr is the error ino's create sent behind failed with (nil if none).
func (b *behind) lostErr(ino ids.Ino) error {
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

// waitEmptied returns once no change in dir is in flight, or with ctx's
// error.
func (b *behind) waitEmptied(ctx context.Context, dir ids.Ino) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.waitLocked(ctx, func() bool { return b.in[dir] > 0 })
}

// waitName returns once no removal of dir/name is in flight, or with ctx's
// error.
func (b *behind) waitName(ctx context.Context, dir ids.Ino, name string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.waitLocked(ctx, func() bool { return b.names[dirName{dir, name}] > 0 })
}

// waitAll returns once no change is in flight, or with ctx's error.
func (b *behind) waitAll(ctx context.Context) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.waitLocked(ctx, func() bool { return b.total > 0 })
}

// opWait runs wait, one of behind's waits, for an operation whose
// context is ctx (opContext).
func (b *behind) opWait(ctx context.Context, wait func(context.Context) error) error {
	wctx, cancel := b.c.opContext(ctx, false)
	defer cancel()
	return b.c.softErr(ctx, wait(wctx))
}

// waitFor makes a request wait for the changes sent behind that it could
// observe, until ctx ends. Never called on a sender of those changes
// (sendQueued, a flush sending a held batch), nor by anything that one
// waits for: see the wait order in doc.go.
func (b *behind) waitFor(ctx context.Context, req *wire.Request) error {
	switch req.Op {
	case wire.OpRenew, wire.OpGoodbye, wire.OpOpenSession, wire.OpStatFs, wire.OpAllocInos, wire.OpLockRelease:
		return nil
	case wire.OpLookup:
		// other names of the directory are not affected
		if err := b.waitName(ctx, req.Parent, req.Name); err != nil {
			return err
		}
		return b.wait(ctx, req.Ino)
	}
	return b.wait(ctx, req.Ino, req.Parent, req.NewPar)
}

// remove removes parent/name (the inode child; a directory for
// OpRmdir) in the cache and sends the removal behind the caller, if the
// client holds parent's X lock and knows the removal succeeds; false if it
// must be sent and waited for. It fails only if ctx ends while it waits
// for a slot.
func (b *behind) remove(ctx context.Context, parent ids.Ino, name string, child *wire.Attr, op wire.Op) (bool, error) {
	isDir := child.Mode&syscall.S_IFMT == syscall.S_IFDIR
	if isDir != (op == wire.OpRmdir) {
		return false, nil
	}
	if err := b.opWait(ctx, b.reserve); err != nil {
		return false, err
	}
	b.c.mu.Lock()
	now := b.c.clk.Now()
	mode, _ := b.c.cache.Mode(parent)
	ok := mode == wire.LockExclusive && b.c.leasesValid(now) && b.c.cache.Opens(child.Ino) == 0 &&
		(!isDir || b.c.cache.Empty(child.Ino))
	if ok {
		if cur, known := b.c.cache.Entry(parent, name); !known || cur != child.Ino {
			ok = false
		}
	}
	if !ok {
		b.c.mu.Unlock()
		b.unreserve()
		return false, nil
	}
	b.start(parent, child.Ino, name)
	b.c.Counters.RemovedBehind.Add(1)
	b.c.cache.Predict(parent, func(a *wire.Attr) {
		// the times the server will give it, near enough; its next
		// reply about the directory corrects them
		t := time.Now().UnixNano()
		a.Mtime, a.Ctime = t, t
		if isDir {
			a.Nlink--
		}
	})
	b.c.cache.SetEntry(parent, name, 0)
	b.c.cache.InvalidateDir(child.Ino) // its link count changed; a directory is gone
	b.c.cache.Predict(child.Ino, nil)
	b.c.mu.Unlock()
	b.queue(parent, &wire.Request{Op: op, Parent: parent, Name: name, Ino: child.Ino, Flags: wire.RemoveIfIno}, false)
	return true, nil
}

// sendQueued sends the changes queued for dir, in batches of what queued
// up meanwhile, until none is left. Whatever it runs must not wait for a
// change sent behind (wait order, doc.go): it is the one that sends
// them.
func (b *behind) sendQueued(dir ids.Ino) {
	ctx := context.Background()
	for {
		reqs, ok := b.next(dir)
		if !ok {
			return
		}
		for _, req := range reqs {
			if req.Op == wire.OpRmdir {
				// the server must find it empty: its own removals
				// go first (by their directory's sender, which waits
				// for no parent's; the caller did not wait)
				_ = b.waitEmptied(ctx, req.Ino)
			}
		}
		errs, _ := b.sendBatch(ctx, dir, reqs)
		b.finish(dir, reqs, errs)
	}
}

// finish ends the changes sent behind the caller, reqs, which met errs.
func (b *behind) finish(dir ids.Ino, reqs []*wire.Request, errs []error) {
	b.c.mu.Lock()
	for _, req := range reqs {
		b.c.cache.Predicted(dir)
		if req.Op != wire.OpCreate {
			b.c.cache.Predicted(req.Ino) // the removed inode's link count
		}
	}
	b.c.mu.Unlock()
	for i, req := range reqs {
		switch err := errs[i]; {
		case err == nil:
		case errors.Is(err, ErrClosed):
			// the mount stopped before a server took it
			b.c.log.Error("DATA LOST: a "+req.Op.String()+" sent behind the caller did not reach the server before the mount stopped",
				"path", b.c.PathOf(dir), "name", req.Name, "ino", req.Ino)
			b.c.Counters.DataLost.Add(1)
		case req.Op == wire.OpCreate:
			// (it should not, under the lock): what the caller
			// writes to it fails to reach the server and is
			// reported at close or fsync
			b.c.log.Warn("a create sent behind failed at the server; the file is lost",
				"path", b.c.PathOf(dir), "name", req.Name, "ino", req.Ino, "err", err)
			b.c.Counters.DataLost.Add(1)
			b.failed(req.Ino, err)
			if wire.CodeOf(err) == wire.CodeNoSpace {
				b.c.noteNoSpace()
			}
			b.c.forget(dir, req.Ino)
		case gone(err):
			b.c.log.Debug("a removal sent behind found the name gone", "dir", dir, "name", req.Name, "err", err)
		default:
			b.c.log.Warn("a removal sent behind failed at the server; the directory is read again",
				"path", b.c.PathOf(dir), "name", req.Name, "err", err)
			b.c.forget(dir)
		}
		b.done(dir, req.Ino, req.Name)
	}
}

// sendWithHeld sends change, a change of ino's, in one batch with the
// held queue that ends with ino's create (takeHeld), if there is one; it
// reports whether it sent it, and the change's reply or error.
func (b *behind) sendWithHeld(ctx context.Context, ino ids.Ino, change *wire.Request) (bool, *wire.Reply, error) {
	dir, queued, ok := b.takeHeld(ino)
	if !ok {
		return false, nil, nil
	}
	b.c.Counters.CreatedWithData.Add(1)
	errs, reps := b.sendBatch(ctx, dir, append(queued[:len(queued):len(queued)], change))
	b.finish(dir, queued, errs[:len(queued)])
	b.sent(dir)
	return true, reps[len(queued)], errs[len(queued)]
}

// sendBatch sends changes of dir as one request (wire.OpBatch; a single
// change as itself) and returns each one's error and reply (nil with an
// error).
func (b *behind) sendBatch(ctx context.Context, dir ids.Ino, reqs []*wire.Request) ([]error, []*wire.Reply) {
	errs := make([]error, len(reqs))
	if len(reqs) == 1 {
		rep, err := b.c.send(ctx, reqs[0], sendOpts{})
		errs[0] = err
		return errs, []*wire.Reply{rep}
	}
	// numbered as send numbers a change, each its own: the server
	// applies none twice when the batch is sent again
	for _, r := range reqs {
		r.Oldest = b.c.inFlight.add(&r.ReqID, r.OriginIno())
	}
	defer func() {
		for _, r := range reqs {
			b.c.inFlight.done(r.ReqID)
		}
	}()
	b.c.Counters.BehindBatches.Add(1)
	rep, err := b.c.send(ctx, &wire.Request{Op: wire.OpBatch, Parent: dir, Data: wire.AppendBatch(nil, reqs)}, sendOpts{})
	var reps []*wire.Reply
	if err == nil {
		reps, err = wire.ParseBatchReplies(rep.Data, len(reqs))
	}
	if err != nil {
		reps = make([]*wire.Reply, len(reqs))
	}
	for i := range reqs {
		if err != nil {
			errs[i] = err
		} else {
			errs[i] = reps[i].Err()
		}
	}
	return errs, reps
}
