package client

import (
	"cmp"
	"context"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/leasefs/leasefs/cache"
	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/wire"
)

// Write-back under an exclusive data lock (DESIGN.md "Data locks"): while
// the client holds X on a file and its lease is valid, writes are buffered
// here and sent in large batches on fsync, close, read, attribute change,
// revocation, memory pressure and before the lease could lapse. After a
// NACK, dirty data is reclaimed only if the file's version at the server is
// still the one the data was based on; otherwise it is lost, counted, logged,
// and the next fsync or close of the file returns EIO.

const (
	// Buffered bytes of one file, and of all files together, before a
	// write flushes its file synchronously. Each flush rewrites every
	// server chunk it touches and stalls the writer: a random writer
	// flushing often would rewrite the same chunks over and over.
	flushThreshold = 64 << 20
	flushChunk     = 1 << 20 // bytes per write request when flushing
	flushAge       = 2 * time.Second
)

// DirtyBudget bounds the bytes a client buffers for all files together.
const DirtyBudget = 128 << 20

type extent struct {
	off  uint64
	data []byte
}

// dirtyFile is one file's buffered writes: disjoint extents in ascending
// order (extents()), a later write copied over the bytes of earlier ones it
// overlaps.
type dirtyFile struct {
	// mu is held while flushing, so flushes of one file are ordered; a
	// write waiting for it gives up when its context ends.
	mu ctxMutex
	// settled and pending are each sorted, and disjoint from each other
	// and between themselves. A write that overlaps nothing goes into
	// pending, a write that overlaps something into settled (after
	// settle); settle merges pending in once it holds maxPending extents
	// or the extents are wanted. Inserting every random page write into
	// one sorted slice would move the slice's tail each time, quadratic in
	// the extents.
	settled []extent
	pending []extent
	bytes   int // in extents
	// attrs is a buffered attribute change (mode, owner, times; never the
	// size), sent after the writes: tar, cp -p and rsync set three per file.
	attrs *wire.Request
	since time.Time
	base  uint64 // the file's version at the server the writes are based on
	// gen is the client's cache generation (Client.cacheGen) when the
	// file became dirty: once the cache was dropped since, the lock the
	// changes were made under is gone and they may only be reclaimed.
	gen uint64
	// slabs hold the data of small extents once the file has many
	// (extentData); the last has room.
	slabs [][]byte
}

// bufferedAttrs are the attribute changes a client may buffer under X:
// the ones a write request can carry.
const bufferedAttrs = wire.WriteAttrs

// dirty reports whether f holds anything not yet sent. Called with f.mu.
func (f *dirtyFile) dirty() bool { return len(f.settled)+len(f.pending) > 0 || f.attrs != nil }

// writeBack is the client's write-back: the dirty files, and the losses of
// their changes that handles report. It sends through its Client and
// keeps the cache under c.mu (lock order: doc.go).
type writeBack struct {
	c     *Client
	mu    sync.Mutex
	files map[ids.Ino]*dirtyFile
	total atomic.Int64 // bytes in the extents of all files
	// lostGens counts lost-write events per inode; a handle that saw
	// fewer reports EIO on its next fsync or close, or lostErrs's error if
	// the last was a refusal for want of space.
	lostGens map[ids.Ino]uint64
	lostErrs map[ids.Ino]error
}

func newWriteBack(c *Client) *writeBack {
	return &writeBack{c: c, files: map[ids.Ino]*dirtyFile{}, lostGens: map[ids.Ino]uint64{}, lostErrs: map[ids.Ino]error{}}
}

func (w *writeBack) file(ino ids.Ino, create bool) *dirtyFile {
	w.mu.Lock()
	defer w.mu.Unlock()
	f := w.files[ino]
	if f == nil && create {
		f = &dirtyFile{mu: newCtxMutex(), since: time.Now()}
		w.files[ino] = f
	}
	return f
}

// buffers reports whether ino has buffered writes, or is being written or
// flushed.
func (w *writeBack) buffers(ino ids.Ino) bool {
	f := w.file(ino, false)
	if f == nil {
		return false
	}
	if !f.mu.tryLock() {
		return true
	}
	defer f.mu.unlock()
	return f.bytes > 0
}

// holds reports whether ino has a dirty file (perhaps being flushed).
func (w *writeBack) holds(ino ids.Ino) bool { return w.file(ino, false) != nil }

// dirtyBytes is the bytes buffered for all files together.
func (w *writeBack) dirtyBytes() int64 { return w.total.Load() }

