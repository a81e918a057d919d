// Package mountsock is the unix socket on which a mount serves its status
// and admin requests (leasefs admin --mount), found from the mountpoint
// alone.
//
// # Safety
//
// The socket lives in a directory only the mount's user can write, so no
// other user can put one in its place or take its name first: the first
// of $XDG_RUNTIME_DIR/leasefs (for the user the variable belongs to),
// /run/leasefs (root) or /run/user/UID/leasefs, and $TMPDIR/leasefs-UID,
// made mode 0700 and used only if it is a directory (not a link) owned by
// the user with no access for group or others. The socket is named by the
// first 16 hex digits of the SHA-256 of the mountpoint as mounts.Resolve
// gives it, mode 0600, removed on exit.
//
// Both ends check who is at the other: the mount serves only its own user
// and root (SO_PEERCRED), and a client (Client) trusts a socket only in a
// private directory of the user the kernel lists as the mount's owner
// (its user_id), owned by that user, and served by a process of that
// user. Finding no mount, or no such socket, is an error: nothing else
// can answer in the mount's name.
//
// The mountpoint is resolved without stat'ing it, so that asking a hung
// mount for its status never touches the mount itself.
package mountsock

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/leasefs/leasefs/internal/mounts"
)

// Dirs returns the directories uid's mount sockets may be in, the one a
// mount prefers first.
func Dirs(uid int) []string {
	var out []string
	if x := os.Getenv("XDG_RUNTIME_DIR"); x != "" && filepath.IsAbs(x) && uid == os.Geteuid() {
		out = append(out, filepath.Join(x, "leasefs"))
	}
	if uid == 0 {
		out = append(out, "/run/leasefs")
	} else {
		out = append(out, filepath.Join("/run/user", strconv.Itoa(uid), "leasefs"))
	}
	return append(out, filepath.Join(os.TempDir(), "leasefs-"+strconv.Itoa(uid)))
}

// Name is the socket's file name for the mountpoint mp (resolved).
func Name(mp string) string {
	sum := sha256.Sum256([]byte(filepath.Clean(mp)))
	return hex.EncodeToString(sum[:8]) + ".sock"
}

// private reports why dir is not a private directory of uid ("" if it is).
func private(dir string, uid int) string {
	fi, err := os.Lstat(dir)
	if err != nil {
		return err.Error()
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	switch {
	case !fi.IsDir():
		return dir + " is not a directory"
	case !ok:
		return dir + ": no owner"
	case int(st.Uid) != uid:
		return fmt.Sprintf("%s belongs to uid %d, not %d", dir, st.Uid, uid)
	case fi.Mode().Perm()&0o077 != 0:
		return fmt.Sprintf("%s has mode %#o: open to others", dir, fi.Mode().Perm())
	}
	return ""
}

// makeDir makes dir (0700) for this process's user if it is missing, puts
// right the mode of one of ours, and reports why it cannot be used ("" if
// it can).
func makeDir(dir string) string {
	uid := os.Geteuid()
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return err.Error()
	}
	if fi, err := os.Lstat(dir); err == nil && fi.IsDir() {
		if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) == uid && fi.Mode().Perm()&0o077 != 0 {
			_ = os.Chmod(dir, 0o700)
		}
	}
	return private(dir, uid)
}

// Listen makes the socket of the mount at mp (resolved) in the first
// usable directory of Dirs and returns it with its path. Connections from
// users other than this process's and root are closed unanswered (logged
// at debug).
func Listen(mp string, log *slog.Logger) (net.Listener, string, error) {
	var why []string
	for _, dir := range Dirs(os.Geteuid()) {
		if w := makeDir(dir); w != "" {
			why = append(why, w)
			continue
		}
		path := filepath.Join(dir, Name(mp))
		_ = os.Remove(path) // a stale socket of a killed mount: the directory is ours alone
		ln, err := net.Listen("unix", path)
		if err != nil {
			return nil, "", err
		}
		_ = os.Chmod(path, 0o600)
		return &peerListener{Listener: ln, log: log}, path, nil
	}
	return nil, "", fmt.Errorf("mountsock: no private directory for the status socket: %s", strings.Join(why, "; "))
}

// peerListener accepts connections from this process's user and root only.
type peerListener struct {
	net.Listener
	log *slog.Logger
}

