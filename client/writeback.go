package client

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
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
	// flushing every 8 MiB rewrote the same chunks over and over.
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
	// one slice moved the slice's tail each time: 16,384 random pages
	// took 250 ms.
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

type writeback struct {
	mu    sync.Mutex
	files map[ids.Ino]*dirtyFile
	total atomic.Int64 // bytes in the extents of all files
	// lost counts lost-write events per inode; a handle that saw fewer
	// reports EIO on its next fsync or close, or lostErr's error if the
	// last was a refusal for want of space.
	lost    map[ids.Ino]uint64
	lostErr map[ids.Ino]error
}

func (w *writeback) file(ino ids.Ino, create bool) *dirtyFile {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.files == nil {
		w.files = map[ids.Ino]*dirtyFile{}
	}
	if w.lost == nil {
		// (lost may have made them: written-back pages lost first)
		w.lost = map[ids.Ino]uint64{}
		w.lostErr = map[ids.Ino]error{}
	}
	f := w.files[ino]
	if f == nil && create {
		f = &dirtyFile{mu: newCtxMutex(), since: time.Now()}
		w.files[ino] = f
	}
	return f
}

// retire empties f, which its caller holds locked, and forgets it, once
// its changes are at the server (or lost).
func (w *writeback) retire(ino ids.Ino, f *dirtyFile) {
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
func (w *writeback) lockFile(ctx context.Context, ino ids.Ino) (*dirtyFile, error) {
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
func (c *Client) LostGen(ino ids.Ino) uint64 {
	c.wb.mu.Lock()
	defer c.wb.mu.Unlock()
	return c.wb.lost[ino]
}

// LostErr is why ino's last buffered writes were lost, if the server
// refused them for want of space (wire.CodeNoSpace); nil otherwise.
func (c *Client) LostErr(ino ids.Ino) error {
	c.wb.mu.Lock()
	defer c.wb.mu.Unlock()
	return c.wb.lostErr[ino]
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
		buffered, fileBytes, killed, err := c.buffer(ctx, ino, off, data, killSuidgid)
		if err != nil {
			return false, err
		}
		if buffered {
			if fileBytes >= flushThreshold || c.wb.total.Load() >= DirtyBudget {
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
// returned, with the bytes the file buffers. Lock order: the file's mu,
// then c.mu (Flush holds the file's mu while it calls). It fails only if
// ctx ends while it waits for a flush of the file.
func (c *Client) bufferChange(ctx context.Context, ino ids.Ino, fields uint32, change func(f *dirtyFile, attr *wire.Attr)) (*wire.Attr, int, error) {
	if c.spaceShort() {
		return nil, 0, nil
	}
	wctx, cancel := c.opContext(ctx, false)
	f, err := c.wb.lockFile(wctx, ino)
	cancel()
	if err != nil {
		return nil, 0, c.softErr(ctx, err)
	}
	defer f.mu.unlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.leasesValid(c.clk.Now()) {
		return nil, 0, nil
	}
	if mode, _ := c.cache.Mode(ino); mode != wire.LockExclusive {
		return nil, 0, nil
	}
	attr, ok := c.cache.Attr(ino)
	if !ok {
		return nil, 0, nil
	}
	if !f.dirty() {
		f.base = attr.Version
		f.since = time.Now()
		f.gen = c.cacheGen
	}
	change(f, attr)
	c.cache.SetLocal(attr, fields)
	if fields&wire.SetMode != 0 {
		// an access ACL follows the mode: asked again, after this change
		// reached the server (GetXattr)
		c.cache.ModeChanged(ino)
	}
	return attr, f.bytes, nil
}

// retire forgets f, ino's dirty file, which its caller holds locked, once
// its changes are at the server (or lost), and the cache its buffered
// attributes if f is still ino's: a flush that waited for f while another
// sent it finds it retired, and a change buffered since (in a new dirty
// file) keeps its attributes. While f.mu is held, f stays ino's if it is.
func (c *Client) retire(ino ids.Ino, f *dirtyFile) {
	c.wb.mu.Lock()
	current := c.wb.files[ino] == f
	c.wb.mu.Unlock()
	if current {
		c.mu.Lock()
		c.cache.LocalDone(ino)
		c.mu.Unlock()
	}
	c.wb.retire(ino, f)
}

// buffer records a write if the client may keep it, and with killSuidgid
// the mode it leaves (Write); it returns the bytes its file then buffers
// and whether it changed the mode.
func (c *Client) buffer(ctx context.Context, ino ids.Ino, off uint64, data []byte, killSuidgid bool) (ok bool, fileBytes int, killed bool, err error) {
	attr, fileBytes, err := c.bufferChange(ctx, ino, wire.SetSize|wire.SetMtime|wire.SetCtime, func(f *dirtyFile, attr *wire.Attr) {
		if killSuidgid && killPrivs(f, attr) {
			killed = true
			c.cache.SetLocal(attr, wire.SetMode)
		}
		// the server drops file capabilities as the write reaches it
		c.cache.Written(ino)
		if f.attrs != nil {
			// the write sets the times when it reaches the server, after a
			// buffered utimes would: the times the write gives win
			f.attrs.Valid &^= wire.SetMtime | wire.SetCtime
		}
		before := f.bytes
		f.add(off, data)
		c.wb.total.Add(int64(f.bytes - before))
		c.cache.WriteData(ino, off, data, attr.Size)
		attr.Size = max(attr.Size, off+uint64(len(data)))
		attr.Mtime = time.Now().UnixNano()
		attr.Ctime = attr.Mtime
	})
	return attr != nil, fileBytes, killed, err
}

// bufferAttr records an attribute change (req.Valid within bufferedAttrs)
// if the client may keep it, the way the server would make it, and
// returns the attributes it gives.
func (c *Client) bufferAttr(ctx context.Context, req *wire.Request) (*wire.Attr, error) {
	attr, _, err := c.bufferChange(ctx, req.Ino, req.Valid|wire.SetCtime, func(f *dirtyFile, attr *wire.Attr) {
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

// Flush sends ino's buffered writes to the server, then the pages the
// kernel wrote back from a mapping of it (WritePage), which are newer than
// any buffered write they overlap: a write() buffered after them made the
// kernel drop those pages (and a fill of them sends the writes buffered
// before, flushBuffered).
func (c *Client) Flush(ctx context.Context, ino ids.Ino) error {
	if err := c.flushBuffered(ctx, ino); err != nil {
		return err
	}
	return c.sendMapped(ctx, ino)
}

// flushBuffered sends ino's buffered writes to the server, concurrently
// (they are disjoint: their order does not matter), then its buffered
// attribute change.
//
// A change the server refuses (wire.Error: a file too large for it, a
// full disk, a create sent behind that failed) fails the file, not the
// flush's caller: its buffered changes are dropped and reported lost
// (loseFile), and the file's next fsync or close returns EIO. The flush
// then returns nil, so a revocation is acknowledged and the client keeps
// its session and its other files' changes. Only the loss of the server
// (what can be sent again later) fails it.
func (c *Client) flushBuffered(ctx context.Context, ino ids.Ino) error {
	f := c.wb.file(ino, false)
	if f == nil {
		return nil
	}
	wctx, cancel := c.opContext(ctx, false)
	defer cancel()
	if c.behind.busy(ino) {
		if err := f.mu.lock(wctx); err != nil {
			return c.softErr(ctx, err)
		}
		sent, err := c.flushWithCreate(ctx, ino, f)
		f.mu.unlock()
		if sent {
			return err
		}
	}
	// a file created behind the caller: its writes go after its create
	// (they are sent without waitFor, several at once)
	if err := c.behind.wait(wctx, ino); err != nil {
		return c.softErr(ctx, err)
	}
	if err := f.mu.lock(wctx); err != nil {
		return c.softErr(ctx, err)
	}
	defer f.mu.unlock()
	reqs := packWrites(ino, f.extents())
	defer releaseWrites(reqs)
	attrs := f.attrs
	if attrs != nil && len(reqs) == 1 {
		// one write carries the attribute change: one round trip (with
		// several, concurrent writes, the change must follow them all)
		withAttrs(reqs[0], attrs)
		attrs = nil
	}
	sent := &sentWrites{reqs: reqs, base: f.base}
	err := c.sendWrites(ctx, f, sent)
	if err == nil && attrs != nil {
		// if this is refused, the reclaim sends the writes again: the
		// server answers them from its record of them, then takes the
		// attributes
		_, err = c.send(ctx, attrs, sendOpts{apply: ownVersion, failOnNack: true, cacheGen: f.gen})
	}
	if c.removedWhileDirty(ino, f, err) {
		err = nil
	}
	switch {
	case err == nil:
	case errors.Is(err, errRecovered):
		// The server failed us while we flushed: what is left may only
		// be reclaimed (reclaimFile).
		c.reclaimFile(ctx, ino, f, sent)
	case refused(err):
		c.loseFile(ino, f, err)
	default:
		return err // kept, to be sent again
	}
	c.retire(ino, f)
	return nil
}

// refused reports whether the server answered a flushed change with an
// error: sending it again would only get the same answer. (A NACK, a
// redirect or a server that cannot serve never gets here: send handles
// them.) A server that is closing (interrupted) or asks to try again did
// not refuse the change.
func refused(err error) bool {
	var we *wire.Error
	if !errors.As(err, &we) {
		return false // the server was not reached, or not in time
	}
	switch we.Code {
	case wire.CodeAgain, wire.CodeInterrupted, wire.CodeNack, wire.CodeRedirect, wire.CodeUnavailable:
		return false
	}
	return true
}

// loseFile drops f's buffered changes, which the server refused with err,
// and everything cached that they made (the file's size and pages): the
// file's next fsync or close on every handle returns EIO, or ENOSPC if the
// server had no space for them (as NFS reports a write error it cannot
// retry). Called with f.mu held, before f is retired.
func (c *Client) loseFile(ino ids.Ino, f *dirtyFile, err error) {
	if gone(err) {
		// a create sent behind that failed (removedWhileDirty took a
		// removal): its error, not "no such file"
		if lerr := c.behind.lostErr(ino); lerr != nil {
			err = lerr
		}
	}
	c.Counters.DataLost.Add(1)
	c.lost(ino, err)
	c.mu.Lock()
	c.cache.DropData(ino)
	c.cache.InvalidateAttr(ino)
	c.mu.Unlock()
	// the kernel's size and pages came from the lost writes; the flush may
	// run for a FUSE request holding the kernel's locks (a read of it)
	c.invalidateLater(ino)
	c.log.Error("DATA LOST: the server refused a file's buffered changes; "+
		"the next fsync or close of the file returns EIO (ENOSPC for want of space)", "path", c.PathOf(ino), "ino", ino, "bytes", f.bytes, "err", err)
}

// lost records a loss of ino's buffered writes for its handles (LostGen,
// LostErr).
func (c *Client) lost(ino ids.Ino, err error) {
	c.wb.mu.Lock()
	defer c.wb.mu.Unlock()
	if c.wb.lost == nil {
		c.wb.lost = map[ids.Ino]uint64{}
		c.wb.lostErr = map[ids.Ino]error{}
	}
	c.wb.lost[ino]++
	if wire.CodeOf(err) == wire.CodeNoSpace {
		c.wb.lostErr[ino] = err
	} else {
		delete(c.wb.lostErr, ino)
	}
}

// sentWrites is a flush's writes, which of them were answered, and the
// file's version before it.
type sentWrites struct {
	reqs     []*wire.Request
	answered []bool
	base     uint64
}

// flushWithCreate sends f's changes, if they make one write, in one batch
// with ino's create, if that is still held in its queue (createHold): the
// small file a tool creates, writes and closes costs one round trip and one
// server request. It reports whether it sent them. Called with f.mu held.
func (c *Client) flushWithCreate(ctx context.Context, ino ids.Ino, f *dirtyFile) (bool, error) {
	reqs := packWrites(ino, f.extents())
	defer releaseWrites(reqs)
	if len(reqs) != 1 {
		return false, nil
	}
	dir, queued, ok := c.behind.takeHeld(ino)
	if !ok {
		return false, nil
	}
	w := reqs[0]
	if f.attrs != nil {
		withAttrs(w, f.attrs)
	}
	// A batch is sent again after a NACK, when others may have written
	// the file since (our locks were stolen): as in a reclaim, the write
	// applies only to the version it was based on.
	w.Flags |= wire.WriteIfVersion
	w.Version = f.base
	c.Counters.CreatedWithData.Add(1)
	errs, reps := c.sendBatch(ctx, dir, append(queued[:len(queued):len(queued)], w))
	c.behindSent(dir, queued, errs[:len(queued)])
	c.behind.sent(dir)
	switch err := errs[len(queued)]; {
	case err == nil:
		// our own change under our X lock, which a revocation can take
		// only after this flush (it flushes the file first)
		if rep := reps[len(queued)]; rep.Attr != nil {
			c.mu.Lock()
			c.cache.SetAttr(rep.Attr)
			ownVersion(c.cache, rep)
			c.mu.Unlock()
			f.base = max(f.base, rep.Attr.Version)
		}
	case c.removedWhileDirty(ino, f, err):
	case wire.CodeOf(err) == wire.CodeStale:
		// sent again after a NACK, and the file changed meanwhile:
		// the reclaim finds so too, and reports the data lost
		c.reclaimFile(ctx, ino, f, &sentWrites{reqs: reqs, answered: make([]bool, len(reqs)), base: f.base})
	case refused(err):
		c.loseFile(ino, f, err)
	default:
		return true, err
	}
	c.retire(ino, f)
	return true, nil
}

// ownVersion, applied with a flushed change's reply, tells the cache that
// the version the change got is the cached pages' (they have it already).
func ownVersion(ch *cache.Cache, rep *wire.Reply) {
	if rep.Code == wire.CodeOK && rep.Attr != nil {
		ch.OwnVersion(rep.Attr.Ino, rep.Attr.Version)
	}
}

// gone reports whether a change failed because its file no longer exists
// (not CodeStale: that is a reclaim's failed version check).
func gone(err error) bool { return wire.CodeOf(err) == wire.CodeNotFound }

// removedWhileDirty reports (and logs) whether sending f's changes failed
// because the file was removed (its last link, and nobody has it open):
// nobody can read what was buffered any more.
func (c *Client) removedWhileDirty(ino ids.Ino, f *dirtyFile, err error) bool {
	if !gone(err) {
		return false
	}
	if c.behind.isLost(ino) {
		return false // never made at the server (createBehind): the writes fail
	}
	c.log.Debug("buffered changes of a removed file dropped", "ino", ino, "bytes", f.bytes)
	return true
}

// withAttrs makes the write w carry the attribute change a.
func withAttrs(w, a *wire.Request) {
	w.Valid, w.Mode, w.Uid, w.Gid = a.Valid, a.Mode, a.Uid, a.Gid
	w.Atime, w.Mtime, w.Ctime = a.Atime, a.Mtime, a.Ctime
}

// noVersion is a version no file has: a write sent with it as its
// WriteIfVersion is refused unless the server finds it applied already.
const noVersion = ^uint64(0)

// reclaimInterrupted sorts out the writes of a flush the server's NACK
// interrupted. Those answered are at the server; their ids must not go
// again (the server forgets the ids of changes the client went on from,
// and refuses a copy of one as stale). Each of the others may have been
// applied with its answer lost: sent with noVersion, one applied is
// answered from the server's record of it, one not applied is refused and
// changes nothing. It returns the writes not applied, and the version the
// file has if nobody else wrote it since: every write moves it on by one.
// (The flush numbered its writes as it sent them, not in file order.)
func (c *Client) reclaimInterrupted(ctx context.Context, sent *sentWrites) ([]*wire.Request, uint64, error) {
	version := sent.base
	var left []*wire.Request
	for i, r := range sent.reqs {
		if sent.answered[i] {
			version++
			continue
		}
		r.Flags |= wire.WriteIfVersion
		r.Version = noVersion
		for nacks := 0; ; nacks++ {
			_, err := c.send(ctx, r, sendOpts{failOnNack: true}) // (as reclaimFile's)
			switch {
			case errors.Is(err, errRecovered) && nacks < maxReclaimNacks:
				continue
			case err == nil:
				version++
			case wire.CodeOf(err) == wire.CodeStale:
				left = append(left, r)
			default:
				return nil, 0, err
			}
			break
		}
	}
	// In the order of their ids: each names the oldest change in flight,
	// and the server refuses a copy of one older than an oldest it saw.
	slices.SortFunc(left, func(a, b *wire.Request) int { return cmp.Compare(a.ReqID, b.ReqID) })
	return left, version, nil
}

// maxPending is how many extents dirtyFile.pending holds before they are
// merged into settled: a merge moves all extents, an insert into pending
// at most this many.
const maxPending = 256

// extents returns f's extents, in ascending order.
func (f *dirtyFile) extents() []extent {
	f.settle()
	return f.settled
}

// settle merges pending into settled, from the back, in place.
func (f *dirtyFile) settle() {
	n, m := len(f.settled), len(f.pending)
	if m == 0 {
		return
	}
	f.settled = slices.Grow(f.settled, m)[:n+m]
	i, j := n-1, m-1
	for k := n + m - 1; j >= 0; k-- {
		if i >= 0 && f.settled[i].off > f.pending[j].off {
			f.settled[k] = f.settled[i]
			i--
		} else {
			f.settled[k] = f.pending[j]
			j--
		}
	}
	clear(f.pending)
	f.pending = f.pending[:0]
}

// endingAfter returns the index of the first of the sorted extents that
// ends after off.
func endingAfter(extents []extent, off uint64) int {
	i, _ := slices.BinarySearchFunc(extents, off, func(e extent, off uint64) int {
		return cmp.Compare(e.end(), off+1)
	})
	return i
}

// add buffers a write of data at off: bytes of extents it overlaps are
// overwritten in place, the rest become new extents; a write that continues
// the last extent extends it, so sequential writes become large requests.
func (f *dirtyFile) add(off uint64, data []byte) {
	if len(data) == 0 {
		return
	}
	end := off + uint64(len(data))
	p := endingAfter(f.pending, off)
	if p < len(f.pending) && f.pending[p].off < end {
		f.settle()
		p = 0
	}
	// the first extent ending after off: extents before it are untouched
	i := endingAfter(f.settled, off)
	switch {
	case i == len(f.settled) && p == len(f.pending):
		f.appendAt(off, data)
		return
	case i == len(f.settled) || f.settled[i].off >= end:
		f.pending = slices.Insert(f.pending, p, extent{off: off, data: f.extentData(data)})
		f.bytes += len(data)
		if len(f.pending) >= maxPending {
			f.settle()
		}
		return
	}
	var merged []extent
	pos, j := off, i
	for ; j < len(f.settled) && f.settled[j].off < end; j++ {
		e := f.settled[j]
		if pos < e.off {
			merged = append(merged, extent{off: pos, data: f.extentData(data[pos-off : e.off-off])})
			f.bytes += int(e.off - pos)
		}
		lo, hi := max(off, e.off), min(end, e.end())
		copy(e.data[lo-e.off:hi-e.off], data[lo-off:hi-off])
		merged = append(merged, e)
		pos = hi
	}
	if pos < end {
		merged = append(merged, extent{off: pos, data: f.extentData(data[pos-off:])})
		f.bytes += int(end - pos)
	}
	f.settled = slices.Replace(f.settled, i, j, merged...)
}

// appendAt adds a write after every extent: it extends the last settled
// extent if it continues it, in chunk buffers for a sequential writer.
func (f *dirtyFile) appendAt(off uint64, data []byte) {
	for len(data) > 0 {
		n := len(f.settled)
		if n == 0 || f.settled[n-1].end() != off || len(f.settled[n-1].data) >= flushChunk {
			f.settled = append(f.settled, extent{off: off, data: newExtentData(len(data))})
			n++
		}
		last := &f.settled[n-1]
		take := min(len(data), flushChunk-len(last.data))
		if cap(last.data)-len(last.data) < take {
			last.data = growExtentData(last.data, take)
		}
		last.data = append(last.data, data[:take]...)
		f.bytes += take
		off += uint64(take)
		data = data[take:]
	}
}

func (e extent) end() uint64 { return e.off + uint64(len(e.data)) }

// chunkBufs holds flushChunk buffers: the extents a sequential writer
// fills, and the data of vectored write requests, which gather scattered
// pages. Fresh memory costs a page fault per 4 KiB on first touch: the
// cost of a sequential write's copy into its extent, and of a fresh 1 MiB
// buffer per vectored request. Extents of small writes stay on the heap,
// sized to their data: a random writer's thousands of extents must not
// take a chunk each.
var chunkBufs = sync.Pool{New: func() any { b := make([]byte, 0, flushChunk); return &b }}

// pooledExtent is the size from which an extent's data goes into a pooled
// chunk buffer.
const pooledExtent = flushChunk / 16

// newExtentData returns an empty buffer for an extent whose first write
// has n bytes.
func newExtentData(n int) []byte {
	if n >= pooledExtent {
		return (*chunkBufs.Get().(*[]byte))[:0]
	}
	return make([]byte, 0, n)
}

// growExtentData makes room for n more bytes after data: by doubling on
// the heap (append grows a large slice by a quarter, which copied a
// growing extent several times over), then in a pooled chunk buffer.
func growExtentData(data []byte, n int) []byte {
	if len(data)+n >= pooledExtent {
		return append(newExtentData(flushChunk), data...)
	}
	return slices.Grow(data, max(n, len(data)))
}

// Slabs: a random writer's page extents, thousands per file, each took
// fresh heap memory, and a page fault per page on first touch was a third
// of the mount's CPU in the suite's random writes. Past slabAfter extents,
// a file's small extents are carved from pooled slabs instead; the slabs
// go back when the file is retired. A file with few extents (most of
// them) keeps its data on the heap, sized to it: a slab each would cost
// an untar 64 KiB per small file.
const (
	slabSize  = 64 << 10
	slabAfter = 16
)

var slabBufs = sync.Pool{New: func() any { b := make([]byte, 0, slabSize); return &b }}

// extentData returns a copy of data for a new extent of f.
func (f *dirtyFile) extentData(data []byte) []byte {
	if len(f.settled)+len(f.pending) < slabAfter || len(data) > slabSize/4 {
		return bytes.Clone(data)
	}
	n := len(f.slabs)
	if n == 0 || cap(f.slabs[n-1])-len(f.slabs[n-1]) < len(data) {
		f.slabs = append(f.slabs, (*slabBufs.Get().(*[]byte))[:0])
		n++
	}
	slab := f.slabs[n-1]
	start := len(slab)
	slab = append(slab, data...)
	f.slabs[n-1] = slab
	// capped: growing the extent (appendAt) moves it, not over the next
	return slab[start:len(slab):len(slab)]
}

// free empties f and gives its buffers back, once nothing sends its
// extents any more.
func (f *dirtyFile) free() {
	freeExtents(f.settled)
	freeExtents(f.pending)
	for _, slab := range f.slabs {
		slab = slab[:0]
		slabBufs.Put(&slab)
	}
	f.settled, f.pending, f.slabs, f.bytes = nil, nil, nil, 0
}

// freeExtents gives the extents' chunk buffers back, once nothing sends
// them any more.
func freeExtents(extents []extent) {
	for _, e := range extents {
		if cap(e.data) == flushChunk {
			b := e.data[:0]
			chunkBufs.Put(&b)
		}
	}
}

// packWrites turns disjoint ascending extents into write requests of up
// to flushChunk bytes each: a large extent is split into plain writes;
// small ones share vectored writes (wire.Request.Spans), within the spans
// and chunks one request may carry. Random page writes thus cost one
// request and one transaction per few hundred pages, not one each.
func packWrites(ino ids.Ino, extents []extent) []*wire.Request {
	var (
		reqs      []*wire.Request
		cur       *wire.Request
		lastChunk uint64
		chunks    int
	)
	for _, e := range extents {
		for off := 0; off < len(e.data); {
			n := min(len(e.data)-off, flushChunk)
			pos := e.off + uint64(off)
			first, last := pos/serverChunk, (pos+uint64(n)-1)/serverChunk
			more := int(last-first) + 1
			if cur != nil && first == lastChunk {
				more--
			}
			if cur == nil || len(cur.Data)+n > flushChunk || len(cur.Spans) == wire.MaxSpans || chunks+more > maxRequestChunks {
				cur = &wire.Request{Op: wire.OpWrite, Ino: ino}
				reqs = append(reqs, cur)
				chunks, more = 0, int(last-first)+1
			}
			cur.Spans = append(cur.Spans, wire.Span{Off: pos, Len: uint32(n)})
			if cur.Data == nil {
				// the extent's own bytes, no copy: the flush sends them
				// under f.mu, which keeps writes out of the extents; the
				// capped slice makes a later span's append copy
				cur.Data = e.data[off : off+n : off+n]
			} else {
				if len(cur.Spans) == 2 {
					buf := *chunkBufs.Get().(*[]byte)
					cur.Data = append(buf[:0], cur.Data...)
				}
				cur.Data = append(cur.Data, e.data[off:off+n]...)
			}
			chunks += more
			lastChunk = last
			off += n
		}
	}
	for _, r := range reqs {
		if len(r.Spans) == 1 {
			// a plain write: what every server version takes
			r.Off, r.Spans = r.Spans[0].Off, nil
		}
	}
	return reqs
}

// releaseWrites returns the buffers of requests packWrites made, once
// nothing sends them any more.
func releaseWrites(reqs []*wire.Request) {
	for _, r := range reqs {
		if len(r.Spans) > 1 {
			b := r.Data[:0]
			chunkBufs.Put(&b)
			r.Data = nil
		}
	}
}

// writeRange is the bytes a write request covers, from its first to past
// its last byte.
func writeRange(r *wire.Request) (start, end uint64) {
	if len(r.Spans) == 0 {
		return r.Off, r.Off + uint64(len(r.Data))
	}
	last := r.Spans[len(r.Spans)-1]
	return r.Spans[0].Off, last.Off + uint64(last.Len)
}

const (
	// maxReclaimNacks bounds how often one reclaim is NACKed and retried.
	maxReclaimNacks = 8
	flushParallel   = 16
	serverChunk     = 64 << 10 // the server's chunk size: writes into one chunk conflict
	// maxRequestChunks bounds the server chunks one vectored write
	// touches (each a read-modify-write in the request's transaction):
	// as many as a plain write of wire.MaxData bytes.
	maxRequestChunks = wire.MaxData / serverChunk
)

// sendWrites sends the requests (disjoint writes, in ascending order), up
// to flushParallel at once; writes into the same server chunk go one after
// the other so their transactions do not conflict. It marks the ones
// answered. A failure leaves every write to be sent again, which is
// harmless: writing the same bytes twice gives the same file.
func (c *Client) sendWrites(ctx context.Context, f *dirtyFile, sent *sentWrites) error {
	reqs := sent.reqs
	sent.answered = make([]bool, len(reqs))
	index := make(map[*wire.Request]int, len(reqs))
	for i, r := range reqs {
		index[r] = i
	}
	var versionMu sync.Mutex
	send := func(r *wire.Request) error {
		rep, err := c.send(ctx, r, sendOpts{apply: ownVersion, failOnNack: true, cacheGen: f.gen})
		if err == nil {
			versionMu.Lock()
			sent.answered[index[r]] = true
			if rep.Attr != nil {
				// Our own writes move the version on; a reclaim
				// compares against the newest one we caused.
				f.base = max(f.base, rep.Attr.Version)
			}
			versionMu.Unlock()
			c.maps.sawVersion(r.Ino, rep.Attr.Version)
		}
		return err
	}
	if len(reqs) == 1 {
		return send(reqs[0])
	}
	var groups [][]*wire.Request
	var prevEnd uint64
	for i, r := range reqs {
		start, end := writeRange(r)
		if i > 0 && start/serverChunk == (prevEnd-1)/serverChunk {
			groups[len(groups)-1] = append(groups[len(groups)-1], r)
		} else {
			groups = append(groups, []*wire.Request{r})
		}
		prevEnd = end
	}
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		firstErr error
		next     = make(chan []*wire.Request)
	)
	for range min(flushParallel, len(groups)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for g := range next {
				for _, r := range g {
					if err := send(r); err != nil {
						mu.Lock()
						firstErr = cmp.Or(firstErr, err)
						mu.Unlock()
						break
					}
				}
			}
		}()
	}
	for _, g := range groups {
		next <- g
	}
	close(next)
	wg.Wait()
	return firstErr
}

// FlushAll flushes every dirty file, after the changes sent behind the
// caller; it returns the first failure, after trying every file.
func (c *Client) FlushAll(ctx context.Context) error {
	if err := c.waitBehind(ctx, c.behind.waitAll); err != nil {
		c.log.Warn("changes sent behind the caller not at the server", "err", err)
		return fmt.Errorf("changes sent behind: %w", err)
	}
	c.wb.mu.Lock()
	inos := make([]ids.Ino, 0, len(c.wb.files))
	for ino := range c.wb.files {
		inos = append(inos, ino)
	}
	c.wb.mu.Unlock()
	inos = append(inos, c.maps.queuedFiles()...)
	var first error
	for _, ino := range inos {
		if err := c.Flush(ctx, ino); err != nil {
			c.log.Warn("flush of buffered writes failed", "ino", ino, "err", err)
			first = cmp.Or(first, fmt.Errorf("flush of inode %v: %w", ino, err))
		}
	}
	return first
}

// flushOld flushes files dirty for longer than flushAge, so a crash of this
// client loses at most that much of what it buffered.
func (c *Client) flushOld(ctx context.Context) {
	c.wb.mu.Lock()
	var old []ids.Ino
	for ino, f := range c.wb.files {
		if f.mu.tryLock() {
			if f.dirty() && time.Since(f.since) > flushAge {
				old = append(old, ino)
			}
			f.mu.unlock()
		}
	}
	c.wb.mu.Unlock()
	old = append(old, c.maps.oldQueues(flushAge)...)
	for _, ino := range old {
		_ = c.Flush(ctx, ino)
	}
}

// reclaim runs after a NACK, in the new session, for every dirty file that
// no flush is sending at the moment (a flush reclaims its own file).
func (c *Client) reclaim(ctx context.Context) {
	c.wb.mu.Lock()
	files := make(map[ids.Ino]*dirtyFile, len(c.wb.files))
	for ino, f := range c.wb.files {
		files[ino] = f
	}
	c.wb.mu.Unlock()
	reclaim := func(ctx context.Context, ino ids.Ino, f *dirtyFile) {
		c.reclaimFile(ctx, ino, f, nil)
		c.retire(ino, f)
		f.mu.unlock()
	}
	for ino, f := range files {
		if c.behind.busy(ino) {
			// a file created behind the caller, its create perhaps in
			// the very batch whose NACK this recovery answers: reclaim
			// once it reached the server, not waiting for it here
			go func() {
				ctx := context.Background()
				_ = c.behind.wait(ctx, ino)
				_ = f.mu.lock(ctx)
				reclaim(ctx, ino, f)
			}()
		} else if f.mu.tryLock() {
			reclaim(ctx, ino, f)
		}
	}
}

// reclaimFile writes f's buffered data back if the file's version is still
// the one it was based on (nobody else wrote it meanwhile); otherwise the
// data is lost and reported. sent, if set, is a flush the server's NACK
// interrupted (reclaimInterrupted); otherwise the writes are new. Called
// with f.mu held.
func (c *Client) reclaimFile(ctx context.Context, ino ids.Ino, f *dirtyFile, sent *sentWrites) {
	if !f.dirty() {
		return
	}
	var (
		reqs    []*wire.Request
		version = f.base
		err     error
	)
	if sent == nil {
		reqs = packWrites(ino, f.extents())
		defer releaseWrites(reqs)
	} else {
		reqs, version, err = c.reclaimInterrupted(ctx, sent)
	}
	nacks := 0
	for i := 0; i < len(reqs) && err == nil; {
		r := reqs[i]
		r.Flags |= wire.WriteIfVersion
		r.Version = version
		var rep *wire.Reply
		// Not waiting for changes sent behind (call): this may run
		// on their sender, after a NACK. Whoever reclaims the file
		// waited for its own changes behind first.
		rep, err = c.send(ctx, r, sendOpts{failOnNack: true})
		if errors.Is(err, errRecovered) && nacks < maxReclaimNacks {
			// NACKed again (in a cluster a failover can take a few
			// servers): the version check alone keeps the reclaim safe
			nacks++
			err = nil
			continue
		}
		if err != nil {
			break
		}
		version = rep.Attr.Version
		i++
	}
	if err == nil && f.attrs != nil {
		// An attribute change carries no version check of its own: it
		// goes after the writes passed theirs, or alone if the file's
		// version is still the one it was based on.
		if len(reqs) == 0 {
			var rep *wire.Reply
			if rep, err = c.send(ctx, &wire.Request{Op: wire.OpGetAttr, Ino: ino}, sendOpts{failOnNack: true}); err == nil &&
				(rep.Attr == nil || rep.Attr.Version != version) {
				err = fmt.Errorf("the file changed at the server meanwhile")
			}
		}
		if err == nil {
			_, err = c.send(ctx, f.attrs, sendOpts{failOnNack: true})
		}
	}
	if c.removedWhileDirty(ino, f, err) {
		return
	}
	if err == nil {
		c.Counters.ReclaimsOK.Add(1)
		c.log.Info("reclaimed buffered writes after recovery", "path", c.PathOf(ino), "ino", ino, "bytes", f.bytes)
		return
	}
	c.Counters.ReclaimsRefused.Add(1)
	c.Counters.DataLost.Add(1)
	c.lost(ino, err)
	c.log.Error("DATA LOST: buffered writes could not be reclaimed after the server failed this client; "+
		"the next fsync or close of the file returns EIO", "path", c.PathOf(ino), "ino", ino, "bytes", f.bytes, "err", err)
}
