package integration

import (
	"bytes"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/leasefs/leasefs/internal/testnet"
)

// blockFiles lists the block files of a block directory, without the
// store's id file and blocks still being written.
func blockFiles(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || strings.HasPrefix(d.Name(), ".") {
			return err
		}
		out = append(out, p)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// duBytes is what the files under dir take on disk.
func duBytes(dir string) int64 {
	var n int64
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		var st syscall.Stat_t
		if err == nil && !d.IsDir() && syscall.Stat(p, &st) == nil {
			n += st.Blocks * 512
		}
		return nil
	})
	return n
}

// catErr reads path with cat in a fresh process and returns its output
// and error.
func catErr(path string) (string, error) {
	out, err := exec.Command("cat", path).CombinedOutput()
	return string(out), err
}

// TestBlockCorrupt: a block whose bytes no longer match its checksums,
// or that is gone from the store, reads as EIO on a mount that did not
// cache it, never as wrong bytes, and the mount's log names the file.
func TestBlockCorrupt(t *testing.T) {
	s := startServer(t)
	a := startMount(t, s)
	data := randomBytes(6 << 20)
	writeSync(t, filepath.Join(a.dir, "big"), data)
	small := []byte("small files keep their data inline\n")
	writeSync(t, filepath.Join(a.dir, "small"), small)
	files := blockFiles(t, filepath.Join(s.dir, "blocks"))
	if len(files) != 2 {
		t.Fatalf("a 6 MiB file in %d blocks (%v), want 2 of at most 4 MiB", len(files), files)
	}

	// flip one byte of the block holding the file's start
	var first string
	for _, f := range files {
		b, err := os.ReadFile(f)
		must(t, err)
		if bytes.HasPrefix(data, b[:4096]) {
			first = f
			b[1000] ^= 0xff
			must(t, os.WriteFile(f, b, 0o644))
		}
	}
	if first == "" {
		t.Fatal("no block holds the file's first bytes")
	}
	b := startMount(t, s)
	out, err := catErr(filepath.Join(b.dir, "big"))
	if err == nil || !strings.Contains(out, "Input/output error") {
		t.Errorf("read of a corrupt block: %v %.200q, want EIO", err, out)
	}
	if log := b.output(); !strings.Contains(log, "file data unreadable") || !strings.Contains(log, "big") {
		t.Errorf("the mount's log does not name the file:\n%s", log)
	}
	// the other block, and a small file, still read
	f, err := os.Open(filepath.Join(b.dir, "big"))
	must(t, err)
	rest := make([]byte, 2<<20)
	_, err = f.ReadAt(rest, 4<<20)
	f.Close()
	if err != nil || !bytes.Equal(rest, data[4<<20:]) {
		t.Errorf("read of the intact block: %v, equal %v", err, bytes.Equal(rest, data[4<<20:]))
	}
	wantSame(t, filepath.Join(b.dir, "small"), small)

	// gone from the store
	must(t, os.Remove(first))
	c := startMount(t, s)
	if out, err := catErr(filepath.Join(c.dir, "big")); err == nil || !strings.Contains(out, "Input/output error") {
		t.Errorf("read of a missing block: %v %.200q, want EIO", err, out)
	}
}

// TestBlocksFull: a block directory on a small tmpfs fills: the writer's
// fsync gets ENOSPC, nothing of the refused flush is committed (the file
// keeps what was committed before), files written before keep their
// bytes, and once files are removed (their blocks collected) writes work
// again.
func TestBlocksFull(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting a tmpfs needs root")
	}
	dir := filepath.Join(t.TempDir(), "blocks")
	must(t, os.Mkdir(dir, 0o755))
	mountFS(t, dir, exec.Command("mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", dir))
	s := &server{dir: t.TempDir(), addr: testnet.UDPAddr(t), extra: []string{"--blocks", "file:" + dir}}
	s.tokenFile = filepath.Join(s.dir, "token")
	s.start(t)
	m := startMount(t, s)

	early := randomBytes(8 << 20)
	writeSync(t, filepath.Join(m.dir, "early"), early)
	first := randomBytes(2 << 20)
	path := filepath.Join(m.dir, "big")
	writeSync(t, path, first)

	// 32 MiB more into the same file, buffered, then fsync: its blocks do
	// not fit
	more := randomBytes(32 << 20)
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	must(t, err)
	_, err = f.WriteAt(more, int64(len(first)))
	if err == nil {
		err = f.Sync()
	}
	f.Close()
	if !errorsIsENOSPC(err) {
		t.Fatalf("fsync of 32 MiB into 24 MiB of blocks: %v, want ENOSPC", err)
	}
	if s.exited() {
		t.Fatalf("the server died: %v", s.err)
	}
	// nothing of the refused flush: the file is what was committed
	o := startMount(t, s)
	wantSame(t, filepath.Join(o.dir, "big"), first)
	wantSame(t, filepath.Join(o.dir, "early"), early)

	// removing gives the space back (after the collector's delay)
	must(t, os.Remove(filepath.Join(m.dir, "early")))
	again := randomBytes(12 << 20)
	waitFor(t, 60*time.Second, "writes to work again after the removal", func() bool {
		return writeSyncErr(filepath.Join(m.dir, "again"), again) == nil
	})
	wantSame(t, filepath.Join(o.dir, "again"), again)
}

