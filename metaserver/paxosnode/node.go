package paxosnode

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
	"github.com/leasefs/leasefs/lease/paxos"
	"github.com/leasefs/leasefs/transport"
)

// inboxSize bounds PaxosLease messages received but not yet stepped; beyond
// it they are dropped (lost messages are harmless).
const inboxSize = 1024

// Loss reports that this server's ownership of an inode ended without the
// caller releasing it: the lease lapsed (renewals failed), or it was
// released because nobody used it for Config.IdleRelease (Idle). The server
// must stop serving the inode and fail clients that hold locks on it.
type Loss struct {
	Ino   ids.Ino
	Epoch ids.Epoch
	Idle  bool
}

// Owned describes one lease this server holds (for `leasefs admin owners`).
type Owned struct {
	Ino   ids.Ino
	Epoch ids.Epoch
	Held  time.Duration // since this epoch made the server owner
	Left  time.Duration // until the belief ends unless renewed
	Idle  time.Duration // since the last use (Acquire, Touch)
}

// Stats are a node's counters since it started.
type Stats struct {
	Held                             int    // leases held now
	Acquires, Losses, Releases       uint64 // ownership events
	IdleReleases                     uint64 // releases for idleness (also in Releases)
	MsgsSent, EntriesSent, BytesSent uint64 // PaxosLease frames delivered to peers
	SendErrors, SendDropped          uint64 // failed frames; entries dropped before sending
	MsgsRecv, EntriesRecv, BytesRecv uint64 // PaxosLease frames received
	RecvDropped, BadFrames           uint64 // messages dropped (inbox full); rejected frames
	CallsSent, CallsRecv             uint64 // Peers.Call traffic
}

type counters struct {
	acquires, losses, releases, idleReleases atomic.Uint64
	msgsSent, entriesSent, bytesSent         atomic.Uint64
	sendErrors, sendDropped                  atomic.Uint64
	msgsRecv, entriesRecv, bytesRecv         atomic.Uint64
	recvDropped, badFrames                   atomic.Uint64
	callsSent, callsRecv                     atomic.Uint64
	held                                     atomic.Int64
}

// holding is the loop's record of a lease this node holds.
type holding struct {
	epoch   ids.Epoch
	since   clock.Time // when the epoch's accept quorum completed here
	lastUse clock.Time
}

type acqResult struct {
	epoch ids.Epoch
	err   error
}

// Node is one server's PaxosLease ownership runtime: a goroutine that owns
// a paxos.Node (the pure core), steps the messages peers send it, sends what
// the core asks through Peers, and runs the core's timer. Its methods are
// safe for concurrent use; queries go through the goroutine and read the
// clock there, so an answer is never older than the call.
type Node struct {
	cfg   Config
	boot  uint16
	clk   clock.Clock
	log   *slog.Logger
	peers *Peers
	st    *counters
	start clock.Time

	inbox    chan paxos.Message
	reqs     chan func(now clock.Time)
	done     chan struct{} // closed by Close
	loopDone chan struct{} // closed when run returns
	once     sync.Once
	wg       sync.WaitGroup

	// owned by the run goroutine
	core    *paxos.Node
	held    map[ids.Ino]*holding
	waiters map[ids.Ino][]chan acqResult
	// abandoned: inodes whose Acquires all gave up (ctx) while the core was
	// still trying; the core keeps wanting them until the time given, so
	// that a retried Acquire inherits its backoff instead of starting an
	// attempt at once (which would outbid the owner's renewals)
	abandoned map[ids.Ino]clock.Time
	timer     clock.Timer // set to the core's next deadline
	timerC    <-chan time.Time
	dirty     bool // the core was called after the last Ready

	useMu   sync.Mutex
	touched map[ids.Ino]struct{}
	pins    map[ids.Ino]int

	lossMu   sync.Mutex
	lossFns  []func(Loss)
	lossQ    []Loss
	lossWake chan struct{}
}

