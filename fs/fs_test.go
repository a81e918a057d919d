package fs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/leasefs/leasefs/client"
	"github.com/leasefs/leasefs/metaserver"
	"github.com/leasefs/leasefs/transport"
)

// Tests of the FUSE side through real mounts in temporary directories, of
// a metadata server in this process; they need /dev/fuse and the right to
// mount (root).

// startServer runs a metadata server in this process.
func startServer(t *testing.T) *metaserver.Server {
	t.Helper()
	cfg := metaserver.DefaultConfig()
	cfg.Dir = t.TempDir()
	cfg.Listen = "127.0.0.1:0"
	cfg.Logger = slog.New(slog.DiscardHandler)
	s, err := metaserver.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// mount mounts a new client of s in a temporary directory, unmounted when
// the test ends, and returns the directory.
func mount(t *testing.T, s *metaserver.Server) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("mounting needs root")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skip("no /dev/fuse")
	}
	tok, err := transport.ParseToken(s.Token())
	if err != nil {
		t.Fatal(err)
	}
	cfg := client.DefaultConfig()
	cfg.Servers = []string{s.Addr().String()}
	cfg.Token = tok
	cfg.Logger = slog.New(slog.DiscardHandler)
	c, err := client.New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	dir := t.TempDir()
	srv, err := Mount(dir, c, MountOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := srv.Unmount(); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
	return dir
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestLookupCreateWriteRead: a file created and written on one mount is
// found, with its size and bytes, on it and on another mount of the same
// server; a name never made is not.
func TestLookupCreateWriteRead(t *testing.T) {
	s := startServer(t)
	a, b := mount(t, s), mount(t, s)
	data := bytes.Repeat([]byte("leasefs "), 300_000) // 2.4 MB: several writes
	must(t, os.Mkdir(filepath.Join(a, "d"), 0o755))
	must(t, os.WriteFile(filepath.Join(a, "d", "f"), data, 0o644))
	for _, m := range []string{a, b} {
		p := filepath.Join(m, "d", "f")
		st, err := os.Stat(p)
		must(t, err)
		if st.Size() != int64(len(data)) || st.Mode() != 0o644 || !st.Mode().IsRegular() {
			t.Errorf("%s: size %d, mode %v; want %d, -rw-r--r--", p, st.Size(), st.Mode(), len(data))
		}
		got, err := os.ReadFile(p)
		must(t, err)
		if !bytes.Equal(got, data) {
			t.Errorf("%s: read %d bytes, not what was written", p, len(got))
		}
		if _, err := os.Stat(filepath.Join(m, "d", "nothing")); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("a name never made: %v, want ENOENT", err)
		}
	}
	// an overwrite in the middle, and an append, seen by the other mount
	f, err := os.OpenFile(filepath.Join(b, "d", "f"), os.O_RDWR, 0)
	must(t, err)
	_, err = f.WriteAt([]byte("MIDDLE"), 1000)
	must(t, err)
	must(t, f.Close())
	f, err = os.OpenFile(filepath.Join(b, "d", "f"), os.O_WRONLY|os.O_APPEND, 0)
	must(t, err)
	_, err = f.Write([]byte("END"))
	must(t, err)
	must(t, f.Close())
	want := append(slices.Clone(data), "END"...)
	copy(want[1000:], "MIDDLE")
	got, err := os.ReadFile(filepath.Join(a, "d", "f"))
	must(t, err)
	if !bytes.Equal(got, want) {
		t.Errorf("after another mount's writes: read %d bytes, not the %d written", len(got), len(want))
	}
}

// TestSetattr: chmod, chown, truncate and utimes, seen on the mount that
// made them and on another.
func TestSetattr(t *testing.T) {
	s := startServer(t)
	a, b := mount(t, s), mount(t, s)
	p := filepath.Join(a, "f")
	must(t, os.WriteFile(p, []byte("0123456789"), 0o644))
	must(t, os.Chmod(p, 0o600))
	must(t, os.Chown(p, 1234, 5678))
	must(t, os.Truncate(p, 4))
	mtime := time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC)
	must(t, os.Chtimes(p, mtime, mtime))
	for _, m := range []string{a, b} {
		p := filepath.Join(m, "f")
		st, err := os.Stat(p)
		must(t, err)
		sys := st.Sys().(*syscall.Stat_t)
		if st.Mode().Perm() != 0o600 || sys.Uid != 1234 || sys.Gid != 5678 || st.Size() != 4 || !st.ModTime().Equal(mtime) {
			t.Errorf("%s: mode %v, owner %d:%d, size %d, mtime %v; want -rw-------, 1234:5678, 4, %v",
				p, st.Mode(), sys.Uid, sys.Gid, st.Size(), st.ModTime().UTC(), mtime)
		}
		got, err := os.ReadFile(p)
		must(t, err)
		if string(got) != "0123" {
			t.Errorf("%s holds %q after truncating to 4", p, got)
		}
	}
	// extended by truncate: zeros
	must(t, os.Truncate(filepath.Join(b, "f"), 8))
	got, err := os.ReadFile(p)
	must(t, err)
	if string(got) != "0123\x00\x00\x00\x00" {
		t.Errorf("after truncating up to 8: %q", got)
	}
}

