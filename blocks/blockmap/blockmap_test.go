package blockmap

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"

	"github.com/leasefs/leasefs/blocks"
)

// u names a test block by one byte.
func u(c byte) Unique { return Unique{c} }

func blk(c byte, size uint64) Block {
	return Block{Unique: u(c), Size: size, Sums: make(blocks.Sums, chunks(size))}
}

func ext(off, n uint64, c byte, boff uint64) Extent {
	return Extent{Off: off, Len: n, Block: u(c), BlockOff: boff}
}

// mapOf builds a map whose extents each get their own block of 1 MiB
// unless they share a letter.
func mapOf(t *testing.T, exts ...Extent) *Map {
	t.Helper()
	m := New(7)
	for _, e := range exts {
		if _, ok := m.blocks[e.Block]; ok {
			m.ext = append(m.ext, e)
			m.blocks[e.Block].refs++
			continue
		}
		if _, err := m.Apply([]Block{blk(e.Block[0], 1<<20)}, []Extent{e}); err != nil {
			t.Fatal(err)
		}
	}
	m.mustCheck(t)
	return m
}

// mustCheck re-derives the reference counts and checks every invariant,
// through Load, and that the records round-trip.
func (m *Map) mustCheck(t testing.TB) {
	t.Helper()
	var bs []Block
	for _, b := range m.blocks {
		bs = append(bs, b.Block)
	}
	m2, err := Load(m.ino, bs, m.ext)
	if err != nil {
		t.Fatalf("invariant broken: %v\nextents %v", err, m.ext)
	}
	for un, b := range m.blocks {
		if m2.blocks[un].refs != b.refs {
			t.Fatalf("block %x: %d references counted, map says %d", un, m2.blocks[un].refs, b.refs)
		}
	}
	if !slices.Equal(m2.ext, m.ext) {
		t.Fatalf("extents not sorted: %v", m.ext)
	}
}

func freed(cs ...byte) []Block {
	var bs []Block
	for _, c := range cs {
		bs = append(bs, blk(c, 1<<20))
	}
	return bs
}

