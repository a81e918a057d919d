package cache

import (
	"slices"
	"syscall"
	"testing"

	idpkg "github.com/leasefs/leasefs/internal/ids"

	"github.com/leasefs/leasefs/wire"
)

func TestGrantRevokeOrdering(t *testing.T) {
	c := New(100)
	if !c.Granted(wire.Grant{Ino: 5, Mode: wire.LockShared, Seq: 3}) {
		t.Fatal("fresh grant refused")
	}
	c.SetAttr(&wire.Attr{Ino: 5, Size: 10})
	if a, ok := c.Attr(5); !ok || a.Size != 10 {
		t.Fatal("attr not cached under S")
	}
	// The revocation for seq 4 arrives before the grant with seq 3 is
	// re-delivered (duplicate) and before a grant with seq 4.
	if !c.Revoke(5, wire.LockNone, 4) {
		t.Fatal("revocation did not lower the lock")
	}
	if _, ok := c.Attr(5); ok {
		t.Fatal("attr served after revocation")
	}
	if c.HoldsLocks() {
		t.Fatal("HoldsLocks after the only lock was revoked")
	}
	if c.Granted(wire.Grant{Ino: 5, Mode: wire.LockShared, Seq: 3}) {
		t.Fatal("a grant overtaken by its revocation resurrected the lock")
	}
	if !c.Granted(wire.Grant{Ino: 5, Mode: wire.LockExclusive, Seq: 4}) {
		t.Fatal("new grant refused")
	}
	if m, _ := c.Mode(5); m != wire.LockExclusive {
		t.Fatalf("mode %v", m)
	}
	c.Revoke(5, wire.LockShared, 5)
	if m, _ := c.Mode(5); m != wire.LockShared {
		t.Fatalf("after downgrade: %v", m)
	}
}

func TestEntriesNeedParentLock(t *testing.T) {
	c := New(100)
	c.SetEntry(1, "a", 7)
	if _, ok := c.Entry(1, "a"); ok {
		t.Fatal("entry cached without a lock on the parent")
	}
	c.Granted(wire.Grant{Ino: 1, Mode: wire.LockShared, Seq: 1})
	c.SetEntry(1, "a", 7)
	c.SetEntry(1, "missing", 0)
	if ino, ok := c.Entry(1, "a"); !ok || ino != 7 {
		t.Fatal("entry not cached")
	}
	if ino, ok := c.Entry(1, "missing"); !ok || ino != 0 {
		t.Fatal("negative entry not cached")
	}
	c.Revoke(1, wire.LockNone, 2)
	if _, ok := c.Entry(1, "a"); ok {
		t.Fatal("entry survived revocation")
	}
}

func TestBoundedEvictsAndReportsLocks(t *testing.T) {
	c := New(10)
	for i := 1; i <= 25; i++ {
		c.Granted(wire.Grant{Ino: idpkg.Ino(i), Mode: wire.LockShared, Seq: 1})
	}
	if _, _, n := c.Stats(); n > 10 {
		t.Fatalf("%d inodes cached, bound 10", n)
	}
	if ev := c.TakeEvicted(); len(ev) != 15 {
		t.Fatalf("%d evicted locks reported, want 15", len(ev))
	}
	if got := len(c.DropAll()); got != 10 {
		t.Fatalf("DropAll returned %d", got)
	}
	if c.HoldsLocks() {
		t.Fatal("locks after DropAll")
	}
}

func TestCompleteDirectory(t *testing.T) {
	c := New(100)
	c.MarkComplete(2)
	if _, ok := c.Entry(2, "x"); ok {
		t.Fatal("complete without a lock")
	}
	c.Granted(wire.Grant{Ino: 2, Mode: wire.LockExclusive, Seq: 1})
	c.MarkComplete(2)
	if ino, ok := c.Entry(2, "x"); !ok || ino != 0 {
		t.Fatal("a name missing from a complete directory is not known absent")
	}
	c.SetEntry(2, "x", 9)
	if ino, ok := c.Entry(2, "x"); !ok || ino != 9 {
		t.Fatal("new entry not cached")
	}
	c.Revoke(2, wire.LockNone, 2)
	c.Granted(wire.Grant{Ino: 2, Mode: wire.LockShared, Seq: 3})
	if _, ok := c.Entry(2, "y"); ok {
		t.Fatal("directory still complete after its lock was revoked")
	}
}

