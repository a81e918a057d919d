package client

import (
	"bytes"
	"cmp"
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/leasefs/leasefs/internal/clock"
	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/wire"
)

// Shared mappings. read() and write() bypass the kernel's page cache
// (direct_io), but a mapping (mmap) is made of page-cache pages: the kernel
// fills them with reads of its own ("fills", ReadPage) and writes dirty
// ones back with writes of its own ("write-back", WritePage), at times the
// application does not choose (a fault, msync, munmap, close, memory
// pressure). A store into a mapped page asks nobody: a page may be dirty
// under an S lock. A revocation must drop the pages of a file whose lock
// goes (FUSE_NOTIFY_INVAL_INODE, which writes dirty pages back first),
// and that invalidation waits for every page a fill is filling and every
// page being written back. So two rules keep it from waiting for itself:
//
//   - Write-back never waits for a lock: its data is queued here and the
//     kernel's write returns. The queue goes to the server, as ordinary
//     writes under an X lock, from fsync (msync), flush (close), Release,
//     any read() or write() of the file on this mount, a revocation of an
//     X lock (before it is acknowledged: the server still counts the X
//     lock as ours), and after flushAge. A revocation of an S lock cannot
//     send it (the X lock it needs queues behind the very request that
//     revokes), so that data goes after the acknowledgement, and only the
//     aligned words the mapping changed (WritePage): the other client's
//     write that lands first keeps the rest of the page. Any other
//     revocation of the file waits for one of X in progress (revocations
//     can come out of order): acknowledged first, it would downgrade at
//     the server the lock that one's sends go under.
//   - A fill never waits at the server for a lock it does not hold: it
//     reads under the lock the mount holds (granted at once, even while
//     being revoked), or asks for S when it holds none (then no revocation
//     of its lock can be waiting for the fill). It does not send the queue
//     either (that needs X): it lays the queued bytes over what it read.
//
// Pages a fill returns are covered by the lock they were read under, so
// the revocation of that lock must drop them. A fill can come while the
// invalidation is running, after the kernel's walk passed its page: it
// would leave a page the lock no longer covers. So a revocation to None
// opens a window on the file: fills served while it is open are counted,
// and the invalidation runs again until one run saw no fill served and none
// in flight, which closes the window, atomically with that check. A fill
// that arrives while the window is open waits up to fillHold for it to
// close (then it asks for a new lock like any read); past that it is
// served, since the invalidation may be waiting for its very page, and
// counted. Once the window closed, a fill returns only data read under a
// grant the client still holds (ReadPage retries otherwise): a read the
// server answered under the old lock just before it saw the
// acknowledgement is not covered.
//
// Bounds: a store through a mapping is ordered with other clients' writes
// only once msync (or munmap and close) returned; before, another
// client's write of the same bytes may land first and be overwritten,
// while this client's mapping shows its own store. A page this client's
// mapping faults in while its own write() of that range is in flight (the
// kernel dropped the range's pages before sending the write) may show the
// bytes as they were until the write returns (the kernel drops them
// again), when other clients may see the write already. After a NACK, and
// when a lease is about to lapse, the kernel's pages are dropped in the
// background (invalidateLater), not before the request that saw the NACK
// returns: that request may hold what a fill needs. A fill blocked on an
// unreachable server holds up the drop of the file's pages that follow
// it. Pages written back after a NACK, from pages filled under the locks
// lost, go only if the file did not change since (a reclaim, as for
// buffered writes); else they are reported lost. In a cluster, a fill
// sent to a server that is taking the file over from the one revoking
// this client's lock waits for that hand-over, which waits for the
// revocation: until the hand-over gives up (its server's acquire timeout)
// and the fill is served by the owner.

// fillHold is how long a fill that arrives during a revocation's
// invalidation waits for it to end before it is served under the lock
// being revoked (and the invalidation runs again).
const fillHold = 10 * time.Millisecond

