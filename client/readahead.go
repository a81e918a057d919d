package client

import (
	"context"
	"slices"
	"sync"

	"github.com/leasefs/leasefs/cache"
	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/wire"
)

// Readahead: a file read sequentially is fetched ahead of its reader, a
// few requests in flight, so that the reader's next reads find their
// bytes there. One reader's reads otherwise wait in turn for the server's
// read, the transfer and the copy into the kernel; ahead, they overlap.
//
// Prefetched bytes go into the data cache, under the lock the reply
// granted, and are dropped with it; but those of a file larger than half
// the cache, from a block store, are kept by the prefetch itself until
// its reader takes them (take). Such a file cannot stay cached (it would
// push out its own first pages and everything else), and filling the
// cache, a copy into fresh pages under the client's lock, took much of
// the mount's CPU in a read of one over the TCP path. Kept bytes are
// handed out only while what the cache would have held is still good:
// the same lock, no change since (cache.DataCurrent).

const (
	readAheadChunk  = 1 << 20 // bytes per prefetch request
	readAheadWindow = 4 << 20 // bytes fetched ahead of a sequential reader
	readAheadSlots  = 8       // prefetches in flight or kept, all files together
	readAheadFiles  = 1024    // sequential readers remembered
)

// readAhead is the client's read-ahead: the sequential readers it knows
// and the prefetches in flight. It reads through its Client, into the
// Client's cache.
type readAhead struct {
	c     *Client
	mu    sync.Mutex
	files map[ids.Ino]*readStream
	slots chan struct{}
}

func newReadAhead(c *Client) *readAhead {
	return &readAhead{c: c, files: map[ids.Ino]*readStream{}, slots: make(chan struct{}, readAheadSlots)}
}

// readStream is one file's reader: where its last read ended and how far
// ahead of it the file is fetched or being fetched.
type readStream struct {
	next    uint64
	ahead   uint64
	fetches []*prefetch
}

// prefetch is one request in flight: [start, end), done when it is cached
// (or failed), or, if it keeps what it fetched, when kept holds it.
type prefetch struct {
	start, end uint64
	keep       bool
	done       chan struct{}
	kept       fetched // set before done closes; no data if the fetch failed
	gen        uint64  // the cache's data generation before the fetch
}

// isDone reports whether p's fetch ended.
func (p *prefetch) isDone() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// wait waits for a prefetch in flight that covers off, and reports
// whether there was one.
func (r *readAhead) wait(ctx context.Context, ino ids.Ino, off uint64) bool {
	r.mu.Lock()
	var done chan struct{}
	if s := r.files[ino]; s != nil {
		for _, p := range s.fetches {
			if p.start <= off && off < p.end {
				done = p.done
			}
		}
	}
	r.mu.Unlock()
	if done == nil {
		return false
	}
	select {
	case <-done:
		return true
	case <-ctx.Done():
		return false
	}
}

// readDone records a read of n bytes at off and, if it continues the
// file's last read, fetches ahead of it: up to readAheadWindow, within the
// file's size as cached, while this client holds a data lock on it (else
// the replies could not be cached, nor kept).
func (r *readAhead) readDone(ino ids.Ino, off uint64, n int) {
	var size uint64
	ok := r.c.cached(func(ch *cache.Cache) bool {
		mode, _ := ch.Mode(ino)
		a, known := ch.Attr(ino)
		if known {
			size = a.Size
		}
		return mode != wire.LockNone && known
	})
	st := r.c.blockStore()
	keep := st != nil && int64(size) > r.c.cfg.CacheBytes/2
	if st != nil && r.c.streams(st, streamBytes) {
		// the block store is as near as the cache (Client.streams)
		ok = false
	}
	ok = ok && (keep || r.c.cfg.CacheBytes > 0)
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.stream(ino)
	sequential := off == s.next
	s.next = off + uint64(n)
	r.dropPassed(s, sequential)
	if !sequential || !ok {
		s.ahead = 0
		return
	}
	from := (max(s.ahead, s.next) + cache.PageSize - 1) &^ (cache.PageSize - 1)
	limit := min(s.next+readAheadWindow, size)
	// whole chunks only (but the file's last): a reader's small reads
	// would otherwise each send a request as small
	for from < limit && (limit-from >= readAheadChunk || limit == size) {
		end := min(from+readAheadChunk, limit)
		if !keep && r.c.cached(func(ch *cache.Cache) bool { return ch.HasData(ino, from, end-from) }) {
			from = end // a re-read: nothing to fetch
			continue
		}
		if !r.takeSlot(s) {
			s.ahead = from
			return
		}
		p := &prefetch{start: from, end: end, keep: keep, done: make(chan struct{})}
		s.fetches = append(s.fetches, p)
		r.c.Counters.Prefetches.Add(1)
		go r.fetch(ino, p)
		from = p.end
	}
	s.ahead = max(s.ahead, from)
}

