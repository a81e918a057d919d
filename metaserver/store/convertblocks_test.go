package store

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/leasefs/leasefs/blocks"
	"github.com/leasefs/leasefs/blocks/blockmap"
	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/wire"
)

// pagedFile is a file of the conversion tests and the bytes it holds.
type pagedFile struct {
	ino    ids.Ino
	data   []byte   // written at each of at (0 if none); zeros elsewhere
	at     []uint64 //
	size   uint64
	blocks int // blocks the conversion makes of it
}

// converts reports whether ConvertPagesToBlocks moves f's data to blocks:
// it has data and is larger than wire.InlineMax.
func (f *pagedFile) converts() bool { return f.data != nil && f.size > wire.InlineMax }

// pagedFiles writes, as pages, files of 0, 1 and 4 KiB bytes, 5 MiB, one
// with data at 0 and at 1 GiB only, one with a page of zeros between two
// of data, one sized by truncate with no page, one with 3 links, and
// big, if set, one of more pages than two transactions delete.
func pagedFiles(t *testing.T, s *Store, big bool) map[string]*pagedFile {
	t.Helper()
	r := rand.New(rand.NewPCG(3, 4))
	random := func(n int) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(r.Uint32() | 1) // no page of zeros by chance
		}
		return b
	}
	files := map[string]*pagedFile{}
	create := func(name string) *pagedFile {
		a := must[Attr](t)(s.Create(ids.RootIno, name, reg|0o644, 0, 0, 0, 1))
		f := &pagedFile{ino: a.Ino}
		files[name] = f
		return f
	}
	write := func(f *pagedFile, off uint64, data []byte) {
		for i := 0; i < len(data); i += 1 << 20 {
			must[Attr](t)(s.Write(f.ino, off+uint64(i), data[i:min(i+1<<20, len(data))], 2))
		}
		f.size = max(f.size, off+uint64(len(data)))
	}
	create("empty")
	for name, n := range map[string]int{"one": 1, "page": PageSize, "5MiB": 5 << 20} {
		f := create(name)
		f.data = random(n)
		write(f, 0, f.data)
		f.blocks = (n + blocks.MaxBlock - 1) / blocks.MaxBlock
	}
	f := create("sparse")
	f.data = random(PageSize)
	write(f, 0, f.data)
	write(f, 1<<30, f.data)
	f.at = []uint64{0, 1 << 30}
	f.blocks = 2
	f = create("zeropage")
	f.data = slices3(random(wire.InlineMax), make([]byte, PageSize), random(100))
	write(f, 0, f.data)
	f.blocks = 1
	f = create("truncated")
	f.size = 3 << 20
	must[Attr](t)(s.SetAttr(f.ino, SetAttrIn{Valid: wire.SetSize, Size: f.size}, 2))
	f = create("linked")
	f.data = random(10 << 10)
	write(f, 0, f.data)
	f.blocks = 1
	must[Attr](t)(s.Link(f.ino, ids.RootIno, "linked2", 3))
	must[Attr](t)(s.Link(f.ino, ids.RootIno, "linked3", 3))
	if big {
		f = create("big")
		f.data = random((2*deleteBatch + 1) * PageSize)
		write(f, 0, f.data)
		f.blocks = 9
	}
	return files
}

func slices3(a, b, c []byte) []byte { return append(append(append([]byte(nil), a...), b...), c...) }

// contents returns what f holds at off, n bytes (zeros past its data).
func (f *pagedFile) contents(off, n uint64) []byte {
	out := make([]byte, n)
	at := f.at
	if at == nil {
		at = []uint64{0}
	}
	for _, base := range at {
		lo, hi := max(base, off), min(base+uint64(len(f.data)), off+n)
		if lo < hi {
			copy(out[lo-off:hi-off], f.data[lo-base:])
		}
	}
	return out
}

// readMapped reads f through LookupBlocks and the block store, verifying
// each block's sums, in pieces of at most 8 MiB around its data.
func readMapped(t *testing.T, s *Store, bs blocks.Store, f *pagedFile) {
	t.Helper()
	for _, off := range []uint64{0, 1 << 30} {
		if off >= max(f.size, 1) {
			continue
		}
		n := min(f.size-off, 8<<20)
		ask := n
		if off+n == f.size {
			ask += 10 // past the end: clipped
		}
		ps, a, err := s.LookupBlocks(f.ino, off, ask)
		if err != nil {
			t.Fatalf("LookupBlocks of %v: %v", f.ino, err)
		}
		if a.Size != f.size {
			t.Fatalf("%v: size %d, want %d", f.ino, a.Size, f.size)
		}
		got := make([]byte, 0, n)
		for _, p := range ps {
			buf := make([]byte, p.Len)
			if !p.Hole {
				if _, err := blocks.ReadVerified(context.Background(), bs, p.Block, int64(p.Size), p.Sums, buf, int64(p.BlockOff)); err != nil {
					t.Fatalf("%v: reading %v: %v", f.ino, p.Block, err)
				}
			}
			got = append(got, buf...)
		}
		if !bytes.Equal(got, f.contents(off, n)) {
			t.Fatalf("%v: %d bytes at %d differ through the block map", f.ino, n, off)
		}
	}
}

