package paxosnode

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/leasefs/leasefs/internal/clock"
	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/lease/paxos"
	"github.com/leasefs/leasefs/transport"
)

// ErrConfig: the configuration is invalid.
var ErrConfig = errors.New("paxosnode: invalid config")

// Config configures a Node. DefaultConfig fills in DESIGN.md's defaults.
type Config struct {
	// ID is this server; Peers maps every server of the cluster, ID
	// included, to its "host:port". ID's own address is not dialled.
	ID    ids.ServerID
	Peers map[ids.ServerID]string
	// Dir is the server's data directory; the boot counter lives in
	// Dir/BootFile.
	Dir string
	// MinEpoch is the highest epoch this server has persisted (in its
	// records); the first ballot exceeds it.
	MinEpoch ids.Epoch
	// Identity is the cluster's (all servers share one): its token to
	// reach the others, and its key to prove to them that this is a
	// server of the cluster (transport.Identity.PeerKey), which clients,
	// holding the token only, cannot.
	Identity *transport.Identity

	// LeaseTime is T, Drift δ (see paxos.Config).
	LeaseTime time.Duration
	Drift     float64
	// MaxDelay is the delivery bound learners assume (redirects only; see
	// paxos.Config). Zero: T/20.
	MaxDelay time.Duration
	// RetryBackoff is the pause after a failed attempt. Zero: T/20.
	RetryBackoff time.Duration
	// Quarantine is how long a started node takes part in nothing. Zero:
	// T(1+δ), the least that is safe.
	Quarantine time.Duration
	// IdleRelease: a held lease not used (Acquire, Touch) for this long is
	// released. Zero: 4T.
	IdleRelease time.Duration
	// SendTimeout bounds one send of PaxosLease messages to a peer; the
	// next batch to that peer waits for it. Zero: T/4.
	SendTimeout time.Duration

	// Faults, if set, injects faults on this server's outgoing peer links
	// (tests; pass the same Faults to the transport server to cut both
	// directions).
	Faults *transport.Faults
	Logger *slog.Logger
	// Clock is the node's monotonic clock; nil means clock.Real.
	Clock clock.Clock

	// dial, if set, connects this server (from) to the peer at addr
	// instead of a transport.Client (tests: an in-memory network, so that
	// a cluster runs in a testing/synctest bubble); unexported, never set
	// otherwise.
	dial func(from ids.ServerID, addr string, cfg transport.ClientConfig) peerConn

	// unsafe breaks the core on purpose, so that the tests can show their
	// checker catches it (test the tester); unexported, never set otherwise.
	unsafe paxos.Unsafe
}

// DefaultConfig returns DESIGN.md's defaults (T = 2 s, δ = 0.05) for server
// id of the cluster peers, keeping its boot counter in dir.
func DefaultConfig(id ids.ServerID, peers map[ids.ServerID]string, dir string, identity *transport.Identity) Config {
	return Config{
		ID:        id,
		Peers:     peers,
		Dir:       dir,
		Identity:  identity,
		LeaseTime: 2 * time.Second,
		Drift:     0.05,
	}
}

// withDefaults fills in zero durations from LeaseTime.
func (c Config) withDefaults() Config {
	if c.MaxDelay == 0 {
		c.MaxDelay = c.LeaseTime / 20
	}
	if c.RetryBackoff == 0 {
		c.RetryBackoff = c.LeaseTime / 20
	}
	if c.Quarantine == 0 {
		c.Quarantine = time.Duration(float64(c.LeaseTime)*(1+c.Drift)) + 1
	}
	if c.IdleRelease == 0 {
		c.IdleRelease = 4 * c.LeaseTime
	}
	if c.SendTimeout == 0 {
		c.SendTimeout = c.LeaseTime / 4
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Clock == nil {
		c.Clock = clock.Real{}
	}
	return c
}

// serverIDs returns the ids of Peers in ascending order.
func (c *Config) serverIDs() []ids.ServerID {
	out := make([]ids.ServerID, 0, len(c.Peers))
	for id := range c.Peers {
		out = append(out, id)
	}
	slices.Sort(out)
	return out
}

func (c *Config) paxosConfig(boot uint16) paxos.Config {
	return paxos.Config{
		ID:           c.ID,
		Peers:        c.serverIDs(),
		Boot:         boot,
		MinEpoch:     c.MinEpoch,
		LeaseTime:    c.LeaseTime,
		Drift:        c.Drift,
		MaxDelay:     c.MaxDelay,
		Quarantine:   c.Quarantine,
		RetryBackoff: c.RetryBackoff,
		Unsafe:       c.unsafe,
	}
}

// Validate checks the fields (after defaults) and how they relate.
func (c Config) Validate() error {
	c = c.withDefaults()
	bad := func(f string, a ...any) error { return fmt.Errorf("%w: "+f, append([]any{ErrConfig}, a...)...) }
	switch {
	case c.ID == 0:
		return bad("server id 0 is reserved")
	case len(c.Peers) == 0:
		return bad("no peers")
	case c.Dir == "":
		return bad("no data directory")
	case c.Identity == nil:
		return bad("no cluster identity")
	case c.SendTimeout <= 0 || c.SendTimeout > c.LeaseTime:
		return bad("send timeout %v outside (0, T=%v]", c.SendTimeout, c.LeaseTime)
	case c.IdleRelease < c.LeaseTime:
		return bad("idle release %v shorter than T=%v: leases would churn", c.IdleRelease, c.LeaseTime)
	}
	if _, ok := c.Peers[c.ID]; !ok {
		return bad("peers %v do not include this server %v", c.serverIDs(), c.ID)
	}
	addrs := map[string]ids.ServerID{}
	for id, addr := range c.Peers {
		if id == 0 {
			return bad("server id 0 in peers")
		}
		if id == c.ID {
			continue
		}
		if addr == "" {
			return bad("no address for %v", id)
		}
		if other, dup := addrs[addr]; dup {
			return bad("%v and %v share address %s", other, id, addr)
		}
		addrs[addr] = id
	}
	pc := c.paxosConfig(1)
	if err := pc.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrConfig, err)
	}
	return nil
}
