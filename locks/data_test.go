package locks

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/leasefs/leasefs/internal/clock"
	"github.com/leasefs/leasefs/internal/ids"
)

const (
	a  ids.ClientID = 1
	b  ids.ClientID = 2
	c3 ids.ClientID = 3
	i1 ids.Ino      = 10
	i2 ids.Ino      = 20
)

func newTable() *DataTable { return NewDataTable(DataConfig{MaxWaiters: 4}) }

func mustReq(t *testing.T, tb *DataTable, c ids.ClientID, ino ids.Ino, m Mode) Outcome {
	t.Helper()
	out, err := tb.Request(c, ino, m)
	if err != nil {
		t.Fatalf("request %v %v %v: %v", c, ino, m, err)
	}
	return out
}

func granted(out Outcome, c ids.ClientID, m Mode) bool {
	return slices.ContainsFunc(out.Grants, func(g Grant) bool { return g.Client == c && g.Mode == m })
}

func TestModeValuesMatchWire(t *testing.T) {
	// wire.LockMode uses the same numbering; shells cast between them.
	if None != 0 || Shared != 1 || Exclusive != 2 || Shared.String() != "S" || Exclusive.String() != "X" || None.String() != "none" {
		t.Fatal("mode numbering or names changed")
	}
}

func TestSharedCompatibleExclusiveRevokes(t *testing.T) {
	tb := newTable()
	if out := mustReq(t, tb, a, i1, Shared); !granted(out, a, Shared) || out.Queued {
		t.Fatalf("a S: %+v", out)
	}
	if out := mustReq(t, tb, b, i1, Shared); !granted(out, b, Shared) {
		t.Fatalf("b S: %+v", out)
	}
	out := mustReq(t, tb, c3, i1, Exclusive)
	if !out.Queued || len(out.Grants) != 0 || len(out.Revokes) != 2 {
		t.Fatalf("c X: %+v", out)
	}
	for _, r := range out.Revokes {
		if r.To != None || r.Ino != i1 {
			t.Fatalf("revoke %+v", r)
		}
	}
	// Asking again (a retransmission) sends no second revocation.
	if out2 := mustReq(t, tb, c3, i1, Exclusive); !out2.Queued || len(out2.Revokes) != 0 {
		t.Fatalf("retransmit: %+v", out2)
	}
	r := out.Revokes[0]
	o, err := tb.Release(r.Client, i1, None, r.Seq)
	if err != nil || len(o.Grants) != 0 {
		t.Fatalf("first release: %+v %v", o, err)
	}
	r = out.Revokes[1]
	o, err = tb.Release(r.Client, i1, None, r.Seq)
	if err != nil || !granted(o, c3, Exclusive) {
		t.Fatalf("second release: %+v %v", o, err)
	}
	if h := tb.Holders(i1); len(h) != 1 || h[0].Client != c3 || h[0].Mode != Exclusive {
		t.Fatalf("holders %+v", h)
	}
}

func TestDowngradeForSharedWaiter(t *testing.T) {
	tb := newTable()
	g := mustReq(t, tb, a, i1, Exclusive).Grants[0]
	out := mustReq(t, tb, b, i1, Shared)
	if len(out.Revokes) != 1 || out.Revokes[0].To != Shared || out.Revokes[0].Client != a || out.Revokes[0].Seq <= g.Seq {
		t.Fatalf("revokes %+v", out.Revokes)
	}
	o, err := tb.Release(a, i1, Shared, out.Revokes[0].Seq)
	if err != nil || !granted(o, b, Shared) {
		t.Fatalf("downgrade: %+v %v", o, err)
	}
	if got := tb.HeldBy(a); len(got) != 1 || got[0].Mode != Shared {
		t.Fatalf("a holds %+v", got)
	}
}

func TestReentrantAndUpgrade(t *testing.T) {
	tb := newTable()
	g := mustReq(t, tb, a, i1, Exclusive).Grants[0]
	out := mustReq(t, tb, a, i1, Shared)
	if len(out.Grants) != 1 || out.Grants[0] != g || out.Queued {
		t.Fatalf("re-entrant: %+v, want %+v", out, g)
	}
	tb2 := newTable()
	mustReq(t, tb2, a, i1, Shared)
	if out := mustReq(t, tb2, a, i1, Exclusive); !granted(out, a, Exclusive) {
		t.Fatalf("sole holder upgrade: %+v", out)
	}
	tb3 := newTable()
	mustReq(t, tb3, a, i1, Shared)
	mustReq(t, tb3, b, i1, Shared)
	out = mustReq(t, tb3, a, i1, Exclusive)
	if !out.Queued || len(out.Revokes) != 1 || out.Revokes[0].Client != b {
		t.Fatalf("upgrade with a co-holder: %+v", out)
	}
	o, _ := tb3.Release(b, i1, None, out.Revokes[0].Seq)
	if !granted(o, a, Exclusive) {
		t.Fatalf("upgrade not granted: %+v", o)
	}
}