// unsent lists the files whose buffered changes have not reached a
// server, without waiting for anything (Client.Unsent).
func (w *writeBack) unsent() []Unsent {
	w.mu.Lock()
	files := make(map[ids.Ino]*dirtyFile, len(w.files))
	for ino, f := range w.files {
		files[ino] = f
	}
	w.mu.Unlock()
	var out []Unsent
	for ino, f := range files {
		n := -1
		if f.mu.tryLock() {
			dirty := f.dirty()
			n = f.bytes
			f.mu.unlock()
			if !dirty {
				continue
			}
		}
		out = append(out, Unsent{Ino: ino, Path: w.c.PathOf(ino), Bytes: n})
	}
	return out
}

// forget empties f, which its caller holds locked, and forgets it, once
// its changes are at the server (or lost).
func (w *writeBack) forget(ino ids.Ino, f *dirtyFile) {
	w.total.Add(-int64(f.bytes))
	f.free()
	f.attrs = nil
	w.mu.Lock()
	if w.files[ino] == f {
		delete(w.files, ino)
	}
	w.mu.Unlock()
}

// lockFile returns ino's dirty file, locked and still current: a flush
// that completed, or a reclaim, may have retired the one found first, and
// data added to a retired file would never be sent.
func (w *writeBack) lockFile(ctx context.Context, ino ids.Ino) (*dirtyFile, error) {
	for {
		f := w.file(ino, true)
		if err := f.mu.lock(ctx); err != nil {
			return nil, err
		}
		w.mu.Lock()
		current := w.files[ino] == f
		w.mu.Unlock()
		if current {
			return f, nil
		}
		f.mu.unlock()
	}
}

// LostGen returns ino's lost-write generation; fs handles remember it at
// open and compare at fsync and close.
func (c *Client) LostGen(ino ids.Ino) uint64 { return c.wb.lostGen(ino) }

// LostErr is why ino's last buffered writes were lost, if the server
// refused them for want of space (wire.CodeNoSpace); nil otherwise.
func (c *Client) LostErr(ino ids.Ino) error { return c.wb.lostErr(ino) }

// lost records a loss of ino's buffered writes for its handles (LostGen,
// LostErr).
func (w *writeBack) lost(ino ids.Ino, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.lostGens[ino]++
	if wire.CodeOf(err) == wire.CodeNoSpace {
		w.lostErrs[ino] = err
	} else {
		delete(w.lostErrs, ino)
	}
}

func (w *writeBack) lostGen(ino ids.Ino) uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.lostGens[ino]
}

func (w *writeBack) lostErr(ino ids.Ino) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.lostErrs[ino]
}

// killedMode is mode as a write by a caller without CAP_FSETID leaves it,
// as the server makes it (wire.SetKillSuidgid): no setuid, and no setgid
// with group execute.
func killedMode(mode uint32) uint32 {
	mode &^= syscall.S_ISUID
	if mode&syscall.S_IXGRP != 0 {
		mode &^= syscall.S_ISGID
	}
	return mode
}

// Write writes data at off, or at the end of the file in appendMode. Under
// an X lock with a valid lease and cached attributes it only buffers;
// otherwise it writes through, and the reply's grant lets the next write
// buffer. Appends always write through: buffered, they could only be
// reclaimed after a NACK if nobody else had appended meanwhile, and shared
// logs are what O_APPEND is for. killSuidgid, for a writer without
// CAP_FSETID (the kernel's FUSE_WRITE_KILL_SUIDGID), clears setuid and
// setgid as the write changes the file (killedMode); Write reports whether
// that may have changed the mode (the kernel's copy is then stale).
func (c *Client) Write(ctx context.Context, ino ids.Ino, off uint64, data []byte, appendMode, killSuidgid bool) (modeChanged bool, err error) {
	if c.maps.hasQueued(ino) {
		// Pages written back from a mapping are older than this write
		// (the kernel writes back what a write() overlaps before it):
		// they go first.
		if err := c.Flush(ctx, ino); err != nil {
			return false, err
		}
	}
	if !appendMode {
		// what no server takes is refused now, not when a flush of it
		// fails long after this write returned
		if n, err := WriteFits(off, len(data)); err != nil || n < len(data) {
			return false, cmp.Or(err, wire.Errf(wire.CodeTooBig, "a write of %d bytes at %d ends past %d", len(data), off, uint64(wire.MaxFileSize)))
		}
		buffered, fileBytes, killed, err := c.wb.buffer(ctx, ino, off, data, killSuidgid)
		if err != nil {
			return false, err
		}
		if buffered {
			if fileBytes >= flushThreshold || c.wb.dirtyBytes() >= DirtyBudget {
				return killed, c.Flush(ctx, ino)
			}
			return killed, nil
		}
	}
	if err := c.Flush(ctx, ino); err != nil {
		return false, err
	}
	req := &wire.Request{Op: wire.OpWrite, Ino: ino, Off: off, Data: data}
	if appendMode {
		req.Flags = wire.WriteAppend
	}
	if killSuidgid {
		// the server clears them in the write's transaction
		req.Valid = wire.SetKillSuidgid
		c.withCache(func(ch *cache.Cache) {
			a, ok := ch.Attr(ino)
			modeChanged = !ok || a.Mode != killedMode(a.Mode)
		})
	}
	defer c.changingData(ino)()
	rep, err := c.Call(ctx, req)
	if err == nil && rep.Attr != nil {
		c.maps.sawVersion(ino, rep.Attr.Version)
	}
	// the server dropped the file's capabilities with the write
	c.withCache(func(ch *cache.Cache) { ch.Written(ino) })
	if gone(err) {
		// a file whose create sent behind failed: that error
		err = cmp.Or(c.behind.lostErr(ino), err)
	}
	return modeChanged, err
}

