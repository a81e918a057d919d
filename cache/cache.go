// Package cache is a mount's cache of attributes, extended attributes,
// directory entries and file data, each valid only under a data lock the
// server granted (DESIGN.md "Data locks"). It is pure bookkeeping: the
// client checks its lease before trusting anything here, and applies
// grants and revocations in the order their sequence numbers say, whatever
// order the network delivered them in.
//
// Not safe for concurrent use; the client serialises calls.
package cache

import (
	"container/list"
	"syscall"

	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/internal/pagemem"
	"github.com/leasefs/leasefs/locks/lockclient"
	"github.com/leasefs/leasefs/wire"
)

type entry struct {
	mode wire.LockMode
	// seqs orders the lock's grants and revocations: a grant overtaken
	// by its revocation must not resurrect the lock.
	seqs lockclient.Inode
	// attr is the newest attributes a reply gave (with this mount's
	// predictions of its changes sent behind, Predict); Attr gives local
	// over it. change is the greatest Change a reply showed, cached or
	// not: what is older is not cached. See attr.go.
	attr    *wire.Attr
	change  uint64
	local   *localAttr
	pending int    // changes sent behind whose effect Predict made (attr.go)
	touched uint64 // Cache.gen at this mount's last change outside a reply (attr.go)
	xattrs  *xattrs
	names   map[string]ids.Ino // directory entries; 0 caches "does not exist"
	// complete: names holds every entry of the directory (the client made
	// it, under its lock), so a name not in names does not exist.
	complete bool
	pages    map[uint64]*list.Element // page index → *page in the LRU
	// dataDropped is the data generation of the last drop: data fetched
	// before it is stale.
	dataDropped uint64
	// dataVersion is the file version the cached pages belong to;
	// seenVersion the newest version any read reply showed. Replies arrive
	// out of order: once a read returned version v, pages older than v
	// must not be served.
	dataVersion, seenVersion uint64
	changing                 int // changes of the data in flight (BeginChange)
	// blockMap is what a lookup said of the file's blocks (PutMap), kept
	// and dropped with the pages.
	blockMap any
	// opens counts handles opened without the server (OpenLocally);
	// removing counts removals of the file this client has in flight,
	// during which it opens nothing locally.
	opens, removing int
}

// rules are production's sequence-number rules: none switched off.
var rules lockclient.Rules

// Cache holds what the client may serve without asking the server.
type Cache struct {
	inodes  map[ids.Ino]*entry
	locked  int // entries with a lock, so HoldsLocks is O(1) on the renewal tick
	max     int
	evicted []wire.Grant
	hits    int64
	misses  int64
	// names counts the cached directory entries, at most maxNames over
	// all directories (each costs ~100 bytes)
	names, maxNames int

	// covered, during ApplyReply: the inodes whose grant in that reply
	// was accepted, the only ones whose contents it may cache. sent is
	// gen when the reply's request was sent.
	covered map[ids.Ino]bool
	inReply bool
	sent    uint64
	// gen counts this mount's changes of attributes and extended
	// attributes made outside replies (entry.touched).
	gen uint64

	// xattrBytes counts the cached extended attributes' names and
	// values, at most maxXattrBytes (xattr.go).
	xattrBytes, maxXattrBytes int

	lru       list.List     // cached file pages, most recently used first
	pool      *pagemem.Pool // memory of whole pages, made on first use
	dataBytes int64
	dataMax   int64
	dataGen   uint64
}

// New returns a cache holding at most maxInodes locked inodes.
func New(maxInodes int) *Cache {
	return &Cache{inodes: map[ids.Ino]*entry{}, max: maxInodes, maxNames: 500_000, maxXattrBytes: maxXattrBytes}
}

// setMode changes e's lock mode, keeping the count of locked entries;
// file data goes with the last lock.
func (c *Cache) setMode(e *entry, m wire.LockMode) {
	if m == wire.LockNone && e.mode != wire.LockNone {
		c.dropPages(e)
		c.dropXattrs(e)
	}
	if (e.mode != wire.LockNone) != (m != wire.LockNone) {
		if m != wire.LockNone {
			c.locked++
		} else {
			c.locked--
		}
	}
	e.mode = m
}

func (c *Cache) get(ino ids.Ino) *entry {
	e := c.inodes[ino]
	if e == nil {
		e = &entry{dataDropped: c.dataGen}
		c.inodes[ino] = e
	}
	return e
}

// Granted records a lock grant. It returns false for a grant its
// revocation already overtook.
func (c *Cache) Granted(g wire.Grant) bool {
	e := c.get(g.Ino)
	accept, newest := rules.Granted(&e.seqs, g.Seq)
	if !accept {
		return false
	}
	if newest { // the newest grant says what the server believes we hold
		c.setMode(e, g.Mode)
	}
	c.evictIfFull(g.Ino)
	return true
}

