package metaserver

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/leasefs/leasefs/blocks"
	"github.com/leasefs/leasefs/blocks/blockmap"
	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/metaserver/store"
)

const gcTestDelay = 10 * time.Second

// gcEnv is a real badger store and a real FileStore, both in temporary
// directories.
type gcEnv struct {
	t    testing.TB
	meta *store.Store
	blks *blocks.FileStore
	dir  string // the block store's
}

func newGCEnv(t testing.TB) *gcEnv {
	t.Helper()
	meta, err := store.Open(t.TempDir(), store.Options{ServerID: 1, GarbageDelay: gcTestDelay,
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { meta.Close() })
	dir := t.TempDir()
	blks, err := blocks.OpenFileStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	return &gcEnv{t: t, meta: meta, blks: blks, dir: dir}
}

func (e *gcEnv) collector(cfg BlockGCConfig) *BlockGC {
	cfg.Logger = slog.New(slog.DiscardHandler)
	return NewBlockGC(e.meta, e.blks, cfg)
}

func (e *gcEnv) create(name string) ids.Ino {
	e.t.Helper()
	a, err := e.meta.Create(ids.RootIno, name, syscall.S_IFREG|0o644, 0, 0, 0, time.Now().UnixNano())
	if err != nil {
		e.t.Fatal(err)
	}
	return a.Ino
}

// put stores a block of size bytes of ino in the block store.
func (e *gcEnv) put(ino ids.Ino, size int) (blocks.ID, blockmap.Block) {
	e.t.Helper()
	data := make([]byte, size)
	for i := range data {
		data[i] = byte(i)
	}
	id := blocks.NewID(ino)
	if err := e.blks.Put(context.Background(), id, data); err != nil {
		e.t.Fatal(err)
	}
	return id, blockmap.Block{Unique: id.Unique, Size: uint64(size), Sums: blocks.Sum(data)}
}

// write puts a block and commits it as ino's data at off, at now.
func (e *gcEnv) write(ino ids.Ino, off uint64, size int, now time.Time) blocks.ID {
	e.t.Helper()
	id, b := e.put(ino, size)
	ext := []blockmap.Extent{{Off: off, Len: b.Size, Block: b.Unique}}
	if _, err := e.meta.CommitBlocks(ino, []blockmap.Block{b}, ext, off+b.Size, now.UnixNano()); err != nil {
		e.t.Fatal(err)
	}
	return id
}

func (e *gcEnv) exists(id blocks.ID) bool {
	e.t.Helper()
	_, err := e.blks.ReadAt(context.Background(), id, make([]byte, 1), 0)
	if errors.Is(err, blocks.ErrNotFound) {
		return false
	}
	if err != nil {
		e.t.Fatal(err)
	}
	return true
}

// garbage is every garbage record, due or not.
func (e *gcEnv) garbage() []store.Garbage {
	e.t.Helper()
	gs, err := e.meta.DueGarbageAfter(math.MaxInt64, nil, 0, nil)
	if err != nil {
		e.t.Fatal(err)
	}
	return gs
}

// age sets a block file's mtime, as if it had been put at mtime.
func (e *gcEnv) age(id blocks.ID, mtime time.Time) {
	e.t.Helper()
	files, err := filepath.Glob(filepath.Join(e.dir, "*", fmt.Sprintf("%016x", uint64(id.Ino)), hex.EncodeToString(id.Unique[:])))
	if err != nil || len(files) != 1 {
		e.t.Fatalf("block file of %v: %v %v", id, files, err)
	}
	if err := os.Chtimes(files[0], mtime, mtime); err != nil {
		e.t.Fatal(err)
	}
}

// TestBlockGCOverwrite: an overwritten block is deleted and its garbage
// record forgotten once its delay has passed, not before; the block that
// replaced it stays.
func TestBlockGCOverwrite(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newGCEnv(t)
		f := e.create("f")
		old := e.write(f, 0, 5000, time.Now())
		cur := e.write(f, 0, 6000, time.Now())
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		defer wg.Wait()
		defer cancel()
		g := e.collector(BlockGCConfig{Every: time.Second})
		wg.Go(func() { g.Run(ctx) })

		time.Sleep(gcTestDelay - time.Second)
		synctest.Wait()
		if !e.exists(old) || len(e.garbage()) != 1 || g.Stats().Deleted != 0 {
			t.Fatalf("before the delay: block there %v, garbage %+v, %+v", e.exists(old), e.garbage(), g.Stats())
		}
		time.Sleep(2 * time.Second)
		synctest.Wait()
		if e.exists(old) || len(e.garbage()) != 0 {
			t.Fatalf("after the delay: block there %v, garbage %+v", e.exists(old), e.garbage())
		}
		if !e.exists(cur) {
			t.Fatal("the current block was deleted")
		}
		if s := g.Stats(); s.Deleted != 1 || s.Freed != 5000 || s.Errors != 0 {
			t.Fatalf("stats %+v", s)
		}
	})
}

// failingStore fails the deletes of the blocks in fail.
type failingStore struct {
	blocks.Store
	fail map[blocks.ID]bool
}