// TestLocalOpens: a file is opened locally only under a lock with its
// attributes known and no removal in flight; a downgrade keeps the opens,
// losing the lock hands them over (TakeOpens), and eviction passes over a
// file with local opens.
func TestLocalOpens(t *testing.T) {
	c := New(2)
	if _, ok := c.OpenLocally(5); ok {
		t.Fatal("opened locally without a lock")
	}
	c.Granted(wire.Grant{Ino: 5, Mode: wire.LockExclusive, Seq: 1})
	if _, ok := c.OpenLocally(5); ok {
		t.Fatal("opened locally without attributes")
	}
	c.SetAttr(&wire.Attr{Ino: 5, Size: 3})
	for range 2 {
		if a, ok := c.OpenLocally(5); !ok || a.Size != 3 {
			t.Fatalf("local open under X: %v %v", a, ok)
		}
	}
	if !c.CloseLocally(5) {
		t.Fatal("local close refused")
	}
	c.Revoke(5, wire.LockShared, 2)
	if _, ok := c.OpenLocally(5); !ok {
		t.Fatal("no local open under S")
	}
	// two locks more than the cache holds: the open file keeps its lock
	c.Granted(wire.Grant{Ino: 6, Mode: wire.LockShared, Seq: 3})
	c.Granted(wire.Grant{Ino: 7, Mode: wire.LockShared, Seq: 4})
	if m, _ := c.Mode(5); m != wire.LockShared {
		t.Fatal("the lock of a file with local opens was evicted")
	}
	if n := c.BeginRemove(5); n != 2 {
		t.Fatalf("BeginRemove = %d, want 2", n)
	}
	if _, ok := c.OpenLocally(5); ok {
		t.Fatal("opened locally during a removal")
	}
	if c.CloseLocally(5) {
		t.Fatal("a close after BeginRemove stayed local")
	}
	c.EndRemove(5)
	if _, ok := c.OpenLocally(5); !ok {
		t.Fatal("no local open after the removal")
	}
	c.Revoke(5, wire.LockNone, 5)
	if _, ok := c.OpenLocally(5); ok {
		t.Fatal("opened locally after the lock was revoked")
	}
	if n := c.TakeOpens(5); n != 1 {
		t.Fatalf("TakeOpens after revocation = %d, want 1", n)
	}
}

// TestNameBudget: cached names are counted over all directories; at the
// bound the directory being added to starts over, and forgetting a
// directory's names gives their budget back.
func TestNameBudget(t *testing.T) {
	c := New(100)
	c.maxNames = 4
	for dir := idpkg.Ino(1); dir <= 2; dir++ {
		c.Granted(wire.Grant{Ino: dir, Mode: wire.LockShared, Seq: uint64(dir)})
	}
	c.SetEntry(1, "a", 10)
	c.SetEntry(1, "b", 11)
	c.SetEntry(1, "b", 12) // replaced, not added
	c.SetEntry(2, "c", 13)
	c.SetEntry(2, "d", 14)
	if c.names != 4 {
		t.Fatalf("%d names counted, want 4", c.names)
	}
	c.SetEntry(2, "e", 15) // over the bound: directory 2 starts over
	if _, ok := c.Entry(2, "c"); ok || c.names != 3 {
		t.Fatalf("after the bound: %d names, c cached %v", c.names, ok)
	}
	if child, ok := c.Entry(1, "b"); !ok || child != 12 {
		t.Fatalf("directory 1 lost its names: %v %v", child, ok)
	}
	c.InvalidateDir(1)
	c.Revoke(2, wire.LockNone, 9)
	if c.names != 0 {
		t.Fatalf("%d names counted after both directories were forgotten", c.names)
	}
}

// TestListing: a directory's listing comes from the cache only while it is
// complete under a lock and every entry's type is known; removed and absent
// names are not listed, and the order is by name.
func TestListing(t *testing.T) {
	c := New(100)
	c.Granted(wire.Grant{Ino: 2, Mode: wire.LockExclusive, Seq: 1})
	if _, ok := c.Listing(2); ok {
		t.Fatal("listed a directory not known complete")
	}
	c.MarkComplete(2)
	for ino, name := range map[idpkg.Ino]string{10: "b", 11: "a", 12: "c"} {
		c.Granted(wire.Grant{Ino: ino, Mode: wire.LockExclusive, Seq: 1})
		mode := uint32(syscall.S_IFREG | 0o644)
		if name == "c" {
			mode = syscall.S_IFDIR | 0o755
		}
		c.SetAttr(&wire.Attr{Ino: ino, Mode: mode})
		c.SetEntry(2, name, ino)
	}
	c.SetEntry(2, "gone", 0)
	got, ok := c.Listing(2)
	want := []wire.DirEntry{{Name: "a", Ino: 11, Mode: syscall.S_IFREG}, {Name: "b", Ino: 10, Mode: syscall.S_IFREG},
		{Name: "c", Ino: 12, Mode: syscall.S_IFDIR}}
	if !ok || !slices.Equal(got, want) {
		t.Fatalf("listing %v %v, want %v", got, ok, want)
	}
	c.SetEntry(2, "d", 13) // its type unknown
	if _, ok := c.Listing(2); ok {
		t.Fatal("listed an entry of unknown type")
	}
	c.Revoke(2, wire.LockNone, 2)
	if _, ok := c.Listing(2); ok {
		t.Fatal("listed a directory whose lock was revoked")
	}
}
