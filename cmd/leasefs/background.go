package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// Background mounts (mount --background, and mount(8)'s helper for
// fuse.leasefs): the command starts itself again, detached in a session
// of its own, and returns once the child says the file system is mounted,
// or fails with the child's error. The child reports on a pipe whose
// descriptor it finds in readyFDEnv.

const readyFDEnv = "LEASEFS_READY_FD"

// quietBackground leaves out the line saying where a background mount
// runs and logs.
var quietBackground bool

// readyPipe is the pipe to the parent of a background mount (nil in the
// foreground); readyTaken keeps it from being reported on twice.
var readyPipe = func() *os.File {
	s := os.Getenv(readyFDEnv)
	if s == "" {
		return nil
	}
	os.Unsetenv(readyFDEnv) // not for what this process starts
	fd, err := strconv.Atoi(s)
	if err != nil {
		return nil
	}
	return os.NewFile(uintptr(fd), "ready")
}()

// reportReady tells a background mount's parent that the mount is up
// (err nil) or failed, and reports whether it did: a no-op in the
// foreground and after the first call.
func reportReady(err error) bool {
	if readyPipe == nil {
		return false
	}
	msg := "ok\n"
	if err != nil {
		msg = "error: " + err.Error() + "\n"
	}
	_, _ = readyPipe.WriteString(msg)
	_ = readyPipe.Close()
	readyPipe = nil
	return true
}

// startBackground runs `leasefs ARGS` (a foreground mount) detached and
// waits until it is mounted. Its log goes to logFile, else where this
// process's stderr goes unless that is a terminal (a systemd unit's
// journal, a file), else to a file under defaultLogDir, which it names.
func startBackground(args []string, mountpoint, logFile string) error {
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("--background: %w", err)
	}
	if logFile == "" && isTerminal(os.Stderr) {
		logFile = filepath.Join(defaultLogDir(), "mount-"+pathName(mountpoint)+".log")
		args = append([]string{args[0], "--log-file", logFile}, args[1:]...)
	}
	out := os.Stderr
	if logFile != "" {
		// the child opens its --log-file itself; its stderr catches a panic
		if out, err = openLog(logFile); err != nil {
			return err
		}
		defer out.Close()
	}
	r, w, err := os.Pipe()
	if err != nil {
		return err
	}
	defer r.Close()
	cmd := exec.Command(exe, args...)
	cmd.Env = append(os.Environ(), readyFDEnv+"=3")
	cmd.ExtraFiles = []*os.File{w}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	cmd.Dir = "/"
	if err := cmd.Start(); err != nil {
		w.Close()
		return fmt.Errorf("--background: %w", err)
	}
	w.Close()
	msg, _ := io.ReadAll(io.LimitReader(r, 64<<10))
	if string(msg) == "ok\n" {
		if quietBackground {
			return cmd.Process.Release()
		}
		where := "its log: " + logFile
		if logFile == "" {
			where = "it logs to this command's stderr"
		}
		fmt.Fprintf(os.Stderr, "leasefs: mounted at %s, served by process %d in the background (%s)\n", mountpoint, cmd.Process.Pid, where)
		return cmd.Process.Release()
	}
	werr := cmd.Wait()
	if text := strings.TrimSpace(strings.TrimPrefix(string(msg), "error: ")); text != "" {
		return errors.New(text)
	}
	return fmt.Errorf("the background mount exited before it was mounted (%v); see its log", werr)
}

// defaultLogDir is where a background mount logs when nothing says where.
func defaultLogDir() string {
	if os.Geteuid() == 0 {
		return "/var/log/leasefs"
	}
	if d := os.Getenv("XDG_STATE_HOME"); d != "" {
		return filepath.Join(d, "leasefs")
	}
	if h, err := os.UserHomeDir(); err == nil {
		return filepath.Join(h, ".local", "state", "leasefs")
	}
	return os.TempDir()
}

// pathName makes a mountpoint a file name: /mnt/data -> mnt-data.
func pathName(p string) string {
	p = strings.Trim(filepath.Clean(p), "/")
	if p == "" {
		return "root"
	}
	return strings.ReplaceAll(p, "/", "-")
}

// openLog opens (creates) a log file for appending, and its directory.
func openLog(path string) (*os.File, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return nil, fmt.Errorf("--log-file: %w", err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o640)
	if err != nil {
		return nil, fmt.Errorf("--log-file: %w", err)
	}
	return f, nil
}

func isTerminal(f *os.File) bool {
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}
