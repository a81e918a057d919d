package metaserver

import (
	"cmp"
	"context"
	"log/slog"
	"maps"
	"slices"
	"sync/atomic"
	"time"

	"github.com/leasefs/leasefs/blocks"
	"github.com/leasefs/leasefs/internal/clock"
	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/internal/ratelog"
	"github.com/leasefs/leasefs/metaserver/store"
)

// The collector's defaults (BlockGCConfig).
const (
	DefaultGCEvery      = 5 * time.Second
	DefaultGCBatch      = 1000
	DefaultOrphanEvery  = 10 * time.Minute
	DefaultOrphanDelay  = time.Hour
	DefaultOrphanInodes = 1000
	DefaultAdoptInodes  = 16
	// a failure that repeats every round is logged once a minute, with
	// the count of those left out
	gcWarnEvery = time.Minute
)

// GCStore is what the block collector needs of the metadata store
// (*store.Store). Its methods are called from the collector's goroutine.
type GCStore interface {
	// DueGarbageAfter is store.Store.DueGarbageAfter.
	DueGarbageAfter(now int64, after *store.Garbage, limit int, keep func(ids.Ino) bool) ([]store.Garbage, error)
	// ForgetGarbage is store.Store.ForgetGarbage.
	ForgetGarbage(gone []blocks.ID) error
	// UnknownBlocks is store.Store.UnknownBlocks.
	UnknownBlocks(list []blocks.ID) ([]blocks.ID, error)
}

var _ GCStore = (*store.Store)(nil)

// BlockGCConfig is how the block collector runs; zero fields take the
// defaults.
type BlockGCConfig struct {
	// Every is how often the collector deletes the garbage that is due.
	Every time.Duration
	// Batch is how many garbage records one query returns (and one
	// ForgetGarbage takes); a round goes on while queries come back full.
	Batch int
	// OrphanEvery is how often a scan of the block store for blocks that
	// no record names starts. A scan runs over several rounds,
	// OrphanInodes inodes per round.
	OrphanEvery  time.Duration
	OrphanInodes int
	// OrphanDelay is how old an unknown block must be before it is
	// deleted: longer than any mount takes from putting a block to
	// committing the map that references it.
	OrphanDelay time.Duration
	// Owns reports whether this server may change ino's records (in a
	// cluster, whether it owns ino); the collector leaves the other
	// inodes' blocks alone. Nil: every inode (a single server).
	Owns func(ino ids.Ino) bool
	// Adopter, if set, hands this server the garbage and orphans of the
	// inodes no server owns while it is the cluster's collector (a
	// cluster). AdoptInodes bounds the inodes it takes over per round.
	Adopter     Adopter
	AdoptInodes int
	// Clock times the rounds; nil is clock.Real.
	Clock clock.Clock
	// Now is the wall clock that garbage due times and block mtimes are
	// on; nil is time.Now.
	Now    func() time.Time
	Logger *slog.Logger
}

// BlockGCStats counts what the collector did since it started.
type BlockGCStats struct {
	Deleted     uint64 // garbage blocks deleted and forgotten
	Freed       uint64 // their bytes
	Orphans     uint64 // unknown blocks deleted
	OrphanBytes uint64 // their bytes
	Errors      uint64 // failed queries, deletes, forgets and listings
	Rounds      uint64
	Scans       uint64 // orphan scans finished
	Adopted     uint64 // inodes nobody owned taken over to collect them
}

// BlockGC deletes from the block store the blocks the metadata store no
// longer needs: garbage once due, and blocks no record names (orphans)
// once older than OrphanDelay. Run runs it; Stats may be called from any
// goroutine.
type BlockGC struct {
	meta GCStore
	blks blocks.Store
	cfg  BlockGCConfig
	log  *slog.Logger
	warn *ratelog.Limiter

	// The orphan scan in progress: the inodes still to look at, and when
	// the next scan starts. Only Run's goroutine touches them.
	scan     []ids.Ino
	nextScan clock.Time
	// collecting: this server is the cluster's collector this round;
	// adopt holds the inodes nobody owns whose orphans it is to look at
	// (only Run's goroutine touches them).
	collecting bool
	adopt      adoptQueue

	deleted, freed, orphans, orphanBytes, errs, rounds, scans, adopted atomic.Uint64
}

