package ownership

// Recovery: a new owner makes the newest state of a majority its own.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/leasefs/leasefs/internal/clock"
	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/lease/paxos"
	"github.com/leasefs/leasefs/metaserver/paxosnode"
	"github.com/leasefs/leasefs/metaserver/replica"
)

type replVersion struct {
	epoch   ids.Epoch
	version uint64
}

func (r replVersion) less(o replVersion) bool {
	return r.epoch < o.epoch || r.epoch == o.epoch && r.version < o.version
}

// recoverInode makes the inode's newest state among a majority this
// server's, stamped with its epoch ep on a majority, before it serves the
// inode (DESIGN.md: the new owner reads the inode from a majority, takes
// the newest, writes it back under its own epoch).
func (c *Owner) recoverInode(ctx context.Context, n *paxosnode.Node, ino ids.Ino, ep ids.Epoch, handedOver bool, acquired clock.Time) error {
	states, bestAt, err := c.replicaStates(ctx, n, ino)
	if err != nil {
		return err
	}
	best := states[bestAt]
	if len(states) < c.majority() {
		return errUnavailable("recovering %v: %d of %d servers answered", ino, len(states), c.size)
	}
	if best.epoch > ep {
		// a replica has seen a newer owner: ours is already over
		n.Release(ino)
		return errUnavailable("recovering %v: a newer owner (epoch %v) exists", ino, best.epoch)
	}
	best, exists, err := c.takeNewest(ctx, n, ino, ep, states, bestAt)
	if err != nil {
		return err
	}
	if err := c.writeBackAll(ctx, n, ino, states, best, ep); err != nil {
		return err
	}
	c.stats.recoveries.Add(1)
	c.settleGrace(ctx, n, ino, ep, best, handedOver, exists, acquired)
	c.log.Debug("recovered inode", "ino", ino, "epoch", ep, "from", bestAt, "state", best, "handed_over", handedOver)
	return nil
}

// replicaStates asks every replica for the epoch and version of its state
// of ino, and returns the answers (this server's included) and who holds
// the newest.
func (c *Owner) replicaStates(ctx context.Context, n *paxosnode.Node, ino ids.Ino) (map[ids.ServerID]replVersion, ids.ServerID, error) {
	rctx, cancel := context.WithTimeout(ctx, c.callWait)
	defer cancel()
	req := inoReq{Ino: ino}
	body := req.Append(nil)
	ch := c.fanOut(rctx, func(ctx context.Context, p ids.ServerID) ([]byte, error) {
		return c.call(ctx, n, p, callReplState, body)
	})
	le, lv, err := c.repl.State(ino)
	if err != nil {
		return nil, 0, err
	}
	states := map[ids.ServerID]replVersion{c.self: {le, lv}}
	best, bestAt := replVersion{le, lv}, c.self
	// Once a majority answered, wait a little for the rest: a replica
	// that holds the newest state already needs only a restamp; a dead one
	// must not hold the recovery up.
	var extraT clock.Timer
	var extra <-chan time.Time
	defer func() {
		if extraT != nil {
			extraT.Stop()
		}
	}()
	for answered := 0; answered < len(c.others); {
		var r peerResult
		select {
		case r = <-ch:
			answered++
		case <-extra:
			answered = len(c.others)
			continue
		}
		if r.err != nil {
			continue
		}
		var rs replStateRep
		if parseReply(r.rep, &rs) != nil {
			continue
		}
		rv := replVersion{rs.Epoch, rs.Version}
		states[r.id] = rv
		if best.less(rv) {
			best, bestAt = rv, r.id
		}
		if extra == nil && len(states) >= c.majority() {
			extraT, extra = c.clk.NewTimer(max(c.lease/20, 5*time.Millisecond))
		}
	}
	return states, bestAt, nil
}

