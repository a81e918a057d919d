package paxos

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/leasefs/leasefs/internal/ids"
)

var (
	ErrConfig = errors.New("paxos: invalid config")
)

// Config parameterises a Node. All durations are on the node's own monotonic
// clock.
type Config struct {
	// ID is this node; Peers lists every node of the cluster, ID included.
	ID    ids.ServerID
	Peers []ids.ServerID
	// Boot is this node's boot counter, persisted and incremented by the
	// caller on every start (at most MaxBoot). It makes ballots unique across
	// restarts.
	Boot uint16
	// MinEpoch is the highest epoch the caller has persisted (for example in
	// replicated records); the first ballot exceeds it, so epochs increase
	// across restarts.
	MinEpoch ids.Epoch

	// LeaseTime is T: how long an acceptor keeps an accepted lease. The owner
	// believes for T/(1+Drift) from sending its Prepare.
	LeaseTime time.Duration
	// Drift is δ: for any two nodes and any interval, the durations their
	// clocks measure differ by at most a factor 1+δ.
	Drift float64
	// MaxDelay bounds message delivery for learners only (they re-anchor an
	// owner's remaining time on arrival). Safety of ownership never depends
	// on it.
	MaxDelay time.Duration
	// Quarantine is how long a (re)started node takes part in nothing. It
	// must cover the proposer's lease in real time: at least T(1+δ).
	Quarantine time.Duration
	// RetryBackoff is the pause after a failed attempt before the next one.
	RetryBackoff time.Duration

	// Unsafe breaks the protocol on purpose. TEST ONLY: it exists so that the
	// simulator can show that it catches each bug; production must leave it
	// zero (Validate does not stop you, the simulator tests need it).
	Unsafe Unsafe
}

// Unsafe lists deliberate protocol bugs, one per rule of DESIGN.md's 2026
// audit list. TEST ONLY.
type Unsafe struct {
	CountDuplicates     bool // quorum counted by responses, not distinct acceptors
	DeadlineFromQuorum  bool // attempt deadline and belief anchored at the prepare quorum, not at send
	OwnLeaseAlwaysOpen  bool // a reported lease of our own id is open in any attempt
	AcceptLowerBallot   bool // acceptor accepts a ballot below its promise
	ExtendWithoutQuorum bool // an extension is believed as soon as its Prepare is sent
	ReleaseByAnyone     bool // acceptors drop a lease on any release for the resource
	ShortQuarantine     bool // Validate accepts a quarantine shorter than T(1+δ)
	ReuseBallots        bool // ballots ignore the boot counter and MinEpoch
	NoDriftMargin       bool // the owner believes for T, not T/(1+δ)
	TimerOrder          bool // deadlines enforced only when Tick runs, not checked in handlers or queries
	ReplaceLiveLease    bool // acceptor replaces a live accepted lease of another owner
}

// DefaultConfig returns DESIGN.md's defaults for node id among peers.
func DefaultConfig(id ids.ServerID, peers []ids.ServerID, boot uint16) Config {
	c := Config{
		ID:           id,
		Peers:        peers,
		Boot:         boot,
		LeaseTime:    2 * time.Second,
		Drift:        0.05,
		MaxDelay:     100 * time.Millisecond,
		RetryBackoff: 100 * time.Millisecond,
	}
	c.Quarantine = c.MinQuarantine()
	return c
}

// MinQuarantine is T(1+δ), rounded up.
func (c *Config) MinQuarantine() time.Duration {
	return time.Duration(float64(c.LeaseTime)*(1+c.Drift)) + 1
}

// OwnerLease is how long an owner believes after sending its Prepare:
// T/(1+δ). Acceptors start T on accept, which happens after that send, and
// any clock measures T as at least T/(1+δ) of another's, so every acceptor of
// the quorum still holds the lease when the owner stops believing.
func (c *Config) OwnerLease() time.Duration {
	if c.Unsafe.NoDriftMargin {
		return c.LeaseTime
	}
	return time.Duration(float64(c.LeaseTime) / (1 + c.Drift))
}

// Validate checks the fields and how they relate.
func (c *Config) Validate() error {
	bad := func(f string, a ...any) error { return fmt.Errorf("%w: "+f, append([]any{ErrConfig}, a...)...) }
	switch {
	case c.ID == 0:
		return bad("id 0 is reserved for \"no owner\"")
	case len(c.Peers) == 0 || len(c.Peers) > 255:
		return bad("%d peers", len(c.Peers))
	case !slices.Contains(c.Peers, c.ID):
		return bad("peers %v do not include id %v", c.Peers, c.ID)
	case c.Boot > MaxBoot:
		return bad("boot %d > %d", c.Boot, MaxBoot)
	case c.LeaseTime <= 0:
		return bad("lease time %v", c.LeaseTime)
	case c.Drift < 0 || c.Drift >= 1:
		return bad("drift %v outside [0,1)", c.Drift)
	case c.MaxDelay < 0 || c.MaxDelay*4 > c.OwnerLease():
		return bad("max delay %v must be at most a quarter of the owner lease %v", c.MaxDelay, c.OwnerLease())
	case c.Quarantine < c.MinQuarantine() && !c.Unsafe.ShortQuarantine:
		return bad("quarantine %v shorter than T(1+δ) = %v", c.Quarantine, c.MinQuarantine())
	case c.RetryBackoff <= 0 || c.RetryBackoff > c.LeaseTime:
		return bad("retry backoff %v outside (0, T]", c.RetryBackoff)
	}
	seen := map[ids.ServerID]bool{}
	for _, p := range c.Peers {
		if p == 0 || seen[p] {
			return bad("peer %v zero or repeated", p)
		}
		seen[p] = true
	}
	return nil
}
