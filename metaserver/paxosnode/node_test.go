package paxosnode

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/leasefs/leasefs/internal/clock"
	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/transport"
)

func inoRange(from, n int) []ids.Ino {
	out := make([]ids.Ino, n)
	for i := range out {
		out[i] = ids.Ino(from + i)
	}
	return out
}

func TestAcquireAndLearn(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newSimCluster(t, 3, nil)
		c.waitReady()
		const ino = ids.Ino(100)
		sm := c.sample([]ids.Ino{ino})
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		start := time.Now()
		ep, err := c.node(1).Acquire(ctx, ino)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("uncontended acquire: %v, epoch %v", time.Since(start), ep)
		if got, ok := c.node(1).Owns(ino); !ok || got != ep {
			t.Fatalf("Owns = %v, %v; want %v, true", got, ok, ep)
		}
		if ep2, err := c.node(1).Acquire(ctx, ino); err != nil || ep2 != ep {
			t.Fatalf("second Acquire = %v, %v; want %v", ep2, err, ep)
		}
		for _, id := range []ids.ServerID{2, 3} {
			n := c.node(id)
			eventually(t, 5*time.Second, "learn the owner", func() bool {
				o, ok := n.Owner(ino)
				return ok && o == 1
			})
			_, err := n.Acquire(ctx, ino)
			var no *NotOwnerError
			if !errors.As(err, &no) || no.Owner != 1 || no.Ino != ino {
				t.Fatalf("%v: Acquire = %v, want NotOwnerError naming server:1", id, err)
			}
			if _, ok := n.Owns(ino); ok {
				t.Fatalf("%v owns %v too", id, ino)
			}
		}
		owned := c.node(1).Owned()
		if len(owned) != 1 || owned[0].Ino != ino || owned[0].Epoch != ep || owned[0].Left <= 0 {
			t.Fatalf("Owned = %+v", owned)
		}
		// held while unused for less than IdleRelease: renewals keep it
		time.Sleep(3 * testLease)
		if got, ok := c.node(1).Owns(ino); !ok || got != ep {
			t.Fatalf("after 3T: Owns = %v, %v; want %v (renewed)", got, ok, ep)
		}
		sm.finish()
		st := c.node(1).Stats()
		t.Logf("server:1 stats %+v; sampler %d samples, %d owned", st, sm.samples.Load(), sm.owned.Load())
		if st.Acquires != 1 || st.Held != 1 || st.Losses != 0 {
			t.Fatalf("stats %+v", st)
		}
	})
}

func TestConcurrentAcquire(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newSimCluster(t, 3, nil)
		c.waitReady()
		inos := inoRange(200, 5)
		c.sample(inos)
		for _, ino := range inos {
			type res struct {
				id  ids.ServerID
				ep  ids.Epoch
				err error
			}
			results := make(chan res, 3)
			var wg sync.WaitGroup
			for id := ids.ServerID(1); id <= 3; id++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
					defer cancel()
					ep, err := c.node(id).Acquire(ctx, ino)
					results <- res{id, ep, err}
				}()
			}
			wg.Wait()
			close(results)
			var winner ids.ServerID
			var losers []res
			for r := range results {
				if r.err == nil {
					if winner != 0 {
						t.Fatalf("%v: both %v and %v acquired", ino, winner, r.id)
					}
					winner = r.id
				} else {
					losers = append(losers, r)
				}
			}
			if winner == 0 {
				t.Fatalf("%v: nobody acquired: %v", ino, losers)
			}
			for _, r := range losers {
				var no *NotOwnerError
				if !errors.As(r.err, &no) || no.Owner != winner {
					t.Fatalf("%v: %v got %v, want NotOwnerError naming %v", ino, r.id, r.err, winner)
				}
			}
			t.Logf("%v: %v won", ino, winner)
		}
	})
}

