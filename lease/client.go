package lease

import (
	"fmt"
	"time"

	"github.com/leasefs/leasefs/internal/clock"
)

// Client is a client's lease with one server. It is not safe for concurrent
// use: one goroutine of the client shell owns it.
//
// Every request the client initiates renews the lease when its application
// reply (any reply but a NACK) arrives: opportunistic renewal. An explicit
// renewal is needed only when the client holds state at the server and no
// request was acknowledged recently (NeedsRenewal).
type Client struct {
	cfg     Config
	expiry  clock.Time // lease valid while now < expiry; zero: never acked
	nacked  bool
	nackAt  clock.Time // replies to requests sent at or before this are void
	stats   ClientStats
	renewAt clock.Time // when the last explicit renewal was sent
	// lapseSeen is the expiry whose lapse was last counted.
	lapseSeen clock.Time
}

// ClientStats counts what the client sent.
type ClientStats struct {
	Requests       uint64 `json:"requests"` // every request sent, renewals included
	Renewals       uint64 `json:"renewals"` // explicit renewals among them
	Acks           uint64 `json:"acks"`
	Nacks          uint64 `json:"nacks"`
	StaleAcks      uint64 `json:"stale_acks"`      // replies to requests sent before a NACK, ignored
	LapsesObserved uint64 `json:"lapses_observed"` // NeedsRenewal found the lease already expired
}

// NewClient returns a lease that is not yet valid: the first acknowledged
// request (normally opening the session) starts it. It panics on an invalid
// config, which the caller should have validated.
func NewClient(cfg Config) *Client {
	if err := cfg.Validate(); err != nil {
		panic(fmt.Sprintf("lease: NewClient: %v", err))
	}
	return &Client{cfg: cfg}
}

// Config returns the lease parameters.
func (c *Client) Config() Config { return c.cfg }

// Sent records that a request was sent at now (explicit reports whether it is
// an explicit renewal). It only counts; the caller keeps the send time to pass
// to Acked.
func (c *Client) Sent(now clock.Time, explicit bool) {
	c.stats.Requests++
	if explicit {
		c.stats.Renewals++
		c.renewAt = now
	}
}

// Acked records an application reply to a request the client sent at its
// local time sendTime, received at now. The lease then runs until
// sendTime+τ; it is never shortened.
//
// The lease starts at send time, not receive time (Burns et al. 2001, §3):
// the server generated the reply after sendTime, so it had not yet failed the
// client then, and it waits τ(1+δ) of its own clock after failing before it
// steals. Counting from receipt would stretch the lease by the reply's delay,
// which is unbounded (a lost-and-retransmitted or long-queued reply, a client
// frozen with the reply in its socket buffer).
func (c *Client) Acked(sendTime, now clock.Time) {
	if sendTime.After(now) {
		panic(fmt.Sprintf("lease: Acked: request sent at %d after reply received at %d", sendTime, now))
	}
	if c.nacked && !sendTime.After(c.nackAt) {
		// A reply to a request of the session that was NACKed, overtaken
		// by the NACK: the client has already dropped that state.
		c.stats.StaleAcks++
		return
	}
	c.stats.Acks++
	c.nacked = false
	if e := sendTime.Add(c.cfg.Tau); e.After(c.expiry) {
		c.expiry = e
	}
}

// Nacked records a NACK received at now: the lease is void at once and every
// cached state and lock at this server must be dropped. Replies to requests
// sent up to now no longer renew the lease; the next request sent after now
// (normally opening a new session) starts it again.
func (c *Client) Nacked(now clock.Time) {
	c.stats.Nacks++
	c.nacked = true
	if now.After(c.nackAt) {
		c.nackAt = now
	}
	c.expiry = 0
}

// Valid reports whether the client may trust its cached state and locks at
// this server at its local time now.
func (c *Client) Valid(now clock.Time) bool {
	return !c.nacked && !c.expiry.IsZero() && now.Before(c.expiry)
}

// Expiry returns the local time at which the lease lapses (zero if it has
// never been acknowledged or was NACKed).
func (c *Client) Expiry() clock.Time { return c.expiry }

// RenewAt returns when a client holding state should send an explicit
// renewal: RenewMargin before expiry. The shell arms its timer there and calls
// NeedsRenewal. Zero if there is no lease to renew.
func (c *Client) RenewAt() clock.Time {
	if c.expiry.IsZero() {
		return 0
	}
	return c.expiry.Add(-c.cfg.RenewMargin)
}

// NeedsRenewal reports whether the client should send an explicit renewal at
// now: only when it holds cached state or locks at this server (holdsState),
// has a lease that was not NACKed, and the lease lapses within RenewMargin.
// A renewal sent within the last RenewMargin/2 is given time to be answered
// before another is asked for; a lease already lapsed still asks, since the
// client wants to learn whether its state survived.
func (c *Client) NeedsRenewal(now clock.Time, holdsState bool) bool {
	if !holdsState || c.nacked || c.expiry.IsZero() {
		return false
	}
	if now.Before(c.expiry.Add(-c.cfg.RenewMargin)) {
		return false
	}
	if !c.renewAt.IsZero() && now.Sub(c.renewAt) < c.cfg.RenewMargin/2 && !now.Before(c.renewAt) {
		return false
	}
	if !now.Before(c.expiry) && c.lapseSeen != c.expiry {
		c.stats.LapsesObserved++ // once per lapse, however often asked
		c.lapseSeen = c.expiry
	}
	return true
}

// Remaining returns how long the lease still runs at now (zero if lapsed).
func (c *Client) Remaining(now clock.Time) time.Duration {
	if !c.Valid(now) {
		return 0
	}
	return c.expiry.Sub(now)
}

// Stats returns the counters.
func (c *Client) Stats() ClientStats { return c.stats }
