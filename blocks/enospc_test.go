package blocks

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// TestFileStoreENOSPC fills a 2 MiB tmpfs: the Put that does not fit fails
// with an error wrapping ENOSPC, leaves no temp file and no block behind,
// and once blocks are deleted Puts work again.
func TestFileStoreENOSPC(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting a tmpfs needs root")
	}
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=2m,mode=0700"); err != nil {
		t.Skipf("mount tmpfs: %v", err)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(dir, 0); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
	ctx := context.Background()
	s, err := OpenFileStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	first := NewID(1)
	if err := s.Put(ctx, first, randBytes(1<<20, 1)); err != nil {
		t.Fatal(err)
	}
	u, err := s.Usage(ctx)
	if err != nil || u.Free <= 0 || u.Free > 1<<20 {
		t.Fatalf("Usage = %+v, %v; want under 1 MiB free", u, err)
	}
	for _, size := range []int{MaxBlock, 1 << 20} {
		err := s.Put(ctx, NewID(2), randBytes(size, 2))
		if !errors.Is(err, syscall.ENOSPC) {
			t.Fatalf("Put of %d bytes on a full disk: %v, want ENOSPC", size, err)
		}
	}
	if got := listAll(t, s, AllInodes); len(got) != 1 || got[0] != first.String() {
		t.Fatalf("after ENOSPC the store lists %v", got)
	}
	if ents, _ := os.ReadDir(filepath.Join(dir, tmpDir)); len(ents) != 0 {
		t.Fatalf("temp files left: %v", ents)
	}
	if err := s.Delete(ctx, first); err != nil {
		t.Fatal(err)
	}
	second := NewID(2)
	if err := s.Put(ctx, second, randBytes(1<<20+5, 3)); err != nil {
		t.Fatalf("Put after freeing space: %v", err)
	}
	if got := listAll(t, s, AllInodes); len(got) != 1 || got[0] != second.String() {
		t.Fatalf("store lists %v", got)
	}
}

// TestFileStoreKeepFree: a Put that would leave less than the room to
// keep free fails with ENOSPC and leaves nothing; without it, it works.
func TestFileStoreKeepFree(t *testing.T) {
	st, err := OpenFileStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	var fs syscall.Statfs_t
	if err := syscall.Statfs(t.TempDir(), &fs); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	id := NewID(9)
	st.SetKeepFree(int64(fs.Bavail) * fs.Bsize)
	if err := st.Put(ctx, id, []byte("block")); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("Put into the room to keep: %v, want ENOSPC", err)
	}
	if _, err := st.ReadAt(ctx, id, make([]byte, 1), 0); !errors.Is(err, ErrNotFound) {
		t.Fatalf("after the refused Put: %v, want no block", err)
	}
	st.SetKeepFree(0)
	if err := st.Put(ctx, id, []byte("block")); err != nil {
		t.Fatal(err)
	}
}