// TestManyInodes holds 10 and then 1,000 leases on one server and compares
// the PaxosLease frames per second: renewals are batched, so the rate must
// not grow with the number of leases.
func TestManyInodes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newSimCluster(t, 3, nil)
		c.waitReady()
		n1 := c.node(1)
		acquireAll := func(inos []ids.Ino) time.Duration {
			start := time.Now()
			var wg sync.WaitGroup
			errs := make(chan error, len(inos))
			for _, ino := range inos {
				wg.Add(1)
				go func() {
					defer wg.Done()
					ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
					defer cancel()
					if _, err := n1.Acquire(ctx, ino); err != nil {
						errs <- err
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			return time.Since(start)
		}
		rate := func() (frames, entries, bytes float64) {
			total := func() (f, e, b uint64) {
				for id := ids.ServerID(1); id <= 3; id++ {
					st := c.node(id).Stats()
					f, e, b = f+st.MsgsSent, e+st.EntriesSent, b+st.BytesSent
				}
				return
			}
			time.Sleep(testLease) // let acquisitions' traffic settle
			f0, e0, b0 := total()
			start := time.Now()
			time.Sleep(5 * testLease)
			f1, e1, b1 := total()
			s := time.Since(start).Seconds()
			return float64(f1-f0) / s, float64(e1-e0) / s, float64(b1-b0) / s
		}
		// Renewal rounds come every quarter lease, each renewing leases with at
		// most half their belief left (lease/paxos), so frames/s are bounded by
		// the round rate whatever the count. Leases acquired more than a round
		// trip apart may renew in alternate rounds, which at most doubles it.
		small := inoRange(1000, 10)
		d := acquireAll(small)
		f10, e10, b10 := rate()
		t.Logf("10 leases: acquired in %v; cluster sends %.0f frames/s, %.0f entries/s, %.0f B/s", d, f10, e10, b10)
		for _, ino := range small {
			n1.Release(ino)
		}
		large := inoRange(2000, 1000)
		d = acquireAll(large)
		f1k, e1k, b1k := rate()
		t.Logf("1000 leases: acquired in %v; cluster sends %.0f frames/s, %.0f entries/s, %.0f B/s", d, f1k, e1k, b1k)
		st := n1.Stats()
		t.Logf("server:1 stats %+v", st)
		if st.Held < 900 {
			t.Fatalf("holds %d of 1000 leases", st.Held)
		}
		if f1k > 3*f10+50 {
			t.Fatalf("frames/s grew from %.0f (10 leases) to %.0f (1000 leases)", f10, f1k)
		}
	})
}

// TestFailover kills the owner; another server acquires once the lease has
// run out, under a higher epoch.
func TestFailover(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newSimCluster(t, 3, nil)
		c.waitReady()
		inos := inoRange(300, 3)
		sm := c.sample(inos)
		old := map[ids.Ino]ids.Epoch{}
		for _, ino := range inos {
			old[ino] = acquireRetry(t, c.node(1), ino, 5*time.Second)
		}
		for _, ino := range inos {
			eventually(t, 5*time.Second, "server:2 learns the owner", func() bool {
				o, ok := c.node(2).Owner(ino)
				return ok && o == 1
			})
		}
		killed := time.Now()
		c.kill(1)
		var took time.Duration
		for _, ino := range inos {
			ep := acquireRetry(t, c.node(2), ino, 10*time.Second)
			if took == 0 {
				took = time.Since(killed)
			}
			if ep <= old[ino] {
				t.Fatalf("%v: epoch %v after failover not above %v", ino, ep, old[ino])
			}
		}
		cfg := c.node(2).Config()
		bound := time.Duration(float64(cfg.LeaseTime) * (1 + cfg.Drift))
		t.Logf("failover: first inode acquired %v after the kill (T(1+δ) = %v), all %d after %v", took, bound, len(inos), time.Since(killed))
		// on the bubble's clock: the lease running out, then an attempt
		// that may have started just before and the retry after it
		if took > bound+2*testLease {
			t.Fatalf("failover took %v, more than T(1+δ) = %v + 2T", took, bound)
		}
		sm.finish()
	})
}