// mapFile is what the client knows of one file's pages in the kernel.
type mapFile struct {
	// pages: the kernel may hold pages of the file (a fill was served
	// since the kernel last forgot the inode).
	pages bool
	// windows counts revocations to None invalidating the file's pages;
	// gate is closed when the last ends.
	windows  int
	gate     chan struct{}
	inflight int    // fills being served
	served   uint64 // fills served, ever
	// xRevoking counts revocations of an X lock in progress: the server
	// counts the lock as ours until they are acknowledged. xIdle is
	// closed when the last ends (waitXRevoked).
	xRevoking int
	xIdle     chan struct{}
	// noneRevoking counts revocations to None in progress (released is
	// kept while there are any).
	noneRevoking int
	// released: the client gave up (or is giving up) every grant of the
	// file a server numbered this or lower: the last revocation to None,
	// or the lock the cache evicted. Each server numbers its grants (a
	// cluster's new owner from its own count): by server, 0 for any.
	// Kept while the revocation runs and after it ended (releasedAt, its
	// end; forgetReleased): until the server has the acknowledgement it
	// answers a fill under the grant given up, and a fill that comes
	// after the invalidations would leave a page that nothing drops.
	released   map[ids.ServerID]uint64
	releasedAt time.Time
	// stale: the kernel may still hold pages filled under locks a NACK
	// took (until the background invalidation after it dropped them);
	// what is written back of them goes as a reclaim, only if the file is
	// still at version, the newest the client saw of it under its lock
	// (fills, its own writes): reclaimBase.
	stale   bool
	version uint64
	// queue is written-back data not yet sent, reclaim that of pages
	// based on a lost lock, sending what a send has taken from them and
	// not finished; fills lay them over what they read (sending first,
	// the others are newer). sent counts finished sends.
	queue, reclaim, sending *dirtyFile
	sendingReclaim          *dirtyFile
	reclaimBase             uint64
	sent                    uint64
	since                   time.Time // when queue got its oldest data
	sendMu                  ctxMutex
}

// idle reports whether f holds nothing worth keeping. Called with the
// mappedFiles' mu.
func (f *mapFile) idle() bool {
	return !f.pages && f.windows == 0 && f.inflight == 0 && f.xRevoking == 0 && f.noneRevoking == 0 && !f.stale &&
		!f.holdsData() && len(f.released) == 0
}

// holdsData reports whether f has written-back data not at the server.
func (f *mapFile) holdsData() bool {
	return f.queue != nil || f.reclaim != nil || f.sending != nil || f.sendingReclaim != nil
}

type mappedFiles struct {
	mu    sync.Mutex
	files map[ids.Ino]*mapFile
	// gen is the client's cache generation (Client.cacheGen) as of the
	// last nacked: data written back in an older one is a reclaim.
	gen uint64
	// queued counts files with written-back data not yet at the server
	// (holdsData), so that a write() of a file without any need not look.
	queued atomic.Int64
}

// file returns ino's record, made if create. Called with mu.
func (m *mappedFiles) file(ino ids.Ino, create bool) *mapFile {
	f := m.files[ino]
	if f == nil && create {
		if m.files == nil {
			m.files = map[ids.Ino]*mapFile{}
		}
		f = &mapFile{sendMu: newCtxMutex()}
		m.files[ino] = f
	}
	return f
}

// tidy forgets ino's record if it is idle, and keeps queued's count.
// Called with mu after anything that may have emptied f.
func (m *mappedFiles) tidy(ino ids.Ino, f *mapFile) {
	if f.idle() && m.files[ino] == f {
		delete(m.files, ino)
	}
}

// changedData keeps queued's count after f's data changed from had
// (holdsData before). Called with mu.
func (m *mappedFiles) changedData(f *mapFile, had bool) {
	switch now := f.holdsData(); {
	case now && !had:
		m.queued.Add(1)
	case had && !now:
		m.queued.Add(-1)
	}
}

// enterFill counts a fill of ino in flight, after waiting (up to fillHold
// on clk) for an open window to close.
func (m *mappedFiles) enterFill(ctx context.Context, clk clock.Clock, ino ids.Ino) *mapFile {
	m.mu.Lock()
	defer m.mu.Unlock()
	f := m.file(ino, true)
	f.pages = true
	if f.windows > 0 {
		gate := f.gate
		m.mu.Unlock()
		t, fired := clk.NewTimer(fillHold)
		select {
		case <-gate:
		case <-fired:
		case <-ctx.Done():
		}
		t.Stop()
		m.mu.Lock()
	}
	f.inflight++
	return f
}