// takeNewest makes the newest state (bestAt's) this server's, stamped ep,
// and returns the state it took and whether the inode exists in it.
//
// This server usually holds the newest state already (changes go to
// every replica): then it only restamps it, whatever the inode's size.
// Otherwise the state is copied, a page per call, from a replica that
// has it (from itself at version 0: a server's own unstamped root).
func (c *Owner) takeNewest(ctx context.Context, n *paxosnode.Node, ino ids.Ino, ep ids.Epoch,
	states map[ids.ServerID]replVersion, bestAt ids.ServerID) (best replVersion, exists bool, err error) {
	best = states[bestAt]
	if states[c.self] == best && best.version > 0 {
		done, err := c.repl.Restamp(ino, best.epoch, best.version, ep)
		if err == nil && !done {
			err = fmt.Errorf("local replica moved from %v/%d during recovery", best.epoch, best.version)
		}
		if err != nil {
			if errors.Is(err, replica.ErrStaleEpoch) {
				n.Release(ino)
			}
			return best, false, errUnavailable("recovering %v: %v", ino, err)
		}
		return best, true, nil
	}
	var src replica.StateSource = c.repl
	if bestAt != c.self {
		src = peerState{c, n, bestAt}
	}
	start := c.clk.Now()
	// each page keeps the inode in use, so that a long copy does not
	// let the lease go idle
	got, err := replica.CopyInode(ctx, src, c.repl, ino,
		replica.CopyOptions{Epoch: ep, PageBytes: transferPage, OnPage: func() { n.Touch(ino) }})
	if err != nil {
		if errors.Is(err, replica.ErrStaleEpoch) {
			n.Release(ino)
		}
		return best, false, errUnavailable("recovering %v: copying its state from %v: %v", ino, bestAt, err)
	}
	c.log.Debug("copied inode state", "ino", ino, "from", bestAt, "records", got.Records, "bytes", got.Bytes,
		"pages", got.Pages, "attempts", got.Attempts, "took", c.clk.Now().Sub(start))
	// the source may have taken a last change of the previous owner
	// since it answered: write back the state actually copied
	return replVersion{got.Epoch, got.Version}, got.Records > 0, nil
}

// writeBackAll stamps the recovered state on every other replica that
// answered, and fails unless a majority (this server included) holds it.
//
// Write-backs copy the state a page per call, each call with its own
// timeout: a big inode takes longer than one call. Recovery waits for
// every answer (a dead replica's first call times out), so that no copy
// outlives it.
func (c *Owner) writeBackAll(ctx context.Context, n *paxosnode.Node, ino ids.Ino, states map[ids.ServerID]replVersion, best replVersion, ep ids.Epoch) error {
	acks := 1
	res := make(chan error, len(states))
	for p, st := range states {
		if p == c.self {
			continue
		}
		go func() { res <- c.writeBack(ctx, n, p, ino, st, best, ep) }()
	}
	for range len(states) - 1 {
		if err := <-res; err == nil {
			acks++
		} else if errors.Is(err, replica.ErrStaleEpoch) {
			n.Release(ino)
			return errUnavailable("recovering %v: %v", ino, err)
		}
	}
	if acks < c.majority() {
		return errUnavailable("recovering %v: written back to %d of %d servers", ino, acks, c.size)
	}
	return nil
}

