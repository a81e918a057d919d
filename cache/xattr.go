package cache

import (
	"bytes"
	"slices"

	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/wire"
)

// Extended attributes are cached like attributes: under the inode's lock
// (another mount changes them only under X, after revoking ours), dropped
// with the lock, and not taken from a reply to a request sent before this
// mount changed them (touched). The kernel asks for security.selinux and
// system.posix_acl_access at every ls -l, and for security.capability
// before every write: mostly absent, and each absence is worth caching.

// maxXattrBytes bounds the names and values of extended attributes cached
// over all inodes; past it nothing more is cached until some go with their
// locks. xattrOverhead is what one cached name costs beside its bytes.
const (
	maxXattrBytes = 16 << 20
	xattrOverhead = 64
)

// xattrs is what the cache knows of an inode's extended attributes.
type xattrs struct {
	vals map[string][]byte // name → value; nil: the inode has no such attribute
	// names lists every attribute of the inode, in the server's order,
	// if listed: a name not in it is absent.
	names  []string
	listed bool
	bytes  int // counted in Cache.xattrBytes
}

// dropXattrs forgets e's extended attributes.
func (c *Cache) dropXattrs(e *entry) {
	if e.xattrs != nil {
		c.xattrBytes -= e.xattrs.bytes
		e.xattrs = nil
	}
}

// xattrsFor returns e's extended attributes to add n bytes to, or nil if
// the budget is spent or no lock covers what the current reply says.
func (c *Cache) xattrsFor(e *entry, ino ids.Ino, n int) *xattrs {
	if !c.mayCache(e, ino) || c.predates(e) || c.xattrBytes+n > c.maxXattrBytes {
		return nil
	}
	if e.xattrs == nil {
		e.xattrs = &xattrs{vals: map[string][]byte{}}
	}
	e.xattrs.bytes += n
	c.xattrBytes += n
	return e.xattrs
}

// SetXattr caches ino's extended attribute name: value, or nil when the
// inode has none of that name.
func (c *Cache) SetXattr(ino ids.Ino, name string, value []byte) {
	e := c.inodes[ino]
	if e != nil && e.xattrs != nil {
		if _, ok := e.xattrs.vals[name]; ok {
			return // the same answer: nobody else can change it under our lock
		}
	}
	x := c.xattrsFor(e, ino, len(name)+len(value)+xattrOverhead)
	if x == nil {
		return
	}
	if value != nil {
		value = bytes.Clone(value)
		if value == nil {
			value = []byte{}
		}
	}
	x.vals[name] = value
}

// SetXattrNames caches the names of every extended attribute of ino.
func (c *Cache) SetXattrNames(ino ids.Ino, names []string) {
	e := c.inodes[ino]
	if e != nil && e.xattrs != nil && e.xattrs.listed {
		return
	}
	n := xattrOverhead
	for _, name := range names {
		n += len(name) + 16
	}
	if x := c.xattrsFor(e, ino, n); x != nil {
		x.names, x.listed = slices.Clone(names), true
	}
}

// SetNoXattrs records, under the lock this reply granted, that ino has
// no extended attributes (the client just created it).
func (c *Cache) SetNoXattrs(ino ids.Ino) { c.SetXattrNames(ino, nil) }

// Xattr returns ino's extended attribute name from the cache: ok is false
// if the cache cannot tell, value nil if the inode has none of that name.
// The caller owns the value.
func (c *Cache) Xattr(ino ids.Ino, name string) (value []byte, ok bool) {
	e := c.inodes[ino]
	if e == nil || e.mode == wire.LockNone || e.xattrs == nil {
		c.misses++
		return nil, false
	}
	x := e.xattrs
	if v, ok := x.vals[name]; ok {
		c.hits++
		if v == nil {
			return nil, true
		}
		return bytes.Clone(v), true
	}
	if x.listed && !slices.Contains(x.names, name) {
		c.hits++
		return nil, true
	}
	c.misses++
	return nil, false
}

// XattrNames returns the names of every extended attribute of ino, if the
// cache knows them; the caller owns the slice.
func (c *Cache) XattrNames(ino ids.Ino) ([]string, bool) {
	e := c.inodes[ino]
	if e == nil || e.mode == wire.LockNone || e.xattrs == nil || !e.xattrs.listed {
		c.misses++
		return nil, false
	}
	c.hits++
	return slices.Clone(e.xattrs.names), true
}

// DropXattrs forgets ino's extended attributes: this mount changed one. A
// reply to a request sent before is not cached.
func (c *Cache) DropXattrs(ino ids.Ino) {
	e := c.get(ino)
	c.dropXattrs(e)
	c.touch(e)
}

// ACLAccess is the extended attribute that holds a POSIX access ACL.
const ACLAccess = "system.posix_acl_access"

// ModeChanged forgets ino's cached access ACL: this mount changed the
// mode, and a chmod rewrites an access ACL's entries (POSIX.1e). That the
// inode has none stays true: a chmod makes none. A reply to a request sent
// before is not cached.
func (c *Cache) ModeChanged(ino ids.Ino) {
	e := c.get(ino)
	if x := e.xattrs; x != nil {
		if v, ok := x.vals[ACLAccess]; ok && v != nil {
			delete(x.vals, ACLAccess)
			n := len(ACLAccess) + len(v) + xattrOverhead
			x.bytes -= n
			c.xattrBytes -= n
		}
	}
	c.touch(e)
}

// Capability is the extended attribute that holds a file's capabilities,
// which every write drops at the server (as Linux does).
const Capability = "security.capability"

// Written forgets ino's cached file capabilities: this mount wrote to it,
// and the write drops them when it reaches the server. That the file has
// none stays true. A reply to a request sent before is not cached.
func (c *Cache) Written(ino ids.Ino) {
	e := c.inodes[ino]
	if e == nil || e.xattrs == nil {
		return
	}
	x := e.xattrs
	if v, ok := x.vals[Capability]; ok && v != nil || x.listed && slices.Contains(x.names, Capability) {
		c.dropXattrs(e)
		c.touch(e)
	}
}