// changingData brackets a change of ino's data sent to the server: no page
// of ino is cached or served from the cache until it returns (another
// client may see the change as soon as the server made it, before our
// reply arrives), and reads that raced with it cache nothing. Call the
// function it returns when the change is done.
func (c *Client) changingData(ino ids.Ino) func() {
	c.mu.Lock()
	c.cache.BeginChange(ino)
	c.mu.Unlock()
	return func() {
		c.mu.Lock()
		c.cache.EndChange(ino)
		c.mu.Unlock()
	}
}

// WriteFits returns how many of n bytes written at off fit in a file
// (wire.MaxFileSize, the largest the server takes), or EFBIG if none do: a
// write must be cut short there, as the kernel does at a file system's
// limit (it does not know this one: FUSE sets none).
func WriteFits(off uint64, n int) (int, error) {
	if n == 0 {
		return 0, nil
	}
	if off >= wire.MaxFileSize {
		return 0, wire.Errf(wire.CodeTooBig, "a write at %d: files end at %d", off, uint64(wire.MaxFileSize))
	}
	return int(min(uint64(n), wire.MaxFileSize-off)), nil
}

// bufferChange records a change of ino in its dirty file if the client
// may keep it (an X lock, a valid lease, cached attributes): change gets
// the file and the cached attributes to update, whose fields (wire.Set*
// bits; SetSize for writes) the cache then gives over what replies say
// until the change is at the server (cache.SetLocal, retire); they are
// returned, with the bytes the file buffers. It takes the file's mu, then
// c.mu (doc.go). It fails only if ctx ends while it waits for a flush of
// the file.
func (w *writeBack) bufferChange(ctx context.Context, ino ids.Ino, fields uint32, change func(f *dirtyFile, attr *wire.Attr)) (*wire.Attr, int, error) {
	if w.c.spaceShort() {
		return nil, 0, nil
	}
	wctx, cancel := w.c.opContext(ctx, false)
	f, err := w.lockFile(wctx, ino)
	cancel()
	if err != nil {
		return nil, 0, w.c.softErr(ctx, err)
	}
	defer f.mu.unlock()
	w.c.mu.Lock()
	defer w.c.mu.Unlock()
	if !w.c.leasesValid(w.c.clk.Now()) {
		return nil, 0, nil
	}
	if mode, _ := w.c.cache.Mode(ino); mode != wire.LockExclusive {
		return nil, 0, nil
	}
	attr, ok := w.c.cache.Attr(ino)
	if !ok {
		return nil, 0, nil
	}
	if !f.dirty() {
		f.base = attr.Version
		f.since = time.Now()
		f.gen = w.c.cacheGen
	}
	change(f, attr)
	w.c.cache.SetLocal(attr, fields)
	if fields&wire.SetMode != 0 {
		// an access ACL follows the mode: asked again, after this change
		// reached the server (GetXattr)
		w.c.cache.ModeChanged(ino)
	}
	return attr, f.bytes, nil
}