// settleGrace records the inode as recovered under ep and, where its
// clients' locks may be unknown here, starts its grace period (grace.go).
//
// No grace if this server, in this run, was the inode's last owner
// (every owner that served restamped a majority, so the newest epoch
// of a majority names it): its lock table still holds whatever locks
// its clients had, failed clients' included, until they are stolen.
// Nor if the last owner says none of its clients can trust a lock.
// Nor if the newest state of a majority is unstamped (a fresh
// cluster's root): no owner ever served the inode, since an owner
// serves only after stamping a majority.
func (c *Owner) settleGrace(ctx context.Context, n *paxosnode.Node, ino ids.Ino, ep ids.Epoch, best replVersion, handedOver, exists bool, acquired clock.Time) {
	selfLast := paxos.BallotServer(best.epoch) == c.self && paxos.BallotBoot(best.epoch) == n.Boot()
	neverServed := best.epoch == 0
	needGrace := !handedOver && !selfLast && !neverServed && exists && !c.previousOwnerReleased(ctx, n, ino, best.epoch)
	c.mu.Lock()
	c.recovered[ino] = ep
	sameOwner := c.unsure[ino] == ep
	delete(c.unsure, ino)
	if needGrace && !sameOwner {
		// under mu with recovered: no request may take a client lock
		// on the inode before its grace is set (lock order: mu, then
		// the lock manager's)
		c.locks.Grace(ino, acquired.Add(c.graceTime))
		c.stats.graces.Add(1)
	}
	c.mu.Unlock()
}

// writeBack stamps the recovered state on replica p: a restamp if it holds
// it already, else the whole state, copied from this server's store (which
// holds it under epoch ep by now).
func (c *Owner) writeBack(ctx context.Context, n *paxosnode.Node, p ids.ServerID, ino ids.Ino, has, best replVersion, ep ids.Epoch) error {
	if has == best && best.version > 0 {
		req := restampReq{Ino: ino, Epoch: best.epoch, Version: best.version, NewEpoch: ep}
		cctx, cancel := context.WithTimeout(ctx, c.callWait)
		rep, err := c.call(cctx, n, p, callRestamp, req.Append(nil))
		cancel()
		if err != nil {
			return err
		}
		var done doneRep
		if err := parseReply(rep, &done); err != nil {
			return err
		}
		if done.Done {
			return nil
		}
		// it moved on meanwhile: send the state
	}
	return c.replaceAt(ctx, n, p, ino, ep)
}

// replaceAt copies ino's state from this server's store to replica p, a
// page per call, stamped ep (0: the state's own epoch).
//
// Concurrent copies of one inode to one replica join (c.pushes): every
// change that meets the replica's version gap would otherwise start its
// own copy of the whole state, each superseding the last at the replica.
func (c *Owner) replaceAt(ctx context.Context, n *paxosnode.Node, p ids.ServerID, ino ids.Ino, ep ids.Epoch) error {
	return c.pushes.join(ctx, pushKey{p, ino, ep}, func() error {
		start := c.clk.Now()
		got, err := replica.CopyInode(ctx, c.repl, peerState{c, n, p}, ino, replica.CopyOptions{Epoch: ep, PageBytes: transferPage})
		if err != nil {
			return err
		}
		c.log.Debug("sent inode state", "ino", ino, "to", p, "records", got.Records, "bytes", got.Bytes,
			"pages", got.Pages, "attempts", got.Attempts, "took", c.clk.Now().Sub(start))
		return nil
	})
}

// pushKey names a copy of an inode's state from this server to replica p,
// stamped ep.
type pushKey struct {
	p   ids.ServerID
	ino ids.Ino
	ep  ids.Epoch
}

type push struct {
	done chan struct{}
	err  error
}

// pushFlights runs one copy per pushKey at a time; callers that come while
// it runs wait for it and share its outcome.
type pushFlights struct {
	mu sync.Mutex
	m  map[pushKey]*push
}

// join runs fn unless a copy for k is under way, then waits for that one
// (or for ctx). A joiner may get a state read before the change it needs:
// it finds the gap again and copies once more.
func (f *pushFlights) join(ctx context.Context, k pushKey, fn func() error) error {
	f.mu.Lock()
	if p := f.m[k]; p != nil {
		f.mu.Unlock()
		select {
		case <-p.done:
			return p.err
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	p := &push{done: make(chan struct{})}
	f.m[k] = p
	f.mu.Unlock()
	p.err = fn()
	f.mu.Lock()
	delete(f.m, k)
	f.mu.Unlock()
	close(p.done)
	return p.err
}
