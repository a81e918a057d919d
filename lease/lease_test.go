package lease

import (
	"errors"
	"testing"
	"time"

	"github.com/leasefs/leasefs/internal/clock"
	"github.com/leasefs/leasefs/internal/ids"
)

func ms(n int) clock.Time { return clock.Time(time.Duration(n) * time.Millisecond) }

func testConfig() Config {
	return Config{Tau: time.Second, Delta: 0.1, RenewMargin: 100 * time.Millisecond}
}

func TestConfigValidate(t *testing.T) {
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatalf("default config: %v", err)
	}
	bad := []Config{
		{Tau: 0, Delta: 0.05, RenewMargin: time.Millisecond},
		{Tau: time.Second, Delta: -0.1, RenewMargin: time.Millisecond},
		{Tau: time.Second, Delta: 1, RenewMargin: time.Millisecond},
		{Tau: time.Second, Delta: 0.05, RenewMargin: 0},
		{Tau: time.Second, Delta: 0.05, RenewMargin: 600 * time.Millisecond},
	}
	for _, c := range bad {
		if err := c.Validate(); !errors.Is(err, ErrConfig) {
			t.Errorf("%+v: got %v, want ErrConfig", c, err)
		}
	}
	if got := testConfig().FailTimeout(); got != 1100*time.Millisecond {
		t.Errorf("FailTimeout = %v, want 1.1s", got)
	}
}

func TestClientLeaseFromSendTime(t *testing.T) {
	c := NewClient(testConfig())
	if c.Valid(ms(0)) || c.Valid(ms(1)) {
		t.Fatal("valid before any ack")
	}
	c.Sent(ms(100), false)
	c.Acked(ms(100), ms(400)) // reply took 300ms: lease still counts from 100
	if got := c.Expiry(); got != ms(1100) {
		t.Fatalf("expiry %v, want send time + tau = %v", got, ms(1100))
	}
	if !c.Valid(ms(1099)) || c.Valid(ms(1100)) {
		t.Fatal("validity boundary wrong")
	}
	// A late reply to an older request never shortens the lease.
	c.Acked(ms(50), ms(500))
	if c.Expiry() != ms(1100) {
		t.Fatalf("older ack shortened lease to %v", c.Expiry())
	}
	c.Acked(ms(600), ms(610))
	if c.Expiry() != ms(1600) {
		t.Fatalf("newer ack: expiry %v", c.Expiry())
	}
	if r := c.Remaining(ms(1000)); r != 600*time.Millisecond {
		t.Fatalf("remaining %v", r)
	}
}

func TestClientAckBeforeSendPanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("no panic")
		}
	}()
	NewClient(testConfig()).Acked(ms(10), ms(5))
}

func TestClientNack(t *testing.T) {
	c := NewClient(testConfig())
	c.Acked(ms(0), ms(10))
	c.Nacked(ms(200))
	if c.Valid(ms(201)) {
		t.Fatal("valid after nack")
	}
	if c.NeedsRenewal(ms(950), true) {
		t.Fatal("renewal asked after nack: the client must open a new session instead")
	}
	// A reply to a request sent before the NACK (reordered) does not revive it.
	c.Acked(ms(150), ms(250))
	if c.Valid(ms(260)) {
		t.Fatal("stale ack revived a nacked lease")
	}
	// The new session's first reply does.
	c.Acked(ms(300), ms(320))
	if !c.Valid(ms(330)) || c.Expiry() != ms(1300) {
		t.Fatalf("new session: valid=%v expiry=%v", c.Valid(ms(330)), c.Expiry())
	}
	s := c.Stats()
	if s.Nacks != 1 || s.StaleAcks != 1 || s.Acks != 2 {
		t.Fatalf("stats %+v", s)
	}
}

func TestClientNeedsRenewal(t *testing.T) {
	c := NewClient(testConfig())
	if c.NeedsRenewal(ms(0), true) {
		t.Fatal("renewal without a lease")
	}
	c.Acked(ms(0), ms(5))
	if c.RenewAt() != ms(900) {
		t.Fatalf("RenewAt %v", c.RenewAt())
	}
	if c.NeedsRenewal(ms(899), true) {
		t.Fatal("renewal before the margin")
	}
	if c.NeedsRenewal(ms(950), false) {
		t.Fatal("renewal without state")
	}
	if !c.NeedsRenewal(ms(900), true) {
		t.Fatal("no renewal inside the margin")
	}
	c.Sent(ms(900), true)
	if c.NeedsRenewal(ms(920), true) {
		t.Fatal("second renewal while the first is young")
	}
	if !c.NeedsRenewal(ms(950), true) {
		t.Fatal("no retry after half the margin")
	}
	// Lapsed: still asks (to learn whether the state survived).
	if !c.NeedsRenewal(ms(2000), true) || !c.NeedsRenewal(ms(2100), true) {
		t.Fatal("no renewal after lapse")
	}
	c.Acked(ms(900), ms(2010))
	if c.Valid(ms(2010)) {
		t.Fatal("lease valid after its send time + tau")
	}
	s := c.Stats()
	if s.Requests != 1 || s.Renewals != 1 || s.LapsesObserved != 1 {
		t.Fatalf("stats %+v", s)
	}
}

