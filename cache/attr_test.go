package cache

import (
	"syscall"
	"testing"

	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/wire"
)

// replyAttr applies a reply carrying a, sent at generation sent, whose
// grants are grants.
func (c *Cache) replyAttr(grants []wire.Grant, sent uint64, a wire.Attr) {
	c.ApplyReply(grants, sent, func() { c.SetAttr(&a) })
}

func exclusive(ino ids.Ino, seq uint64) []wire.Grant {
	return []wire.Grant{{Ino: ino, Mode: wire.LockExclusive, Seq: seq}}
}

func wantMode(t *testing.T, c *Cache, ino ids.Ino, perm uint32) *wire.Attr {
	t.Helper()
	a, ok := c.Attr(ino)
	if !ok {
		t.Fatalf("inode %v: no attributes cached, want mode %o", ino, perm)
	}
	if a.Mode&^syscall.S_IFMT != perm {
		t.Fatalf("inode %v: mode %o, want %o", ino, a.Mode&^syscall.S_IFMT, perm)
	}
	return a
}

func wantNoAttr(t *testing.T, c *Cache, ino ids.Ino) {
	t.Helper()
	if a, ok := c.Attr(ino); ok {
		t.Fatalf("inode %v: attributes %+v cached, want none", ino, a)
	}
}

// TestAttrChangeOrder: of two replies about an inode, the one with the
// greater Change wins, whatever order they arrive in; a newer reply that
// no lock covers drops what the cache holds.
func TestAttrChangeOrder(t *testing.T) {
	c := New(100)
	g := c.Gen()
	c.replyAttr(shared(5, 1), g, wire.Attr{Ino: 5, Mode: 0o600, Nlink: 2, Change: 4})
	c.replyAttr(shared(5, 1), g, wire.Attr{Ino: 5, Mode: 0o644, Nlink: 1, Change: 3}) // executed before, arrived after
	if a := wantMode(t, c, 5, 0o600); a.Nlink != 2 {
		t.Fatalf("nlink %d: an older reply replaced a newer one", a.Nlink)
	}
	c.replyAttr(shared(5, 1), g, wire.Attr{Ino: 5, Mode: 0o640, Change: 4}) // the same state again
	wantMode(t, c, 5, 0o640)
	c.replyAttr(nil, g, wire.Attr{Ino: 5, Mode: 0o640, Change: 4}) // uncovered, not newer: kept
	wantMode(t, c, 5, 0o640)
	c.replyAttr(nil, g, wire.Attr{Ino: 5, Mode: 0o600, Change: 6}) // uncovered, newer: what we had is old
	wantNoAttr(t, c, 5)
	c.replyAttr(shared(5, 1), g, wire.Attr{Ino: 5, Mode: 0o644, Change: 5}) // older than one seen uncached
	wantNoAttr(t, c, 5)
	c.replyAttr(shared(5, 1), g, wire.Attr{Ino: 5, Mode: 0o606, Change: 7})
	wantMode(t, c, 5, 0o606)
}

