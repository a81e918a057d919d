package fs

import (
	"context"
	"math"
	"sync"
	"syscall"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/leasefs/leasefs/client"
	"github.com/leasefs/leasefs/wire"
)

// fileHandle is an open file.
type fileHandle struct {
	n       *Node
	flags   uint32
	lostGen uint64 // the file's lost-write generation this handle has reported

	mu     sync.Mutex
	owners map[uint64]bool // lock owners that locked through this handle
}

// newFileHandle opens a handle of n; Release closes it.
func newFileHandle(n *Node, flags uint32, lostGen uint64) *fileHandle {
	n.opens.Add(1)
	return &fileHandle{n: n, flags: flags, lostGen: lostGen}
}

var (
	_ = (gofs.FileReader)((*fileHandle)(nil))
	_ = (gofs.FileWriter)((*fileHandle)(nil))
	_ = (gofs.FileFlusher)((*fileHandle)(nil))
	_ = (gofs.FileFsyncer)((*fileHandle)(nil))
	_ = (gofs.FileReleaser)((*fileHandle)(nil))
	_ = (gofs.FileLseeker)((*fileHandle)(nil))
)

// Read reads from the server (or the mount's cache). A fill of a
// mapping's pages goes its own way (client.ReadPage).
func (h *fileHandle) Read(ctx context.Context, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	read := h.n.c.Read
	if h.n.mnt.x.of(ctx).pageRead {
		read = h.n.c.ReadPage
	}
	n, err := read(ctx, h.n.ino(), uint64(off), dest)
	if err != nil {
		return nil, toErrno(err)
	}
	return fuse.ReadResultData(dest[:n]), 0
}

// Write buffers under an X lock or writes through (client.Write). O_APPEND
// writes go to the end as the server sees it, so appends from several
// clients never overwrite each other. A writer without CAP_FSETID clears
// setuid and setgid as it writes (the kernel says so with the write). The
// kernel's write-back of a mapping's dirty pages is queued
// (client.WritePage).
func (h *fileHandle) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	x := h.n.mnt.x.of(ctx)
	if x.writeFlags&fuse.WRITE_CACHE != 0 {
		if err := h.n.c.WritePage(ctx, h.n.ino(), uint64(off), data); err != nil {
			return 0, toErrno(err)
		}
		return uint32(len(data)), 0
	}
	appendMode := h.flags&syscall.O_APPEND != 0
	if !appendMode {
		// cut short at the largest file, or EFBIG past it
		n, err := client.WriteFits(uint64(off), len(data))
		if err != nil {
			return 0, toErrno(err)
		}
		data = data[:n]
	}
	kill := x.writeFlags&fuse.WRITE_KILL_SUIDGID != 0
	changed, err := h.n.c.Write(ctx, h.n.ino(), uint64(off), data, appendMode, kill)
	if changed {
		// the kernel keeps the mode it had: a direct write changes
		// only its size and times (offset -1: attributes only)
		h.n.mnt.notify(h.n.ino(), -1, 0)
	}
	if err != nil {
		return 0, toErrno(err)
	}
	return uint32(len(data)), 0
}

// Lseek answers SEEK_DATA and SEEK_HOLE from the server, which knows the
// file's holes; the kernel handles the other whence values itself.
func (h *fileHandle) Lseek(ctx context.Context, off uint64, whence uint32) (uint64, syscall.Errno) {
	if whence != wire.SeekData && whence != wire.SeekHole {
		return 0, syscall.EINVAL
	}
	got, err := h.n.c.Seek(ctx, h.n.ino(), off, whence)
	if err != nil {
		return 0, toErrno(err)
	}
	return got, 0
}

// lostWrites reports EIO once for each loss of buffered writes of this file
// (the server failed this client and another client changed the file), or
// ENOSPC if the server had no space for them.
func (h *fileHandle) lostWrites() syscall.Errno {
	gen := h.n.c.LostGen(h.n.ino())
	h.mu.Lock()
	defer h.mu.Unlock()
	if gen > h.lostGen {
		h.lostGen = gen
		if err := h.n.c.LostErr(h.n.ino()); err != nil {
			return toErrno(err)
		}
		return syscall.EIO
	}
	return 0
}

