package metaserver

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/leasefs/leasefs/blocks"
	"github.com/leasefs/leasefs/blocks/blockmap"
	"github.com/leasefs/leasefs/client"
	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/metaserver/store"
	"github.com/leasefs/leasefs/wire"
)

func randData(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, 7))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// writeReq is an OpWrite of data at off.
func writeReq(ino ids.Ino, off uint64, data []byte) *wire.Request {
	return &wire.Request{Op: wire.OpWrite, Ino: ino, Off: off, Data: data}
}

func call(ctx context.Context, t *testing.T, c *client.Client, req *wire.Request) *wire.Reply {
	t.Helper()
	rep, err := c.Call(ctx, req)
	if err != nil {
		t.Fatalf("%v of %v: %v", req.Op, req.Ino, err)
	}
	return rep
}

// readOp reads all of a file of size bytes with OpRead.
func readOp(ctx context.Context, t *testing.T, c *client.Client, ino ids.Ino, size uint64) []byte {
	t.Helper()
	var out []byte
	for off := uint64(0); off < size; {
		rep := call(ctx, t, c, &wire.Request{Op: wire.OpRead, Ino: ino, Off: off, Size: size - off})
		if len(rep.Data) == 0 {
			t.Fatalf("read of %v at %d: no data before its size %d", ino, off, size)
		}
		out = append(out, rep.Data...)
		off += uint64(len(rep.Data))
	}
	return out
}

// readPieces reads all of a block-mapped file through OpLookupBlocks and
// verified reads of the block store, as a mount does.
func readPieces(ctx context.Context, t *testing.T, s *Server, c *client.Client, ino ids.Ino) ([]byte, *wire.Attr) {
	t.Helper()
	var out []byte
	var attr *wire.Attr
	for off := uint64(0); ; {
		ps, rep, err := lookupBlocks(ctx, c, ino, off, 1<<30)
		if err != nil {
			t.Fatalf("lookup of %v at %d: %v", ino, off, err)
		}
		attr = rep.Attr
		if len(ps) == 0 {
			return out, attr
		}
		for _, p := range ps {
			buf := make([]byte, p.Len)
			if !p.Hole {
				if _, err := blocks.ReadVerified(ctx, s.blocks.store, p.Block, int64(p.Size), p.Sums, buf, int64(p.BlockOff)); err != nil {
					t.Fatalf("block %v: %v", p.Block, err)
				}
			}
			out = append(out, buf...)
			off = p.Off + p.Len
		}
	}
}

// isMapped reports whether ino's data is in blocks (else in pages).
func isMapped(t *testing.T, s *Server, ino ids.Ino) bool {
	t.Helper()
	_, err := s.store.Read(ino, 0, 1)
	if err != nil && !errors.Is(err, store.ErrMapped) {
		t.Fatal(err)
	}
	return err != nil
}

