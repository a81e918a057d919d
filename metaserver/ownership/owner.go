package ownership

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/leasefs/leasefs/internal/clock"
	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/metaserver/paxosnode"
	"github.com/leasefs/leasefs/metaserver/replica"
	"github.com/leasefs/leasefs/transport"
	"github.com/leasefs/leasefs/wire"
)

// Stats are a cluster server's replication and ownership counters.
type Stats struct {
	Recoveries     int64 `json:"recoveries"`      // fresh acquires recovered from a majority
	GracesStarted  int64 `json:"graces_started"`  // recoveries without a clean hand-over
	HandoversAsked int64 `json:"handovers_asked"` // inodes this server asked another for
	HandoversGiven int64 `json:"handovers_given"` // inodes it handed over
	HandoverMaxMs  int64 `json:"handover_max_ms"` // longest hand-over served here
	Redirects      int64 `json:"redirects"`       // requests sent on to the inode's owner
	Replicated     int64 `json:"replicated"`      // changes acknowledged by a majority
	ReplCalls      int64 `json:"repl_calls"`      // calls that carried changes to a replica (several per call when busy)
	AllocAhead     int64 `json:"alloc_ahead"`     // new inodes this server owned before it allocated them
	ReplFailed     int64 `json:"repl_failed"`     // changes that did not reach a majority
	StatePushes    int64 `json:"state_pushes"`    // inode states sent to lagging replicas
	StaleRejected  int64 `json:"stale_rejected"`  // our changes a replica fenced off
	LostWithLocks  int64 `json:"lost_with_locks"` // leases lapsed while clients held locks
	AntiEntropy    int64 `json:"anti_entropy"`    // anti-entropy rounds completed
	CaughtUp       int64 `json:"caught_up"`       // inodes fetched by anti-entropy
}

type statCounters struct {
	recoveries, graces, handoversAsked, handoversGiven, handoverMaxMs atomic.Int64
	replicated, replFailed, statePushes, staleRejected, lostWithLocks atomic.Int64
	antiEntropy, caughtUp, replCalls, allocAhead, redirects           atomic.Int64
}

type peerHealth struct {
	lastOK   time.Time
	lastFail time.Time
}

// Config configures an Owner: the server's.
type Config struct {
	ServerID        ids.ServerID
	Peers           map[ids.ServerID]string // every server of the cluster, this one included
	Dir             string                  // the data directory (the PaxosLease boot counter)
	OwnershipLease  time.Duration           // PaxosLease period T
	ClientLease     time.Duration           // τ
	ClockDrift      float64                 // δ
	DeliveryTimeout time.Duration
	IdleRelease     time.Duration
	AntiEntropy     time.Duration // how often replicas compare themselves with their peers
	Faults          *transport.Faults
	PeerFaults      *transport.Faults // faults on the links to the other servers only (tests)
	Logger          *slog.Logger
	// Clock is the lock manager's clock, on which graces end; the owner
	// times its waits and peer calls on it and gives it to its PaxosLease
	// node. Nil is clock.Real.
	Clock clock.Clock
	// BeforeFetch, if set, is called before anti-entropy copies ino from
	// peer p (tests: hold a copy back to force an interleaving).
	BeforeFetch func(p ids.ServerID, ino ids.Ino)
}

// Locks is the server's client lock manager, as far as ownership needs it.
type Locks interface {
	// Holders returns the clients that hold a data lock on ino.
	Holders(ino ids.Ino) []ids.ClientID
	// Held returns every inode with data locks held, and their holders.
	Held() map[ids.Ino][]ids.ClientID
	// Fail fails client c (it gets NACKs; its locks are stolen later).
	Fail(c ids.ClientID, why string)
	// Exclude takes an exclusive lock on ino for c, revoking every other
	// client's; release gives it up.
	Exclude(ctx context.Context, c ids.ClientID, ino ids.Ino) (release func(), err error)
	// Grace grants no client lock on ino before until, on the Clock
	// (the grace after an unclean takeover).
	Grace(ino ids.Ino, until clock.Time)
	// GraceUntil reports whether ino's grace runs, and until when.
	GraceUntil(ino ids.Ino) (clock.Time, bool)
	// EndGrace ends ino's grace: the inode left this server.
	EndGrace(ino ids.Ino)
}