// New increments and persists the boot counter in cfg.Dir, then starts the
// node: it dials nobody until it has something to send, and sits out
// cfg.Quarantine before taking part in any round. Close it when done.
func New(cfg Config) (*Node, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	boot, err := nextBoot(cfg.Dir)
	if err != nil {
		return nil, err
	}
	now := cfg.Clock.Now()
	core, err := paxos.New(cfg.paxosConfig(boot), now)
	if err != nil {
		return nil, fmt.Errorf("paxosnode: %w", err)
	}
	n := &Node{
		cfg:       cfg,
		boot:      boot,
		clk:       cfg.Clock,
		log:       cfg.Logger.With("server", cfg.ID),
		st:        &counters{},
		start:     now,
		inbox:     make(chan paxos.Message, inboxSize),
		reqs:      make(chan func(clock.Time)),
		done:      make(chan struct{}),
		loopDone:  make(chan struct{}),
		core:      core,
		held:      map[ids.Ino]*holding{},
		waiters:   map[ids.Ino][]chan acqResult{},
		abandoned: map[ids.Ino]clock.Time{},
		touched:   map[ids.Ino]struct{}{},
		pins:      map[ids.Ino]int{},
		lossWake:  make(chan struct{}, 1),
	}
	n.peers = newPeers(&cfg, boot, n.st)
	n.timer, n.timerC = n.clk.NewTimer(time.Hour)
	n.timer.Stop()
	n.log.Info("paxosnode: node started", "boot", boot, "peers", len(cfg.Peers),
		"lease", cfg.LeaseTime, "quarantine", cfg.Quarantine, "min_epoch", cfg.MinEpoch)
	n.wg.Add(2)
	go n.run()
	go n.notifyLoop()
	return n, nil
}

// ID is this server's id.
func (n *Node) ID() ids.ServerID { return n.cfg.ID }

// Boot is the boot counter this start persisted.
func (n *Node) Boot() uint16 { return n.boot }

// Config returns the configuration with defaults filled in.
func (n *Node) Config() Config { return n.cfg }

// Peers returns the links to the other servers (for Call and Handle).
func (n *Node) Peers() *Peers { return n.peers }

// Quarantined reports whether the node still sits out its start-up
// quarantine.
func (n *Node) Quarantined() bool {
	return n.clk.Now().Sub(n.start) < n.cfg.Quarantine
}

// Close stops the node like a crash: held leases are not released (peers
// wait for them to run out), waiting Acquires fail with ErrClosed, peer
// links close. It does not close the transport server that calls
// HandlePeer. OnLost callbacks must not call Close.
func (n *Node) Close() error {
	n.once.Do(func() {
		close(n.done)
		<-n.loopDone
		n.peers.close()
		n.wg.Wait()
		n.log.Info("paxosnode: node closed")
	})
	return nil
}

// Shutdown hands every held lease over (Release) so that other servers can
// acquire at once, waits until the releases are sent or ctx ends, then
// closes the node. Use it for a graceful stop; Close is a crash.
func (n *Node) Shutdown(ctx context.Context) error {
	err := n.query(func(now clock.Time) {
		for ino := range n.held {
			n.core.Release(now, ino)
			n.dirty = true
		}
		for ino, ws := range n.waiters {
			for _, w := range ws {
				w <- acqResult{err: ErrClosed}
			}
			delete(n.waiters, ino)
		}
	})
	if err == nil {
		err = n.peers.flush(ctx)
	}
	n.Close()
	return err
}

// OnLost registers fn to be told of every Loss, in order, on a goroutine of
// the node's (so fn may block briefly, but not call Close).
func (n *Node) OnLost(fn func(Loss)) {
	n.lossMu.Lock()
	n.lossFns = append(n.lossFns, fn)
	n.lossMu.Unlock()
}

