package cache

import (
	"bytes"
	"testing"

	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/internal/pagemem"
	"github.com/leasefs/leasefs/wire"
)

func shared(ino ids.Ino, seq uint64) []wire.Grant {
	return []wire.Grant{{Ino: ino, Mode: wire.LockShared, Seq: seq}}
}

// reply applies one read reply the way the client does.
func (c *Cache) reply(grants []wire.Grant, ino ids.Ino, off uint64, data []byte, eof bool, version, gen uint64) {
	c.ApplyReply(grants, c.Gen(), func() { c.PutData(ino, off, data, eof, version, gen) })
}

func filled(b byte) []byte { return bytes.Repeat([]byte{b}, PageSize) }

// readData is ReadData into a fresh buffer of size bytes.
func readData(c *Cache, ino ids.Ino, off uint64, size int) ([]byte, bool) {
	buf := make([]byte, size)
	n, ok := c.ReadData(ino, off, buf)
	return buf[:n], ok
}

func TestDataServedOnlyUnderLock(t *testing.T) {
	c := New(100)
	c.SetDataBudget(1 << 20)
	gen := c.DataGen()
	c.PutData(5, 0, filled('a'), false, 1, gen) // no lock: ignored
	if _, ok := readData(c, 5, 0, 10); ok {
		t.Fatal("data cached without a lock")
	}
	c.reply(shared(5, 1), 5, 0, append(filled('a'), 'b', 'c'), true, 1, gen)
	got, ok := readData(c, 5, PageSize-1, 100)
	if !ok || string(got) != "abc" {
		t.Fatalf("read across pages to EOF = %q, %v", got, ok)
	}
	if got, ok := readData(c, 5, PageSize+2, 10); !ok || len(got) != 0 {
		t.Fatalf("read at EOF = %q, %v; want empty, true", got, ok)
	}
	if _, ok := readData(c, 5, 0, 3*PageSize); !ok {
		t.Fatal("read past EOF from cache should be short, not a miss")
	}
	if !c.HasData(5, 0, 3*PageSize) || !c.HasData(5, PageSize, 1) || c.HasData(6, 0, 1) {
		t.Fatal("HasData: the file's pages to its end are cached, another file's not")
	}
	c.Revoke(5, wire.LockShared, 2) // X→S keeps data... S→S is a no-op
	if _, ok := readData(c, 5, 0, 1); !ok {
		t.Fatal("data dropped by a revocation that left the lock")
	}
	c.Revoke(5, wire.LockNone, 3)
	if _, ok := readData(c, 5, 0, 1); ok || c.DataBytes() != 0 {
		t.Fatal("data kept after its lock was revoked")
	}
}

// TestReplyUnderVoidedGrant: a read executed under a grant that a
// revocation overtook is not cached, even though a newer grant covers the
// inode by the time it arrives.
func TestReplyUnderVoidedGrant(t *testing.T) {
	c := New(100)
	c.SetDataBudget(1 << 20)
	gen := c.DataGen()
	c.Granted(wire.Grant{Ino: 5, Mode: wire.LockShared, Seq: 1})
	c.Revoke(5, wire.LockNone, 2)
	c.Granted(wire.Grant{Ino: 5, Mode: wire.LockShared, Seq: 9})
	c.reply(shared(5, 1), 5, 0, filled('o'), false, 1, gen)
	if _, ok := readData(c, 5, 0, 1); ok {
		t.Fatal("data read under a revoked grant was cached")
	}
	c.ApplyReply(shared(5, 1), c.Gen(), func() { c.SetAttr(&wire.Attr{Ino: 5, Size: 1}) })
	if _, ok := c.Attr(5); ok {
		t.Fatal("attributes read under a revoked grant were cached")
	}
}

