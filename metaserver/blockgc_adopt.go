package metaserver

// The cluster's collector: the garbage and orphans of inodes that no
// server owns (their owner died, or let them go while idle) would stay
// until some request made a server take the inode again, maybe never.
// One server, the collector, takes such inodes over a few per round and
// collects them as their owner would.
//
// Why a takeover makes the orphan check safe even on a replica that
// lagged: a block is referenced only once a map change naming it reached
// a majority of the replicas (the owner replicates before it
// acknowledges). Taking an inode over recovers it first: this server's
// replica gets the newest state among a majority, which shares a replica
// with every majority that took a change, so it holds every committed
// map; and while this server owns the inode no other can commit a change
// to it (replicas fence older epochs). The unknown-block check therefore
// runs against the inode's authoritative state, never against the lagging
// replica's answer, which only says where to look. Blocks put but not yet
// committed are the orphan delay's to protect, as on an owner. Garbage
// goes no sooner than its owner would have deleted it: its due time,
// which outlasts any reader's lock and lease, was set when the change
// that freed it committed.

import (
	"context"

	"github.com/leasefs/leasefs/blocks"
	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/metaserver/ownership"
	"github.com/leasefs/leasefs/metaserver/store"
)

// Adopter is how a cluster server becomes the owner of inodes nobody
// owns, to collect them (*ownership.Owner). Called from the collector's
// goroutine.
type Adopter interface {
	// Collector reports whether this server is the cluster's collector
	// now (one server at a time).
	Collector(ctx context.Context) bool
	// OwnedElsewhere reports whether another server owns ino, as far as
	// this one knows: that owner collects it.
	OwnedElsewhere(ino ids.Ino) bool
	// OwnIfFree makes this server ino's recovered owner if no server
	// owns it, never by asking a live owner to hand it over, and reports
	// whether it owns ino now.
	OwnIfFree(ctx context.Context, ino ids.Ino) (bool, error)
}

var _ Adopter = (*ownership.Owner)(nil)

// adoptQueue is the inodes nobody owns that an orphan scan found with
// blocks this server's replica does not name, each once, in order.
type adoptQueue struct {
	inos []ids.Ino
	in   map[ids.Ino]bool
}

func (q *adoptQueue) add(ino ids.Ino) {
	if q.in == nil {
		q.in = map[ids.Ino]bool{}
	}
	if !q.in[ino] {
		q.in[ino] = true
		q.inos = append(q.inos, ino)
	}
}

func (q *adoptQueue) pop() (ids.Ino, bool) {
	if len(q.inos) == 0 {
		return 0, false
	}
	ino := q.inos[0]
	q.inos = q.inos[1:]
	delete(q.in, ino)
	return ino, true
}

// adoptStep takes over up to AdoptInodes inodes nobody owns: first those
// with due garbage, then those the orphan scan queued, whose orphans it
// then deletes. It reports whether it took over one with due garbage
// (which the caller then collects).
func (g *BlockGC) adoptStep(ctx context.Context, c *roundCounts) bool {
	budget := g.cfg.AdoptInodes
	garbage := false
	for _, ino := range g.garbageCandidates(ctx, c, budget) {
		budget--
		if g.take(ctx, ino, c) {
			garbage = true
		}
	}
	cutoff := g.cfg.Now().Add(-g.cfg.OrphanDelay)
	for budget > 0 && ctx.Err() == nil {
		ino, ok := g.adopt.pop()
		if !ok {
			break
		}
		if !g.cfg.Owns(ino) {
			budget--
			if !g.take(ctx, ino, c) {
				continue // the next scan finds it again if need be
			}
		}
		g.scanInode(ctx, ino, cutoff, c)
	}
	return garbage
}

// take makes this server the owner of ino, which nobody owned.
func (g *BlockGC) take(ctx context.Context, ino ids.Ino, c *roundCounts) bool {
	owns, err := g.cfg.Adopter.OwnIfFree(ctx, ino)
	if err != nil {
		g.failed(c, "take over", err, "ino", ino)
		return false
	}
	if owns {
		c.adopted++
	}
	return owns
}

// garbageCandidates returns up to limit inodes with due garbage that no
// server owns, as far as this server knows, in order: one garbage query
// per inode, each starting past the last inode's records.
func (g *BlockGC) garbageCandidates(ctx context.Context, c *roundCounts, limit int) []ids.Ino {
	now := g.cfg.Now().UnixNano()
	free := map[ids.Ino]bool{}
	keep := func(ino ids.Ino) bool {
		f, ok := free[ino]
		if !ok {
			f = !g.cfg.Owns(ino) && !g.cfg.Adopter.OwnedElsewhere(ino)
			free[ino] = f
		}
		return f
	}
	var out []ids.Ino
	var after *store.Garbage
	for len(out) < limit && ctx.Err() == nil {
		page, err := g.meta.DueGarbageAfter(now, after, 1, keep)
		if err != nil {
			g.failed(c, "garbage query", err)
			break
		}
		if len(page) == 0 {
			break
		}
		ino := page[0].ID.Ino
		out = append(out, ino)
		// the greatest key ino's garbage can have: the next query starts
		// at the next inode's
		last := store.Garbage{ID: blocks.ID{Ino: ino}, Due: -1}
		for i := range last.ID.Unique {
			last.ID.Unique[i] = 0xff
		}
		after = &last
	}
	return out
}
