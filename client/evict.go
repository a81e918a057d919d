package client

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/wire"
)

// Locks the cache drops for space (cache.TakeEvicted) are given back to
// the server by the client's background goroutine (background), never by
// the goroutine whose grant pushed them out. Giving a lock back waits for
// the inode's changes sent behind and flushes its buffered writes (the
// next holder must see them), and that goroutine may be the very sender of
// those changes (behind.sendQueued, or a flush holding the file's lock): it
// would wait for itself. The same goroutine drops the
// kernel's caches that need not go at once (Client.invalidateLater): the
// kernel's invalidation waits for its page locks, which a FUSE request of
// this mount may hold while it waits for the goroutine that asked.
//
// A lock being given back must not come back into the cache under the
// grant that is being released: the server grants a lock it still holds
// for the client again with the same sequence number
// (locks.DataTable.Request), and a request it served just before the
// release (its reply may come after) would have the cache trust a lock the
// server has let go. So until the release is answered and every request
// sent before the answer has its reply, grants of the inode with that
// sequence number or a lower one are not applied (releases.floor). A later
// grant has a higher number: the server's lock table numbers grants from
// one counter.

// releaseTimeout bounds one lock's release: the wait for its changes sent
// behind, the flush of its buffered writes and the release itself. Nothing
// waits for it; past it the client keeps the lock until the server revokes
// it.
const releaseTimeout = time.Minute

// floor keeps grants of an inode with seq or below out of the cache; gen
// is the release generation when its release was answered, 0 while it is
// not (or its answer is unknown).
type floor struct{ seq, gen uint64 }

// releases is the background goroutine's queue and the grants it keeps
// out of the cache. Its mutex is taken last (after Client.mu).
type releases struct {
	mu     sync.Mutex
	queue  map[ids.Ino]wire.Grant // evicted locks not yet given back
	inval  map[ids.Ino]struct{}   // kernel caches to drop
	wake   chan struct{}          // a send means work queued
	floors map[ids.Ino]floor
	// answered lists floors whose release was answered, in order of gen:
	// each goes once no request sent before its answer is unanswered.
	answered []ids.Ino
	// gen counts answered releases; inFlight counts the requests not yet
	// answered by the generation they were sent in.
	gen      uint64
	inFlight map[uint64]int
	// giveBackHook, if set, is called before each release and returns
	// what to call once it is answered (tests: hold one back).
	giveBackHook atomic.Pointer[func(wire.Grant) func()]
}

func (r *releases) init() {
	r.queue = map[ids.Ino]wire.Grant{}
	r.inval = map[ids.Ino]struct{}{}
	r.wake = make(chan struct{}, 1)
	r.floors = map[ids.Ino]floor{}
	r.inFlight = map[uint64]int{}
	r.gen = 1
}

func (r *releases) signal() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// sent records a request about to be sent; call the function it returns
// once its reply's grants are applied, or it got none.
func (r *releases) sent() func() {
	r.mu.Lock()
	gen := r.gen
	r.inFlight[gen]++
	r.mu.Unlock()
	return func() {
		r.mu.Lock()
		if r.inFlight[gen]--; r.inFlight[gen] == 0 {
			delete(r.inFlight, gen)
		}
		r.pruneLocked()
		r.mu.Unlock()
	}
}

// pruneLocked drops the floors no unanswered request can meet any more.
func (r *releases) pruneLocked() {
	if len(r.answered) == 0 {
		return
	}
	oldest := r.gen
	for gen := range r.inFlight {
		oldest = min(oldest, gen)
	}
	n := 0
	for _, ino := range r.answered {
		f, ok := r.floors[ino]
		if ok && f.gen != 0 && f.gen > oldest {
			break
		}
		if ok && f.gen != 0 {
			delete(r.floors, ino)
		}
		n++
	}
	r.answered = r.answered[n:]
}

// filter returns the grants that may be applied to the cache.
func (r *releases) filter(grants []wire.Grant) []wire.Grant {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.floors) == 0 {
		return grants
	}
	out := grants[:0:0]
	for _, g := range grants {
		if f, ok := r.floors[g.Ino]; ok && g.Seq <= f.seq {
			continue
		}
		out = append(out, g)
	}
	return out
}

// done records that g's release was answered (sent is false if it was
// not sent at all) and how: unanswered, it may still reach the server, and
// the floor stays until the cache is dropped.
func (r *releases) done(g wire.Grant, sent, answered bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	f, ok := r.floors[g.Ino]
	if !ok || f.seq != g.Seq || f.gen != 0 {
		return // evicted again meanwhile: that release settles it
	}
	if _, queued := r.queue[g.Ino]; queued {
		return
	}
	switch {
	case !sent:
		delete(r.floors, g.Ino) // the server holds the lock for us still
	case answered:
		r.gen++
		r.floors[g.Ino] = floor{seq: f.seq, gen: r.gen}
		r.answered = append(r.answered, g.Ino)
		r.pruneLocked()
	}
}

