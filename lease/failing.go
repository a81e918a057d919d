package lease

import (
	"slices"
	"time"

	"github.com/leasefs/leasefs/internal/clock"
	"github.com/leasefs/leasefs/internal/ids"
)

// FailingSet is the server's set of clients it is timing out. In normal
// operation it is empty and the server keeps no per-client timer (stateless
// serving); a client enters it when a server-initiated message to it was not
// acknowledged within the delivery timeout (Fail), or by an administrator
// (Evict). One goroutine of the server shell owns it.
type FailingSet struct {
	timeout   time.Duration
	deadlines map[ids.ClientID]clock.Time
	stats     FailingStats
}

// FailingStats counts what the set did.
type FailingStats struct {
	Failed  uint64 // clients that entered the set
	Expired uint64 // clients returned by Expired (their locks are stolen)
}

// NewFailingSet returns an empty set whose timers run τ(1+δ) of cfg.
func NewFailingSet(cfg Config) *FailingSet {
	return &FailingSet{timeout: cfg.FailTimeout(), deadlines: map[ids.ClientID]clock.Time{}}
}

// Fail starts timing out client at now and returns the deadline after which
// its locks may be stolen. From now on the server must NACK every request of
// client. Idempotent: failing a failing client keeps the first deadline,
// since the client's lease was already running out from the first failure.
func (f *FailingSet) Fail(client ids.ClientID, now clock.Time) clock.Time {
	if d, ok := f.deadlines[client]; ok {
		return d
	}
	d := now.Add(f.timeout)
	f.deadlines[client] = d
	f.stats.Failed++
	return d
}

// Evict is Fail for an administrator's request: the same τ(1+δ) wait, since
// the client may still trust its lease until then.
func (f *FailingSet) Evict(client ids.ClientID, now clock.Time) clock.Time {
	return f.Fail(client, now)
}

// Failing reports whether client is being timed out: from Fail until Expired
// returns it. Past its deadline but not yet collected it still counts as
// failing, so the server never ACKs it again.
func (f *FailingSet) Failing(client ids.ClientID, now clock.Time) bool {
	_, ok := f.deadlines[client]
	return ok
}

// Expired removes and returns the clients whose deadline has passed at now,
// in deadline order. The caller must steal their locks and forget their
// sessions; a later request from them finds no session and gets a NACK.
func (f *FailingSet) Expired(now clock.Time) []ids.ClientID {
	var out []ids.ClientID
	for c, d := range f.deadlines {
		if !now.Before(d) {
			out = append(out, c)
		}
	}
	slices.SortFunc(out, func(a, b ids.ClientID) int {
		if da, db := f.deadlines[a], f.deadlines[b]; da != db {
			if da < db {
				return -1
			}
			return 1
		}
		if a < b {
			return -1
		}
		return 1
	})
	for _, c := range out {
		delete(f.deadlines, c)
	}
	f.stats.Expired += uint64(len(out))
	return out
}

// NextDeadline returns the earliest deadline, and false if the set is empty
// (the server then needs no timer at all).
func (f *FailingSet) NextDeadline() (clock.Time, bool) {
	var next clock.Time
	ok := false
	for _, d := range f.deadlines {
		if !ok || d.Before(next) {
			next, ok = d, true
		}
	}
	return next, ok
}

// Remaining returns how long client has left before it expires, for admin
// display; false if it is not failing.
func (f *FailingSet) Remaining(client ids.ClientID, now clock.Time) (time.Duration, bool) {
	d, ok := f.deadlines[client]
	if !ok {
		return 0, false
	}
	if !now.Before(d) {
		return 0, true
	}
	return d.Sub(now), true
}

// Clients returns the failing clients in ascending id order (admin display).
func (f *FailingSet) Clients() []ids.ClientID {
	out := make([]ids.ClientID, 0, len(f.deadlines))
	for c := range f.deadlines {
		out = append(out, c)
	}
	slices.Sort(out)
	return out
}

// Len returns the number of failing clients.
func (f *FailingSet) Len() int { return len(f.deadlines) }

// Stats returns the counters.
func (f *FailingSet) Stats() FailingStats { return f.stats }

// Grace is a restarted server's grace period: it knows no sessions, so some
// client may still trust a lock the previous incarnation granted until τ of
// that client's clock after the crash; the server grants no lock (other than
// reclaims) until start+τ(1+δ) of its own clock.
type Grace struct {
	until clock.Time
}

// NewGrace returns the grace period of a server that started at start.
func NewGrace(cfg Config, start clock.Time) Grace {
	return Grace{until: start.Add(cfg.FailTimeout())}
}

// Active reports whether the grace period still runs at now.
func (g Grace) Active(now clock.Time) bool { return now.Before(g.until) }

// Until returns the end of the grace period.
func (g Grace) Until() clock.Time { return g.until }

// Remaining returns how long the grace period still runs at now.
func (g Grace) Remaining(now clock.Time) time.Duration {
	if !g.Active(now) {
		return 0
	}
	return g.until.Sub(now)
}