// Acquire blocks until this server owns ino and returns the epoch that made
// it owner. It returns *NotOwnerError when it learns of another live owner
// (at once if already known), a *QuarantineError (errors.Is ErrQuarantined)
// without waiting while the node sits out its start-up quarantine,
// ErrReleased if Release(ino) is called meanwhile, ErrClosed, or ctx's
// error. It counts as a use of ino (see Touch).
//
// When ctx ends first the node keeps trying for one more lease period, so
// that a retried Acquire inherits the core's backoff rather than starting
// an attempt at once (repeated fresh attempts outbid the owner's renewals);
// a lease won meanwhile is held until idle.
//
// Having acquired, check the epoch against the inode's records (DESIGN.md:
// the new owner recovers the inode by a majority read before serving).
func (n *Node) Acquire(ctx context.Context, ino ids.Ino) (ids.Epoch, error) {
	if err := ctx.Err(); err != nil {
		return 0, fmt.Errorf("paxosnode: acquire %v: %w", ino, err)
	}
	res := make(chan acqResult, 1)
	err := n.query(func(now clock.Time) {
		if n.core.Quarantined(now) {
			res <- acqResult{err: &QuarantineError{Left: n.start.Add(n.cfg.Quarantine).Sub(now)}}
			return
		}
		if _, ep, ok := n.core.OwnedExpiry(now, ino); ok {
			n.use(now, ino)
			res <- acqResult{epoch: ep}
			return
		}
		if o, ok := n.core.Owner(now, ino); ok && o != n.cfg.ID {
			res <- acqResult{err: &NotOwnerError{Ino: ino, Owner: o}}
			return
		}
		n.waiters[ino] = append(n.waiters[ino], res)
		delete(n.abandoned, ino)
		n.core.Acquire(now, ino)
		n.dirty = true
		n.check(now, ino) // a one-server cluster acquires at once
	})
	if err != nil {
		return 0, err
	}
	select {
	case r := <-res:
		return r.epoch, r.err
	case <-ctx.Done():
	}
	// Give up. Unless another Acquire waits for ino or we hold it (then
	// the idle timer releases it), stop wanting it after a lease.
	n.query(func(now clock.Time) {
		ws := n.waiters[ino]
		if i := slices.Index(ws, res); i >= 0 {
			ws = slices.Delete(ws, i, i+1)
			if len(ws) > 0 {
				n.waiters[ino] = ws
				return
			}
			delete(n.waiters, ino)
			if n.held[ino] == nil {
				n.abandoned[ino] = now.Add(n.cfg.LeaseTime)
			}
		}
	})
	select {
	case r := <-res:
		return r.epoch, r.err // it arrived while we gave up
	default:
	}
	return 0, fmt.Errorf("paxosnode: acquire %v: %w", ino, ctx.Err())
}

// Owns reports whether this server owns ino now (a fresh clock reading, as
// the core requires: never cache the answer) and the epoch that made it
// owner.
func (n *Node) Owns(ino ids.Ino) (ids.Epoch, bool) {
	var ep ids.Epoch
	var ok bool
	n.query(func(now clock.Time) { _, ep, ok = n.core.OwnedExpiry(now, ino) })
	return ep, ok
}

// Owner returns the owner of ino as far as this server knows: itself, or
// the owner it learnt of (for redirects; may be stale, see paxos).
func (n *Node) Owner(ino ids.Ino) (ids.ServerID, bool) {
	var o ids.ServerID
	var ok bool
	n.query(func(now clock.Time) { o, ok = n.core.Owner(now, ino) })
	return o, ok
}

// Touch marks ino as used: a held lease is extended while it is used and
// released once unused for Config.IdleRelease. Cheap; it does not wait for
// the node's goroutine.
func (n *Node) Touch(ino ids.Ino) {
	n.useMu.Lock()
	n.touched[ino] = struct{}{}
	n.useMu.Unlock()
}

// Pin keeps ino's lease from being released for idleness until a matching
// Unpin (for example while clients hold locks on it). Pins count.
func (n *Node) Pin(ino ids.Ino) {
	n.useMu.Lock()
	n.pins[ino]++
	n.useMu.Unlock()
}