func (s *failingStore) Delete(ctx context.Context, id blocks.ID) error {
	if s.fail[id] {
		return errors.New("injected delete failure")
	}
	return s.Store.Delete(ctx, id)
}

// TestBlockGCDeleteError: a block whose delete failed keeps its garbage
// record, the others in its page are collected, and it goes next round.
func TestBlockGCDeleteError(t *testing.T) {
	e := newGCEnv(t)
	f := e.create("f")
	past := time.Now().Add(-time.Hour)
	a := e.write(f, 0, 100, past)
	b := e.write(f, 0, 200, past)
	e.write(f, 0, 300, past) // a and b are garbage, due
	fs := &failingStore{Store: e.blks, fail: map[blocks.ID]bool{a: true}}
	g := NewBlockGC(e.meta, fs, BlockGCConfig{Batch: 1, Logger: slog.New(slog.DiscardHandler)})

	g.round(context.Background())
	if gs := e.garbage(); len(gs) != 1 || gs[0].ID != a || !e.exists(a) {
		t.Fatalf("after a failed delete: garbage %+v, block there %v", gs, e.exists(a))
	}
	if e.exists(b) {
		t.Fatal("the block after the failed one was not deleted")
	}
	if s := g.Stats(); s.Deleted != 1 || s.Freed != 200 || s.Errors != 1 {
		t.Fatalf("stats %+v", s)
	}
	delete(fs.fail, a)
	g.round(context.Background())
	if len(e.garbage()) != 0 || e.exists(a) {
		t.Fatalf("the next round: garbage %+v, block there %v", e.garbage(), e.exists(a))
	}
}

// TestBlockGCUnlink: removing a file of three blocks frees all three,
// and its directory in the block store.
func TestBlockGCUnlink(t *testing.T) {
	e := newGCEnv(t)
	f := e.create("f")
	var written []blocks.ID
	for i := range uint64(3) {
		written = append(written, e.write(f, i*8192, 8192, time.Now()))
	}
	if _, purged, err := e.meta.Unlink(ids.RootIno, "f", time.Now().UnixNano(), func(ids.Ino) bool { return true }); err != nil || !purged {
		t.Fatalf("unlink: purged %v, %v", purged, err)
	}
	later := func() time.Time { return time.Now().Add(gcTestDelay + time.Second) }
	g := e.collector(BlockGCConfig{Now: later})
	g.round(context.Background())
	for _, id := range written {
		if e.exists(id) {
			t.Fatalf("block %v still there", id)
		}
	}
	if len(e.garbage()) != 0 {
		t.Fatalf("garbage %+v", e.garbage())
	}
	if s := g.Stats(); s.Deleted != 3 || s.Freed != 3*8192 {
		t.Fatalf("stats %+v", s)
	}
	if _, err := os.Stat(filepath.Dir(e.blockFile(written[0]))); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the inode's directory: %v", err)
	}
}

// blockFile is where the FileStore keeps id.
func (e *gcEnv) blockFile(id blocks.ID) string {
	fan, _ := filepath.Glob(filepath.Join(e.dir, "??"))
	for _, d := range fan {
		p := filepath.Join(d, fmt.Sprintf("%016x", uint64(id.Ino)))
		if _, err := os.Stat(p); err == nil {
			return filepath.Join(p, hex.EncodeToString(id.Unique[:]))
		}
	}
	return filepath.Join(e.dir, "none", fmt.Sprintf("%016x", uint64(id.Ino)), "none")
}

// TestBlockGCOrphans: a block no record names is deleted once older than
// OrphanDelay; a younger one, a referenced one and one that is garbage
// not yet due stay.
func TestBlockGCOrphans(t *testing.T) {
	e := newGCEnv(t)
	f := e.create("f")
	now := time.Now()
	long := now.Add(-2 * time.Hour)
	garbage := e.write(f, 0, 100, now)
	live := e.write(f, 0, 200, now)
	oldOrphan, _ := e.put(f, 300)
	young, _ := e.put(f, 400)
	gone, _ := e.put(f+1000, 500) // an inode the store does not have
	for _, id := range []blocks.ID{garbage, live, oldOrphan, gone} {
		e.age(id, long)
	}
	e.age(young, now.Add(-30*time.Minute))
	g := e.collector(BlockGCConfig{OrphanDelay: time.Hour})
	g.round(context.Background())
	for id, want := range map[blocks.ID]bool{garbage: true, live: true, young: true, oldOrphan: false, gone: false} {
		if e.exists(id) != want {
			t.Errorf("block %v there %v, want %v", id, e.exists(id), want)
		}
	}
	if s := g.Stats(); s.Orphans != 2 || s.OrphanBytes != 800 || s.Deleted != 0 || s.Scans != 1 {
		t.Fatalf("stats %+v", s)
	}
}

