package paxos

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/leasefs/leasefs/internal/clock"
	"github.com/leasefs/leasefs/internal/ids"
)

var ErrMisaddressed = errors.New("paxos: message not addressed to this node")

// EventKind says what happened to a lease this node wanted.
type EventKind uint8

const (
	Acquired EventKind = iota + 1 // this node became owner; Epoch is the ballot that made it
	Lost                          // ownership lapsed without a release (renewals failed)
	Released                      // Release gave it up
)

func (k EventKind) String() string {
	switch k {
	case Acquired:
		return "acquired"
	case Lost:
		return "lost"
	case Released:
		return "released"
	}
	return fmt.Sprintf("event(%d)", uint8(k))
}

// Event reports a change of this node's ownership.
type Event struct {
	Kind  EventKind
	Ino   ids.Ino
	Epoch ids.Epoch
}

func (e Event) String() string { return fmt.Sprintf("%v %v %v", e.Kind, e.Ino, e.Epoch) }

// Ready is everything the caller must do after a call: send Messages (one per
// peer), then act on Events. The caller owns both slices.
type Ready struct {
	Messages []Message
	Events   []Event
}

// acceptor is the diskless per-instance acceptor state. It is deleted once
// both the promise and the accepted lease have run out.
type acceptor struct {
	promised      ids.Epoch
	promisedUntil clock.Time
	accBallot     ids.Epoch
	accUntil      clock.Time
	accOwner      ids.ServerID
}

// learnt is what a learner knows of another node's lease: kept small, it is
// the only state of an idle instance a node has heard of.
type learnt struct {
	ballot ids.Epoch
	until  clock.Time
	owner  ids.ServerID
}

type phase uint8

const (
	idle phase = iota
	preparing
	proposing
)

// proposal is the proposer state of an instance this node wants or holds.
type proposal struct {
	wanted     bool
	epoch      ids.Epoch  // ballot that made us owner; 0 when not owner
	heldBallot ids.Epoch  // ballot of the latest accept quorum of our lease
	heldUntil  clock.Time // end of our belief; 0 when not owner

	phase    phase
	renewal  bool // attempt renews heldBallot
	nblocked int  // prepare responses reporting a live lease we may not take
	ballot   ids.Epoch
	sentAt   clock.Time
	deadline clock.Time // responses at or after it are void
	retryAt  clock.Time
	votes    [4]uint64 // distinct acceptor ids that answered this phase
	nvotes   int
}

// Node is one server's PaxosLease proposer, acceptor and learner for every
// resource. Not safe for concurrent use: one goroutine owns it.
type Node struct {
	cfg    Config
	lease  time.Duration // owner belief from send: T/(1+δ)
	quorum int

	quarantineUntil clock.Time
	counter         uint64

	acc    map[ids.Ino]acceptor
	learnt map[ids.Ino]learnt
	props  map[ids.Ino]*proposal

	out    map[ids.ServerID][]Entry
	selfq  []Entry
	events []Event

	nextAction clock.Time // earliest proposer deadline; 0 = none
	nextRound  clock.Time // node-wide renewal round, so renewals batch
	nextSweep  clock.Time
}

// New returns a node started at now. It sits out Quarantine first: it may
// have accepted or promised before a crash and forgotten it (diskless).
func New(cfg Config, now clock.Time) (*Node, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	n := &Node{
		cfg:             cfg,
		lease:           cfg.OwnerLease(),
		quorum:          len(cfg.Peers)/2 + 1,
		quarantineUntil: now.Add(cfg.Quarantine),
		acc:             map[ids.Ino]acceptor{},
		learnt:          map[ids.Ino]learnt{},
		props:           map[ids.Ino]*proposal{},
		out:             map[ids.ServerID][]Entry{},
	}
	if !cfg.Unsafe.ReuseBallots {
		n.counter = ballotCounter(uint64(cfg.MinEpoch))
	}
	return n, nil
}

// ID returns the node's server id.
func (n *Node) ID() ids.ServerID { return n.cfg.ID }

// Config returns the node's configuration.
func (n *Node) Config() Config { return n.cfg }

func (n *Node) quarantined(now clock.Time) bool { return now.Before(n.quarantineUntil) }

// Quarantined reports whether the node still sits out after its start.
func (n *Node) Quarantined(now clock.Time) bool { return n.quarantined(now) }

func (n *Node) nextBallot() ids.Epoch {
	n.counter++
	boot := n.cfg.Boot
	if n.cfg.Unsafe.ReuseBallots {
		boot = 0
	}
	return ids.Epoch(makeBallot(n.counter, boot, n.cfg.ID))
}

