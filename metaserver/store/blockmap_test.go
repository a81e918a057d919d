package store

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/leasefs/leasefs/blocks"
	"github.com/leasefs/leasefs/blocks/blockmap"
	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/wire"
)

const testDelay = 5 * time.Second

// newBlock returns a block of size bytes with a distinct random part.
func newBlock(tag byte, size uint64) blockmap.Block {
	var u blockmap.Unique
	u[0], u[15] = tag, 0xb1
	return blockmap.Block{Unique: u, Size: size, Sums: blocks.Sum(make([]byte, size))}
}

// whole is the extent of all of b at off.
func whole(b blockmap.Block, off uint64) []blockmap.Extent {
	return []blockmap.Extent{{Off: off, Len: b.Size, Block: b.Unique}}
}

func newBlockStore(t *testing.T) *Store {
	s := openTestStore(t, t.TempDir(), Options{GarbageDelay: testDelay})
	t.Cleanup(func() { s.Close() })
	return s
}

// commit is CommitBlocks of one whole block at off, the size at least its end.
func commit(t *testing.T, s *Store, ino ids.Ino, b blockmap.Block, off uint64, now int64) Attr {
	t.Helper()
	return must[Attr](t)(s.CommitBlocks(ino, []blockmap.Block{b}, whole(b, off), off+b.Size, now))
}

func garbageOf(t *testing.T, s *Store) []Garbage {
	t.Helper()
	return must[[]Garbage](t)(s.DueGarbageAfter(1<<62, nil, 0, nil))
}

func TestStoreBlocksCommitLookup(t *testing.T) {
	s := newBlockStore(t)
	f := must[Attr](t)(s.Create(ids.RootIno, "f", reg|0o644, 0, 0, 0, 1))
	b1, b2 := newBlock(1, 10000), newBlock(2, 4096)
	a := commit(t, s, f.Ino, b1, 0, 10)
	if a.Size != 10000 || a.Blocks != 10240/512 || a.Version != f.Version+1 || a.Mtime != 10 || a.Ctime != 10 || a.Change <= f.Change {
		t.Fatalf("after the first commit: %+v", a)
	}
	a = commit(t, s, f.Ino, b2, 20000, 20) // a hole before it
	if a.Size != 24096 || a.Blocks != (10000+4096+511)/512 {
		t.Fatalf("after the second commit: %+v", a)
	}
	if got := must[Attr](t)(s.GetAttr(f.Ino)); got != a {
		t.Fatalf("GetAttr %+v, commit returned %+v", got, a)
	}
	ps, pa, err := s.LookupBlocks(f.Ino, 5000, 1<<20)
	if err != nil || pa != a {
		t.Fatalf("lookup: %v, attributes %+v", err, pa)
	}
	want := []blockmap.Piece{
		{Off: 5000, Len: 5000, Block: blocks.ID{Ino: f.Ino, Unique: b1.Unique}, BlockOff: 5000, Size: b1.Size, Sums: b1.Sums},
		{Off: 10000, Len: 10000, Hole: true},
		{Off: 20000, Len: 4096, Block: blocks.ID{Ino: f.Ino, Unique: b2.Unique}, Size: b2.Size, Sums: b2.Sums},
	}
	if !slices.EqualFunc(ps, want, func(a, b blockmap.Piece) bool {
		return a.Off == b.Off && a.Len == b.Len && a.Hole == b.Hole && a.Block == b.Block &&
			a.BlockOff == b.BlockOff && a.Size == b.Size && slices.Equal(a.Sums, b.Sums)
	}) {
		t.Fatalf("pieces %+v, want %+v", ps, want)
	}
	if ps, _, err := s.LookupBlocks(f.Ino, 24096, 10); err != nil || len(ps) != 0 {
		t.Fatalf("lookup at the end: %v %v", ps, err)
	}
	m := must[*blockmap.Map](t)(s.BlockMap(f.Ino))
	if m.Blocks() != 2 || len(m.Extents()) != 2 {
		t.Fatalf("map of %d blocks, %d extents", m.Blocks(), len(m.Extents()))
	}
	// the page operations refuse a block-mapped file
	if _, err := s.Read(f.Ino, 0, 10); err != ErrMapped {
		t.Fatalf("read: %v", err)
	}
	if _, err := s.Write(f.Ino, 0, []byte("x"), 30); err != ErrMapped {
		t.Fatalf("write: %v", err)
	}
	// an extent past the size the commit gives is refused, nothing written
	b3 := newBlock(3, 100)
	_, err = s.CommitBlocks(f.Ino, []blockmap.Block{b3}, whole(b3, 30000), 0, 40)
	wantCode(t, err, wire.CodeInvalid)
	if got := must[Attr](t)(s.GetAttr(f.Ino)); got != a || countRecords(t, s, RecBlock, f.Ino) != 2 {
		t.Fatalf("a refused commit changed %+v", got)
	}
	if len(garbageOf(t, s)) != 0 {
		t.Fatal("garbage without an overwrite")
	}
}

