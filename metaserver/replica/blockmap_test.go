package replica

import (
	"context"
	"slices"
	"testing"

	"github.com/leasefs/leasefs/blocks"
	"github.com/leasefs/leasefs/blocks/blockmap"
	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/metaserver/store"
)

func testBlock(tag byte, size uint64) blockmap.Block {
	var u blockmap.Unique
	u[0], u[15] = tag, 0xb1
	return blockmap.Block{Unique: u, Size: size, Sums: blocks.Sum(make([]byte, size))}
}

func commitBlock(t *testing.T, s *testStore, ino ids.Ino, b blockmap.Block, off uint64, now int64) {
	t.Helper()
	ext := []blockmap.Extent{{Off: off, Len: b.Size, Block: b.Unique}}
	must[store.Attr](t)(s.CommitBlocks(ino, []blockmap.Block{b}, ext, off+b.Size, now))
}

// sameBlocks checks that two stores give the same pieces for a file.
func sameBlocks(t *testing.T, ino ids.Ino, want, got *testStore) {
	t.Helper()
	wp, wa, werr := want.LookupBlocks(ino, 0, 1<<30)
	gp, ga, gerr := got.LookupBlocks(ino, 0, 1<<30)
	if werr != nil || gerr != nil || wa != ga || len(wp) != len(gp) {
		t.Fatalf("lookups differ: %v %+v (%v), %v %+v (%v)", wp, wa, werr, gp, ga, gerr)
	}
	for i := range wp {
		if wp[i].Off != gp[i].Off || wp[i].Len != gp[i].Len || wp[i].Block != gp[i].Block || !slices.Equal(wp[i].Sums, gp[i].Sums) {
			t.Fatalf("piece %d: %+v, %+v", i, wp[i], gp[i])
		}
	}
}

func dueGarbage(t *testing.T, s *testStore) []blocks.ID {
	t.Helper()
	var ids []blocks.ID
	for _, g := range must[[]store.Garbage](t)(s.DueGarbageAfter(1<<62, nil, 0, nil)) {
		ids = append(ids, g.ID)
	}
	return ids
}

// TestReplBlockMap: a block map and the garbage its changes leave
// replicate, copy to a replica that never saw the file, and count in
// checksums and digests.
func TestReplBlockMap(t *testing.T) {
	a, b, c := replCluster(t)
	f := must[store.Attr](t)(a.s.Create(ids.RootIno, "f", reg|0o644, 0, 0, 0, 1))
	b1, b2, b3 := testBlock(1, 8192), testBlock(2, 8192), testBlock(3, 100)
	commitBlock(t, a.s, f.Ino, b1, 0, 10)
	commitBlock(t, a.s, f.Ino, b2, 0, 20) // b1 becomes garbage
	commitBlock(t, a.s, f.Ino, b3, 20000, 30)
	ship(t, a.take(), b)
	sameChecksums(t, a, b)
	sameBlocks(t, f.Ino, a.s, b.s)
	g1 := blocks.ID{Ino: f.Ino, Unique: b1.Unique}
	if g := dueGarbage(t, b.s); !slices.Equal(g, []blocks.ID{g1}) {
		t.Fatalf("replica's garbage %v", g)
	}

	// c never saw the file: its copy holds the map and the garbage
	must[CopyResult](t)(CopyInode(context.Background(), a.s, c.s, f.Ino, CopyOptions{PageBytes: MinPageBytes}))
	sameBlocks(t, f.Ino, a.s, c.s)
	if g := dueGarbage(t, c.s); !slices.Equal(g, []blocks.ID{g1}) {
		t.Fatalf("copy's garbage %v", g)
	}
	digestOf := func(s *testStore) InodeDigest {
		p := must[DigestPage](t)(s.DigestRange(f.Ino-1, f.Ino, true))
		if len(p.Inodes) != 1 {
			t.Fatalf("digest %+v", p)
		}
		return p.Inodes[0]
	}
	if da, dc := digestOf(a.s), digestOf(c.s); da != dc {
		t.Fatalf("digests differ: %+v, %+v", da, dc)
	}
	// a garbage record written outside replication is a divergence
	must[any](t)(nil, c.s.UpdateRaw(func(tx *store.Tx) error {
		return tx.Set(tx.Key(store.RecGarbage, f.Ino, make([]byte, 24)), make([]byte, 8))
	}))
	if da, dc := digestOf(a.s), digestOf(c.s); da.Hash == dc.Hash {
		t.Fatal("a garbage record does not count in the digest")
	}

	// the collector's forgetting and the file's removal replicate too
	must[any](t)(nil, a.s.ForgetGarbage([]blocks.ID{g1}))
	if _, purged, err := a.s.Unlink(ids.RootIno, "f", 40, func(ids.Ino) bool { return true }); err != nil || !purged {
		t.Fatalf("unlink: %v %v", purged, err)
	}
	ship(t, a.take(), b)
	sameChecksums(t, a, b)
	want := []blocks.ID{{Ino: f.Ino, Unique: b2.Unique}, {Ino: f.Ino, Unique: b3.Unique}}
	slices.SortFunc(want, func(x, y blocks.ID) int { return slices.Compare(x.Unique[:], y.Unique[:]) })
	for _, s := range []*testStore{a.s, b.s} {
		if g := dueGarbage(t, s); !slices.Equal(g, want) {
			t.Fatalf("garbage after removal %v, want %v", g, want)
		}
		if n := countRecords(t, s, store.RecExtent, f.Ino) + countRecords(t, s, store.RecBlock, f.Ino); n != 0 {
			t.Fatalf("%d block map records after removal", n)
		}
	}
}
