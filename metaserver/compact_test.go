package metaserver

import (
	"bytes"
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/leasefs/leasefs/blocks/blockmap"
	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/wire"
)

// collectDue runs one round of a collector of s's garbage whose clock is
// past every due time, and returns how many blocks it deleted.
func collectDue(t *testing.T, s *Server) uint64 {
	t.Helper()
	gc := NewBlockGC(s.store, s.blocks.store, BlockGCConfig{OrphanEvery: time.Hour, Logger: s.log,
		Now: func() time.Time { return time.Now().Add(garbageDelay(&s.cfg) + time.Second) }})
	gc.round(context.Background())
	return gc.Stats().Deleted
}

// mapOf is ino's block map, failing the test if it has none.
func mapOf(t *testing.T, s *Server, ino ids.Ino) *blockmap.Map {
	t.Helper()
	m, err := s.store.BlockMap(ino)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestCompactAppends: a file of 100 KB appended 500 times a line through
// OpWrite, each append a block the server puts, keeps a few blocks: the
// server compacts after each write. The file reads back exactly, its
// attributes are a write's (compaction moves neither Version nor times),
// and the blocks compaction freed are garbage, deleted once due.
func TestCompactAppends(t *testing.T) {
	s := startBlockTestServer(t)
	ctx := testContext(t)
	a, b := connect(t, s), connect(t, s)
	f := mustCreate(ctx, t, a, "log")
	want := randData(100_000, 3)
	call(ctx, t, a, writeReq(f.Ino, 0, want))
	var last *wire.Attr
	for i := range 500 {
		line := []byte("line " + string(rune('a'+i%26)) + " of the log, appended alone\n")
		last = call(ctx, t, a, &wire.Request{Op: wire.OpWrite, Ino: f.Ino, Flags: wire.WriteAppend, Data: line}).Attr
		want = append(want, line...)
	}
	m := mapOf(t, s, f.Ino)
	written, rewritten := int64(len(want)), s.counters.CompactedBytes.Load()
	t.Logf("501 writes: %d blocks, %d extents; %d compactions rewrote %d bytes, %.2f per byte written; %d blocks in the store",
		m.Blocks(), len(m.Extents()), s.counters.Compactions.Load(), rewritten, float64(rewritten)/float64(written), storeBlocks(t, s, f.Ino))
	if m.Blocks() > 12 || len(m.Extents()) > 12 {
		t.Errorf("%d blocks, %d extents after 501 writes, want at most 12", m.Blocks(), len(m.Extents()))
	}
	if rewritten > 8*written {
		t.Errorf("rewrote %d bytes for %d written", rewritten, written)
	}
	if cur, err := s.store.GetAttr(f.Ino); err != nil || cur.Version != last.Version || cur.Mtime != last.Mtime || cur.Size != uint64(len(want)) {
		t.Errorf("attributes %+v after compaction, the last write answered %+v (%v)", cur, last, err)
	}
	if got, _ := readPieces(ctx, t, s, b, f.Ino); !bytes.Equal(got, want) {
		t.Fatal("pieces differ from what was written")
	}
	if got := readOp(ctx, t, a, f.Ino, uint64(len(want))); !bytes.Equal(got, want) {
		t.Fatal("OpRead differs from what was written")
	}
	garbage, err := s.store.DueGarbageAfter(1<<62, nil, 0, nil)
	if err != nil || len(garbage) < 400 {
		t.Fatalf("%d garbage records (%v), want one for most writes", len(garbage), err)
	}
	for _, g := range garbage {
		if g.Due < time.Now().Add(garbageDelay(&s.cfg)-time.Minute).UnixNano() {
			t.Fatalf("garbage %+v due before the garbage delay", g)
		}
	}
	if due, err := s.store.DueGarbageAfter(time.Now().UnixNano(), nil, 0, nil); err != nil || len(due) != 0 {
		t.Fatalf("%d garbage blocks due at once (%v)", len(due), err)
	}
	if n := collectDue(t, s); n != uint64(len(garbage)) {
		t.Errorf("collector deleted %d of %d garbage blocks", n, len(garbage))
	}
	if n := storeBlocks(t, s, f.Ino); n != m.Blocks() {
		t.Errorf("%d blocks in the store once the garbage went, the map has %d", n, m.Blocks())
	}
	if got, _ := readPieces(ctx, t, s, b, f.Ino); !bytes.Equal(got, want) {
		t.Fatal("pieces differ once the garbage went")
	}
}

// TestCompactRandomCommits: 300 random 4 KiB writes into a 1 MiB file,
// each committed by the client as a block of its own (OpCommitBlocks),
// leave a bounded number of blocks, and the file reads back as written.
func TestCompactRandomCommits(t *testing.T) {
	s := startBlockTestServer(t)
	ctx := testContext(t)
	a, b := connect(t, s), connect(t, s)
	f := mustCreate(ctx, t, a, "f")
	takeX(ctx, t, a, f.Ino)
	const size, page = 1 << 20, 4096
	want := randData(size, 4)
	blk := putBlock(t, f.Ino, want, s)
	call(ctx, t, a, commitReq(f.Ino, size, []blockmap.Block{blk}, whole(0, blk)))
	r := rand.New(rand.NewPCG(4, 5))
	for i := range 300 {
		off := uint64(r.IntN(size/page)) * page
		data := randData(page, uint64(100+i))
		copy(want[off:], data)
		nb := putBlock(t, f.Ino, data, s)
		call(ctx, t, a, commitReq(f.Ino, size, []blockmap.Block{nb}, whole(off, nb)))
	}
	m := mapOf(t, s, f.Ino)
	t.Logf("301 commits: %d blocks, %d extents, %d block bytes for %d; %d compactions rewrote %d bytes",
		m.Blocks(), len(m.Extents()), m.BlockBytes(), m.StoredBytes(), s.counters.Compactions.Load(), s.counters.CompactedBytes.Load())
	if m.Blocks() > 40 {
		t.Errorf("%d blocks after 301 commits, want at most 40", m.Blocks())
	}
	if got, _ := readPieces(ctx, t, s, b, f.Ino); !bytes.Equal(got, want) {
		t.Fatal("pieces differ from what was written")
	}
	collectDue(t, s)
	if n := storeBlocks(t, s, f.Ino); n != m.Blocks() {
		t.Errorf("%d blocks in the store once the garbage went, the map has %d", n, m.Blocks())
	}
}

// TestCompactDeadBlock: a 4 MiB block overwritten but for one page, in
// pieces too unequal to merge, is rewritten as that page's own block; the
// big one becomes garbage.
func TestCompactDeadBlock(t *testing.T) {
	s := startBlockTestServer(t)
	ctx := testContext(t)
	a, b := connect(t, s), connect(t, s)
	f := mustCreate(ctx, t, a, "f")
	const size, keep = 4 << 20, 1 << 20
	want := randData(size, 6)
	call(ctx, t, a, writeReq(f.Ino, 0, want))
	big := mapOf(t, s, f.Ino).Extents()[0].Block
	for i, w := range [][2]int{{0, keep}, {keep + 4096, 2 << 20}, {keep + 4096 + 2<<20, size - keep - 4096 - 2<<20}} {
		data := randData(w[1], uint64(10+i))
		call(ctx, t, a, writeReq(f.Ino, uint64(w[0]), data))
		copy(want[w[0]:], data)
	}
	m := mapOf(t, s, f.Ino)
	if _, _, ok := m.Block(big); ok || len(m.Extents()) != 4 {
		t.Errorf("the 4 MiB block is still referenced for one page: %d block bytes for %d, %d extents", m.BlockBytes(), m.StoredBytes(), len(m.Extents()))
	}
	if m.BlockBytes() != size || s.counters.CompactedBytes.Load() != 4096 {
		t.Errorf("%d block bytes for a file of %d, %d bytes compacted", m.BlockBytes(), size, s.counters.CompactedBytes.Load())
	}
	if got, _ := readPieces(ctx, t, s, b, f.Ino); !bytes.Equal(got, want) {
		t.Fatal("pieces differ from what was written")
	}
}
