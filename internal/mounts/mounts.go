// Package mounts reads the mounts of this process's mount namespace from
// /proc/self/mountinfo and waits for them to change, resolves a
// mountpoint's path without touching what is mounted there, and aborts
// FUSE connections through the fuse control file system.
//
// Nothing here stats a mountpoint: a FUSE mount whose daemon is stuck
// answers no stat, and a mount that is stopping, or the tool that asks
// it for its status, must not hang on itself.
package mounts

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"unsafe"
)

// Mount is one line of /proc/self/mountinfo (proc(5)).
type Mount struct {
	ID, Parent   int
	Major, Minor uint32 // the device: for FUSE, Minor is the connection's number in fusectl
	Root         string // the mounted directory of its file system
	Point        string // where it is mounted, absolute
	FSType       string // fuse.leasefs, tmpfs, ...
	Source       string
	Super        string // the super block's options
}

func (m Mount) String() string { return fmt.Sprintf("%s (%s) at %s", m.FSType, m.Source, m.Point) }

// IsFUSE reports whether m is a FUSE mount.
func (m Mount) IsFUSE() bool {
	return m.FSType == "fuse" || m.FSType == "fuseblk" || strings.HasPrefix(m.FSType, "fuse.") || strings.HasPrefix(m.FSType, "fuseblk.")
}

// UserID is the uid of the user who made a FUSE mount (its user_id
// option), which is the uid its daemon runs as.
func (m Mount) UserID() (int, bool) {
	for _, o := range strings.Split(m.Super, ",") {
		if v, ok := strings.CutPrefix(o, "user_id="); ok {
			if n, err := strconv.Atoi(v); err == nil {
				return n, true
			}
		}
	}
	return 0, false
}

// mountinfo is read from here (a test may point it elsewhere).
var mountinfo = "/proc/self/mountinfo"

// Read returns the mounts of this process's namespace, in the order the
// kernel lists them: a mount comes after the ones it was mounted over.
func Read() ([]Mount, error) {
	b, err := os.ReadFile(mountinfo)
	if err != nil {
		return nil, fmt.Errorf("mounts: %w", err)
	}
	return Parse(b)
}

// Parse parses the text of a mountinfo file.
func Parse(b []byte) ([]Mount, error) {
	var out []Mount
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		m, err := parseLine(line)
		if err != nil {
			return nil, fmt.Errorf("mounts: %q: %w", line, err)
		}
		out = append(out, m)
	}
	return out, sc.Err()
}

// parseLine reads "36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3
// /dev/root rw,errors=continue": optional fields end at the "-".
func parseLine(line string) (Mount, error) {
	f := strings.Fields(line)
	sep := -1
	for i := 6; i < len(f); i++ {
		if f[i] == "-" {
			sep = i
			break
		}
	}
	if len(f) < 6 || sep < 0 || len(f) < sep+3 {
		return Mount{}, errors.New("too few fields")
	}
	var m Mount
	var err error
	if m.ID, err = strconv.Atoi(f[0]); err != nil {
		return Mount{}, err
	}
	if m.Parent, err = strconv.Atoi(f[1]); err != nil {
		return Mount{}, err
	}
	maj, min, ok := strings.Cut(f[2], ":")
	if !ok {
		return Mount{}, fmt.Errorf("bad device %q", f[2])
	}
	ma, err1 := strconv.ParseUint(maj, 10, 32)
	mi, err2 := strconv.ParseUint(min, 10, 32)
	if err1 != nil || err2 != nil {
		return Mount{}, fmt.Errorf("bad device %q", f[2])
	}
	m.Major, m.Minor = uint32(ma), uint32(mi)
	m.Root, m.Point = unescape(f[3]), unescape(f[4])
	m.FSType, m.Source = unescape(f[sep+1]), unescape(f[sep+2])
	if len(f) > sep+3 {
		m.Super = f[sep+3]
	}
	return m, nil
}

// unescape undoes the kernel's octal escapes of space, tab, newline and
// backslash (\040, \011, \012, \134).
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// At returns the mounts at point (an absolute path as Resolve gives it),
// the topmost last.
func At(point string) ([]Mount, error) {
	all, err := Read()
	if err != nil {
		return nil, err
	}
	var out []Mount
	for _, m := range all {
		if m.Point == point {
			out = append(out, m)
		}
	}
	return out, nil
}

