package blocks

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/leasefs/leasefs/internal/ids"
)

func randBytes(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, 1))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

func openTest(t *testing.T) *FileStore {
	t.Helper()
	s, err := OpenFileStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// listAll returns the ids of ino's blocks (every block for AllInodes), sorted.
func listAll(t *testing.T, s Store, ino ids.Ino) []string {
	t.Helper()
	var got []string
	if err := s.List(context.Background(), ino, func(id ID, _ int64, _ time.Time) error {
		got = append(got, id.String())
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	slices.Sort(got)
	return got
}

func TestFileStorePutRead(t *testing.T) {
	ctx := context.Background()
	s := openTest(t)
	data := randBytes(MaxBlock-1000, 1)
	id := NewID(7)
	if err := s.Put(ctx, id, data); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		off, n int64
		want   int
		eof    bool
	}{
		{0, int64(len(data)), len(data), false},
		{12345, 4096, 4096, false},
		{int64(len(data)) - 10, 100, 10, true},
		{int64(len(data)), 10, 0, true},
	} {
		p := make([]byte, c.n)
		n, err := s.ReadAt(ctx, id, p, c.off)
		if n != c.want || (err == io.EOF) != c.eof || err != nil && err != io.EOF {
			t.Fatalf("ReadAt(%d, %d) = %d, %v; want %d, eof %v", c.off, c.n, n, err, c.want, c.eof)
		}
		if !bytes.Equal(p[:n], data[c.off:c.off+int64(n)]) {
			t.Fatalf("ReadAt(%d, %d): wrong bytes", c.off, c.n)
		}
	}
	if _, err := s.ReadAt(ctx, NewID(7), make([]byte, 1), 0); !errors.Is(err, ErrNotFound) {
		t.Fatalf("missing block: %v, want ErrNotFound", err)
	}
	// the same id and bytes again is harmless
	if err := s.Put(ctx, id, data); err != nil {
		t.Fatal(err)
	}
	if got := listAll(t, s, 7); !slices.Equal(got, []string{id.String()}) {
		t.Fatalf("after a second Put: %v", got)
	}
	if err := s.Put(ctx, NewID(7), make([]byte, MaxBlock+1)); !errors.Is(err, ErrTooBig) {
		t.Fatalf("oversized Put: %v", err)
	}
}

func TestFileStoreListDeleteUsage(t *testing.T) {
	ctx := context.Background()
	s := openTest(t)
	var all, ino5 []string
	var bytes int64
	for i := range 20 {
		ino := ids.Ino(i%4 + 5)
		id := NewID(ino)
		size := 1000 * (i + 1)
		if err := s.Put(ctx, id, randBytes(size, uint64(i))); err != nil {
			t.Fatal(err)
		}
		bytes += int64(size)
		all = append(all, id.String())
		if ino == 5 {
			ino5 = append(ino5, id.String())
		}
	}
	slices.Sort(all)
	slices.Sort(ino5)
	if got := listAll(t, s, AllInodes); !slices.Equal(got, all) {
		t.Fatalf("List(all) = %v, want %v", got, all)
	}
	if got := listAll(t, s, 5); !slices.Equal(got, ino5) {
		t.Fatalf("List(5) = %v, want %v", got, ino5)
	}
	if got := listAll(t, s, 99); len(got) != 0 {
		t.Fatalf("List(99) = %v", got)
	}
	u, err := s.Usage(ctx)
	if err != nil || u.Bytes != bytes || u.Blocks != 20 || u.Free <= 0 {
		t.Fatalf("Usage = %+v, %v; want %d bytes in 20 blocks, some free", u, err, bytes)
	}
	stop := errors.New("stop")
	calls := 0
	if err := s.List(ctx, AllInodes, func(ID, int64, time.Time) error { calls++; return stop }); err != stop || calls != 1 {
		t.Fatalf("List stopping: %v after %d calls", err, calls)
	}

	for _, text := range ino5 {
		id, _ := ParseID(text)
		if err := s.Delete(ctx, id); err != nil {
			t.Fatal(err)
		}
		if err := s.Delete(ctx, id); err != nil {
			t.Fatalf("deleting again: %v", err)
		}
	}
	if got := listAll(t, s, 5); len(got) != 0 {
		t.Fatalf("after deletes: %v", got)
	}
	if _, err := os.Stat(s.inoDir(5)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("inode 5's emptied directory is still there: %v", err)
	}
	// and a Put to it makes it again
	if err := s.Put(ctx, NewID(5), []byte("again")); err != nil {
		t.Fatal(err)
	}
	if got := listAll(t, s, AllInodes); len(got) != 16 {
		t.Fatalf("%d blocks, want 16", len(got))
	}
}

// TestFileStoreCrashTemps: temp files a crashed Put left are never listed,
// and the next open removes those older than a minute but not younger ones
// (another process's Put in progress).
func TestFileStoreCrashTemps(t *testing.T) {
	ctx := context.Background()
	s := openTest(t)
	id := NewID(3)
	if err := s.Put(ctx, id, []byte("kept")); err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(s.dir, tmpDir)
	old, young := filepath.Join(tmp, "put-old"), filepath.Join(tmp, "put-young")
	for _, p := range []string{old, young} {
		if err := os.WriteFile(p, []byte("half a blo"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	past := time.Now().Add(-2 * staleTemp)
	if err := os.Chtimes(old, past, past); err != nil {
		t.Fatal(err)
	}
	if got := listAll(t, s, AllInodes); !slices.Equal(got, []string{id.String()}) {
		t.Fatalf("List = %v", got)
	}
	s2, err := OpenFileStore(s.dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(old); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("stale temp file survived the open: %v", err)
	}
	if _, err := os.Stat(young); err != nil {
		t.Errorf("young temp file removed: %v", err)
	}
	if u, err := s2.Usage(ctx); err != nil || u.Blocks != 1 || u.Bytes != 4 {
		t.Errorf("Usage = %+v, %v", u, err)
	}
}

func TestFileStoreSameStore(t *testing.T) {
	dir := t.TempDir()
	s, err := OpenFileStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(s.StoreID()) != 32 {
		t.Fatalf("store id %q", s.StoreID())
	}
	again, err := OpenFileStore(dir)
	if err != nil || again.StoreID() != s.StoreID() {
		t.Fatalf("reopened: %v, id %q want %q", err, again.StoreID(), s.StoreID())
	}
	fi, err := os.Stat(filepath.Join(dir, storeIDFile))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("store id file: %v, mode %v", err, fi.Mode())
	}
	if _, err := OpenFileStoreIfSame(dir, s.StoreID()); err != nil {
		t.Fatal(err)
	}
	other, err := OpenFileStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := OpenFileStoreIfSame(dir, other.StoreID()); !errors.Is(err, ErrOtherStore) {
		t.Fatalf("another store's id: %v", err)
	}
	if _, err := OpenFileStoreIfSame(t.TempDir(), s.StoreID()); !errors.Is(err, ErrOtherStore) {
		t.Fatalf("an empty directory: %v", err)
	}
}

func TestFileStoreModes(t *testing.T) {
	s := openTest(t)
	id := NewID(1)
	if err := s.Put(context.Background(), id, []byte("x")); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]os.FileMode{
		s.path(id):                        0o600,
		s.inoDir(1):                       0o700 | os.ModeDir,
		filepath.Dir(s.inoDir(1)):         0o700 | os.ModeDir,
		filepath.Join(s.dir, tmpDir):      0o700 | os.ModeDir,
		filepath.Join(s.dir, storeIDFile): 0o600,
	} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode() != want {
			t.Errorf("%s: mode %v, want %v", p, fi.Mode(), want)
		}
	}
}

// TestFileStorePutDeleteRace: Deletes that empty an inode's directory, and
// so remove it, race with Puts to the same inode; every Put must succeed
// and its block be there.
func TestFileStorePutDeleteRace(t *testing.T) {
	ctx := context.Background()
	s := openTest(t)
	done, stop := make(chan struct{}), make(chan struct{})
	defer func() { close(stop); <-done }()
	go func() {
		defer close(done)
		for range 300 {
			select {
			case <-stop:
				return
			default:
			}
			id := NewID(3)
			if err := s.Put(ctx, id, []byte("short-lived")); err != nil {
				t.Error(err)
				return
			}
			s.Delete(ctx, id)
		}
	}()
	for i := 0; ; i++ {
		select {
		case <-done:
			if i < 10 {
				t.Logf("only %d Puts raced", i)
			}
			return
		default:
		}
		id := NewID(3)
		if err := s.Put(ctx, id, []byte("kept")); err != nil {
			t.Fatal(err)
		}
		if n, err := s.ReadAt(ctx, id, make([]byte, 4), 0); n != 4 || err != nil {
			t.Fatalf("block just put: %d, %v", n, err)
		}
		s.Delete(ctx, id)
	}
}
