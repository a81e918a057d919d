package integration

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// TestPermissions: the mount is usable by every user of the machine, with
// the stored mode, uid and gid enforced by the kernel.
func TestPermissions(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to act as another user")
	}
	if _, err := exec.LookPath("setpriv"); err != nil {
		t.Skip("no setpriv")
	}
	s := startServer(t)
	m := startMount(t, s)
	asNobody := func(args ...string) (string, error) {
		cmd := exec.Command("setpriv", append([]string{"--reuid=65534", "--regid=65534", "--clear-groups"}, args...)...)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	// t.TempDir's directories are 0700: let other users reach the mount.
	must(t, os.Chmod(filepath.Dir(m.dir), 0o755))
	must(t, os.Chmod(filepath.Dir(filepath.Dir(m.dir)), 0o755))
	must(t, os.Chmod(m.dir, 0o755))
	must(t, os.WriteFile(filepath.Join(m.dir, "secret"), []byte("root only"), 0o600))
	must(t, os.WriteFile(filepath.Join(m.dir, "public"), []byte("everyone"), 0o644))
	if out, err := asNobody("cat", filepath.Join(m.dir, "public")); err != nil || out != "everyone" {
		t.Fatalf("nobody reads a 0644 file: %v %q", err, out)
	}
	if out, err := asNobody("cat", filepath.Join(m.dir, "secret")); err == nil || !strings.Contains(out, "Permission denied") {
		t.Fatalf("nobody read a 0600 root file: %v %q", err, out)
	}
	if out, err := asNobody("touch", filepath.Join(m.dir, "new")); err == nil {
		t.Fatalf("nobody created a file in a 0755 root directory: %q", out)
	}
	must(t, os.Mkdir(filepath.Join(m.dir, "shared"), 0o777))
	must(t, os.Chmod(filepath.Join(m.dir, "shared"), 0o777))
	if out, err := asNobody("sh", "-c", "umask 022 && echo hi > "+filepath.Join(m.dir, "shared", "mine")); err != nil {
		t.Fatalf("nobody writes in a 0777 directory: %v %q", err, out)
	}
	st, err := os.Stat(filepath.Join(m.dir, "shared", "mine"))
	must(t, err)
	if uid := st.Sys().(*syscall.Stat_t).Uid; uid != 65534 {
		t.Fatalf("file created by nobody is owned by %d", uid)
	}
	if st.Mode().Perm() != 0o644 {
		t.Fatalf("mode %v, want 0644 (the creator's umask, no server umask)", st.Mode().Perm())
	}
}