// TestPartition cuts the owner off: it stops believing within its lease, the
// majority acquires, and after healing everyone agrees.
func TestPartition(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newSimCluster(t, 3, nil)
		c.waitReady()
		inos := inoRange(400, 10)
		sm := c.sample(inos)
		var lostMu sync.Mutex
		lost := map[ids.Ino]bool{}
		c.node(1).OnLost(func(l Loss) {
			lostMu.Lock()
			lost[l.Ino] = true
			lostMu.Unlock()
		})
		old := map[ids.Ino]ids.Epoch{}
		for _, ino := range inos {
			old[ino] = acquireRetry(t, c.node(1), ino, 5*time.Second)
		}
		time.Sleep(2 * testLease) // a few renewals
		cut := time.Now()
		c.servers[1].faults.Cut(true)
		n1 := c.node(1)
		cfg := n1.Config()
		// the owner's belief, T/(1+δ) from its last renewal, ends on the
		// bubble's clock before that much time has passed since the cut
		ownerLease := time.Duration(float64(cfg.LeaseTime) / (1 + cfg.Drift))
		stopped := eventually(t, ownerLease+10*time.Millisecond, "cut-off owner stops believing", func() bool {
			for _, ino := range inos {
				if _, ok := n1.Owns(ino); ok {
					return false
				}
			}
			return true
		})
		t.Logf("cut-off owner stopped believing %v after the cut (owner lease T/(1+δ) = %v)", stopped, ownerLease)
		eventually(t, 2*time.Second, "Lost events", func() bool {
			lostMu.Lock()
			defer lostMu.Unlock()
			return len(lost) == len(inos)
		})
		for _, ino := range inos {
			ep := acquireRetry(t, c.node(2), ino, 10*time.Second)
			if ep <= old[ino] {
				t.Fatalf("%v: epoch %v not above %v", ino, ep, old[ino])
			}
		}
		t.Logf("majority side owns all %d inodes %v after the cut", len(inos), time.Since(cut))
		time.Sleep(2 * testLease)
		c.servers[1].faults.Cut(false)
		for _, ino := range inos {
			for _, id := range []ids.ServerID{1, 2, 3} {
				eventually(t, 5*time.Second, "agree after healing", func() bool {
					o, ok := c.node(id).Owner(ino)
					return ok && o == 2
				})
			}
			var no *NotOwnerError
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_, err := n1.Acquire(ctx, ino)
			cancel()
			if !errors.As(err, &no) || no.Owner != 2 {
				t.Fatalf("healed server:1 Acquire(%v) = %v, want NotOwnerError naming server:2", ino, err)
			}
		}
		sm.finish()
		t.Logf("sampler: %d samples, %d with an owner; server:1 %+v", sm.samples.Load(), sm.owned.Load(), n1.Stats())
		if sm.owned.Load() == 0 {
			t.Fatal("the sampler never saw an owner")
		}
	})
}

// TestRestartQuarantine restarts a server on its data directory: the boot
// counter increases and the server takes part in nothing for T(1+δ), which
// with the third server down keeps the second from any quorum.
func TestRestartQuarantine(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newSimCluster(t, 3, nil)
		c.waitReady()
		boot := c.node(3).Boot()
		c.kill(1)
		c.kill(3)
		n3 := c.restart(3)
		if n3.Boot() != boot+1 {
			t.Fatalf("boot %d after restart, want %d", n3.Boot(), boot+1)
		}
		quarantineEnd := n3.start.Add(n3.Config().Quarantine)
		_, err := n3.Acquire(context.Background(), 500)
		var qe *QuarantineError
		if !errors.Is(err, ErrQuarantined) || !errors.As(err, &qe) || qe.Left <= 0 {
			t.Fatalf("Acquire during quarantine = %v", err)
		}
		type res struct {
			ep  ids.Epoch
			err error
			at  int64
		}
		done := make(chan res, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			n2 := c.node(2)
			ep, err := n2.Acquire(ctx, 501)
			var at int64
			n2.query(func(clock.Time) {
				if h := n2.held[501]; h != nil {
					at = int64(h.since)
				}
			})
			done <- res{ep, err, at}
		}()
		for n3.Quarantined() {
			st := n3.Stats()
			if st.MsgsSent != 0 && n3.Quarantined() {
				t.Fatalf("quarantined server sent %d frames", st.MsgsSent)
			}
			time.Sleep(2 * time.Millisecond)
		}
		r := <-done
		if r.err != nil {
			t.Fatal(r.err)
		}
		if r.at < int64(quarantineEnd) {
			t.Fatalf("server:2 acquired %v before server:3's quarantine ended", time.Duration(int64(quarantineEnd)-r.at))
		}
		t.Logf("server:2 acquired %v after server:3's quarantine ended", time.Duration(r.at-int64(quarantineEnd)))
		if _, err := n3.Acquire(context.Background(), 502); err != nil {
			t.Fatalf("Acquire after quarantine: %v", err)
		}
	})
}