// reset forgets every release and floor: the session they belong to is
// gone, and the server forgot its locks.
func (r *releases) reset() {
	r.mu.Lock()
	clear(r.queue)
	clear(r.floors)
	r.answered = nil
	r.mu.Unlock()
}

// takeEvictedLocked hands the locks the cache evicted to the background
// goroutine, which gives them back; one that a grant in the same critical
// section brought back stays. Called with c.mu held, after every change of
// the cache that may evict (a grant).
func (c *Client) takeEvictedLocked() {
	gs := c.cache.TakeEvicted()
	if len(gs) == 0 {
		return
	}
	r := &c.rel
	r.mu.Lock()
	for _, g := range gs {
		if mode, _ := c.cache.Mode(g.Ino); mode != wire.LockNone {
			continue
		}
		c.Counters.LocksEvicted.Add(1)
		f := r.floors[g.Ino]
		r.floors[g.Ino] = floor{seq: max(f.seq, g.Seq)}
		if q, ok := r.queue[g.Ino]; !ok || q.Seq < g.Seq {
			r.queue[g.Ino] = g
		}
	}
	r.mu.Unlock()
	r.signal()
}

// invalidateLater drops the kernel's caches of ino from the background
// goroutine: for a caller that may run on behalf of a FUSE request which
// holds the kernel's locks the invalidation waits for.
func (c *Client) invalidateLater(ino ids.Ino) {
	r := &c.rel
	r.mu.Lock()
	r.inval[ino] = struct{}{}
	r.mu.Unlock()
	r.signal()
}

// background gives back evicted locks and drops kernel caches, until the
// client closes. Nothing waits for it.
func (c *Client) background() {
	defer c.wg.Done()
	ctx, cancel := context.WithCancel(cancelAlways(context.Background()))
	defer cancel()
	go func() {
		<-c.stop
		cancel()
	}()
	r := &c.rel
	for {
		select {
		case <-c.stop:
			return
		case <-r.wake:
		}
		r.mu.Lock()
		inval := make([]ids.Ino, 0, len(r.inval))
		for ino := range r.inval {
			inval = append(inval, ino)
		}
		clear(r.inval)
		gs := make([]wire.Grant, 0, len(r.queue))
		for _, g := range r.queue {
			gs = append(gs, g)
		}
		clear(r.queue)
		r.mu.Unlock()
		for _, ino := range inval {
			c.Invalidate(ino)
			c.maps.dropped(ino)
		}
		for _, g := range gs {
			c.giveBack(ctx, g)
		}
	}
}

// giveBack releases an evicted lock at the server, after the inode's
// changes sent behind and its buffered writes reached the server and the
// kernel dropped what it caches under the lock.
func (c *Client) giveBack(ctx context.Context, g wire.Grant) {
	ctx, cancel := context.WithTimeout(ctx, releaseTimeout)
	defer cancel()
	if err := c.behind.wait(ctx, g.Ino); err != nil {
		c.rel.done(g, false, false)
		return
	}
	if err := c.Flush(ctx, g.Ino); err != nil {
		c.log.Debug("an evicted lock is kept: its file's buffered writes could not be sent", "ino", g.Ino, "err", err)
		c.rel.done(g, false, false)
		return
	}
	// as for a revocation to None (mapped.go): the kernel's pages, which
	// fills may be filling under this lock, go before it
	heldX := g.Mode == wire.LockExclusive
	c.maps.beginRevoke(g.Ino, c.grantedBy(g.Ino), g.Seq, heldX, true)
	c.dropPages(g.Ino, true)
	if heldX {
		_ = c.sendMapped(ctx, g.Ino) // else flushOld sends it
	}
	c.maps.endRevoke(g.Ino, heldX, false, false)
	after := func() {}
	if hook := c.rel.giveBackHook.Load(); hook != nil {
		after = (*hook)(g)
	}
	_, err := c.send(ctx, &wire.Request{Op: wire.OpLockRelease, Ino: g.Ino, LockMode: wire.LockNone, Version: g.Seq}, sendOpts{})
	// the grant is given up only now: until the server has the release
	// it answers fills under it
	c.maps.endRevoke(g.Ino, false, true, false)
	var answer *wire.Error
	c.rel.done(g, true, err == nil || errors.As(err, &answer))
	after()
}