// asUser runs a command as uid and gid, with no other groups.
func asUser(uid int, args ...string) (string, error) {
	id := strconv.Itoa(uid)
	cmd := exec.Command("setpriv", append([]string{"--reuid=" + id, "--regid=" + id, "--clear-groups"}, args...)...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

const nobody = 65534

// needOtherUsers skips a test that acts as another user when it cannot.
func needOtherUsers(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to act as another user")
	}
	if _, err := exec.LookPath("setpriv"); err != nil {
		t.Skip("no setpriv")
	}
}

// reachable lets other users reach dir: t.TempDir's directories are 0700.
func reachable(t *testing.T, dir string) {
	t.Helper()
	for d := dir; d != "/" && d != os.TempDir(); d = filepath.Dir(d) {
		must(t, os.Chmod(d, 0o755))
	}
}

func modeOf(t *testing.T, p string) uint32 {
	t.Helper()
	var st syscall.Stat_t
	must(t, syscall.Stat(p, &st))
	return st.Mode &^ syscall.S_IFMT
}

// TestModeZero: a file or directory with no permission bits is closed to
// everyone but root, on every mount. go-fuse served such a mode as 0644 or
// 0755, and default_permissions let any user read the file.
func TestModeZero(t *testing.T) {
	needOtherUsers(t)
	s := startServer(t)
	m1 := startMount(t, s)
	m2 := startMount(t, s)
	reachable(t, m1.dir)
	reachable(t, m2.dir)
	must(t, os.WriteFile(filepath.Join(m1.dir, "s"), []byte("secret"), 0o644))
	must(t, os.Chmod(filepath.Join(m1.dir, "s"), 0))
	must(t, os.Mkdir(filepath.Join(m1.dir, "d"), 0o755))
	must(t, os.WriteFile(filepath.Join(m1.dir, "d", "in"), []byte("inside"), 0o644))
	must(t, os.Chmod(filepath.Join(m1.dir, "d"), 0))
	fd, err := syscall.Open(filepath.Join(m1.dir, "c"), syscall.O_CREAT|syscall.O_WRONLY, 0)
	must(t, err)
	syscall.Close(fd)
	must(t, syscall.Mkdir(filepath.Join(m1.dir, "md"), 0))
	for _, m := range []*mount{m1, m2} {
		for _, name := range []string{"s", "d", "c", "md"} {
			if mode := modeOf(t, filepath.Join(m.dir, name)); mode != 0 {
				t.Errorf("%s: mode %#o, want 0", filepath.Join(m.dir, name), mode)
			}
		}
		if out, err := asUser(nobody, "cat", filepath.Join(m.dir, "s")); err == nil || !strings.Contains(out, "Permission denied") {
			t.Errorf("nobody read a mode 000 file on %s: %v %q", m.dir, err, out)
		}
		if out, err := asUser(nobody, "ls", filepath.Join(m.dir, "d")); err == nil || !strings.Contains(out, "Permission denied") {
			t.Errorf("nobody listed a mode 000 directory on %s: %v %q", m.dir, err, out)
		}
		if out, err := asUser(nobody, "cat", filepath.Join(m.dir, "d", "in")); err == nil || !strings.Contains(out, "Permission denied") {
			t.Errorf("nobody went through a mode 000 directory on %s: %v %q", m.dir, err, out)
		}
		// root may, as on any file system
		if b, err := os.ReadFile(filepath.Join(m.dir, "s")); err != nil || string(b) != "secret" {
			t.Errorf("root reads a mode 000 file on %s: %v %q", m.dir, err, b)
		}
	}
}

// TestKillSuidgid: a write by a user without CAP_FSETID clears setuid, and
// setgid if the group may execute, however it changes the file (write,
// O_APPEND write, truncate, fallocate, copy_file_range), through the mount
// that made the file (which buffers the write under its lock) or another
// (which sends it at once), as on a local file system; root's writes keep
// them. Any write drops the file's capabilities (security.capability). The
// server kept both whoever wrote: a user could write into another's setuid
// or setcap program.
func TestKillSuidgid(t *testing.T) {
	needOtherUsers(t)
	s := startServer(t)
	m1 := startMount(t, s)
	m2 := startMount(t, s)
	ref := t.TempDir()
	for _, d := range []string{ref, m1.dir, m2.dir} {
		reachable(t, d)
	}
	py := "/usr/bin/python3" // not a shim in root's home: nobody runs it
	if _, err := os.Stat(py); err != nil {
		t.Skip("no " + py)
	}
	ops := map[string][]string{
		"write":     {"sh", "-c", `printf x 1<>"$0"`},
		"append":    {"sh", "-c", `printf x >>"$0"`},
		"truncate":  {"truncate", "-s", "0"},
		"fallocate": {py, "-c", "import os,sys; fd=os.open(sys.argv[1], os.O_WRONLY); os.posix_fallocate(fd, 0, 8192)"},
		"copy": {py, "-c", "import os,sys; s=os.open(sys.argv[1]+'.src', os.O_RDONLY); d=os.open(sys.argv[1], os.O_WRONLY); " +
			"n=os.copy_file_range(s, d, 4, 0, 0); assert n == 4, n"},
	}
	// who: root, nobody, and nobody with the files' group (root's) among
	// its supplementary groups
	users := map[string][]string{
		"root":   nil,
		"nobody": {"setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"},
		"member": {"setpriv", "--reuid=65534", "--regid=65534", "--groups=0"},
	}
	type key struct {
		op, user string
		mode     uint32
	}
	// run sets the file up in dir, then runs the case on it through opDir
	run := func(dir, opDir string, k key, name string) {
		p := filepath.Join(dir, name)
		must(t, os.WriteFile(p+".src", []byte("data"), 0o644))
		must(t, os.WriteFile(p, []byte("old"), 0o644))
		must(t, os.Chmod(p, os.FileMode(k.mode&0o777)|modeBits(k.mode)))
		must(t, syscall.Setxattr(p, "security.capability", capability, 0))
		args := append(append(slices.Clone(users[k.user]), ops[k.op]...), filepath.Join(opDir, name))
		if out, err := runErr(opDir, args[0], args[1:]...); err != nil {
			t.Fatalf("%v in %s: %v %s", k, opDir, err, out)
		}
	}
	n := 0
	for op := range ops {
		for user := range users {
			for _, mode := range []uint32{0o4777, 0o4767, 0o2777, 0o2767, 0o6777, 0o6767} {
				k := key{op, user, mode}
				name := fmt.Sprintf("f%d", n)
				n++
				// what the case leaves on a local file system (ext4 or
				// tmpfs here): Linux's rules
				run(ref, ref, k, name)
				want := modeOf(t, filepath.Join(ref, name))
				wantCap := hasXattr(t, filepath.Join(ref, name), "security.capability")
				if user == "root" && want != mode || user != "root" && want&syscall.S_ISUID != 0 {
					t.Fatalf("reference %v: mode %#o", k, want)
				}
				if user == "nobody" && mode&0o2010 == 0o2000 {
					// Setgid without group execute: Linux (6.x VFS)
					// drops it for a writer outside the file's group,
					// but FUSE's own rule for truncate and fallocate
					// (fuse_setattr) keeps it, and the file system
					// cannot see the writer's groups: leasefs keeps it
					// on every path, as the kernel does for the others.
					want |= syscall.S_ISGID
				}
				// set up on one mount, which holds the file's lock and
				// buffers the write; run there and on the other, which
				// sends it at once
				for i, m := range []*mount{m1, m2} {
					name := fmt.Sprintf("%s-%d", name, i)
					run(m1.dir, m.dir, k, name)
					for _, seen := range []*mount{m1, m2} {
						if got := modeOf(t, filepath.Join(seen.dir, name)); got != want {
							t.Errorf("%v through %s, seen on %s: mode %#o, want %#o", k, m.dir, seen.dir, got, want)
						}
						if got := hasXattr(t, filepath.Join(seen.dir, name), "security.capability"); got != wantCap {
							t.Errorf("%v through %s, seen on %s: file capabilities %v, want %v", k, m.dir, seen.dir, got, wantCap)
						}
					}
				}
			}
		}
	}
}

// TestCapabilityAfterWrite: file capabilities set after a write, while the
// mount still holds the write, stay: the write reaches the server first
// (which drops capabilities), then the setxattr.
func TestCapabilityAfterWrite(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to set file capabilities")
	}
	s := startServer(t)
	m1 := startMount(t, s)
	m2 := startMount(t, s)
	p := filepath.Join(m1.dir, "prog")
	f, err := os.Create(p)
	must(t, err)
	defer f.Close()
	_, err = f.Write([]byte("#!/bin/sh\n"))
	must(t, err)
	must(t, syscall.Setxattr(p, "security.capability", capability, 0))
	must(t, f.Close())
	for _, m := range []*mount{m1, m2} {
		if !hasXattr(t, filepath.Join(m.dir, "prog"), "security.capability") {
			t.Errorf("%s: capabilities set after the write are gone", m.dir)
		}
	}
}

