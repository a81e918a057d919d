package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// runAsNobody runs a command as user and group 65534, without supplementary
// groups.
func runAsNobody(args ...string) (string, error) {
	cmd := exec.Command("setpriv", append([]string{"--reuid=65534", "--regid=65534", "--clear-groups"}, args...)...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// needNobody skips a test that acts as another user where it cannot, and
// lets that user reach m's files (t.TempDir's directories are 0700).
func needNobody(t *testing.T, mounts ...*mount) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to act as another user")
	}
	if _, err := exec.LookPath("setpriv"); err != nil {
		t.Skip("no setpriv")
	}
	for _, m := range mounts {
		must(t, os.Chmod(filepath.Dir(m.dir), 0o755))
		must(t, os.Chmod(filepath.Dir(filepath.Dir(m.dir)), 0o755))
		must(t, os.Chmod(m.dir, 0o777))
	}
}

// entryOps are the changes of a directory's entries whose replies carry
// the directory's attributes (and, on one server, the file create the
// mount makes itself): each is made in dir right after a chmod or chown
// of dir that the mount still holds back.
var entryOps = []struct {
	name string
	do   func(dir, other string) error
}{
	{"mkdir", func(dir, _ string) error { return os.Mkdir(filepath.Join(dir, "new"), 0o755) }},
	{"create", func(dir, _ string) error { return os.WriteFile(filepath.Join(dir, "new"), nil, 0o644) }},
	{"mknod", func(dir, _ string) error { return syscall.Mknod(filepath.Join(dir, "new"), syscall.S_IFIFO|0o644, 0) }},
	{"symlink", func(dir, _ string) error { return os.Symlink("target", filepath.Join(dir, "new")) }},
	{"link", func(dir, other string) error { return os.Link(other, filepath.Join(dir, "new")) }},
	{"rename", func(dir, other string) error { return os.Rename(other, filepath.Join(dir, "new")) }},
	{"unlink-open", func(dir, _ string) error {
		// a file open here is removed by the server, not behind the caller
		p := filepath.Join(dir, "open")
		f, err := os.Create(p)
		if err != nil {
			return err
		}
		defer f.Close()
		return os.Remove(p)
	}},
}

// statOf returns path's mode bits and owner.
func statOf(t *testing.T, path string) (perm uint32, uid, gid uint32) {
	t.Helper()
	var st syscall.Stat_t
	must(t, syscall.Lstat(path, &st))
	return st.Mode &^ syscall.S_IFMT, st.Uid, st.Gid
}

// checkDirAttrsKept: a chmod or chown of a directory, then a change of its
// entries on the same mount: the mount, and another, see the new mode and
// owner, though the change's reply may carry the directory's attributes
// from before a held-back chmod, which the mount must not cache.
// Then a user whose permission to create in the directory depends on the
// new mode or owner is allowed or refused as the new one says.
func checkDirAttrsKept(t *testing.T, a, b *mount) {
	needNobody(t, a, b)
	changes := []struct {
		name  string
		setup func(dir string) error // the directory's state before (0755 root)
		do    func(dir string) error
		perm  uint32 // the mode after
		uid   uint32
		// whether nobody may create in the directory afterwards
		nobodyCreates bool
	}{
		{"chmod-700", nil, func(d string) error { return os.Chmod(d, 0o700) }, 0o700, 0, false},
		{"chmod-777", nil, func(d string) error { return os.Chmod(d, 0o777) }, 0o777, 0, true},
		{"chmod-755", func(d string) error { return os.Chmod(d, 0o777) },
			func(d string) error { return os.Chmod(d, 0o755) }, 0o755, 0, false},
		{"chown", func(d string) error { return os.Chmod(d, 0o700) },
			func(d string) error { return os.Chown(d, 65534, 65534) }, 0o700, 65534, true},
	}
	for _, ch := range changes {
		for _, op := range entryOps {
			t.Run(ch.name+"/"+op.name, func(t *testing.T) {
				name := ch.name + "-" + op.name
				dir := filepath.Join(a.dir, name)
				must(t, os.Mkdir(dir, 0o755))
				must(t, os.Chmod(dir, 0o755))
				other := filepath.Join(a.dir, name+".file")
				must(t, os.WriteFile(other, []byte("x"), 0o644))
				if ch.setup != nil {
					must(t, ch.setup(dir))
					// the state before at the server (b's look takes
					// a's X lock), then a's X lock again (a's chmod
					// goes to the server for it): the change below is
					// the one held back
					_, _, _ = statOf(t, filepath.Join(b.dir, name))
					must(t, ch.setup(dir))
				}
				must(t, ch.do(dir))
				must(t, op.do(dir, other))
				check := func(where, path string) {
					t.Helper()
					perm, uid, _ := statOf(t, path)
					if perm != ch.perm || uid != ch.uid {
						t.Fatalf("%s: %s is %o owned by %d, want %o owned by %d", where, path, perm, uid, ch.perm, ch.uid)
					}
				}
				probe := filepath.Join(dir, "by-nobody")
				out, err := runAsNobody("touch", probe)
				switch {
				case ch.nobodyCreates && err != nil:
					t.Fatalf("nobody could not create in the directory (mode %o, owner %d): %v %s", ch.perm, ch.uid, err, out)
				case !ch.nobodyCreates && err == nil:
					t.Fatalf("nobody created in the directory (mode %o, owner %d)", ch.perm, ch.uid)
				case !ch.nobodyCreates && !strings.Contains(out, "Permission denied"):
					t.Fatalf("nobody's create: %v %s, want permission denied", err, out)
				}
				check("the mount that changed it", dir)
				check("another mount", filepath.Join(b.dir, name))
				check("the mount that changed it, after the other's look", dir)
			})
		}
	}
}