// see advances the Lamport counter past a ballot seen on the wire.
func (n *Node) see(b ids.Epoch) {
	if c := ballotCounter(uint64(b)); c > n.counter && c <= maxCounter {
		n.counter = c
	}
}

func (n *Node) send(to ids.ServerID, e Entry) {
	if to == n.cfg.ID {
		n.selfq = append(n.selfq, e)
		return
	}
	n.out[to] = append(n.out[to], e)
}

func (n *Node) broadcast(e Entry) {
	for _, p := range n.cfg.Peers {
		n.send(p, e)
	}
}

// drain delivers entries the node sent itself; its own acceptor and learner
// answer at once, without the network.
func (n *Node) drain(now clock.Time) {
	for len(n.selfq) > 0 {
		e := n.selfq[0]
		n.selfq = n.selfq[1:]
		n.handle(now, n.cfg.ID, e)
	}
	n.selfq = n.selfq[:0]
}

func (n *Node) wake(t clock.Time) {
	if n.nextAction.IsZero() || t.Before(n.nextAction) {
		n.nextAction = t
	}
}

// Acquire makes the node want ino: it tries to become owner and, once owner,
// extends automatically until Release. Watch Events for Acquired.
func (n *Node) Acquire(now clock.Time, ino ids.Ino) {
	p := n.props[ino]
	if p == nil {
		p = &proposal{}
		n.props[ino] = p
	}
	p.wanted = true
	n.expire(now, ino, p)
	// repeated calls while backing off do not start attempts: they would
	// outbid the owner's renewals
	if p.phase == idle && p.heldUntil.IsZero() && !n.quarantined(now) && !now.Before(p.retryAt) {
		n.start(now, ino, p)
	} else {
		n.wake(now)
	}
	n.drain(now)
}

// Release gives ino up: the node stops believing at once, then tells learners
// and acceptors so that others can acquire without waiting for expiry.
func (n *Node) Release(now clock.Time, ino ids.Ino) {
	p := n.props[ino]
	if p == nil {
		return
	}
	delete(n.props, ino)
	if n.owns(now, p) {
		n.events = append(n.events, Event{Released, ino, p.epoch})
		// learners and acceptors both act on this one entry, learner first
		n.broadcast(Entry{Kind: KindRelease, Ino: ino, Ballot: p.heldBallot, Owner: n.cfg.ID})
	}
	if p.phase != idle && p.ballot != p.heldBallot {
		// acceptors may have accepted the attempt in flight; free them too
		n.broadcast(Entry{Kind: KindRelease, Ino: ino, Ballot: p.ballot, Owner: n.cfg.ID})
	}
	n.drain(now)
}

func (n *Node) owns(now clock.Time, p *proposal) bool {
	if n.cfg.Unsafe.TimerOrder {
		return !p.heldUntil.IsZero()
	}
	// state checked against the clock, not left to a timer (audit rule)
	return !p.heldUntil.IsZero() && now.Before(p.heldUntil)
}

// Owns reports whether this node owns ino at now.
func (n *Node) Owns(now clock.Time, ino ids.Ino) bool {
	p := n.props[ino]
	return p != nil && n.owns(now, p)
}

// OwnedExpiry returns when this node's ownership of ino ends on its clock and
// the epoch that made it owner.
func (n *Node) OwnedExpiry(now clock.Time, ino ids.Ino) (clock.Time, ids.Epoch, bool) {
	p := n.props[ino]
	if p == nil || !n.owns(now, p) {
		return 0, 0, false
	}
	return p.heldUntil, p.epoch, true
}

// LeaseBallot returns the ballot of the latest accept quorum behind this
// node's ownership of ino (for checkers).
func (n *Node) LeaseBallot(now clock.Time, ino ids.Ino) (ids.Epoch, bool) {
	p := n.props[ino]
	if p == nil || !n.owns(now, p) {
		return 0, false
	}
	return p.heldBallot, true
}

// Owner returns who owns ino as far as this node knows: itself, or the owner
// a learner heard of (for redirects; may be stale, never longer than the
// owner believes if delivery is within MaxDelay).
func (n *Node) Owner(now clock.Time, ino ids.Ino) (ids.ServerID, bool) {
	if n.Owns(now, ino) {
		return n.cfg.ID, true
	}
	if l, ok := n.learnt[ino]; ok && now.Before(l.until) {
		return l.owner, true
	}
	return 0, false
}

