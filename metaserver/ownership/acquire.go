package ownership

// Becoming an inode's owner: acquiring it (asking its owner to hand it
// over), and handing inodes over to other servers.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/leasefs/leasefs/internal/clock"
	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/metaserver/paxosnode"
	"github.com/leasefs/leasefs/wire"
)

// OnAlloc acquires a new inode for the server that creates it: nobody
// else can know the number (server id in its high bits, never reused), so
// there is nothing to recover and no grace. Usually it is held already:
// the next numbers are acquired ahead (acquireAhead).
func (c *Owner) OnAlloc(ino ids.Ino) error {
	n := c.node.Load()
	if n == nil {
		return errUnavailable("server starting")
	}
	defer c.acquireAhead(n, ino)
	c.mu.Lock()
	c.allocated = max(c.allocated, ino)
	c.mu.Unlock()
	// acquired ahead or not, no pin of ino's is left after this
	// (acquireAhead pins only numbers not yet allocated)
	defer n.Unpin(ino)
	if ep, ok := n.Owns(ino); ok {
		c.stats.allocAhead.Add(1)
		c.mu.Lock()
		c.recovered[ino] = ep
		c.mu.Unlock()
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.acquireFor)
	defer cancel()
	ep, err := n.Acquire(ctx, ino)
	var q *paxosnode.QuarantineError
	for errors.As(err, &q) && clock.Sleep(ctx, c.clk, q.Left) == nil {
		ep, err = n.Acquire(ctx, ino)
	}
	if err != nil {
		return c.acquireErr(ino, err)
	}
	c.mu.Lock()
	c.recovered[ino] = ep
	c.mu.Unlock()
	return nil
}

// inosAhead is how many of the inode numbers it will allocate next a
// server owns beforehand: a create then waits for no PaxosLease round of
// its own, only for the replication of the change.
const inosAhead = 32

// acquireAhead acquires, in the background, the inode numbers after ino
// (the store allocates them in sequence; nobody else can know them) and
// pins them until they are allocated.
func (c *Owner) acquireAhead(n *paxosnode.Node, ino ids.Ino) {
	c.mu.Lock()
	from, to := max(ino+1, c.aheadTo), ino+1+inosAhead
	if from < to {
		c.aheadTo = to
	}
	c.mu.Unlock()
	for next := from; next < to; next++ {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), c.acquireFor)
			defer cancel()
			if _, err := n.Acquire(ctx, next); err == nil {
				c.mu.Lock()
				if next > c.allocated {
					n.Pin(next)
				}
				c.mu.Unlock()
			}
		}()
	}
}

func (c *Owner) acquireErr(ino ids.Ino, err error) error {
	var q *paxosnode.QuarantineError
	if errors.As(err, &q) {
		return errUnavailable("server restarting: sits out PaxosLease for %v more", q.Left.Round(time.Millisecond))
	}
	if errors.Is(err, context.Canceled) {
		return wire.Err(wire.CodeInterrupted)
	}
	return errUnavailable("cannot own %v: %v", ino, err)
}

// OwnAll makes this server the recovered owner of every inode (ascending,
// zero skipped), then waits out their graces.
func (c *Owner) OwnAll(ctx context.Context, inos []ids.Ino) error {
	for i, ino := range inos {
		if ino == 0 || i > 0 && inos[i-1] == ino {
			continue
		}
		if err := c.own(ctx, ino); err != nil {
			return err
		}
	}
	// The lock manager grants no client lock during a grace anyway; the
	// wait here keeps the request from holding other inodes' locks
	// meanwhile, which a hand-over of those would wait for.
	for _, ino := range inos {
		until, ok := c.locks.GraceUntil(ino)
		if !ok {
			continue
		}
		if clock.Sleep(ctx, c.clk, clock.Until(c.clk, until)) != nil {
			return wire.Err(wire.CodeInterrupted)
		}
	}
	return nil
}

// StillOwned reports whether this server is still the recovered owner of
// every inode (after waiting for client locks).
func (c *Owner) StillOwned(inos []ids.Ino) bool {
	n := c.node.Load()
	for _, ino := range inos {
		if ino == 0 {
			continue
		}
		if _, ok := c.ready(n, ino); !ok {
			return false
		}
	}
	return true
}

