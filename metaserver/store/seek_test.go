package store

import (
	"testing"

	"github.com/leasefs/leasefs/blocks/blockmap"
	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/wire"
)

// seekCase is one lseek and its answer: ok false means ENXIO.
type seekCase struct {
	off    uint64
	whence uint32
	want   uint64
	ok     bool
}

func checkSeeks(t *testing.T, s *Store, ino ids.Ino, cases []seekCase) {
	t.Helper()
	for _, c := range cases {
		got, err := s.Seek(ino, c.off, c.whence)
		if !c.ok {
			if !errIs(err, wire.CodeNXIO) {
				t.Errorf("seek %d from %d: %d, %v; want ENXIO", c.whence, c.off, got, err)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("seek %d from %d: %d, %v; want %d", c.whence, c.off, got, err, c.want)
		}
	}
}

func errIs(err error, c wire.Code) bool { return err != nil && wire.CodeOf(err) == c }

const (
	sd = wire.SeekData
	sh = wire.SeekHole
)

func TestStoreSeekPages(t *testing.T) {
	s := newStore(t)
	empty := must[Attr](t)(s.Create(ids.RootIno, "empty", reg|0o644, 0, 0, 0, 1))
	checkSeeks(t, s, empty.Ino, []seekCase{{0, sd, 0, false}, {0, sh, 0, false}})

	full := must[Attr](t)(s.Create(ids.RootIno, "full", reg|0o644, 0, 0, 0, 1))
	must[Attr](t)(s.Write(full.Ino, 0, make([]byte, 3*PageSize+100), 2)) // zeros are data
	checkSeeks(t, s, full.Ino, []seekCase{
		{0, sd, 0, true}, {5000, sd, 5000, true}, {0, sh, 3*PageSize + 100, true},
		{3*PageSize + 99, sh, 3*PageSize + 100, true}, {3*PageSize + 100, sd, 0, false},
		{3*PageSize + 100, sh, 0, false}, {1 << 40, sd, 0, false},
	})

	// a hole at the start, data at 8192+[0, 100) and past 4 GiB, a hole at the end
	const big = 5 << 30
	sparse := must[Attr](t)(s.Create(ids.RootIno, "sparse", reg|0o644, 0, 0, 0, 1))
	must[Attr](t)(s.Write(sparse.Ino, 2*PageSize, []byte("data"), 2))
	must[Attr](t)(s.Write(sparse.Ino, big, make([]byte, PageSize+1), 3))
	must[Attr](t)(s.SetAttr(sparse.Ino, SetAttrIn{Valid: wire.SetSize, Size: big + 10*PageSize}, 4))
	checkSeeks(t, s, sparse.Ino, []seekCase{
		{0, sd, 2 * PageSize, true}, {0, sh, 0, true}, {2 * PageSize, sh, 2*PageSize + 4, true},
		{2*PageSize + 2, sd, 2*PageSize + 2, true}, {2*PageSize + 4, sd, big, true},
		{2*PageSize + 4, sh, 2*PageSize + 4, true}, {big, sh, big + PageSize + 1, true},
		{big + PageSize + 1, sd, 0, false}, {big + PageSize + 1, sh, big + PageSize + 1, true},
		{big + 10*PageSize - 1, sh, big + 10*PageSize - 1, true}, {big + 10*PageSize, sh, 0, false},
	})

	// a truncation into data: what is past the size is neither
	must[Attr](t)(s.SetAttr(full.Ino, SetAttrIn{Valid: wire.SetSize, Size: PageSize + 10}, 5))
	checkSeeks(t, s, full.Ino, []seekCase{{0, sh, PageSize + 10, true}, {PageSize + 10, sd, 0, false}})
}

func TestStoreSeekBlocks(t *testing.T) {
	s := newBlockStore(t)
	f := must[Attr](t)(s.Create(ids.RootIno, "f", reg|0o644, 0, 0, 0, 1))
	b := newBlock(1, 8192)
	must[Attr](t)(s.CommitBlocks(f.Ino, []blockmap.Block{b}, whole(b, 4096), 4096+8192, 10))
	must[Attr](t)(s.SetAttr(f.Ino, SetAttrIn{Valid: wire.SetSize, Size: 20000}, 20))
	checkSeeks(t, s, f.Ino, []seekCase{
		{0, sd, 4096, true}, {0, sh, 0, true}, {5000, sh, 4096 + 8192, true},
		{4096 + 8192, sd, 0, false}, {19999, sh, 19999, true}, {20000, sh, 0, false},
	})
	if _, err := s.Seek(f.Ino, 0, 2); !errIs(err, wire.CodeInvalid) {
		t.Fatalf("seek with whence 2: %v", err)
	}
}