// Flush is called on every close of a file descriptor: buffered writes go
// to the server, so close-to-open readers elsewhere see them.
func (h *fileHandle) Flush(ctx context.Context) syscall.Errno {
	if err := h.n.c.Flush(ctx, h.n.ino()); err != nil {
		return toErrno(err)
	}
	return h.lostWrites()
}

// Fsync returns once the file's data is durable on the server.
func (h *fileHandle) Fsync(ctx context.Context, flags uint32) syscall.Errno {
	if errno := toErrno(h.n.c.Fsync(ctx, h.n.ino())); errno != 0 {
		return errno
	}
	return h.lostWrites()
}

// Release is the last close of the handle.
func (h *fileHandle) Release(ctx context.Context) syscall.Errno {
	defer h.n.opens.Add(-1)
	h.releaseLocks()
	_ = h.n.c.Flush(context.Background(), h.n.ino())
	return toErrno(h.n.c.Release(context.Background(), h.n.ino()))
}

// dirHandle streams a directory. Offsets 1 and 2 are "." and ".."; after
// them an offset is the server's entry cookie plus 2, stable while entries
// are added or removed. A listing the mount's cache holds whole is served
// from there, without the server (rm -rf, find, ls of a tree this mount
// made), in name order: then an offset is localOff plus the entry's place
// in that order, and a seek to one (from another handle too) finds the
// place in the directory as it is then (from the cache, or else from the
// whole listing the server gives, put in name order).
type dirHandle struct {
	n     *Node
	after uint64 // offset of the last entry returned
	buf   []fuse.DirEntry
	eof   bool
	snap  []fuse.DirEntry // the listing in name order, if served that way
}

// localOff marks the offsets of a listing served in name order.
const localOff = 1 << 62

var (
	_ = (gofs.FileReaddirenter)((*dirHandle)(nil))
	_ = (gofs.FileSeekdirer)((*dirHandle)(nil))
)

const dotEntries = 2

// Readdirent returns the next entry, nil at the end.
func (d *dirHandle) Readdirent(ctx context.Context) (*fuse.DirEntry, syscall.Errno) {
	switch d.after {
	case 0:
		d.after = 1
		return &fuse.DirEntry{Name: ".", Mode: syscall.S_IFDIR, Ino: uint64(d.n.ino()), Off: 1}, 0
	case 1:
		d.after = 2
		return &fuse.DirEntry{Name: "..", Mode: syscall.S_IFDIR, Ino: 1, Off: 2}, 0
	}
	if len(d.buf) == 0 {
		if d.eof {
			return nil, 0
		}
		if d.after == dotEntries {
			if ents, ok := d.n.c.CachedListing(d.n.ino()); ok {
				d.snap = inNameOrder(ents)
				d.buf, d.eof = d.snap, true
				return d.Readdirent(ctx)
			}
		}
		ents, err := d.n.c.ReadDir(ctx, d.n.ino(), d.after-dotEntries, client.ReadDirPage)
		if err != nil {
			return nil, toErrno(err)
		}
		// fewer than asked only at the end (wire.OpReadDir): no second
		// request to learn that
		d.eof = len(ents) < client.ReadDirPage
		if len(ents) == 0 {
			return nil, 0
		}
		for _, e := range ents {
			d.buf = append(d.buf, fuse.DirEntry{Name: e.Name, Ino: uint64(e.Ino), Mode: e.Mode, Off: e.Off + dotEntries})
		}
	}
	de := d.buf[0]
	d.buf = d.buf[1:]
	d.after = de.Off
	return &de, 0
}