// own makes this server the recovered owner of ino: acquire, asking the
// current owner to hand it over, then recover it from a majority.
func (c *Owner) own(ctx context.Context, ino ids.Ino) error {
	n := c.node.Load()
	if n == nil {
		return errUnavailable("server starting")
	}
	if _, ok := c.ready(n, ino); ok {
		n.Touch(ino)
		return nil
	}
	defer c.owning.lock(ino)()
	octx, cancel := context.WithTimeout(ctx, c.acquireFor)
	defer cancel()
	handedOver := false
	// The hand-over call runs beside the acquire attempts: a dead owner
	// never answers, and its lease lapses within T(1+δ).
	var handover chan error
	for {
		if _, ok := c.ready(n, ino); ok {
			n.Touch(ino)
			return nil
		}
		actx, acancel := context.WithTimeout(octx, c.acquireTry)
		ep, err := n.Acquire(actx, ino)
		acancel()
		acquired := c.clk.Now()
		var no *paxosnode.NotOwnerError
		var q *paxosnode.QuarantineError
		switch {
		case err == nil:
			return c.recoverInode(ctx, n, ino, ep, handedOver, acquired)
		case errors.As(err, &q):
			// a restarted server sits out at most T(1+δ): wait rather
			// than send the client elsewhere
			clock.Sleep(octx, c.clk, q.Left)
		case errors.As(err, &no) && no.Owner != c.self:
			if handover == nil {
				c.stats.handoversAsked.Add(1)
				handover = make(chan error, 1)
				owner := no.Owner
				go func() { handover <- c.askHandover(octx, n, owner, ino) }()
			}
			t, tc := c.clk.NewTimer(max(c.lease/20, time.Millisecond))
			select {
			case herr := <-handover:
				handover = nil
				if herr == nil {
					handedOver = true
				} else {
					c.log.Debug("hand-over refused or failed", "ino", ino, "owner", no.Owner, "err", herr)
				}
			case <-tc:
			case <-octx.Done():
			}
			t.Stop()
		case ctx.Err() != nil:
			return wire.Err(wire.CodeInterrupted)
		case octx.Err() == nil && errors.Is(err, context.DeadlineExceeded):
			// no majority answered: this server is cut off (or most of
			// the cluster is down); its client does better elsewhere
			return errUnavailable("cannot own %v: no majority of the servers answered within %v", ino, c.acquireTry)
		default:
			return c.acquireErr(ino, err)
		}
		if octx.Err() != nil {
			if ctx.Err() != nil {
				return wire.Err(wire.CodeInterrupted)
			}
			return errUnavailable("cannot own %v: its owner neither hands it over nor lapses", ino)
		}
	}
}

// askHandover asks owner to hand ino over: nil once it released it.
func (c *Owner) askHandover(ctx context.Context, n *paxosnode.Node, owner ids.ServerID, ino ids.Ino) error {
	req := inoReq{Ino: ino}
	rep, err := n.Peers().Call(ctx, owner, callHandover, req.Append(nil))
	c.noteCall(owner, err)
	if err != nil {
		return err
	}
	return parseReply(rep, nil)
}

// handleHandover serves another server's request for an inode we own: the
// same revocation path as a conflicting client request (a pseudo client,
// the asking server, takes X, which revokes every client's lock and fails
// clients that do not acknowledge), then the lease is released.
func (c *Owner) handleHandover(ctx context.Context, from ids.ServerID, body []byte) []byte {
	var req inoReq
	if err := req.Parse(body); err != nil {
		return statusReply(err)
	}
	ino := req.Ino
	n := c.node.Load()
	if _, ok := n.Owns(ino); !ok {
		st := replyStatus{Code: stNotOwner}
		return st.Append(nil)
	}
	start := c.clk.Now()
	// Hold the inode's acquire lock: a local request recovering it
	// meanwhile would otherwise race our release.
	defer c.owning.lock(ino)()
	pseudo := paxosnode.PeerClientID(from)
	hctx, cancel := context.WithTimeout(ctx, c.acquireFor)
	defer cancel()
	release, err := c.locks.Exclude(hctx, pseudo, ino)
	if err != nil {
		return statusReply(fmt.Errorf("hand-over of %v: revoking client locks: %w", ino, err))
	}
	c.mu.Lock()
	delete(c.recovered, ino)
	delete(c.unsure, ino)
	c.mu.Unlock()
	c.locks.EndGrace(ino)
	n.Release(ino)
	release()
	took := c.clk.Now().Sub(start)
	ms := took.Milliseconds()
	c.stats.handoversGiven.Add(1)
	for {
		old := c.stats.handoverMaxMs.Load()
		if ms <= old || c.stats.handoverMaxMs.CompareAndSwap(old, ms) {
			break
		}
	}
	c.log.Debug("handed inode over", "ino", ino, "to", from, "took", took)
	return statusReply(nil)
}

// inoMutexes is a mutex per inode, made on demand. Not striped: a server
// waiting in own for a peer to hand over inode A holds A's mutex, and the
// peer may at the same moment wait for this server to hand over B; with
// A and B on one stripe (inode numbers of different servers differ only
// in their high bits) neither hand-over could start until both gave up.
type inoMutexes struct {
	mu sync.Mutex
	m  map[ids.Ino]*inoMutex
}

type inoMutex struct {
	sync.Mutex
	users int // holders and waiters
}

// lock locks ino's mutex and returns its unlock.
func (l *inoMutexes) lock(ino ids.Ino) func() {
	l.mu.Lock()
	if l.m == nil {
		l.m = map[ids.Ino]*inoMutex{}
	}
	m := l.m[ino]
	if m == nil {
		m = &inoMutex{}
		l.m[ino] = m
	}
	m.users++
	l.mu.Unlock()
	m.Lock()
	return func() {
		m.Unlock()
		l.mu.Lock()
		if m.users--; m.users == 0 {
			delete(l.m, ino)
		}
		l.mu.Unlock()
	}
}
