package ownership

// Replication: every change reaches a majority before the reply.

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/leasefs/leasefs/internal/clock"
	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/metaserver/paxosnode"
	"github.com/leasefs/leasefs/metaserver/replica"
	"github.com/leasefs/leasefs/metaserver/store"
	"github.com/leasefs/leasefs/wire"
)

// Replicate is the store's Replicate: the change goes to every replica and
// counts once a majority, this server's synced store included, has it.
func (c *Owner) Replicate(writes []store.Write) error {
	changes := replica.SplitByInode(writes)
	if len(changes) == 0 {
		return nil
	}
	n := c.node.Load()
	req := applyReq{Changes: changes}
	body := req.Append(nil)
	deadline := c.clk.Now().Add(c.callWait)
	ctx, cancel := context.WithTimeout(context.Background(), c.callWait)
	up := 0
	for _, p := range c.others {
		if !c.down(p) {
			up++
		}
	}
	skipDown := up+1 >= c.majority()
	ch := make(chan error, len(c.others))
	sent := 0
	for _, p := range c.others {
		if skipDown && c.down(p) {
			continue
		}
		sent++
		done := c.lanes[p].send(changes, body, deadline)
		go func() {
			select {
			case err := <-done:
				ch <- err
			case <-ctx.Done():
				ch <- ctx.Err()
			}
		}()
	}
	acks := 1 // this replica: the store commits and syncs after us
	var firstErr, noSpace error
	got := 0
	for ; got < sent && acks < c.majority(); got++ {
		err := <-ch
		switch {
		case err == nil:
			acks++
		case firstErr == nil || errors.Is(err, replica.ErrStaleEpoch):
			firstErr = err
		}
		if err != nil && wire.CodeOf(err) == wire.CodeNoSpace {
			noSpace = err
		}
	}
	// stragglers finish in the background, within the call timeout
	go func() {
		for ; got < sent; got++ {
			<-ch
		}
		cancel()
	}()
	if acks >= c.majority() {
		c.stats.replicated.Add(int64(len(changes)))
		return nil
	}
	c.stats.replFailed.Add(int64(len(changes)))
	// Some replicas may hold the change (a lost answer): recover the
	// inodes from a majority before serving them again.
	c.markUnsure(changes)
	var stale *replica.StaleEpochError
	if errors.As(firstErr, &stale) {
		// fenced: a newer owner exists; stop believing at once
		c.stats.staleRejected.Add(1)
		c.mu.Lock()
		delete(c.recovered, stale.Ino)
		c.mu.Unlock()
		n.Release(stale.Ino)
		return errUnavailable("%v has a newer owner", stale.Ino)
	}
	if noSpace != nil {
		// a replica refused it for want of space, and the others do
		// not make a majority: as final as a full disk here (ENOSPC,
		// not "try again", which would have the client resend for ever)
		return wire.Errf(wire.CodeNoSpace, "change reached %d of %d servers: %v", acks, c.size, noSpace)
	}
	return errUnavailable("change reached %d of %d servers: %v", acks, c.size, firstErr)
}

// peerLane sends changes to one peer in the order replicate made them:
// Replicate returns once a majority has a change, so the next change of
// the same inode may start while a slower peer still receives the last;
// out of order, that peer would find a version gap and need the whole
// inode pushed. One call is in flight per lane; the changes queued
// meanwhile go together in the next call, applied by the peer in one
// transaction and one sync (group commit): a lane that sent one change
// per round trip held a server's concurrent clients to one change per
// round trip.
type peerLane struct {
	clk     clock.Clock
	apply   func(ctx context.Context, body []byte) (answered bool, err error)
	mu      sync.Mutex
	queue   []*laneItem
	sending bool
}

// laneItem is one replicate call's changes for the lane, and where its
// result goes.
type laneItem struct {
	changes  []replica.Change
	body     []byte // applyReq{changes}
	deadline clock.Time
	done     chan error
}

const (
	laneBatchBytes = 2 << 20 // encoded changes per call (one item may exceed it)
	laneBatchMax   = 256     // replicate calls per call
)

func newPeerLane(clk clock.Clock, apply func(ctx context.Context, body []byte) (bool, error)) *peerLane {
	return &peerLane{clk: clk, apply: apply}
}