func TestApply(t *testing.T) {
	B := blk('B', 1<<20)
	for _, c := range []struct {
		name                    string
		old                     []Extent
		write                   []Extent
		want                    []Extent
		removed, added, changed []Extent
		freed                   []Block
	}{
		{name: "into empty", write: []Extent{ext(0, 10, 'B', 0)},
			want: []Extent{ext(0, 10, 'B', 0)}, added: []Extent{ext(0, 10, 'B', 0)}},
		{name: "cover", old: []Extent{ext(100, 100, 'A', 0)}, write: []Extent{ext(50, 200, 'B', 0)},
			want:    []Extent{ext(50, 200, 'B', 0)},
			removed: []Extent{ext(100, 100, 'A', 0)}, added: []Extent{ext(50, 200, 'B', 0)}, freed: freed('A')},
		{name: "exact", old: []Extent{ext(100, 100, 'A', 0)}, write: []Extent{ext(100, 100, 'B', 5)},
			want: []Extent{ext(100, 100, 'B', 5)}, changed: []Extent{ext(100, 100, 'B', 5)}, freed: freed('A')},
		{name: "inside split", old: []Extent{ext(0, 300, 'A', 10)}, write: []Extent{ext(100, 100, 'B', 0)},
			want:    []Extent{ext(0, 100, 'A', 10), ext(100, 100, 'B', 0), ext(200, 100, 'A', 210)},
			added:   []Extent{ext(100, 100, 'B', 0), ext(200, 100, 'A', 210)},
			changed: []Extent{ext(0, 100, 'A', 10)}},
		{name: "left trim", old: []Extent{ext(100, 200, 'A', 0)}, write: []Extent{ext(50, 100, 'B', 0)},
			want:    []Extent{ext(50, 100, 'B', 0), ext(150, 150, 'A', 50)},
			removed: []Extent{ext(100, 200, 'A', 0)},
			added:   []Extent{ext(50, 100, 'B', 0), ext(150, 150, 'A', 50)}},
		{name: "right trim", old: []Extent{ext(100, 200, 'A', 0)}, write: []Extent{ext(200, 200, 'B', 0)},
			want:    []Extent{ext(100, 100, 'A', 0), ext(200, 200, 'B', 0)},
			added:   []Extent{ext(200, 200, 'B', 0)},
			changed: []Extent{ext(100, 100, 'A', 0)}},
		{name: "adjacent left", old: []Extent{ext(100, 100, 'A', 0)}, write: []Extent{ext(0, 100, 'B', 0)},
			want:  []Extent{ext(0, 100, 'B', 0), ext(100, 100, 'A', 0)},
			added: []Extent{ext(0, 100, 'B', 0)}},
		{name: "adjacent right", old: []Extent{ext(100, 100, 'A', 0)}, write: []Extent{ext(200, 100, 'B', 0)},
			want:  []Extent{ext(100, 100, 'A', 0), ext(200, 100, 'B', 0)},
			added: []Extent{ext(200, 100, 'B', 0)}},
		{name: "into hole", old: []Extent{ext(0, 100, 'A', 0), ext(200, 100, 'C', 0)}, write: []Extent{ext(120, 60, 'B', 0)},
			want:  []Extent{ext(0, 100, 'A', 0), ext(120, 60, 'B', 0), ext(200, 100, 'C', 0)},
			added: []Extent{ext(120, 60, 'B', 0)}},
		{name: "several", old: []Extent{ext(0, 100, 'A', 0), ext(100, 100, 'C', 0), ext(300, 100, 'D', 0)},
			write:   []Extent{ext(50, 300, 'B', 0)},
			want:    []Extent{ext(0, 50, 'A', 0), ext(50, 300, 'B', 0), ext(350, 50, 'D', 50)},
			removed: []Extent{ext(100, 100, 'C', 0), ext(300, 100, 'D', 0)},
			added:   []Extent{ext(50, 300, 'B', 0), ext(350, 50, 'D', 50)},
			changed: []Extent{ext(0, 50, 'A', 0)}, freed: freed('C')},
		{name: "merge write", write: []Extent{ext(0, 10, 'B', 0), ext(10, 10, 'B', 10), ext(20, 10, 'B', 30)},
			want:  []Extent{ext(0, 20, 'B', 0), ext(20, 10, 'B', 30)},
			added: []Extent{ext(0, 20, 'B', 0), ext(20, 10, 'B', 30)}},
		{name: "two pieces over one", old: []Extent{ext(0, 1000, 'A', 0)},
			write: []Extent{ext(100, 100, 'B', 0), ext(300, 100, 'B', 100)},
			want: []Extent{ext(0, 100, 'A', 0), ext(100, 100, 'B', 0), ext(200, 100, 'A', 200),
				ext(300, 100, 'B', 100), ext(400, 600, 'A', 400)},
			added:   []Extent{ext(100, 100, 'B', 0), ext(200, 100, 'A', 200), ext(300, 100, 'B', 100), ext(400, 600, 'A', 400)},
			changed: []Extent{ext(0, 100, 'A', 0)}},
		{name: "one block split twice, all covered", old: []Extent{ext(0, 100, 'A', 0), ext(200, 100, 'A', 200)},
			write: []Extent{ext(0, 300, 'B', 0)}, want: []Extent{ext(0, 300, 'B', 0)},
			removed: []Extent{ext(200, 100, 'A', 200)}, changed: []Extent{ext(0, 300, 'B', 0)}, freed: freed('A')},
	} {
		t.Run(c.name, func(t *testing.T) {
			m := mapOf(t, c.old...)
			ch, err := m.Apply([]Block{B}, c.write)
			if err != nil {
				t.Fatal(err)
			}
			m.mustCheck(t)
			if !slices.Equal(m.ext, c.want) {
				t.Errorf("extents\n got %v\nwant %v", m.ext, c.want)
			}
			want := Change{Removed: c.removed, Added: c.added, Changed: c.changed, NewBlocks: []Block{B}, Freed: c.freed}
			if !reflect.DeepEqual(ch, want) {
				t.Errorf("change\n got %+v\nwant %+v", ch, want)
			}
		})
	}
}

