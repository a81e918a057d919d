package mounts

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

const sample = `22 1 0:21 / /proc rw,nosuid,nodev,noexec,relatime shared:12 - proc proc rw
36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue
45 27 0:42 / /tmp/a\040b/mnt rw,nosuid,nodev,relatime - fuse.leasefs leasefs rw,user_id=1000,group_id=1000,default_permissions
46 45 0:43 / /tmp/a\040b/mnt rw,relatime shared:7 master:3 - tmpfs tmp\134fs rw
`

func TestParse(t *testing.T) {
	ms, err := Parse([]byte(sample))
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != 4 {
		t.Fatalf("%d mounts, want 4", len(ms))
	}
	m := ms[2]
	if m.ID != 45 || m.Parent != 27 || m.Major != 0 || m.Minor != 42 || m.Point != "/tmp/a b/mnt" ||
		m.FSType != "fuse.leasefs" || m.Source != "leasefs" || !m.IsFUSE() {
		t.Errorf("fuse line: %+v", m)
	}
	if uid, ok := m.UserID(); !ok || uid != 1000 {
		t.Errorf("user_id: %d %v", uid, ok)
	}
	if ms[1].Root != "/mnt1" || ms[1].Point != "/mnt2" || ms[1].Super != "rw,errors=continue" || ms[1].IsFUSE() {
		t.Errorf("ext3 line: %+v", ms[1])
	}
	if ms[3].Source != `tmp\fs` || ms[3].FSType != "tmpfs" {
		t.Errorf("optional fields and escapes: %+v", ms[3])
	}
	if _, ok := ms[3].UserID(); ok {
		t.Error("tmpfs has no user_id")
	}
	for _, bad := range []string{"1 2 0:1 / /x rw", "x 2 0:1 / /x rw - t s o", "1 2 01 / /x rw - t s o", "1 2 0:1 / /x rw - t"} {
		if _, err := Parse([]byte(bad)); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}

func TestAt(t *testing.T) {
	f := filepath.Join(t.TempDir(), "mountinfo")
	if err := os.WriteFile(f, []byte(sample), 0o600); err != nil {
		t.Fatal(err)
	}
	old := mountinfo
	mountinfo = f
	t.Cleanup(func() { mountinfo = old })
	on, err := At("/tmp/a b/mnt")
	if err != nil {
		t.Fatal(err)
	}
	if len(on) != 2 || on[0].FSType != "fuse.leasefs" || on[1].FSType != "tmpfs" {
		t.Fatalf("At: %+v (want the fuse mount, then the tmpfs over it)", on)
	}
	if on, _ := At("/tmp/a b"); len(on) != 0 {
		t.Errorf("At a parent: %+v", on)
	}
}

func TestResolve(t *testing.T) {
	dir, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	real := filepath.Join(dir, "real")
	if err := os.MkdirAll(filepath.Join(real, "mnt"), 0o755); err != nil {
		t.Fatal(err)
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.Symlink("real", filepath.Join(dir, "link")))       // a directory above the name
	must(os.Symlink("real/mnt", filepath.Join(dir, "last")))   // the last name, relative
	must(os.Symlink(filepath.Join(dir, "last"), dir+"/chain")) // a link to a link
	must(os.Symlink("loop", filepath.Join(dir, "loop")))       // a loop
	for in, want := range map[string]string{
		filepath.Join(dir, "link", "mnt"):        filepath.Join(real, "mnt"),
		filepath.Join(dir, "last"):               filepath.Join(real, "mnt"),
		filepath.Join(dir, "chain"):              filepath.Join(real, "mnt"),
		filepath.Join(dir, "link", "mnt") + "/.": filepath.Join(real, "mnt"),
		filepath.Join(dir, "link", "missing"):    filepath.Join(real, "missing"),
	} {
		got, err := Resolve(in)
		if err != nil || got != want {
			t.Errorf("Resolve(%s) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := Resolve(filepath.Join(dir, "loop")); err == nil {
		t.Error("a symlink loop resolved")
	}
	t.Chdir(dir)
	if got, err := Resolve("last"); err != nil || got != filepath.Join(real, "mnt") {
		t.Errorf("relative: %q %v", got, err)
	}
}

// TestWatcher: a mount here wakes Wait, and shows in At.
func TestWatcher(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount")
	}
	w, err := NewWatcher()
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	woke := make(chan error, 1)
	go func() { woke <- w.Wait() }()
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	defer syscall.Unmount(dir, syscall.MNT_DETACH)
	select {
	case err := <-woke:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a mount did not wake Wait")
	}
	p, err := Resolve(dir)
	if err != nil {
		t.Fatal(err)
	}
	on, err := At(p)
	if err != nil || len(on) != 1 || on[0].FSType != "tmpfs" {
		t.Fatalf("At(%s) = %+v, %v", p, on, err)
	}
}