// ApplyReply applies a reply's grants and runs fn, in which the reply's
// attributes, entries and data may be cached only for inodes whose grant in
// this same reply was accepted. A reply executed under a lock that a
// revocation has since voided is stale even if a newer grant covers the
// inode by the time it arrives (the server let the old holder finish while
// another client waited, and that client may have written since). sent is
// Gen when the request was sent: attributes of an inode this mount changed
// since then are not taken from the reply (attr.go).
func (c *Cache) ApplyReply(grants []wire.Grant, sent uint64, fn func()) {
	if c.covered == nil {
		c.covered = map[ids.Ino]bool{}
	}
	for _, g := range grants {
		if c.Granted(g) {
			c.covered[g.Ino] = true
		}
	}
	defer clear(c.covered)
	defer func() { c.inReply = false }()
	c.inReply, c.sent = true, sent
	fn()
}

// mayCache reports whether what the current reply says about ino may be
// cached: outside ApplyReply it is the client's own change under its lock.
func (c *Cache) mayCache(e *entry, ino ids.Ino) bool {
	return e != nil && e.mode != wire.LockNone && (!c.inReply || c.covered[ino])
}

// evictIfFull drops an arbitrary other inode when over the bound; the
// client releases its lock at the server (TakeEvicted).
func (c *Cache) evictIfFull(keep ids.Ino) {
	for evicted := true; evicted && len(c.inodes) > c.max; {
		evicted = false
		for ino, e := range c.inodes {
			// a file opened locally keeps its lock: giving it back would
			// have to tell the server of the opens first
			if ino == keep || e.changing > 0 || e.opens > 0 {
				continue
			}
			evicted = true
			if e.mode != wire.LockNone {
				c.evicted = append(c.evicted, wire.Grant{Ino: ino, Mode: e.mode, Seq: e.seqs.Grant()})
			}
			c.setMode(e, wire.LockNone)
			c.dropNames(e)
			c.dropXattrs(e)
			delete(c.inodes, ino)
			break
		}
	}
}

// TakeEvicted returns the locks evicted for space since the last call.
func (c *Cache) TakeEvicted() []wire.Grant {
	out := c.evicted
	c.evicted = nil
	return out
}

// Revoke applies a revocation down to mode `to` with sequence number seq.
// It reports whether the inode held a lock that this revocation lowered:
// not if a newer grant overtook it.
func (c *Cache) Revoke(ino ids.Ino, to wire.LockMode, seq uint64) bool {
	e := c.get(ino)
	if !rules.Revoked(&e.seqs, seq) || e.mode <= to {
		return false
	}
	if to == wire.LockNone {
		c.setMode(e, wire.LockNone)
		c.dropNames(e)
		e.attr = nil
	} else {
		c.setMode(e, to)
	}
	return true
}

// OpenLocally counts an open of ino that the server is not asked for and
// returns ino's attributes: allowed while the client holds a lock on ino
// and knows them, since nobody can remove the file without revoking the
// lock first, and the revocation's acknowledgement tells the server of the
// opens (TakeOpens).
func (c *Cache) OpenLocally(ino ids.Ino) (*wire.Attr, bool) {
	e := c.inodes[ino]
	if e == nil || e.mode == wire.LockNone || e.attr == nil || e.removing > 0 {
		return nil, false
	}
	e.opens++
	c.hits++
	return e.view(), true
}

// CloseLocally uncounts a local open of ino; false if there is none, and
// the server must be told of the close.
func (c *Cache) CloseLocally(ino ids.Ino) bool {
	if e := c.inodes[ino]; e != nil && e.opens > 0 {
		e.opens--
		return true
	}
	return false
}

// TakeOpens returns ino's local opens and forgets them: the caller tells
// the server of them (the client gave up its lock).
func (c *Cache) TakeOpens(ino ids.Ino) uint32 {
	e := c.inodes[ino]
	if e == nil {
		return 0
	}
	n := e.opens
	e.opens = 0
	return uint32(n)
}

// Opens returns ino's local opens.
func (c *Cache) Opens(ino ids.Ino) int {
	if e := c.inodes[ino]; e != nil {
		return e.opens
	}
	return 0
}

// Empty reports whether the client knows dir has no entries: it holds its
// lock and knows all of them (MarkComplete), and each is known not to exist.
func (c *Cache) Empty(dir ids.Ino) bool {
	e := c.inodes[dir]
	if e == nil || e.mode == wire.LockNone || !e.complete {
		return false
	}
	for _, child := range e.names {
		if child != 0 {
			return false
		}
	}
	return true
}