func TestApplyRefuses(t *testing.T) {
	A, B := blk('A', 100), blk('B', 100)
	for name, w := range map[string]struct {
		bs []Block
		es []Extent
	}{
		"overlap":         {[]Block{B}, []Extent{ext(0, 10, 'B', 0), ext(5, 10, 'B', 20)}},
		"out of order":    {[]Block{B}, []Extent{ext(20, 10, 'B', 0), ext(0, 10, 'B', 20)}},
		"past block":      {[]Block{B}, []Extent{ext(0, 10, 'B', 95)}},
		"empty extent":    {[]Block{B}, []Extent{ext(0, 0, 'B', 0)}},
		"unknown block":   {[]Block{B}, []Extent{ext(0, 10, 'B', 0), ext(10, 10, 'C', 0)}},
		"old block":       {[]Block{B}, []Extent{ext(0, 10, 'B', 0), ext(10, 10, 'A', 0)}},
		"block not new":   {[]Block{A}, []Extent{ext(0, 10, 'A', 0)}},
		"unused block":    {[]Block{B, blk('C', 10)}, []Extent{ext(0, 10, 'B', 0)}},
		"twice":           {[]Block{B, B}, []Extent{ext(0, 10, 'B', 0)}},
		"past MaxSize":    {[]Block{B}, []Extent{ext(MaxSize-5, 10, 'B', 0)}},
		"bad sums":        {[]Block{{Unique: u('B'), Size: 100}}, []Extent{ext(0, 10, 'B', 0)}},
		"block too large": {[]Block{blk('B', blocks.MaxBlock+1)}, []Extent{ext(0, 10, 'B', 0)}},
	} {
		m := New(1)
		if _, err := m.Apply([]Block{A}, []Extent{ext(0, 100, 'A', 0)}); err != nil {
			t.Fatal(err)
		}
		before := slices.Clone(m.ext)
		if _, err := m.Apply(w.bs, w.es); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: got %v, want ErrInvalid", name, err)
		}
		if !slices.Equal(m.ext, before) || len(m.blocks) != 1 {
			t.Errorf("%s: map changed: %v", name, m.ext)
		}
	}
}

func TestTruncatePunch(t *testing.T) {
	old := []Extent{ext(0, 100, 'A', 0), ext(100, 100, 'C', 0), ext(300, 100, 'D', 0)}
	for _, c := range []struct {
		name  string
		op    func(m *Map) (Change, error)
		want  []Extent
		freed []Block
	}{
		{"truncate 0", func(m *Map) (Change, error) { return m.Truncate(0) }, nil, freed('A', 'C', 'D')},
		{"truncate mid", func(m *Map) (Change, error) { return m.Truncate(150) },
			[]Extent{ext(0, 100, 'A', 0), ext(100, 50, 'C', 0)}, freed('D')},
		{"truncate at boundary", func(m *Map) (Change, error) { return m.Truncate(200) }, old[:2], freed('D')},
		{"truncate in hole", func(m *Map) (Change, error) { return m.Truncate(250) }, old[:2], freed('D')},
		{"truncate past end", func(m *Map) (Change, error) { return m.Truncate(1000) }, old, nil},
		{"truncate at MaxSize", func(m *Map) (Change, error) { return m.Truncate(MaxSize) }, old, nil},
		{"punch split", func(m *Map) (Change, error) { return m.PunchHole(20, 30) },
			[]Extent{ext(0, 20, 'A', 0), ext(50, 50, 'A', 50), old[1], old[2]}, nil},
		{"punch exact", func(m *Map) (Change, error) { return m.PunchHole(100, 100) },
			[]Extent{old[0], old[2]}, freed('C')},
		{"punch across", func(m *Map) (Change, error) { return m.ZeroRange(50, 300) },
			[]Extent{ext(0, 50, 'A', 0), ext(350, 50, 'D', 50)}, freed('C')},
		{"punch hole", func(m *Map) (Change, error) { return m.PunchHole(200, 100) }, old, nil},
		{"punch empty", func(m *Map) (Change, error) { return m.PunchHole(50, 0) }, old, nil},
		{"punch to MaxSize", func(m *Map) (Change, error) { return m.PunchHole(10, MaxSize-10) },
			[]Extent{ext(0, 10, 'A', 0)}, freed('C', 'D')},
	} {
		t.Run(c.name, func(t *testing.T) {
			m := mapOf(t, old...)
			ch, err := c.op(m)
			if err != nil {
				t.Fatal(err)
			}
			m.mustCheck(t)
			if !slices.Equal(m.ext, c.want) {
				t.Errorf("extents\n got %v\nwant %v", m.ext, c.want)
			}
			if !reflect.DeepEqual(ch.Freed, c.freed) {
				t.Errorf("freed %v, want %v", ch.Freed, c.freed)
			}
			if slices.Equal(c.want, old) && !ch.Empty() {
				t.Errorf("no-op reported a change: %+v", ch)
			}
		})
	}
	m := mapOf(t, old...)
	for _, err := range []error{
		func() error { _, err := m.Truncate(MaxSize + 1); return err }(),
		func() error { _, err := m.PunchHole(MaxSize, 1); return err }(),
		func() error { _, err := m.PunchHole(1<<63+5, 0); return err }(),
		func() error { _, err := m.Lookup(MaxSize-1, 2); return err }(),
	} {
		if !errors.Is(err, ErrInvalid) {
			t.Errorf("got %v, want ErrInvalid", err)
		}
	}
}

