package metaserver

import (
	"bytes"
	"context"
	"maps"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/leasefs/leasefs/blocks"
	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/metaserver/ownership"
)

// gcCluster is a 3-server cluster on one shared block directory whose
// collectors run every 100 ms, with the given orphan delay (0: the
// default, an hour).
func gcCluster(t *testing.T, orphanDelay time.Duration) *testCluster {
	shared := t.TempDir()
	return newTestCluster(t, 3, func(id ids.ServerID, cfg *Config) {
		cfg.Blocks = "file:" + shared
		cfg.BlocksListen = "127.0.0.1:0"
		cfg.gcEvery = 100 * time.Millisecond
		cfg.OrphanDelay = orphanDelay
	})
}

// blockSet lists ino's blocks in the (shared) block store.
func blockSet(t *testing.T, s *Server, ino ids.Ino) map[blocks.ID]bool {
	t.Helper()
	out := map[blocks.ID]bool{}
	err := s.blocks.store.List(context.Background(), ino, func(id blocks.ID, _ int64, _ time.Time) error {
		out[id] = true
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// waitFor polls cond until it holds, failing after within; it returns
// how long that took.
func waitFor(t *testing.T, within time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > within {
			t.Fatalf("%s: not within %v", what, within)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return time.Since(start)
}

// gcFile is a file written as several blocks through some server.
type gcFile struct {
	ino    ids.Ino
	data   []byte
	blocks map[blocks.ID]bool
}

// writeBlocks creates name through server via and writes it as n blocks
// of 100 KiB (one per write: past wire.InlineMax, the server puts each
// write as a block). Its client is closed when it returns: a client of
// a server that dies takes a minute to close.
func writeBlocks(ctx context.Context, t *testing.T, tc *testCluster, via ids.ServerID, name string, n int, seed uint64) gcFile {
	t.Helper()
	c := tc.connectUnmanaged(via)
	defer c.Close()
	f := mustCreate(ctx, t, c, name)
	var data []byte
	for i := range n {
		piece := randData(100<<10, seed+uint64(i))
		call(ctx, t, c, writeReq(f.Ino, uint64(len(data)), piece))
		data = append(data, piece...)
	}
	got := blockSet(t, tc.srv[via], f.Ino)
	if len(got) < n {
		t.Fatalf("%s: %d blocks in the store, want %d", name, len(got), n)
	}
	return gcFile{ino: f.Ino, data: data, blocks: got}
}

// checkIntact reads every file back through every running server and
// checks that none of its blocks left the store.
func checkIntact(ctx context.Context, t *testing.T, tc *testCluster, files map[string]gcFile) {
	t.Helper()
	for _, id := range slices.Sorted(maps.Keys(tc.srv)) {
		c := tc.connect(id)
		for name, f := range files {
			if got := readOp(ctx, t, c, f.ino, uint64(len(f.data))); !bytes.Equal(got, f.data) {
				t.Fatalf("%s through %v: its data differs", name, id)
			}
			have := blockSet(t, tc.srv[id], f.ino)
			for b := range f.blocks {
				if !have[b] {
					t.Fatalf("%s: its block %v was deleted", name, b)
				}
			}
		}
	}
}

// gcTotals sums the collector counters of the running servers.
func gcTotals(tc *testCluster) (total BlockGCStats) {
	for _, s := range tc.srv {
		st := s.blocks.gc.Stats()
		total.Deleted += st.Deleted
		total.Orphans += st.Orphans
		total.Adopted += st.Adopted
	}
	return total
}

// collector returns the running server that owns the collector's inode.
func (tc *testCluster) collector(t *testing.T) ids.ServerID {
	t.Helper()
	var found ids.ServerID
	waitFor(t, 10*time.Second, "a running server is the collector", func() bool {
		for id, s := range tc.srv {
			if _, err := s.owner.OwnerEpoch(ownership.CollectorIno); err == nil {
				found = id
				return true
			}
		}
		return false
	})
	return found
}

// TestClusterCollectsDeadOwnersGarbage: a file written as several blocks
// through server 1 is removed there, and server 1 dies before its
// garbage is due. Nobody owns the file's inode any more: the cluster's
// collector, a surviving server, takes it over and deletes its blocks
// from the shared directory within the garbage delay and a few rounds;
// the files that stay, one of them the dead server's too, read back
// intact with every block.
func TestClusterCollectsDeadOwnersGarbage(t *testing.T) {
	tc := gcCluster(t, 0)
	ctx := testContext(t)
	files := map[string]gcFile{
		"stays1": writeBlocks(ctx, t, tc, 1, "stays1", 3, 100),
		"stays2": writeBlocks(ctx, t, tc, 2, "stays2", 3, 200),
	}
	gone := writeBlocks(ctx, t, tc, 1, "gone", 4, 300)
	c1 := tc.connectUnmanaged(1)
	rm := time.Now() // before the removal: its garbage is due no sooner than delay after
	if err := c1.Unlink(ctx, ids.RootIno, "gone"); err != nil {
		t.Fatal(err)
	}
	c1.Close()
	// the removal made the blocks garbage, on the replicas too
	for _, id := range []ids.ServerID{2, 3} {
		g, err := tc.srv[id].store.DueGarbageAfter(math.MaxInt64, nil, 0, func(ino ids.Ino) bool { return ino == gone.ino })
		if err != nil {
			t.Fatal(err)
		}
		if len(g) != len(gone.blocks) {
			t.Fatalf("server %v holds %d garbage records of the removed file, want %d", id, len(g), len(gone.blocks))
		}
	}
	tc.kill(1)
	delay := garbageDelay(&tc.srv[2].cfg)
	if since := time.Since(rm); since >= delay {
		t.Fatalf("server 1 died %v after the removal, not before the garbage was due (%v)", since, delay)
	}
	bound := delay + 10*time.Second
	waitFor(t, bound, "the removed file's blocks leave the shared directory", func() bool {
		return len(blockSet(t, tc.srv[2], gone.ino)) == 0
	})
	took := time.Since(rm)
	if took < delay {
		t.Fatalf("the blocks went %v after the removal, before the garbage delay %v", took, delay)
	}
	t.Logf("%d garbage blocks of the dead owner's file collected %v after the removal (garbage delay %v, bound %v), by the collector %v",
		len(gone.blocks), took.Round(time.Millisecond), delay, bound, tc.collector(t))
	// the round counts what it did once the garbage records are gone too
	waitFor(t, 5*time.Second, "the collector counts the takeover and the deletes", func() bool {
		st := gcTotals(tc)
		return st.Deleted >= uint64(len(gone.blocks)) && st.Adopted > 0
	})
	checkIntact(ctx, t, tc, files)
}

// TestClusterCollectsDeadOwnersOrphans: a block put for a file owned by
// server 1 (as a mount under the file's X lock puts it) is never
// committed: server 1 dies first. The cluster's collector takes the
// inode over once the block is older than the orphan delay, finds that
// no map names it, and deletes it; the files that stay read back intact
// with every block, the dead server's included.
func TestClusterCollectsDeadOwnersOrphans(t *testing.T) {
	const orphanDelay = time.Second
	tc := gcCluster(t, orphanDelay)
	ctx := testContext(t)
	files := map[string]gcFile{
		"stays1": writeBlocks(ctx, t, tc, 1, "stays1", 3, 100),
		"stays2": writeBlocks(ctx, t, tc, 2, "stays2", 3, 200),
	}
	c1 := tc.connectUnmanaged(1)
	f := mustCreate(ctx, t, c1, "uncommitted")
	takeX(ctx, t, c1, f.Ino)
	put := time.Now() // before the puts: the blocks' mtimes are later
	orphan := putBlock(t, f.Ino, randData(100<<10, 400), tc.srv[1])
	orphanID := blocks.ID{Ino: f.Ino, Unique: orphan.Unique}
	// and one for a file that stays: only the unnamed block goes
	extra := putBlock(t, files["stays1"].ino, randData(10, 401), tc.srv[1])
	c1.Close()
	tc.kill(1)
	bound := orphanDelay + 10*time.Second
	waitFor(t, bound, "the uncommitted blocks leave the shared directory", func() bool {
		return !blockSet(t, tc.srv[2], f.Ino)[orphanID] &&
			!blockSet(t, tc.srv[2], files["stays1"].ino)[blocks.ID{Ino: files["stays1"].ino, Unique: extra.Unique}]
	})
	took := time.Since(put)
	// file times come from the kernel's coarse clock, a tick behind
	if took < orphanDelay-10*time.Millisecond {
		t.Fatalf("orphans deleted %v after their put, before the orphan delay %v", took, orphanDelay)
	}
	t.Logf("orphans of the dead owner's files collected %v after their put (orphan delay %v, bound %v), by the collector %v",
		took.Round(time.Millisecond), orphanDelay, bound, tc.collector(t))
	waitFor(t, 5*time.Second, "the collector counts the takeovers and the deletes", func() bool {
		st := gcTotals(tc)
		return st.Orphans >= 2 && st.Adopted >= 2
	})
	checkIntact(ctx, t, tc, files)
}

// TestClusterOneCollector: one server at a time is the collector, and
// a collector never takes an inode another live server owns.
func TestClusterOneCollector(t *testing.T) {
	tc := gcCluster(t, 0)
	ctx := testContext(t)
	first := tc.collector(t)
	var collectors []ids.ServerID
	for id, s := range tc.srv {
		if s.owner.Collector(ctx) {
			collectors = append(collectors, id)
		}
	}
	if len(collectors) != 1 || collectors[0] != first {
		t.Fatalf("collectors %v, want only %v", collectors, first)
	}
	other := first%3 + 1
	f := writeBlocks(ctx, t, tc, other, "f", 1, 1)
	owns, err := tc.srv[first].owner.OwnIfFree(ctx, f.ino)
	if err != nil || owns {
		t.Fatalf("the collector took an inode server %v owns: %v, %v", other, owns, err)
	}
	if _, err := tc.srv[other].owner.OwnerEpoch(f.ino); err != nil {
		t.Fatalf("server %v lost its inode to the collector: %v", other, err)
	}
	// the collector dies: another server takes its place
	tc.kill(first)
	next := tc.collector(t)
	if next == first {
		t.Fatal("a dead server is still the collector")
	}
}
