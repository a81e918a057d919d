package ownership

// Cluster mode (DESIGN.md, "Servers, ownership and replication"): per-inode
// ownership by PaxosLease (package cluster), recovery of an inode's state
// from a majority on a fresh acquire, replication of every change to a
// majority before the reply, hand-over of inodes between servers, and
// anti-entropy for servers that were down or cut off.
//
// # Request path
//
// underLocks (ops.go) first makes this server the recovered owner of every
// inode an operation touches, in ascending inode order (own), holding no
// client lock meanwhile: a server asked to hand an inode over must be able
// to revoke its clients' locks. Then it takes the client locks and checks
// ownership once more: an inode handed over while the operation waited for
// its lock is owned again from the start. The store is opened with
// OwnerEpoch (ownerEpoch: a change commits only while this server owns
// every inode it writes, recovered under the current epoch) and Replicate
// (replicate: the change reaches a majority, this server's synced store
// included, before the operation returns).
//
// # Safety
//
//   - Fencing: every replica rejects records of an older epoch than one it
//     has seen for the inode (store_repl.go); a recovered owner has written
//     its epoch to a majority before it serves, so a deposed owner can never
//     again reach a majority.
//   - A fresh owner that did not get the inode by a confirmed hand-over
//     (the previous owner crashed, was cut off, or we cannot tell) grants no
//     client lock on it for τ(1+δ) after its acquire: the old owner's
//     clients may trust their locks until then. Phase 1 has no lock
//     reclaim on the server, so during the grace every lock request on the
//     inode waits (stricter than DESIGN.md's "no conflicting lock except
//     reclaims"); clients reclaim buffered writes after it by their
//     version check (WriteIfVersion).
//   - An inode with client locks is pinned (never released for idleness);
//     if its lease lapses anyway the clients that hold locks on it are
//     failed (NACK), never ACKed again (onLost).
//
// # State transfer
//
// Whole-inode states (a new owner's recovery and write-back, a push to a
// replica that answers with a version gap, anti-entropy) move with
// replica.CopyInode (store_transfer.go): a page of at most transferPage bytes per
// peer call, staged at the receiver and switched in at the end, so inodes
// of any size move, and a crash or a dead sender midway leaves the
// receiver at its previous state.
//
// # Limits (phase 1)
//
//   - Open-but-unlinked files are counted per server.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/lease/paxos"
	"github.com/leasefs/leasefs/metaserver/cluster"
	"github.com/leasefs/leasefs/metaserver/replica"
	"github.com/leasefs/leasefs/metaserver/store"
	"github.com/leasefs/leasefs/transport"
	"github.com/leasefs/leasefs/wire"
)

