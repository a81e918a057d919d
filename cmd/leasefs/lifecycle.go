package main

// How a mount ends. A signal or an unmount starts the stop, and the
// process exits within --stop-timeout whatever the kernel, the
// applications and the servers do: it unmounts (retrying while busy, then
// detaching lazily), aborts its FUSE connection if the kernel keeps it (a
// copy of the mount in another mount namespace holds it however it is
// unmounted here), sends what it buffered while the bound allows, logs
// what it could not as DATA LOST with its path, and exits. A second
// signal exits at once.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/internal/version"

	"github.com/hanwen/go-fuse/v2/fuse"
	"github.com/spf13/pflag"

	"github.com/leasefs/leasefs/client"
	lfs "github.com/leasefs/leasefs/fs"
	"github.com/leasefs/leasefs/internal/mounts"
)

// lifeFlags are the flags of mount and up about where a mount goes and
// how it ends.
type lifeFlags struct {
	stopTimeout  time.Duration
	allowStacked bool
}

func (l *lifeFlags) add(fs *pflag.FlagSet) {
	fs.DurationVar(&l.stopTimeout, "stop-timeout", 10*time.Second,
		"after SIGINT, SIGTERM or an unmount, the mount exits within this long: it unmounts (aborting its FUSE\n"+
			"connection if the kernel keeps it), sends what it buffered, logs what it could not as DATA LOST and exits;\n"+
			"a second signal exits at once")
	fs.BoolVar(&l.allowStacked, "allow-stacked", false,
		"mount even if MOUNTPOINT already has a mount on it (the new one hides it); refused by default")
}

func (l *lifeFlags) validate() error {
	if l.stopTimeout < time.Second {
		return fmt.Errorf("--stop-timeout %v: must be at least 1s", l.stopTimeout)
	}
	return nil
}

// checkMountpoint resolves mountpoint (mounts.Resolve) and refuses one
// that already has a mount on it, unless allowStacked. It returns the
// resolved path and the mounts on it.
func checkMountpoint(mountpoint string, allowStacked bool) (string, []mounts.Mount, error) {
	mp, err := mounts.Resolve(mountpoint)
	if err != nil {
		return "", nil, fmt.Errorf("mountpoint: %w", err)
	}
	on, err := mounts.At(mp)
	if err != nil {
		return "", nil, err
	}
	if len(on) > 0 {
		if !allowStacked {
			top := on[len(on)-1]
			what := fmt.Sprintf("%s (source %s)", top.FSType, top.Source)
			if top.FSType == "fuse.leasefs" {
				what = "a leasefs mount"
			}
			return "", nil, fmt.Errorf("mountpoint %s already has a mount on it: %s; unmount it first, or give --allow-stacked to mount over it", mp, what)
		}
		// not stat'ed: the mount there would answer, or hang
		return mp, on, nil
	}
	st, err := os.Stat(mp)
	if err != nil {
		return "", nil, fmt.Errorf("mountpoint: %w", err)
	}
	if !st.IsDir() {
		return "", nil, fmt.Errorf("mountpoint %s is not a directory", mp)
	}
	return mp, on, nil
}

// ourMount returns the FUSE mount at mp that was not among before (the
// one just made; ok false if none is found).
func ourMount(mp string, before []mounts.Mount) (mounts.Mount, bool) {
	on, err := mounts.At(mp)
	if err != nil {
		return mounts.Mount{}, false
	}
	for i := len(on) - 1; i >= 0; i-- {
		m := on[i]
		if m.IsFUSE() && !slices.ContainsFunc(before, func(b mounts.Mount) bool { return b.ID == m.ID }) {
			return m, true
		}
	}
	return mounts.Mount{}, false
}

// mountExtras are what only `leasefs mount` asks of mountAndServe.
type mountExtras struct {
	metrics string // serve the mount's metrics there (mountmetrics.go)
	subdir  string // mount this directory of the file system as the root
}