// Owner is a server's cluster mode; nil on a single server.
type Owner struct {
	cfg    Config
	repl   *replica.Replica // set by Start
	locks  Locks            // set by Start
	log    *slog.Logger
	self   ids.ServerID
	others []ids.ServerID
	size   int
	node   atomic.Pointer[paxosnode.Node]

	clk        clock.Clock   // the lock manager's
	started    clock.Time    // when New ran, as the server started
	lease      time.Duration // T
	graceTime  time.Duration // τ(1+δ)
	callWait   time.Duration // one peer call
	acquireFor time.Duration // how long own keeps trying
	acquireTry time.Duration // how long one PaxosLease acquire may take

	owning inoMutexes // serialises acquire+recover of one inode, and its hand-over
	// pinCollector pins CollectorIno once this server first owns it
	pinCollector sync.Once
	aheadTo      ids.Ino // inode numbers below it are acquired ahead (under mu)
	allocated    ids.Ino // the greatest inode number allocated (under mu)

	mu        sync.Mutex
	recovered map[ids.Ino]ids.Epoch // inodes recovered under the epoch we own them by
	// unsure: inodes whose last change did not reach a majority, with the
	// epoch we own them by; recovering them under the same epoch needs
	// no grace (our clients' locks never left this server)
	unsure map[ids.Ino]ids.Epoch
	pinned map[ids.Ino]bool
	health map[ids.ServerID]*peerHealth
	lanes  map[ids.ServerID]*peerLane // set at start, read-only

	stats  statCounters
	pushes pushFlights // copies of inodes' states to replicas under way
	stop   chan struct{}
	wg     sync.WaitGroup
}

func errUnavailable(format string, a ...any) error {
	return wire.Errf(wire.CodeUnavailable, format, a...)
}

// New returns the owner logic of a cluster server; Start starts it.
func New(cfg Config) *Owner {
	c := &Owner{cfg: cfg, log: cfg.Logger, pushes: pushFlights{m: map[pushKey]*push{}}, self: cfg.ServerID, size: len(cfg.Peers),
		lease: cfg.OwnershipLease, clk: cfg.Clock,
		graceTime: time.Duration(float64(cfg.ClientLease)*(1+cfg.ClockDrift)) + time.Millisecond,
		recovered: map[ids.Ino]ids.Epoch{}, unsure: map[ids.Ino]ids.Epoch{},
		pinned: map[ids.Ino]bool{}, health: map[ids.ServerID]*peerHealth{}, lanes: map[ids.ServerID]*peerLane{}, stop: make(chan struct{})}
	if c.clk == nil {
		c.clk = clock.Real{}
	}
	c.started = c.clk.Now()
	for id := range cfg.Peers {
		if id != c.self {
			c.others = append(c.others, id)
			c.health[id] = &peerHealth{}
			c.lanes[id] = newPeerLane(c.clk, func(ctx context.Context, body []byte) (bool, error) {
				return c.applyAt(ctx, c.node.Load(), id, body)
			})
		}
	}
	slices.Sort(c.others)
	c.callWait = max(c.lease, time.Second)
	// a lapsed owner's lease runs out within T(1+δ); then recovery and a
	// hand-over of a busy inode (revocations: delivery timeout, or a
	// failed client's τ(1+δ))
	c.acquireFor = 2*c.lease + c.graceTime + cfg.DeliveryTimeout + time.Second
	// acceptors that promised a lapsed owner answer within its lease,
	// T(1+δ); longer means no majority answers at all
	c.acquireTry = c.lease*3/2 + 100*time.Millisecond
	return c
}

