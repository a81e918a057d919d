package transport

import (
	"sync"

	"github.com/leasefs/leasefs/internal/ids"
)

type sessionKey struct {
	client  ids.ClientID
	session ids.SessionID
}

// replyCache remembers the replies of one session's requests by seq so that
// a retried request is executed at most once (DESIGN.md, client leases: "a
// bounded reply cache per session").
//
// Bounds: at most size finished entries (FIFO by finish time; in-flight
// entries are bounded by the connection's stream limit and never evicted) and
// at most maxBytes of reply bodies (beyond it the oldest bodies are dropped
// but their seqs stay known). An evicted seq is remembered as a watermark:
// any unknown seq at or below the highest evicted one is refused rather than
// risk executing a request twice; this needs seqs to increase per session.
type replyCache struct {
	size     int
	maxBytes int

	mu      sync.Mutex
	entries map[uint64]*replyEntry
	order   []uint64 // finished seqs, oldest first, from head
	head    int
	kept    int // bodies of order[head:kept] are dropped; order[kept:] may hold bodies
	bytes   int
	evicted bool
	maxGone uint64 // highest evicted seq, valid if evicted
}

type replyEntry struct {
	done    chan struct{} // closed when reply is set
	reply   []byte
	dropped bool // body dropped for the byte bound
	rerun   bool // idempotent: no body kept, a duplicate runs again
}

func newReplyCache(size, maxBytes int) *replyCache {
	return &replyCache{size: size, maxBytes: maxBytes, entries: make(map[uint64]*replyEntry)}
}

// begin looks up seq. run is true if the caller must execute the request and
// then call finish; otherwise e is the first execution, to wait for.
func (c *replyCache) begin(seq uint64) (e *replyEntry, run bool, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e := c.entries[seq]; e != nil {
		return e, false, nil
	}
	if c.evicted && seq <= c.maxGone {
		return nil, false, ErrReplyEvicted
	}
	e = &replyEntry{done: make(chan struct{})}
	c.entries[seq] = e
	return e, true, nil
}

// finish records seq's reply; with rerun (an idempotent request) it keeps
// none, and a duplicate runs the request again.
func (c *replyCache) finish(seq uint64, e *replyEntry, reply []byte, rerun bool) {
	if rerun {
		reply = nil
	}
	c.mu.Lock()
	e.reply, e.rerun, e.dropped = reply, rerun, rerun
	c.order = append(c.order, seq)
	c.bytes += len(reply)
	for c.live() > c.size {
		old := c.pop()
		if oe := c.entries[old]; oe != nil {
			c.bytes -= len(oe.reply)
			delete(c.entries, old)
		}
		if !c.evicted || old > c.maxGone {
			c.evicted, c.maxGone = true, old
		}
	}
	// Drop bodies, oldest first, but never the one just finished: its
	// duplicates may be waiting for it right now.
	if c.kept < c.head {
		c.kept = c.head
	}
	for ; c.bytes > c.maxBytes && c.kept < len(c.order)-1; c.kept++ {
		if oe := c.entries[c.order[c.kept]]; oe != nil && !oe.dropped && len(oe.reply) > 0 {
			c.bytes -= len(oe.reply)
			oe.reply, oe.dropped = nil, true
		}
	}
	c.mu.Unlock()
	close(e.done)
}

func (c *replyCache) live() int { return len(c.order) - c.head }

func (c *replyCache) pop() uint64 {
	v := c.order[c.head]
	c.head++
	// compact when the dead prefix dominates, so order stays O(size)
	if c.head > 64 && c.head*2 > len(c.order) {
		n := copy(c.order, c.order[c.head:])
		c.order = c.order[:n]
		c.kept -= c.head
		c.head = 0
	}
	return v
}

// result returns a finished entry's reply; ok is false if its body was
// dropped, or never kept (rerun).
func (c *replyCache) result(e *replyEntry) (reply []byte, ok, rerun bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return e.reply, !e.dropped, e.rerun
}