// TestReaddir: a directory lists every name made in it, with its type,
// once, and not the names removed.
func TestReaddir(t *testing.T) {
	s := startServer(t)
	a, b := mount(t, s), mount(t, s)
	d := filepath.Join(a, "d")
	must(t, os.Mkdir(d, 0o755))
	var want []string
	for i := range 700 { // more than one page of a listing (client.ReadDirPage)
		name := fmt.Sprintf("f%04d", i)
		must(t, os.WriteFile(filepath.Join(d, name), nil, 0o644))
		want = append(want, name)
	}
	must(t, os.Mkdir(filepath.Join(d, "sub"), 0o755))
	must(t, os.Symlink("f0000", filepath.Join(d, "link")))
	for i := 0; i < 700; i += 7 {
		must(t, os.Remove(filepath.Join(d, want[i])))
		want[i] = ""
	}
	want = slices.DeleteFunc(want, func(s string) bool { return s == "" })
	want = append(want, "link", "sub")
	slices.Sort(want)
	for _, m := range []string{a, b} {
		ents, err := os.ReadDir(filepath.Join(m, "d"))
		must(t, err)
		var got []string
		for _, e := range ents {
			got = append(got, e.Name())
			wantType := os.FileMode(0)
			switch e.Name() {
			case "sub":
				wantType = os.ModeDir
			case "link":
				wantType = os.ModeSymlink
			}
			if e.Type() != wantType {
				t.Errorf("%s: %s has type %v, want %v", m, e.Name(), e.Type(), wantType)
			}
		}
		if !slices.Equal(got, want) {
			t.Errorf("%s: %d names listed, want %d (first difference near %q)", m, len(got), len(want), firstDiff(got, want))
		}
	}
}

func firstDiff(a, b []string) string {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return a[i] + " / " + b[i]
		}
	}
	return "the end"
}

// TestXattr: extended attributes set, read, listed and removed, on the
// mount that set them and on another.
func TestXattr(t *testing.T) {
	s := startServer(t)
	a, b := mount(t, s), mount(t, s)
	p := filepath.Join(a, "f")
	must(t, os.WriteFile(p, nil, 0o644))
	must(t, syscall.Setxattr(p, "user.one", []byte("1"), 0))
	must(t, syscall.Setxattr(p, "user.two", []byte("second value"), 0))
	if err := syscall.Setxattr(p, "user.one", []byte("again"), 1 /* XATTR_CREATE */); err != syscall.EEXIST {
		t.Errorf("XATTR_CREATE of an existing name: %v, want EEXIST", err)
	}
	for _, m := range []string{a, b} {
		p := filepath.Join(m, "f")
		buf := make([]byte, 64)
		n, err := syscall.Getxattr(p, "user.two", buf)
		must(t, err)
		if string(buf[:n]) != "second value" {
			t.Errorf("%s: user.two is %q", p, buf[:n])
		}
		if _, err := syscall.Getxattr(p, "user.two", make([]byte, 2)); err != syscall.ERANGE {
			t.Errorf("%s: a short buffer: %v, want ERANGE", p, err)
		}
		n, err = syscall.Listxattr(p, buf)
		must(t, err)
		names := strings.Split(strings.TrimSuffix(string(buf[:n]), "\x00"), "\x00")
		slices.Sort(names)
		if !slices.Equal(names, []string{"user.one", "user.two"}) {
			t.Errorf("%s: names %q", p, names)
		}
	}
	must(t, syscall.Removexattr(filepath.Join(b, "f"), "user.one"))
	if _, err := syscall.Getxattr(p, "user.one", make([]byte, 64)); err != syscall.ENODATA {
		t.Errorf("a removed attribute: %v, want ENODATA", err)
	}
}

// TestRename: renames within a directory, across directories, over an
// existing file, and of a directory, seen on another mount.
func TestRename(t *testing.T) {
	s := startServer(t)
	a, b := mount(t, s), mount(t, s)
	must(t, os.MkdirAll(filepath.Join(a, "x", "inner"), 0o755))
	must(t, os.Mkdir(filepath.Join(a, "y"), 0o755))
	must(t, os.WriteFile(filepath.Join(a, "x", "f"), []byte("f"), 0o644))
	must(t, os.WriteFile(filepath.Join(a, "x", "g"), []byte("g"), 0o644))
	must(t, os.WriteFile(filepath.Join(a, "y", "old"), []byte("old"), 0o644))
	must(t, os.Rename(filepath.Join(a, "x", "f"), filepath.Join(a, "x", "f2")))
	must(t, os.Rename(filepath.Join(a, "x", "g"), filepath.Join(a, "y", "g")))
	must(t, os.Rename(filepath.Join(a, "x", "f2"), filepath.Join(a, "y", "old")))
	must(t, os.Rename(filepath.Join(a, "x", "inner"), filepath.Join(a, "y", "inner")))
	if err := os.Rename(filepath.Join(a, "y"), filepath.Join(a, "y", "inner", "loop")); !errors.Is(err, syscall.EINVAL) {
		t.Errorf("a directory into itself: %v, want EINVAL", err)
	}
	for _, m := range []string{a, b} {
		for name, want := range map[string]string{"y/g": "g", "y/old": "f"} {
			got, err := os.ReadFile(filepath.Join(m, name))
			if err != nil || string(got) != want {
				t.Errorf("%s/%s: %q (%v), want %q", m, name, got, err, want)
			}
		}
		for _, gone := range []string{"x/f", "x/f2", "x/g", "x/inner"} {
			if _, err := os.Lstat(filepath.Join(m, gone)); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("%s/%s after renaming it away: %v", m, gone, err)
			}
		}
		if st, err := os.Stat(filepath.Join(m, "y", "inner")); err != nil || !st.IsDir() {
			t.Errorf("%s/y/inner: %v", m, err)
		}
		ents, err := os.ReadDir(filepath.Join(m, "x"))
		must(t, err)
		if len(ents) != 0 {
			t.Errorf("%s/x still lists %d names", m, len(ents))
		}
	}
}