// Start starts the PaxosLease node once the transport listens, over the
// server's replica and lock manager.
func (c *Owner) Start(id *transport.Identity, r *replica.Replica, lk Locks, minEpoch ids.Epoch) error {
	cfg := c.cfg
	c.repl, c.locks = r, lk
	ncfg := paxosnode.DefaultConfig(cfg.ServerID, cfg.Peers, cfg.Dir, id)
	ncfg.LeaseTime = cfg.OwnershipLease
	ncfg.Drift = cfg.ClockDrift
	ncfg.MinEpoch = minEpoch
	ncfg.IdleRelease = cfg.IdleRelease
	ncfg.Faults = cfg.Faults
	if cfg.PeerFaults != nil {
		ncfg.Faults = cfg.PeerFaults
	}
	ncfg.Logger = cfg.Logger
	ncfg.Clock = c.clk
	n, err := paxosnode.New(ncfg)
	if err != nil {
		return fmt.Errorf("ownership: %w", err)
	}
	n.OnLost(c.onLost)
	p := n.Peers()
	p.Handle(callApply, c.handleApply)
	p.Handle(callReplState, c.handleReplState)
	p.Handle(callState, c.handleState)
	p.Handle(callReplace, c.handleReplace)
	p.Handle(callRestamp, c.handleRestamp)
	p.Handle(callHandover, c.handleHandover)
	p.Handle(callDigest, c.handleDigest)
	p.Handle(callLockFree, c.handleLockFree) // cluster_grace.go
	c.node.Store(n)
	c.wg.Add(2)
	go c.pinLoop()
	go c.antiEntropyLoop()
	c.log.Info("cluster mode", "server_id", cfg.ServerID, "peers", cfg.Peers, "ownership_lease", cfg.OwnershipLease,
		"boot", n.Boot(), "min_epoch", minEpoch)
	return nil
}

// Close stops the loops and the node, like a crash (shutdown: leases
// handed over first).
func (c *Owner) Close(ctx context.Context, graceful bool) {
	select {
	case <-c.stop:
		return
	default:
	}
	close(c.stop)
	if n := c.node.Load(); n != nil {
		if graceful {
			_ = n.Shutdown(ctx)
		} else {
			_ = n.Close()
		}
	}
	c.wg.Wait()
}

// HandlePeer routes a peer frame to the node.
func (c *Owner) HandlePeer(ctx context.Context, tr *transport.Request) []byte {
	n := c.node.Load()
	if n == nil {
		return append([]byte{paxosnode.PeerMagic, 1}, "server starting"...)
	}
	if f := c.cfg.PeerFaults; f != nil && f.Spec().Cut {
		// cut off: the asker learns nothing (an answer at once rather
		// than none, so that waiting handlers do not use up the
		// connection's streams)
		return append([]byte{paxosnode.PeerMagic, 1}, "cut off from the other servers (fault injection)"...)
	}
	return n.HandlePeer(ctx, tr)
}

// ready reports whether this server owns ino now, recovered under the
// current epoch.
func (c *Owner) ready(n *paxosnode.Node, ino ids.Ino) (ids.Epoch, bool) {
	ep, ok := n.Owns(ino)
	if !ok {
		return 0, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return ep, c.recovered[ino] == ep
}

// Redirect answers a request for an inode another server owns (as this one
// learnt) with that owner, unless the client asks to be served here anyway.
// An inode nobody owns is taken over, as is every further inode of a
// multi-inode operation (with a hand-over if need be).
func (c *Owner) Redirect(r *wire.Request) *wire.Reply {
	if r.NoRedirect || !r.Op.Owned() {
		return nil
	}
	c.mu.Lock()
	_, mine := c.recovered[r.Home()]
	c.mu.Unlock()
	if mine {
		return nil // the usual case, without a round trip to the node's loop
	}
	n := c.node.Load()
	if n == nil {
		return nil
	}
	owner, ok := n.Owner(r.Home())
	if !ok || owner == c.self {
		return nil
	}
	c.stats.redirects.Add(1)
	return &wire.Reply{Code: wire.CodeRedirect, Msg: fmt.Sprintf("%v is owned by server %d", r.Home(), owner), Owner: owner}
}

// OwnerEpoch is the store's OwnerEpoch: a change to ino commits only while
// this server is its recovered owner.
func (c *Owner) OwnerEpoch(ino ids.Ino) (ids.Epoch, error) {
	n := c.node.Load()
	if n == nil {
		return 0, errUnavailable("server starting")
	}
	ep, ok := c.ready(n, ino)
	if !ok {
		return 0, errUnavailable("%v is not owned by %v", ino, c.self)
	}
	return ep, nil
}

// peerResult is one peer's answer in a fan-out.
type peerResult struct {
	id  ids.ServerID
	rep []byte
	err error
}

// fanOut calls fn for every other server concurrently and returns a channel
// of their results (buffered: stragglers never block).
func (c *Owner) fanOut(ctx context.Context, fn func(ctx context.Context, p ids.ServerID) ([]byte, error)) <-chan peerResult {
	ch := make(chan peerResult, len(c.others))
	for _, p := range c.others {
		go func() {
			rep, err := fn(ctx, p)
			ch <- peerResult{p, rep, err}
		}()
	}
	return ch
}

// call is one peer call that records the peer's health.
func (c *Owner) call(ctx context.Context, n *paxosnode.Node, p ids.ServerID, kind byte, body []byte) ([]byte, error) {
	rep, err := n.Peers().Call(ctx, p, kind, body)
	c.noteCall(p, err)
	return rep, err
}

func (c *Owner) noteCall(p ids.ServerID, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	h := c.health[p]
	if h == nil {
		return
	}
	if err == nil {
		h.lastOK = time.Now()
	} else {
		h.lastFail = time.Now()
	}
}

// down reports whether p failed its last call within the last lease: not
// waited for when enough others are up (anti-entropy catches it up).
func (c *Owner) down(p ids.ServerID) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	h := c.health[p]
	return h != nil && h.lastFail.After(h.lastOK) && time.Since(h.lastFail) < c.lease
}