func TestStoreBlocksOverwriteGarbage(t *testing.T) {
	s := newBlockStore(t)
	f := must[Attr](t)(s.Create(ids.RootIno, "f", reg|0o644, 0, 0, 0, 1))
	old, part, repl := newBlock(1, 8192), newBlock(2, 100), newBlock(3, 8192)
	commit(t, s, f.Ino, old, 0, 10)
	// a partial overwrite keeps the old block: it is still referenced
	commit(t, s, f.Ino, part, 4000, 20)
	if g := garbageOf(t, s); len(g) != 0 {
		t.Fatalf("garbage %+v after a partial overwrite", g)
	}
	const now = 100
	a := commit(t, s, f.Ino, repl, 0, now)
	want := []Garbage{{ID: blocks.ID{Ino: f.Ino, Unique: old.Unique}, Due: now + int64(testDelay), Size: old.Size},
		{ID: blocks.ID{Ino: f.Ino, Unique: part.Unique}, Due: now + int64(testDelay), Size: part.Size}}
	if g := garbageOf(t, s); !slices.Equal(g, want) {
		t.Fatalf("garbage %+v, want %+v", g, want)
	}
	if a.Blocks != 8192/512 || countRecords(t, s, RecBlock, f.Ino) != 1 || countRecords(t, s, RecExtent, f.Ino) != 1 {
		t.Fatalf("after the overwrite: %+v, %d blocks, %d extents", a, countRecords(t, s, RecBlock, f.Ino), countRecords(t, s, RecExtent, f.Ino))
	}
	if due := dueIDs(t, s, now+int64(testDelay)-1, 0); len(due) != 0 {
		t.Fatalf("due before its time: %v", due)
	}
	due := dueIDs(t, s, now+int64(testDelay), 0)
	if len(due) != 2 || due[0] != want[0].ID || due[1] != want[1].ID {
		t.Fatalf("due %v", due)
	}
	if one := dueIDs(t, s, now+int64(testDelay), 1); len(one) != 1 {
		t.Fatalf("limit 1 gave %v", one)
	}
	must[any](t)(nil, s.ForgetGarbage(due[:1]))
	if g := garbageOf(t, s); len(g) != 1 || g[0].ID != due[1] {
		t.Fatalf("after forgetting one: %+v", g)
	}
	must[any](t)(nil, s.ForgetGarbage(due))
	if n := countRecords(t, s, RecGarbage, f.Ino); n != 0 {
		t.Fatalf("%d garbage records left", n)
	}
}