func TestFIFONoStarvation(t *testing.T) {
	tb := NewDataTable(DataConfig{MaxWaiters: 100})
	mustReq(t, tb, a, i1, Shared)
	out := mustReq(t, tb, b, i1, Exclusive)
	if !out.Queued {
		t.Fatal("X not queued")
	}
	// A stream of S requests queues behind the X waiter instead of
	// joining the compatible holder.
	for c := ids.ClientID(10); c < 20; c++ {
		if out := mustReq(t, tb, c, i1, Shared); !out.Queued {
			t.Fatalf("S of %v jumped the X waiter", c)
		}
	}
	o, _ := tb.Release(a, i1, None, out.Revokes[0].Seq)
	if len(o.Grants) != 1 || o.Grants[0].Client != b {
		t.Fatalf("after release: %+v", o)
	}
	// The S waiters are now blocked by b's X: b is asked to downgrade.
	if len(o.Revokes) != 1 || o.Revokes[0].Client != b || o.Revokes[0].To != Shared {
		t.Fatalf("revokes %+v", o.Revokes)
	}
	o, _ = tb.Release(b, i1, Shared, o.Revokes[0].Seq)
	if len(o.Grants) != 10 {
		t.Fatalf("all S waiters should be granted together: %+v", o)
	}
}

func TestStaleRelease(t *testing.T) {
	tb := newTable()
	g1 := mustReq(t, tb, a, i1, Exclusive).Grants[0]
	if _, err := tb.Release(a, i1, None, g1.Seq); err != nil {
		t.Fatal(err)
	}
	g2 := mustReq(t, tb, a, i1, Exclusive).Grants[0]
	if g2.Seq <= g1.Seq {
		t.Fatalf("seq did not increase across an idle inode: %d then %d", g1.Seq, g2.Seq)
	}
	// The first release, duplicated by the network, arrives again.
	if _, err := tb.Release(a, i1, None, g1.Seq); !errors.Is(err, ErrStale) {
		t.Fatalf("stale release: %v", err)
	}
	if h := tb.Holders(i1); len(h) != 1 {
		t.Fatal("stale release dropped the lock")
	}
	if _, err := tb.Release(b, i1, None, 99); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("release by non-holder: %v", err)
	}
	if _, err := tb.Request(a, i1, None); !errors.Is(err, ErrBadMode) {
		t.Fatalf("bad mode: %v", err)
	}
}

func TestCancel(t *testing.T) {
	tb := newTable()
	mustReq(t, tb, a, i1, Exclusive)
	mustReq(t, tb, b, i1, Exclusive)
	out := mustReq(t, tb, c3, i1, Shared)
	if !out.Queued {
		t.Fatal("not queued")
	}
	o, err := tb.Cancel(b, i1)
	if err != nil {
		t.Fatal(err)
	}
	// c (S) is now head; a was already asked to release fully, so
	// nothing new is sent.
	if len(o.Grants)+len(o.Revokes) != 0 {
		t.Fatalf("after cancel: %+v", o)
	}
	if _, err := tb.Cancel(b, i1); !errors.Is(err, ErrNotWaiting) {
		t.Fatalf("double cancel: %v", err)
	}
	if w := tb.Waiters(i1); len(w) != 1 || w[0].Client != c3 {
		t.Fatalf("waiters %+v", w)
	}
	// Cancelling the head behind an X holder that was only asked to
	// downgrade brings a full release for the new X head.
	tb2 := newTable()
	mustReq(t, tb2, a, i1, Exclusive)
	mustReq(t, tb2, b, i1, Shared)
	mustReq(t, tb2, c3, i1, Exclusive)
	o, _ = tb2.Cancel(b, i1)
	if len(o.Revokes) != 1 || o.Revokes[0].Client != a || o.Revokes[0].To != None {
		t.Fatalf("cancel head: %+v", o)
	}
}

