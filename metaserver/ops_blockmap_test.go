package metaserver

import (
	"bytes"
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/leasefs/leasefs/blocks"
	"github.com/leasefs/leasefs/blocks/blockmap"
	"github.com/leasefs/leasefs/client"
	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/wire"
)

func startBlockTestServer(t *testing.T) *Server {
	t.Helper()
	return startTestServerWith(t, func(cfg *Config) {
		cfg.Blocks = "file:" + filepath.Join(cfg.Dir, "blocks")
		cfg.BlocksListen = "127.0.0.1:0"
	})
}

// putBlock puts data as a new block of ino in the stores of servers, and
// returns it as a map names it.
func putBlock(t *testing.T, ino ids.Ino, data []byte, servers ...*Server) blockmap.Block {
	t.Helper()
	id := blocks.NewID(ino)
	for _, s := range servers {
		if err := s.blocks.store.Put(context.Background(), id, data); err != nil {
			t.Fatal(err)
		}
	}
	return blockmap.Block{Unique: id.Unique, Size: uint64(len(data)), Sums: blocks.Sum(data)}
}

// whole is the extent of all of b at off.
func whole(off uint64, b blockmap.Block) blockmap.Extent {
	return blockmap.Extent{Off: off, Len: b.Size, Block: b.Unique}
}

func commitReq(ino ids.Ino, size uint64, blks []blockmap.Block, exts ...blockmap.Extent) *wire.Request {
	return &wire.Request{Op: wire.OpCommitBlocks, Ino: ino, Size: size, Data: wire.AppendCommit(nil, blks, exts)}
}

func lookupBlocks(ctx context.Context, c *client.Client, ino ids.Ino, off, n uint64) ([]blockmap.Piece, *wire.Reply, error) {
	rep, err := c.Call(ctx, &wire.Request{Op: wire.OpLookupBlocks, Ino: ino, Off: off, Size: n})
	if err != nil {
		return nil, rep, err
	}
	if rep.Flags&wire.InlineData != 0 {
		return nil, rep, errInline
	}
	ps, err := wire.ParsePieces(rep.Data)
	return ps, rep, err
}

// errInline is lookupBlocks' answer for a reply holding the file's bytes.
var errInline = errors.New("lookup answered the file's bytes")

// lookupInline looks up a range of a file whose data is in pages: the
// reply holds its bytes.
func lookupInline(ctx context.Context, t *testing.T, c *client.Client, ino ids.Ino, off, n uint64) ([]byte, *wire.Reply) {
	t.Helper()
	rep, err := c.Call(ctx, &wire.Request{Op: wire.OpLookupBlocks, Ino: ino, Off: off, Size: n})
	if err != nil {
		t.Fatalf("lookup of paged %v: %v", ino, err)
	}
	if rep.Flags&wire.InlineData == 0 {
		t.Fatalf("lookup of paged %v: flags %#x, no InlineData", ino, rep.Flags)
	}
	return rep.Data, rep
}

// takeX gets c the X lock on ino without writing pages (a chmod takes it).
func takeX(ctx context.Context, t *testing.T, c *client.Client, ino ids.Ino) {
	t.Helper()
	rep, err := c.Call(ctx, &wire.Request{Op: wire.OpSetAttr, Ino: ino, Valid: wire.SetMode, Mode: 0o644})
	if err != nil {
		t.Fatalf("chmod for the X lock: %v", err)
	}
	if !slicesHasGrant(rep, ino, wire.LockExclusive) {
		t.Fatalf("chmod granted %+v, want X on %v", rep.Grants, ino)
	}
}

func slicesHasGrant(rep *wire.Reply, ino ids.Ino, mode wire.LockMode) bool {
	for _, g := range rep.Grants {
		if g.Ino == ino && g.Mode == mode {
			return true
		}
	}
	return false
}

