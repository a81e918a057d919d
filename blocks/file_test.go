package blocks

import (
	"context"
	"errors"
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

func TestFileStoreContract(t *testing.T) { testStoreContract(t, openTest(t)) }

// TestFileStoreInodeDirs: deleting an inode's last block removes its
// directory, and a Put to it makes it again.
func TestFileStoreInodeDirs(t *testing.T) {
	ctx := context.Background()
	s := openTest(t)
	a, b := NewID(5), NewID(5)
	for _, id := range []ID{a, b} {
		if err := s.Put(ctx, id, []byte("block")); err != nil {
			t.Fatal(err)
		}
	}
	for i, id := range []ID{a, b} {
		if err := s.Delete(ctx, id); err != nil {
			t.Fatal(err)
		}
		_, err := os.Stat(s.inoDir(5))
		if gone := errors.Is(err, os.ErrNotExist); gone != (i == 1) {
			t.Fatalf("after %d deletes: inode directory: %v", i+1, err)
		}
	}
	if err := s.Put(ctx, NewID(5), []byte("again")); err != nil {
		t.Fatal(err)
	}
	if got := listAll(t, s, 5); len(got) != 1 {
		t.Fatalf("List(5) = %v", got)
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