// Unpin undoes one Pin and counts as a use.
func (n *Node) Unpin(ino ids.Ino) {
	n.useMu.Lock()
	if n.pins[ino] <= 1 {
		delete(n.pins, ino)
	} else {
		n.pins[ino]--
	}
	n.touched[ino] = struct{}{}
	n.useMu.Unlock()
}

// Release gives ino up at once (hand-over): this server stops believing
// before Release returns, and tells the others so that they can acquire
// without waiting for the lease to run out. Acquires of ino waiting here
// fail with ErrReleased.
func (n *Node) Release(ino ids.Ino) {
	n.query(func(now clock.Time) {
		n.core.Release(now, ino)
		n.dirty = true
		for _, w := range n.waiters[ino] {
			w <- acqResult{err: ErrReleased}
		}
		delete(n.waiters, ino)
		delete(n.abandoned, ino)
	})
}

// Owned lists the leases this server holds, by inode.
func (n *Node) Owned() []Owned {
	var out []Owned
	n.query(func(now clock.Time) {
		for ino, h := range n.held {
			if until, ep, ok := n.core.OwnedExpiry(now, ino); ok {
				out = append(out, Owned{Ino: ino, Epoch: ep, Held: now.Sub(h.since), Left: until.Sub(now), Idle: now.Sub(h.lastUse)})
			}
		}
	})
	slices.SortFunc(out, func(a, b Owned) int {
		switch {
		case a.Ino < b.Ino:
			return -1
		case a.Ino > b.Ino:
			return 1
		}
		return 0
	})
	return out
}

// Stats returns the node's counters.
func (n *Node) Stats() Stats {
	c := n.st
	return Stats{
		Held:     int(c.held.Load()),
		Acquires: c.acquires.Load(), Losses: c.losses.Load(), Releases: c.releases.Load(), IdleReleases: c.idleReleases.Load(),
		MsgsSent: c.msgsSent.Load(), EntriesSent: c.entriesSent.Load(), BytesSent: c.bytesSent.Load(),
		SendErrors: c.sendErrors.Load(), SendDropped: c.sendDropped.Load(),
		MsgsRecv: c.msgsRecv.Load(), EntriesRecv: c.entriesRecv.Load(), BytesRecv: c.bytesRecv.Load(),
		RecvDropped: c.recvDropped.Load(), BadFrames: c.badFrames.Load(),
		CallsSent: c.callsSent.Load(), CallsRecv: c.callsRecv.Load(),
	}
}

// HandlePeer serves one peer frame (IsPeerBody) that arrived on the
// server's transport. PaxosLease messages are queued for the node's
// goroutine and acknowledged at once; calls run the Handle'd function. A
// frame that does not decode, does not come from a peer client id matching
// its sender, or is not addressed to this server gets an error reply and
// changes nothing.
func (n *Node) HandlePeer(ctx context.Context, req *transport.Request) []byte {
	select {
	case <-n.done:
		return errReply(ErrClosed)
	default:
	}
	f, err := n.checkFrame(req)
	if err != nil {
		n.st.badFrames.Add(1)
		n.log.Warn("paxosnode: bad peer frame", "client", req.Client, "bytes", len(req.Body), "err", err)
		return errReply(err)
	}
	n.st.bytesRecv.Add(uint64(len(req.Body)))
	switch f.typ {
	case framePaxos:
		n.st.msgsRecv.Add(1)
		n.st.entriesRecv.Add(uint64(len(f.msg.Entries)))
		select {
		case n.inbox <- f.msg:
		default:
			if d := n.st.recvDropped.Add(1); d&(d-1) == 0 { // 1st, 2nd, 4th, ...
				n.log.Warn("paxosnode: PaxosLease inbox full, message dropped", "from", f.msg.From, "dropped", d)
			}
		}
		return okReply(nil)
	case frameCall:
		n.st.callsRecv.Add(1)
		h := n.peers.handler(f.kind)
		if h == nil {
			return errReply(fmt.Errorf("%w %d", ErrNoHandler, f.kind))
		}
		return okReply(h(ctx, f.from, f.body))
	}
	panic("paxosnode: parseFrame returned an unknown frame type")
}

