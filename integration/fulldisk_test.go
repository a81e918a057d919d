package integration

import (
	"bytes"
	"crypto/rand"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/leasefs/leasefs/internal/testnet"
)

// TestFullDisk runs a server on a small file system and fills it through a
// mount, on tmpfs and on ext4 (a loop device). badger writes its files
// through memory maps: before, the server died of SIGBUS when the disk
// filled, died again at every restart on the full disk, and the writer
// hung on the hard mount instead of getting ENOSPC.
func TestFullDisk(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting a small file system needs root")
	}
	t.Run("tmpfs", func(t *testing.T) {
		fullDisk(t, func(t *testing.T, dir string) {
			mountFS(t, dir, exec.Command("mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", dir))
		})
	})
	t.Run("ext4", func(t *testing.T) {
		fullDisk(t, func(t *testing.T, dir string) {
			if _, err := exec.LookPath("mkfs.ext4"); err != nil {
				t.Fatal("no mkfs.ext4: install e2fsprogs (.ci/run does)")
			}
			img := filepath.Join(t.TempDir(), "img")
			run(t, "", "truncate", "-s", "96M", img)
			run(t, "", "mkfs.ext4", "-q", img)
			if out, err := exec.Command("losetup", "-f").CombinedOutput(); err != nil {
				t.Skipf("no free loop device: %v %s", err, out)
			}
			mountFS(t, dir, exec.Command("mount", "-o", "loop", img, dir))
		})
	})
}

// mountFS runs the mount command for dir and unmounts it at cleanup, which
// runs after the server's and the mount's (registered later).
func mountFS(t *testing.T, dir string, mount *exec.Cmd) {
	t.Helper()
	if out, err := mount.CombinedOutput(); err != nil {
		if strings.Contains(string(out), "loop") {
			t.Skipf("cannot mount a loop device here: %v %s", err, out)
		}
		t.Fatalf("%v: %v %s", mount.Args, err, out)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(dir, 0); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
			_ = syscall.Unmount(dir, syscall.MNT_DETACH)
		}
	})
}