// Accepted returns the live lease this node's acceptor holds for ino.
func (n *Node) Accepted(now clock.Time, ino ids.Ino) (ids.ServerID, ids.Epoch, bool) {
	a, ok := n.acc[ino]
	if !ok || a.accOwner == 0 || !now.Before(a.accUntil) {
		return 0, 0, false
	}
	return a.accOwner, a.accBallot, true
}

// Ready returns and clears what the caller must send and report.
func (n *Node) Ready() Ready {
	var r Ready
	for _, p := range n.cfg.Peers {
		if es := n.out[p]; len(es) > 0 {
			r.Messages = append(r.Messages, Message{From: n.cfg.ID, To: p, Entries: es})
			delete(n.out, p)
		}
	}
	r.Events, n.events = n.events, nil
	return r
}

// NextDeadline is the time at which Tick must next be called; zero if never
// (until the next Step, Acquire or Release).
func (n *Node) NextDeadline() clock.Time {
	d := n.nextAction
	min := func(t clock.Time) {
		if !t.IsZero() && (d.IsZero() || t.Before(d)) {
			d = t
		}
	}
	if len(n.acc) > 0 || len(n.learnt) > 0 {
		min(n.nextSweep)
	}
	return d
}

// Step handles one message from a peer. now is read once by the caller for
// the whole message, so every entry is judged at one instant (audit rule:
// read the clock once per handler).
func (n *Node) Step(now clock.Time, m Message) error {
	if m.To != n.cfg.ID {
		return fmt.Errorf("%w: to %v, this is %v", ErrMisaddressed, m.To, n.cfg.ID)
	}
	if m.From == n.cfg.ID {
		return fmt.Errorf("%w: from itself", ErrMisaddressed)
	}
	for _, e := range m.Entries {
		n.handle(now, m.From, e)
	}
	n.drain(now)
	return nil
}

func (n *Node) handle(now clock.Time, from ids.ServerID, e Entry) {
	if n.quarantined(now) {
		// a restarted node takes part in nothing for T(1+δ) (audit rule):
		// it may have promised or accepted before the crash
		return
	}
	if !n.cfg.Unsafe.ReuseBallots {
		n.see(e.Ballot)
	}
	switch e.Kind {
	case KindPrepare:
		n.onPrepare(now, from, e)
	case KindPropose:
		n.onPropose(now, from, e)
	case KindRelease:
		n.onRelease(now, from, e)
	case KindLearn:
		n.onLearn(now, from, e)
	case KindPromise, KindPrepareReject, KindAccepted, KindProposeReject:
		n.onResponse(now, from, e)
	}
}

// acceptorState returns ino's acceptor state with run-out parts cleared.
func (n *Node) acceptorState(now clock.Time, ino ids.Ino) acceptor {
	a := n.acc[ino]
	if !now.Before(a.accUntil) {
		a.accOwner, a.accBallot, a.accUntil = 0, 0, 0
	}
	if !now.Before(a.promisedUntil) {
		// A promise is kept for T after it was made: the proposer's attempt
		// deadline (send + T/(1+δ)) has passed by then, so no response of
		// that attempt can still count.
		a.promised, a.promisedUntil = 0, 0
	}
	return a
}

func (n *Node) store(ino ids.Ino, a acceptor) {
	if a.promisedUntil.IsZero() && a.accUntil.IsZero() {
		delete(n.acc, ino) // idle instances take no memory
		return
	}
	n.acc[ino] = a
	if n.nextSweep.IsZero() {
		n.nextSweep = max(a.promisedUntil, a.accUntil)
	}
}

func (n *Node) onPrepare(now clock.Time, from ids.ServerID, e Entry) {
	a := n.acceptorState(now, e.Ino)
	if e.Ballot < a.promised {
		n.send(from, Entry{Kind: KindPrepareReject, Ino: e.Ino, Ballot: e.Ballot, Aux: uint64(a.promised)})
		return
	}
	a.promised = e.Ballot
	a.promisedUntil = now.Add(n.cfg.LeaseTime)
	n.store(e.Ino, a)
	n.send(from, Entry{Kind: KindPromise, Ino: e.Ino, Ballot: e.Ballot, Owner: a.accOwner, Aux: uint64(a.accBallot)})
}