func TestStoreBlocksTruncatePunch(t *testing.T) {
	s := newBlockStore(t)
	f := must[Attr](t)(s.Create(ids.RootIno, "f", reg|0o644, 0, 0, 0, 1))
	b1, b2 := newBlock(1, 4096), newBlock(2, 4096)
	must[Attr](t)(s.CommitBlocks(f.Ino, []blockmap.Block{b1, b2},
		append(whole(b1, 0), whole(b2, 4096)...), 8192, 10))
	a := must[Attr](t)(s.SetAttr(f.Ino, SetAttrIn{Valid: wire.SetSize, Size: 4000}, 20))
	if a.Size != 4000 || a.Blocks != 4096/512 {
		t.Fatalf("after truncation: %+v", a)
	}
	if g := garbageOf(t, s); len(g) != 1 || g[0].ID.Unique != b2.Unique || g[0].Due != 20+int64(testDelay) {
		t.Fatalf("garbage after truncation: %+v", g)
	}
	// an extension reads a hole, not the cut bytes
	must[Attr](t)(s.SetAttr(f.Ino, SetAttrIn{Valid: wire.SetSize, Size: 8192}, 30))
	ps := must[[]blockmap.Piece](t)(pieces(s.LookupBlocks(f.Ino, 0, 8192)))
	if len(ps) != 2 || ps[0].Len != 4000 || !ps[1].Hole || ps[1].Off != 4000 {
		t.Fatalf("after extension: %+v", ps)
	}
	a = must[Attr](t)(s.Punch(f.Ino, 0, 8192, wire.PunchHole|wire.PunchKeepSize, 40))
	if a.Size != 8192 || a.Blocks != 0 || a.Mtime != 40 {
		t.Fatalf("after punching: %+v", a)
	}
	if g := garbageOf(t, s); len(g) != 2 || g[1].ID.Unique != b1.Unique || g[1].Due != 40+int64(testDelay) {
		t.Fatalf("garbage after punching: %+v", g)
	}
}

func pieces(ps []blockmap.Piece, _ Attr, err error) ([]blockmap.Piece, error) { return ps, err }

func TestStoreBlocksUnlinkPurge(t *testing.T) {
	clock := int64(1000)
	s := openTestStore(t, t.TempDir(), Options{GarbageDelay: testDelay, Clock: func() int64 { return clock }})
	defer s.Close()
	// removed at once
	f := must[Attr](t)(s.Create(ids.RootIno, "f", reg|0o644, 0, 0, 0, 1))
	b := newBlock(1, 4096)
	commit(t, s, f.Ino, b, 0, 10)
	if _, purged, err := s.Unlink(ids.RootIno, "f", 50, func(ids.Ino) bool { return true }); err != nil || !purged {
		t.Fatalf("unlink: purged %v, %v", purged, err)
	}
	if g := garbageOf(t, s); len(g) != 1 || g[0].ID != (blocks.ID{Ino: f.Ino, Unique: b.Unique}) || g[0].Due != 50+int64(testDelay) {
		t.Fatalf("garbage after unlink: %+v", g)
	}
	// removed at its last close, its map bigger than a purge step
	h := must[Attr](t)(s.Create(ids.RootIno, "h", reg|0o644, 0, 0, 0, 1))
	big := newBlock(2, blocks.MaxBlock)
	var exts []blockmap.Extent
	for i := range uint64(deleteBatch + 10) {
		exts = append(exts, blockmap.Extent{Off: 2 * i, Len: 1, Block: big.Unique, BlockOff: 2 * i})
	}
	must[Attr](t)(s.CommitBlocks(h.Ino, []blockmap.Block{big}, exts, 2*uint64(len(exts)), 60))
	must[Attr](t)(unlinked(s.Unlink(ids.RootIno, "h", 70, nil)))
	clock = 2000
	must[any](t)(nil, s.Purge(h.Ino))
	for _, kind := range []byte{RecAttr, RecExtent, RecBlock} {
		if n := countRecords(t, s, kind, h.Ino); n != 0 {
			t.Fatalf("%d %c records after purge", n, kind)
		}
	}
	if g := garbageOf(t, s); len(g) != 2 || g[1].ID.Unique != big.Unique || g[1].Due != 2000+int64(testDelay) || g[1].Size != blocks.MaxBlock {
		t.Fatalf("garbage after purge: %+v", g)
	}
}