// TestBlockGCOrphanScanResumes: a scan looks at OrphanInodes inodes a
// round and goes on where it stopped; the next starts OrphanEvery later.
func TestBlockGCOrphanScanResumes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newGCEnv(t)
		var orphans []blocks.ID
		for ino := range ids.Ino(3) {
			id, _ := e.put(1000+ino, 10)
			e.age(id, time.Now().Add(-2*time.Hour))
			orphans = append(orphans, id)
		}
		g := e.collector(BlockGCConfig{OrphanInodes: 1, OrphanEvery: time.Minute})
		for round := range 3 {
			g.round(context.Background())
			if s := g.Stats(); s.Orphans != uint64(round+1) {
				t.Fatalf("round %d: %+v", round, s)
			}
		}
		if s := g.Stats(); s.Scans != 1 {
			t.Fatalf("after three rounds: %+v", s)
		}
		late, _ := e.put(2000, 10)
		e.age(late, time.Now().Add(-2*time.Hour))
		g.round(context.Background())
		if !e.exists(late) {
			t.Fatal("a scan started before OrphanEvery had passed")
		}
		time.Sleep(time.Minute)
		g.round(context.Background())
		if e.exists(late) {
			t.Fatal("no scan after OrphanEvery")
		}
	})
}

// TestBlockGCOwns: the collector leaves alone the garbage and the
// orphans of inodes it does not own.
func TestBlockGCOwns(t *testing.T) {
	e := newGCEnv(t)
	mine, theirs := e.create("mine"), e.create("theirs")
	past := time.Now().Add(-time.Hour)
	var myGarbage, theirGarbage []blocks.ID
	for range 3 {
		myGarbage = append(myGarbage, e.write(mine, 0, 100, past))
		theirGarbage = append(theirGarbage, e.write(theirs, 0, 100, past))
	}
	orphan, _ := e.put(theirs, 10)
	e.age(orphan, past.Add(-time.Hour))
	g := e.collector(BlockGCConfig{Batch: 1, OrphanDelay: time.Minute, Owns: func(ino ids.Ino) bool { return ino == mine }})
	g.round(context.Background())
	for _, id := range append(theirGarbage, orphan) {
		if !e.exists(id) {
			t.Fatalf("another owner's block %v deleted", id)
		}
	}
	for _, id := range myGarbage[:2] {
		if e.exists(id) {
			t.Fatalf("own garbage %v not deleted", id)
		}
	}
	if gs := e.garbage(); len(gs) != 2 || gs[0].ID.Ino != theirs || gs[1].ID.Ino != theirs {
		t.Fatalf("garbage left %+v", gs)
	}
}

// TestBlockGCRunScans: Run starts its first orphan scan OrphanEvery after
// it starts, not at once: a mount of before a restart may still commit.
func TestBlockGCRunScans(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newGCEnv(t)
		orphan, _ := e.put(1000, 10)
		e.age(orphan, time.Now().Add(-2*time.Hour))
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		defer wg.Wait()
		defer cancel()
		g := e.collector(BlockGCConfig{Every: time.Second, OrphanEvery: time.Minute})
		wg.Go(func() { g.Run(ctx) })
		time.Sleep(time.Minute - time.Second)
		synctest.Wait()
		if !e.exists(orphan) {
			t.Fatal("orphan deleted before the first scan was due")
		}
		time.Sleep(2 * time.Second)
		synctest.Wait()
		if e.exists(orphan) {
			t.Fatalf("orphan still there after the first scan: %+v", g.Stats())
		}
	})
}

// TestBlockGCOnServer: a server with a block store runs the collector: a
// block an overwrite made garbage, long due, leaves the store within a
// round; the block the file now references stays.
func TestBlockGCOnServer(t *testing.T) {
	s := startBlockTestServer(t)
	ctx := context.Background()
	past := time.Now().Add(-time.Hour).UnixNano()
	f, err := s.store.Create(ids.RootIno, "f", 0o644, 0, 0, 0, past)
	if err != nil {
		t.Fatal(err)
	}
	put := func(data string) blocks.ID {
		id := blocks.NewID(f.Ino)
		if err := s.blocks.store.Put(ctx, id, []byte(data)); err != nil {
			t.Fatal(err)
		}
		b := blockmap.Block{Unique: id.Unique, Size: uint64(len(data)), Sums: blocks.Sum([]byte(data))}
		ext := blockmap.Extent{Off: 0, Len: b.Size, Block: id.Unique}
		if _, err := s.store.CommitBlocks(f.Ino, []blockmap.Block{b}, []blockmap.Extent{ext}, b.Size, past); err != nil {
			t.Fatal(err)
		}
		return id
	}
	old, cur := put("first"), put("again")
	gone := func(id blocks.ID) bool {
		_, err := s.blocks.store.ReadAt(ctx, id, make([]byte, 5), 0)
		return errors.Is(err, blocks.ErrNotFound)
	}
	for deadline := time.Now().Add(3 * DefaultGCEvery); !gone(old); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the overwritten block is still in the store after %v", 3*DefaultGCEvery)
		}
	}
	if gone(cur) {
		t.Fatal("the collector deleted the block the file references")
	}
	if st := s.blocks.gc.Stats(); st.Deleted != 1 {
		t.Fatalf("collector stats %+v, want 1 deleted", st)
	}
}