func (n *Node) checkFrame(req *transport.Request) (frame, error) {
	f, err := parseFrame(req.Body)
	if err != nil {
		return f, err
	}
	from, ok := PeerOf(req.Client)
	switch {
	case req.Conn != nil && !req.Conn.Peer():
		// a token holder, not a server: only connections that proved the
		// cluster's key speak for a server (transport.ClientKey)
		return f, badFrame("%v did not prove the cluster's key", req.Client)
	case !ok:
		return f, badFrame("%v is not a peer client id", req.Client)
	case from != f.from:
		return f, badFrame("frame from %v on the connection of %v", f.from, from)
	case f.to != n.cfg.ID:
		return f, badFrame("frame for %v reached %v", f.to, n.cfg.ID)
	case n.peers.links[f.from] == nil:
		return f, badFrame("%v is not a peer of %v", f.from, n.cfg.ID)
	}
	return f, nil
}

// query runs fn on the node's goroutine (fn reads the clock there) and
// waits for it; ErrClosed if the node closes first.
func (n *Node) query(fn func(now clock.Time)) error {
	ran := make(chan struct{})
	select {
	case n.reqs <- func(now clock.Time) { fn(now); close(ran) }:
	case <-n.done:
		return ErrClosed
	}
	select {
	case <-ran:
		return nil
	case <-n.loopDone:
		return ErrClosed
	}
}

func (n *Node) run() {
	defer n.wg.Done()
	defer close(n.loopDone)
	// idle releases and abandoned wants are checked a few times per period
	idlePeriod := min(n.cfg.IdleRelease/4, n.cfg.LeaseTime)
	idle, idleC := n.clk.NewTimer(idlePeriod)
	defer idle.Stop()
	defer n.timer.Stop()
	for {
		select {
		case <-n.done:
			for ino, ws := range n.waiters {
				for _, w := range ws {
					w <- acqResult{err: ErrClosed}
				}
				delete(n.waiters, ino)
			}
			return
		case m := <-n.inbox:
			now := n.clk.Now()
			// read once for the whole message (audit rule); HandlePeer
			// checked the addressing, so Step cannot fail
			if err := n.core.Step(now, m); err != nil {
				panic(fmt.Sprintf("paxosnode: step of a checked message: %v", err))
			}
			n.dirty = true
			if len(n.waiters) > 0 {
				for _, e := range m.Entries {
					n.check(now, e.Ino)
				}
			}
			n.process(now)
		case fn := <-n.reqs:
			now := n.clk.Now()
			fn(now)
			n.process(now)
		case <-n.timerC:
			now := n.clk.Now()
			n.core.Tick(now)
			n.dirty = true
			n.process(now)
		case <-idleC:
			idle.Reset(idlePeriod)
			now := n.clk.Now()
			n.releaseIdle(now)
			n.process(now)
		}
	}
}

// process does the caller's duties after calls into the core (paxos doc):
// send the messages, act on the events, then arm the timer.
func (n *Node) process(now clock.Time) {
	for n.dirty {
		n.dirty = false
		rd := n.core.Ready()
		for _, m := range rd.Messages {
			n.peers.sendPaxos(m)
		}
		for _, e := range rd.Events {
			n.onEvent(now, e)
		}
	}
	if d := n.core.NextDeadline(); d.IsZero() {
		n.timer.Stop()
	} else {
		n.timer.Reset(max(d.Sub(n.clk.Now()), 0))
	}
}

