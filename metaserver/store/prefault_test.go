package store

import (
	"bytes"
	"math/rand/v2"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/leasefs/leasefs/internal/ids"
)

// TestPrefaultValueLog: while a file is written, the pages just past the
// value log's end are populated ahead of badger, never more than
// prefaultAhead of them, and the data reads back as written.
func TestPrefaultValueLog(t *testing.T) {
	if !onTmpfs("/dev/shm") {
		t.Skip("no tmpfs at /dev/shm")
	}
	dir, err := os.MkdirTemp("/dev/shm", "leasefs-prefault-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	s := openTestStore(t, dir, Options{})
	defer s.Close()
	f := must[Attr](t)(s.Create(ids.RootIno, "f", reg|0o644, 0, 0, 0, 1))
	const size = 24 << 20
	data := make([]byte, size)
	rng := rand.New(rand.NewPCG(3, 4))
	for i := range data {
		data[i] = byte(rng.Uint32())
	}
	for off := 0; off < size; off += 1 << 20 {
		must[Attr](t)(s.Write(f.Ino, uint64(off), data[off:off+1<<20], 2))
	}
	deadline := time.Now().Add(10 * time.Second)
	for s.pf.ahead.Load() < prefaultAhead/2 {
		if time.Now().After(deadline) {
			t.Fatalf("%d bytes populated past the value log's end, want %d or more", s.pf.ahead.Load(), prefaultAhead/2)
		}
		time.Sleep(10 * time.Millisecond)
	}
	logs, err := filepath.Glob(filepath.Join(dir, "db", "*.vlog"))
	if err != nil || len(logs) != 1 {
		t.Fatalf("value logs %v: %v", logs, err)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(logs[0], &st); err != nil {
		t.Fatal(err)
	}
	if held := st.Blocks * 512; held > size+size/20+prefaultAhead {
		t.Errorf("the value log holds %d bytes for %d written: more than %d populated ahead", held, size, prefaultAhead)
	}
	if got := must[[]byte](t)(s.Read(f.Ino, 0, size)); !bytes.Equal(got, data) {
		t.Fatal("the file reads back different")
	}
}

// TestPrefaultTouchUnmapped: touching pages badger unmapped meanwhile is an
// error, not a crash.
func TestPrefaultTouchUnmapped(t *testing.T) {
	b, err := syscall.Mmap(-1, 0, pageBytes, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANON)
	if err != nil {
		t.Fatal(err)
	}
	p := &prefaulter{}
	p.addr = uintptr(unsafe.Pointer(&b[0]))
	if err := syscall.Munmap(b); err != nil {
		t.Fatal(err)
	}
	if err := p.touch(0, pageBytes); err == nil {
		t.Fatal("touching an unmapped page succeeded")
	}
	if err := p.populate(0, pageBytes); err == nil {
		t.Fatal("populating an unmapped page succeeded")
	}
}

// TestPrefaultOnlyOnTmpfs: on a disk the prefaulter does not run (what it
// touched ahead would be written twice).
func TestPrefaultOnlyOnTmpfs(t *testing.T) {
	dir := t.TempDir()
	if onTmpfs(dir) {
		t.Skip("the temporary directory is on tmpfs")
	}
	s := openTestStore(t, dir, Options{})
	defer s.Close()
	if s.pf != nil {
		t.Fatal("prefaulting a value log on a disk")
	}
}
