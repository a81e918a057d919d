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

// TestMountHelper mounts as an operator does: `mount -t fuse.leasefs` and
// a line of an fstab, through mount(8) and mount.fuse3 (fuse3), which find
// `leasefs` on the PATH they set. It runs in a mount namespace of its own
// where a directory holding only this build's binary is bound over
// /usr/local/sbin, so the machine's own directories are left alone. mount
// returns once the file system is there; umount ends the mount's process.
func TestMountHelper(t *testing.T) {
	requireFUSE(t)
	for _, tool := range []string{"unshare", "mount", "mount.fuse3"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not installed (fuse3, util-linux)", tool)
		}
	}
	s := startServer(t)
	dir := t.TempDir()
	bin := filepath.Join(dir, "bin")
	must(t, os.Mkdir(bin, 0o755))
	must(t, os.Symlink(binary, filepath.Join(bin, "leasefs")))
	mnt := filepath.Join(dir, "mnt")
	must(t, os.Mkdir(mnt, 0o755))
	fstab := filepath.Join(dir, "fstab")
	must(t, os.WriteFile(fstab, []byte(s.addr+" "+mnt+" fuse.leasefs token_file="+s.tokenFile+
		",_netdev,nofail,ro,x-systemd.mount-timeout=30,log_file="+filepath.Join(dir, "fstab.log")+" 0 0\n"), 0o644))
	t.Cleanup(func() { killServing(t, mnt) })

	script := `set -e
mount --bind "$BIN" /usr/local/sbin
mount -t fuse.leasefs "$ADDR" "$MNT" -o "token_file=$TOKEN,_netdev,nofail,x-systemd.automount,cache_mib=64,log_file=$DIR/mount.log"
grep -q " $MNT fuse.leasefs " /proc/self/mounts && echo "type ok"
echo hello > "$MNT/f"
cat "$MNT/f"
umount "$MNT"
mount -T "$FSTAB" "$MNT"
cat "$MNT/f"
if echo x > "$MNT/g" 2>/dev/null; then echo "wrote to a read-only mount"; exit 3; fi
umount "$MNT"
if mount -t fuse.leasefs "$ADDR" "$MNT" -o token_file=$TOKEN,bogus 2>&1; then exit 4; fi
`
	cmd := exec.Command("unshare", "-m", "sh", "-c", script)
	cmd.Env = append(os.Environ(), "BIN="+bin, "ADDR="+s.addr, "MNT="+mnt, "TOKEN="+s.tokenFile, "DIR="+dir, "FSTAB="+fstab)
	out, err := cmd.CombinedOutput()
	if err != nil {
		log, _ := os.ReadFile(filepath.Join(dir, "mount.log"))
		t.Fatalf("%v:\n%s\nmount log:\n%s", err, out, log)
	}
	for _, w := range []string{"type ok", `unknown mount option "bogus"`} {
		if !strings.Contains(string(out), w) {
			t.Errorf("output lacks %q:\n%s", w, out)
		}
	}
	if n := strings.Count(string(out), "hello"); n != 2 || strings.Contains(string(out), "leasefs: mounted") {
		t.Errorf("want the file read on both mounts, and mount(8) quiet on success:\n%s", out)
	}
	if log, _ := os.ReadFile(filepath.Join(dir, "mount.log")); !strings.Contains(string(log), `msg=mounted`) ||
		!strings.Contains(string(log), `msg=stopped`) {
		t.Errorf("the background mount's log:\n%s", log)
	}
}

// killServing kills the processes still serving mnt (a failed test's
// background mounts), which only this test started.
func killServing(t *testing.T, mnt string) {
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil || !strings.Contains(string(b), mnt) || !strings.Contains(string(b), "mount") {
			continue
		}
		pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(p)))
		if pid > 0 && pid != os.Getpid() {
			t.Logf("killing background mount %d: %q", pid, strings.ReplaceAll(string(b), "\x00", " "))
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}