func (n *Node) onPropose(now clock.Time, from ids.ServerID, e Entry) {
	a := n.acceptorState(now, e.Ino)
	reject := e.Ballot < a.promised && !n.cfg.Unsafe.AcceptLowerBallot
	// never replace a live accepted lease of a different owner (audit rule):
	// its owner may still believe, whatever ballot the newcomer has
	if a.accOwner != 0 && a.accOwner != e.Owner && !n.cfg.Unsafe.ReplaceLiveLease {
		reject = true
	}
	if e.Owner != from {
		reject = true // a proposer proposes only itself
	}
	if reject {
		n.send(from, Entry{Kind: KindProposeReject, Ino: e.Ino, Ballot: e.Ballot, Aux: uint64(a.promised)})
		return
	}
	a.promised = max(a.promised, e.Ballot)
	a.promisedUntil = max(a.promisedUntil, now.Add(n.cfg.LeaseTime))
	a.accOwner, a.accBallot = e.Owner, e.Ballot
	// the acceptor's timer starts on accept, after the proposer started its
	// own (at Prepare send); T here ≥ T/(1+δ) there in real time
	a.accUntil = now.Add(n.cfg.LeaseTime)
	n.store(e.Ino, a)
	n.send(from, Entry{Kind: KindAccepted, Ino: e.Ino, Ballot: e.Ballot})
}

func (n *Node) onRelease(now clock.Time, from ids.ServerID, e Entry) {
	// a lease is (owner, ballot); only its owner releases it (audit rule)
	mine := e.Owner == from
	if l, ok := n.learnt[e.Ino]; ok && mine && l.owner == e.Owner && l.ballot == e.Ballot {
		delete(n.learnt, e.Ino)
	}
	a := n.acceptorState(now, e.Ino)
	if a.accOwner != 0 && (n.cfg.Unsafe.ReleaseByAnyone || mine && a.accOwner == e.Owner && a.accBallot == e.Ballot) {
		a.accOwner, a.accBallot, a.accUntil = 0, 0, 0
	}
	n.store(e.Ino, a)
	if p := n.props[e.Ino]; p != nil && mine && p.phase == idle && p.heldUntil.IsZero() && e.Owner != n.cfg.ID {
		p.retryAt = now // the resource is free: try at once
		n.wake(now)
	}
}

func (n *Node) onLearn(now clock.Time, from ids.ServerID, e Entry) {
	if e.Owner == n.cfg.ID || e.Owner != from {
		return // the owner's learner keeps the proposer's own deadline
	}
	l, ok := n.learnt[e.Ino]
	if ok && now.Before(l.until) && l.ballot > e.Ballot {
		return // stale
	}
	// Re-anchor the owner's remaining time on arrival: scale it by the rate
	// bound and subtract the delivery bound, so the learner's view ends no
	// later than the owner's belief (audit rule). Compare before subtracting.
	left := time.Duration(float64(e.Aux) / (1 + n.cfg.Drift))
	if e.Aux > uint64(n.cfg.LeaseTime) || left <= n.cfg.MaxDelay {
		return
	}
	n.learnt[e.Ino] = learnt{ballot: e.Ballot, until: now.Add(left - n.cfg.MaxDelay), owner: e.Owner}
	if n.nextSweep.IsZero() {
		n.nextSweep = now.Add(n.cfg.LeaseTime)
	}
}

func (p *proposal) vote(from ids.ServerID, dupOK bool) bool {
	w, bit := from/64, uint64(1)<<(from%64)
	if p.votes[w]&bit != 0 && !dupOK {
		return false // count distinct acceptors: QUIC and retries duplicate (audit rule)
	}
	p.votes[w] |= bit
	p.nvotes++
	return true
}

func (p *proposal) resetVotes() { p.votes, p.nvotes, p.nblocked = [4]uint64{}, 0, 0 }

func (n *Node) onResponse(now clock.Time, from ids.ServerID, e Entry) {
	p := n.props[e.Ino]
	if e.Kind == KindPrepareReject || e.Kind == KindProposeReject {
		n.see(ids.Epoch(e.Aux))
	}
	if p == nil || p.ballot != e.Ballot || p.phase == idle {
		return // stale or duplicate response of a finished attempt
	}
	if !n.cfg.Unsafe.TimerOrder {
		n.expire(now, e.Ino, p)
	}
	if !n.cfg.Unsafe.TimerOrder && !now.Before(p.deadline) {
		// the deadline is state checked here, not a race between timers
		// (audit rule): responses after it are void
		n.fail(now, p)
		return
	}
	switch {
	case e.Kind == KindPrepareReject || e.Kind == KindProposeReject:
		n.fail(now, p)
	case e.Kind == KindPromise && p.phase == preparing:
		n.onPromise(now, from, e, p)
	case e.Kind == KindAccepted && p.phase == proposing:
		n.onAccepted(now, from, e, p)
	}
}