func TestDataGenerationsAndVersions(t *testing.T) {
	c := New(100)
	c.SetDataBudget(1 << 20)
	c.Granted(wire.Grant{Ino: 5, Mode: wire.LockExclusive, Seq: 1})
	before := c.DataGen()
	c.DropData(5) // a write this client made after the read was sent
	c.reply(shared(5, 1), 5, 0, filled('o'), false, 1, before)
	if _, ok := readData(c, 5, 0, 1); ok {
		t.Fatal("data fetched before a local write was cached")
	}

	x1 := []wire.Grant{{Ino: 5, Mode: wire.LockExclusive, Seq: 1}}
	// Replies out of order: version 3 arrives, then version 2.
	gen := c.DataGen()
	c.reply(x1, 5, 0, filled('3'), false, 3, gen)
	c.reply(x1, 5, 0, filled('2'), false, 2, gen)
	if got, _ := readData(c, 5, 0, 1); string(got) != "3" {
		t.Fatalf("older reply overwrote a newer one: %q", got)
	}
	// A newer version that may not be cached still voids older pages.
	c.BeginChange(5)
	c.reply(x1, 5, 0, filled('4'), false, 4, c.DataGen())
	if _, ok := readData(c, 5, 0, 1); ok {
		t.Fatal("pages served or cached while a change is in flight")
	}
	c.EndChange(5)
	c.reply(x1, 5, 0, filled('3'), false, 3, c.DataGen())
	if _, ok := readData(c, 5, 0, 1); ok {
		t.Fatal("version 3 cached after a read returned version 4")
	}
}

func TestDataBudget(t *testing.T) {
	c := New(100)
	c.SetDataBudget(4 * PageSize)
	c.Granted(wire.Grant{Ino: 5, Mode: wire.LockShared, Seq: 1})
	c.Granted(wire.Grant{Ino: 6, Mode: wire.LockShared, Seq: 2})
	gen := c.DataGen()
	c.PutData(5, 0, bytes.Repeat([]byte{'x'}, 3*PageSize), false, 1, gen)
	readData(c, 5, 0, 1) // page 0 recently used
	c.PutData(6, 0, bytes.Repeat([]byte{'y'}, 2*PageSize), false, 1, gen)
	if c.DataBytes() > 4*PageSize {
		t.Fatalf("cache holds %d bytes over a budget of %d", c.DataBytes(), 4*PageSize)
	}
	if _, ok := readData(c, 5, 0, 1); !ok {
		t.Fatal("most recently used page evicted")
	}
	if _, ok := readData(c, 5, PageSize, 1); ok {
		t.Fatal("least recently used page kept over budget")
	}
	c.DropAll()
	if c.DataBytes() != 0 || c.lru.Len() != 0 {
		t.Fatal("DropAll left data behind")
	}
}

// TestWriteData: writes buffered under X go into the pages, so that the
// file reads back as written without a server: whole pages are cached,
// cached pages patched, a hole past the old end reads as zeros; a read
// fetched before the write caches nothing, and the version the flush
// gets keeps the pages when a later read returns it.
func TestWriteData(t *testing.T) {
	c := New(100)
	c.SetDataBudget(1 << 20)
	gen := c.DataGen()
	c.reply([]wire.Grant{{Ino: 5, Mode: wire.LockExclusive, Seq: 1}}, 5, 0, []byte("abc"), true, 1, gen)
	want := []byte("abc")
	write := func(off int, data []byte) {
		t.Helper()
		c.WriteData(5, uint64(off), data, uint64(len(want)))
		if end := off + len(data); end > len(want) {
			want = append(want, make([]byte, end-len(want))...)
		}
		copy(want[off:], data)
	}
	write(1, []byte("XY"))                         // patches the cached page
	write(2*PageSize, filled('w'))                 // a whole page past a hole
	write(3*PageSize, []byte("tail"))              // the file's new last page, whole to its end
	if _, ok := readData(c, 5, PageSize, 10); ok { // the hole's page was never cached
		t.Fatal("a page nobody wrote or read is cached")
	}
	for _, r := range []struct{ off, size int }{{0, PageSize}, {2 * PageSize, 2*PageSize + 100}} {
		got, ok := readData(c, 5, uint64(r.off), r.size)
		if !ok || !bytes.Equal(got, want[r.off:min(r.off+r.size, len(want))]) {
			t.Fatalf("read %d+%d after writes: %q, %v", r.off, r.size, got, ok)
		}
	}
	stale := c.DataGen()
	write(0, filled('n'))
	c.reply([]wire.Grant{{Ino: 5, Mode: wire.LockExclusive, Seq: 1}}, 5, 0, filled('o'), false, 1, stale) // fetched before the write
	if got, _ := readData(c, 5, 0, 1); string(got) != "n" {
		t.Fatalf("a read fetched before the write overwrote it: %q", got)
	}
	c.OwnVersion(5, 7) // the flush's version
	c.reply(nil, 5, 3*PageSize, []byte("tail"), true, 7, c.DataGen())
	if got, ok := readData(c, 5, 2*PageSize, 1); !ok || string(got) != "w" {
		t.Fatalf("pages dropped by a read returning the client's own version: %q, %v", got, ok)
	}
	c.Revoke(5, wire.LockShared, 2) // S keeps them
	c.WriteData(5, 0, []byte("z"), uint64(len(want)))
	if _, ok := readData(c, 5, 0, 1); ok {
		t.Fatal("a write without an X lock left pages cached")
	}
}

