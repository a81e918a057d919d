package fs

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// notifyIncEpoch is FUSE_NOTIFY_INC_EPOCH (protocol 7.44, Linux 6.16): the
// kernel looks up again every name it cached before the notification.
// go-fuse has no call for it.
const notifyIncEpoch = 8

// nameEpoch makes the kernel forget every name it caches. That is how a
// revoked directory lock drops the kernel's names: FUSE_NOTIFY_INVAL_ENTRY,
// per name, waits for the directory's lock in the kernel, which a request
// of this mount may hold while the server waits for this very revocation
// (a deadlock). The epoch takes no lock; its cost is that names of other
// directories are looked up again too (from the client's cache).
type nameEpoch struct {
	fd int // a /dev/fuse descriptor of this mount's connection
}

// bump increments the epoch: the kernel trusts no name cached before it.
func (e *nameEpoch) bump() error {
	// fuse_out_header: len, error (the notification's code), unique (0:
	// a notification)
	var hdr [16]byte
	binary.LittleEndian.PutUint32(hdr[0:], uint32(len(hdr)))
	binary.LittleEndian.PutUint32(hdr[4:], notifyIncEpoch)
	if _, err := syscall.Write(e.fd, hdr[:]); err != nil {
		return fmt.Errorf("fs: FUSE_NOTIFY_INC_EPOCH: %w", err)
	}
	return nil
}

// fuseFDs lists this process's open /dev/fuse descriptors.
func fuseFDs() map[int]bool {
	fds := map[int]bool{}
	ents, _ := os.ReadDir("/proc/self/fd")
	for _, e := range ents {
		var fd int
		if _, err := fmt.Sscan(e.Name(), &fd); err != nil {
			continue
		}
		if target, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name())); err == nil && target == "/dev/fuse" {
			fds[fd] = true
		}
	}
	return fds
}

// newNameEpoch finds the descriptor a mount opened (one of after, not in
// before) and checks that the kernel knows the notification; nil if not.
func newNameEpoch(before, after map[int]bool) (*nameEpoch, error) {
	for fd := range after {
		if before[fd] {
			continue
		}
		e := &nameEpoch{fd: fd}
		if err := e.bump(); err != nil {
			return nil, err
		}
		return e, nil
	}
	return nil, fmt.Errorf("fs: no /dev/fuse descriptor of the new mount found")
}