// storeBlocks counts the blocks of ino in the block store.
func storeBlocks(t *testing.T, s *Server, ino ids.Ino) int {
	t.Helper()
	n := 0
	err := s.blocks.store.List(context.Background(), ino, func(blocks.ID, int64, time.Time) error {
		n++
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestWriteConvertsPaged: a file written in pages while at most
// wire.InlineMax, whose lookups answer its bytes, becomes block-mapped
// when a write takes it past InlineMax: its pages go into one block, the
// write into another, and it reads back the same through pieces and
// verified block reads, through OpRead, and from another client.
func TestWriteConvertsPaged(t *testing.T) {
	s := startBlockTestServer(t)
	ctx := testContext(t)
	a, b := connect(t, s), connect(t, s)
	f := mustCreate(ctx, t, a, "f")
	want := randData(wire.InlineMax+5000, 1)
	small := want[:wire.InlineMax-1000]
	// a hole of a page inside the paged data
	clear(small[8192:12288])
	call(ctx, t, a, writeReq(f.Ino, 0, small[:8192]))
	call(ctx, t, a, writeReq(f.Ino, 12288, small[12288:]))
	if isMapped(t, s, f.Ino) {
		t.Fatal("a file of less than InlineMax is block-mapped")
	}
	if data, rep := lookupInline(ctx, t, b, f.Ino, 0, 1<<20); !bytes.Equal(data, small) || rep.Attr.Size != uint64(len(small)) {
		t.Fatalf("inline lookup: %d bytes, size %d", len(data), rep.Attr.Size)
	}
	rep := call(ctx, t, a, writeReq(f.Ino, uint64(len(small)), want[len(small):]))
	if rep.Attr == nil || rep.Attr.Size != uint64(len(want)) {
		t.Fatalf("write past InlineMax: attributes %+v", rep.Attr)
	}
	if !isMapped(t, s, f.Ino) {
		t.Fatal("a file past InlineMax is still in pages")
	}
	m, err := s.store.BlockMap(f.Ino)
	if err != nil || m.Blocks() != 2 {
		t.Fatalf("block map %v, %v; want 2 blocks", m, err)
	}
	if got, attr := readPieces(ctx, t, s, b, f.Ino); !bytes.Equal(got, want) || attr.Version != rep.Attr.Version {
		t.Fatalf("read through pieces: %d bytes (want %d), equal %v; version %d, want %d",
			len(got), len(want), bytes.Equal(got, want), attr.Version, rep.Attr.Version)
	}
	if got := readOp(ctx, t, a, f.Ino, uint64(len(want))); !bytes.Equal(got, want) {
		t.Fatal("OpRead of the block-mapped file differs")
	}
	// st_blocks counts the stored bytes: not the page of zeros
	if a, err := s.store.GetAttr(f.Ino); err != nil || a.Blocks != uint64(len(want)-4096+511)/512 {
		t.Fatalf("st_blocks %d, want %d (%v)", a.Blocks, (len(want)-4096+511)/512, err)
	}
}

// TestWriteBlocks: writes to a block-mapped file through OpWrite, each a
// block the server puts: vectored, appended, refused when stale
// (WriteIfVersion), carrying attribute changes, killing file
// capabilities; a resent write is answered once; OpRead and the pieces
// read the result.
func TestWriteBlocks(t *testing.T) {
	s := startBlockTestServer(t)
	ctx := testContext(t)
	a, b := connect(t, s), connect(t, s)
	f := mustCreate(ctx, t, a, "f")
	want := randData(wire.InlineMax+1, 2)
	first := call(ctx, t, a, writeReq(f.Ino, 0, want)) // straight to a block: no page
	if !isMapped(t, s, f.Ino) || storeBlocks(t, s, f.Ino) != 1 {
		t.Fatalf("first write: mapped %v, %d blocks", isMapped(t, s, f.Ino), storeBlocks(t, s, f.Ino))
	}
	check := func(what string) {
		t.Helper()
		if got := readOp(ctx, t, a, f.Ino, uint64(len(want))); !bytes.Equal(got, want) {
			t.Fatalf("%s: OpRead differs", what)
		}
		if got, _ := readPieces(ctx, t, s, b, f.Ino); !bytes.Equal(got, want) {
			t.Fatalf("%s: pieces differ", what)
		}
	}
	check("first write")

	// vectored: two spans, their bytes one after another in Data
	v := &wire.Request{Op: wire.OpWrite, Ino: f.Ino, Data: []byte("helloworld"),
		Spans: []wire.Span{{Off: 10, Len: 5}, {Off: 40000, Len: 5}}}
	call(ctx, t, a, v)
	copy(want[10:], "hello")
	copy(want[40000:], "world")
	check("vectored write")

	// appended, with a mode change and an mtime
	mtime := time.Date(2020, 1, 2, 3, 4, 5, 0, time.UTC).UnixNano()
	app := &wire.Request{Op: wire.OpWrite, Ino: f.Ino, Flags: wire.WriteAppend, Data: []byte("tail"),
		Valid: wire.SetMode | wire.SetMtime, Mode: 0o600, Mtime: mtime}
	rep := call(ctx, t, a, app)
	want = append(want, "tail"...)
	if at := rep.Attr; at.Size != uint64(len(want)) || at.Mode&0o7777 != 0o600 || at.Mtime != mtime {
		t.Fatalf("append with attributes: %+v", at)
	}
	check("append")

	// a buffered write made against an older version is refused
	stale := &wire.Request{Op: wire.OpWrite, Ino: f.Ino, Off: 0, Data: []byte("stale"), Flags: wire.WriteIfVersion, Version: first.Attr.Version}
	if _, err := a.Call(ctx, stale); !errors.Is(err, wire.Err(wire.CodeStale)) {
		t.Fatalf("stale write: %v, want CodeStale", err)
	}
	cur, err := s.store.GetAttr(f.Ino)
	if err != nil {
		t.Fatal(err)
	}
	ok := &wire.Request{Op: wire.OpWrite, Ino: f.Ino, Off: 0, Data: []byte("fresh"), Flags: wire.WriteIfVersion, Version: cur.Version}
	call(ctx, t, a, ok)
	copy(want, "fresh")
	check("write at its version")

	// file capabilities go with a write, as a local file system drops them
	if err := s.store.SetXattr(f.Ino, "security.capability", []byte{1, 2, 3}, 0, time.Now().UnixNano()); err != nil {
		t.Fatal(err)
	}
	once := writeReq(f.Ino, 100, []byte("once"))
	first = call(ctx, t, a, once)
	copy(want[100:], "once")
	if _, err := s.store.GetXattr(f.Ino, "security.capability"); !errors.Is(err, wire.Err(wire.CodeNoData)) {
		t.Fatalf("capability after a write: %v, want gone", err)
	}
	// the same write again (its reply lost): answered, not made again
	blocksBefore, replayed := storeBlocks(t, s, f.Ino), s.counters.Replayed.Load()
	again := call(ctx, t, a, once)
	if again.Attr.Version != first.Attr.Version || s.counters.Replayed.Load() != replayed+1 || storeBlocks(t, s, f.Ino) != blocksBefore {
		t.Fatalf("resent write: version %d (first %d), replayed %d -> %d, blocks %d -> %d", again.Attr.Version, first.Attr.Version,
			replayed, s.counters.Replayed.Load(), blocksBefore, storeBlocks(t, s, f.Ino))
	}
	check("resent write")
	// a small write to a block-mapped file is a block too: it never
	// goes back to pages
	if !isMapped(t, s, f.Ino) {
		t.Fatal("no longer block-mapped")
	}
}

// TestCommitConvertsPaged: a block commit to a file whose data is in pages
// moves them to a block first; the file then holds both.
func TestCommitConvertsPaged(t *testing.T) {
	s := startBlockTestServer(t)
	ctx := testContext(t)
	a, b := connect(t, s), connect(t, s)
	f := mustCreate(ctx, t, a, "f")
	want := randData(20000, 3)
	call(ctx, t, a, writeReq(f.Ino, 0, want))
	takeX(ctx, t, a, f.Ino)
	more := randData(100000, 4)
	blk := putBlock(t, f.Ino, more, s)
	rep := call(ctx, t, a, commitReq(f.Ino, 10000+blk.Size, []blockmap.Block{blk}, whole(10000, blk)))
	want = append(want[:10000], more...)
	if rep.Attr.Size != uint64(len(want)) || !isMapped(t, s, f.Ino) {
		t.Fatalf("commit: size %d, mapped %v", rep.Attr.Size, isMapped(t, s, f.Ino))
	}
	if got, _ := readPieces(ctx, t, s, b, f.Ino); !bytes.Equal(got, want) {
		t.Fatal("pieces differ after a commit to a paged file")
	}
}

// TestReadBlockUnreadable: OpRead of a block-mapped file whose block is
// corrupt or missing answers CodeIO, never wrong bytes.
func TestReadBlockUnreadable(t *testing.T) {
	s := startBlockTestServer(t)
	ctx := testContext(t)
	a := connect(t, s)
	f := mustCreate(ctx, t, a, "f")
	data := randData(wire.InlineMax+10, 5)
	call(ctx, t, a, writeReq(f.Ino, 0, data))
	ps, _, err := lookupBlocks(ctx, a, f.Ino, 0, 1<<20)
	if err != nil || len(ps) != 1 {
		t.Fatalf("pieces %+v, %v", ps, err)
	}
	read := &wire.Request{Op: wire.OpRead, Ino: f.Ino, Off: 0, Size: 1 << 20}
	// other bytes under the block's name
	if err := s.blocks.store.Put(ctx, ps[0].Block, randData(len(data), 6)); err != nil {
		t.Fatal(err)
	}
	if rep, err := a.Call(ctx, read); !errors.Is(err, wire.Err(wire.CodeIO)) {
		t.Fatalf("read of a corrupt block: %v (%d bytes)", err, len(rep.Data))
	}
	if err := s.blocks.store.Delete(ctx, ps[0].Block); err != nil {
		t.Fatal(err)
	}
	if rep, err := a.Call(ctx, read); !errors.Is(err, wire.Err(wire.CodeIO)) {
		t.Fatalf("read of a missing block: %v (%d bytes)", err, len(rep.Data))
	}
}

// TestWriteBlockNoSpace: with the block store full, a write that needs a
// block, whether to a block-mapped file or one that would take a paged
// file past InlineMax, answers CodeNoSpace and leaves the file as it was
// (the paged file is not converted, though its pages would fit); once
// space is freed the same write goes through.
func TestWriteBlockNoSpace(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting a tmpfs needs root")
	}
	dir := filepath.Join(t.TempDir(), "blocks")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=2m,mode=0700"); err != nil {
		t.Skipf("mount tmpfs: %v", err)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(dir, 0); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
	s := startTestServerWith(t, func(cfg *Config) {
		cfg.Blocks = "file:" + dir
		cfg.BlocksListen = "127.0.0.1:0"
	})
	ctx := testContext(t)
	a := connect(t, s)
	mk := func(name string, data []byte) ids.Ino {
		f, err := a.Create(ctx, ids.RootIno, name, 0o100644, 0, 0, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		call(ctx, t, a, writeReq(f.Ino, 0, data))
		return f.Ino
	}
	mappedData, pagedData := randData(wire.InlineMax+100, 7), randData(30000, 8)
	mapped, paged := mk("mapped", mappedData), mk("paged", pagedData)
	// fill the store but for 40 KiB: room for the paged file's 30000
	// bytes, not for a write of 50000
	reserve := blocks.NewID(999)
	if err := s.blocks.store.Put(ctx, reserve, make([]byte, 40<<10)); err != nil {
		t.Fatal(err)
	}
	var filler []blocks.ID
	for size := 1 << 20; size >= 512; size /= 2 {
		for {
			id := blocks.NewID(999)
			if err := s.blocks.store.Put(ctx, id, make([]byte, size)); err != nil {
				if !errors.Is(err, syscall.ENOSPC) {
					t.Fatal(err)
				}
				break
			}
			filler = append(filler, id)
		}
	}
	if err := s.blocks.store.Delete(ctx, reserve); err != nil {
		t.Fatal(err)
	}
	writes := []struct {
		ino  ids.Ino
		req  func() *wire.Request
		data []byte
	}{
		{mapped, func() *wire.Request { return writeReq(mapped, 1000, randData(50000, 9)) }, mappedData},
		{paged, func() *wire.Request { return writeReq(paged, 30000, randData(50000, 10)) }, pagedData},
	}
	for _, w := range writes {
		before, err := s.store.GetAttr(w.ino)
		if err != nil {
			t.Fatal(err)
		}
		wasMapped := isMapped(t, s, w.ino)
		if _, err := a.Call(ctx, w.req()); !errors.Is(err, wire.Err(wire.CodeNoSpace)) {
			t.Fatalf("write to %v with the block store full: %v, want CodeNoSpace", w.ino, err)
		}
		after, err := s.store.GetAttr(w.ino)
		if err != nil {
			t.Fatal(err)
		}
		if after.Version != before.Version || after.Size != before.Size || isMapped(t, s, w.ino) != wasMapped {
			t.Fatalf("%v changed by a write that found no space: %+v -> %+v", w.ino, before, after)
		}
		if got := readOp(ctx, t, a, w.ino, after.Size); !bytes.Equal(got, w.data) {
			t.Fatalf("%v: data changed by a write that found no space", w.ino)
		}
	}
	for _, id := range filler {
		if err := s.blocks.store.Delete(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	for _, w := range writes {
		req := w.req()
		call(ctx, t, a, req)
		want := append(w.data[:req.Off:req.Off], req.Data...)
		want = append(want, w.data[min(len(w.data), len(want)):]...)
		if got := readOp(ctx, t, a, w.ino, uint64(len(want))); !bytes.Equal(got, want) || !isMapped(t, s, w.ino) {
			t.Fatalf("%v: write after space was freed: mapped %v", w.ino, isMapped(t, s, w.ino))
		}
	}
}

// TestStartConvertsBigPagedFiles: a server started with a block store on a
// data directory whose files all keep their data in pages moves the
// files over wire.InlineMax to blocks before it serves, and leaves the
// smaller ones, and those with no data, in pages.
func TestStartConvertsBigPagedFiles(t *testing.T) {
	dir := t.TempDir()
	// as a server without a block store wrote them
	st, err := store.Open(dir, store.Options{ServerID: DefaultConfig().ServerID})
	if err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{"big": randData(wire.InlineMax+1, 11), "small": randData(wire.InlineMax, 12), "empty": nil}
	inos := map[string]ids.Ino{}
	for name, data := range files {
		f, err := st.Create(ids.RootIno, name, 0o100644, 0, 0, 0, 1)
		if err != nil {
			t.Fatal(err)
		}
		inos[name] = f.Ino
		if _, err := st.Write(f.Ino, 0, data, 2); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	ctx := testContext(t)
	s := startTestServerWith(t, func(cfg *Config) {
		cfg.Dir = dir
		cfg.Blocks = "file:" + filepath.Join(dir, "blocks")
		cfg.BlocksListen = "127.0.0.1:0"
	})
	a := connect(t, s)
	for name, data := range files {
		ino := inos[name]
		if mapped := isMapped(t, s, ino); mapped != (name == "big") {
			t.Errorf("%s: block-mapped %v after the start", name, mapped)
		}
		if got := readOp(ctx, t, a, ino, uint64(len(data))); !bytes.Equal(got, data) {
			t.Errorf("%s: data differs after the start", name)
		}
	}
	if _, err := s.store.BlockMap(inos["empty"]); err != nil {
		t.Errorf("a file with no data: %v", err)
	}
}

// TestClusterWriteBlocks: on a cluster sharing one block directory, a
// file written past InlineMax through server 1 reads back through server
// 2, which takes it over, writes to it as blocks and converts it no
// more; server 1 reads that back after taking it again.
func TestClusterWriteBlocks(t *testing.T) {
	shared := t.TempDir()
	tc := newTestCluster(t, 3, func(id ids.ServerID, cfg *Config) {
		cfg.Blocks = "file:" + shared
		cfg.BlocksListen = "127.0.0.1:0"
	})
	ctx := testContext(t)
	c1, c2 := tc.connect(1), tc.connect(2)
	f := mustCreate(ctx, t, c1, "f")
	want := randData(1000, 13)
	call(ctx, t, c1, writeReq(f.Ino, 0, want)) // in pages
	more := randData(wire.InlineMax, 14)
	call(ctx, t, c1, writeReq(f.Ino, uint64(len(want)), more)) // converted
	want = append(want, more...)
	if got := readOp(ctx, t, c2, f.Ino, uint64(len(want))); !bytes.Equal(got, want) {
		t.Fatal("read through server 2 differs")
	}
	if _, err := tc.srv[2].owner.OwnerEpoch(f.Ino); err != nil {
		t.Fatalf("server 2 does not own the file it read: %v", err)
	}
	call(ctx, t, c2, writeReq(f.Ino, 500, []byte("through two")))
	copy(want[500:], "through two")
	if got, _ := readPieces(ctx, t, tc.srv[1], c1, f.Ino); !bytes.Equal(got, want) {
		t.Fatal("pieces through server 1 differ")
	}
	if got := readOp(ctx, t, c1, f.Ino, uint64(len(want))); !bytes.Equal(got, want) {
		t.Fatal("read through server 1 differs")
	}
}