// mustCreate creates a regular file name in the root through c.
func mustCreate(ctx context.Context, t *testing.T, c *client.Client, name string) *wire.Attr {
	t.Helper()
	a, err := c.Create(ctx, ids.RootIno, name, 0o100644, 0, 0, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// TestCommitThenLookup: blocks committed under X read back, as pieces with
// their ids, sizes and sums, by another client under the S lock the
// lookup grants; a paged file answers its bytes.
func TestCommitThenLookup(t *testing.T) {
	s := startBlockTestServer(t)
	ctx := testContext(t)
	a, b := connect(t, s), connect(t, s)
	f := mustCreate(ctx, t, a, "f")
	takeX(ctx, t, a, f.Ino)
	data := []byte("hello, blocks")
	blk := putBlock(t, f.Ino, data, s)
	// the file: a hole of 100 bytes, then the block
	rep, err := a.Call(ctx, commitReq(f.Ino, 100+blk.Size, []blockmap.Block{blk}, whole(100, blk)))
	if err != nil {
		t.Fatalf("commit under X: %v", err)
	}
	if rep.Attr == nil || rep.Attr.Size != 100+blk.Size || rep.Attr.Version <= f.Version {
		t.Fatalf("commit reply attributes %+v (before %+v)", rep.Attr, f)
	}
	ps, rep, err := lookupBlocks(ctx, b, f.Ino, 0, 1<<20)
	if err != nil {
		t.Fatalf("lookup: %v", err)
	}
	if !slicesHasGrant(rep, f.Ino, wire.LockShared) {
		t.Errorf("lookup granted %+v, want S", rep.Grants)
	}
	want := []blockmap.Piece{{Off: 0, Len: 100, Hole: true},
		{Off: 100, Len: blk.Size, Block: blocks.ID{Ino: f.Ino, Unique: blk.Unique}, Size: blk.Size, Sums: blk.Sums}}
	if len(ps) != 2 || !ps[0].Hole || ps[0].Off != 0 || ps[0].Len != 100 || ps[1].Block != want[1].Block || ps[1].Off != 100 || ps[1].Len != blk.Size ||
		ps[1].Size != blk.Size || !slicesEqual(ps[1].Sums, blk.Sums) || ps[1].Hole {
		t.Fatalf("pieces %+v, want %+v", ps, want)
	}
	if rep.Attr == nil || rep.Attr.Size != 100+blk.Size {
		t.Fatalf("lookup attributes %+v", rep.Attr)
	}
	got := make([]byte, ps[1].Len)
	if _, err := s.blocks.store.ReadAt(ctx, ps[1].Block, got, int64(ps[1].BlockOff)); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("block bytes %q, %v", got, err)
	}

	g := mustCreate(ctx, t, b, "g")
	if _, err := b.Write(ctx, g.Ino, 0, []byte("pages"), false, false); err != nil {
		t.Fatal(err)
	}
	if err := b.Fsync(ctx, g.Ino); err != nil {
		t.Fatal(err)
	}
	if data, rep := lookupInline(ctx, t, a, g.Ino, 1, 10); string(data) != "ages" || rep.Attr == nil || rep.Attr.Size != 5 {
		t.Fatalf("lookup of a paged file: %q, %+v", data, rep.Attr)
	}
}

func slicesEqual(a, b blocks.Sums) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestLookupBlocksPaged: a reply holds at most wire.MaxPieces pieces; the
// client asks again from where they end and gets the rest.
func TestLookupBlocksPaged(t *testing.T) {
	s := startBlockTestServer(t)
	ctx := testContext(t)
	a := connect(t, s)
	f := mustCreate(ctx, t, a, "f")
	takeX(ctx, t, a, f.Ino)
	// one byte of data every other byte: a piece per byte
	const per = 700
	var size uint64
	for c := range 2 {
		blk := putBlock(t, f.Ino, make([]byte, per), s)
		exts := make([]blockmap.Extent, per)
		for i := range exts {
			exts[i] = blockmap.Extent{Off: uint64(2 * (c*per + i)), Len: 1, Block: blk.Unique, BlockOff: uint64(i)}
		}
		size = exts[per-1].End()
		if _, err := a.Call(ctx, commitReq(f.Ino, size, []blockmap.Block{blk}, exts...)); err != nil {
			t.Fatalf("commit %d: %v", c, err)
		}
	}
	var all []blockmap.Piece
	for off := uint64(0); off < size; {
		ps, _, err := lookupBlocks(ctx, a, f.Ino, off, size-off)
		if err != nil {
			t.Fatal(err)
		}
		if len(ps) == 0 || len(ps) > wire.MaxPieces {
			t.Fatalf("lookup at %d: %d pieces", off, len(ps))
		}
		all = append(all, ps...)
		off = ps[len(ps)-1].Off + ps[len(ps)-1].Len
	}
	if len(all) != 2*2*per-1 || len(all) <= wire.MaxPieces {
		t.Fatalf("%d pieces in all, want %d", len(all), 2*2*per-1)
	}
	for i, p := range all {
		if p.Off != uint64(i) || p.Len != 1 || p.Hole != (i%2 == 1) {
			t.Fatalf("piece %d: %+v", i, p)
		}
	}
}

// TestCommitNeedsX: a client that never locked the file (held by another
// client, or by none), and one whose X a reader revoked, cannot commit;
// nothing changes.
func TestCommitNeedsX(t *testing.T) {
	s := startBlockTestServer(t)
	ctx := testContext(t)
	a, b := connect(t, s), connect(t, s)
	f := mustCreate(ctx, t, a, "f")
	blk := putBlock(t, f.Ino, []byte("data"), s)
	if _, err := b.Call(ctx, commitReq(f.Ino, blk.Size, []blockmap.Block{blk}, whole(0, blk))); !errors.Is(err, wire.Err(wire.CodeAccess)) {
		t.Fatalf("commit without a lock: %v, want refused", err)
	}
	// a file whose lock nobody holds: the commit must not take it
	h, err := s.store.Create(ids.RootIno, "h", 0o100644, 0, 0, 0, time.Now().UnixNano())
	if err != nil {
		t.Fatal(err)
	}
	hb := putBlock(t, h.Ino, []byte("data"), s)
	if _, err := b.Call(ctx, commitReq(h.Ino, hb.Size, []blockmap.Block{hb}, whole(0, hb))); !errors.Is(err, wire.Err(wire.CodeAccess)) {
		t.Fatalf("commit with the lock free: %v, want refused", err)
	}
	takeX(ctx, t, a, f.Ino)
	// b's lookup takes S: a's X goes
	if data, _ := lookupInline(ctx, t, b, f.Ino, 0, 10); len(data) != 0 {
		t.Fatalf("lookup of a file with no data yet: %q", data)
	}
	if _, err := a.Call(ctx, commitReq(f.Ino, blk.Size, []blockmap.Block{blk}, whole(0, blk))); !errors.Is(err, wire.Err(wire.CodeAccess)) {
		t.Fatalf("commit after X was revoked: %v, want refused", err)
	}
	if m, err := s.store.BlockMap(f.Ino); err != nil || len(m.Extents()) != 0 {
		t.Fatalf("map after refused commits: %v, %v", m, err)
	}
}

// TestCommitUnuploadedBlock: a commit naming a block the store does not
// hold, or holds with another size, is refused and changes nothing.
func TestCommitUnuploadedBlock(t *testing.T) {
	s := startBlockTestServer(t)
	ctx := testContext(t)
	a := connect(t, s)
	f := mustCreate(ctx, t, a, "f")
	takeX(ctx, t, a, f.Ino)
	first := putBlock(t, f.Ino, []byte("first"), s)
	if _, err := a.Call(ctx, commitReq(f.Ino, first.Size, []blockmap.Block{first}, whole(0, first))); err != nil {
		t.Fatal(err)
	}
	before, err := s.store.GetAttr(f.Ino)
	if err != nil {
		t.Fatal(err)
	}
	put := putBlock(t, f.Ino, []byte("0123456789"), s)
	never := blockmap.Block{Unique: blocks.NewID(f.Ino).Unique, Size: 10, Sums: put.Sums}
	short, long := put, put
	short.Size, long.Size = 9, 11
	for name, c := range map[string]struct {
		blk  blockmap.Block
		code wire.Code
	}{"never put": {never, wire.CodeNotFound}, "shorter": {long, wire.CodeInvalid}, "longer": {short, wire.CodeInvalid}} {
		_, err := a.Call(ctx, commitReq(f.Ino, 20, []blockmap.Block{put, c.blk}, whole(0, put), whole(10, c.blk)))
		if !errors.Is(err, wire.Err(c.code)) {
			t.Errorf("commit of a block %s: %v, want %v", name, err, c.code)
		}
	}
	after, err := s.store.GetAttr(f.Ino)
	if err != nil {
		t.Fatal(err)
	}
	if after.Version != before.Version || after.Size != before.Size {
		t.Fatalf("attributes changed: %+v -> %+v", before, after)
	}
	m, err := s.store.BlockMap(f.Ino)
	if err != nil || m.Blocks() != 1 || len(m.Extents()) != 1 || m.Extents()[0].Block != first.Unique {
		t.Fatalf("map after refused commits: %+v, %v", m, err)
	}
}

// TestCommitResentOnce: a commit sent again (its reply lost) is answered
// from the current state, not applied again.
func TestCommitResentOnce(t *testing.T) {
	s := startBlockTestServer(t)
	ctx := testContext(t)
	a := connect(t, s)
	f := mustCreate(ctx, t, a, "f")
	takeX(ctx, t, a, f.Ino)
	blk := putBlock(t, f.Ino, []byte("once"), s)
	req := commitReq(f.Ino, blk.Size, []blockmap.Block{blk}, whole(0, blk))
	first, err := a.Call(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	replayed := s.counters.Replayed.Load()
	again, err := a.Call(ctx, req) // the same ReqID
	if err != nil {
		t.Fatalf("resent commit: %v", err)
	}
	if again.Attr == nil || again.Attr.Version != first.Attr.Version || again.Attr.Size != first.Attr.Size {
		t.Fatalf("resent commit answered %+v, first %+v", again.Attr, first.Attr)
	}
	if s.counters.Replayed.Load() != replayed+1 {
		t.Fatalf("replayed %d -> %d", replayed, s.counters.Replayed.Load())
	}
}

// TestCommitReclaim: a commit carrying WriteIfVersion (a reclaim after a
// NACK, the client's locks gone) takes the X lock itself and applies only
// at the version it names.
func TestCommitReclaim(t *testing.T) {
	s := startBlockTestServer(t)
	ctx := testContext(t)
	a, b := connect(t, s), connect(t, s)
	f := mustCreate(ctx, t, a, "f")
	takeX(ctx, t, a, f.Ino)
	first := putBlock(t, f.Ino, []byte("first"), s)
	rep, err := a.Call(ctx, commitReq(f.Ino, first.Size, []blockmap.Block{first}, whole(0, first)))
	if err != nil {
		t.Fatal(err)
	}
	base := rep.Attr.Version
	// b takes the file: a holds no lock now
	if _, _, err := lookupBlocks(ctx, b, f.Ino, 0, 5); err != nil {
		t.Fatal(err)
	}
	stale := putBlock(t, f.Ino, []byte("stale"), s)
	req := commitReq(f.Ino, stale.Size, []blockmap.Block{stale}, whole(0, stale))
	req.Flags, req.Version = wire.WriteIfVersion, base-1
	if _, err := a.Call(ctx, req); !errors.Is(err, wire.Err(wire.CodeStale)) {
		t.Fatalf("reclaim at an old version: %v, want stale", err)
	}
	again := putBlock(t, f.Ino, []byte("again"), s)
	req = commitReq(f.Ino, again.Size, []blockmap.Block{again}, whole(0, again))
	req.Flags, req.Version = wire.WriteIfVersion, base
	rep, err = a.Call(ctx, req)
	if err != nil {
		t.Fatalf("reclaim at the file's version: %v", err)
	}
	if !slicesHasGrant(rep, f.Ino, wire.LockExclusive) || rep.Attr.Version == base {
		t.Fatalf("reclaim granted %+v, version %d (was %d)", rep.Grants, rep.Attr.Version, base)
	}
	if m, err := s.store.BlockMap(f.Ino); err != nil || len(m.Extents()) != 1 || m.Extents()[0].Block != again.Unique {
		t.Fatalf("map after the reclaim: %+v, %v", m, err)
	}
}

// TestCommitOverwriteGarbage: a commit over a block's whole range leaves
// that block garbage, due later; the new block is not.
func TestCommitOverwriteGarbage(t *testing.T) {
	s := startBlockTestServer(t)
	ctx := testContext(t)
	a := connect(t, s)
	f := mustCreate(ctx, t, a, "f")
	takeX(ctx, t, a, f.Ino)
	old := putBlock(t, f.Ino, []byte("old data"), s)
	cur := putBlock(t, f.Ino, []byte("new data"), s)
	for _, b := range []blockmap.Block{old, cur} {
		if _, err := a.Call(ctx, commitReq(f.Ino, b.Size, []blockmap.Block{b}, whole(0, b))); err != nil {
			t.Fatal(err)
		}
	}
	if due, err := s.store.DueGarbageAfter(time.Now().UnixNano(), nil, 0, nil); err != nil || len(due) != 0 {
		t.Fatalf("garbage due at once: %v, %v", due, err)
	}
	due, err := s.store.DueGarbageAfter(time.Now().Add(time.Hour).UnixNano(), nil, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(due) != 1 || due[0].ID != (blocks.ID{Ino: f.Ino, Unique: old.Unique}) {
		t.Fatalf("garbage %v, want the old block %x only", due, old.Unique)
	}
}

// TestClusterCommitLookup: blocks committed through server 1 are looked up
// through server 2, which takes the file over; a client there commits an
// overwrite, which server 1 then serves back after taking it again.
func TestClusterCommitLookup(t *testing.T) {
	tc := newTestCluster(t, 3, func(id ids.ServerID, cfg *Config) {
		cfg.Blocks = "file:" + filepath.Join(cfg.Dir, "blocks")
		cfg.BlocksListen = "127.0.0.1:0"
	})
	servers := []*Server{tc.srv[1], tc.srv[2], tc.srv[3]}
	ctx := testContext(t)
	c1, c2 := tc.connect(1), tc.connect(2)
	f := mustCreate(ctx, t, c1, "f")
	takeX(ctx, t, c1, f.Ino)
	first := putBlock(t, f.Ino, []byte("through one"), servers...)
	if _, err := c1.Call(ctx, commitReq(f.Ino, first.Size, []blockmap.Block{first}, whole(0, first))); err != nil {
		t.Fatalf("commit through 1: %v", err)
	}
	if _, err := tc.srv[1].owner.OwnerEpoch(f.Ino); err != nil {
		t.Fatalf("server 1 does not own the file it committed: %v", err)
	}
	check := func(c *client.Client, via ids.ServerID, b blockmap.Block) {
		t.Helper()
		ps, _, err := lookupBlocks(ctx, c, f.Ino, 0, 100)
		if err != nil {
			t.Fatalf("lookup through %v: %v", via, err)
		}
		if len(ps) != 1 || ps[0].Block.Unique != b.Unique || ps[0].Len != b.Size {
			t.Fatalf("pieces through %v: %+v, want block %x", via, ps, b.Unique)
		}
		if _, err := tc.srv[via].owner.OwnerEpoch(f.Ino); err != nil {
			t.Fatalf("server %v does not own the file after the lookup: %v", via, err)
		}
	}
	check(c2, 2, first)
	takeX(ctx, t, c2, f.Ino)
	second := putBlock(t, f.Ino, []byte("through two"), servers...)
	if _, err := c2.Call(ctx, commitReq(f.Ino, second.Size, []blockmap.Block{second}, whole(0, second))); err != nil {
		t.Fatalf("commit through 2: %v", err)
	}
	check(c1, 1, second)
}

// TestBlockUsageReported: the admin status and statfs count the blocks a
// client committed (the first count lists the store at once).
func TestBlockUsageReported(t *testing.T) {
	s := startBlockTestServer(t)
	ctx := testContext(t)
	a := connect(t, s)
	f := mustCreate(ctx, t, a, "f")
	takeX(ctx, t, a, f.Ino)
	data := bytes.Repeat([]byte("u"), 3<<20)
	blk := putBlock(t, f.Ino, data, s)
	if _, err := a.Call(ctx, commitReq(f.Ino, blk.Size, []blockmap.Block{blk}, whole(0, blk))); err != nil {
		t.Fatal(err)
	}
	st := adminView{s}.Status()
	if st.BlockBytes != int64(len(data)) || st.Blocks != 1 || st.BlockFree <= 0 {
		t.Fatalf("status: %d bytes in %d blocks, %d free; want %d in 1", st.BlockBytes, st.Blocks, st.BlockFree, len(data))
	}
	rep, err := a.Call(ctx, &wire.Request{Op: wire.OpStatFs})
	if err != nil {
		t.Fatal(err)
	}
	fs := rep.StatFs
	if used := (fs.Blocks - fs.Bfree) * uint64(fs.Bsize); used < uint64(len(data)) {
		t.Fatalf("statfs: %d bytes used, want at least the %d in blocks", used, len(data))
	}
}