// leaveFill ends a fill enterFill counted; one that returned data covered
// by the client's lock records the file's version it saw.
func (m *mappedFiles) leaveFill(f *mapFile, version uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	f.inflight--
	f.served++
	f.version = max(f.version, version)
}

// mayReturn reports whether a fill in flight (f) may return data read as
// info says, served by server from: covered, from the cache (under a lock
// the client holds) or read under a grant the client has not given up (a
// grant kept through a downgrade counts: what was read under X is valid
// under S, and the server revokes the lock before anybody else may
// write); or not covered but a window is open, whose invalidation drops
// it.
func (m *mappedFiles) mayReturn(f *mapFile, info readInfo, from ids.ServerID) (ok, covered bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	covered = info.cached || info.grant != 0 && info.grant > max(f.released[from], f.released[0])
	return covered || f.windows > 0, covered
}

// sawVersion records a version of ino this client caused or read under
// its lock (a reclaim of written-back pages compares with the newest).
func (m *mappedFiles) sawVersion(ino ids.Ino, v uint64) {
	if v == 0 {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if f := m.file(ino, false); f != nil {
		f.version = max(f.version, v)
	}
}

// beginRevoke records a revocation of ino by server (0: unknown; sequence
// number seq) in progress: of an X lock (heldX), and to None (a window,
// and every grant of server's up to seq given up).
func (m *mappedFiles) beginRevoke(ino ids.Ino, server ids.ServerID, seq uint64, heldX, toNone bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	f := m.file(ino, true)
	if heldX {
		if f.xRevoking == 0 {
			f.xIdle = make(chan struct{})
		}
		f.xRevoking++
	}
	if toNone {
		f.noneRevoking++
		if f.windows == 0 {
			f.gate = make(chan struct{})
		}
		f.windows++
		if f.released == nil {
			f.released = map[ids.ServerID]uint64{}
		}
		f.released[server] = max(f.released[server], seq)
		f.releasedAt = time.Now()
	}
}

// forgetReleased forgets the grants given up more than keep ago, of
// files with no fill in flight or revocation in progress, and the files
// that then hold nothing. keep must be longer than the server takes to
// apply an acknowledgement (it fails a client that takes longer than its
// delivery timeout, under τ; a NACK forgets released anyway): a fill that
// comes later is served after the release.
func (m *mappedFiles) forgetReleased(keep time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for ino, f := range m.files {
		if f.released != nil && f.inflight == 0 && f.noneRevoking == 0 && time.Since(f.releasedAt) > keep {
			f.released = nil
		}
		m.tidy(ino, f)
	}
}

// endRevoke ends what beginRevoke began; window: the window is still
// open (quiet did not close it).
func (m *mappedFiles) endRevoke(ino ids.Ino, heldX, toNone, window bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	f := m.file(ino, false)
	if f == nil {
		return
	}
	if heldX {
		if f.xRevoking--; f.xRevoking == 0 {
			close(f.xIdle)
		}
	}
	if toNone {
		f.noneRevoking--
		f.releasedAt = time.Now()
	}
	if window {
		m.closeWindowLocked(f)
	}
	m.tidy(ino, f)
}

// waitXRevoked waits until no revocation of an X lock on ino is in
// progress.
func (m *mappedFiles) waitXRevoked(ctx context.Context, ino ids.Ino) error {
	m.mu.Lock()
	f := m.file(ino, false)
	if f == nil || f.xRevoking == 0 {
		m.mu.Unlock()
		return nil
	}
	idle := f.xIdle
	m.mu.Unlock()
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (m *mappedFiles) closeWindowLocked(f *mapFile) {
	if f.windows--; f.windows == 0 {
		close(f.gate)
	}
}

// servedSoFar returns how many fills of ino were served so far.
func (m *mappedFiles) servedSoFar(ino ids.Ino) uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	if f := m.file(ino, false); f != nil {
		return f.served
	}
	return 0
}

// quiet closes the window if no fill of ino was served since the count
// was before and none is in flight, and reports whether it did: the
// invalidation that ran meanwhile dropped every page a fill returned under
// the lock being revoked.
func (m *mappedFiles) quiet(ino ids.Ino, before uint64) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	f := m.file(ino, false)
	if f == nil {
		return true
	}
	if f.served != before || f.inflight > 0 {
		return false
	}
	m.closeWindowLocked(f)
	return true
}