// onPromise counts a promise for the attempt p in its prepare phase, and
// proposes once a quorum promised with no live lease in the way.
func (n *Node) onPromise(now clock.Time, from ids.ServerID, e Entry, p *proposal) {
	if !p.vote(from, n.cfg.Unsafe.CountDuplicates) {
		return
	}
	if e.Owner != 0 && !n.leaseOpen(now, e, p) {
		p.nvotes--
		p.nblocked++
		if p.nblocked > len(n.cfg.Peers)-n.quorum {
			n.failBlocked(now, p)
		}
		return
	}
	if p.nvotes < n.quorum {
		return
	}
	p.phase = proposing
	p.resetVotes()
	if n.cfg.Unsafe.DeadlineFromQuorum {
		p.sentAt, p.deadline = now, now.Add(n.lease)
		n.wake(p.deadline)
	}
	n.broadcast(Entry{Kind: KindPropose, Ino: e.Ino, Ballot: p.ballot, Owner: n.cfg.ID})
}

// leaseOpen reports whether the live lease a promise reports leaves the
// attempt p free to go on. Our own reported lease is open only when
// renewing exactly it (audit rule); anything else live blocks this
// response. A quorum of open responses still suffices: any rival's accept
// quorum intersects it.
func (n *Node) leaseOpen(now clock.Time, e Entry, p *proposal) bool {
	return e.Owner == n.cfg.ID && (n.cfg.Unsafe.OwnLeaseAlwaysOpen ||
		p.renewal && ids.Epoch(e.Aux) == p.heldBallot && n.owns(now, p))
}

// onAccepted counts an accept for the attempt p in its propose phase; at a
// quorum the lease is ours (or extended), and the other servers learn it.
func (n *Node) onAccepted(now clock.Time, from ids.ServerID, e Entry, p *proposal) {
	if !p.vote(from, n.cfg.Unsafe.CountDuplicates) || p.nvotes < n.quorum {
		return
	}
	// an extension counts only now, after a fresh accept quorum (audit rule)
	until := p.sentAt.Add(n.lease)
	if !p.renewal || !n.owns(now, p) {
		p.epoch = p.ballot
		n.events = append(n.events, Event{Acquired, e.Ino, p.epoch})
	}
	p.heldBallot, p.heldUntil = p.ballot, max(until, p.heldUntil)
	p.phase = idle
	p.resetVotes()
	n.wake(p.heldUntil)
	n.wakeRound(now)
	if !now.Before(p.heldUntil) {
		return // compare before subtracting (audit rule)
	}
	left := p.heldUntil.Sub(now)
	for _, peer := range n.cfg.Peers {
		if peer != n.cfg.ID {
			n.send(peer, Entry{Kind: KindLearn, Ino: e.Ino, Ballot: p.heldBallot, Owner: n.cfg.ID, Aux: uint64(left)})
		}
	}
}

// fail ends the current attempt; the next one waits RetryBackoff, staggered
// by node id so that duelling proposers do not collide forever.
func (n *Node) fail(now clock.Time, p *proposal) {
	p.phase = idle
	p.resetVotes()
	b := n.cfg.RetryBackoff
	b += b * time.Duration((uint64(n.cfg.ID)*7+n.counter)%8) / 8
	p.retryAt = now.Add(b)
	n.wake(p.retryAt)
}

// failBlocked ends an attempt that met a live lease: it waits half a lease
// before trying again (or until a release is learnt), so that its prepares do
// not keep outbidding the owner's renewals.
func (n *Node) failBlocked(now clock.Time, p *proposal) {
	n.fail(now, p)
	p.retryAt = p.retryAt.Add(n.lease / 2)
	n.wake(p.retryAt)
}

// expire ends our belief once its deadline has passed.
func (n *Node) expire(now clock.Time, ino ids.Ino, p *proposal) {
	if p.heldUntil.IsZero() || now.Before(p.heldUntil) {
		return
	}
	n.events = append(n.events, Event{Lost, ino, p.epoch})
	p.heldUntil, p.epoch, p.heldBallot = 0, 0, 0
}