func fullDisk(t *testing.T, mountSmall func(*testing.T, string)) {
	requireFUSE(t)
	small := filepath.Join(t.TempDir(), "fs")
	must(t, os.Mkdir(small, 0o755))
	mountSmall(t, small)
	s := &server{dir: filepath.Join(small, "data"), addr: testnet.UDPAddr(t)}
	s.tokenFile = filepath.Join(s.dir, "token")
	s.start(t)
	m := startMount(t, s)

	// an fsynced file from before the disk filled
	early := randomBytes(5 << 20)
	writeSync(t, filepath.Join(m.dir, "early"), early)

	// A writer that fsyncs every MiB fills the disk: it gets ENOSPC, and
	// every MiB it synced before stays.
	synced := syncUntilFull(t, filepath.Join(m.dir, "synced"))
	t.Logf("%d MiB synced before ENOSPC", len(synced)>>20)

	// dd through the mount: ENOSPC, not a hang, not a crash
	src := filepath.Join(t.TempDir(), "src")
	must(t, os.WriteFile(src, randomBytes(200<<20), 0o644))
	var out []byte
	_, err := within(t, 2*time.Minute, "dd onto the full disk", func() (err error) {
		out, err = exec.Command("dd", "if="+src, "of="+filepath.Join(m.dir, "big"), "bs=1M").CombinedOutput()
		return err
	})
	if err == nil || !strings.Contains(string(out), "No space left on device") {
		t.Fatalf("dd of 200 MiB onto a full disk: %v, want ENOSPC\n%s", err, out)
	}
	if s.exited() {
		t.Fatalf("the server died: %v", s.err)
	}
	// statfs tells the truth: nothing left to write, and the reserve is
	// not counted as free
	var st, back syscall.Statfs_t
	must(t, syscall.Statfs(m.dir, &st))
	must(t, syscall.Statfs(small, &back))
	if free := int64(st.Bavail) * st.Bsize; free > 4<<20 || free >= int64(back.Bavail)*back.Bsize {
		t.Errorf("the full mount reports %d bytes free (its file system %d)", free, int64(back.Bavail)*back.Bsize)
	}
	wantSame(t, filepath.Join(m.dir, "early"), early)
	wantPrefix(t, filepath.Join(m.dir, "synced"), synced)

	// killed and restarted on the full disk: it starts and serves
	s.restart(t)
	wantSame(t, filepath.Join(m.dir, "early"), early)
	wantPrefix(t, filepath.Join(m.dir, "synced"), synced)

	// removing gives the space back: writes work again
	must(t, os.Remove(filepath.Join(m.dir, "big")))
	must(t, os.Remove(filepath.Join(m.dir, "synced")))
	again := randomBytes(16 << 20)
	// (blocks come back once no reader can still fetch them: τ(1+δ)+10 s)
	waitFor(t, 60*time.Second, "writes to work again after the removals", func() bool {
		return writeSyncErr(filepath.Join(m.dir, "again"), again) == nil
	})
	wantSame(t, filepath.Join(m.dir, "again"), again)

	// Filled from outside, to the last block, and restarted: the server
	// gives up what it holds ahead (its reserve file, badger's next
	// write-ahead log) to open the store, and serves. (A removal on the
	// full disk took the reserve: it is taken again once the space is
	// back.)
	// the log says when the disk filled and when space came back, not
	// each change that fit between refused ones
	if n := strings.Count(s.output(), "refusing changes that add data"); n > 3 {
		t.Errorf("the server logged %d times that it refuses changes", n)
	}
	waitFor(t, 10*time.Second, "the server to hold its reserve file", func() bool {
		var st syscall.Stat_t
		return syscall.Stat(filepath.Join(s.dir, "space-reserve"), &st) == nil && st.Blocks > 0
	})
	filler, err := os.Create(filepath.Join(small, "filler"))
	must(t, err)
	chunk := make([]byte, 1<<20)
	for err == nil {
		_, err = filler.Write(chunk)
	}
	for n := len(chunk) >> 1; n > 0 && errors.Is(err, syscall.ENOSPC); n >>= 1 {
		_, err = filler.Write(chunk[:n]) // the last blocks
		if err == nil {
			err = syscall.ENOSPC // again with the same size
			n <<= 1
		}
	}
	filler.Close()
	s.restart(t)
	wantSame(t, filepath.Join(m.dir, "early"), early)
	wantSame(t, filepath.Join(m.dir, "again"), again)
	must(t, os.Remove(filepath.Join(small, "filler")))
	waitFor(t, 60*time.Second, "writes to work after the filler's removal", func() bool {
		return writeSyncErr(filepath.Join(m.dir, "late"), early) == nil
	})
}

func randomBytes(n int) []byte {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return b
}

// syncUntilFull writes path a MiB at a time, each fsynced, until a write or
// fsync fails, which must be with ENOSPC, and returns what was synced. (The
// file is opened and closed inside within: a close waits for a hung fsync,
// and must not keep the test from failing and cleaning up.)
func syncUntilFull(t *testing.T, path string) []byte {
	t.Helper()
	var synced []byte
	_, err := within(t, 2*time.Minute, "writing and syncing until the disk is full", func() error {
		f, err := os.Create(path)
		if err != nil {
			return err
		}
		defer f.Close()
		for {
			chunk := randomBytes(1 << 20)
			if _, err := f.Write(chunk); err != nil {
				return err
			}
			if err := f.Sync(); err != nil {
				return err
			}
			synced = append(synced, chunk...)
			if len(synced) > 1<<30 {
				return errors.New("1 GiB fitted on a small file system")
			}
		}
	})
	if !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("writing until the disk is full: %v, want ENOSPC", err)
	}
	return synced
}

func writeSyncErr(path string, data []byte) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// wantPrefix fails the test unless path starts with want.
func wantPrefix(t *testing.T, path string, want []byte) {
	t.Helper()
	got := make([]byte, len(want))
	_, err := within(t, time.Minute, "read "+path, func() error {
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = f.ReadAt(got, 0)
		return err
	})
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if !bytes.Equal(got, want) {
		i := 0
		for got[i] == want[i] {
			i++
		}
		t.Fatalf("%s differs from what was synced at byte %d of %d", path, i, len(want))
	}
}