func TestIdleRelease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newSimCluster(t, 3, func(cfg *Config) { cfg.IdleRelease = testLease })
		c.waitReady()
		n := c.node(1)
		var mu sync.Mutex
		var losses []Loss
		n.OnLost(func(l Loss) {
			mu.Lock()
			losses = append(losses, l)
			mu.Unlock()
		})
		const idle, touched, pinned = ids.Ino(600), ids.Ino(601), ids.Ino(602)
		for _, ino := range []ids.Ino{idle, touched, pinned} {
			acquireRetry(t, n, ino, 5*time.Second)
		}
		n.Pin(pinned)
		stop := make(chan struct{})
		go func() {
			for {
				select {
				case <-stop:
					return
				case <-time.After(testLease / 8):
					n.Touch(touched)
				}
			}
		}()
		defer close(stop)
		eventually(t, 10*testLease, "idle release", func() bool {
			_, ok := n.Owns(idle)
			return !ok
		})
		time.Sleep(2 * testLease)
		for _, ino := range []ids.Ino{touched, pinned} {
			if _, ok := n.Owns(ino); !ok {
				t.Fatalf("%v released though in use", ino)
			}
		}
		eventually(t, 2*time.Second, "server:2 may acquire the released inode at once", func() bool {
			ctx, cancel := context.WithTimeout(context.Background(), testLease)
			defer cancel()
			_, err := c.node(2).Acquire(ctx, idle)
			return err == nil
		})
		eventually(t, 2*time.Second, "idle Loss reported", func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(losses) > 0
		})
		mu.Lock()
		if len(losses) != 1 || losses[0].Ino != idle || !losses[0].Idle {
			t.Fatalf("losses %+v, want one idle loss of %v", losses, idle)
		}
		mu.Unlock()
		n.Unpin(pinned)
		eventually(t, 10*testLease, "release after Unpin", func() bool {
			_, ok := n.Owns(pinned)
			return !ok
		})
		if st := n.Stats(); st.IdleReleases != 2 || st.Losses != 0 {
			t.Fatalf("stats %+v", st)
		}
	})
}

func TestRelease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newSimCluster(t, 3, nil)
		c.waitReady()
		const ino = ids.Ino(700)
		ep1 := acquireRetry(t, c.node(1), ino, 5*time.Second)
		c.node(1).Release(ino)
		if _, ok := c.node(1).Owns(ino); ok {
			t.Fatal("owns after Release")
		}
		start := time.Now()
		// the release frees the acceptors: no waiting for the lease to run out
		ep2 := acquireRetry(t, c.node(3), ino, 5*time.Second)
		t.Logf("hand-over after Release: %v", time.Since(start))
		if ep2 <= ep1 {
			t.Fatalf("epoch %v after hand-over not above %v", ep2, ep1)
		}
	})
}

func TestAcquireCancel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// server:1 alone cannot reach a quorum: Acquire waits until ctx ends
		c := newSimCluster(t, 3, nil)
		c.waitReady()
		c.kill(2)
		c.kill(3)
		n := c.node(1)
		ctx, cancel := context.WithTimeout(context.Background(), testLease)
		defer cancel()
		if _, err := n.Acquire(ctx, 800); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Acquire without quorum = %v", err)
		}
		// the core keeps wanting 800 for a lease (a retry inherits its
		// backoff), then stops
		abandoned := func() bool {
			var ok bool
			n.query(func(clock.Time) { _, ok = n.abandoned[800] })
			return ok
		}
		if !abandoned() {
			t.Fatal("given-up Acquire not kept for a lease")
		}
		eventually(t, 3*testLease, "abandoned want dropped", func() bool { return !abandoned() })
		done := make(chan error, 1)
		go func() {
			_, err := n.Acquire(context.Background(), 801)
			done <- err
		}()
		time.Sleep(testLease / 4)
		n.Close()
		if err := <-done; !errors.Is(err, ErrClosed) {
			t.Fatalf("Acquire across Close = %v", err)
		}
		if _, ok := n.Owns(801); ok {
			t.Fatal("closed node owns")
		}
	})
}

