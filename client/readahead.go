package client

import (
	"context"
	"sync"

	"github.com/leasefs/leasefs/cache"
	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/wire"
)

// Readahead: a file read sequentially is fetched ahead of its reader into
// the data cache, a few requests in flight, so that the reader's next
// reads find their pages there. One reader's reads otherwise wait in turn
// for the server's read, the transfer and the copy into the kernel; ahead,
// they overlap. Prefetched pages are cached like any read's, under the
// lock its reply granted, and dropped with it.

const (
	readAheadChunk  = 1 << 20 // bytes per prefetch request
	readAheadWindow = 4 << 20 // bytes fetched ahead of a sequential reader
	readAheadSlots  = 8       // prefetch requests in flight, all files together
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
// (or failed).
type prefetch struct {
	start, end uint64
	done       chan struct{}
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
// the replies could not be cached).
func (r *readAhead) readDone(ino ids.Ino, off uint64, n int) {
	var size uint64
	ok := r.c.cached(func(ch *cache.Cache) bool {
		mode, _ := ch.Mode(ino)
		a, known := ch.Attr(ino)
		if known {
			size = a.Size
		}
		return mode != wire.LockNone && known && r.c.cfg.CacheBytes > 0
	})
	if st := r.c.blockStore(); st != nil && r.c.streams(st, streamBytes) {
		// what a prefetch fetches would not be cached (Client.streams)
		ok = false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
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
	sequential := off == s.next
	s.next = off + uint64(n)
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
		if r.c.cached(func(ch *cache.Cache) bool { return ch.HasData(ino, from, end-from) }) {
			from = end // a re-read: nothing to fetch
			continue
		}
		select {
		case r.slots <- struct{}{}:
		default:
			s.ahead = from
			return
		}
		p := &prefetch{start: from, end: end, done: make(chan struct{})}
		s.fetches = append(s.fetches, p)
		r.c.Counters.Prefetches.Add(1)
		go r.fetch(ino, p)
		from = p.end
	}
	s.ahead = max(s.ahead, from)
}

// fetch reads [p.start, p.end) of ino into the cache. Nothing is
// fetched while the file has buffered writes (the server's data lacks
// them); a write buffered after the generation was taken makes the reply
// uncacheable (cache.PutData).
func (r *readAhead) fetch(ino ids.Ino, p *prefetch) {
	defer func() {
		r.mu.Lock()
		if s := r.files[ino]; s != nil {
			for i, q := range s.fetches {
				if q == p {
					s.fetches = append(s.fetches[:i], s.fetches[i+1:]...)
					break
				}
			}
		}
		r.mu.Unlock()
		close(p.done)
		<-r.slots
	}()
	var gen uint64
	r.c.withCache(func(ch *cache.Cache) { gen = ch.DataGen() })
	if r.c.wb.buffers(ino) {
		return
	}
	if f, err := r.c.fetch(context.Background(), ino, p.start, p.end, gen); err == nil {
		f.recycle() // the cache has its copy
	}
}