// hasPages reports whether the kernel may hold pages of ino.
func (m *mappedFiles) hasPages(ino ids.Ino) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	f := m.file(ino, false)
	return f != nil && f.pages
}

// withPages lists the files the kernel may hold pages of.
func (m *mappedFiles) withPages() []ids.Ino {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []ids.Ino
	for ino, f := range m.files {
		if f.pages {
			out = append(out, ino)
		}
	}
	return out
}

// forget records that the kernel forgot ino, and its pages with it.
func (m *mappedFiles) forget(ino ids.Ino) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if f := m.file(ino, false); f != nil {
		f.pages = false
		m.tidy(ino, f)
	}
}

// nacked records that the client lost its locks (cache generation gen
// begins), having known the versions given of some files: what was
// written back of every file and not sent, and what the kernel writes back
// of the pages it has until they are dropped (dropped), is based on a
// lock lost, and goes as a reclaim.
func (m *mappedFiles) nacked(gen uint64, known map[ids.Ino]uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.gen = gen
	for ino, f := range m.files {
		f.version = max(f.version, known[ino])
		f.stale = f.stale || f.pages
		// the servers forgot the client's locks; their grants to come
		// are new, whatever their numbers (a restarted server counts
		// from the start)
		clear(f.released)
		if f.queue == nil {
			continue
		}
		if f.reclaim == nil {
			f.reclaim, f.reclaimBase = f.queue, f.version
		} else {
			for _, e := range f.queue.extents() {
				f.reclaim.add(e.off, e.data)
			}
			f.queue.free()
		}
		f.queue = nil
	}
}

// dropped records that the kernel's pages of ino present at a NACK are
// gone (the client invalidated them since).
func (m *mappedFiles) dropped(ino ids.Ino) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if f := m.file(ino, false); f != nil {
		f.stale = false
		m.tidy(ino, f)
	}
}

// hasQueued reports whether ino has written-back data not at the server.
func (m *mappedFiles) hasQueued(ino ids.Ino) bool {
	if m.queued.Load() == 0 {
		return false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	f := m.file(ino, false)
	return f != nil && f.holdsData()
}

// overlay lays ino's written-back data not yet at the server over buf,
// which holds n bytes of the file read at off, and returns how many bytes
// buf holds then (more, if queued data lies past what was read), and the
// count of finished sends: if that moved while the data was read, a send
// may have finished between the read and the overlay, and the caller
// reads again.
func (m *mappedFiles) overlay(ino ids.Ino, off uint64, buf []byte, n int) (int, uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	f := m.file(ino, false)
	if f == nil {
		return n, 0
	}
	for _, d := range []*dirtyFile{f.sendingReclaim, f.sending, f.reclaim, f.queue} {
		if d != nil {
			n = overlayExtents(d.extents(), off, buf, n)
		}
	}
	return n, f.sent
}

// sentSoFar returns the count of finished sends of ino's queue.
func (m *mappedFiles) sentSoFar(ino ids.Ino) uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	if f := m.file(ino, false); f != nil {
		return f.sent
	}
	return 0
}

// overlayExtents copies the extents' bytes within [off, off+len(buf))
// into buf, which holds n bytes read at off; bytes between n and an
// extent are a hole, zeros. It returns the bytes buf holds then.
func overlayExtents(exts []extent, off uint64, buf []byte, n int) int {
	end := off + uint64(len(buf))
	for i := endingAfter(exts, off); i < len(exts) && exts[i].off < end; i++ {
		e := exts[i]
		lo, hi := max(off, e.off), min(end, e.end())
		if int(lo-off) > n {
			clear(buf[n : lo-off])
		}
		copy(buf[lo-off:hi-off], e.data[lo-e.off:hi-e.off])
		n = max(n, int(hi-off))
	}
	return n
}

// queueWrite queues a write-back of data at off, made of pages in cache
// generation gen; reclaim: of pages based on a lock lost since, as is
// any of an older generation than the current.
func (m *mappedFiles) queueWrite(ino ids.Ino, off uint64, data []byte, gen uint64, reclaim bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	reclaim = reclaim || gen != m.gen
	f := m.file(ino, true)
	had := f.holdsData()
	if f.since.IsZero() {
		f.since = time.Now()
	}
	d := &f.queue
	if reclaim {
		d = &f.reclaim
		if f.reclaim == nil {
			f.reclaimBase = f.version
		}
	}
	if *d == nil {
		*d = &dirtyFile{}
	}
	(*d).add(off, data)
	m.changedData(f, had)
}