// TestNemesis runs all three servers over lossy links (drop, duplicate,
// reorder, jitter) while they compete for a few inodes and a nemesis cuts
// one server off at a time; the sampler checks invariant 1 throughout. Then
// the faults stop and every inode must get an owner again.
func TestNemesis(t *testing.T) {
	c := newCluster(t, 3, nil)
	for _, s := range c.servers {
		s.faults.Set(transport.FaultSpec{Drop: 0.05, Dup: 0.05, Reorder: 0.05, Jitter: 2 * time.Millisecond})
	}
	c.waitReady()
	inos := inoRange(1100, 6)
	sm := c.sample(inos)
	const seed = 1
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for id := ids.ServerID(1); id <= 3; id++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, uint64(id)))
			n := c.node(id)
			for {
				select {
				case <-stop:
					return
				default:
				}
				ino := inos[rng.IntN(len(inos))]
				ctx, cancel := context.WithTimeout(context.Background(), testLease/2)
				n.Acquire(ctx, ino)
				cancel()
				n.Touch(ino)
				time.Sleep(time.Duration(rng.IntN(10)) * time.Millisecond)
			}
		}()
	}
	rng := rand.New(rand.NewPCG(seed, 0))
	end := time.Now().Add(4 * time.Second)
	cuts := 0
	for time.Now().Before(end) {
		s := c.servers[ids.ServerID(1+rng.IntN(3))]
		s.faults.Cut(true)
		cuts++
		time.Sleep(testLease + time.Duration(rng.IntN(int(testLease))))
		s.faults.Cut(false)
		time.Sleep(time.Duration(rng.IntN(int(testLease))))
	}
	close(stop)
	wg.Wait()
	for _, s := range c.servers {
		s.faults.Set(transport.FaultSpec{})
	}
	for _, ino := range inos {
		eventually(t, 10*time.Second, "an owner after the faults", func() bool {
			for id := ids.ServerID(1); id <= 3; id++ {
				ctx, cancel := context.WithTimeout(context.Background(), testLease)
				_, err := c.node(id).Acquire(ctx, ino)
				cancel()
				if err == nil {
					return true
				}
			}
			return false
		})
	}
	sm.finish()
	for id := ids.ServerID(1); id <= 3; id++ {
		st := c.node(id).Stats()
		t.Logf("%v: acquires %d, losses %d, frames sent %d, send errors %d", id, st.Acquires, st.Losses, st.MsgsSent, st.SendErrors)
	}
	t.Logf("%d cuts; sampler: %d samples, %d with an owner", cuts, sm.samples.Load(), sm.owned.Load())
}

// TestSamplerCatchesBrokenCore tests the tester: with a core that believes
// an extension before its accept quorum (paxos.Unsafe.ExtendWithoutQuorum),
// a cut-off owner starts a renewal about half a lease after its last good
// one and believes a whole lease from there, while the acceptors' leases end
// T after the last good one. Acquiring on the majority side just after that
// lands in the gap, and the sampler must say so.
func TestSamplerCatchesBrokenCore(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newSimCluster(t, 3, func(cfg *Config) { cfg.unsafe.ExtendWithoutQuorum = true })
		c.waitReady()
		const ino = ids.Ino(1200)
		sm := c.sample([]ids.Ino{ino})
		acquireRetry(t, c.node(1), ino, 5*time.Second)
		time.Sleep(testLease)
		c.servers[1].faults.Cut(true)
		accepted := func(id ids.ServerID) bool {
			n := c.node(id)
			var ok bool
			n.query(func(now clock.Time) { _, _, ok = n.core.Accepted(now, ino) })
			return ok
		}
		eventually(t, 5*time.Second, "the majority's acceptors free the lease", func() bool {
			return !accepted(2) && !accepted(3)
		})
		// no earlier attempt of server:2's, so no backoff: it acquires at once
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if _, err := c.node(2).Acquire(ctx, ino); err != nil {
			t.Fatal(err)
		}
		eventually(t, 5*time.Second, "the sampler sees two owners", func() bool {
			sm.mu.Lock()
			defer sm.mu.Unlock()
			return len(sm.errs) > 0
		})
		v := sm.violations()
		t.Logf("%d violations, first: %s", len(v), v[0])
	})
}

// TestShutdown: a graceful stop releases, so another server acquires at once
// rather than after the lease runs out.
func TestShutdown(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newSimCluster(t, 3, func(cfg *Config) { cfg.LeaseTime = time.Second })
		c.waitReady()
		inos := inoRange(1300, 5)
		for _, ino := range inos {
			acquireRetry(t, c.node(1), ino, 5*time.Second)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		start := time.Now()
		if err := c.node(1).Shutdown(ctx); err != nil {
			t.Fatal(err)
		}
		c.kill(1)
		for _, ino := range inos {
			acquireRetry(t, c.node(2), ino, 5*time.Second)
		}
		took := time.Since(start)
		t.Logf("shutdown and hand-over of %d inodes: %v (T = 1s)", len(inos), took)
		if took > 100*time.Millisecond {
			t.Fatalf("hand-over after Shutdown took %v: the leases were not released", took)
		}
	})
}

// BenchmarkOwns measures the ownership check the metaserver makes before
// every change: a round trip through the node's goroutine.
func BenchmarkOwns(b *testing.B) {
	cfg := DefaultConfig(1, map[ids.ServerID]string{1: ""}, b.TempDir(), testIdentity(b))
	cfg.LeaseTime = testLease
	n, err := New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer n.Close()
	for n.Quarantined() {
		time.Sleep(5 * time.Millisecond)
	}
	if _, err := n.Acquire(context.Background(), 7); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for b.Loop() {
		if _, ok := n.Owns(7); !ok {
			b.Fatal("lost")
		}
	}
}