// Seekdir continues the stream after offset off.
func (d *dirHandle) Seekdir(ctx context.Context, off uint64) syscall.Errno {
	d.after, d.buf, d.eof = off, nil, false
	if off&localOff == 0 {
		d.snap = nil // a server cookie, or the start: the directory as it is now
		return 0
	}
	if d.snap == nil {
		ents, err := d.n.c.ListingByName(ctx, d.n.ino())
		if err != nil {
			return toErrno(err)
		}
		d.snap = inNameOrder(ents)
	}
	d.buf, d.eof = d.snap[min(off&^localOff, uint64(len(d.snap))):], true
	return 0
}

// inNameOrder makes a handle's entries of a listing in name order.
func inNameOrder(ents []wire.DirEntry) []fuse.DirEntry {
	out := make([]fuse.DirEntry, 0, len(ents))
	for i, e := range ents {
		out = append(out, fuse.DirEntry{Name: e.Name, Ino: uint64(e.Ino), Mode: e.Mode, Off: localOff | uint64(i+1)})
	}
	return out
}

var (
	_ = (gofs.FileGetlker)((*fileHandle)(nil))
	_ = (gofs.FileSetlker)((*fileHandle)(nil))
	_ = (gofs.FileSetlkwer)((*fileHandle)(nil))
)

func (h *fileHandle) posixLk(owner uint64, lk *fuse.FileLock, flags uint32) wire.PosixLk {
	end := lk.End
	if end >= math.MaxInt64 {
		end = math.MaxUint64 // to end of file
	}
	return wire.PosixLk{Flock: flags&fuse.FUSE_LK_FLOCK != 0, Type: uint8(lk.Typ), Start: lk.Start, End: end,
		Pid: lk.Pid, Owner: owner}
}

// Getlk reports a lock that would block lk (F_GETLK).
func (h *fileHandle) Getlk(ctx context.Context, owner uint64, lk *fuse.FileLock, flags uint32, out *fuse.FileLock) syscall.Errno {
	req := h.posixLk(owner, lk, flags)
	req.Get = true
	got, err := h.n.c.PosixLock(ctx, h.n.ino(), req)
	if err != nil {
		return toErrno(err)
	}
	out.Typ = uint32(got.Type)
	if got.Type != syscall.F_UNLCK {
		out.Start, out.End, out.Pid = got.Start, got.End, got.Pid
		if got.End == math.MaxUint64 {
			out.End = math.MaxInt64
		}
	}
	return 0
}

// Setlk sets a lock without waiting (F_SETLK, flock LOCK_NB).
func (h *fileHandle) Setlk(ctx context.Context, owner uint64, lk *fuse.FileLock, flags uint32) syscall.Errno {
	return h.setlk(ctx, h.posixLk(owner, lk, flags))
}

// Setlkw sets a lock, waiting for conflicting ones (F_SETLKW, flock).
func (h *fileHandle) Setlkw(ctx context.Context, owner uint64, lk *fuse.FileLock, flags uint32) syscall.Errno {
	req := h.posixLk(owner, lk, flags)
	req.Wait = true
	return h.setlk(ctx, req)
}

func (h *fileHandle) setlk(ctx context.Context, req wire.PosixLk) syscall.Errno {
	if req.Type != syscall.F_UNLCK {
		h.mu.Lock()
		if h.owners == nil {
			h.owners = map[uint64]bool{}
		}
		h.owners[req.Owner] = true
		h.mu.Unlock()
	}
	_, err := h.n.c.PosixLock(ctx, h.n.ino(), req)
	return toErrno(err)
}

// releaseLocks drops the POSIX and flock locks taken through this handle:
// the file is closed.
func (h *fileHandle) releaseLocks() {
	h.mu.Lock()
	owners := h.owners
	h.owners = nil
	h.mu.Unlock()
	for owner := range owners {
		_ = h.n.c.ReleaseLockOwner(context.Background(), h.n.ino(), owner)
	}
}

var _ = (gofs.FileFsyncdirer)((*dirHandle)(nil))

// Fsyncdir makes the directory's entries durable on the server.
func (d *dirHandle) Fsyncdir(ctx context.Context, flags uint32) syscall.Errno {
	return toErrno(d.n.c.Fsync(ctx, d.n.ino()))
}