// mountAndServe connects, mounts and serves until unmount or signal, then
// stops within lf.stopTimeout.
func mountAndServe(cfg client.Config, mountpoint string, opts lfs.MountOptions, log *slog.Logger, lf lifeFlags, ex mountExtras) error {
	if err := lf.validate(); err != nil {
		return err
	}
	mp, before, err := checkMountpoint(mountpoint, lf.allowStacked)
	if err != nil {
		return err
	}
	// every signal from here on is seen here; the context only ends the
	// connecting
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)
	ctx, stopConnecting := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	cfg.Mountpoint = mp
	mm := newMountMetrics()
	if ex.metrics != "" {
		cfg.ObserveRequest = mm.observe
	}
	c, err := client.New(ctx, cfg)
	if err != nil {
		stopConnecting()
		return err
	}
	shutdown := func(err error) error {
		ctx, cancel := context.WithTimeout(context.Background(), lf.stopTimeout)
		defer cancel()
		_ = c.Shutdown(ctx)
		return err
	}
	if ex.subdir != "" {
		opts.Root, err = lookupDir(ctx, c, ex.subdir)
		if err != nil {
			stopConnecting()
			return shutdown(err)
		}
	}
	stopConnecting()
	if ex.metrics != "" {
		stopMetrics, err := serveMountMetrics(ex.metrics, c, mm, log)
		if err != nil {
			return shutdown(fmt.Errorf("--metrics: %w", err))
		}
		defer stopMetrics()
	}
	stopStatus := serveMountStatus(c, mp, log) // leasefs admin --mount (admin.go)
	defer stopStatus()
	opts.Logger = log
	srv, err := lfs.Mount(mp, c, opts)
	if err != nil {
		return shutdown(err)
	}
	m := &mounted{srv: srv, c: c, point: mp, log: log, done: make(chan struct{}), gone: make(chan struct{}), stopStatus: stopStatus}
	if mi, ok := ourMount(mp, before); ok {
		m.id, m.conn = mi.ID, mi.Minor
	}
	m.watch()
	go func() { srv.Wait(); close(m.done) }()
	log.Info("mounted", "version", version.Get().String(), "mountpoint", mp, "server", c.Server(), "fuse_connection", m.conn)
	reportReady(nil)
	return m.run(sigs, lf.stopTimeout)
}

// mounted is a mount being served.
type mounted struct {
	srv        *fuse.Server
	c          *client.Client
	point      string // resolved
	id         int    // the mount's id in mountinfo (0: not found)
	conn       uint32 // the FUSE connection's number (0: not found)
	log        *slog.Logger
	done       chan struct{} // closed when the serve loops end: the kernel let go
	gone       chan struct{} // closed when the mount is no longer listed here (watch)
	stopStatus func()
	detached   bool
}

// run serves until an unmount or a signal, then stops within bound.
func (m *mounted) run(sigs <-chan os.Signal, bound time.Duration) error {
	var t0 time.Time
	select {
	case <-m.done:
		t0 = time.Now()
		m.log.Info("unmounted", "mountpoint", m.point)
	case <-m.gone:
		t0 = time.Now()
		m.log.Debug("unmounted here; waiting for the kernel to let go of the mount", "mountpoint", m.point, "stop_timeout", bound)
		if m.letGo(t0.Add(bound/2), sigs, "the kernel keeps the mount after it was unmounted here: "+
			"another mount namespace holds a copy of it, or files in it are still open") {
			m.now()
		}
	case sig := <-sigs:
		t0 = time.Now()
		m.log.Info("signal received: unmounting; a second signal stops at once",
			"signal", sig, "mountpoint", m.point, "stop_timeout", bound)
		if m.release(t0, bound, sigs) {
			m.now()
		}
	}
	// The rest of the bound sends what is buffered; Shutdown returns
	// half a second after its deadline at the latest.
	ctx, cancel := context.WithDeadline(context.Background(), t0.Add(bound-time.Second))
	defer cancel()
	res := make(chan error, 1)
	go func() { res <- m.c.Shutdown(ctx) }()
	select {
	case err := <-res:
		if err != nil {
			return err
		}
		m.log.Info("stopped", "mountpoint", m.point)
		return nil
	case <-sigs:
		m.now()
		return nil // not reached
	}
}