// take moves ino's queued data to sending, for a send holding f.sendMu.
func (m *mappedFiles) take(f *mapFile) (reclaim *dirtyFile, base uint64, queue *dirtyFile) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, d := range []*dirtyFile{f.reclaim, f.queue} {
		if d != nil {
			d.settle() // extents() reads it from here on, under mu or not
		}
	}
	reclaim, base, queue = f.reclaim, f.reclaimBase, f.queue
	f.reclaim, f.queue = nil, nil
	f.sendingReclaim, f.sending = reclaim, queue
	f.since = time.Time{}
	return reclaim, base, queue
}

// sentQueue ends a send of f.sending and f.sendingReclaim: what of them
// is in keep goes back under what was queued since (which is newer).
func (m *mappedFiles) sentQueue(ino ids.Ino, f *mapFile, keepReclaim, keepQueue bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	had := f.holdsData()
	putBack := func(d *dirtyFile, keep bool, into **dirtyFile) {
		if d == nil {
			return
		}
		if !keep {
			d.free()
			return
		}
		if *into != nil {
			for _, e := range (*into).extents() {
				d.add(e.off, e.data)
			}
			(*into).free()
		}
		*into = d
		if f.since.IsZero() {
			f.since = time.Now()
		}
	}
	putBack(f.sendingReclaim, keepReclaim, &f.reclaim)
	putBack(f.sending, keepQueue, &f.queue)
	f.sendingReclaim, f.sending = nil, nil
	f.sent++
	m.changedData(f, had)
	m.tidy(ino, f)
}

// oldQueues lists the files whose queued data is older than age.
func (m *mappedFiles) oldQueues(age time.Duration) []ids.Ino {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []ids.Ino
	for ino, f := range m.files {
		if (f.queue != nil || f.reclaim != nil) && !f.since.IsZero() && time.Since(f.since) > age {
			out = append(out, ino)
		}
	}
	return out
}

// queuedFiles lists the files with queued data.
func (m *mappedFiles) queuedFiles() []ids.Ino {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []ids.Ino
	for ino, f := range m.files {
		if f.holdsData() {
			out = append(out, ino)
		}
	}
	return out
}

// ReadPage serves a fill of the kernel's page cache (a page fault in a
// mapping, or its readahead): the bytes at off, fewer at the end of the
// file. See the rules above: it never waits at the server for a lock the
// mount does not hold, and returns only data that a lock this mount holds
// covers, or that a revocation's invalidation will drop.
func (c *Client) ReadPage(ctx context.Context, ino ids.Ino, off uint64, buf []byte) (n int, err error) {
	f := c.maps.enterFill(ctx, c.clk, ino)
	var (
		info    readInfo
		covered bool
	)
	defer func() {
		if !covered {
			info.version = 0
		}
		c.maps.leaveFill(f, info.version)
	}()
	wait := time.Millisecond
	for {
		sent := c.maps.sentSoFar(ino)
		var from ids.ServerID // the server that answers (send)
		n, info, err = c.read(context.WithValue(ctx, replyFromKey{}, &from), ino, off, buf, c.wb.flushBuffered)
		if err != nil {
			return 0, err
		}
		n, sentAfter := c.maps.overlay(ino, off, buf, n)
		var ok bool
		if ok, covered = c.maps.mayReturn(f, info, from); ok && sentAfter == sent {
			// with the revocations (revoke), what names a stale page
			c.log.Debug("fill served", "ino", ino, "off", off, "bytes", n, "version", info.version, "cached", info.cached,
				"grant", info.grant, "server", from, "covered", covered)
			return n, nil
		}
		// Not covered: read under a lock this client gave up, just
		// before the server saw it go. Again, until the server grants a
		// new one.
		c.log.Debug("fill read under a grant given up; reading again", "ino", ino, "grant", info.grant, "server", from,
			"cached", info.cached, "sent_meanwhile", sentAfter != sent)
		if err := clock.Sleep(ctx, c.clk, wait); err != nil {
			return 0, err
		}
		wait = min(2*wait, 50*time.Millisecond)
	}
}

