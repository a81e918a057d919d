// Package testuser lets a test running as root act as another user for a
// moment, in its own process: to make a socket or file another user owns,
// or to connect as that user, without starting a process as them.
package testuser

import (
	"fmt"
	"runtime"
	"syscall"
)

// Nobody is the uid and gid of the user nobody.
const Nobody = 65534

// Do runs fn on a thread of its own whose real, effective and saved uid
// and gid are uid and gid, and returns once fn did. Only that thread
// changes user (the raw system calls, unlike syscall.Setresuid, act on
// the calling thread alone), and it ends with fn: it is never given back
// to the Go scheduler. What fn does in system calls made from its own
// goroutine (socket, bind, listen, connect, open) is done as that user;
// fn must not hand its work to other goroutines.
func Do(uid, gid int, fn func()) error {
	errc := make(chan error, 1)
	go func() {
		// never unlocked: the thread exits with this goroutine
		runtime.LockOSThread()
		if _, _, e := syscall.RawSyscall(syscall.SYS_SETGROUPS, 0, 0, 0); e != 0 {
			errc <- fmt.Errorf("testuser: setgroups: %w", e)
			return
		}
		if _, _, e := syscall.RawSyscall(syscall.SYS_SETRESGID, uintptr(gid), uintptr(gid), uintptr(gid)); e != 0 {
			errc <- fmt.Errorf("testuser: setresgid %d: %w", gid, e)
			return
		}
		if _, _, e := syscall.RawSyscall(syscall.SYS_SETRESUID, uintptr(uid), uintptr(uid), uintptr(uid)); e != 0 {
			errc <- fmt.Errorf("testuser: setresuid %d: %w", uid, e)
			return
		}
		fn()
		errc <- nil
	}()
	return <-errc
}