// ClusterStats are a cluster server's replication and ownership counters.
type ClusterStats struct {
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

type clusterStats struct {
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
	Started         time.Time // when the server started
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
	node   atomic.Pointer[cluster.Node]

	lease      time.Duration // T
	graceTime  time.Duration // τ(1+δ)
	callWait   time.Duration // one peer call
	acquireFor time.Duration // how long own keeps trying
	acquireTry time.Duration // how long one PaxosLease acquire may take

	owning    inoMutexes // serialises acquire+recover of one inode, and its hand-over
	aheadTo   ids.Ino    // inode numbers below it are acquired ahead (under mu)
	allocated ids.Ino    // the greatest inode number allocated (under mu)

	mu        sync.Mutex
	recovered map[ids.Ino]ids.Epoch // inodes recovered under the epoch we own them by
	grace     map[ids.Ino]time.Time // no client lock before this
	// unsure: inodes whose last change did not reach a majority, with the
	// epoch we own them by; recovering them under the same epoch needs
	// no grace (our clients' locks never left this server)
	unsure map[ids.Ino]ids.Epoch
	pinned map[ids.Ino]bool
	health map[ids.ServerID]*peerHealth
	lanes  map[ids.ServerID]*peerLane // set at start, read-only

	stats clusterStats
	stop  chan struct{}
	wg    sync.WaitGroup
}

func errUnavailable(format string, a ...any) error {
	return wire.Errf(wire.CodeUnavailable, format, a...)
}

// New returns the owner logic of a cluster server; Start starts it.
func New(cfg Config) *Owner {
	c := &Owner{cfg: cfg, log: cfg.Logger, self: cfg.ServerID, size: len(cfg.Peers),
		lease:     cfg.OwnershipLease,
		graceTime: time.Duration(float64(cfg.ClientLease)*(1+cfg.ClockDrift)) + time.Millisecond,
		recovered: map[ids.Ino]ids.Epoch{}, grace: map[ids.Ino]time.Time{}, unsure: map[ids.Ino]ids.Epoch{},
		pinned: map[ids.Ino]bool{}, health: map[ids.ServerID]*peerHealth{}, lanes: map[ids.ServerID]*peerLane{}, stop: make(chan struct{})}
	for id := range cfg.Peers {
		if id != c.self {
			c.others = append(c.others, id)
			c.health[id] = &peerHealth{}
			c.lanes[id] = newPeerLane(func(ctx context.Context, body []byte) (bool, error) {
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
	ncfg := cluster.DefaultConfig(cfg.ServerID, cfg.Peers, cfg.Dir, id)
	ncfg.LeaseTime = cfg.OwnershipLease
	ncfg.Drift = cfg.ClockDrift
	ncfg.MinEpoch = minEpoch
	ncfg.IdleRelease = cfg.IdleRelease
	ncfg.Faults = cfg.Faults
	if cfg.PeerFaults != nil {
		ncfg.Faults = cfg.PeerFaults
	}
	ncfg.Logger = cfg.Logger
	n, err := cluster.New(ncfg)
	if err != nil {
		return fmt.Errorf("metaserver: cluster: %w", err)
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
		return append([]byte{cluster.PeerMagic, 1}, "server starting"...)
	}
	if f := c.cfg.PeerFaults; f != nil && f.Spec().Cut {
		// cut off: the asker learns nothing (an answer at once rather
		// than none, so that waiting handlers do not use up the
		// connection's streams)
		return append([]byte{cluster.PeerMagic, 1}, "cut off from the other servers (fault injection)"...)
	}
	return n.HandlePeer(ctx, tr)
}

// ready reports whether this server owns ino now, recovered under the
// current epoch.
func (c *Owner) ready(n *cluster.Node, ino ids.Ino) (ids.Epoch, bool) {
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

// OnAlloc acquires a new inode for the server that creates it: nobody
// else can know the number (server id in its high bits, never reused), so
// there is nothing to recover and no grace. Usually it is held already:
// the next numbers are acquired ahead (acquireAhead).
func (c *Owner) OnAlloc(ino ids.Ino) error {
	n := c.node.Load()
	if n == nil {
		return errUnavailable("server starting")
	}
	defer c.acquireAhead(n, ino)
	c.mu.Lock()
	c.allocated = max(c.allocated, ino)
	c.mu.Unlock()
	// acquired ahead or not, no pin of ino's is left after this
	// (acquireAhead pins only numbers not yet allocated)
	defer n.Unpin(ino)
	if ep, ok := n.Owns(ino); ok {
		c.stats.allocAhead.Add(1)
		c.mu.Lock()
		c.recovered[ino] = ep
		c.mu.Unlock()
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.acquireFor)
	defer cancel()
	ep, err := n.Acquire(ctx, ino)
	var q *cluster.QuarantineError
	for errors.As(err, &q) && sleepCtx(ctx, q.Left) {
		ep, err = n.Acquire(ctx, ino)
	}
	if err != nil {
		return c.acquireErr(ino, err)
	}
	c.mu.Lock()
	c.recovered[ino] = ep
	c.mu.Unlock()
	return nil
}

// inosAhead is how many of the inode numbers it will allocate next a
// server owns beforehand: a create then waits for no PaxosLease round of
// its own, only for the replication of the change.
const inosAhead = 32

// acquireAhead acquires, in the background, the inode numbers after ino
// (the store allocates them in sequence; nobody else can know them) and
// pins them until they are allocated.
func (c *Owner) acquireAhead(n *cluster.Node, ino ids.Ino) {
	c.mu.Lock()
	from, to := max(ino+1, c.aheadTo), ino+1+inosAhead
	if from < to {
		c.aheadTo = to
	}
	c.mu.Unlock()
	for next := from; next < to; next++ {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), c.acquireFor)
			defer cancel()
			if _, err := n.Acquire(ctx, next); err == nil {
				c.mu.Lock()
				if next > c.allocated {
					n.Pin(next)
				}
				c.mu.Unlock()
			}
		}()
	}
}

func (c *Owner) acquireErr(ino ids.Ino, err error) error {
	var q *cluster.QuarantineError
	if errors.As(err, &q) {
		return errUnavailable("server restarting: sits out PaxosLease for %v more", q.Left.Round(time.Millisecond))
	}
	if errors.Is(err, context.Canceled) {
		return wire.Err(wire.CodeInterrupted)
	}
	return errUnavailable("cannot own %v: %v", ino, err)
}

// OwnAll makes this server the recovered owner of every inode (ascending,
// zero skipped), then waits out their graces.
func (c *Owner) OwnAll(ctx context.Context, inos []ids.Ino) error {
	for i, ino := range inos {
		if ino == 0 || i > 0 && inos[i-1] == ino {
			continue
		}
		if err := c.own(ctx, ino); err != nil {
			return err
		}
	}
	for _, ino := range inos {
		c.mu.Lock()
		until, ok := c.grace[ino]
		if ok && !time.Now().Before(until) {
			delete(c.grace, ino)
			ok = false
		}
		c.mu.Unlock()
		if !ok {
			continue
		}
		t := time.NewTimer(time.Until(until))
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return wire.Err(wire.CodeInterrupted)
		}
	}
	return nil
}

// StillOwned reports whether this server is still the recovered owner of
// every inode (after waiting for client locks).
func (c *Owner) StillOwned(inos []ids.Ino) bool {
	n := c.node.Load()
	for _, ino := range inos {
		if ino == 0 {
			continue
		}
		if _, ok := c.ready(n, ino); !ok {
			return false
		}
	}
	return true
}

// own makes this server the recovered owner of ino: acquire, asking the
// current owner to hand it over, then recover it from a majority.
func (c *Owner) own(ctx context.Context, ino ids.Ino) error {
	n := c.node.Load()
	if n == nil {
		return errUnavailable("server starting")
	}
	if _, ok := c.ready(n, ino); ok {
		n.Touch(ino)
		return nil
	}
	defer c.owning.lock(ino)()
	deadline := time.Now().Add(c.acquireFor)
	octx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	handedOver := false
	// The hand-over call runs beside the acquire attempts: a dead owner
	// never answers, and its lease lapses within T(1+δ).
	var handover chan error
	for {
		if _, ok := c.ready(n, ino); ok {
			n.Touch(ino)
			return nil
		}
		actx, acancel := context.WithTimeout(octx, c.acquireTry)
		ep, err := n.Acquire(actx, ino)
		acancel()
		acquired := time.Now()
		var no *cluster.NotOwnerError
		var q *cluster.QuarantineError
		switch {
		case err == nil:
			return c.recover(ctx, n, ino, ep, handedOver, acquired)
		case errors.As(err, &q):
			// a restarted server sits out at most T(1+δ): wait rather
			// than send the client elsewhere
			sleepCtx(octx, q.Left)
		case errors.As(err, &no) && no.Owner != c.self:
			if handover == nil {
				c.stats.handoversAsked.Add(1)
				handover = make(chan error, 1)
				owner := no.Owner
				go func() { handover <- c.askHandover(octx, n, owner, ino) }()
			}
			t := time.NewTimer(max(c.lease/20, time.Millisecond))
			select {
			case herr := <-handover:
				handover = nil
				if herr == nil {
					handedOver = true
				} else {
					c.log.Debug("hand-over refused or failed", "ino", ino, "owner", no.Owner, "err", herr)
				}
			case <-t.C:
			case <-octx.Done():
			}
			t.Stop()
		case ctx.Err() != nil:
			return wire.Err(wire.CodeInterrupted)
		case octx.Err() == nil && errors.Is(err, context.DeadlineExceeded):
			// no majority answered: this server is cut off (or most of
			// the cluster is down); its client does better elsewhere
			return errUnavailable("cannot own %v: no majority of the servers answered within %v", ino, c.acquireTry)
		default:
			return c.acquireErr(ino, err)
		}
		if octx.Err() != nil {
			if ctx.Err() != nil {
				return wire.Err(wire.CodeInterrupted)
			}
			return errUnavailable("cannot own %v: its owner neither hands it over nor lapses", ino)
		}
	}
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// askHandover asks owner to hand ino over: nil once it released it.
func (c *Owner) askHandover(ctx context.Context, n *cluster.Node, owner ids.ServerID, ino ids.Ino) error {
	e := &enc{}
	e.u64(uint64(ino))
	rep, err := n.Peers().Call(ctx, owner, callHandover, e.b)
	c.noteCall(owner, err)
	if err != nil {
		return err
	}
	_, err = replyErr(rep)
	return err
}

// handleHandover serves another server's request for an inode we own: the
// same revocation path as a conflicting client request (a pseudo client,
// the asking server, takes X, which revokes every client's lock and fails
// clients that do not acknowledge), then the lease is released.
func (c *Owner) handleHandover(ctx context.Context, from ids.ServerID, body []byte) []byte {
	d := &dec{b: body}
	ino := ids.Ino(d.u64())
	if d.err != nil {
		return statusReply(d.err)
	}
	n := c.node.Load()
	if _, ok := n.Owns(ino); !ok {
		return []byte{stNotOwner}
	}
	start := time.Now()
	// Hold the inode's acquire lock: a local request recovering it
	// meanwhile would otherwise race our release.
	defer c.owning.lock(ino)()
	pseudo := cluster.PeerClientID(from)
	hctx, cancel := context.WithTimeout(ctx, c.acquireFor)
	defer cancel()
	release, err := c.locks.Exclude(hctx, pseudo, ino)
	if err != nil {
		return statusReply(fmt.Errorf("hand-over of %v: revoking client locks: %w", ino, err))
	}
	c.mu.Lock()
	delete(c.recovered, ino)
	delete(c.grace, ino)
	delete(c.unsure, ino)
	c.mu.Unlock()
	n.Release(ino)
	release()
	ms := time.Since(start).Milliseconds()
	c.stats.handoversGiven.Add(1)
	for {
		old := c.stats.handoverMaxMs.Load()
		if ms <= old || c.stats.handoverMaxMs.CompareAndSwap(old, ms) {
			break
		}
	}
	c.log.Debug("handed inode over", "ino", ino, "to", from, "took", time.Since(start))
	return []byte{stOK}
}

// inoMutexes is a mutex per inode, made on demand. Not striped: a server
// waiting in own for a peer to hand over inode A holds A's mutex, and the
// peer may at the same moment wait for this server to hand over B; with
// A and B on one stripe (inode numbers of different servers differ only
// in their high bits) neither hand-over could start until both gave up.
type inoMutexes struct {
	mu sync.Mutex
	m  map[ids.Ino]*inoMutex
}

type inoMutex struct {
	sync.Mutex
	users int // holders and waiters
}

// lock locks ino's mutex and returns its unlock.
func (l *inoMutexes) lock(ino ids.Ino) func() {
	l.mu.Lock()
	if l.m == nil {
		l.m = map[ids.Ino]*inoMutex{}
	}
	m := l.m[ino]
	if m == nil {
		m = &inoMutex{}
		l.m[ino] = m
	}
	m.users++
	l.mu.Unlock()
	m.Lock()
	return func() {
		m.Unlock()
		l.mu.Lock()
		if m.users--; m.users == 0 {
			delete(l.m, ino)
		}
		l.mu.Unlock()
	}
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
func (c *Owner) call(ctx context.Context, n *cluster.Node, p ids.ServerID, kind byte, body []byte) ([]byte, error) {
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

type replVersion struct {
	epoch   ids.Epoch
	version uint64
}

func (r replVersion) less(o replVersion) bool {
	return r.epoch < o.epoch || r.epoch == o.epoch && r.version < o.version
}

// recover makes the inode's newest state among a majority this server's,
// stamped with its epoch ep on a majority, before it serves the inode
// (DESIGN.md: the new owner reads the inode from a majority, takes the
// newest, writes it back under its own epoch).
func (c *Owner) recover(ctx context.Context, n *cluster.Node, ino ids.Ino, ep ids.Epoch, handedOver bool, acquired time.Time) error {
	rctx, cancel := context.WithTimeout(ctx, c.callWait)
	defer cancel()
	q := &enc{}
	q.u64(uint64(ino))
	ch := c.fanOut(rctx, func(ctx context.Context, p ids.ServerID) ([]byte, error) {
		return c.call(ctx, n, p, callReplState, q.b)
	})
	le, lv, err := c.repl.ReplicaState(ino)
	if err != nil {
		return err
	}
	states := map[ids.ServerID]replVersion{c.self: {le, lv}}
	best, bestAt := replVersion{le, lv}, c.self
	// Once a majority answered, wait a little for the rest: a replica
	// that holds the newest state already needs only a restamp; a dead one
	// must not hold the recovery up.
	var extra <-chan time.Time
	for answered := 0; answered < len(c.others); {
		var r peerResult
		select {
		case r = <-ch:
			answered++
		case <-extra:
			answered = len(c.others)
			continue
		}
		if r.err != nil {
			continue
		}
		d, err := replyErr(r.rep)
		e, v := ids.Epoch(d.u64()), d.u64()
		if err != nil || d.err != nil {
			continue
		}
		rv := replVersion{e, v}
		states[r.id] = rv
		if best.less(rv) {
			best, bestAt = rv, r.id
		}
		if extra == nil && len(states) >= c.majority() {
			extra = time.After(max(c.lease/20, 5*time.Millisecond))
		}
	}
	if len(states) < c.majority() {
		return errUnavailable("recovering %v: %d of %d servers answered", ino, len(states), c.size)
	}
	if best.epoch > ep {
		// a replica has seen a newer owner: ours is already over
		n.Release(ino)
		return errUnavailable("recovering %v: a newer owner (epoch %v) exists", ino, best.epoch)
	}
	// This server usually holds the newest state already (changes go to
	// every replica): then it only restamps it, whatever the inode's size.
	// Otherwise the state is copied, a page per call, from a replica that
	// has it (from itself at version 0: a server's own unstamped root).
	exists := best.version > 0
	if states[c.self] == best && best.version > 0 {
		done, err := c.repl.RestampInode(ino, best.epoch, best.version, ep)
		if err == nil && !done {
			err = fmt.Errorf("local replica moved from %v/%d during recovery", best.epoch, best.version)
		}
		if err != nil {
			if errors.Is(err, replica.ErrStaleEpoch) {
				n.Release(ino)
			}
			return errUnavailable("recovering %v: %v", ino, err)
		}
	} else {
		var src replica.StateSource = c.repl
		if bestAt != c.self {
			src = peerState{c, n, bestAt}
		}
		start := time.Now()
		// each page keeps the inode in use, so that a long copy does not
		// let the lease go idle
		got, err := replica.CopyInode(ctx, src, c.repl, ino,
			replica.CopyOptions{Epoch: ep, PageBytes: transferPage, OnPage: func() { n.Touch(ino) }})
		if err != nil {
			if errors.Is(err, replica.ErrStaleEpoch) {
				n.Release(ino)
			}
			return errUnavailable("recovering %v: copying its state from %v: %v", ino, bestAt, err)
		}
		// the source may have taken a last change of the previous owner
		// since it answered: write back the state actually copied
		best = replVersion{got.Epoch, got.Version}
		exists = got.Records > 0
		c.log.Debug("copied inode state", "ino", ino, "from", bestAt, "records", got.Records, "bytes", got.Bytes,
			"pages", got.Pages, "attempts", got.Attempts, "took", time.Since(start))
	}
	acks := 1
	// store.Write-backs copy the state a page per call, each call with its own
	// timeout: a big inode takes longer than one call. Recovery waits for
	// every answer (a dead replica's first call times out), so that no
	// copy outlives it.
	res := make(chan error, len(states))
	for p, st := range states {
		if p == c.self {
			continue
		}
		go func() { res <- c.writeBack(ctx, n, p, ino, st, best, ep) }()
	}
	for range len(states) - 1 {
		if err := <-res; err == nil {
			acks++
		} else if errors.Is(err, replica.ErrStaleEpoch) {
			n.Release(ino)
			return errUnavailable("recovering %v: %v", ino, err)
		}
	}
	if acks < c.majority() {
		return errUnavailable("recovering %v: written back to %d of %d servers", ino, acks, c.size)
	}
	c.stats.recoveries.Add(1)
	// No grace if this server, in this run, was the inode's last owner
	// (every owner that served restamped a majority, so the newest epoch
	// of a majority names it): its lock table still holds whatever locks
	// its clients had, failed clients' included, until they are stolen.
	// Nor if the last owner says none of its clients can trust a lock.
	// Nor if the newest state of a majority is unstamped (a fresh
	// cluster's root): no owner ever served the inode, since an owner
	// serves only after stamping a majority.
	selfLast := paxos.BallotServer(best.epoch) == c.self && paxos.BallotBoot(best.epoch) == n.Boot()
	neverServed := best.epoch == 0
	needGrace := !handedOver && !selfLast && !neverServed && exists && !c.previousOwnerReleased(ctx, n, ino, best.epoch)
	c.mu.Lock()
	c.recovered[ino] = ep
	sameOwner := c.unsure[ino] == ep
	delete(c.unsure, ino)
	if needGrace && !sameOwner {
		c.grace[ino] = acquired.Add(c.graceTime)
		c.stats.graces.Add(1)
	}
	c.mu.Unlock()
	c.log.Debug("recovered inode", "ino", ino, "epoch", ep, "from", bestAt, "state", best, "handed_over", handedOver)
	return nil
}

// writeBack stamps the recovered state on replica p: a restamp if it holds
// it already, else the whole state, copied from this server's store (which
// holds it under epoch ep by now).
func (c *Owner) writeBack(ctx context.Context, n *cluster.Node, p ids.ServerID, ino ids.Ino, has, best replVersion, ep ids.Epoch) error {
	if has == best && best.version > 0 {
		e := &enc{}
		e.u64(uint64(ino))
		e.u64(uint64(best.epoch))
		e.u64(best.version)
		e.u64(uint64(ep))
		cctx, cancel := context.WithTimeout(ctx, c.callWait)
		rep, err := c.call(cctx, n, p, callRestamp, e.b)
		cancel()
		if err != nil {
			return err
		}
		d, err := replyErr(rep)
		if err != nil {
			return err
		}
		if d.u8() == 1 {
			return nil
		}
		// it moved on meanwhile: send the state
	}
	return c.replaceAt(ctx, n, p, ino, ep)
}

// replaceAt copies ino's state from this server's store to replica p, a
// page per call, stamped ep (0: the state's own epoch).
//
// Concurrent copies of one inode to one replica join (pushes.join): every
// change that meets the replica's version gap would otherwise start its
// own copy of the whole state, each superseding the last at the replica.
func (c *Owner) replaceAt(ctx context.Context, n *cluster.Node, p ids.ServerID, ino ids.Ino, ep ids.Epoch) error {
	return pushes.join(ctx, pushKey{c, p, ino, ep}, func() error {
		start := time.Now()
		got, err := replica.CopyInode(ctx, c.repl, peerState{c, n, p}, ino, replica.CopyOptions{Epoch: ep, PageBytes: transferPage})
		if err != nil {
			return err
		}
		c.log.Debug("sent inode state", "ino", ino, "to", p, "records", got.Records, "bytes", got.Bytes,
			"pages", got.Pages, "attempts", got.Attempts, "took", time.Since(start))
		return nil
	})
}

// Replicate is the store's Replicate: the change goes to every replica and
// counts once a majority, this server's synced store included, has it.
func (c *Owner) Replicate(writes []store.Write) error {
	changes := replica.SplitByInode(writes)
	if len(changes) == 0 {
		return nil
	}
	n := c.node.Load()
	body := encodeChanges(changes)
	deadline := time.Now().Add(c.callWait)
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	up := 0
	for _, p := range c.others {
		if !c.down(p) {
			up++
		}
	}
	skipDown := up+1 >= c.majority()
	ch := make(chan error, len(c.others))
	sent := 0
	for _, p := range c.others {
		if skipDown && c.down(p) {
			continue
		}
		sent++
		done := c.lanes[p].send(changes, body, deadline)
		go func() {
			select {
			case err := <-done:
				ch <- err
			case <-ctx.Done():
				ch <- ctx.Err()
			}
		}()
	}
	acks := 1 // this replica: the store commits and syncs after us
	var firstErr, noSpace error
	got := 0
	for ; got < sent && acks < c.majority(); got++ {
		err := <-ch
		switch {
		case err == nil:
			acks++
		case firstErr == nil || errors.Is(err, replica.ErrStaleEpoch):
			firstErr = err
		}
		if err != nil && wire.CodeOf(err) == wire.CodeNoSpace {
			noSpace = err
		}
	}
	// stragglers finish in the background, within the call timeout
	go func() {
		for ; got < sent; got++ {
			<-ch
		}
		cancel()
	}()
	if acks >= c.majority() {
		c.stats.replicated.Add(int64(len(changes)))
		return nil
	}
	c.stats.replFailed.Add(int64(len(changes)))
	// Some replicas may hold the change (a lost answer): recover the
	// inodes from a majority before serving them again.
	c.markUnsure(changes)
	var stale *replica.StaleEpochError
	if errors.As(firstErr, &stale) {
		// fenced: a newer owner exists; stop believing at once
		c.stats.staleRejected.Add(1)
		c.mu.Lock()
		delete(c.recovered, stale.Ino)
		c.mu.Unlock()
		n.Release(stale.Ino)
		return errUnavailable("%v has a newer owner", stale.Ino)
	}
	if noSpace != nil {
		// a replica refused it for want of space, and the others do
		// not make a majority: as final as a full disk here (ENOSPC,
		// not "try again", which would have the client resend for ever)
		return wire.Errf(wire.CodeNoSpace, "change reached %d of %d servers: %v", acks, c.size, noSpace)
	}
	return errUnavailable("change reached %d of %d servers: %v", acks, c.size, firstErr)
}

// peerLane sends changes to one peer in the order replicate made them:
// Replicate returns once a majority has a change, so the next change of
// the same inode may start while a slower peer still receives the last;
// out of order, that peer would find a version gap and need the whole
// inode pushed. One call is in flight per lane; the changes queued
// meanwhile go together in the next call, applied by the peer in one
// transaction and one sync (group commit): a lane that sent one change
// per round trip held a server's concurrent clients to one change per
// round trip.
type peerLane struct {
	apply   func(ctx context.Context, body []byte) (answered bool, err error)
	mu      sync.Mutex
	queue   []*laneItem
	sending bool
}

// laneItem is one replicate call's changes for the lane, and where its
// result goes.
type laneItem struct {
	changes  []replica.ReplicaChange
	body     []byte // encodeChanges(changes)
	deadline time.Time
	done     chan error
}

const (
	laneBatchBytes = 2 << 20 // encoded changes per call (one item may exceed it)
	laneBatchMax   = 256     // replicate calls per call
)

func newPeerLane(apply func(ctx context.Context, body []byte) (bool, error)) *peerLane {
	return &peerLane{apply: apply}
}

// send queues changes behind every earlier change and returns the channel
// their result comes on (buffered: nobody need wait for it).
func (l *peerLane) send(changes []replica.ReplicaChange, body []byte, deadline time.Time) <-chan error {
	it := &laneItem{changes: changes, body: body, deadline: deadline, done: make(chan error, 1)}
	l.mu.Lock()
	l.queue = append(l.queue, it)
	start := !l.sending
	l.sending = true
	l.mu.Unlock()
	if start {
		go l.drain()
	}
	return it.done
}

// drain sends the queue, a batch per call, until it is empty.
func (l *peerLane) drain() {
	for {
		l.mu.Lock()
		if len(l.queue) == 0 {
			l.sending = false
			l.mu.Unlock()
			return
		}
		n, size := 0, 0
		for n < len(l.queue) && n < laneBatchMax && (n == 0 || size+len(l.queue[n].body) <= laneBatchBytes) {
			size += len(l.queue[n].body)
			n++
		}
		batch := slices.Clone(l.queue[:n])
		l.queue = slices.Delete(l.queue, 0, n)
		l.mu.Unlock()
		l.sendBatch(batch)
	}
}

func (l *peerLane) sendBatch(batch []*laneItem) {
	deadline := batch[0].deadline
	for _, it := range batch {
		deadline = later(deadline, it.deadline)
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	if len(batch) == 1 {
		_, err := l.apply(ctx, batch[0].body)
		batch[0].done <- err
		return
	}
	var all []replica.ReplicaChange
	for _, it := range batch {
		all = append(all, it.changes...)
	}
	answered, err := l.apply(ctx, encodeChanges(all))
	if err == nil || !answered {
		for _, it := range batch {
			it.done <- err
		}
		return
	}
	// The peer refused the batch as a whole (a newer epoch of one of its
	// inodes): each change gets its own answer.
	for _, it := range batch {
		ictx, icancel := context.WithDeadline(context.Background(), later(it.deadline, time.Now().Add(time.Second)))
		_, err := l.apply(ictx, it.body)
		icancel()
		it.done <- err
	}
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// Uncommitted is the store's Uncommitted: the change reached a majority
// but this replica failed to commit it.
func (c *Owner) Uncommitted(writes []store.Write) {
	c.log.Warn("replicated change not committed locally; recovering its inodes before serving them", "inodes", len(replica.SplitByInode(writes)))
	c.markUnsure(replica.SplitByInode(writes))
}

// markUnsure makes the next request on each inode recover it from a
// majority first: this replica may not hold the newest state, and nothing
// may be served (a read, or the answer to a resend of the same request)
// from a state that is not on a majority.
func (c *Owner) markUnsure(changes []replica.ReplicaChange) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, ch := range changes {
		if ep, ok := c.recovered[ch.Ino]; ok {
			c.unsure[ch.Ino] = ep
			delete(c.recovered, ch.Ino)
		}
	}
}

// applyAt sends changes to p; a replica that lacks the inode's previous
// state gets the whole state first.
func (c *Owner) applyAt(ctx context.Context, n *cluster.Node, p ids.ServerID, body []byte) (answered bool, _ error) {
	for try := 0; ; try++ {
		c.stats.replCalls.Add(1)
		rep, err := c.call(ctx, n, p, callApply, body)
		if err != nil {
			return answered, err
		}
		answered = true
		_, err = replyErr(rep)
		var gap *replica.VersionGapError
		if !errors.As(err, &gap) || try == 3 {
			return answered, err
		}
		// The push may outlive the change's deadline (ctx): a big inode
		// takes many calls, each with its own timeout. close waits for it
		// (wg) before the store closes; added before stop is checked, so
		// that a push either sees stop or is waited for.
		c.wg.Add(1)
		select {
		case <-c.stop:
			c.wg.Done()
			return answered, errUnavailable("server closing")
		default:
		}
		c.stats.statePushes.Add(1)
		err = c.replaceAt(context.WithoutCancel(ctx), n, p, gap.Ino, 0)
		c.wg.Done()
		if err != nil {
			return answered, err
		}
	}
}

func (c *Owner) handleApply(_ context.Context, _ ids.ServerID, body []byte) []byte {
	changes, err := decodeChanges(body)
	if err == nil {
		err = c.repl.ApplyReplica(changes)
	}
	return statusReply(err)
}

func (c *Owner) handleReplState(_ context.Context, _ ids.ServerID, body []byte) []byte {
	d := &dec{b: body}
	ino := ids.Ino(d.u64())
	if d.err != nil {
		return statusReply(d.err)
	}
	ep, v, err := c.repl.ReplicaState(ino)
	if err != nil {
		return statusReply(err)
	}
	e := &enc{}
	e.u8(stOK)
	e.u64(uint64(ep))
	e.u64(v)
	return e.b
}

// handleState serves one page of an inode's state (ReadStatePage).
func (c *Owner) handleState(ctx context.Context, _ ids.ServerID, body []byte) []byte {
	ino, after, maxBytes, err := decodeStateReq(body)
	if err != nil {
		return statusReply(err)
	}
	page, err := c.repl.ReadStatePage(ctx, ino, after, maxBytes)
	if err != nil {
		return statusReply(err)
	}
	return encodeStatePage(page)
}

// handleReplace stages one page of a transfer into this replica; the last
// one switches it in (StagePage).
func (c *Owner) handleReplace(ctx context.Context, _ ids.ServerID, body []byte) []byte {
	tr, seq, records, last, err := decodeStage(body)
	if err != nil {
		return statusReply(err)
	}
	done, err := c.repl.StagePage(ctx, tr, seq, records, last)
	if err != nil {
		return statusReply(err)
	}
	if done {
		return []byte{stOK, 1}
	}
	return []byte{stOK, 0}
}

func (c *Owner) handleRestamp(_ context.Context, _ ids.ServerID, body []byte) []byte {
	d := &dec{b: body}
	ino, ep, v, nep := ids.Ino(d.u64()), ids.Epoch(d.u64()), d.u64(), ids.Epoch(d.u64())
	if d.err != nil {
		return statusReply(d.err)
	}
	done, err := c.repl.RestampInode(ino, ep, v, nep)
	if err != nil {
		return statusReply(err)
	}
	if done {
		return []byte{stOK, 1}
	}
	return []byte{stOK, 0}
}

func (c *Owner) handleDigest(_ context.Context, _ ids.ServerID, body []byte) []byte {
	d := &dec{b: body}
	after, max := ids.Ino(d.u64()), int(d.u32())
	if d.err != nil {
		return statusReply(d.err)
	}
	page, err := c.repl.Digest(after, min(max, 4096), false)
	if err != nil {
		return statusReply(err)
	}
	return encodePage(page)
}

// onLost: ownership ended without a release. Clients holding locks on the
// inode are failed (DESIGN.md: never ACK them again), since another server
// may own it soon.
func (c *Owner) onLost(l cluster.Loss) {
	c.mu.Lock()
	delete(c.recovered, l.Ino)
	delete(c.grace, l.Ino)
	delete(c.unsure, l.Ino)
	c.mu.Unlock()
	failed := 0
	for _, h := range c.locks.Holders(l.Ino) {
		if _, peer := cluster.PeerOf(h); peer {
			continue
		}
		c.locks.Fail(h, fmt.Sprintf("ownership of %v lost", l.Ino))
		failed++
	}
	if failed > 0 {
		c.stats.lostWithLocks.Add(1)
		c.log.Warn("ownership lost while clients held locks; failing them", "ino", l.Ino, "epoch", l.Epoch,
			"idle", l.Idle, "clients", failed)
	}
}

// pinLoop keeps every inode with client locks pinned, so that it is never
// released for idleness while clients trust their locks.
func (c *Owner) pinLoop() {
	defer c.wg.Done()
	t := time.NewTicker(max(c.lease/8, 10*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-c.stop:
			return
		case <-t.C:
		}
		n := c.node.Load()
		all := c.locks.Held()
		held := make(map[ids.Ino]bool, len(all))
		for ino, holders := range all {
			for _, h := range holders {
				if _, peer := cluster.PeerOf(h); !peer {
					held[ino] = true
				}
			}
		}
		c.mu.Lock()
		var pin, unpin []ids.Ino
		for ino := range held {
			if !c.pinned[ino] {
				c.pinned[ino] = true
				pin = append(pin, ino)
			}
		}
		for ino := range c.pinned {
			if !held[ino] {
				delete(c.pinned, ino)
				unpin = append(unpin, ino)
			}
		}
		c.mu.Unlock()
		for _, ino := range pin {
			n.Pin(ino)
		}
		for _, ino := range unpin {
			n.Unpin(ino)
		}
	}
}

// antiEntropyLoop compares this replica with every peer at start and then
// periodically, fetching the inodes a peer holds newer.
func (c *Owner) antiEntropyLoop() {
	defer c.wg.Done()
	every := c.cfg.AntiEntropy
	first := time.NewTimer(0)
	defer first.Stop()
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-c.stop:
			return
		case <-first.C:
		case <-t.C:
		}
		for _, p := range c.others {
			if err := c.catchUp(p); err != nil {
				c.log.Debug("anti-entropy", "peer", p, "err", err)
			}
		}
		c.stats.antiEntropy.Add(1)
	}
}

// catchUp walks p's digest pages and fetches every inode p holds at a newer
// (epoch, version) than this replica, except inodes this server owns (an
// owner is never behind: it recovered from a majority). Once a round
// (before the first peer) it finishes switches a crash interrupted and
// drops abandoned transfers' staging.
func (c *Owner) catchUp(p ids.ServerID) error {
	n := c.node.Load()
	if p == c.others[0] {
		if err := c.repl.SweepTransfers(replica.StageIdle); err != nil {
			c.log.Warn("sweeping transfers' staging", "err", err)
		}
	}
	var after ids.Ino
	for {
		select {
		case <-c.stop:
			return nil
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), c.callWait)
		e := &enc{}
		e.u64(uint64(after))
		e.u32(1024)
		rep, err := c.call(ctx, n, p, callDigest, e.b)
		cancel()
		if err != nil {
			return err
		}
		d, err := replyErr(rep)
		if err != nil {
			return err
		}
		page := decodePage(d)
		if d.err != nil {
			return d.err
		}
		local, err := c.repl.DigestRange(page.After, page.Through, false)
		if err != nil {
			return err
		}
		fetch, _, err := replica.DiffDigests(local, page)
		if err != nil {
			return err
		}
		// A few fetches at once: catching up many small inodes is bound
		// by a round trip and a sync each, not by bandwidth. Each holds
		// at most a page; all end before the next digest page.
		var wg sync.WaitGroup
		sem := make(chan struct{}, fetchWorkers)
	fetching:
		for _, ino := range fetch {
			if _, owns := n.Owns(ino); owns {
				continue
			}
			select {
			case <-c.stop:
				break fetching
			case sem <- struct{}{}:
			}
			wg.Add(1)
			go func() {
				defer func() { <-sem; wg.Done() }()
				if err := c.fetchInode(n, p, ino); err != nil {
					c.log.Debug("anti-entropy fetch", "peer", p, "ino", ino, "err", err)
					return
				}
				c.stats.caughtUp.Add(1)
			}()
		}
		wg.Wait()
		if page.Last() || page.Through <= after {
			return nil
		}
		after = page.Through
	}
}

// fetchInode copies ino's state from p, a page per call, keeping p's epoch.
func (c *Owner) fetchInode(n *cluster.Node, p ids.ServerID, ino ids.Ino) error {
	if f := c.cfg.BeforeFetch; f != nil {
		f(p, ino)
	}
	start := time.Now()
	got, err := replica.CopyInode(context.Background(), peerState{c, n, p}, c.repl, ino, replica.CopyOptions{PageBytes: transferPage})
	if errors.Is(err, replica.ErrStaleEpoch) {
		return nil // we moved on meanwhile
	}
	if err != nil {
		return err
	}
	c.log.Debug("fetched inode state", "ino", ino, "from", p, "state", replVersion{got.Epoch, got.Version},
		"records", got.Records, "bytes", got.Bytes, "pages", got.Pages, "took", time.Since(start))
	return nil
}

// Stats returns the counters.
func (c *Owner) Stats() ClusterStats {
	s := &c.stats
	return ClusterStats{Recoveries: s.recoveries.Load(), GracesStarted: s.graces.Load(),
		HandoversAsked: s.handoversAsked.Load(), HandoversGiven: s.handoversGiven.Load(),
		HandoverMaxMs: s.handoverMaxMs.Load(), Redirects: s.redirects.Load(), Replicated: s.replicated.Load(), ReplFailed: s.replFailed.Load(),
		StatePushes: s.statePushes.Load(), StaleRejected: s.staleRejected.Load(),
		LostWithLocks: s.lostWithLocks.Load(), AntiEntropy: s.antiEntropy.Load(), CaughtUp: s.caughtUp.Load(),
		ReplCalls: s.replCalls.Load(), AllocAhead: s.allocAhead.Load()}
}

// Owned lists the inodes this server owns, but those acquired ahead of
// their allocation (no inode yet).
func (c *Owner) Owned() []cluster.Owned {
	n := c.node.Load()
	if n == nil {
		return nil
	}
	c.mu.Lock()
	allocated, aheadTo := c.allocated, c.aheadTo
	c.mu.Unlock()
	owned := n.Owned()
	return slices.DeleteFunc(owned, func(o cluster.Owned) bool { return allocated < o.Ino && o.Ino < aheadTo })
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