func TestStoreBlocksExactlyOnce(t *testing.T) {
	s := newBlockStore(t)
	f := must[Attr](t)(s.Create(ids.RootIno, "f", reg|0o644, 0, 0, 0, 1))
	b1, b2 := newBlock(1, 4096), newBlock(2, 4096)
	o := Origin{Ino: f.Ino, Client: 7, Req: 1}
	a := commit(t, s.For(o), f.Ino, b1, 0, 10)
	// the resend after a failover: found applied, nothing made again
	again := commit(t, s.For(o), f.Ino, b1, 0, 11)
	if again != a {
		t.Fatalf("resent commit gave %+v, first %+v", again, a)
	}
	if done, _, err := s.Applied(o); err != nil || !done {
		t.Fatalf("applied %v, %v", done, err)
	}
	// a later request overwrites; a resend of it frees nothing twice
	o2 := Origin{Ino: f.Ino, Client: 7, Req: 2}
	a2 := commit(t, s.For(o2), f.Ino, b2, 0, 20)
	if a2.Version != a.Version+1 {
		t.Fatalf("second commit: %+v after %+v", a2, a)
	}
	if got := commit(t, s.For(o2), f.Ino, b2, 0, 21); got != a2 || len(garbageOf(t, s)) != 1 {
		t.Fatalf("resent second commit: %+v, garbage %+v", got, garbageOf(t, s))
	}
	// and one the client never sent before is made
	b3 := newBlock(3, 4096)
	if a3 := commit(t, s.For(Origin{Ino: f.Ino, Client: 7, Req: 3}), f.Ino, b3, 0, 30); a3.Version != a2.Version+1 {
		t.Fatalf("third commit: %+v", a3)
	}
}

func TestStoreBlocksReopen(t *testing.T) {
	dir := t.TempDir()
	s := openTestStore(t, dir, Options{GarbageDelay: testDelay})
	f := must[Attr](t)(s.Create(ids.RootIno, "f", reg|0o644, 0, 0, 0, 1))
	b1, b2 := newBlock(1, 8192), newBlock(2, 100)
	commit(t, s, f.Ino, b1, 0, 10)
	commit(t, s, f.Ino, b2, 6000, 20)
	a := must[Attr](t)(s.SetAttr(f.Ino, SetAttrIn{Valid: wire.SetSize, Size: 4096}, 30)) // b2 goes
	ps := must[[]blockmap.Piece](t)(pieces(s.LookupBlocks(f.Ino, 0, 1<<20)))
	g := garbageOf(t, s)
	if len(g) != 1 {
		t.Fatalf("garbage %+v", g)
	}
	dumped := dump(t, s)
	must[any](t)(nil, s.Close())

	s = openTestStore(t, dir, Options{GarbageDelay: testDelay})
	defer s.Close()
	if got := must[Attr](t)(s.GetAttr(f.Ino)); got != a || got.Blocks != 4096/512 {
		t.Fatalf("reopened: %+v, before %+v", got, a)
	}
	got := must[[]blockmap.Piece](t)(pieces(s.LookupBlocks(f.Ino, 0, 1<<20)))
	if len(got) != len(ps) || len(got) != 1 || got[0].Block != ps[0].Block || got[0].Len != 4096 {
		t.Fatalf("reopened pieces %+v, before %+v", got, ps)
	}
	if gg := garbageOf(t, s); !slices.Equal(gg, g) {
		t.Fatalf("reopened garbage %+v, before %+v", gg, g)
	}
	if d := dump(t, s); !slices.Equal(d, dumped) {
		t.Fatalf("records changed across a restart:\n%v\n%v", dumped, d)
	}
}

