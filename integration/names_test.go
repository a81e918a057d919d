package integration

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestNameTooLong: a name over 255 bytes is ENAMETOOLONG for every
// operation that takes one, in a directory the mount holds whole in its
// cache (it made it) as in one it must ask the server about, and an
// extended attribute's name over 255 bytes is ERANGE. The cache answered
// ENOENT for a name it could not hold.
func TestNameTooLong(t *testing.T) {
	s := startServer(t)
	m1 := startMount(t, s)
	m2 := startMount(t, s)
	ops := []struct {
		name string
		op   func(d, f, long string) error
	}{
		{"stat", func(d, f, long string) error { _, err := os.Lstat(long); return err }},
		{"open", func(d, f, long string) error { _, err := os.Open(long); return err }},
		{"create", func(d, f, long string) error { return os.WriteFile(long, nil, 0o644) }},
		{"mkdir", func(d, f, long string) error { return os.Mkdir(long, 0o755) }},
		{"mknod", func(d, f, long string) error { return syscall.Mknod(long, syscall.S_IFIFO|0o644, 0) }},
		{"symlink", func(d, f, long string) error { return os.Symlink("f", long) }},
		{"link", func(d, f, long string) error { return os.Link(f, long) }},
		{"rename to", func(d, f, long string) error { return os.Rename(f, long) }},
		{"rename from", func(d, f, long string) error { return os.Rename(long, f) }},
		{"rename across", func(d, f, long string) error {
			return os.Rename(f, filepath.Join(filepath.Dir(d), filepath.Base(long)))
		}},
		{"unlink", func(d, f, long string) error { return syscall.Unlink(long) }},
		{"rmdir", func(d, f, long string) error { return syscall.Rmdir(long) }},
		{"getxattr", func(d, f, long string) error { _, err := getxattr(long, "user.x"); return err }},
		{"setxattr", func(d, f, long string) error { return syscall.Setxattr(long, "user.x", nil, 0) }},
	}
	// Each case in a directory of its own: one the mount made, so it
	// holds it whole (a failed change makes it forget that), and one
	// another mount made, which it asks the server about.
	i := 0
	dirs := func() (mine, theirs string) {
		i++
		mine, theirs = filepath.Join(m1.dir, fmt.Sprint("mine", i)), filepath.Join(m2.dir, fmt.Sprint("theirs", i))
		for _, d := range []string{mine, theirs} {
			must(t, os.Mkdir(d, 0o755))
			must(t, os.WriteFile(filepath.Join(d, "f"), nil, 0o644))
		}
		return mine, filepath.Join(m1.dir, filepath.Base(theirs))
	}
	for _, c := range ops {
		for _, n := range []int{256, 1000} {
			mine, theirs := dirs()
			for _, d := range []string{mine, theirs} {
				if _, err := os.ReadDir(d); err != nil {
					t.Fatal(err)
				}
				long := filepath.Join(d, strings.Repeat("n", n))
				if err := c.op(d, filepath.Join(d, "f"), long); !errors.Is(err, syscall.ENAMETOOLONG) {
					t.Errorf("%s of a %d-byte name in %s: %v, want ENAMETOOLONG", c.name, n, filepath.Base(d), err)
				}
			}
		}
	}
	xname := "user." + strings.Repeat("x", 251)
	for name, op := range map[string]func(f string) error{
		"getxattr":    func(f string) error { _, err := getxattr(f, xname); return err },
		"setxattr":    func(f string) error { return syscall.Setxattr(f, xname, []byte("v"), 0) },
		"removexattr": func(f string) error { return syscall.Removexattr(f, xname) },
	} {
		mine, theirs := dirs()
		for _, d := range []string{mine, theirs} {
			if err := op(filepath.Join(d, "f")); !errors.Is(err, syscall.ERANGE) {
				t.Errorf("%s of a %d-byte attribute name in %s: %v, want ERANGE", name, len(xname), filepath.Base(d), err)
			}
		}
	}
	// and 255 bytes is a name like any other
	mine, _ := dirs()
	ok := filepath.Join(mine, strings.Repeat("o", 255))
	must(t, os.WriteFile(ok, []byte("x"), 0o644))
	if _, err := os.Stat(filepath.Join(m2.dir, filepath.Base(mine), filepath.Base(ok))); err != nil {
		t.Errorf("a 255-byte name: %v", err)
	}
}