// stream returns ino's reader, remembering a new one (and forgetting
// idle ones past readAheadFiles). Called with r.mu held.
func (r *readAhead) stream(ino ids.Ino) *readStream {
	s := r.files[ino]
	if s == nil {
		if len(r.files) >= readAheadFiles {
			for i, old := range r.files {
				if len(old.fetches) == 0 {
					delete(r.files, i)
				}
			}
		}
		s = &readStream{}
		r.files[ino] = s
	}
	return s
}

// takeSlot takes a slot for a prefetch of s's file. With none free, the
// bytes kept for another file's reader (who may have stopped reading)
// give theirs up. Called with r.mu held.
func (r *readAhead) takeSlot(s *readStream) bool {
	for {
		select {
		case r.slots <- struct{}{}:
			return true
		default:
		}
		var victim *prefetch
		var from *readStream
		for _, o := range r.files {
			if o == s {
				continue
			}
			for _, p := range o.fetches {
				if p.keep && p.isDone() {
					victim, from = p, o
					break
				}
			}
			if victim != nil {
				break
			}
		}
		if victim == nil {
			return false
		}
		r.drop(from, victim)
	}
}

// dropPassed drops what s keeps that its reader has gone past, or all
// of it when the reader jumped elsewhere. Called with r.mu held.
func (r *readAhead) dropPassed(s *readStream, sequential bool) {
	for i := 0; i < len(s.fetches); {
		if p := s.fetches[i]; p.keep && p.isDone() && (!sequential || p.end <= s.next) {
			r.drop(s, p) // takes it out of s.fetches
		} else {
			i++
		}
	}
}

// drop forgets a prefetch that ended and gives its bytes and slot back.
// Called with r.mu held.
func (r *readAhead) drop(s *readStream, p *prefetch) {
	if i := slices.Index(s.fetches, p); i >= 0 {
		s.fetches = slices.Delete(s.fetches, i, i+1)
	}
	if p.kept.recycle != nil {
		p.kept.recycle()
	}
	p.kept = fetched{}
	<-r.slots
}

// take copies into buf the bytes at off that prefetches keep for ino's
// reader, if they hold all of them (or up to the file's end) and are
// still current under the lock this client holds, and returns how many
// and the file version they are of. What it handed out to the end is
// given back.
func (r *readAhead) take(ino ids.Ino, off uint64, buf []byte) (n int, version uint64, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.files[ino]
	if s == nil {
		return 0, 0, false
	}
	var used []*prefetch
	pos, end := off, off+uint64(len(buf))
	for pos < end {
		i := slices.IndexFunc(s.fetches, func(p *prefetch) bool {
			return p.keep && p.start <= pos && pos < p.end && p.isDone() && p.kept.data != nil
		})
		if i < 0 {
			return 0, 0, false
		}
		p := s.fetches[i]
		used = append(used, p)
		version = max(version, p.kept.info.version)
		if pos >= p.start+uint64(len(p.kept.data)) {
			break // the end of the file
		}
		pos += min(end, p.start+uint64(len(p.kept.data))) - pos
		if uint64(len(p.kept.data)) < p.end-p.start && pos == p.start+uint64(len(p.kept.data)) {
			break // the end of the file
		}
	}
	current := r.c.cached(func(ch *cache.Cache) bool {
		for _, p := range used {
			if !ch.DataCurrent(ino, p.kept.info.version, p.gen) {
				return false
			}
		}
		return true
	})
	if !current {
		for _, p := range used {
			r.drop(s, p)
		}
		return 0, 0, false
	}
	for _, p := range used {
		lo := max(off, p.start)
		n += copy(buf[lo-off:], p.kept.data[min(lo-p.start, uint64(len(p.kept.data))):])
		if uint64(len(buf))+off >= p.start+uint64(len(p.kept.data)) {
			r.drop(s, p) // taken to its end
		}
	}
	return n, version, true
}

// fetch reads [p.start, p.end) of ino into the cache, or into p.kept.
// Nothing is fetched while the file has buffered writes (the server's
// data lacks them); a write buffered after the generation was taken makes
// the reply uncacheable (cache.PutData) and kept bytes stale.
func (r *readAhead) fetch(ino ids.Ino, p *prefetch) {
	var f fetched
	defer func() {
		r.mu.Lock()
		i, s := -1, r.files[ino]
		if s != nil {
			i = slices.Index(s.fetches, p)
		}
		if i >= 0 && f.data != nil && p.keep {
			p.kept = f // the reader takes it, or drop gives its slot back
		} else {
			if i >= 0 {
				s.fetches = slices.Delete(s.fetches, i, i+1)
			}
			if f.recycle != nil {
				f.recycle() // the cache has its copy, if any
			}
			<-r.slots
		}
		close(p.done)
		r.mu.Unlock()
	}()
	r.c.withCache(func(ch *cache.Cache) { p.gen = ch.DataGen() })
	if r.c.wb.buffers(ino) {
		return
	}
	var err error
	if f, err = r.c.fetch(context.Background(), ino, p.start, p.end, p.gen, !p.keep); err != nil {
		f = fetched{}
	}
}
