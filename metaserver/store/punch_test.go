package store

import (
	"bytes"
	"testing"

	"github.com/leasefs/leasefs/blocks/blockmap"
	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/wire"
)

// pageLen is the stored length of ino's page pi, or -1 without a record.
func pageLen(t *testing.T, s *Store, ino ids.Ino, pi uint64) int {
	t.Helper()
	n := -1
	if err := s.view(func(tx *Tx) error {
		_, err := tx.get(tx.key64(RecPage, ino, pi), func(v []byte) error {
			n = len(v)
			return nil
		})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestStorePunchPages(t *testing.T) {
	const size = 6*PageSize + 100
	pk := wire.PunchHole | wire.PunchKeepSize
	for _, c := range []struct {
		name      string
		off, n    uint64
		flags     uint32
		wantSize  uint64
		wantPages []int // stored lengths of pages 0..6 afterwards (-1: none)
	}{
		{"in one page", 100, 200, pk, size, []int{PageSize, PageSize, PageSize, PageSize, PageSize, PageSize, 100}},
		{"to a page's end", 100, PageSize - 100, pk, size, []int{PageSize, PageSize, PageSize, PageSize, PageSize, PageSize, 100}},
		{"across pages", PageSize + 10, 3 * PageSize, pk, size, []int{PageSize, PageSize, -1, -1, PageSize, PageSize, 100}},
		{"whole pages", PageSize, 2 * PageSize, pk, size, []int{PageSize, -1, -1, PageSize, PageSize, PageSize, 100}},
		{"to the end", 2*PageSize + 5, size - 2*PageSize - 5, pk, size, []int{PageSize, PageSize, PageSize, -1, -1, -1, -1}},
		{"past the end", 5 * PageSize, 10 * PageSize, pk, size, []int{PageSize, PageSize, PageSize, PageSize, PageSize, -1, -1}},
		{"zero range", PageSize + 10, 3 * PageSize, wire.PunchZeroRange, size, []int{PageSize, PageSize, -1, -1, PageSize, PageSize, 100}},
		{"zero range grows", 5 * PageSize, 10 * PageSize, wire.PunchZeroRange, 15 * PageSize, []int{PageSize, PageSize, PageSize, PageSize, PageSize, -1, -1}},
		{"zero range keeps size", 5 * PageSize, 10 * PageSize, wire.PunchZeroRange | wire.PunchKeepSize, size, []int{PageSize, PageSize, PageSize, PageSize, PageSize, -1, -1}},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := newStore(t)
			f := must[Attr](t)(s.Create(ids.RootIno, "f", reg|0o644, 0, 0, 0, 1))
			want := bytes.Repeat([]byte{7}, size)
			must[Attr](t)(s.Write(f.Ino, 0, want, 2))
			a, err := s.Punch(f.Ino, c.off, c.n, c.flags, 3)
			if err != nil {
				t.Fatal(err)
			}
			if a.Size != c.wantSize || a.Mtime != 3 || a.Ctime != 3 {
				t.Fatalf("attributes after: size %d mtime %d ctime %d; want size %d, times 3", a.Size, a.Mtime, a.Ctime, c.wantSize)
			}
			want = append(want, make([]byte, c.wantSize-size)...)
			clear(want[c.off:min(c.off+c.n, c.wantSize)])
			got, err := s.Read(f.Ino, 0, int(c.wantSize)+10)
			if err != nil || !bytes.Equal(got, want) {
				t.Fatalf("read back %d bytes, %v; differs from what was expected (%d bytes)", len(got), err, len(want))
			}
			for pi, w := range c.wantPages {
				if got := pageLen(t, s, f.Ino, uint64(pi)); got != w {
					t.Errorf("page %d: stored %d bytes, want %d", pi, got, w)
				}
			}
		})
	}
}

func TestStorePunchModes(t *testing.T) {
	s := newStore(t)
	f := must[Attr](t)(s.Create(ids.RootIno, "f", reg|0o644, 0, 0, 0, 1))
	must[Attr](t)(s.Write(f.Ino, 0, []byte("data"), 2))
	for _, flags := range []uint32{0, wire.PunchHole, wire.PunchKeepSize, wire.PunchHole | wire.PunchZeroRange | wire.PunchKeepSize} {
		if _, err := s.Punch(f.Ino, 0, 4, flags, 3); !errIs(err, wire.CodeNotSupported) {
			t.Errorf("mode %#x: %v; want not supported", flags, err)
		}
	}
	if _, err := s.Punch(f.Ino, 0, 0, wire.PunchZeroRange, 3); !errIs(err, wire.CodeInvalid) {
		t.Errorf("no bytes: %v; want invalid", err)
	}
	if _, err := s.Punch(f.Ino, 1<<62, 1<<62, wire.PunchZeroRange, 3); !errIs(err, wire.CodeTooBig) {
		t.Errorf("past the largest size: %v; want too big", err)
	}
	if _, err := s.Punch(f.Ino, 0, 2*wire.MaxPunch, wire.PunchZeroRange, 3); err != nil {
		t.Errorf("a long range past a short file's end: %v", err)
	}
	g := must[Attr](t)(s.Create(ids.RootIno, "g", reg|0o644, 0, 0, 0, 1))
	must[Attr](t)(s.SetAttr(g.Ino, SetAttrIn{Valid: wire.SetSize, Size: 4 * wire.MaxPunch}, 2))
	if _, err := s.Punch(g.Ino, 0, 2*wire.MaxPunch, wire.PunchHole|wire.PunchKeepSize, 3); !errIs(err, wire.CodeTooBig) {
		t.Errorf("more than MaxPunch bytes inside the file: %v; want too big", err)
	}
}

func TestStorePunchBlocks(t *testing.T) {
	s := newBlockStore(t)
	f := must[Attr](t)(s.Create(ids.RootIno, "f", reg|0o644, 0, 0, 0, 1))
	b := newBlock(1, 8192)
	must[Attr](t)(s.CommitBlocks(f.Ino, []blockmap.Block{b}, whole(b, 4096), 4096+8192, 10))
	a, err := s.Punch(f.Ino, 4096, 4096, wire.PunchHole|wire.PunchKeepSize, 20)
	if err != nil || a.Size != 4096+8192 || a.Mtime != 20 {
		t.Fatalf("punch: %+v, %v", a, err)
	}
	checkSeeks(t, s, f.Ino, []seekCase{{0, sd, 8192, true}, {8192, sh, 4096 + 8192, true}})
	if a, err = s.Punch(f.Ino, 0, 20000, wire.PunchZeroRange, 30); err != nil || a.Size != 20000 {
		t.Fatalf("zero range: %+v, %v", a, err)
	}
	checkSeeks(t, s, f.Ino, []seekCase{{0, sd, 0, false}, {0, sh, 0, true}})
}