// replyFromKey is a context key whose value, a *ids.ServerID, send sets
// to the server whose reply in the current session it applies.
type replyFromKey struct{}

// gen returns the client's cache generation.
func (c *Client) gen() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cacheGen
}

// WritePage queues the kernel's write-back of mapped pages (see above):
// the data goes to the server later. Under an X lock the whole pages go.
// Under S, only the words that differ from the file as the client has it
// (the server's, with what it queued over them): nobody else can have
// changed the file while this client held its lock, so those are the
// words stored into through the mapping, and another client's write that
// lands before them (this one's S lock was revoked for it) keeps the
// rest of the page. The comparison reads under the lock held, which the
// server grants at once. Pages based on a lock lost since (a NACK) go as
// a reclaim.
func (c *Client) WritePage(ctx context.Context, ino ids.Ino, off uint64, data []byte) error {
	c.mu.Lock()
	gen := c.cacheGen
	mode, _ := c.cache.Mode(ino)
	x := mode == wire.LockExclusive && c.leasesValid(c.clk.Now())
	c.mu.Unlock()
	c.maps.mu.Lock()
	f := c.maps.file(ino, true)
	lost := f.stale
	x = x || f.xRevoking > 0
	c.maps.mu.Unlock()
	if lost || x {
		c.maps.queueWrite(ino, off, data, gen, lost)
		return nil
	}
	base := make([]byte, len(data))
	n, _, err := c.read(ctx, ino, off, base, noFlush)
	if err != nil {
		return err
	}
	if c.gen() != gen {
		// NACKed meanwhile: what the server has now is no base (others
		// may have written since our lock was stolen)
		c.maps.queueWrite(ino, off, data, gen, true)
		return nil
	}
	n, _ = c.maps.overlay(ino, off, base, n)
	clear(base[n:])
	for _, r := range changedWords(off, data, base) {
		c.maps.queueWrite(ino, off+uint64(r[0]), data[r[0]:r[1]], gen, false)
	}
	return nil
}

// wordSize is the unit in which WritePage compares: the widest store a
// CPU makes at once. A store through a mapping that happens to leave a
// byte as it was still writes it; comparing byte by byte would leave that
// byte to another client's write, and tear the store.
const wordSize = 8

// changedWords returns the ranges of data (at file offset off) made of
// the aligned words in which it differs from base, each as [start, end)
// into data.
func changedWords(off uint64, data, base []byte) [][2]int {
	var out [][2]int
	for i := 0; i < len(data); {
		// the word holding data[i] ends at the next multiple of wordSize
		end := min(len(data), i+wordSize-int((off+uint64(i))%wordSize))
		if bytes.Equal(data[i:end], base[i:end]) {
			i = end
			continue
		}
		if k := len(out); k > 0 && out[k-1][1] == i {
			out[k-1][1] = end
		} else {
			out = append(out, [2]int{i, end})
		}
		i = end
	}
	return out
}

// noFlush is a read's flush that sends nothing.
func noFlush(context.Context, ids.Ino) error { return nil }

// sendMapped sends ino's queued write-back data to the server, as writes
// through (an X lock each; a reclaim only if the file is still at the
// version its pages were based on), and waits for any send of it in
// progress.
func (c *Client) sendMapped(ctx context.Context, ino ids.Ino) error {
	c.maps.mu.Lock()
	f := c.maps.file(ino, false)
	c.maps.mu.Unlock()
	if f == nil {
		return nil
	}
	wctx, cancel := c.opContext(ctx, false)
	defer cancel()
	if err := f.sendMu.lock(wctx); err != nil {
		return c.softErr(ctx, err)
	}
	defer f.sendMu.unlock()
	reclaim, base, queue := c.maps.take(f)
	if reclaim == nil && queue == nil {
		return nil
	}
	var rerr, err error
	if reclaim != nil {
		rerr = c.sendMappedWrites(ctx, ino, reclaim, true, base)
		switch {
		case gone(rerr):
			rerr = nil
		case refused(rerr):
			// someone else wrote the file since (CodeStale), or the
			// server takes the data in no case: what this client
			// stored through its mapping then is lost, and said so
			c.lostMapped(ino, rerr)
			rerr = nil
		}
	}
	if queue != nil && rerr == nil {
		err = c.sendMappedWrites(ctx, ino, queue, false, 0)
		switch {
		case gone(err):
			c.log.Debug("written-back pages of a removed file dropped", "ino", ino, "bytes", queue.bytes)
			err = nil
		case refused(err):
			// a file too large, a full disk: sent again, it would get
			// the same answer (as a flush's, loseFile)
			c.lostMapped(ino, err)
			err = nil
		}
	}
	c.maps.sentQueue(ino, f, rerr != nil, rerr != nil || err != nil)
	return cmp.Or(rerr, err)
}

