package integration

import (
	"os"
	"os/exec"
	"path/filepath"
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
