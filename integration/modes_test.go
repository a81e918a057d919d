package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// modeOps makes, in dir, one inode per way a mode is given and per mode
// from 0000 to 7777: open(O_CREAT), mknod of a regular file, mkdir, and
// chmod of a file and of a directory. The umask is 0, so every bit the
// caller gives reaches the file system.
var modeOps = []struct {
	prefix string
	make   func(p string, m uint32) error
}{
	{"c", func(p string, m uint32) error {
		fd, err := syscall.Open(p, syscall.O_CREAT|syscall.O_EXCL|syscall.O_WRONLY, m)
		if err == nil {
			err = syscall.Close(fd)
		}
		return err
	}},
	{"n", func(p string, m uint32) error { return syscall.Mknod(p, syscall.S_IFREG|m, 0) }},
	{"d", func(p string, m uint32) error { return syscall.Mkdir(p, m) }},
	{"h", func(p string, m uint32) error {
		fd, err := syscall.Open(p, syscall.O_CREAT|syscall.O_EXCL|syscall.O_WRONLY, 0o600)
		if err != nil {
			return err
		}
		syscall.Close(fd)
		return syscall.Chmod(p, m)
	}},
	{"D", func(p string, m uint32) error {
		if err := syscall.Mkdir(p, 0o700); err != nil {
			return err
		}
		return syscall.Chmod(p, m)
	}},
}

func makeModes(t *testing.T, dir string) {
	t.Helper()
	for _, op := range modeOps {
		for m := uint32(0); m <= 0o7777; m++ {
			p := filepath.Join(dir, fmt.Sprintf("%s%04o", op.prefix, m))
			if err := op.make(p, m); err != nil {
				t.Fatalf("%s: %v", p, err)
			}
		}
	}
}

// modesOf returns the mode (type and permission bits) of every entry of
// dir, stat'ed by a few goroutines at once (another mount's stat of an
// inode waits for the writer to give up its lock).
func modesOf(t *testing.T, dir string) map[string]uint32 {
	t.Helper()
	ents, err := os.ReadDir(dir)
	must(t, err)
	modes := make([]uint32, len(ents))
	errs := make(chan error, 8)
	for w := range cap(errs) {
		go func() {
			var err error
			for i := w; i < len(ents) && err == nil; i += cap(errs) {
				var st syscall.Stat_t
				err = syscall.Lstat(filepath.Join(dir, ents[i].Name()), &st)
				modes[i] = st.Mode
			}
			errs <- err
		}()
	}
	for range cap(errs) {
		must(t, <-errs)
	}
	out := make(map[string]uint32, len(ents))
	for i, e := range ents {
		out[e.Name()] = modes[i]
	}
	return out
}

func compareModes(t *testing.T, where string, got, want map[string]uint32) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d entries, want %d", where, len(got), len(want))
	}
	var bad []string
	for name, w := range want {
		if g := got[name]; g != w {
			bad = append(bad, fmt.Sprintf("%s: %#o, want %#o", name, g, w))
		}
	}
	if len(bad) > 0 {
		if len(bad) > 20 {
			bad = append(bad[:20], fmt.Sprintf("... %d more", len(bad)-20))
		}
		t.Fatalf("%s: %d modes differ from a local file system's:\n%s", where, len(bad), strings.Join(bad, "\n"))
	}
}

// TestModesRoundTrip: every mode from 0000 to 7777, given by create,
// mknod, mkdir or chmod, is what stat shows, on the writing mount and on
// another, as on a local file system (the reference: mkdir drops setuid and
// setgid, for one). go-fuse served a mode without permission bits as 0644
// or 0755 unless told not to, so chmod 000 let everyone in.
func TestModesRoundTrip(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: setuid, setgid and other owners' modes")
	}
	s := startServer(t)
	m1 := startMount(t, s)
	m2 := startMount(t, s)
	old := syscall.Umask(0)
	t.Cleanup(func() { syscall.Umask(old) })

	ref := t.TempDir()
	makeModes(t, ref)
	want := modesOf(t, ref)

	dir := filepath.Join(m1.dir, "modes")
	must(t, os.Mkdir(dir, 0o755))
	makeModes(t, dir)
	compareModes(t, "writing mount", modesOf(t, dir), want)
	compareModes(t, "other mount", modesOf(t, filepath.Join(m2.dir, "modes")), want)
}
