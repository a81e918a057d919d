package locks

import (
	"errors"
	"math/rand/v2"
	"syscall"
	"testing"

	"github.com/leasefs/leasefs/internal/ids"
)

func TestLockTypeValuesMatchLinux(t *testing.T) {
	if ReadLock != syscall.F_RDLCK || WriteLock != syscall.F_WRLCK || Unlock != syscall.F_UNLCK {
		t.Fatal("lock type values differ from Linux F_RDLCK/F_WRLCK/F_UNLCK")
	}
}

func own(c ids.ClientID, o uint64) Owner { return Owner{Client: c, Owner: o} }

func rng(o Owner, typ LockType, s, e uint64) PosixLock {
	return PosixLock{Owner: o, Type: typ, Start: s, End: e, Pid: uint32(o.Owner)}
}

func TestPosixSplitMerge(t *testing.T) {
	tb := NewPosixTable(DefaultPosixConfig())
	o := own(1, 7)
	must := func(lk PosixLock) {
		t.Helper()
		if _, err := tb.Set(i1, lk); err != nil {
			t.Fatal(err)
		}
	}
	must(rng(o, WriteLock, 0, 99))
	must(rng(o, ReadLock, 40, 59)) // split into W 0-39, R 40-59, W 60-99
	got := tb.Locks(i1)
	if len(got) != 3 || got[0].End != 39 || got[1].Type != ReadLock || got[2].Start != 60 {
		t.Fatalf("split: %+v", got)
	}
	must(rng(o, WriteLock, 40, 59)) // merges back into one W 0-99
	if got := tb.Locks(i1); len(got) != 1 || got[0].Start != 0 || got[0].End != 99 {
		t.Fatalf("merge: %+v", got)
	}
	must(rng(o, WriteLock, 100, ToEOF)) // adjacent: merges
	if got := tb.Locks(i1); len(got) != 1 || got[0].End != ToEOF {
		t.Fatalf("adjacent merge: %+v", got)
	}
	must(rng(o, Unlock, 10, 19))
	if got := tb.Locks(i1); len(got) != 2 || got[0].End != 9 || got[1].Start != 20 {
		t.Fatalf("unlock hole: %+v", got)
	}
	must(rng(o, Unlock, 0, ToEOF))
	if tb.Len() != 0 {
		t.Fatal("unlock all left a record")
	}
}

func TestPosixConflicts(t *testing.T) {
	tb := NewPosixTable(DefaultPosixConfig())
	a1, b1 := own(1, 1), own(2, 1)
	if _, err := tb.Set(i1, rng(a1, ReadLock, 0, 9)); err != nil {
		t.Fatal(err)
	}
	if _, err := tb.Set(i1, rng(b1, ReadLock, 5, 14)); err != nil {
		t.Fatalf("read/read: %v", err)
	}
	if _, err := tb.Set(i1, rng(b1, WriteLock, 5, 14)); !errors.Is(err, ErrConflict) {
		t.Fatalf("write over read: %v", err)
	}
	// The failed upgrade left b's read lock alone.
	if got := tb.Locks(i1); len(got) != 2 || got[1].Type != ReadLock {
		t.Fatalf("after failed set: %+v", got)
	}
	c, ok, err := tb.Get(i1, rng(own(3, 1), WriteLock, 12, 12))
	if err != nil || !ok || c.Owner != b1 || c.Pid != 1 {
		t.Fatalf("getlk: %+v %v %v", c, ok, err)
	}
	if _, ok, _ := tb.Get(i1, rng(own(3, 1), WriteLock, 15, 20)); ok {
		t.Fatal("getlk found a conflict past the locks")
	}
	// Same client, other owner (another process): conflicts too.
	if _, err := tb.Set(i1, rng(own(1, 2), WriteLock, 0, 0)); !errors.Is(err, ErrConflict) {
		t.Fatalf("other owner same client: %v", err)
	}
	if _, err := tb.Set(i1, rng(a1, WriteLock, 9, 3)); !errors.Is(err, ErrBadRange) {
		t.Fatalf("bad range: %v", err)
	}
}

