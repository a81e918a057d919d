package transport

import (
	"sync"

	"github.com/leasefs/leasefs/internal/ids"
)

type sessionKey struct {
	client  ids.ClientID
	session ids.SessionID
}

// replyStore holds the reply caches of every session, under one mutex so
// that the bytes they keep are bounded in total as well as per session
// (DESIGN.md, client leases: "a bounded reply cache per session"). Only
// sessions the application opened (Server.OpenSession) and a few per peer
// server have a cache: a request under a made-up session id gets none.
//
// Bounds: per session, at most size finished entries (FIFO by finish
// time; in-flight entries are bounded by the connection's stream limit)
// and maxBytes of reply bodies; over all sessions, maxTotal bytes of
// bodies, dropped oldest first. A dropped body's seq stays known and a
// retry of it gets ErrReplyEvicted, never a second execution. Entries
// below the client's oldest seq in flight (the request frame's oldest)
// are forgotten: the client waits for none of them, so an idle session
// keeps almost nothing.
type replyStore struct {
	size     int
	maxBytes int
	maxTotal int

	mu       sync.Mutex
	sessions map[sessionKey]*replyCache
	// peers: the sessions made for each peer server's client id, oldest
	// first (at most maxPeerSessions)
	peers map[ids.ClientID][]ids.SessionID
	total int // reply bytes kept over all sessions
	// bodies lists the entries that kept a body, oldest first from
	// bhead; live of them still keep it (the others were dropped since).
	bodies []bodyRef
	bhead  int
	live   int
}

type bodyRef struct {
	c *replyCache
	e *replyEntry
}

// maxPeerSessions bounds the reply caches of one peer server: it uses two
// sessions per boot, and a restarted peer's old ones go.
const maxPeerSessions = 4

func newReplyStore(size, maxBytes, maxTotal int) *replyStore {
	return &replyStore{size: size, maxBytes: maxBytes, maxTotal: maxTotal,
		sessions: map[sessionKey]*replyCache{}, peers: map[ids.ClientID][]ids.SessionID{}}
}

// replyCache is one session's replies by seq, so that a retried request is
// executed at most once. Guarded by its replyStore's mutex.
//
// An evicted seq is remembered as a watermark: any unknown seq at or
// below the highest evicted one is refused rather than risk executing a
// request twice; this needs seqs to increase per session.
type replyCache struct {
	entries map[uint64]*replyEntry
	order   []uint64 // finished seqs, oldest first, from head
	head    int
	kept    int // bodies of order[head:kept] are dropped; order[kept:] may hold bodies
	bytes   int
	evicted bool
	maxGone uint64 // highest evicted seq, valid if evicted
	// floor: the client is done with every seq below it (frame oldest)
	floor uint64
}

type replyEntry struct {
	// done is made by the first duplicate that waits, closed by finish:
	// most requests have no duplicate, and a channel per entry was most
	// of an idle session's memory.
	done     chan struct{}
	finished bool
	reply    []byte
	dropped  bool // body dropped for the byte bounds
	rerun    bool // idempotent: no body kept, a duplicate runs again
}

// open makes the cache of a session the application opened.
func (st *replyStore) open(key sessionKey) {
	st.mu.Lock()
	if st.sessions[key] == nil {
		st.sessions[key] = &replyCache{entries: make(map[uint64]*replyEntry)}
	}
	st.mu.Unlock()
}

// lookup returns the session's cache; for a peer server's connection it
// makes one (forgetting the peer's oldest beyond maxPeerSessions), for
// anyone else nil if the session was not opened.
func (st *replyStore) lookup(key sessionKey, peer bool) *replyCache {
	st.mu.Lock()
	defer st.mu.Unlock()
	c := st.sessions[key]
	if c != nil || !peer {
		return c
	}
	c = &replyCache{entries: make(map[uint64]*replyEntry)}
	st.sessions[key] = c
	ps := append(st.peers[key.client], key.session)
	for len(ps) > maxPeerSessions {
		st.forgetLocked(sessionKey{key.client, ps[0]})
		ps = ps[1:]
	}
	st.peers[key.client] = ps
	return c
}

// forget drops a session's cache; a request of it that is running
// finishes into the dropped cache, which nothing refers to any more.
func (st *replyStore) forget(key sessionKey) {
	st.mu.Lock()
	st.forgetLocked(key)
	st.mu.Unlock()
}

func (st *replyStore) forgetLocked(key sessionKey) {
	c := st.sessions[key]
	if c == nil {
		return
	}
	delete(st.sessions, key)
	for _, e := range c.entries {
		st.dropBody(c, e)
	}
	st.compactBodies()
}

// dropBody drops e's body, if it keeps one. Called with mu held.
func (st *replyStore) dropBody(c *replyCache, e *replyEntry) {
	if e.dropped || len(e.reply) == 0 {
		return
	}
	c.bytes -= len(e.reply)
	st.total -= len(e.reply)
	st.live--
	e.reply, e.dropped = nil, true
}

