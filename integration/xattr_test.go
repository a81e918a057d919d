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

	"github.com/leasefs/leasefs/internal/testnet"
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

// getxattr returns path's extended attribute name, or the errno.
func getxattr(path, name string) (string, error) {
	buf := make([]byte, 256)
	n, err := syscall.Getxattr(path, name, buf)
	if err != nil {
		return "", err
	}
	return string(buf[:n]), nil
}

// TestXattrCache: ls -l asks for two extended attributes
// of every file, which a mount caches with their absence under the file's
// lock: a repeated ls -l of 500 files on a second mount costs the server
// a few requests, not two per file, and no error (a missing attribute is
// a normal answer, as a missing name is). What a mount caches goes with its
// lock: another mount's setxattr is seen, and so is this mount's own.
func TestXattrCache(t *testing.T) {
	s := startServer(t, "--admin", testnet.TCPAddr(t))
	a, b := startMount(t, s), startMount(t, s)
	const files = 500
	must(t, os.Mkdir(filepath.Join(a.dir, "d"), 0o755))
	for i := range files {
		must(t, os.WriteFile(filepath.Join(a.dir, "d", fmt.Sprint("f", i)), []byte("x"), 0o644))
	}
	must(t, a.sync())
	errs0 := adminCounters(t, s).Errors
	run(t, "", "ls", "-l", filepath.Join(b.dir, "d"))
	req1 := adminCounters(t, s).Requests
	run(t, "", "ls", "-l", filepath.Join(b.dir, "d"))
	req2 := adminCounters(t, s).Requests
	t.Logf("second ls -l of %d files: %d server requests", files, req2-req1)
	if req2-req1 >= 50 {
		t.Errorf("a second ls -l of %d files cost %d server requests, want under 50", files, req2-req1)
	}
	// normal answers are no errors: missing names and attributes, a lock
	// another holds (flock -n)
	if _, err := os.Stat(filepath.Join(b.dir, "d", "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("stat of a missing name: %v", err)
	}
	lockA, err := os.Open(filepath.Join(a.dir, "d", "f1"))
	must(t, err)
	defer lockA.Close()
	lockB, err := os.Open(filepath.Join(b.dir, "d", "f1"))
	must(t, err)
	defer lockB.Close()
	must(t, syscall.Flock(int(lockA.Fd()), syscall.LOCK_EX))
	if err := syscall.Flock(int(lockB.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != syscall.EWOULDBLOCK {
		t.Fatalf("flock -n of a file locked elsewhere: %v", err)
	}
	if errs := adminCounters(t, s).Errors; errs != errs0 {
		t.Errorf("ls -l, a lookup of a missing name and flock -n counted %d request errors, want none", errs-errs0)
	}
	for _, line := range strings.Split(s.output(), "\n") {
		if strings.Contains(line, "request failed") {
			t.Errorf("the server logged a normal answer as a failure: %s", line)
		}
	}

	// b caches f0's absent user.x; a's setxattr takes b's lock first
	f0a, f0b := filepath.Join(a.dir, "d", "f0"), filepath.Join(b.dir, "d", "f0")
	if _, err := getxattr(f0b, "user.x"); err != syscall.ENODATA {
		t.Fatalf("b: user.x before it was set: %v", err)
	}
	must(t, syscall.Setxattr(f0a, "user.x", []byte("from a"), 0))
	if v, err := getxattr(f0b, "user.x"); err != nil || v != "from a" {
		t.Fatalf("b: user.x after a set it: %q %v", v, err)
	}
	// this mount's own changes: set, replace, list, remove
	must(t, syscall.Setxattr(f0b, "user.x", []byte("from b"), 0))
	if v, err := getxattr(f0b, "user.x"); err != nil || v != "from b" {
		t.Fatalf("b: user.x after b replaced it: %q %v", v, err)
	}
	buf := make([]byte, 256)
	n, err := syscall.Listxattr(f0b, buf)
	must(t, err)
	if got := string(buf[:n]); got != "user.x\x00" {
		t.Fatalf("b lists %q", got)
	}
	must(t, syscall.Removexattr(f0b, "user.x"))
	if _, err := getxattr(f0b, "user.x"); err != syscall.ENODATA {
		t.Fatalf("b: user.x after b removed it: %v", err)
	}
	if n, err := syscall.Listxattr(f0b, buf); err != nil || n != 0 {
		t.Fatalf("b lists %q %v after removing its only attribute", buf[:n], err)
	}
	if _, err := getxattr(f0a, "user.x"); err != syscall.ENODATA {
		t.Fatalf("a: user.x after b removed it: %v", err)
	}
	// a file this mount just made has none; one it sets on it is seen
	nf := filepath.Join(b.dir, "d", "new")
	must(t, os.WriteFile(nf, nil, 0o644))
	if _, err := getxattr(nf, "user.y"); err != syscall.ENODATA {
		t.Fatalf("new file: user.y: %v", err)
	}
	must(t, syscall.Setxattr(nf, "user.y", []byte("y"), 0))
	if v, err := getxattr(filepath.Join(a.dir, "d", "new"), "user.y"); err != nil || v != "y" {
		t.Fatalf("a: new file's user.y: %q %v", v, err)
	}
}
