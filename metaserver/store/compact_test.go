package store

import (
	"testing"

	"github.com/leasefs/leasefs/blocks"
	"github.com/leasefs/leasefs/blocks/blockmap"
	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/wire"
)

func TestStoreCompactBlocks(t *testing.T) {
	s := newBlockStore(t)
	f := must[Attr](t)(s.Create(ids.RootIno, "f", reg|0o644, 0, 0, 0, 1))
	var size uint64
	for i := range 6 {
		b := newBlock(byte(i+1), 1000)
		commit(t, s, f.Ino, b, size, 10)
		size += b.Size
	}
	before := must[Attr](t)(s.GetAttr(f.Ino))
	p, ok := must[*blockmap.Map](t)(s.BlockMap(f.Ino)).CompactPlan()
	if !ok || len(p.Extents) != 6 || p.Size != 6000 {
		t.Fatalf("plan %+v %v", p, ok)
	}
	nb := newBlock(99, p.Size)
	// a block of another size is refused
	_, err := s.CompactBlocks(f.Ino, p, newBlock(98, 10), 100)
	wantCode(t, err, wire.CodeInvalid)

	const now = 100
	freed, err := s.CompactBlocks(f.Ino, p, nb, now)
	if err != nil || freed != 6000 {
		t.Fatalf("compaction: freed %d, %v", freed, err)
	}
	if a := must[Attr](t)(s.GetAttr(f.Ino)); a != before {
		t.Fatalf("compaction changed the attributes: %+v, were %+v", a, before)
	}
	if nb, ne := countRecords(t, s, RecBlock, f.Ino), countRecords(t, s, RecExtent, f.Ino); nb != 1 || ne != 1 {
		t.Fatalf("after: %d blocks, %d extents", nb, ne)
	}
	g := garbageOf(t, s)
	if len(g) != 6 {
		t.Fatalf("garbage %+v", g)
	}
	for _, x := range g {
		if x.Due != now+int64(testDelay) || x.Size != 1000 {
			t.Fatalf("garbage %+v, due at %d", x, now+int64(testDelay))
		}
	}
	ps, _, err := s.LookupBlocks(f.Ino, 0, size)
	if err != nil || len(ps) != 1 || ps[0].Block != (blocks.ID{Ino: f.Ino, Unique: nb.Unique}) || ps[0].Len != size {
		t.Fatalf("lookup %+v %v", ps, err)
	}

	// The same plan again: its extents are gone, nothing changes.
	_, err = s.CompactBlocks(f.Ino, p, newBlock(97, p.Size), now)
	wantCode(t, err, wire.CodeStale)
	if nb, ne := countRecords(t, s, RecBlock, f.Ino), countRecords(t, s, RecExtent, f.Ino); nb != 1 || ne != 1 || len(garbageOf(t, s)) != 6 {
		t.Fatalf("a stale compaction changed the map: %d blocks, %d extents", nb, ne)
	}
	// a file in pages has no map to compact
	pg := must[Attr](t)(s.Create(ids.RootIno, "pages", reg|0o644, 0, 0, 0, 1))
	must[Attr](t)(s.Write(pg.Ino, 0, []byte("x"), 10))
	if _, err := s.CompactBlocks(pg.Ino, p, nb, now); err != ErrNotMapped {
		t.Fatalf("compacting a file in pages: %v", err)
	}
}