func TestStoreBlocksPagesUntouched(t *testing.T) {
	s := newBlockStore(t)
	f := must[Attr](t)(s.Create(ids.RootIno, "f", reg|0o644, 0, 0, 0, 1))
	a := must[Attr](t)(s.Write(f.Ino, 100, []byte("hello"), 2))
	if a.Blocks != 1 {
		t.Fatalf("a file with pages: %+v", a)
	}
	b := newBlock(1, 10)
	if _, err := s.CommitBlocks(f.Ino, []blockmap.Block{b}, whole(b, 0), 10, 3); err != ErrNotMapped {
		t.Fatalf("commit to a file with pages: %v", err)
	}
	if _, _, err := s.LookupBlocks(f.Ino, 0, 10); err != ErrNotMapped {
		t.Fatalf("lookup in a file with pages: %v", err)
	}
	if _, err := s.BlockMap(f.Ino); err != ErrNotMapped {
		t.Fatalf("map of a file with pages: %v", err)
	}
	if got := must[[]byte](t)(s.Read(f.Ino, 98, 10)); string(got) != "\x00\x00hello" {
		t.Fatalf("read %q", got)
	}
	must[Attr](t)(s.SetAttr(f.Ino, SetAttrIn{Valid: wire.SetSize, Size: 102}, 4))
	if got := must[[]byte](t)(s.Read(f.Ino, 98, 10)); string(got) != "\x00\x00he" {
		t.Fatalf("read after truncation %q", got)
	}
	// its attribute record keeps its format
	err := s.view(func(tx *Tx) error {
		_, err := tx.get(tx.key(RecAttr, f.Ino, nil), func(v []byte) error {
			if len(v) != inodeSize || v[0] != inodeFormat {
				return errors.New("attribute record changed format")
			}
			return nil
		})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if n := countRecords(t, s, RecExtent, f.Ino) + countRecords(t, s, RecBlock, f.Ino); n != 0 || len(garbageOf(t, s)) != 0 {
		t.Fatalf("a file with pages has %d block map records", n)
	}
	// a file with no data yet becomes block-mapped, and stays so once empty
	e := must[Attr](t)(s.Create(ids.RootIno, "e", reg|0o644, 0, 0, 0, 1))
	commit(t, s, e.Ino, b, 0, 5)
	must[Attr](t)(s.SetAttr(e.Ino, SetAttrIn{Valid: wire.SetSize, Size: 0}, 6))
	if _, err := s.Write(e.Ino, 0, []byte("x"), 7); err != ErrMapped {
		t.Fatalf("page write to an emptied block-mapped file: %v", err)
	}
}

func TestStoreBlocksRemovalsAdmitted(t *testing.T) {
	for _, kind := range []byte{RecExtent, RecBlock, RecGarbage} {
		var c txnCost
		c.del([]byte{kind, 0, 0, 0, 0, 0, 0, 0, 1})
		if !c.removal() {
			t.Fatalf("deleting a %c record is not a removal", kind)
		}
	}
}

// TestStoreBlocksTruncateMany: a truncation that frees more extents than
// one transaction should delete takes several, and frees them all.
func TestStoreBlocksTruncateMany(t *testing.T) {
	commits := 0
	s := openTestStore(t, t.TempDir(), Options{GarbageDelay: testDelay, OnCommit: func([]Write) { commits++ }})
	defer s.Close()
	f := must[Attr](t)(s.Create(ids.RootIno, "f", reg|0o644, 0, 0, 0, 1))
	big, small := newBlock(1, blocks.MaxBlock), newBlock(2, 10)
	exts := whole(small, 0)
	for i := range uint64(2*deleteBatch + 5) {
		exts = append(exts, blockmap.Extent{Off: 100 + 2*i, Len: 1, Block: big.Unique, BlockOff: 2 * i})
	}
	end := exts[len(exts)-1].End()
	must[Attr](t)(s.CommitBlocks(f.Ino, []blockmap.Block{small, big}, exts, end, 2))
	commits = 0
	a := must[Attr](t)(s.SetAttr(f.Ino, SetAttrIn{Valid: wire.SetSize, Size: 10}, 3))
	if commits != 3 {
		t.Fatalf("truncation took %d transactions, want 3", commits)
	}
	if a.Size != 10 || a.Blocks != 1 || countRecords(t, s, RecExtent, f.Ino) != 1 || countRecords(t, s, RecBlock, f.Ino) != 1 {
		t.Fatalf("after truncation: %+v, %d extents", a, countRecords(t, s, RecExtent, f.Ino))
	}
	if g := garbageOf(t, s); len(g) != 1 || g[0].ID.Unique != big.Unique {
		t.Fatalf("garbage %+v", g)
	}
}

// TestStoreDueGarbageAfter: the collector's query goes on after a given
// record, leaves out the inodes keep refuses without counting them
// against the limit, and never returns a block before its due time.
func TestStoreDueGarbageAfter(t *testing.T) {
	s := newBlockStore(t)
	f := must[Attr](t)(s.Create(ids.RootIno, "f", reg|0o644, 0, 0, 0, 1))
	g := must[Attr](t)(s.Create(ids.RootIno, "g", reg|0o644, 0, 0, 0, 1))
	for i, ino := range []ids.Ino{f.Ino, g.Ino} {
		for j := range 3 {
			b := newBlock(byte(10*i+j), 100)
			commit(t, s, ino, b, 0, int64(10*(j+1)))
		}
	}
	// each inode: its first two blocks are garbage, due at 20+d and 30+d
	all := garbageOf(t, s)
	if len(all) != 4 {
		t.Fatalf("garbage %+v, want 4 records", all)
	}
	now := 30 + int64(testDelay)
	var got []Garbage
	var after *Garbage
	for {
		page := must[[]Garbage](t)(s.DueGarbageAfter(now, after, 1, nil))
		if len(page) == 0 {
			break
		}
		got = append(got, page...)
		after = &page[len(page)-1]
	}
	if !slices.Equal(got, all) {
		t.Fatalf("paged one at a time: %+v, want %+v", got, all)
	}
	if due := must[[]Garbage](t)(s.DueGarbageAfter(20+int64(testDelay), nil, 0, nil)); len(due) != 2 || due[0] != all[0] || due[1] != all[2] {
		t.Fatalf("due at the first due time: %+v", due)
	}
	onlyG := func(ino ids.Ino) bool { return ino == g.Ino }
	if due := must[[]Garbage](t)(s.DueGarbageAfter(now, nil, 2, onlyG)); !slices.Equal(due, all[2:]) {
		t.Fatalf("only g's, two: %+v, want %+v", due, all[2:])
	}
}

// TestStoreUnknownBlocks: a block is unknown while no 'U' record
// references it and no 'G' record holds it, and known again after neither.
func TestStoreUnknownBlocks(t *testing.T) {
	s := newBlockStore(t)
	f := must[Attr](t)(s.Create(ids.RootIno, "f", reg|0o644, 0, 0, 0, 1))
	live, old, never := newBlock(1, 100), newBlock(2, 100), newBlock(3, 100)
	commit(t, s, f.Ino, old, 0, 10)
	commit(t, s, f.Ino, live, 0, 20) // old becomes garbage
	id := func(b blockmap.Block) blocks.ID { return blocks.ID{Ino: f.Ino, Unique: b.Unique} }
	other := blocks.ID{Ino: f.Ino + 1, Unique: live.Unique} // another inode's block of the same random part
	got := must[[]blocks.ID](t)(s.UnknownBlocks([]blocks.ID{id(live), id(old), id(never), other}))
	if want := []blocks.ID{id(never), other}; !slices.Equal(got, want) {
		t.Fatalf("unknown %v, want %v", got, want)
	}
	must[any](t)(nil, s.ForgetGarbage([]blocks.ID{id(old)}))
	got = must[[]blocks.ID](t)(s.UnknownBlocks([]blocks.ID{id(live), id(old)}))
	if want := []blocks.ID{id(old)}; !slices.Equal(got, want) {
		t.Fatalf("after the garbage is forgotten: unknown %v, want %v", got, want)
	}
}

// dueIDs is the blocks of the garbage due at now, up to limit.
func dueIDs(t *testing.T, s *Store, now int64, limit int) []blocks.ID {
	t.Helper()
	var ids []blocks.ID
	for _, g := range must[[]Garbage](t)(s.DueGarbageAfter(now, nil, limit, nil)) {
		ids = append(ids, g.ID)
	}
	return ids
}