func TestSeek(t *testing.T) {
	// data [100, 200) [200, 250) [300, 400); size 500
	m := mapOf(t, ext(100, 100, 'A', 0), ext(200, 50, 'C', 0), ext(300, 100, 'D', 0))
	const size = 500
	for _, c := range []struct {
		off           uint64
		data, hole    uint64
		dataErr, hErr bool
	}{
		{off: 0, data: 100, hole: 0},
		{off: 100, data: 100, hole: 250},
		{off: 199, data: 199, hole: 250},
		{off: 200, data: 200, hole: 250},
		{off: 250, data: 300, hole: 250},
		{off: 399, data: 399, hole: 400},
		{off: 400, dataErr: true, hole: 400},
		{off: 499, dataErr: true, hole: 499},
		{off: 500, dataErr: true, hErr: true},
		{off: 1 << 40, dataErr: true, hErr: true},
	} {
		d, err := m.SeekData(c.off, size)
		if c.dataErr != (err != nil) || err != nil && !errors.Is(err, ErrNXIO) || err == nil && d != c.data {
			t.Errorf("SeekData(%d) = %d, %v; want %d, error %v", c.off, d, err, c.data, c.dataErr)
		}
		h, err := m.SeekHole(c.off, size)
		if c.hErr != (err != nil) || err != nil && !errors.Is(err, ErrNXIO) || err == nil && h != c.hole {
			t.Errorf("SeekHole(%d) = %d, %v; want %d, error %v", c.off, h, err, c.hole, c.hErr)
		}
	}
	// A size inside data: the end of the file is a hole; data past the
	// size (a caller that has not truncated yet) is not reported.
	if h, err := m.SeekHole(120, 150); err != nil || h != 150 {
		t.Errorf("SeekHole in data past size = %d, %v", h, err)
	}
	if _, err := m.SeekData(260, 300); !errors.Is(err, ErrNXIO) {
		t.Errorf("SeekData with data only past size: %v", err)
	}
	if n := m.StoredBytes(); n != 512 {
		t.Errorf("StoredBytes = %d, want 250 rounded to 512", n)
	}
	if n := m.BlockBytes(); n != 3<<20 {
		t.Errorf("BlockBytes = %d", n)
	}
}

