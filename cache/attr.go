package cache

import (
	"syscall"

	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/wire"
)

// Attributes. Four things can make what the cache holds older than what
// this mount knows, and each has its rule:
//
//   - Replies arrive in any order. Each carries the inode's Change (the
//     server counts every change of the attribute record): the cache keeps
//     the greatest it saw (entry.change) and ignores attributes older.
//   - This mount buffers attribute changes under its X lock (chmod, utimes,
//     the size of buffered writes) that the server does not have yet, while
//     replies about the inode keep coming (a create in a directory carries
//     the directory's new times). They are kept apart (SetLocal) and given
//     over whatever the replies say (Attr) until the server has them
//     (LocalDone).
//   - Changes sent behind the caller (creates and removals, client/behind.go)
//     are predicted in the cache at once (Predict); a reply about the inode
//     before they reach the server (Predicted) may predate them, and one
//     to a request sent before they did may too.
//   - Some changes' replies do not carry the attributes they changed (an
//     unlink's of the file, a rename's, a setxattr's): the cache drops them
//     (InvalidateAttr), and a reply to a request sent before that may
//     predate the change.
//
// The last two are one rule: a reply about an inode that this mount changed
// outside replies after the reply's request was sent (entry.touched, against
// ApplyReply's sent) or is changing (entry.pending) is not cached.

// localAttr is the attribute changes this mount buffered and the server
// does not have yet: fields (wire.SetMode, SetUid, SetGid, SetAtime,
// SetMtime, SetCtime; SetSize for buffered writes) say which of a's are
// set.
type localAttr struct {
	fields uint32
	a      wire.Attr
}

// over copies l's fields into a.
func (l *localAttr) over(a *wire.Attr) {
	f := l.fields
	if f&wire.SetMode != 0 {
		a.Mode = a.Mode&syscall.S_IFMT | l.a.Mode&^syscall.S_IFMT
	}
	if f&wire.SetUid != 0 {
		a.Uid = l.a.Uid
	}
	if f&wire.SetGid != 0 {
		a.Gid = l.a.Gid
	}
	if f&wire.SetSize != 0 {
		a.Size = l.a.Size
		a.Blocks = (a.Size + 511) / 512 // as the server counts them
	}
	if f&wire.SetAtime != 0 {
		a.Atime = l.a.Atime
	}
	if f&wire.SetMtime != 0 {
		a.Mtime = l.a.Mtime
	}
	if f&wire.SetCtime != 0 {
		a.Ctime = l.a.Ctime
	}
}

// view returns a copy of e's attributes with this mount's buffered changes
// over them; e.attr must be set.
func (e *entry) view() *wire.Attr {
	cp := *e.attr
	if e.local != nil {
		e.local.over(&cp)
	}
	return &cp
}

// Gen returns the generation of this mount's own changes: a request takes
// it when it is sent, and its reply passes it to ApplyReply.
func (c *Cache) Gen() uint64 { return c.gen }

// touch records that this mount changed e's attributes or extended
// attributes outside a reply: replies to requests sent before may predate
// the change.
func (c *Cache) touch(e *entry) {
	c.gen++
	e.touched = c.gen
}

// predates reports whether what the current reply says about e may be
// older than a change this mount made or is making.
func (c *Cache) predates(e *entry) bool {
	return c.inReply && (e.pending > 0 || e.touched > c.sent)
}

// SetAttr takes attributes from a reply (or this mount's own change's
// reply outside ApplyReply), if a lock covers them and they are not older
// than what the cache knows.
func (c *Cache) SetAttr(a *wire.Attr) {
	e := c.inodes[a.Ino]
	if e == nil || a.Change < e.change {
		return // a reply that crossed a newer one on the way
	}
	newer := a.Change > e.change
	e.change = a.Change
	switch {
	case c.mayCache(e, a.Ino) && !c.predates(e):
		cp := *a
		e.attr = &cp
	case newer:
		e.attr = nil // what we had is older than a
	}
}

// Attr returns the cached attributes, with this mount's buffered changes.
func (c *Cache) Attr(ino ids.Ino) (*wire.Attr, bool) {
	if e := c.inodes[ino]; e != nil && e.mode != wire.LockNone && e.attr != nil {
		c.hits++
		return e.view(), true
	}
	c.misses++
	return nil, false
}

// Newest returns what to hand the kernel after a reply that carried a:
// the cached attributes if they are at least as new, else a; either with
// this mount's buffered changes over it.
func (c *Cache) Newest(a *wire.Attr) *wire.Attr {
	e := c.inodes[a.Ino]
	if e == nil {
		return a
	}
	if e.mode != wire.LockNone && e.attr != nil && e.attr.Change >= a.Change {
		return e.view()
	}
	cp := *a
	if e.local != nil {
		e.local.over(&cp)
	}
	return &cp
}

// SetLocal records attribute changes this mount made under its X lock and
// buffered: fields (see localAttr) of a. Attr gives them over what replies
// say until LocalDone.
func (c *Cache) SetLocal(a *wire.Attr, fields uint32) {
	e := c.inodes[a.Ino]
	if e == nil {
		return
	}
	if e.local == nil {
		e.local = &localAttr{}
	}
	e.local.fields |= fields
	e.local.a.Ino = a.Ino
	(&localAttr{fields: fields, a: *a}).over(&e.local.a)
}

// LocalFields returns the fields of ino this mount changed and the server
// does not have yet.
func (c *Cache) LocalFields(ino ids.Ino) uint32 {
	if e := c.inodes[ino]; e != nil && e.local != nil {
		return e.local.fields
	}
	return 0
}

// LocalDone forgets ino's buffered changes: the server has them (their
// replies are cached), or they are lost.
func (c *Cache) LocalDone(ino ids.Ino) {
	if e := c.inodes[ino]; e != nil {
		e.local = nil
	}
}

// Predict changes ino's cached attributes as a change this mount sends
// behind its caller will (fn, if they are cached), until Predicted: no
// reply meanwhile, nor one to a request sent before, replaces them.
func (c *Cache) Predict(ino ids.Ino, fn func(a *wire.Attr)) {
	e := c.get(ino)
	if e.attr != nil && fn != nil {
		fn(e.attr)
	}
	e.pending++
	c.touch(e)
}

// Predicted ends a Predict: the change reached the server. A reply to a
// request sent before may still predate it. If the cache was dropped
// since (a NACK), what it cached meanwhile may predate it: dropped.
func (c *Cache) Predicted(ino ids.Ino) {
	e := c.get(ino)
	if e.pending > 0 {
		e.pending--
	} else {
		e.attr = nil
	}
	c.touch(e)
}

// InvalidateAttr forgets ino's cached attributes: this mount changed them,
// and the reply did not say how.
func (c *Cache) InvalidateAttr(ino ids.Ino) {
	e := c.get(ino)
	e.attr = nil
	c.touch(e)
}

// InvalidateDir forgets a directory's cached entries and attributes.
func (c *Cache) InvalidateDir(dir ids.Ino) {
	e := c.get(dir)
	c.dropNames(e)
	e.attr = nil
	c.touch(e)
}
