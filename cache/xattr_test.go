package cache

import (
	"testing"

	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/wire"
)

// TestXattrCache (issue 25 item 7): values and absences cached under the
// lock a reply granted; kept while S stays, dropped with the lock and on
// this mount's own changes, and not taken from a reply to a request sent
// before such a change.
func TestXattrCache(t *testing.T) {
	c := New(100)
	if _, ok := c.Xattr(5, "user.a"); ok {
		t.Fatal("an xattr known without a lock")
	}
	g := c.Gen()
	c.ApplyReply(nil, g, func() { c.SetXattr(5, "user.a", []byte("v")) })
	if _, ok := c.Xattr(5, "user.a"); ok {
		t.Fatal("an xattr cached without a lock")
	}
	c.ApplyReply(shared(5, 1), g, func() {
		c.SetXattr(5, "user.a", []byte("v"))
		c.SetXattr(5, "security.selinux", nil)
		c.SetXattr(5, "user.empty", []byte{})
	})
	if v, ok := c.Xattr(5, "user.a"); !ok || string(v) != "v" {
		t.Fatalf("user.a: %q %v", v, ok)
	}
	if v, ok := c.Xattr(5, "security.selinux"); !ok || v != nil {
		t.Fatalf("absent security.selinux: %q %v", v, ok)
	}
	if v, ok := c.Xattr(5, "user.empty"); !ok || v == nil || len(v) != 0 {
		t.Fatalf("empty user.empty: %q %v", v, ok)
	}
	if _, ok := c.Xattr(5, "user.b"); ok {
		t.Fatal("an xattr never asked for is known")
	}
	if _, ok := c.XattrNames(5); ok {
		t.Fatal("names known without a listing")
	}
	c.ApplyReply(shared(5, 1), g, func() { c.SetXattrNames(5, []string{"user.a", "user.empty"}) })
	if v, ok := c.Xattr(5, "user.b"); !ok || v != nil {
		t.Fatal("a name not listed is not known absent")
	}
	if names, ok := c.XattrNames(5); !ok || len(names) != 2 {
		t.Fatalf("names %q %v", names, ok)
	}
	c.Revoke(5, wire.LockShared, 2) // X→S (we held S: nothing lowered) keeps them
	if _, ok := c.Xattr(5, "user.a"); !ok {
		t.Fatal("xattrs dropped while the lock stayed")
	}
	c.Revoke(5, wire.LockNone, 3)
	c.Granted(wire.Grant{Ino: 5, Mode: wire.LockShared, Seq: 4})
	if _, ok := c.Xattr(5, "user.a"); ok {
		t.Fatal("xattrs kept past the lock")
	}
	if c.xattrBytes != 0 {
		t.Fatalf("%d xattr bytes counted with none cached", c.xattrBytes)
	}

	// this mount's own setxattr: what a request sent before says is old
	sent := c.Gen()
	c.ApplyReply(shared(5, 4), sent, func() { c.SetXattr(5, "user.a", nil) })
	c.DropXattrs(5)
	c.ApplyReply(shared(5, 4), sent, func() { c.SetXattr(5, "user.a", nil) })
	if _, ok := c.Xattr(5, "user.a"); ok {
		t.Fatal("a reply sent before this mount's setxattr was cached")
	}
	c.ApplyReply(shared(5, 4), c.Gen(), func() { c.SetXattr(5, "user.a", []byte("new")) })
	if v, ok := c.Xattr(5, "user.a"); !ok || string(v) != "new" {
		t.Fatalf("after the setxattr: %q %v", v, ok)
	}

	// a chmod rewrites an access ACL, and makes none where there is none
	c.ApplyReply(shared(5, 4), c.Gen(), func() {
		c.SetXattr(5, ACLAccess, []byte("acl"))
		c.SetXattr(5, "system.posix_acl_default", nil)
	})
	c.Granted(wire.Grant{Ino: 7, Mode: wire.LockExclusive, Seq: 6})
	c.SetNoXattrs(7)
	c.ModeChanged(5)
	c.ModeChanged(7)
	if _, ok := c.Xattr(5, ACLAccess); ok {
		t.Fatal("an access ACL kept past a chmod")
	}
	if v, ok := c.Xattr(5, "user.a"); !ok || string(v) != "new" {
		t.Fatalf("a chmod dropped user.a: %q %v", v, ok)
	}
	if v, ok := c.Xattr(7, ACLAccess); !ok || v != nil {
		t.Fatalf("a chmod forgot that the inode has no access ACL: %q %v", v, ok)
	}

	// a new inode of this mount's has none
	c.Granted(wire.Grant{Ino: 6, Mode: wire.LockExclusive, Seq: 5})
	c.SetNoXattrs(6)
	if v, ok := c.Xattr(6, "security.capability"); !ok || v != nil {
		t.Fatalf("new inode: security.capability %q %v", v, ok)
	}
	if names, ok := c.XattrNames(6); !ok || len(names) != 0 {
		t.Fatalf("new inode: names %q %v", names, ok)
	}
	c.DropAll()
	if c.xattrBytes != 0 {
		t.Fatalf("%d xattr bytes counted after DropAll", c.xattrBytes)
	}
}

// TestXattrBudget: past the budget nothing more is cached; what goes with
// its lock frees room.
func TestXattrBudget(t *testing.T) {
	c := New(100)
	c.maxXattrBytes = 3 * (xattrOverhead + 10)
	for ino := ids.Ino(1); ino <= 4; ino++ {
		c.ApplyReply(shared(ino, uint64(ino)), c.Gen(), func() { c.SetXattr(ino, "user.a", []byte("12345")) })
	}
	if _, ok := c.Xattr(4, "user.a"); ok {
		t.Fatal("cached past the budget")
	}
	c.Revoke(1, wire.LockNone, 10)
	c.ApplyReply(shared(4, 4), c.Gen(), func() { c.SetXattr(4, "user.a", []byte("12345")) })
	if _, ok := c.Xattr(4, "user.a"); !ok {
		t.Fatal("room freed by a revocation not used")
	}
	if c.xattrBytes > c.maxXattrBytes {
		t.Fatalf("%d bytes over a budget of %d", c.xattrBytes, c.maxXattrBytes)
	}
}