func errorsIsENOSPC(err error) bool {
	return err != nil && strings.Contains(err.Error(), syscall.ENOSPC.Error())
}

// TestMountKilledBeforeCommit: a mount that put a flush's blocks in the
// store and died before the owner committed them leaves the file as it
// was last committed; the blocks it left are collected.
func TestMountKilledBeforeCommit(t *testing.T) {
	s := startServer(t, "--orphan-delay", "3s")
	a := startMount(t, s)
	path := filepath.Join(a.dir, "f")
	committed := randomBytes(5 << 20)
	f, err := os.Create(path)
	must(t, err)
	t.Cleanup(func() { f.Close() })
	// before the file's close (cleanups run last first), which waits
	// for the server
	t.Cleanup(func() { s.signal(syscall.SIGCONT) })
	_, err = f.Write(committed)
	must(t, err)
	must(t, f.Sync())
	blocksDir := filepath.Join(s.dir, "blocks")
	before := blockFiles(t, blocksDir)

	// The server stopped: the mount buffers the writes under the X lock
	// it holds, and at fsync puts their blocks (it needs no server for
	// that), then waits to commit them.
	s.signal(syscall.SIGSTOP)
	done := make(chan error, 1)
	go func() {
		_, err := f.WriteAt(randomBytes(8<<20), 0)
		if err == nil {
			err = f.Sync()
		}
		done <- err
	}()
	waitFor(t, 30*time.Second, "the flush's blocks in the store", func() bool {
		return len(blockFiles(t, blocksDir)) >= len(before)+2
	})
	a.kill()
	abortFUSE(a.dir)
	if err := <-done; err == nil {
		t.Error("fsync returned success from a mount killed before its commit")
	}
	// The commit the mount sent may wait in the stopped server's socket:
	// killed, the server never reads it.
	s.signal(syscall.SIGKILL)
	<-s.done
	s.start(t)

	b := startMount(t, s)
	wantSame(t, filepath.Join(b.dir, "f"), committed)
	waitFor(t, 60*time.Second, "the uncommitted blocks collected", func() bool {
		return len(blockFiles(t, blocksDir)) == len(before)
	})
	wantSame(t, filepath.Join(b.dir, "f"), committed)
}

// TestSpaceComesBack: removing 1 GiB gives at least 900 MiB of the block
// directory back within 60 s, with no restart.
func TestSpaceComesBack(t *testing.T) {
	s := &server{dir: tmpfsDir(t, "space"), addr: testnet.UDPAddr(t)}
	s.tokenFile = filepath.Join(s.dir, "token")
	s.start(t)
	m := startMount(t, s)
	path := filepath.Join(m.dir, "big")
	run(t, "", "dd", "if=/dev/urandom", "of="+path, "bs=1M", "count=1024", "conv=fsync", "status=none")
	blocksDir := filepath.Join(s.dir, "blocks")
	full := duBytes(blocksDir)
	if full < 1<<30 {
		t.Fatalf("1 GiB written, the block directory holds %d bytes", full)
	}
	// df counts the blocks (the count is refreshed every 10 s)
	waitFor(t, 30*time.Second, "statfs to count the blocks", func() bool {
		var st syscall.Statfs_t
		must(t, syscall.Statfs(m.dir, &st))
		return int64(st.Blocks-st.Bfree)*st.Bsize >= 1<<30
	})
	must(t, os.Remove(path))
	start := time.Now()
	waitFor(t, 60*time.Second, "900 MiB of blocks freed", func() bool { return full-duBytes(blocksDir) >= 900<<20 })
	t.Logf("block directory %d MiB -> %d MiB in %v after rm", full>>20, duBytes(blocksDir)>>20, time.Since(start).Round(time.Second))
}
