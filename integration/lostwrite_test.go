package integration

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestLeaseLostDirtyData: A buffers writes under its X lock and is frozen
// before it flushes them. B writes the file once the server has failed A
// and stolen its lock. Resumed, A cannot reclaim its writes (the file
// changed since they were made): A's fsync returns EIO, the loss is logged
// and counted, A reads B's data, never its own stale bytes, and the same
// handle works normally afterwards.
func TestLeaseLostDirtyData(t *testing.T) {
	a, b, f := frozenWithBufferedWrites(t)
	path := filepath.Join(a.dir, "f")
	var err error

	_, err = within(t, 20*time.Second, "B's write", func() error {
		return os.WriteFile(filepath.Join(b.dir, "f"), []byte("B-WROTE-THIS"), 0o644)
	})
	must(t, err)
	a.signal(syscall.SIGCONT)

	_, err = within(t, 20*time.Second, "A's fsync", func() error { return f.Sync() })
	if !errors.Is(err, syscall.EIO) {
		t.Fatalf("A's fsync after losing buffered writes: %v, want EIO", err)
	}
	wantFile(t, path, []byte("B-WROTE-THIS"))
	waitFor(t, 5*time.Second, "A to log the loss", func() bool {
		return strings.Contains(a.output(), "DATA LOST") && strings.Contains(a.output(), "path=/f ")
	})
	if st := mountStatus(t, a.dir); st.DataLost != 1 {
		t.Fatalf("A counts %d losses, want 1", st.DataLost)
	}
	// The handle works again: the loss was reported once.
	_, err = f.WriteAt([]byte("A-AGAIN"), 0)
	must(t, err)
	must(t, f.Sync())
	wantFile(t, filepath.Join(b.dir, "f"), []byte("A-AGAIN-THIS"))
}

// TestLeaseReclaimDirtyData: as above, but nobody touches the file while A
// is failed: A reclaims its buffered writes and nothing is lost.
func TestLeaseReclaimDirtyData(t *testing.T) {
	a, b, f := frozenWithBufferedWrites(t)
	var err error
	// B touches another file only, but the server must still fail A: make
	// B want A's lock on the directory by creating a file there.
	_, err = within(t, 20*time.Second, "B's create", func() error {
		return os.WriteFile(filepath.Join(b.dir, "other"), []byte("x"), 0o644)
	})
	must(t, err)
	time.Sleep(1500 * time.Millisecond) // past τ(1+δ): A's locks are stolen
	a.signal(syscall.SIGCONT)
	_, err = within(t, 20*time.Second, "A's fsync", func() error { return f.Sync() })
	must(t, err)
	wantFile(t, filepath.Join(b.dir, "f"), []byte("A-BUFFERED"))
	if st, err := os.Stat(filepath.Join(b.dir, "f")); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("B: %v %v, want the reclaimed mode 0600", st.Mode(), err)
	}
	if st := mountStatus(t, a.dir); st.DataLost != 0 || st.ReclaimsOK < 1 {
		t.Fatalf("A: %+v, want a reclaim and no loss", st)
	}
}

// frozenWithBufferedWrites starts a server (τ = 1 s) and mounts A and B; A
// opens f, writes through once (which brings the X lock), then buffers
// "A-BUFFERED" and a chmod to 0600 under that lock and is frozen before it
// flushes.
func frozenWithBufferedWrites(t *testing.T) (a, b *mount, f *os.File) {
	s := startServer(t, "--client-lease", "1s", "--delivery-timeout", "250ms")
	a, b = startMount(t, s), startMount(t, s)
	f, err := os.OpenFile(filepath.Join(a.dir, "f"), os.O_CREATE|os.O_RDWR, 0o644)
	must(t, err)
	t.Cleanup(func() { f.Close() })
	_, err = f.WriteAt([]byte("first"), 0) // write-through: brings the X lock
	must(t, err)
	_, err = f.WriteAt([]byte("A-BUFFERED"), 0) // buffered under X
	must(t, err)
	must(t, f.Chmod(0o600)) // buffered too
	a.signal(syscall.SIGSTOP)
	waitStopped(t, a.proc)
	return a, b, f
}