func (n *Node) onEvent(now clock.Time, e paxos.Event) {
	switch e.Kind {
	case paxos.Acquired:
		n.st.acquires.Add(1)
		delete(n.abandoned, e.Ino) // held now: the idle timer takes over
		if n.held[e.Ino] == nil {
			n.st.held.Add(1)
		}
		n.held[e.Ino] = &holding{epoch: e.Epoch, since: now, lastUse: now}
		n.log.Debug("paxosnode: acquired", "ino", e.Ino, "epoch", paxos.FormatBallot(e.Epoch))
	case paxos.Lost:
		n.st.losses.Add(1)
		n.drop(e.Ino)
		n.log.Warn("paxosnode: ownership lapsed", "ino", e.Ino, "epoch", paxos.FormatBallot(e.Epoch),
			"paxos_send_errors", n.st.sendErrors.Load(), "paxos_send_dropped", n.st.sendDropped.Load(),
			"paxos_recv_dropped", n.st.recvDropped.Load())
		n.notify(Loss{Ino: e.Ino, Epoch: e.Epoch})
		if len(n.waiters[e.Ino]) == 0 {
			// stop wanting it: the server acquires afresh (and recovers the
			// inode) when it next needs it
			n.core.Release(now, e.Ino)
			n.dirty = true
			delete(n.abandoned, e.Ino)
		}
	case paxos.Released:
		n.st.releases.Add(1)
		n.drop(e.Ino)
		n.log.Debug("paxosnode: released", "ino", e.Ino, "epoch", paxos.FormatBallot(e.Epoch))
	}
	n.check(now, e.Ino)
}

func (n *Node) drop(ino ids.Ino) {
	if n.held[ino] != nil {
		delete(n.held, ino)
		n.st.held.Add(-1)
	}
}

// check answers the Acquires waiting for ino if the core has decided.
func (n *Node) check(now clock.Time, ino ids.Ino) {
	ws := n.waiters[ino]
	if len(ws) == 0 {
		return
	}
	var r acqResult
	if _, ep, ok := n.core.OwnedExpiry(now, ino); ok {
		n.use(now, ino)
		r.epoch = ep
	} else if o, ok := n.core.Owner(now, ino); ok && o != n.cfg.ID {
		r.err = &NotOwnerError{Ino: ino, Owner: o}
		if n.held[ino] == nil {
			n.core.Release(now, ino) // stop competing with the owner
			n.dirty = true
			delete(n.abandoned, ino)
		}
	} else {
		return
	}
	for _, w := range ws {
		w <- r
	}
	delete(n.waiters, ino)
}

func (n *Node) use(now clock.Time, ino ids.Ino) {
	if h := n.held[ino]; h != nil {
		h.lastUse = now
	}
}

// releaseIdle releases held leases unused for IdleRelease and not pinned.
func (n *Node) releaseIdle(now clock.Time) {
	n.useMu.Lock()
	touched := n.touched
	n.touched = map[ids.Ino]struct{}{}
	for ino := range n.pins {
		touched[ino] = struct{}{}
	}
	n.useMu.Unlock()
	for ino := range touched {
		n.use(now, ino)
	}
	for ino, until := range n.abandoned {
		if now.Before(until) {
			continue
		}
		delete(n.abandoned, ino)
		if n.held[ino] == nil && len(n.waiters[ino]) == 0 {
			n.core.Release(now, ino)
			n.dirty = true
		}
	}
	for ino, h := range n.held {
		if now.Sub(h.lastUse) < n.cfg.IdleRelease || len(n.waiters[ino]) > 0 {
			continue
		}
		n.st.idleReleases.Add(1)
		n.core.Release(now, ino)
		n.dirty = true
		n.notify(Loss{Ino: ino, Epoch: h.epoch, Idle: true})
	}
}

func (n *Node) notify(l Loss) {
	n.lossMu.Lock()
	n.lossQ = append(n.lossQ, l)
	n.lossMu.Unlock()
	select {
	case n.lossWake <- struct{}{}:
	default:
	}
}

func (n *Node) notifyLoop() {
	defer n.wg.Done()
	for {
		select {
		case <-n.done:
			return
		case <-n.lossWake:
		}
		n.lossMu.Lock()
		q, fns := n.lossQ, slices.Clone(n.lossFns)
		n.lossQ = nil
		n.lossMu.Unlock()
		for _, l := range q {
			for _, fn := range fns {
				fn(l)
			}
		}
	}
}
