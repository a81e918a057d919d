package locks

import (
	"runtime"
	"testing"

	"github.com/leasefs/leasefs/internal/ids"
)

// BenchmarkDataPingPong moves an X lock back and forth between two clients:
// request (revoke), release (grant), as the server does per ping-pong.
func BenchmarkDataPingPong(b *testing.B) {
	tb := NewDataTable(DefaultDataConfig())
	tb.Request(1, i1, Exclusive)
	holder, seq := ids.ClientID(1), uint64(1)
	b.ReportAllocs()
	for b.Loop() {
		other := 3 - holder
		out, _ := tb.Request(other, i1, Exclusive)
		out, _ = tb.Release(holder, i1, None, out.Revokes[0].Seq)
		holder, seq = other, out.Grants[0].Seq
	}
	_ = seq
}

// BenchmarkDataManyInodes grants and releases S locks on 10,000 inodes.
func BenchmarkDataManyInodes(b *testing.B) {
	tb := NewDataTable(DefaultDataConfig())
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		ino := ids.Ino(i%10000 + 1)
		out, _ := tb.Request(1, ino, Shared)
		tb.Release(1, ino, None, out.Grants[0].Seq)
		i++
	}
}

// BenchmarkPosixLockUnlock sets and removes an fcntl range lock next to 100
// other owners' locks.
func BenchmarkPosixLockUnlock(b *testing.B) {
	tb := NewPosixTable(DefaultPosixConfig())
	for o := uint64(0); o < 100; o++ {
		tb.Set(i1, PosixLock{Owner: Owner{Client: 2, Owner: o}, Type: ReadLock, Start: o * 10, End: o*10 + 9})
	}
	me := Owner{Client: 1, Owner: 1}
	b.ReportAllocs()
	for b.Loop() {
		tb.Set(i1, PosixLock{Owner: me, Type: ReadLock, Start: 500, End: 599})
		tb.Set(i1, PosixLock{Owner: me, Type: Unlock, Start: 0, End: ToEOF})
	}
}

// BenchmarkDataHeld measures the lock table's memory per held lock: the
// live heap after granting S locks on 100,000 inodes, less before, per lock.
func BenchmarkDataHeld(b *testing.B) {
	const n = 100_000
	for range b.N {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		tb := NewDataTable(DefaultDataConfig())
		for i := range n {
			if out, _ := tb.Request(1, ids.Ino(i+1), Shared); len(out.Grants) != 1 {
				b.Fatalf("inode %d: %+v", i+1, out)
			}
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/n, "B/held-lock")
		runtime.KeepAlive(tb)
	}
}
