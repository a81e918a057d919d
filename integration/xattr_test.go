package integration

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// asNobody runs this test binary's test function test as user nobody
// (setpriv), with arg as its helper argument, and returns its output. The
// binary is copied where nobody may run it.
func asNobody(t *testing.T, test, arg string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to act as another user")
	}
	if _, err := exec.LookPath("setpriv"); err != nil {
		t.Skip("no setpriv")
	}
	dir, err := os.MkdirTemp("", "leasefs-nobody")
	must(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	must(t, os.Chmod(dir, 0o755))
	exe := filepath.Join(dir, "integration.test")
	b, err := os.ReadFile(os.Args[0])
	must(t, err)
	must(t, os.WriteFile(exe, b, 0o755))
	cmd := exec.Command("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
		exe, "-test.run=^"+test+"$", "-test.timeout=1m")
	cmd.Env = append(os.Environ(), helperEnv+"="+arg)
	cmd.Dir = dir
	out, _ := cmd.CombinedOutput()
	return string(out)
}

// TestStatusXattrOwner: the mount's user.leasefs.status xattr is for the
// mount's owner and root; another user of the (shared) mount gets EACCES,
// while the file's ordinary xattrs stay readable to it.
func TestStatusXattrOwner(t *testing.T) {
	s := startServer(t)
	m := startMount(t, s)
	// t.TempDir's directories are 0700: let other users reach the mount.
	must(t, os.Chmod(filepath.Dir(m.dir), 0o755))
	must(t, os.Chmod(filepath.Dir(filepath.Dir(m.dir)), 0o755))
	must(t, os.Chmod(m.dir, 0o755))
	f := filepath.Join(m.dir, "f")
	must(t, os.WriteFile(f, []byte("x"), 0o644))
	must(t, syscall.Setxattr(f, "user.note", []byte("public"), 0))

	buf := make([]byte, 64<<10)
	n, err := syscall.Getxattr(f, "user.leasefs.status", buf)
	if err != nil || !json.Valid(buf[:n]) {
		t.Fatalf("root reads the status xattr: %v %q", err, buf[:n])
	}
	out := asNobody(t, "TestStatusXattrOwnerHelper", f)
	if !strings.Contains(out, "user.leasefs.status: permission denied") || !strings.Contains(out, "user.note: public") {
		t.Fatalf("as nobody:\n%s", out)
	}
}

// TestStatusXattrOwnerHelper is TestStatusXattrOwner's process running as
// another user: it prints what getxattr gives it.
func TestStatusXattrOwnerHelper(t *testing.T) {
	path := helperArg()
	if path == "" {
		t.Skip("run by TestStatusXattrOwner")
	}
	for _, name := range []string{"user.leasefs.status", "user.note"} {
		buf := make([]byte, 64<<10)
		n, err := syscall.Getxattr(path, name, buf)
		if err != nil {
			fmt.Printf("%s: %v\n", name, err)
		} else {
			fmt.Printf("%s: %s\n", name, buf[:n])
		}
	}
}

// TestXattrListBound: setxattr refuses (ENOSPC) the name that would make a
// file's names list longer than listxattr can return (64 KiB), so that
// listxattr keeps working; removing a name makes room again.
func TestXattrListBound(t *testing.T) {
	s := startServer(t)
	m := startMount(t, s)
	f := filepath.Join(m.dir, "f")
	must(t, os.WriteFile(f, nil, 0o644))
	// 255-byte names: 256 bytes each in the list, 256 of them fill it
	name := func(i int) string { return fmt.Sprintf("user.%03d.%s", i, strings.Repeat("n", 255-9)) }
	set, full := 0, 0
	for i := range 400 {
		switch err := syscall.Setxattr(f, name(i), []byte("v"), 0); {
		case err == nil:
			set++
		case errors.Is(err, syscall.ENOSPC):
			full++
		default:
			t.Fatalf("setxattr %d: %v", i, err)
		}
	}
	if set != 256 || full != 400-256 {
		t.Fatalf("%d names set, %d refused: want 256 and %d", set, full, 400-256)
	}
	list := make([]byte, 64<<10)
	n, err := syscall.Listxattr(f, list)
	if err != nil || n != 64<<10 || bytes.Count(list[:n], []byte{0}) != 256 {
		t.Fatalf("listxattr: %d bytes, %v", n, err)
	}
	must(t, syscall.Removexattr(f, name(0)))
	must(t, syscall.Setxattr(f, name(399), []byte("v"), 0))
	if err := syscall.Setxattr(f, name(398), []byte("v"), 0); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("setxattr past the bound after a removal: %v, want ENOSPC", err)
	}
	if _, err := syscall.Listxattr(f, list); err != nil {
		t.Fatalf("listxattr: %v", err)
	}
}