func TestFailingSet(t *testing.T) {
	cfg := testConfig()
	f := NewFailingSet(cfg)
	a, b := ids.ClientID(1), ids.ClientID(2)
	if _, ok := f.NextDeadline(); ok {
		t.Fatal("timer in an empty set")
	}
	if f.Failing(a, ms(0)) {
		t.Fatal("failing before Fail")
	}
	if d := f.Fail(a, ms(100)); d != ms(1200) {
		t.Fatalf("deadline %v, want now+tau(1+delta)", d)
	}
	if d := f.Fail(a, ms(500)); d != ms(1200) {
		t.Fatalf("second Fail moved the deadline to %v", d)
	}
	f.Evict(b, ms(50))
	if d, ok := f.NextDeadline(); !ok || d != ms(1150) {
		t.Fatalf("next deadline %v %v", d, ok)
	}
	if r, ok := f.Remaining(a, ms(200)); !ok || r != time.Second {
		t.Fatalf("remaining %v %v", r, ok)
	}
	if got := f.Expired(ms(1149)); len(got) != 0 {
		t.Fatalf("expired early: %v", got)
	}
	if got := f.Expired(ms(1199)); len(got) != 1 || got[0] != b {
		t.Fatalf("expired %v", got)
	}
	if !f.Failing(a, ms(5000)) {
		t.Fatal("a past its deadline but uncollected must still be failing")
	}
	if got := f.Expired(ms(5000)); len(got) != 1 || got[0] != a {
		t.Fatalf("expired %v", got)
	}
	if f.Failing(a, ms(5000)) || f.Len() != 0 {
		t.Fatal("expired client still in the set")
	}
	// After being forgotten a client can fail again with a fresh timer.
	if d := f.Fail(a, ms(6000)); d != ms(7100) {
		t.Fatalf("refail deadline %v", d)
	}
	if s := f.Stats(); s.Failed != 3 || s.Expired != 2 {
		t.Fatalf("stats %+v", s)
	}
}

func TestFailingSetOrder(t *testing.T) {
	f := NewFailingSet(testConfig())
	for _, c := range []ids.ClientID{5, 3, 9, 1} {
		f.Fail(c, ms(int(c)))
	}
	f.Fail(7, ms(3))
	got := f.Expired(ms(10_000))
	want := []ids.ClientID{1, 3, 7, 5, 9}
	if len(got) != len(want) {
		t.Fatalf("got %v", got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("got %v want %v", got, want)
		}
	}
}

func TestGrace(t *testing.T) {
	g := NewGrace(testConfig(), ms(1000))
	if !g.Active(ms(1000)) || !g.Active(ms(2099)) || g.Active(ms(2100)) {
		t.Fatal("grace boundaries")
	}
	if g.Until() != ms(2100) || g.Remaining(ms(2000)) != 100*time.Millisecond || g.Remaining(ms(3000)) != 0 {
		t.Fatal("grace until/remaining")
	}
}

// TestSafetyBound checks the arithmetic the protocol rests on: whatever the
// rates of the two clocks within δ, a lease started at the last acknowledged
// send has lapsed in real time when the server's τ(1+δ) timer fires.
func TestSafetyBound(t *testing.T) {
	cfg := testConfig()
	for _, rc := range []float64{1, 1 + cfg.Delta/2, 1 + cfg.Delta} {
		for _, rs := range []float64{1, 1 + cfg.Delta/2, 1 + cfg.Delta} {
			if rs/rc > 1+cfg.Delta || rc/rs > 1+cfg.Delta {
				continue
			}
			clientLease := float64(cfg.Tau) / rc // real duration of τ on the client
			serverWait := float64(cfg.FailTimeout()) / rs
			if serverWait < clientLease-1 { // 1ns: float rounding
				t.Errorf("rates client %v server %v: server waits %v < client lease %v", rc, rs, serverWait, clientLease)
			}
		}
	}
}