// TestLocalAttrsOverReplies (issue 25 item 4): a chmod buffered under X is
// given over every reply until the server has it, however new the reply
// (a create's reply carries the directory's new times and link count).
func TestLocalAttrsOverReplies(t *testing.T) {
	c := New(100)
	c.replyAttr(exclusive(1, 1), c.Gen(), wire.Attr{Ino: 1, Mode: syscall.S_IFDIR | 0o755, Nlink: 2, Change: 1})
	a := wantMode(t, c, 1, 0o755)
	a.Mode = syscall.S_IFDIR | 0o700
	a.Uid = 99 // not among the fields: ignored
	c.SetLocal(a, wire.SetMode|wire.SetCtime)
	if c.LocalFields(1) != wire.SetMode|wire.SetCtime {
		t.Fatalf("local fields %#x", c.LocalFields(1))
	}
	c.replyAttr(exclusive(1, 1), c.Gen(), wire.Attr{Ino: 1, Mode: syscall.S_IFDIR | 0o755, Nlink: 3, Mtime: 9, Change: 2})
	got := wantMode(t, c, 1, 0o700)
	if got.Nlink != 3 || got.Mtime != 9 || got.Uid != 0 || got.Mode&syscall.S_IFMT != syscall.S_IFDIR {
		t.Fatalf("reply's other attributes lost: %+v", got)
	}
	if n := c.Newest(&wire.Attr{Ino: 1, Mode: syscall.S_IFDIR | 0o755, Change: 2}); n.Mode&0o777 != 0o700 {
		t.Fatalf("Newest gives %o, not the buffered chmod", n.Mode&0o777)
	}
	if n := c.Newest(&wire.Attr{Ino: 1, Mode: syscall.S_IFDIR | 0o755, Nlink: 7, Change: 3}); n.Mode&0o777 != 0o700 || n.Nlink != 7 {
		t.Fatalf("Newest of a newer reply: %+v", n)
	}
	// the buffered size of writes, with the blocks it takes
	f := c.Gen()
	c.replyAttr(exclusive(2, 1), f, wire.Attr{Ino: 2, Mode: syscall.S_IFREG | 0o644, Size: 0, Change: 1})
	c.SetLocal(&wire.Attr{Ino: 2, Size: 5000, Mtime: 7}, wire.SetSize|wire.SetMtime)
	c.replyAttr(exclusive(2, 1), f, wire.Attr{Ino: 2, Mode: syscall.S_IFREG | 0o644, Nlink: 2, Change: 2})
	if a, _ := c.Attr(2); a.Size != 5000 || a.Blocks != 10 || a.Mtime != 7 || a.Nlink != 2 {
		t.Fatalf("buffered writes over a reply: %+v", a)
	}
	// the server has the changes: its reply is what is cached
	c.replyAttr(exclusive(1, 1), c.Gen(), wire.Attr{Ino: 1, Mode: syscall.S_IFDIR | 0o700, Nlink: 3, Ctime: 11, Change: 3})
	c.LocalDone(1)
	if a := wantMode(t, c, 1, 0o700); a.Ctime != 11 {
		t.Fatalf("after LocalDone: %+v", a)
	}
	// buffered changes outlive dropped attributes
	c.SetLocal(&wire.Attr{Ino: 1, Mode: 0o711}, wire.SetMode)
	c.InvalidateAttr(1)
	if n := c.Newest(&wire.Attr{Ino: 1, Mode: syscall.S_IFDIR | 0o700, Change: 4}); n.Mode != syscall.S_IFDIR|0o711 {
		t.Fatalf("Newest without cached attributes: %o", n.Mode)
	}
	// and go with the cache on a NACK
	c.DropAll()
	if c.LocalFields(1) != 0 {
		t.Fatal("buffered changes survived DropAll")
	}
}

// TestPredictedAttrs: a change sent behind the caller is predicted; until
// it reaches the server no reply replaces the prediction, nor does a
// reply to a request sent before it got there.
func TestPredictedAttrs(t *testing.T) {
	c := New(100)
	c.replyAttr(exclusive(1, 1), c.Gen(), wire.Attr{Ino: 1, Mode: syscall.S_IFDIR | 0o755, Nlink: 3, Change: 5})
	before := c.Gen()
	c.Predict(1, func(a *wire.Attr) { a.Nlink-- })
	during := c.Gen()
	// a lookup of the directory, made before the removal reached the server
	c.replyAttr(exclusive(1, 1), during, wire.Attr{Ino: 1, Mode: syscall.S_IFDIR | 0o755, Nlink: 3, Change: 5})
	if a, _ := c.Attr(1); a == nil || a.Nlink != 2 {
		t.Fatalf("prediction replaced while pending: %+v", a)
	}
	c.Predicted(1)
	c.replyAttr(exclusive(1, 1), before, wire.Attr{Ino: 1, Mode: syscall.S_IFDIR | 0o755, Nlink: 3, Change: 5})
	c.replyAttr(exclusive(1, 1), during, wire.Attr{Ino: 1, Mode: syscall.S_IFDIR | 0o755, Nlink: 3, Change: 5})
	if a, _ := c.Attr(1); a == nil || a.Nlink != 2 {
		t.Fatalf("prediction replaced by a reply sent before the change arrived: %+v", a)
	}
	c.replyAttr(exclusive(1, 1), c.Gen(), wire.Attr{Ino: 1, Mode: syscall.S_IFDIR | 0o755, Nlink: 2, Mtime: 3, Change: 6})
	if a, _ := c.Attr(1); a == nil || a.Mtime != 3 {
		t.Fatalf("a reply sent after the change arrived not cached: %+v", a)
	}
	// a change whose start the cache lost (a NACK dropped it) leaves
	// nothing cached that may predate it
	c.Predicted(1)
	wantNoAttr(t, c, 1)
}

// TestInvalidatedAttrs: after this mount changed an inode in a way its
// reply does not tell (an unlink of one of a file's names, a setxattr),
// a reply to a request sent before is not cached.
func TestInvalidatedAttrs(t *testing.T) {
	c := New(100)
	sent := c.Gen()
	c.replyAttr(shared(5, 1), sent, wire.Attr{Ino: 5, Nlink: 2, Change: 1})
	c.InvalidateAttr(5) // an unlink of one name came back
	c.replyAttr(shared(5, 1), sent, wire.Attr{Ino: 5, Nlink: 2, Change: 1})
	wantNoAttr(t, c, 5)
	c.replyAttr(shared(5, 1), c.Gen(), wire.Attr{Ino: 5, Nlink: 1, Change: 2})
	if a, ok := c.Attr(5); !ok || a.Nlink != 1 {
		t.Fatalf("a reply sent after the change not cached: %+v", a)
	}
}