// release makes the kernel let go of the mount by t0+bound/2 (plus a
// second for the serve loops to end): an unmount, retried while busy and
// then lazy, and an abort of the FUSE connection if the kernel still keeps
// it. It reports whether a second signal came meanwhile.
func (m *mounted) release(t0 time.Time, bound time.Duration, sigs <-chan os.Signal) (again bool) {
	letGoBy := t0.Add(bound / 2)
	unmounted := make(chan error, 1)
	go func() { unmounted <- m.unmount(t0.Add(min(2*time.Second, bound/4))) }()
	why := "the mount is still in use (open files, or a process inside it)"
	t := time.NewTimer(time.Until(letGoBy))
	defer t.Stop()
	select {
	case <-m.done:
		m.log.Info("unmounted", "mountpoint", m.point)
		return false
	case <-sigs:
		return true
	case err := <-unmounted:
		switch {
		case errors.Is(err, errNotOnTop):
			m.log.Info("the mount was detached here already", "mountpoint", m.point)
		case err != nil:
			m.log.Warn("unmount failed", "mountpoint", m.point, "err", err)
		case !m.detached:
			// Unmounted here, so the kernel ends the connection at
			// once, unless another mount namespace holds a copy of the
			// mount (unshare -m, a container), which will not go away.
			if soon := time.Now().Add(time.Second); soon.Before(letGoBy) {
				letGoBy = soon
			}
			why = "the kernel keeps the mount after it was unmounted here: another mount namespace holds a copy of it"
		}
	case <-t.C: // the unmount itself hangs
	}
	return m.letGo(letGoBy, sigs, why)
}

// letGo waits until deadline for the kernel to let go of the mount (the
// serve loops end), then aborts the FUSE connection, saying why, and waits
// a second more for the loops. It reports whether a second signal came
// meanwhile.
func (m *mounted) letGo(deadline time.Time, sigs <-chan os.Signal, why string) (again bool) {
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case <-m.done:
		m.log.Info("unmounted", "mountpoint", m.point)
		return false
	case <-sigs:
		return true
	case <-t.C:
	}
	m.abortFUSE(why)
	select {
	case <-m.done:
	case <-sigs:
		return true
	case <-time.After(time.Second):
		m.log.Warn("the FUSE serve loops did not end after the abort; going on")
	}
	return false
}

// watch closes m.gone once the mount is no longer listed here (unmounted
// here by anyone) while the kernel may keep its connection: a copy in
// another mount namespace holds it however it is unmounted here.
func (m *mounted) watch() {
	if m.id == 0 {
		return
	}
	w, err := mounts.NewWatcher()
	if err != nil {
		m.log.Warn("not watching for an unmount here", "err", err)
		return
	}
	go func() {
		defer w.Close()
		for {
			all, err := mounts.Read()
			if err != nil {
				return
			}
			if !slices.ContainsFunc(all, func(mi mounts.Mount) bool { return mi.ID == m.id }) {
				close(m.gone)
				return
			}
			if err := w.Wait(); err != nil {
				return
			}
		}
	}()
}

// errNotOnTop: the mount at the mountpoint is not this one (it was
// detached here already; another may be under it).
var errNotOnTop = errors.New("this mount is no longer the one at the mountpoint")

// onTop reports whether the mount at m.point is m, so that an unmount of
// the path unmounts m and not one it was stacked on.
func (m *mounted) onTop() bool {
	on, err := mounts.At(m.point)
	return err == nil && len(on) > 0 && m.id != 0 && on[len(on)-1].ID == m.id
}

