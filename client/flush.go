package client

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/leasefs/leasefs/cache"
	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/wire"
)

// Flush sends ino's buffered writes to the server, then the pages the
// kernel wrote back from a mapping of it (WritePage), which are newer than
// any buffered write they overlap: a write() buffered after them made the
// kernel drop those pages (and a fill of them sends the writes buffered
// before, flushBuffered).
func (c *Client) Flush(ctx context.Context, ino ids.Ino) error {
	if err := c.wb.flushBuffered(ctx, ino); err != nil {
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
func (w *writeBack) flushBuffered(ctx context.Context, ino ids.Ino) error {
	f := w.file(ino, false)
	if f == nil {
		return nil
	}
	wctx, cancel := w.c.opContext(ctx, false)
	defer cancel()
	if w.c.behind.busy(ino) {
		if err := f.mu.lock(wctx); err != nil {
			return w.c.softErr(ctx, err)
		}
		sent, err := w.flushWithCreate(ctx, ino, f)
		f.mu.unlock()
		if sent {
			return err
		}
	}
	// a file created behind the caller: its writes go after its create
	// (they are sent without waitFor, several at once)
	if err := w.c.behind.wait(wctx, ino); err != nil {
		return w.c.softErr(ctx, err)
	}
	if err := f.mu.lock(wctx); err != nil {
		return w.c.softErr(ctx, err)
	}
	defer f.mu.unlock()
	reqs, err := w.changeRequests(ctx, ino, f)
	if err != nil {
		if refused(err) {
			w.loseFile(ino, f, err)
			w.retire(ino, f)
			return nil
		}
		return err // kept, to be sent again
	}
	defer releaseWrites(reqs)
	attrs := f.attrs
	if attrs != nil && len(reqs) == 1 && reqs[0].Op == wire.OpWrite {
		// one write carries the attribute change: one round trip (with
		// several, concurrent writes, the change must follow them all)
		withAttrs(reqs[0], attrs)
		attrs = nil
	}
	sent := &sentWrites{reqs: reqs, base: f.base}
	err = w.sendWrites(ctx, f, sent)
	if err == nil && attrs != nil {
		// if this is refused, the reclaim sends the writes again: the
		// server answers them from its record of them, then takes the
		// attributes
		_, err = w.c.send(ctx, attrs, sendOpts{apply: ownVersion, failOnNack: true, cacheGen: f.gen})
	}
	if w.removedWhileDirty(ino, f, err) {
		err = nil
	}
	switch {
	case err == nil:
	case errors.Is(err, errRecovered):
		// The server failed us while we flushed: what is left may only
		// be reclaimed (reclaimFile).
		w.reclaimFile(ctx, ino, f, sent)
	case refused(err):
		w.loseFile(ino, f, err)
	default:
		return err // kept, to be sent again
	}
	w.retire(ino, f)
	return nil
}

// changeRequests returns the requests that send f's buffered writes: the
// block commits once their blocks are put (inBlocks), else writes
// carrying the data.
func (w *writeBack) changeRequests(ctx context.Context, ino ids.Ino, f *dirtyFile) ([]*wire.Request, error) {
	exts := f.extents()
	if !w.inBlocks(ino, exts) {
		return packWrites(ino, exts), nil
	}
	return w.putBlocks(ctx, w.c.blockStore(), ino, exts)
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
func (w *writeBack) loseFile(ino ids.Ino, f *dirtyFile, err error) {
	if gone(err) {
		// a create sent behind that failed (removedWhileDirty took a
		// removal): its error, not "no such file"
		if lerr := w.c.behind.lostErr(ino); lerr != nil {
			err = lerr
		}
	}
	w.c.Counters.DataLost.Add(1)
	w.lost(ino, err)
	w.c.mu.Lock()
	w.c.cache.DropData(ino)
	w.c.cache.InvalidateAttr(ino)
	w.c.mu.Unlock()
	// the kernel's size and pages came from the lost writes; the flush may
	// run for a FUSE request holding the kernel's locks (a read of it)
	w.c.invalidateLater(ino)
	w.c.log.Error("DATA LOST: the server refused a file's buffered changes; "+
		"the next fsync or close of the file returns EIO (ENOSPC for want of space)", "path", w.c.PathOf(ino), "ino", ino, "bytes", f.bytes, "err", err)
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
func (w *writeBack) flushWithCreate(ctx context.Context, ino ids.Ino, f *dirtyFile) (bool, error) {
	if w.inBlocks(ino, f.extents()) {
		return false, nil // its blocks are committed once the create is at the server
	}
	reqs := packWrites(ino, f.extents())
	defer releaseWrites(reqs)
	if len(reqs) != 1 {
		return false, nil
	}
	write := reqs[0]
	if f.attrs != nil {
		withAttrs(write, f.attrs)
	}
	// A batch is sent again after a NACK, when others may have written
	// the file since (our locks were stolen): as in a reclaim, the write
	// applies only to the version it was based on.
	write.Flags |= wire.WriteIfVersion
	write.Version = f.base
	sent, rep, err := w.c.behind.sendWithHeld(ctx, ino, write)
	if !sent {
		return false, nil
	}
	switch {
	case err == nil:
		// our own change under our X lock, which a revocation can take
		// only after this flush (it flushes the file first)
		if rep.Attr != nil {
			w.c.mu.Lock()
			w.c.cache.SetAttr(rep.Attr)
			ownVersion(w.c.cache, rep)
			w.c.mu.Unlock()
			f.base = max(f.base, rep.Attr.Version)
		}
	case w.removedWhileDirty(ino, f, err):
	case wire.CodeOf(err) == wire.CodeStale:
		// sent again after a NACK, and the file changed meanwhile:
		// the reclaim finds so too, and reports the data lost
		w.reclaimFile(ctx, ino, f, &sentWrites{reqs: reqs, answered: make([]bool, len(reqs)), base: f.base})
	case refused(err):
		w.loseFile(ino, f, err)
	default:
		return true, err
	}
	w.retire(ino, f)
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
func (w *writeBack) removedWhileDirty(ino ids.Ino, f *dirtyFile, err error) bool {
	if !gone(err) {
		return false
	}
	if w.c.behind.isLost(ino) {
		return false // never made at the server (behind.create): the writes fail
	}
	w.c.log.Debug("buffered changes of a removed file dropped", "ino", ino, "bytes", f.bytes)
	return true
}

// withAttrs makes the write w carry the attribute change a.
func withAttrs(w, a *wire.Request) {
	w.Valid, w.Mode, w.Uid, w.Gid = a.Valid, a.Mode, a.Uid, a.Gid
	w.Atime, w.Mtime, w.Ctime = a.Atime, a.Mtime, a.Ctime
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
func (w *writeBack) sendWrites(ctx context.Context, f *dirtyFile, sent *sentWrites) error {
	reqs := sent.reqs
	sent.answered = make([]bool, len(reqs))
	index := make(map[*wire.Request]int, len(reqs))
	for i, r := range reqs {
		index[r] = i
	}
	var versionMu sync.Mutex
	send := func(r *wire.Request) error {
		rep, err := w.c.send(ctx, r, sendOpts{apply: ownVersion, failOnNack: true, cacheGen: f.gen})
		if err == nil {
			versionMu.Lock()
			sent.answered[index[r]] = true
			if rep.Attr != nil {
				// Our own writes move the version on; a reclaim
				// compares against the newest one we caused.
				f.base = max(f.base, rep.Attr.Version)
			}
			versionMu.Unlock()
			w.c.maps.sawVersion(r.Ino, rep.Attr.Version)
		}
		return err
	}
	if len(reqs) <= 1 || reqs[0].Op == wire.OpCommitBlocks {
		// commits of one file would only conflict at the server
		for _, r := range reqs {
			if err := send(r); err != nil {
				return err
			}
		}
		return nil
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

// flushAll flushes every dirty file, after the changes sent behind the
// caller; it returns the first failure, after trying every file.
func (w *writeBack) flushAll(ctx context.Context) error {
	if err := w.c.behind.opWait(ctx, w.c.behind.waitAll); err != nil {
		w.c.log.Warn("changes sent behind the caller not at the server", "err", err)
		return fmt.Errorf("changes sent behind: %w", err)
	}
	w.mu.Lock()
	inos := make([]ids.Ino, 0, len(w.files))
	for ino := range w.files {
		inos = append(inos, ino)
	}
	w.mu.Unlock()
	inos = append(inos, w.c.maps.queuedFiles()...)
	var first error
	for _, ino := range inos {
		if err := w.c.Flush(ctx, ino); err != nil {
			w.c.log.Warn("flush of buffered writes failed", "ino", ino, "err", err)
			first = cmp.Or(first, fmt.Errorf("flush of inode %v: %w", ino, err))
		}
	}
	return first
}

// FlushAll flushes every dirty file, after the changes sent behind the
// caller; it returns the first failure, after trying every file.
func (c *Client) FlushAll(ctx context.Context) error { return c.wb.flushAll(ctx) }

// flushOld flushes files dirty for longer than flushAge, so a crash of this
// client loses at most that much of what it buffered.
func (w *writeBack) flushOld(ctx context.Context) {
	w.mu.Lock()
	var old []ids.Ino
	for ino, f := range w.files {
		if f.mu.tryLock() {
			if f.dirty() && time.Since(f.since) > flushAge {
				old = append(old, ino)
			}
			f.mu.unlock()
		}
	}
	w.mu.Unlock()
	old = append(old, w.c.maps.oldQueues(flushAge)...)
	for _, ino := range old {
		_ = w.c.Flush(ctx, ino)
	}
}