// start begins an attempt: acquire, or renew if we own ino.
func (n *Node) start(now clock.Time, ino ids.Ino, p *proposal) {
	p.ballot = n.nextBallot()
	p.retryAt = 0
	p.phase = preparing
	p.renewal = n.owns(now, p)
	p.resetVotes()
	// The attempt's deadline starts now, when Prepare is sent (audit rule):
	// an acceptor can forget a promise (restart, or its T running out) and
	// then accept a rival, so only a deadline anchored at send is covered
	// by the acceptors' timers.
	p.sentAt, p.deadline = now, now.Add(n.lease)
	if n.cfg.Unsafe.DeadlineFromQuorum {
		// the 2012 rule: the timer starts at the prepare quorum, so until
		// then the attempt only has a generous give-up time
		p.deadline = now.Add(4 * n.cfg.LeaseTime)
	}
	if n.cfg.Unsafe.ExtendWithoutQuorum && p.renewal {
		p.heldUntil = p.deadline
	}
	n.wake(p.deadline)
	n.broadcast(Entry{Kind: KindPrepare, Ino: ino, Ballot: p.ballot})
}

// needsAction reports whether Tick at now has anything to do for p.
func (n *Node) needsAction(now clock.Time, p *proposal, round bool) bool {
	switch {
	case !p.heldUntil.IsZero() && !now.Before(p.heldUntil):
		return true
	case p.phase != idle:
		return !now.Before(p.deadline)
	case !p.wanted || n.quarantined(now):
		return false
	case !p.heldUntil.IsZero():
		return round && n.renewDue(now, p) || !p.retryAt.IsZero() && !now.Before(p.retryAt)
	}
	return !now.Before(p.retryAt)
}

// renewDue: a held lease is renewed in the first round at which at most half
// of its belief is left; rounds come every quarter lease, so renewals of all
// instances fall into the same rounds and share messages.
func (n *Node) renewDue(now clock.Time, p *proposal) bool {
	return p.heldUntil.Sub(now) <= n.lease/2
}

func (n *Node) wakeRound(now clock.Time) {
	if n.nextRound.IsZero() {
		n.nextRound = now.Add(n.lease / 4)
	}
	// An overdue round is not put off: a node whose timer runs behind a
	// stream of acquisitions would skip round after round, and every
	// lease it holds would lapse unrenewed. It runs at the next Tick.
	n.wake(n.nextRound)
}

// Tick runs timers: it ends lapsed beliefs and attempts, starts retries and
// renewal rounds, and frees run-out acceptor and learner state.
func (n *Node) Tick(now clock.Time) {
	if !n.nextSweep.IsZero() && !now.Before(n.nextSweep) {
		n.sweep(now)
	}
	if n.nextAction.IsZero() || now.Before(n.nextAction) {
		return
	}
	round := !now.Before(n.nextRound)
	if round {
		n.nextRound = now.Add(n.lease / 4)
	}
	n.nextAction = 0
	// Act on instances in ino order, not map order, so that a run replays
	// exactly (ballots and message order depend on it).
	var due []ids.Ino
	for ino, p := range n.props {
		if n.needsAction(now, p, round) {
			due = append(due, ino)
		}
	}
	slices.Sort(due)
	for _, ino := range due {
		p := n.props[ino]
		n.expire(now, ino, p)
		if p.phase != idle && !now.Before(p.deadline) {
			n.fail(now, p)
		}
		if p.phase == idle && p.wanted && !n.quarantined(now) {
			switch {
			case !p.heldUntil.IsZero():
				if round && n.renewDue(now, p) || !p.retryAt.IsZero() && !now.Before(p.retryAt) {
					n.start(now, ino, p)
				}
			case !now.Before(p.retryAt):
				n.start(now, ino, p)
			}
		}
	}
	held := false
	for _, p := range n.props {
		if p.phase != idle {
			n.wake(p.deadline)
		}
		switch {
		case !p.heldUntil.IsZero():
			held = true
			n.wake(p.heldUntil)
			if p.phase == idle && !p.retryAt.IsZero() {
				n.wake(p.retryAt)
			}
		case p.wanted && p.phase == idle:
			n.wake(max(p.retryAt, n.quarantineUntil))
		}
	}
	if held {
		n.wake(n.nextRound)
	}
	n.drain(now)
}

func (n *Node) sweep(now clock.Time) {
	for ino := range n.acc {
		n.store(ino, n.acceptorState(now, ino))
	}
	for ino, l := range n.learnt {
		if !now.Before(l.until) {
			delete(n.learnt, ino)
		}
	}
	n.nextSweep = 0
	if len(n.acc) > 0 || len(n.learnt) > 0 {
		n.nextSweep = now.Add(n.cfg.LeaseTime)
	}
}