func (c *Owner) majority() int { return c.size/2 + 1 }

// Stats returns the counters.
func (c *Owner) Stats() Stats {
	s := &c.stats
	return Stats{Recoveries: s.recoveries.Load(), GracesStarted: s.graces.Load(),
		HandoversAsked: s.handoversAsked.Load(), HandoversGiven: s.handoversGiven.Load(),
		HandoverMaxMs: s.handoverMaxMs.Load(), Redirects: s.redirects.Load(), Replicated: s.replicated.Load(), ReplFailed: s.replFailed.Load(),
		StatePushes: s.statePushes.Load(), StaleRejected: s.staleRejected.Load(),
		LostWithLocks: s.lostWithLocks.Load(), AntiEntropy: s.antiEntropy.Load(), CaughtUp: s.caughtUp.Load(),
		ReplCalls: s.replCalls.Load(), AllocAhead: s.allocAhead.Load()}
}

// Owned lists the inodes this server owns, but those acquired ahead of
// their allocation (no inode yet).
func (c *Owner) Owned() []paxosnode.Owned {
	n := c.node.Load()
	if n == nil {
		return nil
	}
	c.mu.Lock()
	allocated, aheadTo := c.allocated, c.aheadTo
	c.mu.Unlock()
	owned := n.Owned()
	return slices.DeleteFunc(owned, func(o paxosnode.Owned) bool { return allocated < o.Ino && o.Ino < aheadTo })
}

// GiveUpAfter is how long a request waits to own an inode before it gives
// up (a lapsed owner's lease, a recovery and a hand-over of a busy inode).
func (c *Owner) GiveUpAfter() time.Duration { return c.acquireFor }

// Quarantined reports whether the server still sits out PaxosLease after
// its start.
func (c *Owner) Quarantined() bool {
	n := c.node.Load()
	return n == nil || n.Quarantined()
}

// PeerStatus is one other server of the cluster. Reachable: its last peer
// call succeeded.
type PeerStatus struct {
	ID        ids.ServerID `json:"id"`
	Addr      string       `json:"addr"`
	Reachable bool         `json:"reachable"`
	LastOK    time.Time    `json:"last_ok,omitzero"`
}

// PeerStatus reports the other servers and whether their last call
// succeeded.
func (c *Owner) PeerStatus() []PeerStatus {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]PeerStatus, 0, len(c.others))
	for _, p := range c.others {
		h := c.health[p]
		out = append(out, PeerStatus{ID: p, Addr: c.cfg.Peers[p], Reachable: !h.lastOK.IsZero() && !h.lastFail.After(h.lastOK),
			LastOK: h.lastOK})
	}
	return out
}
