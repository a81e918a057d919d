package integration

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// How a mount ends (cmd/leasefs/lifecycle.go): within --stop-timeout of a
// signal whatever holds it, what it buffered sent or logged as DATA LOST,
// a second signal at once; and where it may be mounted.

// exitWithin waits up to d for p to exit and reports whether it did.
func exitWithin(p *proc, d time.Duration) bool {
	select {
	case <-p.done:
		return true
	case <-time.After(d):
		return false
	}
}

// exitCode is p's exit status once it exited (-1 if a signal ended it).
func exitCode(p *proc) int {
	var ee *exec.ExitError
	if errors.As(p.err, &ee) {
		return ee.ExitCode()
	}
	if p.err != nil {
		return -1
	}
	return 0
}

// holdBuffered has a helper process create name in m, write to it and
// keep it open, and checks that the mount buffers the write. A process of
// its own: every process the test starts would hold a file the test opened
// until its exec, and the close there flushes it (to a server that may be
// down, which a hard mount waits for). If the mount does not stop, the
// cleanup kills it before the helper exits (its close would wait too).
func holdBuffered(t *testing.T, m *mount, name string) {
	t.Helper()
	startHelper(t, "TestMountSyncHolder", filepath.Join(m.dir, name), "written")
	t.Cleanup(m.kill)
	if _, st := mountStats(t, m); st.DirtyBytes == 0 {
		t.Fatal("the mount buffers nothing: the test needs buffered writes")
	}
}

// blockedInFUSE waits until process pid waits for a FUSE request.
func blockedInFUSE(t *testing.T, pid int) {
	t.Helper()
	waitFor(t, 10*time.Second, "the process to wait on the mount", func() bool {
		b, _ := os.ReadFile("/proc/" + itoa(pid) + "/wchan")
		return string(b) == "request_wait_answer"
	})
}

// TestStopNamespaceCopy: another mount namespace holding a copy of the
// mount kept the kernel's connection alive after the unmount here: on a
// signal the mount process waited for it for ever, ignoring further
// signals, and after an umount it went on serving the copy unseen. It
// must abort its connection, send what it buffered, and exit.
func TestStopNamespaceCopy(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for a mount namespace")
	}
	s := startServer(t)
	for _, how := range []string{"SIGTERM", "umount"} {
		t.Run(how, func(t *testing.T) {
			m := startMount(t, s, "--stop-timeout", "4s")
			kept := filepath.Join(m.dir, "kept")
			must(t, os.WriteFile(kept, []byte("kept"), 0o644))
			// a buffered change with no file open (an open file would make
			// the unmount here busy): a chmod under the X lock
			must(t, os.Chmod(kept, 0o600))
			ns := exec.Command("unshare", "--mount", "--propagation", "private", "sleep", "60")
			must(t, ns.Start())
			t.Cleanup(func() { _ = ns.Process.Kill(); _ = ns.Wait() })
			pid := itoa(ns.Process.Pid)
			waitFor(t, 10*time.Second, "the namespace holding a copy of the mount", func() bool {
				comm, _ := os.ReadFile("/proc/" + pid + "/comm")
				info, _ := os.ReadFile("/proc/" + pid + "/mountinfo")
				return string(comm) == "sleep\n" && strings.Contains(string(info), " "+m.dir+" ")
			})
			if how == "SIGTERM" {
				m.signal(syscall.SIGTERM)
			} else {
				run(t, "", "umount", m.dir)
			}
			if !exitWithin(m.proc, 20*time.Second) {
				t.Fatalf("the mount did not exit within 20 s of %s while another mount namespace holds a copy of it", how)
			}
			if code := exitCode(m.proc); code != 0 {
				t.Fatalf("exit status %d, want 0 (nothing lost)", code)
			}
			if out := m.output(); !strings.Contains(out, "another mount namespace holds a copy") || !strings.Contains(out, "aborting its FUSE connection") {
				t.Fatalf("the mount did not say why it aborted its connection:\n%s", out)
			}
			// the copy is dead, not hung
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			out, err := exec.CommandContext(ctx, "nsenter", "-t", pid, "-m", "--", "stat", kept).CombinedOutput()
			if err == nil || ctx.Err() != nil {
				t.Fatalf("the namespace's copy of the mount still answers, or hangs: %v %s", err, out)
			}
			// the buffered chmod reached the server
			m2 := startMount(t, s)
			st, err := os.Stat(filepath.Join(m2.dir, "kept"))
			must(t, err)
			if st.Mode().Perm() != 0o600 {
				t.Fatalf("mode %v after the mount stopped, want 0600: its buffered chmod was not sent", st.Mode().Perm())
			}
			must(t, os.Remove(filepath.Join(m2.dir, "kept")))
		})
	}
}

