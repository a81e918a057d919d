package metaserver

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/locks"
	"github.com/leasefs/leasefs/metaserver/paxosnode"
)

// failTimeout is τ(1+δ) of cfg.
func failTimeout(cfg Config) time.Duration {
	return cfg.ClientLease + time.Duration(float64(cfg.ClientLease)*cfg.ClockDrift)
}

// acquireLater starts an acquire and returns the channel its result comes on.
func acquireLater(s *Server, c ids.ClientID, ino ids.Ino, mode locks.Mode) <-chan error {
	done := make(chan error, 1)
	go func() {
		h, err := s.lm.acquire(context.Background(), c, ino, mode)
		if err == nil {
			s.lm.done(h)
		}
		done <- err
	}()
	return done
}

func granted(t *testing.T, done <-chan error) bool {
	t.Helper()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
		return true
	default:
		return false
	}
}

// TestFailStealsAfterLease: a failed client gets NACKs at once and loses
// its locks and its session exactly τ(1+δ) later on the lock manager's
// clock, not a moment before; then the waiting request is granted.
func TestFailStealsAfterLease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := DefaultConfig()
		s := bareServer(cfg)
		const failed, other = ids.ClientID(1), ids.ClientID(2)
		s.addSession(failed)
		h, err := s.lm.acquire(context.Background(), failed, 10, locks.Exclusive)
		if err != nil {
			t.Fatal(err)
		}
		s.lm.done(h)
		s.lm.fail(failed, "test")
		if _, err := s.lm.acquire(context.Background(), failed, 11, locks.Shared); !errors.Is(err, errNack) {
			t.Fatalf("a failing client's request: %v", err)
		}
		done := acquireLater(s, other, 10, locks.Shared)
		time.Sleep(failTimeout(cfg) - time.Nanosecond)
		synctest.Wait()
		if granted(t, done) || !s.known(failed) {
			t.Fatal("locks stolen before τ(1+δ)")
		}
		time.Sleep(time.Nanosecond)
		synctest.Wait()
		if !granted(t, done) || s.known(failed) {
			t.Fatalf("not stolen at τ(1+δ): session known %v", s.known(failed))
		}
	})
}

// TestStealNacksWaiting: a request of a failed client that waits in a
// lock's queue gets a NACK when its locks are stolen (the steal drops its
// place in the queue). It waited for ever: a mount's send of pages written
// back from a mapping, queued behind another mount's write, never got an
// answer, and its msync never returned.
func TestStealNacksWaiting(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := DefaultConfig()
		s := bareServer(cfg)
		// a hand-over's pseudo client holds the lock: it is asked for
		// nothing (bareServer delivers no revocations)
		const failed = ids.ClientID(1)
		other := paxosnode.PeerClientID(2)
		s.addSession(failed)
		h, err := s.lm.acquire(context.Background(), other, 10, locks.Exclusive)
		if err != nil {
			t.Fatal(err)
		}
		s.lm.done(h)
		waiting := acquireLater(s, failed, 10, locks.Exclusive)
		synctest.Wait()
		s.lm.fail(failed, "test")
		time.Sleep(failTimeout(cfg))
		synctest.Wait()
		select {
		case err := <-waiting:
			if !errors.Is(err, errNack) {
				t.Fatalf("the failed client's waiting request after the steal: %v", err)
			}
		default:
			t.Fatal("the failed client's request still waits after its locks were stolen")
		}
	})
}

// TestRestartGrace: a restarted server grants nothing for τ(1+δ).
func TestRestartGrace(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := DefaultConfig()
		s := bareServer(cfg)
		s.lm = newLockMgr(s, true)
		done := acquireLater(s, 1, 10, locks.Shared)
		time.Sleep(failTimeout(cfg) - time.Nanosecond)
		synctest.Wait()
		if granted(t, done) {
			t.Fatal("granted during the grace")
		}
		time.Sleep(time.Nanosecond)
		synctest.Wait()
		if !granted(t, done) {
			t.Fatal("not granted at the grace's end")
		}
	})
}

// TestInodeGraceShell: the ownership grace of one inode holds its requests
// back until its end on the lock manager's clock; other inodes go on.
func TestInodeGraceShell(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := bareServer(DefaultConfig())
		ol := ownerLocks{s.lm}
		const d = 3 * time.Second
		ol.Grace(10, s.lm.clk.Now().Add(d))
		if until, ok := ol.GraceUntil(10); !ok || until != s.lm.clk.Now().Add(d) {
			t.Fatalf("grace until %v %v", until, ok)
		}
		done := acquireLater(s, 1, 10, locks.Exclusive)
		other := acquireLater(s, 1, 11, locks.Exclusive)
		synctest.Wait()
		if !granted(t, other) {
			t.Fatal("another inode held back")
		}
		time.Sleep(d - time.Nanosecond)
		synctest.Wait()
		if granted(t, done) {
			t.Fatal("granted during the inode's grace")
		}
		time.Sleep(time.Nanosecond)
		synctest.Wait()
		if !granted(t, done) {
			t.Fatal("not granted at the grace's end")
		}
		if _, ok := ol.GraceUntil(10); ok {
			t.Fatal("the grace still runs")
		}
	})
}

// BenchmarkAcquireDone is a request's lock round trip: a lock the client
// holds already, granted again at once.
func BenchmarkAcquireDone(b *testing.B) {
	s := bareServer(DefaultConfig())
	ctx := context.Background()
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		h, err := s.lm.acquire(ctx, 1, ids.Ino(1+i%64), locks.Shared)
		if err != nil {
			b.Fatal(err)
		}
		s.lm.noteProgress(1, h.grant.Ino)
		s.lm.done(h)
	}
}
