package integration

import (
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
)

// aclScript sets and inherits ACLs the way people and tools do (setfacl,
// and coreutils, which restore a copied file's mode through an ACL), in
// the current directory, with umask 022.
const aclScript = `set -e
umask 022
echo s > named && chmod 600 named && setfacl -m u:nobody:r-- named
echo s > masked && setfacl -m u:nobody:rw-,g::r-- masked && chmod 600 masked
echo s > opened && chmod 640 opened && setfacl -m u:nobody:r-- opened && chmod 604 opened && chmod 640 opened
echo s > stripped && setfacl -m u:nobody:rwx stripped && setfacl -b stripped
echo s > trivial && setfacl -m u::rw-,g::r--,o::r-- trivial
mkdir inherit && setfacl -d -m u:nobody:rwx inherit && setfacl -m d:g::r-x inherit
touch inherit/f && mkdir inherit/s && touch inherit/s/f && mknod inherit/p p && echo x > inherit/w
(umask 077 && touch inherit/u && mkdir inherit/ud)
ln -s f inherit/l
mkdir minimal && setfacl -d -m u::rwx,g::---,o::--- minimal && touch minimal/f && mkdir minimal/s
mkdir nodefault && setfacl -d -m u:nobody:rwx nodefault && setfacl -k nodefault && touch nodefault/f
echo a > src && chmod 644 src && mkdir srcd && echo '#!/bin/sh' > srcd/x && chmod 755 srcd/x
echo x > srcd/y && chmod 644 srcd/y
cp -a src cpa && cp -p src cpp && cp -a srcd cpad && cp -rp srcd cprp
sed -i s/a/b/ src
`

// aclListing maps every entry under dir to its mode and ACLs, as getfacl
// shows them.
func aclListing(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	must(t, filepath.Walk(dir, func(p string, _ os.FileInfo, err error) error {
		if err != nil || p == dir {
			return err
		}
		n := p[len(dir)+1:]
		var st syscall.Stat_t
		must(t, syscall.Lstat(p, &st))
		out[n] = fmt.Sprintf("%#o\n", st.Mode)
		if st.Mode&syscall.S_IFMT != syscall.S_IFLNK {
			out[n] += run(t, dir, "getfacl", "-c", "-E", n)
		}
		return nil
	}))
	return out
}

// needACLTools skips a test without setfacl and getfacl, or whose
// reference file system (dir) keeps no ACLs.
func needACLTools(t *testing.T, dir string) {
	t.Helper()
	for _, tool := range []string{"setfacl", "getfacl"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skip("no " + tool + " (apt-get install acl)")
		}
	}
	p := filepath.Join(dir, "probe")
	must(t, os.WriteFile(p, nil, 0o600))
	defer os.Remove(p)
	if out, err := runErr(dir, "setfacl", "-m", "u:nobody:r", p); err != nil {
		t.Skipf("the reference file system keeps no ACLs: %v %s", err, out)
	}
}

// checkACLs runs aclScript through mount w and checks what it left, seen
// through every mount in seen, against a local file system (ref), and that
// the kernel enforces it for another user on each.
func checkACLs(t *testing.T, ref string, w *mount, seen ...*mount) {
	t.Helper()
	run(t, ref, "sh", "-c", aclScript)
	want := aclListing(t, ref)
	dir := filepath.Join(w.dir, "acl")
	must(t, os.Mkdir(dir, 0o755))
	run(t, dir, "sh", "-c", aclScript)
	for _, m := range seen {
		d := filepath.Join(m.dir, "acl")
		if diff := listingDiff(aclListing(t, d), want); diff != "" {
			t.Errorf("through %s: modes and ACLs differ from a local file system's:\n%s", d, diff)
		}
	}
	for i, m := range seen {
		d := filepath.Join(m.dir, "acl")
		// named grants nobody read, masked denies it after the chmod,
		// inherit/w grants read and write through the default ACL,
		// minimal/f is 0600
		for _, c := range []struct {
			args []string
			ok   bool
		}{
			{[]string{"cat", "named"}, true},
			{[]string{"sh", "-c", "echo x >> named"}, false},
			{[]string{"cat", "masked"}, false},
			{[]string{"cat", "opened"}, true},
			{[]string{"cat", "stripped"}, true},
			{[]string{"sh", "-c", "echo x >> inherit/w"}, true},
			{[]string{"cat", "minimal/f"}, false},
			{[]string{"touch", fmt.Sprint("inherit/s/new", i)}, true},
		} {
			args := append([]string{"sh", "-c", `cd "$0" && exec "$@"`, d}, c.args...)
			out, err := asUser(nobody, args...)
			if (err == nil) != c.ok {
				t.Errorf("through %s, nobody: %v: %v %s (want success %v)", d, c.args, err, out, c.ok)
			}
		}
	}
}