// TestStopServerKilled: after the server was killed, a hard mount never
// ended (its close waited for the server for ever). On SIGTERM, or after
// umount -l (which returns at once), it must stop within --stop-timeout,
// log what it could not send as DATA LOST with the path, exit 1, and
// release what waited on it (a statfs).
func TestStopServerKilled(t *testing.T) {
	for _, how := range []string{"SIGTERM", "umount -l"} {
		t.Run(strings.ReplaceAll(how, " ", ""), func(t *testing.T) {
			s := startServer(t)
			m := startMount(t, s, "--stop-timeout", "4s")
			holdBuffered(t, m, "lost.txt")
			s.kill()
			// a statfs waits for the server on a hard mount
			df := exec.Command("stat", "-f", m.dir)
			must(t, df.Start())
			dfDone := make(chan error, 1)
			go func() { dfDone <- df.Wait() }()
			t.Cleanup(func() { _ = df.Process.Kill() })
			blockedInFUSE(t, df.Process.Pid)
			start := time.Now()
			if how == "SIGTERM" {
				m.signal(syscall.SIGTERM)
			} else {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				if out, err := exec.CommandContext(ctx, "umount", "-l", m.dir).CombinedOutput(); err != nil {
					t.Fatalf("umount -l with the server down: %v %s", err, out)
				}
				if isMounted(m.dir) {
					t.Fatal("still mounted after umount -l")
				}
			}
			if !exitWithin(m.proc, 15*time.Second) {
				t.Fatalf("the mount did not exit within 15 s of %s (--stop-timeout 4s) with its server killed", how)
			}
			t.Logf("stopped %v after %s", time.Since(start).Round(time.Millisecond), how)
			if code := exitCode(m.proc); code != 1 {
				t.Fatalf("exit status %d, want 1 (data lost)", code)
			}
			if out := m.output(); !strings.Contains(out, "DATA LOST") || !strings.Contains(out, "path=/lost.txt") {
				t.Fatalf("no DATA LOST line naming /lost.txt:\n%s", out)
			}
			if isMounted(m.dir) {
				t.Fatal("still mounted after the mount exited")
			}
			select {
			case <-dfDone:
			case <-time.After(10 * time.Second):
				t.Fatal("stat -f still waits on the mount after it exited")
			}
		})
	}
}

// TestStopSecondSignal: a second SIGTERM exits at once, logging what was
// buffered as DATA LOST.
func TestStopSecondSignal(t *testing.T) {
	s := startServer(t)
	m := startMount(t, s, "--stop-timeout", "2m")
	holdBuffered(t, m, "second.txt")
	s.kill()
	m.signal(syscall.SIGTERM)
	waitFor(t, 10*time.Second, "the mount to take the first signal", func() bool {
		return strings.Contains(m.output(), "signal received")
	})
	m.signal(syscall.SIGTERM)
	if !exitWithin(m.proc, 5*time.Second) {
		t.Fatal("the mount did not exit within 5 s of a second SIGTERM (--stop-timeout 2m)")
	}
	if code := exitCode(m.proc); code != 1 {
		t.Fatalf("exit status %d, want 1 (data lost)", code)
	}
	if out := m.output(); !strings.Contains(out, "DATA LOST") || !strings.Contains(out, "path=/second.txt") {
		t.Fatalf("no DATA LOST line naming /second.txt:\n%s", out)
	}
	if isMounted(m.dir) {
		t.Fatal("still mounted after the mount exited")
	}
}