func TestStealGrantsWaiters(t *testing.T) {
	tb := newTable()
	mustReq(t, tb, a, i1, Exclusive)
	mustReq(t, tb, a, i2, Shared)
	mustReq(t, tb, b, i1, Shared)
	mustReq(t, tb, c3, i2, Exclusive)
	mustReq(t, tb, a, 30, Exclusive)
	out := tb.Steal(a)
	if !granted(out, b, Shared) || !granted(out, c3, Exclusive) || len(out.Grants) != 2 {
		t.Fatalf("steal: %+v", out)
	}
	if len(tb.HeldBy(a)) != 0 {
		t.Fatal("a still holds")
	}
	if all := tb.All(); len(all) != 2 {
		t.Fatalf("all %+v", all)
	}
	if out := tb.Steal(a); len(out.Grants)+len(out.Revokes) != 0 {
		t.Fatal("second steal did something")
	}
}

func TestBoundedWaiters(t *testing.T) {
	tb := newTable()
	mustReq(t, tb, 100, i1, Exclusive)
	for c := ids.ClientID(1); c <= 4; c++ {
		mustReq(t, tb, c, i1, Exclusive)
	}
	if _, err := tb.Request(5, i1, Exclusive); !errors.Is(err, ErrTooManyWaiters) {
		t.Fatalf("fifth waiter: %v", err)
	}
	if len(tb.HeldBy(5)) != 0 || len(tb.Waiters(i1)) != 4 {
		t.Fatal("refused waiter left a trace")
	}
}

func TestGrace(t *testing.T) {
	tb := newTable()
	tb.SetGrace(clock.Time(1000))
	if _, err := tb.Reclaim(a, i1, Exclusive); err != nil {
		t.Fatal(err)
	}
	if _, err := tb.Reclaim(b, i1, Shared); !errors.Is(err, ErrConflict) {
		t.Fatalf("conflicting reclaim: %v", err)
	}
	if _, err := tb.Reclaim(b, i2, Shared); err != nil {
		t.Fatal(err)
	}
	// An ordinary request waits, even a compatible one, and sends nothing.
	out := mustReq(t, tb, c3, i2, Shared)
	if !out.Queued || len(out.Grants)+len(out.Revokes) != 0 {
		t.Fatalf("request in grace: %+v", out)
	}
	if o := tb.Tick(999); len(o.Grants) != 0 {
		t.Fatal("grace ended early")
	}
	out = tb.Tick(1000)
	if !granted(out, c3, Shared) {
		t.Fatalf("tick: %+v", out)
	}
	if _, err := tb.Reclaim(b, 30, Shared); !errors.Is(err, ErrNoGrace) {
		t.Fatalf("reclaim after grace: %v", err)
	}
}