// NewBlockGC returns a collector over meta and blks; it does nothing until
// Run.
func NewBlockGC(meta GCStore, blks blocks.Store, cfg BlockGCConfig) *BlockGC {
	cfg.Every = cmp.Or(cfg.Every, DefaultGCEvery)
	cfg.Batch = cmp.Or(cfg.Batch, DefaultGCBatch)
	cfg.OrphanEvery = cmp.Or(cfg.OrphanEvery, DefaultOrphanEvery)
	cfg.OrphanInodes = cmp.Or(cfg.OrphanInodes, DefaultOrphanInodes)
	cfg.OrphanDelay = cmp.Or(cfg.OrphanDelay, DefaultOrphanDelay)
	cfg.AdoptInodes = cmp.Or(cfg.AdoptInodes, DefaultAdoptInodes)
	if cfg.Owns == nil {
		cfg.Owns = func(ids.Ino) bool { return true }
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	return &BlockGC{meta: meta, blks: blks, cfg: cfg, log: log,
		warn: ratelog.NewLimiter(1, gcWarnEvery, 16)}
}

// Stats returns the counts so far.
func (g *BlockGC) Stats() BlockGCStats {
	return BlockGCStats{Deleted: g.deleted.Load(), Freed: g.freed.Load(), Orphans: g.orphans.Load(),
		OrphanBytes: g.orphanBytes.Load(), Errors: g.errs.Load(), Rounds: g.rounds.Load(), Scans: g.scans.Load(),
		Adopted: g.adopted.Load()}
}

// Run collects every Every until ctx is done. The first orphan scan
// starts OrphanEvery in, once the mounts of before a restart have had
// their time to reclaim their locks and commit what they had put.
func (g *BlockGC) Run(ctx context.Context) {
	g.nextScan = g.cfg.Clock.Now().Add(g.cfg.OrphanEvery)
	t, tick := g.cfg.Clock.NewTimer(g.cfg.Every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick:
		}
		g.round(ctx)
		t.Reset(g.cfg.Every)
	}
}

// roundCounts is what one round did.
type roundCounts struct {
	deleted, freed, orphans, orphanBytes, errs, adopted uint64
}

// round deletes the due garbage, then takes the orphan scan a step on;
// the cluster's collector then takes over inodes nobody owns that have
// due garbage or orphans, and collects those. It logs one line if it
// deleted anything.
func (g *BlockGC) round(ctx context.Context) {
	var c roundCounts
	g.collecting = g.cfg.Adopter != nil && g.cfg.Adopter.Collector(ctx)
	g.collectGarbage(ctx, &c)
	g.scanStep(ctx, &c)
	if g.collecting && g.adoptStep(ctx, &c) {
		g.collectGarbage(ctx, &c)
	}
	g.rounds.Add(1)
	g.deleted.Add(c.deleted)
	g.freed.Add(c.freed)
	g.orphans.Add(c.orphans)
	g.orphanBytes.Add(c.orphanBytes)
	g.errs.Add(c.errs)
	g.adopted.Add(c.adopted)
	// errors alone are WARN lines already, rate limited
	if c.deleted+c.orphans > 0 {
		g.log.Info("block collector: round", "garbage", c.deleted, "garbage_bytes", c.freed,
			"orphans", c.orphans, "orphan_bytes", c.orphanBytes, "adopted", c.adopted, "errors", c.errs)
	}
}

// failed counts an error and logs it, at most once a minute per kind.
func (g *BlockGC) failed(c *roundCounts, kind string, err error, args ...any) {
	c.errs++
	g.warn.Warn(g.log, kind, "block collector: "+kind, append(args, "err", err)...)
}

// collectGarbage deletes the garbage due now, a page at a time, and
// forgets the blocks it deleted. A block whose delete failed keeps its
// record and is tried again next round; the pages go on past it.
func (g *BlockGC) collectGarbage(ctx context.Context, c *roundCounts) {
	now := g.cfg.Now().UnixNano()
	var after *store.Garbage
	for ctx.Err() == nil {
		page, err := g.meta.DueGarbageAfter(now, after, g.cfg.Batch, g.cfg.Owns)
		if err != nil {
			g.failed(c, "garbage query", err)
			return
		}
		if len(page) == 0 {
			return
		}
		after = &page[len(page)-1]
		gone := make([]blocks.ID, 0, len(page))
		var bytes uint64
		for _, gb := range page {
			err := g.blks.Delete(ctx, gb.ID)
			if ctx.Err() != nil {
				break // shutting down: forget what went
			}
			if err != nil {
				g.failed(c, "delete", err, "block", gb.ID.String())
				continue
			}
			gone = append(gone, gb.ID)
			bytes += gb.Size
		}
		if err := g.meta.ForgetGarbage(gone); err != nil {
			g.failed(c, "forget garbage", err, "blocks", len(gone))
		} else {
			c.deleted += uint64(len(gone))
			c.freed += bytes
		}
		if len(page) < g.cfg.Batch {
			return
		}
	}
}