// TestCapabilityDroppedByWrite: a mount that knows a file's capabilities
// (it read them) and writes to the file no longer reports them, whether it
// holds the write or sent it, as on a local file system.
func TestCapabilityDroppedByWrite(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to set file capabilities")
	}
	s := startServer(t)
	m1 := startMount(t, s)
	m2 := startMount(t, s)
	for i, flags := range []int{os.O_WRONLY, os.O_WRONLY | os.O_APPEND} { // buffered, sent at once
		p := filepath.Join(m1.dir, fmt.Sprint("prog", i))
		must(t, os.WriteFile(p, []byte("#!/bin/sh\n"), 0o755))
		must(t, syscall.Setxattr(p, "security.capability", capability, 0))
		if !hasXattr(t, p, "security.capability") { // now cached
			t.Fatal("capabilities not set")
		}
		f, err := os.OpenFile(p, flags, 0)
		must(t, err)
		_, err = f.Write([]byte("exit 0\n"))
		must(t, err)
		if hasXattr(t, p, "security.capability") {
			t.Errorf("flags %#x: capabilities still there after a write, before close", flags)
		}
		must(t, f.Close())
		for _, m := range []*mount{m1, m2} {
			if hasXattr(t, filepath.Join(m.dir, filepath.Base(p)), "security.capability") {
				t.Errorf("flags %#x: %s: capabilities still there after a write", flags, m.dir)
			}
		}
	}
}

// capability is a security.capability value (revision 2, effective,
// CAP_CHOWN permitted): file capabilities are privileges a write drops.
var capability = []byte{1, 0, 0, 2, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}

func hasXattr(t *testing.T, p, name string) bool {
	t.Helper()
	_, err := syscall.Getxattr(p, name, nil)
	if err != nil && !errors.Is(err, syscall.ENODATA) {
		t.Fatalf("getxattr %s %s: %v", p, name, err)
	}
	return err == nil
}

// modeBits converts setuid, setgid and sticky to os.FileMode.
func modeBits(mode uint32) os.FileMode {
	var m os.FileMode
	if mode&syscall.S_ISUID != 0 {
		m |= os.ModeSetuid
	}
	if mode&syscall.S_ISGID != 0 {
		m |= os.ModeSetgid
	}
	if mode&syscall.S_ISVTX != 0 {
		m |= os.ModeSticky
	}
	return m
}
