package blockmap

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/leasefs/leasefs/blocks"
)

// TestReadPieces: pieces of a map read from a real file store give the
// file's bytes, holes as zeros, from any start; a lookup cut short ends
// where its pieces do; a corrupt block is an error naming its piece.
func TestReadPieces(t *testing.T) {
	dir := t.TempDir()
	st, err := blocks.OpenFileStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	m := New(7)
	want := make([]byte, 300<<10)
	put := func(off uint64, data []byte) {
		id := blocks.NewID(7)
		if err := st.Put(ctx, id, data); err != nil {
			t.Fatal(err)
		}
		blk := Block{Unique: id.Unique, Size: uint64(len(data)), Sums: blocks.Sum(data)}
		if _, err := m.Apply([]Block{blk}, []Extent{{Off: off, Len: blk.Size, Block: id.Unique}}); err != nil {
			t.Fatal(err)
		}
		copy(want[off:], data)
	}
	put(0, bytes.Repeat([]byte("a"), 100<<10))
	put(200<<10, bytes.Repeat([]byte("b"), 100<<10)) // a hole between
	put(50<<10, bytes.Repeat([]byte("c"), 10))       // over the first
	for _, start := range []uint64{0, 1, 50 << 10, 150 << 10, 250<<10 + 3} {
		ps, err := m.Lookup(start, uint64(len(want))-start)
		if err != nil {
			t.Fatal(err)
		}
		buf := bytes.Repeat([]byte{0xff}, len(want)-int(start))
		end, bad, err := ReadPieces(start, ps, buf, ReadVerified(ctx, st))
		if err != nil || bad != nil || end != uint64(len(want)) || !bytes.Equal(buf, want[start:]) {
			t.Fatalf("from %d: end %d, %v, %v; equal %v", start, end, bad, err, bytes.Equal(buf, want[start:]))
		}
		if len(ps) > 1 {
			end, _, err := ReadPieces(start, ps[:1], buf, ReadVerified(ctx, st))
			if err != nil || end != ps[0].Off+ps[0].Len {
				t.Fatalf("one piece from %d: end %d, %v", start, end, err)
			}
		}
	}
	// flip a byte of the second block
	ps, _ := m.Lookup(200<<10, 100<<10)
	files, _ := filepath.Glob(filepath.Join(dir, "*", "*", "*"))
	for _, f := range files {
		if filepath.Base(f) == ps[0].Block.String()[17:] {
			b, _ := os.ReadFile(f)
			b[5] ^= 1
			if err := os.WriteFile(f, b, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	_, bad, err := ReadPieces(200<<10, ps, make([]byte, 100<<10), ReadVerified(ctx, st))
	if !errors.Is(err, blocks.ErrCorrupt) || bad == nil || bad.Block != ps[0].Block {
		t.Fatalf("corrupt block: %v, piece %+v", err, bad)
	}
}

// TestSlice: a slice of a lookup's pieces equals the lookup of the
// slice's range, at every boundary.
func TestSlice(t *testing.T) {
	m := New(7)
	for _, w := range []struct{ off, n uint64 }{{0, 100}, {300, 50}, {320, 100}, {1000, 10}} {
		u := blocks.NewID(7).Unique
		blk := Block{Unique: u, Size: w.n + 7, Sums: blocks.Sum(make([]byte, w.n+7))}
		if _, err := m.Apply([]Block{blk}, []Extent{{Off: w.off, Len: w.n, Block: u, BlockOff: 7}}); err != nil {
			t.Fatal(err)
		}
	}
	all, err := m.Lookup(0, 1200)
	if err != nil {
		t.Fatal(err)
	}
	for off := uint64(0); off < 1200; off += 13 {
		for _, n := range []uint64{1, 50, 333, 1200 - off} {
			end := min(off+n, 1200)
			want, _ := m.Lookup(off, end-off)
			got := Slice(all, off, end)
			if len(got) != len(want) {
				t.Fatalf("[%d, %d): %d pieces, want %d", off, end, len(got), len(want))
			}
			for i := range got {
				g, w := got[i], want[i]
				if g.Off != w.Off || g.Len != w.Len || g.Hole != w.Hole || g.Block != w.Block || g.BlockOff != w.BlockOff {
					t.Fatalf("[%d, %d) piece %d: %+v, want %+v", off, end, i, g, w)
				}
			}
		}
	}
}