func (l *peerListener) Accept() (net.Conn, error) {
	me := uint32(os.Geteuid())
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		cred, err := PeerCred(c)
		if err == nil && (cred.Uid == me || cred.Uid == 0) {
			return c, nil
		}
		if err == nil {
			err = fmt.Errorf("uid %d (pid %d) is neither the mount's user nor root", cred.Uid, cred.Pid)
		}
		l.log.Debug("status socket: connection refused", "err", err)
		_ = c.Close()
	}
}

// PeerCred returns the credentials of the process at the other end of a
// unix socket: for a listening socket's, those it had when it listened.
func PeerCred(c net.Conn) (*syscall.Ucred, error) {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return nil, fmt.Errorf("mountsock: %T is not a unix socket", c)
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return nil, err
	}
	var cred *syscall.Ucred
	var serr error
	if err := raw.Control(func(fd uintptr) {
		cred, serr = syscall.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED)
	}); err != nil {
		return nil, err
	}
	return cred, serr
}

// ErrNoMount: no FUSE mount is at the mountpoint.
var ErrNoMount = errors.New("mountsock: no FUSE mount")

// Mount returns the resolved mountpoint of the FUSE mount at mp and the
// uid its daemon runs as.
func Mount(mp string) (string, int, error) {
	p, err := mounts.Resolve(mp)
	if err != nil {
		return "", 0, err
	}
	on, err := mounts.At(p)
	if err != nil {
		return "", 0, err
	}
	for i := len(on) - 1; i >= 0; i-- {
		if !on[i].IsFUSE() {
			continue
		}
		uid, ok := on[i].UserID()
		if !ok {
			return "", 0, fmt.Errorf("mountsock: the mount at %s names no user", p)
		}
		return p, uid, nil
	}
	if len(on) > 0 {
		return "", 0, fmt.Errorf("%w: %s is %s", ErrNoMount, p, on[len(on)-1])
	}
	return "", 0, fmt.Errorf("%w: nothing is mounted at %s", ErrNoMount, p)
}

// Dial connects to the status socket of the FUSE mount at mp, trusting
// only what the package doc says. It returns the resolved mountpoint too.
func Dial(ctx context.Context, mp string) (net.Conn, string, error) {
	p, uid, err := Mount(mp)
	if err != nil {
		return nil, "", err
	}
	var why []string
	for _, dir := range Dirs(uid) {
		path := filepath.Join(dir, Name(p))
		fi, err := os.Lstat(path)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if w := trusted(dir, path, fi, err, uid); w != "" {
			why = append(why, w)
			continue
		}
		c, err := (&net.Dialer{}).DialContext(ctx, "unix", path)
		if err != nil {
			why = append(why, err.Error())
			continue
		}
		cred, err := PeerCred(c)
		if err == nil && int(cred.Uid) != uid {
			err = fmt.Errorf("%s is served by uid %d (pid %d), not the mount's user %d", path, cred.Uid, cred.Pid, uid)
		}
		if err != nil {
			_ = c.Close()
			why = append(why, err.Error())
			continue
		}
		return c, p, nil
	}
	if len(why) == 0 {
		why = []string{"none in " + strings.Join(Dirs(uid), ", ")}
	}
	return nil, p, fmt.Errorf("mountsock: no status socket of the mount at %s (uid %d) to trust: %s", p, uid, strings.Join(why, "; "))
}

// trusted reports why the socket at path, in dir, is not to be trusted as
// uid's ("" if it is); fi and err are its Lstat.
func trusted(dir, path string, fi fs.FileInfo, err error, uid int) string {
	if err != nil {
		return err.Error()
	}
	if w := private(dir, uid); w != "" {
		return w
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	switch {
	case fi.Mode()&fs.ModeSocket == 0:
		return path + " is not a socket"
	case !ok:
		return path + ": no owner"
	case int(st.Uid) != uid:
		return fmt.Sprintf("%s belongs to uid %d, not the mount's user %d", path, st.Uid, uid)
	}
	return ""
}

// Client is an HTTP client whose every request goes to the status socket
// of the mount at mp (Dial), whatever the URL's host.
func Client(mp string) *http.Client {
	return &http.Client{Transport: &http.Transport{DisableKeepAlives: true,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			c, _, err := Dial(ctx, mp)
			return c, err
		}}}
}