// send queues changes behind every earlier change and returns the channel
// their result comes on (buffered: nobody need wait for it).
func (l *peerLane) send(changes []replica.Change, body []byte, deadline clock.Time) <-chan error {
	it := &laneItem{changes: changes, body: body, deadline: deadline, done: make(chan error, 1)}
	l.mu.Lock()
	l.queue = append(l.queue, it)
	start := !l.sending
	l.sending = true
	l.mu.Unlock()
	if start {
		go l.drain()
	}
	return it.done
}

// drain sends the queue, a batch per call, until it is empty.
func (l *peerLane) drain() {
	for {
		l.mu.Lock()
		if len(l.queue) == 0 {
			l.sending = false
			l.mu.Unlock()
			return
		}
		n, size := 0, 0
		for n < len(l.queue) && n < laneBatchMax && (n == 0 || size+len(l.queue[n].body) <= laneBatchBytes) {
			size += len(l.queue[n].body)
			n++
		}
		batch := slices.Clone(l.queue[:n])
		l.queue = slices.Delete(l.queue, 0, n)
		l.mu.Unlock()
		l.sendBatch(batch)
	}
}

func (l *peerLane) sendBatch(batch []*laneItem) {
	deadline := batch[0].deadline
	for _, it := range batch {
		deadline = max(deadline, it.deadline)
	}
	ctx, cancel := context.WithTimeout(context.Background(), clock.Until(l.clk, deadline))
	defer cancel()
	if len(batch) == 1 {
		_, err := l.apply(ctx, batch[0].body)
		batch[0].done <- err
		return
	}
	var all []replica.Change
	for _, it := range batch {
		all = append(all, it.changes...)
	}
	answered, err := l.apply(ctx, (&applyReq{Changes: all}).Append(nil))
	if err == nil || !answered {
		for _, it := range batch {
			it.done <- err
		}
		return
	}
	// The peer refused the batch as a whole (a newer epoch of one of its
	// inodes): each change gets its own answer.
	for _, it := range batch {
		ictx, icancel := context.WithTimeout(context.Background(), max(clock.Until(l.clk, it.deadline), time.Second))
		_, err := l.apply(ictx, it.body)
		icancel()
		it.done <- err
	}
}

// Uncommitted is the store's Uncommitted: the change reached a majority
// but this replica failed to commit it.
func (c *Owner) Uncommitted(writes []store.Write) {
	c.log.Warn("replicated change not committed locally; recovering its inodes before serving them", "inodes", len(replica.SplitByInode(writes)))
	c.markUnsure(replica.SplitByInode(writes))
}

// markUnsure makes the next request on each inode recover it from a
// majority first: this replica may not hold the newest state, and nothing
// may be served (a read, or the answer to a resend of the same request)
// from a state that is not on a majority.
func (c *Owner) markUnsure(changes []replica.Change) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, ch := range changes {
		if ep, ok := c.recovered[ch.Ino]; ok {
			c.unsure[ch.Ino] = ep
			delete(c.recovered, ch.Ino)
		}
	}
}

// applyAt sends changes to p; a replica that lacks the inode's previous
// state gets the whole state first.
func (c *Owner) applyAt(ctx context.Context, n *paxosnode.Node, p ids.ServerID, body []byte) (answered bool, _ error) {
	for try := 0; ; try++ {
		c.stats.replCalls.Add(1)
		rep, err := c.call(ctx, n, p, callApply, body)
		if err != nil {
			return answered, err
		}
		answered = true
		err = parseReply(rep, nil)
		var gap *replica.VersionGapError
		if !errors.As(err, &gap) || try == 3 {
			return answered, err
		}
		// The push may outlive the change's deadline (ctx): a big inode
		// takes many calls, each with its own timeout. close waits for it
		// (wg) before the store closes; added before stop is checked, so
		// that a push either sees stop or is waited for.
		c.wg.Add(1)
		select {
		case <-c.stop:
			c.wg.Done()
			return answered, errUnavailable("server closing")
		default:
		}
		c.stats.statePushes.Add(1)
		err = c.replaceAt(context.WithoutCancel(ctx), n, p, gap.Ino, 0)
		c.wg.Done()
		if err != nil {
			return answered, err
		}
	}
}