// BeginRemove is TakeOpens before a change that may remove ino's last
// link; ino gets no local opens until EndRemove.
func (c *Cache) BeginRemove(ino ids.Ino) uint32 {
	c.get(ino).removing++
	return c.TakeOpens(ino)
}

// EndRemove ends a removal BeginRemove began.
func (c *Cache) EndRemove(ino ids.Ino) {
	if e := c.inodes[ino]; e != nil && e.removing > 0 {
		e.removing--
	}
}

// Mode returns the lock the client holds on ino.
func (c *Cache) Mode(ino ids.Ino) (wire.LockMode, uint64) {
	if e := c.inodes[ino]; e != nil {
		return e.mode, e.seqs.Grant()
	}
	return wire.LockNone, 0
}

// SetEntry caches parent/name → child (0: known not to exist) under the
// parent's lock.
func (c *Cache) SetEntry(parent ids.Ino, name string, child ids.Ino) {
	e := c.inodes[parent]
	if e == nil || e.mode == wire.LockNone {
		return
	}
	if !c.mayCache(e, parent) {
		// Not covered by this reply's grant, yet the name may have changed:
		// forget what we had.
		if _, ok := e.names[name]; ok {
			delete(e.names, name)
			c.names--
		}
		e.complete = false
		return
	}
	if e.names == nil {
		e.names = map[string]ids.Ino{}
	}
	if _, ok := e.names[name]; !ok {
		if c.names >= c.maxNames {
			c.dropNames(e)
			e.names = map[string]ids.Ino{}
		}
		c.names++
	}
	e.names[name] = child
}

// dropNames forgets e's cached entries.
func (c *Cache) dropNames(e *entry) {
	c.names -= len(e.names)
	e.names, e.complete = nil, false
}

// Entry looks parent/name up; ok is false when the cache cannot tell.
func (c *Cache) Entry(parent ids.Ino, name string) (child ids.Ino, ok bool) {
	if e := c.inodes[parent]; e != nil && e.mode != wire.LockNone {
		if child, ok := e.names[name]; ok {
			c.hits++
			return child, true
		}
		if e.complete {
			c.hits++
			return 0, true
		}
	}
	c.misses++
	return 0, false
}

// Listing returns every entry of dir, in name order, if the cache holds
// them all (complete) and knows each one's type (an inode's type never
// changes); false otherwise.
func (c *Cache) Listing(dir ids.Ino) ([]wire.DirEntry, bool) {
	e := c.inodes[dir]
	if e == nil || e.mode == wire.LockNone || !e.complete {
		c.misses++
		return nil, false
	}
	out := make([]wire.DirEntry, 0, len(e.names))
	for name, ino := range e.names {
		if ino == 0 {
			continue
		}
		child := c.inodes[ino]
		if child == nil || child.attr == nil {
			c.misses++
			return nil, false
		}
		out = append(out, wire.DirEntry{Name: name, Ino: ino, Mode: child.attr.Mode & syscall.S_IFMT})
	}
	wire.SortByName(out)
	c.hits++
	return out, true
}

// MarkComplete records that the client knows every entry of dir: it has
// just created it, empty, and holds its lock.
func (c *Cache) MarkComplete(dir ids.Ino) {
	if e := c.inodes[dir]; c.mayCache(e, dir) {
		e.complete = true
		if e.names == nil {
			e.names = map[string]ids.Ino{}
		}
	}
}

// DropAll forgets everything (after a NACK) and returns the inodes that
// had anything cached, so the caller can drop the kernel's caches too.
func (c *Cache) DropAll() []ids.Ino {
	out := make([]ids.Ino, 0, len(c.inodes))
	for ino := range c.inodes {
		out = append(out, ino)
	}
	clear(c.inodes)
	for el := c.lru.Front(); el != nil; el = el.Next() {
		c.freePage(el.Value.(*page))
	}
	c.lru.Init()
	c.dataBytes = 0
	c.dataGen++
	c.locked = 0
	c.names = 0
	c.xattrBytes = 0
	c.evicted = nil
	return out
}

// Locks returns every lock held.
func (c *Cache) Locks() []wire.Grant {
	var out []wire.Grant
	for ino, e := range c.inodes {
		if e.mode != wire.LockNone {
			out = append(out, wire.Grant{Ino: ino, Mode: e.mode, Seq: e.seqs.Grant()})
		}
	}
	return out
}

// HoldsLocks reports whether any lock is held: only then does the client
// renew its lease explicitly.
func (c *Cache) HoldsLocks() bool { return c.locked > 0 }

// Stats returns cache hits, misses and cached inodes.
func (c *Cache) Stats() (hits, misses int64, inodes int) { return c.hits, c.misses, len(c.inodes) }