// TestDirAttrsKept: checkDirAttrsKept on one server.
func TestDirAttrsKept(t *testing.T) {
	s := startServer(t)
	checkDirAttrsKept(t, startMount(t, s), startMount(t, s))
}

// TestClusterDirAttrsKept: checkDirAttrsKept on three servers, where the
// directory and the new inode may be owned by different servers and plain
// file creates go to the server too.
func TestClusterDirAttrsKept(t *testing.T) {
	c := startCluster(t, 3, clusterTimings()...)
	checkDirAttrsKept(t, c.mount(t, []int{0, 1, 2}), c.mount(t, []int{1, 2, 0}))
}

// TestHeldBackAttrsLink: a link's reply carries the file's attributes as
// the server has them, without the mode, times and size the mount still
// holds back (a chmod, a utimes, a write of a file kept open): the kernel
// got those for the file, and kept them.
func TestHeldBackAttrsLink(t *testing.T) {
	s := startServer(t)
	a, b := startMount(t, s), startMount(t, s)
	f := filepath.Join(a.dir, "f")
	h, err := os.Create(f)
	must(t, err)
	defer h.Close()
	_, err = h.Write([]byte("hello"))
	must(t, err)
	must(t, os.Chmod(f, 0o600))
	mtime := time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC)
	must(t, os.Chtimes(f, mtime, mtime))
	must(t, os.Link(f, filepath.Join(a.dir, "g")))
	for _, p := range []string{filepath.Join(a.dir, "g"), f, filepath.Join(b.dir, "g")} {
		st, err := os.Stat(p)
		must(t, err)
		if st.Mode().Perm() != 0o600 || st.Size() != 5 || !st.ModTime().Equal(mtime) {
			t.Fatalf("%s: mode %v, size %d, mtime %v; want 0600, 5, %v", p, st.Mode(), st.Size(), st.ModTime(), mtime)
		}
	}
}

// TestHeldBackAttrsLookup: a directory whose chmod the mount holds back
// is looked up again (another mount's create in its parent took the
// parent's lock and its names): the lookup's reply lacks the chmod, and
// the kernel got that.
func TestHeldBackAttrsLookup(t *testing.T) {
	s := startServer(t)
	a, b := startMount(t, s), startMount(t, s)
	d := filepath.Join(a.dir, "d")
	must(t, os.Mkdir(d, 0o755))
	must(t, os.Chmod(d, 0o700))
	must(t, os.WriteFile(filepath.Join(b.dir, "x"), nil, 0o644))
	for _, p := range []string{d, filepath.Join(b.dir, "d"), d} {
		if perm, _, _ := statOf(t, p); perm != 0o700 {
			t.Fatalf("%s is %o, want 700", p, perm)
		}
	}
}

// TestClusterHeldBackAttrsFailover: the owner of a directory whose chmod a
// mount holds back dies. The mount fails over, reclaims the chmod at the
// new owner and makes a directory in it there: it and another mount see
// the new mode, not the one the server had before the reclaim.
func TestClusterHeldBackAttrsFailover(t *testing.T) {
	c := startCluster(t, 3, clusterTimings()...)
	a := c.mount(t, []int{0, 1, 2})
	b := c.mount(t, []int{1, 2, 0})
	d := filepath.Join(a.dir, "d")
	must(t, os.Mkdir(d, 0o755)) // made, and owned, by server 1
	must(t, os.Chmod(d, 0o700))
	must(t, os.Chown(d, 65534, 65534))
	c.servers[0].kill()
	must(t, os.Mkdir(filepath.Join(d, "c"), 0o755))
	for _, p := range []string{d, filepath.Join(b.dir, "d"), d} {
		if perm, uid, _ := statOf(t, p); perm != 0o700 || uid != 65534 {
			t.Fatalf("%s is %o owned by %d, want 700 owned by 65534", p, perm, uid)
		}
	}
	if strings.Contains(a.output(), "DATA LOST") {
		t.Fatalf("the held-back chmod was not reclaimed:\n%s", a.output())
	}
}