func TestLookup(t *testing.T) {
	m := mapOf(t, ext(100, 100, 'A', 1000), ext(200, 50, 'C', 0))
	ps, err := m.Lookup(50, 250)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range ps {
		if p.Hole {
			got = append(got, fmt.Sprintf("hole %d+%d", p.Off, p.Len))
			continue
		}
		fo, fn := p.Fetch()
		got = append(got, fmt.Sprintf("%c %d+%d @%d fetch %d+%d", p.Block.Unique[0], p.Off, p.Len, p.BlockOff, fo, fn))
		if p.Block.Ino != 7 || p.Size != 1<<20 || len(p.Sums) != 16 {
			t.Errorf("piece %+v: block fields", p)
		}
	}
	want := []string{"hole 50+50", "A 100+100 @1000 fetch 0+65536", "C 200+50 @0 fetch 0+65536", "hole 250+50"}
	if !slices.Equal(got, want) {
		t.Errorf("got %q\nwant %q", got, want)
	}
	ps, _ = m.Lookup(120, 10)
	if len(ps) != 1 || ps[0].Off != 120 || ps[0].BlockOff != 1020 || ps[0].Len != 10 {
		t.Errorf("inside one extent: %+v", ps)
	}
	if ps, _ = m.Lookup(120, 0); len(ps) != 0 {
		t.Errorf("empty read: %+v", ps)
	}
}

// compactAll applies m's compaction plans until there is none, each into
// a new block named from next, and returns the plans.
func compactAll(t testing.TB, m *Map, next *byte) []Plan {
	t.Helper()
	var ps []Plan
	for {
		p, ok := m.CompactPlan()
		if !ok {
			return ps
		}
		*next++
		if _, err := m.Apply(p.Write(u(*next), make(blocks.Sums, chunks(p.Size)))); err != nil {
			t.Fatal(err)
		}
		m.mustCheck(t)
		ps = append(ps, p)
	}
}

// applyAll writes each extent of exts as a block of its own, named by its
// Block's first byte and as big as the extent plus its BlockOff.
func applyAll(t testing.TB, m *Map, exts ...Extent) {
	t.Helper()
	for _, e := range exts {
		if _, err := m.Apply([]Block{blk(e.Block[0], e.BlockOff+e.Len)}, []Extent{e}); err != nil {
			t.Fatal(err)
		}
	}
}

// pieces is n touching extents of size bytes, each in a block of its own.
func pieces(n int, size uint64) []Extent {
	var exts []Extent
	for i := range n {
		exts = append(exts, ext(uint64(i)*size, size, byte(i+1), 0))
	}
	return exts
}

func TestCompactPlanFragments(t *testing.T) {
	const k = 4096
	for name, c := range map[string]struct {
		exts []Extent
		want [][2]int // plans: first extent's Off/k, extents
	}{
		// 8 touching, a hole, 4 touching: two windows, the bigger first;
		// a whole block after a hole stays as it is
		"runs": {[]Extent{ext(0, k, 1, 0), ext(k, k, 2, 0), ext(2*k, k, 3, 0), ext(3*k, k, 4, 0),
			ext(4*k, k, 5, 0), ext(5*k, k, 6, 0), ext(6*k, k, 7, 0), ext(7*k, k, 8, 0),
			ext(10*k, k, 9, 0), ext(11*k, k, 10, 0), ext(12*k, k, 11, 0), ext(13*k, k, 12, 0),
			ext(1<<20, blocks.MaxBlock, 13, 0)},
			[][2]int{{0, 8}, {10, 4}}},
		"three": {[]Extent{ext(0, k, 1, 0), ext(k, k, 2, 0), ext(2*k, k, 3, 0)}, nil},
		// a big extent and small ones after it: only the small ones merge
		"tiers": {[]Extent{ext(0, 4*k, 1, 0), ext(4*k, k, 2, 0), ext(5*k, k, 3, 0), ext(6*k, k, 4, 0), ext(7*k, k, 5, 0)},
			[][2]int{{4, 4}}},
		"too big a one": {[]Extent{ext(0, 256*k, 1, 0), ext(256*k, k, 2, 0), ext(257*k, k, 3, 0), ext(258*k, k, 4, 0)}, nil},
		// five of 1 MiB: no fragments, nothing to rewrite
		"MiB pieces": {[]Extent{ext(0, 256*k, 1, 0), ext(256*k, 256*k, 2, 0), ext(512*k, 256*k, 3, 0),
			ext(768*k, 256*k, 4, 0), ext(1024*k, 256*k, 5, 0)}, nil},
		// seventeen of 256 KiB: sixteen fill a block, the last stays
		"a block full": {pieces(17, 64*k), [][2]int{{0, 16}}},
		// the longest in the middle: the window must leave it out
		"big between": {[]Extent{ext(0, k, 1, 0), ext(k, k, 2, 0), ext(2*k, k, 3, 0), ext(3*k, k, 4, 0),
			ext(4*k, 64*k, 5, 0), ext(68*k, k, 6, 0), ext(69*k, k, 7, 0), ext(70*k, k, 8, 0)},
			[][2]int{{0, 4}}},
	} {
		m := New(3)
		applyAll(t, m, c.exts...)
		stored := m.StoredBytes()
		next := byte(100)
		var got [][2]int
		for _, p := range compactAll(t, m, &next) {
			if p.Sparse {
				t.Errorf("%s: sparse plan %+v", name, p)
			}
			got = append(got, [2]int{int(p.Extents[0].Off / k), len(p.Extents)})
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("%s: plans %v, want %v", name, got, c.want)
		}
		if m.StoredBytes() != stored {
			t.Errorf("%s: stored %d bytes, then %d", name, stored, m.StoredBytes())
		}
	}
}

