package lockserver

import (
	"errors"
	"testing"
	"time"

	"github.com/leasefs/leasefs/internal/clock"
	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/lease"
	"github.com/leasefs/leasefs/locks"
)

const (
	a, b = ids.ClientID(1), ids.ClientID(2)
	ino  = ids.Ino(7)
	t0   = clock.Time(time.Hour)
	dt   = 100 * time.Millisecond
)

var lcfg = lease.Config{Tau: time.Second, Delta: 0.1, RenewMargin: time.Second / 8}

func newServer(t *testing.T, restarted bool, edit ...func(*Config)) *Server {
	t.Helper()
	cfg := DefaultConfig(lcfg, dt)
	cfg.MaxRevokeWait = 10 * dt
	for _, e := range edit {
		e(&cfg)
	}
	s, err := New(cfg, t0, restarted)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// conflict gives a X on ino, then b asks X: a is asked to release.
func conflict(t *testing.T, s *Server) locks.Revoke {
	t.Helper()
	if q, err := s.Request(t0, a, ino, locks.Exclusive); err != nil || q {
		t.Fatalf("a's request: queued %v, %v", q, err)
	}
	if rd := s.Ready(); len(rd.Grants) != 1 {
		t.Fatalf("a not granted: %+v", rd)
	}
	if q, err := s.Request(t0, b, ino, locks.Exclusive); err != nil || !q {
		t.Fatalf("b's request: queued %v, %v", q, err)
	}
	rd := s.Ready()
	if len(rd.Revokes) != 1 || rd.Revokes[0].Client != a {
		t.Fatalf("no revocation for a: %+v", rd)
	}
	return rd.Revokes[0]
}

func TestAckGrantsWaiter(t *testing.T) {
	s := newServer(t, false)
	r := conflict(t, s)
	if d := s.NextDeadline(); d != t0.Add(dt) {
		t.Fatalf("deadline %v, want delivery timeout", d.Sub(t0))
	}
	if err := s.Acked(t0.Add(dt/2), a, ino, r.To, r.Seq); err != nil {
		t.Fatal(err)
	}
	rd := s.Ready()
	if len(rd.Grants) != 1 || rd.Grants[0].Client != b || !s.NextDeadline().IsZero() {
		t.Fatalf("b not granted after the ack: %+v, deadline %v", rd, s.NextDeadline())
	}
}

// TestProgressExtendsRevocation: a client that keeps sending requests about
// the inode is flushing, and is failed only at MaxRevokeWait; one that
// stops is failed a delivery timeout after its last request.
func TestProgressExtendsRevocation(t *testing.T) {
	s := newServer(t, false)
	conflict(t, s)
	now := t0
	for i := 0; i < 30; i++ {
		now = now.Add(dt / 2)
		s.Tick(now)
		if s.Failing(a) {
			break
		}
		s.Progress(now, a, ino)
	}
	if !s.Failing(a) || now != t0.Add(10*dt) {
		t.Fatalf("failing %v at %v, want at MaxRevokeWait", s.Failing(a), now.Sub(t0))
	}
	rd := s.Ready()
	if len(rd.Failed) != 1 || rd.Failed[0].StealAt != now.Add(lcfg.FailTimeout()) {
		t.Fatalf("failures %+v", rd.Failed)
	}

	s = newServer(t, false)
	conflict(t, s)
	s.Progress(t0.Add(dt/2), a, ino)
	if d := s.NextDeadline(); d != t0.Add(dt/2+dt) {
		t.Fatalf("deadline %v after progress", d.Sub(t0))
	}
}

// TestFailNacksThenSteals: a failing client gets NACKs, its acknowledgement
// changes nothing, and its locks go only τ(1+δ) after the failure.
func TestFailNacksThenSteals(t *testing.T) {
	s := newServer(t, false)
	r := conflict(t, s)
	failAt := t0.Add(dt)
	s.Tick(failAt)
	if rd := s.Ready(); len(rd.Failed) != 1 || rd.Failed[0].Client != a || rd.Failed[0].Ino != ino {
		t.Fatalf("not failed: %+v", rd)
	}
	if _, err := s.Request(failAt, a, 9, locks.Shared); !errors.Is(err, ErrNack) {
		t.Fatalf("request of a failing client: %v", err)
	}
	if err := s.Forget(failAt, a); !errors.Is(err, ErrNack) {
		t.Fatalf("forgetting a failing client: %v", err)
	}
	_ = s.Acked(failAt, a, ino, r.To, r.Seq)
	steal := failAt.Add(lcfg.FailTimeout())
	if d := s.NextDeadline(); d != steal {
		t.Fatalf("deadline %v, want the steal", d.Sub(t0))
	}
	s.Tick(steal - 1)
	if rd := s.Ready(); !rd.Empty() || s.Mode(a, ino) != locks.Exclusive {
		t.Fatalf("stolen early: %+v", rd)
	}
	s.Tick(steal)
	rd := s.Ready()
	if len(rd.Stolen) != 1 || len(rd.Grants) != 1 || rd.Grants[0].Client != b || s.Failing(a) {
		t.Fatalf("steal: %+v", rd)
	}
}

func TestUnsafeStealWithoutWait(t *testing.T) {
	s := newServer(t, false, func(c *Config) { c.Unsafe.StealWithoutWait = true })
	conflict(t, s)
	s.Tick(t0.Add(dt))
	if rd := s.Ready(); len(rd.Stolen) != 1 || len(rd.Grants) != 1 {
		t.Fatalf("%+v", rd)
	}
}

// TestGrace: a restarted server grants only reclaims for τ(1+δ).
func TestGrace(t *testing.T) {
	for _, unsafe := range []bool{false, true} {
		s := newServer(t, true, func(c *Config) { c.Unsafe.NoGrace = unsafe })
		if _, err := s.Reclaim(t0, a, ino, locks.Exclusive); (err == nil) == unsafe {
			t.Fatalf("no-grace %v: reclaim %v", unsafe, err)
		}
		q, _ := s.Request(t0, b, 9, locks.Shared)
		if q == unsafe {
			t.Fatalf("no-grace %v: request queued %v", unsafe, q)
		}
		if unsafe {
			continue
		}
		end := t0.Add(lcfg.FailTimeout())
		if d := s.NextDeadline(); d != end {
			t.Fatalf("grace ends %v", d.Sub(t0))
		}
		s.Tick(end)
		if rd := s.Ready(); len(rd.Grants) != 1 || rd.Grants[0].Client != b {
			t.Fatalf("after grace: %+v", rd)
		}
	}
	s := newServer(t, true, func(c *Config) { c.Unsafe.IgnoreDelta = true })
	if d := s.NextDeadline(); d != t0.Add(lcfg.Tau) {
		t.Fatalf("ignore-delta grace ends %v", d.Sub(t0))
	}
}

// TestReleaseWaitsForInflight: an acknowledgement or release takes effect
// only when the operations under the lock end.
func TestReleaseWaitsForInflight(t *testing.T) {
	s := newServer(t, false)
	s.Begin(a, ino)
	r := conflict(t, s)
	_ = s.Acked(t0, a, ino, r.To, r.Seq)
	if rd := s.Ready(); len(rd.Grants) != 0 || s.Mode(a, ino) != locks.Exclusive {
		t.Fatalf("released under an operation: %+v", rd)
	}
	s.End(t0, a, ino)
	if rd := s.Ready(); len(rd.Grants) != 1 || rd.Grants[0].Client != b {
		t.Fatalf("not released after the operation: %+v", rd)
	}
}

func TestUndeliveredAndLocal(t *testing.T) {
	s := newServer(t, false)
	conflict(t, s)
	s.Undelivered(t0, a, 99, "no such revocation")
	if s.Failing(a) {
		t.Fatal("failed for a revocation never sent")
	}
	s.Undelivered(t0, a, ino, "connection closed")
	if !s.Failing(a) {
		t.Fatal("not failed on a delivery error")
	}

	s = newServer(t, false, func(c *Config) { c.Local = func(c ids.ClientID) bool { return c == a } })
	_, _ = s.Request(t0, a, ino, locks.Exclusive)
	_, _ = s.Request(t0, b, ino, locks.Exclusive)
	if rd := s.Ready(); len(rd.Revokes) != 0 || !s.NextDeadline().IsZero() {
		t.Fatalf("a local client was sent a revocation: %+v", rd)
	}
}

func TestResend(t *testing.T) {
	s := newServer(t, false, func(c *Config) { c.Resend = dt / 2 })
	r := conflict(t, s)
	s.Tick(t0.Add(dt / 2))
	if rd := s.Ready(); len(rd.Revokes) != 1 || rd.Revokes[0] != r {
		t.Fatalf("not resent: %+v", rd)
	}
	s.Tick(t0.Add(dt/2 + 1))
	if rd := s.Ready(); len(rd.Revokes) != 0 {
		t.Fatalf("resent twice: %+v", rd)
	}
}

// TestInodeGrace: the ownership grace holds clients back on one inode, not
// the server's own pseudo clients, and ends at its deadline.
func TestInodeGrace(t *testing.T) {
	const pseudo = ids.ClientID(99)
	s := newServer(t, false, func(c *Config) { c.Local = func(c ids.ClientID) bool { return c == pseudo } })
	until := t0.Add(lcfg.FailTimeout())
	s.InodeGrace(ino, until)
	if q, _ := s.Request(t0, a, ino, locks.Shared); !q {
		t.Fatal("granted during the inode's grace")
	}
	if q, _ := s.Request(t0, pseudo, 9, locks.Exclusive); q {
		t.Fatal("pseudo client held back on another inode")
	}
	if d := s.NextDeadline(); d != until {
		t.Fatalf("deadline %v", d.Sub(t0))
	}
	s.Ready()
	s.Tick(until)
	if rd := s.Ready(); len(rd.Grants) != 1 || rd.Grants[0].Client != a {
		t.Fatalf("not granted at the grace's end: %+v", rd)
	}
}