func TestFlockSeparateNamespace(t *testing.T) {
	tb := NewPosixTable(DefaultPosixConfig())
	a1, b1 := own(1, 1), own(2, 1)
	if _, err := tb.Set(i1, rng(a1, WriteLock, 0, ToEOF)); err != nil {
		t.Fatal(err)
	}
	fl := PosixLock{Owner: b1, Flock: true, Type: WriteLock}
	if _, err := tb.Set(i1, fl); err != nil {
		t.Fatalf("flock blocked by fcntl: %v", err)
	}
	if _, err := tb.Set(i1, PosixLock{Owner: a1, Flock: true, Type: ReadLock}); !errors.Is(err, ErrConflict) {
		t.Fatalf("flock sh over ex: %v", err)
	}
	// Converting a flock lock replaces it.
	if _, err := tb.Set(i1, PosixLock{Owner: b1, Flock: true, Type: ReadLock}); err != nil {
		t.Fatal(err)
	}
	if _, err := tb.Set(i1, PosixLock{Owner: a1, Flock: true, Type: ReadLock}); err != nil {
		t.Fatalf("flock sh/sh: %v", err)
	}
	if got := tb.Locks(i1); len(got) != 3 {
		t.Fatalf("locks %+v", got)
	}
}

func TestPosixWaitGrantCancelRelease(t *testing.T) {
	tb := NewPosixTable(DefaultPosixConfig())
	a1, b1, c1 := own(1, 1), own(2, 1), own(3, 1)
	id, g, err := tb.SetWait(i1, rng(a1, WriteLock, 0, 9))
	if err != nil || len(g) != 1 || g[0].Waiter != id {
		t.Fatalf("immediate: %v %+v %v", id, g, err)
	}
	wb, g, err := tb.SetWait(i1, rng(b1, WriteLock, 5, 5))
	if err != nil || len(g) != 0 {
		t.Fatalf("b should wait: %+v %v", g, err)
	}
	wc, _, _ := tb.SetWait(i1, rng(c1, ReadLock, 8, 20))
	if w := tb.Waiting(i1); len(w) != 2 {
		t.Fatalf("waiting %+v", w)
	}
	if err := tb.Cancel(wc); err != nil {
		t.Fatal(err)
	}
	if err := tb.Cancel(wc); !errors.Is(err, ErrNotWaiting) {
		t.Fatalf("double cancel: %v", err)
	}
	// Unlocking part of a's range that does not cover byte 5 grants nothing.
	g, _ = tb.Set(i1, rng(a1, Unlock, 6, 9))
	if len(g) != 0 {
		t.Fatalf("premature grant %+v", g)
	}
	g = tb.ReleaseOwner(1, 1, i1) // a closes the file
	if len(g) != 1 || g[0].Waiter != wb || g[0].Lock.Owner != b1 {
		t.Fatalf("grant on close: %+v", g)
	}
	if got := tb.Locks(i1); len(got) != 1 || got[0].Owner != b1 {
		t.Fatalf("locks %+v", got)
	}
}

func TestPosixSteal(t *testing.T) {
	tb := NewPosixTable(DefaultPosixConfig())
	a1, a2, b1 := own(1, 1), own(1, 2), own(2, 1)
	tb.Set(i1, rng(a1, WriteLock, 0, ToEOF))
	tb.Set(i2, PosixLock{Owner: a2, Flock: true, Type: WriteLock})
	w1, _, _ := tb.SetWait(i1, rng(b1, ReadLock, 0, 0))
	w2, _, _ := tb.SetWait(i2, PosixLock{Owner: b1, Flock: true, Type: WriteLock})
	g := tb.Steal(1)
	if len(g) != 2 || g[0].Waiter != w1 || g[1].Waiter != w2 {
		t.Fatalf("steal: %+v", g)
	}
	if len(tb.Locks(i1)) != 1 || len(tb.Locks(i2)) != 1 {
		t.Fatal("locks after steal")
	}
}