// retire forgets f, ino's dirty file, which its caller holds locked, once
// its changes are at the server (or lost), and the cache its buffered
// attributes if f is still ino's: a flush that waited for f while another
// sent it finds it retired, and a change buffered since (in a new dirty
// file) keeps its attributes. While f.mu is held, f stays ino's if it is.
func (w *writeBack) retire(ino ids.Ino, f *dirtyFile) {
	w.mu.Lock()
	current := w.files[ino] == f
	w.mu.Unlock()
	if current {
		w.c.mu.Lock()
		w.c.cache.LocalDone(ino)
		w.c.mu.Unlock()
	}
	w.forget(ino, f)
}

// buffer records a write if the client may keep it, and with killSuidgid
// the mode it leaves (Write); it returns the bytes its file then buffers
// and whether it changed the mode.
func (w *writeBack) buffer(ctx context.Context, ino ids.Ino, off uint64, data []byte, killSuidgid bool) (ok bool, fileBytes int, killed bool, err error) {
	st := w.c.blockStore() // (not under c.mu, which bufferChange holds)
	stream := st != nil && w.c.streams(st, uint64(len(data)))
	attr, fileBytes, err := w.bufferChange(ctx, ino, wire.SetSize|wire.SetMtime|wire.SetCtime, func(f *dirtyFile, attr *wire.Attr) {
		if killSuidgid && killPrivs(f, attr) {
			killed = true
			w.c.cache.SetLocal(attr, wire.SetMode)
		}
		// the server drops file capabilities as the write reaches it
		w.c.cache.Written(ino)
		if f.attrs != nil {
			// the write sets the times when it reaches the server, after a
			// buffered utimes would: the times the write gives win
			f.attrs.Valid &^= wire.SetMtime | wire.SetCtime
		}
		before := f.bytes
		f.add(off, data)
		w.total.Add(int64(f.bytes - before))
		if stream {
			w.c.cache.PatchData(ino, off, data, attr.Size)
		} else {
			w.c.cache.WriteData(ino, off, data, attr.Size)
		}
		attr.Size = max(attr.Size, off+uint64(len(data)))
		attr.Mtime = time.Now().UnixNano()
		attr.Ctime = attr.Mtime
	})
	return attr != nil, fileBytes, killed, err
}

// bufferAttr records an attribute change (req.Valid within bufferedAttrs)
// if the client may keep it, the way the server would make it, and
// returns the attributes it gives.
func (w *writeBack) bufferAttr(ctx context.Context, req *wire.Request) (*wire.Attr, error) {
	attr, _, err := w.bufferChange(ctx, req.Ino, req.Valid|wire.SetCtime, func(f *dirtyFile, attr *wire.Attr) {
		if f.attrs == nil {
			f.attrs = &wire.Request{Op: wire.OpSetAttr, Ino: req.Ino}
		}
		p, v := f.attrs, req.Valid
		p.Valid |= v
		if v&wire.SetMode != 0 {
			p.Mode = req.Mode
			attr.Mode = attr.Mode&syscall.S_IFMT | req.Mode&^syscall.S_IFMT
		}
		if v&wire.SetUid != 0 {
			p.Uid, attr.Uid = req.Uid, req.Uid
		}
		if v&wire.SetGid != 0 {
			p.Gid, attr.Gid = req.Gid, req.Gid
		}
		if v&wire.SetAtime != 0 {
			p.Atime, attr.Atime = req.Atime, req.Atime
		}
		if v&wire.SetMtime != 0 {
			p.Mtime, attr.Mtime = req.Mtime, req.Mtime
		}
		// the change time is now, unless given; sent as given, so that the
		// server keeps the time of the change, not of its flush
		p.Valid |= wire.SetCtime
		if v&wire.SetCtime != 0 {
			p.Ctime = req.Ctime
		} else {
			p.Ctime = time.Now().UnixNano()
		}
		attr.Ctime = p.Ctime
	})
	return attr, err
}

// killPrivs makes the change a write by a caller without CAP_FSETID makes
// to the mode on the cached attributes attr and f's buffered changes, and
// reports whether it changed the mode. Under the X lock the cached mode is
// the file's: the change is buffered as the mode it gives (its permission
// bits, and so an access ACL, stay as they are).
func killPrivs(f *dirtyFile, attr *wire.Attr) bool {
	mode := killedMode(attr.Mode)
	if mode == attr.Mode {
		return false
	}
	attr.Mode = mode
	if f.attrs == nil {
		f.attrs = &wire.Request{Op: wire.OpSetAttr, Ino: attr.Ino}
	}
	f.attrs.Valid |= wire.SetMode
	f.attrs.Mode = mode &^ syscall.S_IFMT
	return true
}