func TestCompactPlanSparse(t *testing.T) {
	const k = 4096
	m := New(3)
	// 'A' (4 MiB) keeps one page, 'C' (1 MiB) keeps 300 KiB, 'D' (128 KiB)
	// keeps one page: only 'A' is worth rewriting.
	applyAll(t, m, ext(0, 1024*k, 'A', 0), ext(1024*k, 256*k, 'C', 0), ext(2048*k, 32*k, 'D', 0))
	applyAll(t, m, ext(0, 1000*k, 'a', 0), ext(1001*k, 23*k, 'b', 0))
	applyAll(t, m, ext(1024*k, 181*k, 'c', 0))
	applyAll(t, m, ext(2048*k, 31*k, 'd', 0))
	next := byte(100)
	ps := compactAll(t, m, &next)
	if len(ps) != 1 || !ps[0].Sparse || len(ps[0].Extents) != 1 || ps[0].Extents[0] != ext(1000*k, k, 'A', 1000*k) || ps[0].Size != k {
		t.Fatalf("plans %+v", ps)
	}
	if _, _, ok := m.Block(u('A')); ok {
		t.Error("block A still referenced")
	}
	if _, _, ok := m.Block(u('C')); !ok {
		t.Error("block C rewritten")
	}
}

// TestCompactAppends: a file appended 50 bytes at a time, compacted after
// each append as the server does, keeps few extents, and each byte is
// rewritten a bounded number of times. Appended blocks are as long as
// their extents, so a merged window is all young: each rewrite puts a
// byte in a block at least tierFanout times bigger, at most MaxBlock, so a
// byte is rewritten at most log4(MaxBlock/50) = 8 times. The extents left
// hold at most 3 lengths in each power of 4 (four of one power usually
// form a window): 9 powers from 50 bytes to MaxBlock, 27 extents. That
// last bound is measured, not proven (appends of 1 byte to 64 KiB, up to
// 300,000 of them, never left more than 3 in one power).
func TestCompactAppends(t *testing.T) {
	const n, size = 10000, 50
	m := New(3)
	var id uint64
	unique := func() Unique {
		id++
		var un Unique
		binary.BigEndian.PutUint64(un[8:], id)
		return un
	}
	var written, rewritten uint64
	most := 0
	for i := range n {
		un := unique()
		if _, err := m.Apply([]Block{{Unique: un, Size: size, Sums: blocks.Sums{0}}}, []Extent{{Off: uint64(i) * size, Len: size, Block: un}}); err != nil {
			t.Fatal(err)
		}
		written += size
		for {
			p, ok := m.CompactPlan()
			if !ok {
				break
			}
			rewritten += p.Size
			if _, err := m.Apply(p.Write(unique(), make(blocks.Sums, chunks(p.Size)))); err != nil {
				t.Fatal(err)
			}
		}
		most = max(most, len(m.ext))
	}
	m.mustCheck(t)
	t.Logf("%d appends of %d bytes: at most %d extents, %d at the end; %d blocks; rewrote %.2f bytes per byte written",
		n, size, most, len(m.ext), m.Blocks(), float64(rewritten)/float64(written))
	if most > 27 {
		t.Errorf("%d extents at most, want at most 27", most)
	}
	if rewritten > 8*written {
		t.Errorf("rewrote %d bytes for %d written", rewritten, written)
	}
	if m.StoredBytes() != (n*size+511)&^511 || m.Blocks() != len(m.ext) {
		t.Errorf("stored %d bytes in %d blocks, %d extents", m.StoredBytes(), m.Blocks(), len(m.ext))
	}
}