// Resolve makes path absolute and resolves every symbolic link in it
// without stat'ing a mountpoint: the directories above the last name are
// resolved as usual, and the last name is examined only when no mount is
// on it (then it lies in its parent's file system).
func Resolve(path string) (string, error) {
	p, err := filepath.Abs(path)
	if err != nil {
		return "", err
	}
	for range 40 { // the kernel's limit on links followed
		dir, base := filepath.Split(p)
		if dir, err = filepath.EvalSymlinks(dir); err != nil {
			return "", err
		}
		p = filepath.Join(dir, base)
		if base == "" || base == "." || base == ".." {
			return filepath.Clean(p), nil
		}
		on, err := At(p)
		if err != nil {
			return "", err
		}
		if len(on) > 0 {
			return p, nil
		}
		fi, err := os.Lstat(p)
		if err != nil || fi.Mode()&fs.ModeSymlink == 0 {
			return p, nil // a missing name is the caller's to report
		}
		target, err := os.Readlink(p)
		if err != nil {
			return "", err
		}
		if !filepath.IsAbs(target) {
			target = filepath.Join(dir, target)
		}
		p = filepath.Clean(target)
	}
	return "", fmt.Errorf("%s: %w", path, syscall.ELOOP)
}

// fusectl is where the fuse control file system is mounted.
const fusectl = "/sys/fs/fuse/connections"

// ErrNoConnection: the FUSE connection is not (or no longer) listed by
// the fuse control file system.
var ErrNoConnection = errors.New("mounts: no such FUSE connection")

// AbortFUSE aborts the FUSE connection numbered minor (its mount's device
// minor): every request waiting on it fails with ENOTCONN, and its daemon
// reads ECONNABORTED. It mounts the control file system if it is not, as
// root may.
func AbortFUSE(minor uint32) error {
	path := filepath.Join(fusectl, strconv.FormatUint(uint64(minor), 10), "abort")
	err := os.WriteFile(path, []byte("1"), 0)
	if !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	on, rerr := At(fusectl)
	if rerr != nil {
		return err
	}
	mounted := false
	for _, m := range on {
		mounted = mounted || m.FSType == "fusectl"
	}
	if mounted {
		return fmt.Errorf("%w: %d", ErrNoConnection, minor)
	}
	if merr := syscall.Mount("fusectl", fusectl, "fusectl", 0, ""); merr != nil {
		return fmt.Errorf("mounts: mount the fuse control file system at %s: %w", fusectl, merr)
	}
	err = os.WriteFile(path, []byte("1"), 0)
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%w: %d", ErrNoConnection, minor)
	}
	return err
}

// Watcher waits for changes to this process's mount namespace: the kernel
// marks /proc/self/mountinfo (POLLPRI) when a mount comes or goes here.
type Watcher struct{ fd int }

// NewWatcher starts watching; the first Wait returns at the first change
// after this.
func NewWatcher() (*Watcher, error) {
	// Not os.Open: Go's poller would take the file into its epoll set,
	// and each of its polls consumes the change the kernel reports once.
	fd, err := syscall.Open(mountinfo, syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("mounts: open %s: %w", mountinfo, err)
	}
	w := &Watcher{fd: fd}
	if _, err := w.poll(0); err != nil {
		syscall.Close(fd)
		return nil, err
	}
	return w, nil
}

// Wait blocks until the mounts here change, and returns. Each change
// wakes one Wait (several changes in a row may wake only one).
func (w *Watcher) Wait() error {
	for {
		changed, err := w.poll(-1)
		if err != nil || changed {
			return err
		}
	}
}

// Close stops watching (not while a Wait is in progress).
func (w *Watcher) Close() error { return syscall.Close(w.fd) }

const pollPri, pollErr = 0x2, 0x8

// poll waits up to timeoutMs (-1: for ever) for a change and reports
// whether there was one.
func (w *Watcher) poll(timeoutMs int) (bool, error) {
	fd := struct {
		fd              int32
		events, revents int16
	}{fd: int32(w.fd), events: pollPri}
	var ts *syscall.Timespec
	if timeoutMs >= 0 {
		t := syscall.NsecToTimespec(int64(timeoutMs) * 1e6)
		ts = &t
	}
	for {
		_, _, e := syscall.Syscall6(syscall.SYS_PPOLL, uintptr(unsafe.Pointer(&fd)), 1, uintptr(unsafe.Pointer(ts)), 0, 0, 0)
		if e == syscall.EINTR {
			continue
		}
		if e != 0 {
			return false, fmt.Errorf("mounts: poll %s: %w", mountinfo, e)
		}
		return fd.revents&(pollPri|pollErr) != 0, nil
	}
}