// readEither reads f as a reader would during a conversion: through pages
// if Read takes it, else through its block map; never half of each.
func readEither(t *testing.T, s *Store, bs blocks.Store, f *pagedFile) {
	t.Helper()
	for _, off := range []uint64{0, 1 << 30} {
		if off >= f.size {
			continue
		}
		n := min(f.size-off, 8<<20)
		got, err := s.Read(f.ino, off, int(n))
		if errors.Is(err, ErrMapped) {
			readMapped(t, s, bs, f)
			if _, err := s.BlockMap(f.ino); err != nil {
				t.Fatalf("%v: Read says block-mapped, BlockMap says %v", f.ino, err)
			}
			return
		}
		if err != nil {
			t.Fatalf("Read of %v: %v", f.ino, err)
		}
		if !bytes.Equal(got, f.contents(off, n)) {
			t.Fatalf("%v: %d bytes at %d differ through pages", f.ino, n, off)
		}
		if _, _, err := s.LookupBlocks(f.ino, 0, 1); !errors.Is(err, ErrNotMapped) {
			t.Fatalf("%v: Read reads pages, LookupBlocks says %v", f.ino, err)
		}
	}
}

func storeFormatRecord(t *testing.T, s *Store) byte {
	t.Helper()
	return must[byte](t)(s.format())
}