// TestCompactRandomOverwrites: 300 random 4 KiB overwrites of a 1 MiB
// block, compacted after each. The old block's pieces are rewritten only
// with young blocks making a quarter of the window, each young byte moving
// to a block 4 times bigger, at most the file: at most youngFrac *
// log4(1 MiB/4 KiB) = 16 bytes rewritten per byte written. Blocks: 64
// writes make a quarter of the file young, and then the whole file merges,
// so at most 64 written blocks and the few merged ones, say 70.
func TestCompactRandomOverwrites(t *testing.T) {
	const size, page, n = 1 << 20, 4096, 300
	m := New(3)
	var id uint64
	unique := func() Unique {
		id++
		var un Unique
		binary.BigEndian.PutUint64(un[8:], id)
		return un
	}
	write := func(off, n uint64) {
		un := unique()
		if _, err := m.Apply([]Block{{Unique: un, Size: n, Sums: make(blocks.Sums, chunks(n))}}, []Extent{{Off: off, Len: n, Block: un}}); err != nil {
			t.Fatal(err)
		}
	}
	write(0, size)
	r := rand.New(rand.NewPCG(1, 2))
	var rewritten uint64
	most := 0
	for range n {
		write(r.Uint64N(size/page)*page, page)
		for {
			p, ok := m.CompactPlan()
			if !ok {
				break
			}
			rewritten += p.Size
			if _, err := m.Apply(p.Write(unique(), make(blocks.Sums, chunks(p.Size)))); err != nil {
				t.Fatal(err)
			}
		}
		most = max(most, m.Blocks())
	}
	m.mustCheck(t)
	amp := float64(rewritten) / (n * page)
	t.Logf("%d random 4 KiB writes: at most %d blocks, %d blocks and %d extents at the end, %d block bytes; rewrote %.2f bytes per byte written",
		n, most, m.Blocks(), len(m.ext), m.BlockBytes(), amp)
	if most > 70 || amp > 16 {
		t.Errorf("at most %d blocks (want 70), %.2f bytes rewritten per byte (want 16)", most, amp)
	}
}

func TestLoadRefuses(t *testing.T) {
	A := blk('A', 100)
	for name, c := range map[string]struct {
		bs []Block
		es []Extent
	}{
		"overlap":      {[]Block{A}, []Extent{ext(0, 10, 'A', 0), ext(5, 10, 'A', 20)}},
		"unreferenced": {[]Block{A, blk('C', 10)}, []Extent{ext(0, 10, 'A', 0)}},
		"no block":     {nil, []Extent{ext(0, 10, 'A', 0)}},
		"past block":   {[]Block{A}, []Extent{ext(0, 10, 'A', 91)}},
		"block twice":  {[]Block{A, A}, []Extent{ext(0, 10, 'A', 0)}},
	} {
		if _, err := Load(1, c.bs, c.es); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: got %v, want ErrCorrupt", name, err)
		}
	}
	// Records come in key order, not necessarily file order.
	if _, err := Load(1, []Block{A}, []Extent{ext(50, 10, 'A', 0), ext(0, 10, 'A', 0)}); err != nil {
		t.Error(err)
	}
}
