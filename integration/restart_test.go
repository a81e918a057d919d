package integration

import (
	"bytes"
	"crypto/rand"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// TestRestart: every fsynced byte survives SIGKILL of the server.
func TestRestart(t *testing.T) {
	s := startServer(t)
	m := startMount(t, s)
	files := map[string][]byte{}
	must(t, os.MkdirAll(filepath.Join(m.dir, "d/e"), 0o755))
	for i, size := range []int{0, 1, 4095, 65536, 65537, 3<<20 + 17} {
		data := make([]byte, size)
		_, _ = rand.Read(data)
		name := filepath.Join("d/e", "f"+itoa(i))
		f, err := os.Create(filepath.Join(m.dir, name))
		must(t, err)
		_, err = f.Write(data)
		must(t, err)
		must(t, f.Sync())
		must(t, f.Close())
		files[name] = data
	}
	must(t, os.Symlink("e/f1", filepath.Join(m.dir, "d/link")))
	d, err := os.Open(filepath.Join(m.dir, "d"))
	must(t, err)
	must(t, d.Sync())
	d.Close()

	s.restart(t)
	m.unmount(t)
	m2 := startMount(t, s)
	for name, want := range files {
		got, err := os.ReadFile(filepath.Join(m2.dir, name))
		if err != nil {
			t.Fatalf("%s after restart: %v", name, err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("%s after restart: %d bytes differ from the %d written", name, len(got), len(want))
		}
	}
	if target, err := os.Readlink(filepath.Join(m2.dir, "d/link")); err != nil || target != "e/f1" {
		t.Fatalf("symlink after restart: %q %v", target, err)
	}
}

// TestRestartDuringFlush: the server is killed while a big fsync's writes
// are half applied (some answered, some in flight) and restarted. The
// mount reclaims what it buffered and the fsync succeeds: the file reads
// back exactly. Before, the reclaim sent every write of the interrupted
// flush again with its request id, the answered ones too; the server had
// dropped those ids from its record of applied requests (the client had
// moved past them) and refused the first as a stale copy, and the reclaim
// gave the rest up: the fsync failed with EIO and the file held runs of
// zeros where the writes in flight had been.
func TestRestartDuringFlush(t *testing.T) {
	s := startServer(t)
	m := startMount(t, s)
	const size = 48 << 20 // buffered whole: under the mount's per-file flush threshold
	src := filepath.Join(t.TempDir(), "src")
	for attempt := 0; ; attempt++ {
		if attempt == 5 {
			t.Fatal("never caught the flush half done")
		}
		data := make([]byte, size)
		_, _ = rand.Read(data)
		must(t, os.WriteFile(src, data, 0o644))
		path := filepath.Join(m.dir, "f"+itoa(attempt))
		base := storedBytes(s.dir)
		// dd writes, then fsyncs: this process holds no descriptor of
		// the mount, whose close would wait for the flush (a process
		// started meanwhile closes its copies at exec)
		dd := exec.Command("dd", "if="+src, "of="+path, "bs=1M", "conv=fsync")
		out := &bytes.Buffer{}
		dd.Stdout, dd.Stderr = out, out
		must(t, dd.Start())
		done := make(chan error, 1)
		go func() { done <- dd.Wait() }()
		// stop the server once the flush is a quarter through
		waitFor(t, 30*time.Second, "the flush to start", func() bool { return storedBytes(s.dir)-base >= size/4 })
		s.signal(syscall.SIGSTOP)
		half := storedBytes(s.dir)-base < size*7/8
		s.restart(t)
		var err error
		_, _ = within(t, 60*time.Second, "dd", func() error { err = <-done; return nil })
		if !half {
			continue // the flush was done before the server stopped: again
		}
		if err != nil {
			t.Fatalf("dd with fsync across the server's restart: %v\n%s", err, out)
		}
		wantSame(t, path, data)
		if st := mountStatus(t, m.dir); st.DataLost != 0 || st.ReclaimsOK < 1 {
			t.Fatalf("mount: %+v, want a reclaim and no loss", st)
		}
		return
	}
}

// storedBytes is what a server's value log files and its block store
// (DATA/blocks) hold on disk: where file data goes.
func storedBytes(dir string) int64 {
	names, _ := filepath.Glob(filepath.Join(dir, "db", "*.vlog"))
	var n int64
	for _, name := range names {
		var st syscall.Stat_t
		if syscall.Stat(name, &st) == nil {
			n += st.Blocks * 512
		}
	}
	n += duBytes(filepath.Join(dir, "blocks"))
	return n
}

// wantSame fails the test unless path holds want, saying where it differs
// and whether with zeros.
func wantSame(t *testing.T, path string, want []byte) {
	t.Helper()
	var got []byte
	_, err := within(t, 60*time.Second, "read "+path, func() (err error) { got, err = os.ReadFile(path); return err })
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if bytes.Equal(got, want) {
		return
	}
	i := 0
	for i < len(got) && i < len(want) && got[i] == want[i] {
		i++
	}
	j := i
	for j < len(got) && j < len(want) && got[j] != want[j] && got[j] == 0 {
		j++
	}
	t.Fatalf("%s: %d bytes, want %d; differs from byte %d (%d zeros there)", path, len(got), len(want), i, j-i)
}