// unmount unmounts m here, retrying while it is busy until busyUntil,
// then detaching it lazily.
func (m *mounted) unmount(busyUntil time.Time) error {
	for {
		if !m.onTop() {
			return errNotOnTop
		}
		err := unmountPath(m.point, false)
		if err == nil {
			return nil
		}
		if !errors.Is(err, syscall.EBUSY) || time.Now().After(busyUntil) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if !m.onTop() {
		return errNotOnTop
	}
	m.log.Warn("mount busy (open files, or a process inside it): detaching it lazily", "mountpoint", m.point)
	m.detached = true
	return unmountPath(m.point, true)
}

// unmountPath unmounts the mount at point (lazy: detaches it, and the
// kernel ends it once unused). A user other than root unmounts a FUSE
// mount of theirs with fusermount3, which is setuid.
func unmountPath(point string, lazy bool) error {
	flags := 0
	if lazy {
		flags = syscall.MNT_DETACH
	}
	err := syscall.Unmount(point, flags)
	if !errors.Is(err, syscall.EPERM) || os.Geteuid() == 0 {
		return err
	}
	bin, lerr := exec.LookPath("fusermount3")
	if lerr != nil {
		if bin, lerr = exec.LookPath("fusermount"); lerr != nil {
			return err
		}
	}
	args := []string{"-u", "-q"}
	if lazy {
		args = append(args, "-z")
	}
	if out, ferr := exec.Command(bin, append(args, point)...).CombinedOutput(); ferr != nil {
		if strings.Contains(string(out), "busy") {
			return syscall.EBUSY
		}
		return fmt.Errorf("%s: %v: %s", bin, ferr, strings.TrimSpace(string(out)))
	}
	return nil
}

// abortFUSE aborts m's FUSE connection: every request on it fails, and the
// serve loops end.
func (m *mounted) abortFUSE(why string) {
	if m.conn == 0 {
		m.log.Warn(why+"; its FUSE connection is not known: exiting ends it", "mountpoint", m.point)
		return
	}
	m.log.Warn(why+"; aborting its FUSE connection", "mountpoint", m.point, "fuse_connection", m.conn)
	if err := mounts.AbortFUSE(m.conn); err != nil && !errors.Is(err, mounts.ErrNoConnection) {
		m.log.Warn("aborting the FUSE connection failed: exiting ends it", "fuse_connection", m.conn, "err", err)
	}
}

// now stops at once, on a second signal: it aborts the FUSE connection if
// the kernel has not let go, detaches the mount, logs what is still
// buffered as DATA LOST, and exits.
func (m *mounted) now() {
	m.log.Warn("second signal: stopping at once", "mountpoint", m.point)
	select {
	case <-m.done:
	default:
		m.abortFUSE("stopping at once")
		detached := make(chan struct{})
		go func() {
			if m.onTop() {
				_ = unmountPath(m.point, true)
			}
			close(detached)
		}()
		select {
		case <-detached:
		case <-time.After(200 * time.Millisecond):
		}
	}
	err := m.c.ReportUnsent("a second signal stopped the mount at once")
	m.stopStatus()
	if err != nil {
		fmt.Fprintf(os.Stderr, "leasefs: %v\n", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// lookupDir returns the inode of the directory at path, from the file
// system's root: --subdir's.
func lookupDir(ctx context.Context, c *client.Client, path string) (ids.Ino, error) {
	ino := ids.RootIno
	for _, name := range strings.Split(strings.Trim(path, "/"), "/") {
		if name == "" || name == "." {
			continue
		}
		if name == ".." {
			return 0, fmt.Errorf("--subdir %s: no .. in it, please", path)
		}
		a, err := c.Lookup(ctx, ino, name)
		if err != nil {
			return 0, fmt.Errorf("--subdir %s: %s: %w", path, name, err)
		}
		if a.Mode&syscall.S_IFMT != syscall.S_IFDIR {
			return 0, fmt.Errorf("--subdir %s: %s is not a directory", path, name)
		}
		ino = a.Ino
	}
	return ino, nil
}