// TestRandomOps drives the table with random operations and checks, after
// each, that holders are compatible, that every waiter is blocked (nothing is
// left ungranted that could be), that sequence numbers only grow and that
// every waiter is eventually granted once all others release.
func TestRandomOps(t *testing.T) {
	for seed := uint64(0); seed < 200; seed++ {
		r := rand.New(rand.NewPCG(seed, 1))
		tb := NewDataTable(DataConfig{MaxWaiters: 8})
		var lastSeq uint64
		// seen[c][ino] is the highest seq client c received.
		seen := map[ids.ClientID]map[ids.Ino]uint64{}
		note := func(c ids.ClientID, ino ids.Ino, s uint64) {
			if seen[c] == nil {
				seen[c] = map[ids.Ino]uint64{}
			}
			seen[c][ino] = max(seen[c][ino], s)
		}
		lastGrant := map[[2]uint64]uint64{}
		check := func(op string, out Outcome) {
			prev := lastSeq
			for _, g := range out.Grants {
				// A re-entrant grant repeats its old number; a new
				// one must be above every number sent before.
				if g.Seq <= prev && g.Seq != lastGrant[[2]uint64{uint64(g.Client), uint64(g.Ino)}] {
					t.Fatalf("seed %d %s: grant seq %d not above %d", seed, op, g.Seq, prev)
				}
				lastSeq = max(lastSeq, g.Seq)
				lastGrant[[2]uint64{uint64(g.Client), uint64(g.Ino)}] = g.Seq
				note(g.Client, g.Ino, g.Seq)
			}
			for _, rv := range out.Revokes {
				if rv.Seq <= prev {
					t.Fatalf("seed %d %s: revoke seq %d not above %d", seed, op, rv.Seq, prev)
				}
				lastSeq = max(lastSeq, rv.Seq)
				note(rv.Client, rv.Ino, rv.Seq)
			}
			all := tb.All()
			if n := tb.Inodes(); n != len(all) {
				t.Fatalf("seed %d %s: Inodes() %d, All() has %d", seed, op, n, len(all))
			}
			for _, il := range all {
				for i, x := range il.Holders {
					for _, y := range il.Holders[i+1:] {
						if !compatible(x.Mode, y.Mode) {
							t.Fatalf("seed %d %s: %v holds %v and %v holds %v on %v", seed, op, x.Client, x.Mode, y.Client, y.Mode, il.Ino)
						}
					}
				}
				if len(il.Waiters) > 0 {
					if tb.fits(tb.inodes[il.Ino], il.Waiters[0]) {
						t.Fatalf("seed %d %s: head waiter %+v on %v could be granted", seed, op, il.Waiters[0], il.Ino)
					}
				}
			}
		}
		for step := 0; step < 300; step++ {
			c := ids.ClientID(r.IntN(4) + 1)
			ino := ids.Ino(r.IntN(3) + 1)
			var out Outcome
			op := ""
			switch k := r.IntN(10); {
			case k < 4:
				op = "request"
				out, _ = tb.Request(c, ino, Mode(r.IntN(2)+1))
			case k < 7:
				op = "release"
				out, _ = tb.Release(c, ino, Mode(r.IntN(2)), seen[c][ino])
			case k < 8:
				op = "cancel"
				out, _ = tb.Cancel(c, ino)
			default:
				if r.IntN(5) == 0 {
					op = "steal"
					out = tb.Steal(c)
				}
			}
			check(fmt.Sprintf("step %d %s %v %v", step, op, c, ino), out)
		}
		// Liveness: everyone releases, every waiter is granted in turn.
		for round := 0; round < 100 && len(tb.All()) > 0; round++ {
			for _, il := range tb.All() {
				for _, h := range il.Holders {
					out, err := tb.Release(h.Client, il.Ino, None, seen[h.Client][il.Ino])
					if err != nil {
						t.Fatalf("seed %d: drain release: %v", seed, err)
					}
					check("drain", out)
				}
			}
		}
		if all := tb.All(); len(all) > 0 || len(tb.byClient) > 0 {
			t.Fatalf("seed %d: not drained: %+v %v", seed, all, tb.byClient)
		}
	}
}

// TestInodeGrace: during an inode's grace no client is granted a lock on
// it, nobody is asked to give one up, other inodes and exempt clients go
// on, and the queued requests are served when it ends.
func TestInodeGrace(t *testing.T) {
	const pseudo = ids.ClientID(99)
	tb := NewDataTable(DataConfig{MaxWaiters: 8, GraceExempt: func(c ids.ClientID) bool { return c == pseudo }})
	if _, err := tb.Request(1, 5, Shared); err != nil {
		t.Fatal(err)
	}
	tb.SetInodeGrace(5, 100)
	tb.SetInodeGrace(7, 50)
	if d, ok := tb.NextDeadline(); !ok || d != 50 {
		t.Fatalf("next deadline %v %v", d, ok)
	}
	out, _ := tb.Request(2, 7, Exclusive)
	if !out.Queued || len(out.Grants) != 0 {
		t.Fatalf("granted in grace: %+v", out)
	}
	if out, _ := tb.Request(2, 8, Exclusive); out.Queued {
		t.Fatal("an inode without grace held back")
	}
	// the exempt pseudo client gets X on 5 and revokes the S holder
	out, _ = tb.Request(pseudo, 5, Exclusive)
	if len(out.Revokes) != 1 || out.Revokes[0].Client != 1 {
		t.Fatalf("exempt client held back: %+v", out)
	}
	if out := tb.Tick(49); len(out.Grants) != 0 {
		t.Fatalf("grace ended early: %+v", out)
	}
	if out := tb.Tick(50); len(out.Grants) != 1 || out.Grants[0].Client != 2 {
		t.Fatalf("queued request not served at the grace's end: %+v", out)
	}
	if _, ok := tb.InodeGrace(7); ok {
		t.Fatal("grace of 7 still runs")
	}
	if out := tb.EndInodeGrace(5); len(out.Grants) != 0 {
		t.Fatalf("%+v", out)
	}
	if _, ok := tb.NextDeadline(); ok {
		t.Fatal("a deadline with no grace")
	}
}
