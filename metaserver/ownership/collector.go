package ownership

// The cluster's block collector: one server at a time takes over the
// inodes no server owns, to delete their garbage and orphans.

import (
	"context"
	"errors"

	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/metaserver/paxosnode"
)

// CollectorIno is the inode whose owner is the cluster's block collector.
// It names no file: an inode number carries the id of the server that
// allocated it in its top byte, server ids start at 1, and the root is
// the only number with a zero top byte in use, so no allocation ever
// produces it. Not the root itself: a takeover of the root without a
// hand-over (its owner died) starts a grace in which no client may lock
// the root directory for τ(1+δ), and the collector would move with every
// client that works in it; no client ever locks this inode, so taking it
// over stalls nobody and nothing pulls it away.
const CollectorIno = ids.Ino(2)

// Collector reports whether this server is the cluster's collector now:
// it owns CollectorIno, taking it if no server does (never from a live
// owner). Once it has it, the inode is pinned: it stays with this server
// while it runs, renewed, and goes to another only when this one dies or
// is cut off.
func (c *Owner) Collector(ctx context.Context) bool {
	owns, err := c.OwnIfFree(ctx, CollectorIno)
	if err != nil {
		c.log.Debug("cannot take the collector's inode", "err", err)
	}
	if owns {
		c.pinCollector.Do(func() { c.node.Load().Pin(CollectorIno) })
	}
	return owns
}

// OwnedElsewhere reports whether another server owns ino, as far as this
// server has learnt.
func (c *Owner) OwnedElsewhere(ino ids.Ino) bool {
	n := c.node.Load()
	if n == nil {
		return false
	}
	o, ok := n.Owner(ino)
	return ok && o != c.self
}

// OwnIfFree makes this server the recovered owner of ino if no server
// owns it, and reports whether it owns ino now. Unlike the acquire of a
// request (own), it never asks a live owner to hand ino over, so that the
// collector does not pull clients' inodes away from the server serving
// them: a known owner, or one its PaxosLease acquire learns of, is a
// false at once. The takeover recovers ino from a majority, as own does.
func (c *Owner) OwnIfFree(ctx context.Context, ino ids.Ino) (bool, error) {
	n := c.node.Load()
	if n == nil {
		return false, errUnavailable("server starting")
	}
	if _, ok := c.ready(n, ino); ok {
		n.Touch(ino)
		return true, nil
	}
	if o, ok := n.Owner(ino); ok && o != c.self {
		return false, nil
	}
	defer c.owning.lock(ino)()
	if _, ok := c.ready(n, ino); ok {
		n.Touch(ino)
		return true, nil
	}
	actx, cancel := context.WithTimeout(ctx, c.acquireTry)
	ep, err := n.Acquire(actx, ino)
	cancel()
	acquired := c.clk.Now()
	var no *paxosnode.NotOwnerError
	switch {
	case errors.As(err, &no):
		return false, nil
	case err != nil:
		return false, c.acquireErr(ino, err)
	}
	if err := c.recoverInode(ctx, n, ino, ep, false, acquired); err != nil {
		return false, err
	}
	return true, nil
}
