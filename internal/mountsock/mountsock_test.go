package mountsock

import (
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/leasefs/leasefs/internal/testuser"
)

// runtimeDir makes a directory for XDG_RUNTIME_DIR that other users can
// traverse (t.TempDir's parent is 0700) and points the variable at it.
func runtimeDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "mountsock")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("XDG_RUNTIME_DIR", dir)
	return dir
}

func listen(t *testing.T, mp string) (net.Listener, string) {
	t.Helper()
	ln, path, err := Listen(mp, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close(); os.Remove(path) })
	return ln, path
}

func mode(t *testing.T, p string) (os.FileMode, uint32) {
	t.Helper()
	fi, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Mode(), fi.Sys().(*syscall.Stat_t).Uid
}

// TestListenPrivate: the socket is made in a directory of the user's
// alone, 0700, and is 0600; a directory of ours open to others is closed.
func TestListenPrivate(t *testing.T) {
	x := runtimeDir(t)
	if err := os.Mkdir(filepath.Join(x, "leasefs"), 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(x, "leasefs"), 0o777); err != nil {
		t.Fatal(err)
	}
	_, path := listen(t, "/some/mountpoint")
	if want := filepath.Join(x, "leasefs", Name("/some/mountpoint")); path != want {
		t.Fatalf("socket at %s, want %s", path, want)
	}
	if m, uid := mode(t, filepath.Dir(path)); !m.IsDir() || m.Perm() != 0o700 || int(uid) != os.Geteuid() {
		t.Fatalf("directory %v owned by %d", m, uid)
	}
	if m, _ := mode(t, path); m&os.ModeSocket == 0 || m.Perm() != 0o600 {
		t.Fatalf("socket %v", m)
	}
	if Name("/a/b") == Name("/a/c") || !strings.HasSuffix(Name("/a/b"), ".sock") {
		t.Fatal("names")
	}
}

// TestListenForeignDir: a directory another user made where the mount's
// would be is not used (its owner could replace the socket).
func TestListenForeignDir(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to make another user's directory")
	}
	x := runtimeDir(t)
	foreign := filepath.Join(x, "leasefs")
	if err := os.Mkdir(foreign, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(foreign, testuser.Nobody, testuser.Nobody); err != nil {
		t.Fatal(err)
	}
	_, path := listen(t, "/foreign/dir/test")
	if strings.HasPrefix(path, foreign) {
		t.Fatalf("the socket went into %s, which uid %d owns", path, testuser.Nobody)
	}
	if w := private(foreign, 0); !strings.Contains(w, "belongs to uid 65534") {
		t.Fatalf("private(foreign) = %q", w)
	}
}

// TestPeerCheck: the mount serves its own user and root only, even if its
// socket can be reached; Dial's check of a socket: in a private directory
// of the mount's user, owned by them.
func TestPeerCheck(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to connect as another user")
	}
	runtimeDir(t)
	ln, path := listen(t, "/peer/check")
	// open it up, as a mistake or a hostile umask would
	if err := os.Chmod(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, 0o666); err != nil {
		t.Fatal(err)
	}
	accepted := make(chan net.Conn, 2)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte("status"))
			accepted <- c
		}
	}()
	var nobody net.Conn
	var derr error
	if err := testuser.Do(testuser.Nobody, testuser.Nobody, func() { nobody, derr = net.Dial("unix", path) }); err != nil {
		t.Fatal(err)
	}
	if derr != nil {
		t.Fatalf("nobody could not even connect (the test needs it to): %v", derr)
	}
	defer nobody.Close()
	_ = nobody.SetReadDeadline(time.Now().Add(10 * time.Second))
	if b, err := io.ReadAll(nobody); len(b) != 0 || err != nil {
		t.Fatalf("nobody got %q, %v: want the connection closed unanswered", b, err)
	}
	root, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	buf := make([]byte, 6)
	if _, err := io.ReadFull(root, buf); err != nil || string(buf) != "status" {
		t.Fatalf("root: %q %v", buf, err)
	}
	if cred, err := PeerCred(root); err != nil || cred.Uid != 0 || int(cred.Pid) != os.Getpid() {
		t.Fatalf("peer of root's connection: %+v %v", cred, err)
	}
	(<-accepted).Close()

	// what Dial trusts
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	if w := trusted(filepath.Dir(path), path, fi, nil, 0); !strings.Contains(w, "open to others") {
		t.Fatalf("a socket in a directory open to others: %q", w)
	}
	if err := os.Chmod(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	if w := trusted(filepath.Dir(path), path, fi, nil, 0); w != "" {
		t.Fatalf("the mount's own socket: %q", w)
	}
	if w := trusted(filepath.Dir(path), path, fi, nil, testuser.Nobody); !strings.Contains(w, "belongs to uid 0") {
		t.Fatalf("root's socket taken for nobody's mount: %q", w)
	}
	plain := filepath.Join(filepath.Dir(path), "plain")
	if err := os.WriteFile(plain, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	fi, _ = os.Lstat(plain)
	if w := trusted(filepath.Dir(path), plain, fi, nil, 0); !strings.Contains(w, "not a socket") {
		t.Fatalf("a plain file: %q", w)
	}
}

func TestDirs(t *testing.T) {
	t.Setenv("XDG_RUNTIME_DIR", "/run/user/1000")
	me := os.Geteuid()
	d := Dirs(me)
	if d[0] != "/run/user/1000/leasefs" {
		t.Fatalf("Dirs(%d) = %v: the runtime dir first", me, d)
	}
	if other := Dirs(me + 1); strings.HasPrefix(other[0], "/run/user/1000/") {
		t.Fatalf("another user's dirs include ours: %v", other)
	}
	if root := Dirs(0); !slices.Contains(root, "/run/leasefs") {
		t.Fatalf("root: %v", root)
	}
}