// referenced returns the blocks the store's records reference, per inode.
func referenced(t *testing.T, s *Store) map[blocks.ID]bool {
	t.Helper()
	refs := map[blocks.ID]bool{}
	err := s.view(func(tx *Tx) error {
		return tx.scan([]byte{RecBlock}, nil, false, false, func(k, _ []byte) (bool, error) {
			refs[blocks.ID{Ino: KeyIno(k), Unique: blockmap.Unique(k[9:])}] = true
			return true, nil
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	return refs
}

// checkConverted checks that every file over wire.InlineMax reads back
// byte-identical through its block map, has no page and as many blocks as
// its data windows, that the others read the same through their pages,
// and that the block store holds every referenced block (orphans apart).
func checkConverted(t *testing.T, s *Store, bs blocks.Store, files map[string]*pagedFile) (orphans int) {
	t.Helper()
	for name, f := range files {
		if !f.converts() {
			readEither(t, s, bs, f)
			if _, err := s.BlockMap(f.ino); err == nil && f.data != nil {
				t.Fatalf("%s: block-mapped, %d bytes", name, f.size)
			}
			if n := countRecords(t, s, RecBlock, f.ino); n != 0 {
				t.Fatalf("%s: %d blocks, want none", name, n)
			}
			continue
		}
		readMapped(t, s, bs, f)
		if _, err := s.Read(f.ino, 0, 1); !errors.Is(err, ErrMapped) {
			t.Fatalf("%s: Read after the conversion: %v", name, err)
		}
		if n := countRecords(t, s, RecPage, f.ino); n != 0 {
			t.Fatalf("%s: %d pages left", name, n)
		}
		if n := countRecords(t, s, RecBlock, f.ino); n != f.blocks {
			t.Fatalf("%s: %d blocks, want %d", name, n, f.blocks)
		}
	}
	refs := referenced(t, s)
	err := bs.List(context.Background(), blocks.AllInodes, func(id blocks.ID, _ int64, _ time.Time) error {
		if refs[id] {
			delete(refs, id)
		} else {
			orphans++
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(refs) > 0 {
		t.Fatalf("%d referenced blocks missing from the block store", len(refs))
	}
	if f := storeFormatRecord(t, s); f != storeFormat {
		t.Fatalf("format %d after the conversion, want %d", f, storeFormat)
	}
	return orphans
}

func newFileBlocks(t *testing.T) *blocks.FileStore {
	t.Helper()
	return must[*blocks.FileStore](t)(blocks.OpenFileStore(t.TempDir()))
}

// pagedBytes is what pagedFiles stores in blocks, big apart: the 5 MiB
// file's, the sparse file's two pages, the zero page's block (the zero
// page inside it); not the files of at most wire.InlineMax (one, page,
// linked) nor those with no data.
const pagedBytes = 5<<20 + 2*PageSize + wire.InlineMax + PageSize + 100

// TestConvertPagesToBlocks: every file over wire.InlineMax reads back
// byte-identical through its block map and the block store, holes stay
// holes (the sparse file has no block for them), the smaller files and
// those with no data stay in pages, and the format becomes 4; a second
// run converts nothing.
func TestConvertPagesToBlocks(t *testing.T) {
	dir := t.TempDir()
	s := openTestStore(t, dir, Options{})
	files := pagedFiles(t, s, false)
	if f := storeFormatRecord(t, s); f != pagesFormat {
		t.Fatalf("format %d before the conversion, want %d", f, pagesFormat)
	}
	bs := newFileBlocks(t)
	nfiles, nbytes, err := s.ConvertPagesToBlocks(context.Background(), bs, quiet)
	if err != nil {
		t.Fatal(err)
	}
	// the files with a page and over InlineMax: 5MiB, sparse, zeropage
	if nfiles != 3 || nbytes != pagedBytes {
		t.Fatalf("converted %d files, %d bytes; want 3, %d", nfiles, nbytes, pagedBytes)
	}
	if n := checkConverted(t, s, bs, files); n != 0 {
		t.Fatalf("%d orphan blocks after a clean conversion", n)
	}
	if a := must[Attr](t)(s.GetAttr(files["sparse"].ino)); a.Blocks != 2*PageSize/512 {
		t.Fatalf("sparse file: st_blocks %d, want %d", a.Blocks, 2*PageSize/512)
	}
	if a := must[Attr](t)(s.GetAttr(files["linked"].ino)); a.Nlink != 3 {
		t.Fatalf("linked file: nlink %d", a.Nlink)
	}
	if a := must[Attr](t)(s.GetAttr(files["truncated"].ino)); a.Size != 3<<20 {
		t.Fatalf("truncated file: size %d", a.Size)
	}
	// the zero page is a hole: two extents into one block
	m := must[*blockmap.Map](t)(s.BlockMap(files["zeropage"].ino))
	if e := m.Extents(); len(e) != 2 || e[0].Len != wire.InlineMax || e[1].Off != wire.InlineMax+PageSize {
		t.Fatalf("zero page file's extents %+v", e)
	}
	refs := referenced(t, s)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openTestStore(t, dir, Options{})
	defer s.Close()
	nfiles, nbytes, err = s.ConvertPagesToBlocks(context.Background(), bs, quiet)
	if err != nil || nfiles != 0 || nbytes != 0 {
		t.Fatalf("second conversion: %d files, %d bytes, %v", nfiles, nbytes, err)
	}
	checkConverted(t, s, bs, files)
	if again := referenced(t, s); len(again) != len(refs) {
		t.Fatalf("%d blocks referenced after a second run, %d before", len(again), len(refs))
	}
}

// TestConvertPagesToBlocksResume stops the conversion after every one of
// its committed steps in turn, closing and reopening the store each time:
// at every stop each file reads whole, either as pages or as blocks, and
// the end is what one run makes, each file's blocks referenced once, and
// a file converted before a stop is not converted again. A run cancelled
// between a Put and its commit leaves an orphan block, nothing else.
func TestConvertPagesToBlocksResume(t *testing.T) {
	dir := t.TempDir()
	s := openTestStore(t, dir, Options{})
	files := pagedFiles(t, s, true)
	bs := newFileBlocks(t)
	ctx := context.Background()

	// cancelled after its first Put, before the commit
	cctx, cancel := context.WithCancel(ctx)
	if _, _, err := s.ConvertPagesToBlocks(cctx, cancelAfterPut{bs, cancel}, quiet); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled conversion: %v", err)
	}
	if n := len(referenced(t, s)); n != 0 {
		t.Fatalf("%d blocks referenced after a cancel before the first commit", n)
	}

	stop := errors.New("stop")
	steps, totalFiles, totalBytes := 0, 0, 0
	var steps0 []string
	done := map[ids.Ino][]blocks.ID{} // files switched, and their blocks then
	for {
		steps++
		if steps > 100 {
			t.Fatal("the conversion does not end")
		}
		s.convertStep = func(ino ids.Ino, step string) error {
			steps0 = append(steps0, step)
			return stop
		}
		nfiles, nbytes, err := s.ConvertPagesToBlocks(ctx, bs, quiet)
		totalFiles += nfiles
		totalBytes += nbytes
		if err == nil {
			break
		}
		if !errors.Is(err, stop) {
			t.Fatal(err)
		}
		if f := storeFormatRecord(t, s); f != pagesFormat {
			t.Fatalf("format %d before the end, want %d", f, pagesFormat)
		}
		for _, f := range files {
			readEither(t, s, bs, f)
		}
		// a switched file keeps its blocks: it is never converted again
		for ino, ids := range done {
			if got := blocksOf(t, s, ino); !equalIDs(got, ids) {
				t.Fatalf("%v: blocks changed after its switch: %v, were %v", ino, got, ids)
			}
		}
		for _, f := range files {
			if _, err := s.BlockMap(f.ino); err == nil && done[f.ino] == nil && countRecords(t, s, RecPage, f.ino) == 0 {
				done[f.ino] = blocksOf(t, s, f.ino)
			}
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		s = openTestStore(t, dir, Options{})
	}
	defer s.Close()
	for _, want := range []string{"stage", "switch", "pages"} {
		if !contains(steps0, want) {
			t.Fatalf("no stop after a %q step: %v", want, steps0)
		}
	}
	if n := checkConverted(t, s, bs, files); n != 1 {
		t.Fatalf("%d orphan blocks, want the 1 put before the cancel", n)
	}
	// each file and each byte converted once over all the runs
	if want := pagedBytes + (2*deleteBatch+1)*PageSize; totalFiles != 4 || totalBytes != want {
		t.Fatalf("%d files, %d bytes converted in all, want 4, %d", totalFiles, totalBytes, want)
	}
}

// cancelAfterPut cancels the conversion's context once a Put is durable.
type cancelAfterPut struct {
	blocks.Store
	cancel func()
}

func (c cancelAfterPut) Put(ctx context.Context, id blocks.ID, data []byte) error {
	err := c.Store.Put(ctx, id, data)
	c.cancel()
	return err
}

func blocksOf(t *testing.T, s *Store, ino ids.Ino) []blocks.ID {
	t.Helper()
	var out []blocks.ID
	for id := range referenced(t, s) {
		if id.Ino == ino {
			out = append(out, id)
		}
	}
	return out
}

func equalIDs(a, b []blocks.ID) bool {
	if len(a) != len(b) {
		return false
	}
	set := map[blocks.ID]bool{}
	for _, id := range a {
		set[id] = true
	}
	for _, id := range b {
		if !set[id] {
			return false
		}
	}
	return true
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// TestConvertFile: a paged file converted inside a request becomes one
// block per window of data in one switch, its pages gone, its Version
// and bytes unchanged; a block-mapped file and one with no page are left
// as they are.
func TestConvertFile(t *testing.T) {
	s := openTestStore(t, t.TempDir(), Options{})
	defer s.Close()
	files := pagedFiles(t, s, false)
	bs := newFileBlocks(t)
	ctx := context.Background()
	for _, name := range []string{"one", "zeropage", "5MiB"} {
		f := files[name]
		before := must[Attr](t)(s.GetAttr(f.ino))
		if ok, err := s.ConvertFile(ctx, bs, f.ino); !ok || err != nil {
			t.Fatalf("%s: ConvertFile = %v, %v", name, ok, err)
		}
		readMapped(t, s, bs, f)
		if n := countRecords(t, s, RecPage, f.ino); n != 0 {
			t.Fatalf("%s: %d pages left", name, n)
		}
		if n := countRecords(t, s, RecBlock, f.ino); n != f.blocks {
			t.Fatalf("%s: %d blocks, want %d", name, n, f.blocks)
		}
		if a := must[Attr](t)(s.GetAttr(f.ino)); a.Version != before.Version || a.Size != before.Size {
			t.Fatalf("%s: attributes %+v, were %+v", name, a, before)
		}
		if ok, err := s.ConvertFile(ctx, bs, f.ino); ok || err != nil {
			t.Fatalf("%s: ConvertFile of a block-mapped file = %v, %v", name, ok, err)
		}
	}
	for _, name := range []string{"empty", "truncated"} {
		if ok, err := s.ConvertFile(ctx, bs, files[name].ino); ok || err != nil {
			t.Fatalf("%s: ConvertFile of a file with no data = %v, %v", name, ok, err)
		}
		if _, err := s.Read(files[name].ino, 0, 1); err != nil {
			t.Fatalf("%s: no longer paged: %v", name, err)
		}
	}
}