// TestACL: POSIX ACLs set and inherited through one mount are what a local
// file system keeps (modes included), on that mount and another, and the
// kernel enforces them for every user. They were stored as plain extended
// attributes: not enforced (setfacl -m u:nobody:r on a 0600 file let
// nobody read nothing), and a copy's mode restored through a trivial ACL
// stayed 0600 (cp -a, cp -p, sed -i, mv across disks turned 0644 into
// 0600 and 0755 into 0700).
func TestACL(t *testing.T) {
	needOtherUsers(t)
	ref := t.TempDir()
	needACLTools(t, ref)
	s := startServer(t)
	m1 := startMount(t, s)
	m2 := startMount(t, s)
	for _, d := range []string{ref, m1.dir, m2.dir} {
		reachable(t, d)
	}
	checkACLs(t, ref, m1, m1, m2)

	// A change through one mount is what the other's kernel enforces
	// next (it cached the ACL the checks above read).
	named := func(m *mount) string { return filepath.Join(m.dir, "acl", "named") }
	canRead := func(m *mount) bool { _, err := asUser(nobody, "cat", named(m)); return err == nil }
	for i, step := range []struct {
		on        *mount
		args      []string
		readable  bool
		aclOnBoth string
	}{
		{m1, []string{"setfacl", "-x", "u:nobody"}, false, "user::rw-\ngroup::---\nmask::---\nother::---\n"},
		{m2, []string{"setfacl", "-m", "u:nobody:rw"}, true, "user::rw-\nuser:nobody:rw-\ngroup::---\nmask::rw-\nother::---\n"},
		{m1, []string{"chmod", "600"}, false, "user::rw-\nuser:nobody:rw-\t#effective:---\ngroup::---\nmask::---\nother::---\n"},
		{m2, []string{"chmod", "g+r"}, true, "user::rw-\nuser:nobody:rw-\t#effective:r--\ngroup::---\nmask::r--\nother::---\n"},
	} {
		run(t, "/", step.args[0], append(step.args[1:], named(step.on))...)
		for _, m := range []*mount{m1, m2} {
			if got := canRead(m); got != step.readable {
				t.Errorf("step %d %v through %s: nobody reads: %v, want %v", i, step.args, m.dir, got, step.readable)
			}
			if got := run(t, "/", "getfacl", "-c", "-p", named(m)); got != step.aclOnBoth+"\n" {
				t.Errorf("step %d %v: getfacl through %s:\n%s\nwant\n%s", i, step.args, m.dir, got, step.aclOnBoth)
			}
		}
	}

	// mv from another file system copies and restores the mode
	other := t.TempDir()
	must(t, os.WriteFile(filepath.Join(other, "f"), []byte("x"), 0o644))
	must(t, os.Mkdir(filepath.Join(other, "d"), 0o755))
	must(t, os.WriteFile(filepath.Join(other, "d", "x"), []byte("x"), 0o755))
	for _, n := range []string{"f", "d"} {
		run(t, m1.dir, "mv", filepath.Join(other, n), filepath.Join(m1.dir, "mv"+n))
	}
	for _, m := range []*mount{m1, m2} {
		for n, want := range map[string]uint32{"mvf": 0o644, "mvd": 0o755, "mvd/x": 0o755} {
			if got := modeOf(t, filepath.Join(m.dir, n)); got != want {
				t.Errorf("%s after mv from another disk: %#o, want %#o", filepath.Join(m.dir, n), got, want)
			}
		}
	}

	// Setting an access ACL clears setgid when its owner is not in the
	// file's group (the kernel says so: FUSE_SETXATTR_ACL_KILL_SGID).
	for _, d := range []string{ref, m1.dir} {
		p := filepath.Join(d, "sgid")
		must(t, os.WriteFile(p, nil, 0o644))
		must(t, os.Chown(p, nobody, 0))
		must(t, os.Chmod(p, 0o770|os.ModeSetgid))
		if out, err := asUser(nobody, "setfacl", "-m", "u:nobody:rwx,g::r-x", p); err != nil {
			t.Fatalf("setfacl as the owner: %v %s", err, out)
		}
	}
	want := modeOf(t, filepath.Join(ref, "sgid"))
	if want&syscall.S_ISGID != 0 {
		t.Fatalf("reference kept setgid: %#o", want)
	}
	for _, m := range []*mount{m1, m2} {
		if got := modeOf(t, filepath.Join(m.dir, "sgid")); got != want {
			t.Errorf("%s: mode %#o after its owner outside its group set an ACL, want %#o", m.dir, got, want)
		}
	}
}

// TestACLCluster: on a cluster of three servers, ACLs set and inherited
// through a mount of one server are kept, inherited and enforced through a
// mount of another.
func TestACLCluster(t *testing.T) {
	needOtherUsers(t)
	ref := t.TempDir()
	needACLTools(t, ref)
	c := startCluster(t, 3, clusterTimings()...)
	a := c.mount(t, []int{0, 1, 2})
	b := c.mount(t, []int{1, 2, 0})
	for _, d := range []string{ref, a.dir, b.dir} {
		reachable(t, d)
	}
	checkACLs(t, ref, a, b, a)
}

// listingDiff lists the entries whose modes or ACLs differ.
func listingDiff(got, want map[string]string) string {
	var b strings.Builder
	for _, n := range slices.Sorted(maps.Keys(want)) {
		if got[n] != want[n] {
			fmt.Fprintf(&b, "%s: got\n%swant\n%s", n, got[n], want[n])
		}
	}
	for n := range got {
		if _, ok := want[n]; !ok {
			fmt.Fprintf(&b, "%s: not wanted\n", n)
		}
	}
	return b.String()
}
