package integration

import (
	"os"
	"os/exec"
	"path/filepath"
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