func TestPosixDeadlock(t *testing.T) {
	tb := NewPosixTable(DefaultPosixConfig())
	a1, b1 := own(1, 1), own(2, 1)
	tb.Set(i1, rng(a1, WriteLock, 0, 0))
	tb.Set(i2, rng(b1, WriteLock, 0, 0))
	if _, _, err := tb.SetWait(i2, rng(a1, WriteLock, 0, 0)); err != nil {
		t.Fatal(err)
	}
	if _, _, err := tb.SetWait(i1, rng(b1, WriteLock, 0, 0)); !errors.Is(err, ErrDeadlock) {
		t.Fatalf("cycle not detected: %v", err)
	}
	// A third owner waiting on a is no cycle.
	if _, _, err := tb.SetWait(i1, rng(own(3, 1), WriteLock, 0, 0)); err != nil {
		t.Fatalf("false deadlock: %v", err)
	}
}

func TestPosixLimits(t *testing.T) {
	tb := NewPosixTable(PosixConfig{MaxLocks: 3, MaxWaiters: 1})
	o := own(1, 1)
	tb.Set(i1, rng(o, WriteLock, 0, 99))
	tb.Set(i1, rng(o, ReadLock, 10, 10))
	if _, err := tb.Set(i1, rng(o, ReadLock, 20, 20)); !errors.Is(err, ErrTooManyLocks) {
		t.Fatalf("lock limit: %v", err)
	}
	if got := tb.Locks(i1); len(got) != 3 {
		t.Fatalf("failed set changed locks: %+v", got)
	}
	tb.SetWait(i1, rng(own(2, 1), ReadLock, 0, 0))
	if _, _, err := tb.SetWait(i1, rng(own(3, 1), ReadLock, 0, 0)); !errors.Is(err, ErrTooManyWaiters) {
		t.Fatalf("waiter limit: %v", err)
	}
}

// TestPosixModel compares the table with a per-byte model over random fcntl
// operations of three owners on a 32-byte file.
func TestPosixModel(t *testing.T) {
	const n = 32
	owners := []Owner{own(1, 1), own(1, 2), own(2, 1)}
	for seed := uint64(0); seed < 300; seed++ {
		r := rand.New(rand.NewPCG(seed, 2))
		tb := NewPosixTable(DefaultPosixConfig())
		// model[o][i]: 0 none, 1 read, 2 write.
		model := make([][n]int, len(owners))
		for step := 0; step < 60; step++ {
			oi := r.IntN(len(owners))
			s := uint64(r.IntN(n))
			e := s + uint64(r.IntN(n-int(s)))
			typ := LockType(r.IntN(3))
			want := 0
			switch typ {
			case ReadLock:
				want = 1
			case WriteLock:
				want = 2
			}
			conflict := false
			for j := range owners {
				if j == oi {
					continue
				}
				for i := s; i <= e; i++ {
					if want != 0 && model[j][i] != 0 && (want == 2 || model[j][i] == 2) {
						conflict = true
					}
				}
			}
			_, err := tb.Set(i1, rng(owners[oi], typ, s, e))
			if conflict != errors.Is(err, ErrConflict) {
				t.Fatalf("seed %d step %d: model conflict %v, table %v", seed, step, conflict, err)
			}
			if err == nil {
				for i := s; i <= e; i++ {
					model[oi][i] = want
				}
			}
			var got [3][n]int
			locks := tb.Locks(i1)
			for k, l := range locks {
				j := 0
				for owners[j] != l.Owner {
					j++
				}
				for i := l.Start; i <= l.End && i < n; i++ {
					if got[j][i] != 0 {
						t.Fatalf("seed %d: owner's locks overlap: %+v", seed, locks)
					}
					got[j][i] = int(l.Type) + 1
				}
				if k > 0 && locks[k-1].Owner == l.Owner && locks[k-1].Type == l.Type && locks[k-1].End+1 == l.Start {
					t.Fatalf("seed %d: unmerged neighbours %+v", seed, locks)
				}
			}
			for j := range owners {
				if got[j] != model[j] {
					t.Fatalf("seed %d step %d owner %d:\n got  %v\n want %v\n locks %+v", seed, step, j, got[j], model[j], locks)
				}
			}
		}
	}
}