// begin looks up seq in c. run is true if the caller must execute the
// request and then call finish; otherwise e is the first execution, to
// wait for. oldest is the client's oldest seq in flight.
func (st *replyStore) begin(c *replyCache, seq, oldest uint64) (e *replyEntry, run bool, err error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if f := min(oldest, seq); f > c.floor {
		c.floor = f
		st.trim(c)
	}
	if seq < c.floor {
		return nil, false, ErrReplyEvicted // the client gave it up
	}
	if e := c.entries[seq]; e != nil {
		return e, false, nil
	}
	if c.evicted && seq <= c.maxGone {
		return nil, false, ErrReplyEvicted
	}
	e = &replyEntry{}
	c.entries[seq] = e
	return e, true, nil
}

// trim forgets finished entries below the floor, from the oldest
// finished on (an entry that finished out of order waits for its turn,
// or for the size bound). Called with mu held.
func (st *replyStore) trim(c *replyCache) {
	for c.head < len(c.order) && c.order[c.head] < c.floor {
		seq := c.pop()
		if e := c.entries[seq]; e != nil {
			st.dropBody(c, e)
			delete(c.entries, seq)
		}
	}
}

// finish records seq's reply; with rerun (an idempotent request) it keeps
// nothing, and a duplicate runs the request again.
func (st *replyStore) finish(c *replyCache, seq uint64, e *replyEntry, reply []byte, rerun bool) {
	st.mu.Lock()
	defer st.mu.Unlock()
	e.finished = true
	if e.done != nil {
		defer close(e.done)
	}
	if c.entries[seq] != e {
		// forgotten meanwhile (the session, or the seq below the floor)
		e.rerun, e.dropped = rerun, true
		return
	}
	if rerun {
		// nothing to keep: a later duplicate runs again, unless refused
		// below the floor or the watermark like any forgotten seq
		e.rerun, e.dropped = true, true
		delete(c.entries, seq)
		return
	}
	e.reply = reply
	c.order = append(c.order, seq)
	if len(reply) > 0 {
		c.bytes += len(reply)
		st.total += len(reply)
		st.live++
		st.bodies = append(st.bodies, bodyRef{c, e})
	}
	for c.live() > st.size {
		old := c.pop()
		if oe := c.entries[old]; oe != nil {
			st.dropBody(c, oe)
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
	for ; c.bytes > st.maxBytes && c.kept < len(c.order)-1; c.kept++ {
		if oe := c.entries[c.order[c.kept]]; oe != nil {
			st.dropBody(c, oe)
		}
	}
	// Then over all sessions, oldest first, the same way.
	for st.total > st.maxTotal && st.bhead < len(st.bodies)-1 {
		r := st.bodies[st.bhead]
		st.bodies[st.bhead] = bodyRef{}
		st.bhead++
		st.dropBody(r.c, r.e)
	}
	st.compactBodies()
}

// compactBodies keeps the list of bodies proportional to the bodies
// kept: refs to dropped ones go once they are most of it.
func (st *replyStore) compactBodies() {
	n := len(st.bodies) - st.bhead
	switch {
	case st.live == 0:
		clear(st.bodies)
		st.bodies, st.bhead = st.bodies[:0], 0
		if cap(st.bodies) > 4096 {
			st.bodies = nil
		}
	case n >= 1024 && n > 2*st.live:
		keep := st.bodies[:0]
		for _, r := range st.bodies[st.bhead:] {
			if !r.e.dropped && len(r.e.reply) > 0 {
				keep = append(keep, r)
			}
		}
		clear(st.bodies[len(keep):])
		st.bodies, st.bhead = keep, 0
	case st.bhead > 64 && st.bhead*2 > len(st.bodies):
		copy(st.bodies, st.bodies[st.bhead:])
		clear(st.bodies[n:])
		st.bodies, st.bhead = st.bodies[:n], 0
	}
}

// wait returns a channel closed once e finished (nil if it has).
func (st *replyStore) wait(e *replyEntry) <-chan struct{} {
	st.mu.Lock()
	defer st.mu.Unlock()
	if e.finished {
		return nil
	}
	if e.done == nil {
		e.done = make(chan struct{})
	}
	return e.done
}

// result returns a finished entry's reply; ok is false if its body was
// dropped, or never kept (rerun).
func (st *replyStore) result(e *replyEntry) (reply []byte, ok, rerun bool) {
	st.mu.Lock()
	defer st.mu.Unlock()
	return e.reply, !e.dropped, e.rerun
}

// stats returns the sessions with a cache, their entries and the reply
// bytes kept.
func (st *replyStore) stats() (sessions, entries, bytes int) {
	st.mu.Lock()
	defer st.mu.Unlock()
	for _, c := range st.sessions {
		entries += len(c.entries)
	}
	return len(st.sessions), entries, st.total
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