// TestStatfsSoftServerDown: df on a soft mount whose server is down
// answers with the last usage known within the soft timeout (it failed
// with EIO, and an unmount that asks it with it).
func TestStatfsSoftServerDown(t *testing.T) {
	s := startServer(t)
	m := startMount(t, s, "--soft-timeout", "2s")
	var before syscall.Statfs_t
	must(t, syscall.Statfs(m.dir, &before))
	s.kill()
	type result struct {
		st  syscall.Statfs_t
		err error
	}
	res := make(chan result, 1)
	start := time.Now()
	go func() {
		var r result
		r.err = syscall.Statfs(m.dir, &r.st)
		res <- r
	}()
	var r result
	select {
	case r = <-res:
	case <-time.After(15 * time.Second):
		t.Fatal("statfs on a soft mount (2 s) with the server down did not answer in 15 s")
	}
	took := time.Since(start)
	if r.err != nil {
		t.Fatalf("statfs with the server down: %v (after %v)", r.err, took)
	}
	if r.st.Blocks != before.Blocks || r.st.Files != before.Files || r.st.Bsize != before.Bsize {
		t.Fatalf("statfs answered %+v, want the last known %+v", r.st, before)
	}
	if took > 2*time.Second+3*time.Second {
		t.Fatalf("statfs took %v: not within the soft timeout (2 s)", took)
	}
}

// TestMountStacked: a mount on a directory that already has one (leasefs
// or any) is refused, naming what is there, unless --allow-stacked.
func TestMountStacked(t *testing.T) {
	s := startServer(t)
	m := startMount(t, s)
	refused := func(dir, want string, args ...string) {
		t.Helper()
		p := startProc(t, "refused-"+args[0], append(args, dir)...)
		if !exitWithin(p, 20*time.Second) {
			t.Fatalf("leasefs %s on %s did not exit", args[0], dir)
		}
		if out := p.output(); exitCode(p) == 0 || !strings.Contains(out, "already has a mount on it") || !strings.Contains(out, want) {
			t.Fatalf("leasefs %s on %s: exit %d, want a refusal naming %q:\n%s", args[0], dir, exitCode(p), want, out)
		}
	}
	refused(m.dir, "a leasefs mount", "mount", "--server", s.addr, "--token-file", s.tokenFile)
	refused(m.dir, "a leasefs mount", "up", "--data", t.TempDir(), "--listen", "127.0.0.1:0")
	if os.Geteuid() == 0 {
		tmp := filepath.Join(t.TempDir(), "tmpfs")
		must(t, os.Mkdir(tmp, 0o755))
		must(t, syscall.Mount("tmpfs", tmp, "tmpfs", 0, "size=1m"))
		t.Cleanup(func() { _ = syscall.Unmount(tmp, syscall.MNT_DETACH) })
		refused(tmp, "tmpfs", "mount", "--server", s.addr, "--token-file", s.tokenFile)
	}
	if n := strings.Count(mountinfoLines(), " "+m.dir+" "); n != 1 {
		t.Fatalf("%d mounts at %s after the refusals, want 1", n, m.dir)
	}
	// asked for: the new mount goes over the old one, and stops without
	// taking the one below with it
	must(t, os.WriteFile(filepath.Join(m.dir, "below"), nil, 0o644))
	top := startProc(t, "stacked", "mount", "--server", s.addr, "--token-file", s.tokenFile, "--allow-stacked", m.dir)
	waitFor(t, 15*time.Second, "the stacked mount", func() bool {
		if top.exited() {
			t.Fatalf("stacked mount exited: %v\n%s", top.err, top.output())
		}
		return strings.Contains(top.output(), "msg=mounted")
	})
	if n := strings.Count(mountinfoLines(), " "+m.dir+" "); n != 2 {
		t.Fatalf("%d mounts at %s with --allow-stacked, want 2", n, m.dir)
	}
	top.signal(syscall.SIGTERM)
	if !exitWithin(top, 15*time.Second) || exitCode(top) != 0 {
		t.Fatalf("stacked mount did not stop cleanly: %v\n%s", top.err, top.output())
	}
	if !isMounted(m.dir) || m.exited() {
		t.Fatal("stopping the stacked mount took the one below with it")
	}
	if _, err := os.Stat(filepath.Join(m.dir, "below")); err != nil {
		t.Fatalf("the mount below: %v", err)
	}
}

func mountinfoLines() string {
	b, _ := os.ReadFile("/proc/self/mountinfo")
	return string(b)
}