// TestWriteDataSpan: pages a write would newly cache past half the data
// budget are left out (a large file written through), while cached pages
// there are still patched, so that what is cached is never stale.
func TestWriteDataSpan(t *testing.T) {
	c := New(100)
	const budget = 64 << 20
	c.SetDataBudget(budget)
	const span = budget / 2
	const far = span + 10*PageSize
	c.reply([]wire.Grant{{Ino: 5, Mode: wire.LockExclusive, Seq: 1}}, 5, far, filled('o'), false, 1, c.DataGen())
	size := uint64(far + PageSize)
	c.WriteData(5, span-PageSize, filled('a'), size) // the span's last page
	c.WriteData(5, span, filled('b'), size)          // the first page past it
	c.WriteData(5, far, []byte("pp"), size)          // patches a cached page
	if got, ok := readData(c, 5, span-PageSize, 1); !ok || string(got) != "a" {
		t.Errorf("a page written within the span: %q, %v", got, ok)
	}
	if _, ok := readData(c, 5, span, 1); ok {
		t.Error("a page written past the span was cached")
	}
	if got, ok := readData(c, 5, far, 3); !ok || string(got) != "ppo" {
		t.Errorf("a cached page past the span, written: %q, %v", got, ok)
	}
}

// TestPagesReused: whole pages come from the page pool and go back to it
// when evicted, revoked or replaced, so the pool holds no more than the
// budget (in whole slabs), however much data passes through; what a read
// returns is what was put, never a reused page's old contents.
func TestPagesReused(t *testing.T) {
	c := New(1000)
	c.SetDataBudget(1 << 20)
	for f := range 64 {
		ino := ids.Ino(10 + f)
		chunk := bytes.Repeat([]byte{byte(f)}, 1<<20) // 256 pages
		c.reply(shared(ino, 1), ino, 0, chunk, true, 1, c.DataGen())
		if got, ok := readData(c, ino, 5*PageSize, 3); !ok || !bytes.Equal(got, []byte{byte(f), byte(f), byte(f)}) {
			t.Fatalf("file %d: read %v, %v", f, got, ok)
		}
		if f%2 == 1 {
			c.Revoke(ino, wire.LockNone, 2) // its pages go back at once
		}
		c.reply(nil, ino, 0, filled('z'), false, 1, c.DataGen()) // replaces page 0 where cached
	}
	if c.DataBytes() > 1<<20 {
		t.Fatalf("%d bytes cached over a budget of 1 MiB", c.DataBytes())
	}
	// a page given back and handed out again shows only its new contents
	last := ids.Ino(10 + 62)
	if got, ok := readData(c, last, 0, 2); ok && string(got) != "zz" {
		t.Fatalf("page 0 of the last file reads %q", got)
	}
	if n := c.pool.Slabs(); n > 2 {
		t.Fatalf("%d slabs of 2 MiB for a 1 MiB budget: pages were not reused", n)
	}
	c.DropAll()
	if free := c.pool.Free(); free != c.pool.Slabs()*pagemem.SlabSize/PageSize {
		t.Fatalf("%d pages free after DropAll, of %d", free, c.pool.Slabs()*pagemem.SlabSize/PageSize)
	}
}

// TestPatchData: a patch changes the pages cached and caches no other.
func TestPatchData(t *testing.T) {
	c := New(100)
	c.SetDataBudget(1 << 20)
	c.Granted(wire.Grant{Ino: 5, Mode: wire.LockExclusive, Seq: 1})
	c.PutData(5, 0, filled('a'), false, 1, c.DataGen())
	c.PatchData(5, 10, []byte("xy"), PageSize)
	c.PatchData(5, PageSize, filled('b'), PageSize)
	buf := make([]byte, 2)
	if n, ok := c.ReadData(5, 10, buf); !ok || n != 2 || string(buf) != "xy" {
		t.Fatalf("patched page reads %q (%v)", buf[:n], ok)
	}
	if _, ok := c.ReadData(5, PageSize, buf); ok {
		t.Fatal("a page only written, never cached, reads from the cache")
	}
}