// scanStep starts an orphan scan when one is due, by listing the inodes
// that have blocks, and looks at up to OrphanInodes of them.
func (g *BlockGC) scanStep(ctx context.Context, c *roundCounts) {
	if len(g.scan) == 0 {
		if g.cfg.Clock.Now().Before(g.nextScan) {
			return
		}
		g.nextScan = g.cfg.Clock.Now().Add(g.cfg.OrphanEvery)
		g.removeStaleTemps(c)
		inos, err := g.inodesWithBlocks(ctx)
		if err != nil {
			g.failed(c, "list", err)
			return
		}
		g.scan = inos
	}
	n := min(len(g.scan), g.cfg.OrphanInodes)
	cutoff := g.cfg.Now().Add(-g.cfg.OrphanDelay)
	for _, ino := range g.scan[:n] {
		if ctx.Err() != nil {
			return
		}
		g.scanInode(ctx, ino, cutoff, c)
	}
	g.scan = g.scan[n:]
	if len(g.scan) == 0 {
		g.scans.Add(1)
	}
}

// tempRemover is a store whose writers may leave parts of blocks behind
// when they die mid-Put (blocks.FileStore's temp files).
type tempRemover interface {
	RemoveStaleTemps(age time.Duration) (int, error)
}

// removeStaleTemps removes what writers that died mid-Put left, once as
// old as an orphan, counted with the orphans.
func (g *BlockGC) removeStaleTemps(c *roundCounts) {
	tr, ok := g.blks.(tempRemover)
	if !ok {
		return
	}
	n, err := tr.RemoveStaleTemps(g.cfg.OrphanDelay)
	if err != nil {
		g.failed(c, "temp files", err)
	}
	c.orphans += uint64(n)
}

// inodesWithBlocks lists the block store's inodes, in order. Whether
// this server owns one is asked when the scan reaches it: ownership may
// move meanwhile.
func (g *BlockGC) inodesWithBlocks(ctx context.Context) ([]ids.Ino, error) {
	seen := map[ids.Ino]bool{}
	err := g.blks.List(ctx, blocks.AllInodes, func(id blocks.ID, _ int64, _ time.Time) error {
		seen[id.Ino] = true
		return nil
	})
	out := slices.Sorted(maps.Keys(seen))
	return out, err
}

// scanInode deletes ino's blocks that no record names and that were put
// before cutoff, if this server owns ino. The cluster's collector queues
// an inode nobody owns whose replica here names not all of its old
// blocks, to take it over (adoptStep) and look again.
func (g *BlockGC) scanInode(ctx context.Context, ino ids.Ino, cutoff time.Time, c *roundCounts) {
	owned := g.cfg.Owns(ino)
	if !owned && !g.collecting {
		return
	}
	var old []blocks.ID
	size := map[blocks.ID]int64{}
	err := g.blks.List(ctx, ino, func(id blocks.ID, n int64, mtime time.Time) error {
		if mtime.Before(cutoff) {
			old = append(old, id)
			size[id] = n
		}
		return nil
	})
	if err != nil {
		g.failed(c, "list", err, "ino", ino)
		return
	}
	if len(old) == 0 {
		return
	}
	unknown, err := g.meta.UnknownBlocks(old)
	if err != nil {
		g.failed(c, "orphan query", err, "ino", ino)
		return
	}
	if !owned {
		// This replica may lag behind the inode's last owner, so its
		// answer is a hint only: the blocks are looked at again once
		// this server owns the inode, recovered.
		if len(unknown) > 0 && !g.cfg.Adopter.OwnedElsewhere(ino) {
			g.adopt.add(ino)
		}
		return
	}
	for _, id := range unknown {
		if err := g.blks.Delete(ctx, id); ctx.Err() != nil {
			return
		} else if err != nil {
			g.failed(c, "delete", err, "block", id.String())
			continue
		}
		c.orphans++
		c.orphanBytes += uint64(size[id])
	}
}
