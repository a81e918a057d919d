package integration

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// maxFileSize is wire.MaxFileSize, the largest file a server takes.
const maxFileSize = 1 << 60

// TestWritePastMaxFileSize: a write, truncation or allocation past the
// largest file the server takes fails at once with EFBIG (a write that
// begins below it is cut short there), at the mount: the kernel knows no
// limit of a FUSE file system. A write at 2^61 was buffered and "succeeded";
// the close failed with EFBIG, the file reported a size past 2^61 and EFBIG
// on every later read and truncate.
func TestWritePastMaxFileSize(t *testing.T) {
	s := startServer(t)
	a, b := startMount(t, s), startMount(t, s)
	path := filepath.Join(a.dir, "f")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	must(t, err)
	defer f.Close()
	_, err = f.WriteAt([]byte("hello"), 0)
	must(t, err)

	efbig := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, syscall.EFBIG) {
			t.Errorf("%s: %v, want EFBIG", what, err)
		}
	}
	_, err = f.WriteAt([]byte("x"), 1<<61)
	efbig("pwrite at 2^61", err)
	_, err = f.WriteAt([]byte("x"), maxFileSize)
	efbig("pwrite at the limit", err)
	efbig("ftruncate to 2^61", f.Truncate(1<<61))
	efbig("ftruncate past the limit", f.Truncate(maxFileSize+1))
	fd := int(f.Fd())
	efbig("fallocate past the limit", syscall.Fallocate(fd, 0, maxFileSize-1, 2))
	efbig("fallocate (keep size) past the limit", syscall.Fallocate(fd, 1, 1<<61, 1))
	must(t, f.Sync())
	if st, err := f.Stat(); err != nil || st.Size() != 5 {
		t.Fatalf("after the refused calls: size %v, %v; want 5", st.Size(), err)
	}

	// A write that begins below the limit is cut short at it, as the
	// kernel cuts one at a file system's s_maxbytes. (os.File.WriteAt
	// would go on and drop the count with the EFBIG.)
	if n, err := syscall.Pwrite(fd, []byte("tail"), maxFileSize-2); n != 2 || err != nil {
		t.Fatalf("pwrite of 4 bytes 2 before the limit: %d, %v; want 2", n, err)
	}
	must(t, f.Close())

	// Both mounts see the file whole and usable.
	for _, m := range []*mount{a, b} {
		p := filepath.Join(m.dir, "f")
		st, err := os.Stat(p)
		if err != nil || st.Size() != maxFileSize {
			t.Fatalf("%s: size %v, %v; want %d", p, st.Size(), err, int64(maxFileSize))
		}
		g, err := os.Open(p)
		must(t, err)
		buf := make([]byte, 5)
		if _, err := g.ReadAt(buf, 0); err != nil || string(buf) != "hello" {
			t.Fatalf("%s at 0: %q, %v", p, buf, err)
		}
		if _, err := g.ReadAt(buf[:2], maxFileSize-2); err != nil || string(buf[:2]) != "ta" {
			t.Fatalf("%s at its end: %q, %v", p, buf[:2], err)
		}
		g.Close()
	}
	must(t, os.Truncate(path, 3))
	wantFile(t, filepath.Join(b.dir, "f"), []byte("hel"))
}

// TestRefusedFlushFailsOnlyTheFile: a server that takes smaller files than
// the mount knows of refuses a file's buffered writes when the mount
// flushes them for another mount's read. That fails the file (EIO at its
// next fsync, the data logged lost with its path), not the mount: the
// revocation is acknowledged, the server does not fail the client (no NACK:
// before, every lock was stolen), the file's earlier fsync'ed write stays,
// and another file's buffered writes reach the server.
func TestRefusedFlushFailsOnlyTheFile(t *testing.T) {
	const limit = 1 << 20
	s := startServer(t, "--max-file-size", itoa(limit), "--client-lease", "1s", "--delivery-timeout", "250ms")
	a, b := startMount(t, s), startMount(t, s)

	f, err := os.OpenFile(filepath.Join(a.dir, "f"), os.O_CREATE|os.O_RDWR, 0o644)
	must(t, err)
	defer f.Close()
	_, err = f.WriteAt([]byte("first"), 0)
	must(t, err)
	must(t, f.Sync()) // acknowledged
	g, err := os.OpenFile(filepath.Join(a.dir, "g"), os.O_CREATE|os.O_RDWR, 0o644)
	must(t, err)
	defer g.Close()
	_, err = g.WriteAt([]byte("other file"), 0) // buffered
	must(t, err)
	_, err = f.WriteAt([]byte("more"), 100) // buffered
	must(t, err)
	_, err = f.WriteAt([]byte("x"), 2*limit) // buffered: the mount does not know the server's limit
	must(t, err)

	// B's read revokes A's lock on f: A flushes f, which the server refuses.
	got, err := os.ReadFile(filepath.Join(b.dir, "f"))
	must(t, err)
	if !bytes.HasPrefix(got, []byte("first")) {
		t.Fatalf("B reads %q: the fsync'ed write is gone", got)
	}
	wantFile(t, filepath.Join(b.dir, "g"), []byte("other file"))

	if err := f.Sync(); !errors.Is(err, syscall.EIO) {
		t.Fatalf("A's fsync of the file whose writes the server refused: %v, want EIO", err)
	}
	waitFor(t, 5*time.Second, "A to log the loss", func() bool {
		out := a.output()
		return strings.Contains(out, "DATA LOST") && strings.Contains(out, "path=/f ")
	})
	if st, err := f.Stat(); err != nil || st.Size() > limit {
		t.Fatalf("A's file: size %v, %v; the refused writes still count", st.Size(), err)
	}
	// reported once; the handle works again
	_, err = f.WriteAt([]byte("again"), 0)
	must(t, err)
	must(t, f.Sync())
	must(t, g.Close())
	wantFile(t, filepath.Join(b.dir, "g"), []byte("other file"))
	got, err = os.ReadFile(filepath.Join(b.dir, "f"))
	if err != nil || !bytes.HasPrefix(got, []byte("again")) {
		t.Fatalf("B reads %q, %v after A wrote again", got, err)
	}
	if _, st := mountStats(t, a); st.NacksReceived != 0 || st.Recoveries != 0 || st.DataLost != 1 {
		t.Fatalf("A: %d NACKs, %d recoveries, %d losses; want 0, 0, 1", st.NacksReceived, st.Recoveries, st.DataLost)
	}
}
