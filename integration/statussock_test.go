package integration

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/leasefs/leasefs/internal/mounts"
	"github.com/leasefs/leasefs/internal/mountsock"
	"github.com/leasefs/leasefs/internal/testuser"
)

// impostor serves, as the user nobody, a status socket at path that
// answers every request as the mount at mp would, and counts them. A
// disguised one is bound elsewhere and moved to path, then given to root:
// only who serves it gives it away.
func impostor(t *testing.T, path, mp string, disguised bool) *atomic.Int64 {
	t.Helper()
	at := path
	if disguised {
		at = filepath.Join(os.TempDir(), "leasefs-impostor-"+itoa(os.Getpid())+".sock")
	}
	var ln net.Listener
	var err error
	must(t, testuser.Do(testuser.Nobody, testuser.Nobody, func() { ln, err = net.Listen("unix", at) }))
	must(t, err)
	if ul, ok := ln.(*net.UnixListener); ok {
		ul.SetUnlinkOnClose(false) // removed below, wherever it is
	}
	if disguised {
		must(t, os.Rename(at, path))
		must(t, os.Chown(path, 0, 0))
		must(t, os.Chmod(path, 0o600))
	} else {
		must(t, os.Chmod(path, 0o777))
	}
	hits := new(atomic.Int64)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"mountpoint":%q,"pid":1,"client":"client:00000000000000aa","dirty_bytes":0}`, mp)
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close(); os.Remove(path) })
	return hits
}

// adminEnv runs leasefs admin with extra environment variables.
func adminEnv(env []string, args ...string) (string, error) {
	cmd := exec.Command(binary, append([]string{"admin"}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// TestStatusSocket: a mount's status socket is in a directory only its
// user can write, and leasefs admin --mount trusts nothing else: before,
// it sat at a predictable /tmp/leasefs-HASH.sock that any user could take
// first, and admin reported a sync as done by whatever answered there.
func TestStatusSocket(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to act as another user")
	}
	// no mount at all: a socket another user put at the old place is
	// not taken for one
	none := filepath.Join(t.TempDir(), "nomount")
	must(t, os.Mkdir(none, 0o755))
	abs, err := mounts.Resolve(none)
	must(t, err)
	sum := sha256.Sum256([]byte(abs))
	oldPath := filepath.Join(os.TempDir(), "leasefs-"+hex.EncodeToString(sum[:8])+".sock")
	hits := impostor(t, oldPath, abs, false)
	for _, cmd := range []string{"sync", "status"} {
		out, err := adminEnv(nil, "--mount", none, cmd)
		if err == nil || !strings.Contains(out, "nothing is mounted") {
			t.Fatalf("admin --mount %s %s with no mount there: %v\n%s", none, cmd, err, out)
		}
	}
	if n := hits.Load(); n != 0 {
		t.Fatalf("admin asked the impostor %d times", n)
	}

	s := startServer(t)
	m := startMount(t, s)
	mp, err := mounts.Resolve(m.dir)
	must(t, err)
	dir := mountsock.Dirs(0)[0]
	sock := filepath.Join(dir, mountsock.Name(mp))
	fi, err := os.Lstat(sock)
	must(t, err)
	if fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o600 || fi.Sys().(*syscall.Stat_t).Uid != 0 {
		t.Fatalf("status socket %s: %v, owner %d", sock, fi.Mode(), fi.Sys().(*syscall.Stat_t).Uid)
	}
	di, err := os.Lstat(dir)
	must(t, err)
	if !di.IsDir() || di.Mode().Perm() != 0o700 || di.Sys().(*syscall.Stat_t).Uid != 0 {
		t.Fatalf("socket directory %s: %v, owner %d", dir, di.Mode(), di.Sys().(*syscall.Stat_t).Uid)
	}
	sum = sha256.Sum256([]byte(mp))
	if old := filepath.Join(os.TempDir(), "leasefs-"+hex.EncodeToString(sum[:8])+".sock"); exists(old) {
		t.Fatalf("a socket at the old predictable place %s", old)
	}

	// An impostor's socket where admin looks first (its
	// XDG_RUNTIME_DIR, in a directory nobody owns) is passed over for
	// the mount's own.
	x, err := os.MkdirTemp("", "xdg")
	must(t, err)
	t.Cleanup(func() { os.RemoveAll(x) })
	must(t, os.Chmod(x, 0o755))
	must(t, os.Mkdir(filepath.Join(x, "leasefs"), 0o700))
	must(t, os.Chown(filepath.Join(x, "leasefs"), testuser.Nobody, testuser.Nobody))
	hits = impostor(t, filepath.Join(x, "leasefs", mountsock.Name(mp)), mp, false)
	genuine := func(how string) {
		t.Helper()
		env := []string{"XDG_RUNTIME_DIR=" + x}
		out, err := adminEnv(env, "--mount", m.dir, "status", "--json")
		if err != nil {
			t.Fatalf("%s: admin status: %v\n%s", how, err, out)
		}
		var st struct{ Pid int }
		must(t, json.Unmarshal([]byte(out), &st))
		if st.Pid != m.cmd.Process.Pid {
			t.Fatalf("%s: status from pid %d, want the mount's %d", how, st.Pid, m.cmd.Process.Pid)
		}
		if out, err := adminEnv(env, "--mount", m.dir, "sync"); err != nil {
			t.Fatalf("%s: admin sync: %v\n%s", how, err, out)
		}
		if n := hits.Load(); n != 0 {
			t.Fatalf("%s: admin asked the impostor %d times", how, n)
		}
	}
	genuine("in a directory nobody owns")
	// the same, in a private directory of root's and owned by root, but
	// served by nobody
	must(t, os.Chown(filepath.Join(x, "leasefs"), 0, 0))
	must(t, os.Remove(filepath.Join(x, "leasefs", mountsock.Name(mp))))
	hits = impostor(t, filepath.Join(x, "leasefs", mountsock.Name(mp)), mp, true)
	genuine("served by nobody")
}