// sendMappedWrites sends d's extents; ifVersion: each only if the file is
// still at version (the one before it, for the next).
func (c *Client) sendMappedWrites(ctx context.Context, ino ids.Ino, d *dirtyFile, ifVersion bool, version uint64) error {
	reqs := packWrites(ino, d.extents())
	defer releaseWrites(reqs)
	defer c.changingData(ino)()
	for _, r := range reqs {
		if ifVersion {
			r.Flags |= wire.WriteIfVersion
			r.Version = version
		}
		rep, err := c.Call(ctx, r)
		if err != nil {
			return err
		}
		if rep.Attr != nil {
			version = rep.Attr.Version
			c.maps.sawVersion(ino, version)
		}
	}
	return nil
}

// sendMappedLater sends ino's queued data in the background. What fails
// stays queued: flushOld sends it again, and the file's next fsync or
// close returns the error if it still fails then.
func (c *Client) sendMappedLater(ino ids.Ino) {
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), maxMappedSend)
		defer cancel()
		if err := c.sendMapped(ctx, ino); err != nil {
			c.log.Warn("sending pages written back from a mapping failed; kept to send again",
				"path", c.PathOf(ino), "ino", ino, "err", err)
		}
	}()
}

// maxMappedSend bounds a background send of written-back data.
const maxMappedSend = 5 * time.Minute

// lostMapped reports written-back data the server refused, dropped: the
// file's next fsync or close returns EIO (ENOSPC for a full disk).
func (c *Client) lostMapped(ino ids.Ino, err error) {
	c.Counters.DataLost.Add(1)
	c.wb.lost(ino, err)
	c.log.Error("DATA LOST: the server refused pages written back from a mapping (stored under a lock since lost, "+
		"and the file changed meanwhile; or a file too large, a full disk); the next fsync or close of the file returns EIO",
		"path", c.PathOf(ino), "ino", ino, "err", err)
}

// dropPages drops the kernel's pages (and attributes) of ino, which a
// revocation of this client's lock takes away; the kernel writes dirty
// pages back first (WritePage). For a revocation to None (a window is
// open) it runs until a run saw no fill (quiet), which closes the window;
// for a downgrade to S one run writes back what was dirty and makes the
// next store fault, and the pages stay valid under S. The server hears
// from this client about the file meanwhile, so it does not take a long
// write-back for a client that stopped answering.
func (c *Client) dropPages(ino ids.Ino, window bool) {
	stop := c.keepRevoking(ino)
	defer stop()
	for {
		before := c.maps.servedSoFar(ino)
		c.Invalidate(ino)
		if !window || c.maps.quiet(ino, before) {
			return
		}
	}
}

// keepRevoking sends, until stop is called, a request about ino every
// τ/8: the server takes it as the revocation's progress (its delivery
// timeout counts from the last request about the file).
func (c *Client) keepRevoking(ino ids.Ino) (stop func()) {
	every := time.Duration(c.Session().Tau) / 8
	if every <= 0 {
		return func() {}
	}
	var (
		mu      sync.Mutex
		stopped bool
		t       clock.Timer
	)
	var tick func()
	tick = func() {
		ctx, cancel := context.WithTimeout(context.Background(), every)
		_, _ = c.Call(ctx, &wire.Request{Op: wire.OpGetAttr, Ino: ino})
		cancel()
		mu.Lock()
		defer mu.Unlock()
		if !stopped {
			t.Reset(every)
		}
	}
	mu.Lock()
	t = c.clk.AfterFunc(every, tick)
	mu.Unlock()
	return func() {
		mu.Lock()
		stopped = true
		t.Stop()
		mu.Unlock()
	}
}

// ForgetPages records that the kernel forgot ino (and its pages).
func (c *Client) ForgetPages(ino ids.Ino) { c.maps.forget(ino) }
