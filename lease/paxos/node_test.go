package paxos

import (
	"errors"
	"testing"
	"time"

	"github.com/leasefs/leasefs/internal/clock"
	"github.com/leasefs/leasefs/internal/ids"
)

// tnet is a cluster on one shared clock with a hand-driven network: unit
// tests pick which messages arrive, and when.
type tnet struct {
	t       testing.TB
	now     clock.Time
	peers   []ids.ServerID
	nodes   map[ids.ServerID]*Node
	pending []Message
	events  []Event
}

func newNet(t testing.TB, n int, mut func(*Config)) *tnet {
	tn := &tnet{t: t, now: 1, nodes: map[ids.ServerID]*Node{}}
	for i := 1; i <= n; i++ {
		tn.peers = append(tn.peers, ids.ServerID(i))
	}
	for _, id := range tn.peers {
		tn.boot(id, 1, mut)
	}
	tn.advance(tn.nodes[1].cfg.Quarantine)
	return tn
}

func (tn *tnet) boot(id ids.ServerID, boot uint16, mut func(*Config)) *Node {
	c := testConfig(id, tn.peers, boot)
	if mut != nil {
		mut(&c)
	}
	n, err := New(c, tn.now)
	if err != nil {
		tn.t.Fatal(err)
	}
	tn.nodes[id] = n
	return n
}

func (tn *tnet) collect() {
	for _, id := range tn.peers {
		if n := tn.nodes[id]; n != nil {
			rd := n.Ready()
			tn.pending = append(tn.pending, rd.Messages...)
			tn.events = append(tn.events, rd.Events...)
		}
	}
}

// advance moves time, running timers but delivering nothing.
func (tn *tnet) advance(d time.Duration) {
	end := tn.now.Add(d)
	for {
		next := end
		for _, n := range tn.nodes {
			if n != nil {
				if dl := n.NextDeadline(); !dl.IsZero() && dl.Before(next) {
					next = max(dl, tn.now)
				}
			}
		}
		tn.now = next
		for _, id := range tn.peers {
			if n := tn.nodes[id]; n != nil {
				n.Tick(tn.now)
			}
		}
		tn.collect()
		if tn.now == end {
			return
		}
	}
}

// take removes and returns pending messages that match.
func (tn *tnet) take(match func(Message) bool) []Message {
	tn.collect()
	var got, keep []Message
	for _, m := range tn.pending {
		if match(m) {
			got = append(got, m)
		} else {
			keep = append(keep, m)
		}
	}
	tn.pending = keep
	return got
}

func (tn *tnet) deliver(ms ...Message) {
	for _, m := range ms {
		if n := tn.nodes[m.To]; n != nil {
			if err := n.Step(tn.now, m); err != nil {
				tn.t.Fatal(err)
			}
		}
	}
	tn.collect()
}

// settle delivers everything until the network is quiet.
func (tn *tnet) settle() {
	for {
		ms := tn.take(func(Message) bool { return true })
		if len(ms) == 0 {
			return
		}
		tn.deliver(ms...)
	}
}

func from(id ids.ServerID) func(Message) bool { return func(m Message) bool { return m.From == id } }
func to(id ids.ServerID) func(Message) bool   { return func(m Message) bool { return m.To == id } }
func all(Message) bool                        { return true }

func (tn *tnet) owners(ino ids.Ino) []ids.ServerID {
	var o []ids.ServerID
	for _, id := range tn.peers {
		if n := tn.nodes[id]; n != nil && n.Owns(tn.now, ino) {
			o = append(o, id)
		}
	}
	return o
}

func TestAcquireTwoRoundTrips(t *testing.T) {
	tn := newNet(t, 3, nil)
	tn.nodes[1].Acquire(tn.now, 7)
	prepares := tn.take(all)
	if len(prepares) != 2 {
		t.Fatalf("prepares: %v", prepares)
	}
	tn.deliver(prepares...)
	promises := tn.take(all)
	tn.deliver(promises...)
	proposes := tn.take(all)
	tn.deliver(proposes...)
	accepts := tn.take(all)
	tn.deliver(accepts...)
	if o := tn.owners(7); len(o) != 1 || o[0] != 1 {
		t.Fatalf("owners %v", o)
	}
	learns := tn.take(all)
	if len(learns) != 2 || learns[0].Entries[0].Kind != KindLearn {
		t.Fatalf("learns %v", learns)
	}
	if n := len(prepares) + len(promises) + len(proposes) + len(accepts); n != 8 {
		t.Fatalf("%d messages before learning, want 8 (2 round trips to 2 peers)", n)
	}
	if len(tn.events) != 1 || tn.events[0].Kind != Acquired || tn.events[0].Epoch != prepares[0].Entries[0].Ballot {
		t.Fatalf("events %v", tn.events)
	}
}

func TestBatchingOneMessagePerPeer(t *testing.T) {
	tn := newNet(t, 3, nil)
	for ino := range ids.Ino(1000) {
		tn.nodes[1].Acquire(tn.now, ino+1)
	}
	ms := tn.take(all)
	if len(ms) != 2 || len(ms[0].Entries) != 1000 {
		t.Fatalf("%d messages, %d entries", len(ms), len(ms[0].Entries))
	}
	tn.deliver(ms...)
	tn.settle()
	// renewals also batch: one round later, one prepare per peer for all
	tn.advance(tn.nodes[1].lease * 3 / 4)
	ms = tn.take(from(1))
	if len(ms) != 2 || len(ms[0].Entries) != 1000 || ms[0].Entries[0].Kind != KindPrepare {
		t.Fatalf("renewal: %d messages", len(ms))
	}
}

func TestQuorumCountsDistinctAcceptors(t *testing.T) {
	tn := newNet(t, 5, nil)
	tn.nodes[1].Acquire(tn.now, 7)
	tn.deliver(tn.take(to(2))...)
	p := tn.take(from(2))
	tn.take(all)
	// node 2's promise arrives three times; with node 1's own that is four
	// responses but two acceptors, below the quorum of three
	tn.deliver(p...)
	tn.deliver(p...)
	tn.deliver(p...)
	if ms := tn.take(all); len(ms) != 0 {
		t.Fatalf("proposed on duplicates: %v", ms)
	}
}

func TestResponsesAfterDeadlineVoid(t *testing.T) {
	tn := newNet(t, 3, nil)
	tn.nodes[1].Acquire(tn.now, 7)
	tn.deliver(tn.take(all)...)
	promises := tn.take(all)
	// the deadline runs from the Prepare's send, not from any quorum
	tn.advance(tn.nodes[1].lease)
	tn.deliver(promises...)
	if ms := tn.take(func(m Message) bool { return m.Entries[0].Kind == KindPropose }); len(ms) != 0 {
		t.Fatalf("proposed after the deadline: %v", ms)
	}
}

// TestDeadlinesCheckedWithoutTick: a node whose loop stalled handles a late
// response, or is asked who owns, before its timer runs; the state decides.
func TestDeadlinesCheckedWithoutTick(t *testing.T) {
	tn := newNet(t, 3, nil)
	tn.nodes[1].Acquire(tn.now, 7)
	tn.settle()
	until, _, _ := tn.nodes[1].OwnedExpiry(tn.now, 7)
	if tn.nodes[1].Owns(until, 7) || !tn.nodes[1].Owns(until-1, 7) {
		t.Fatal("ownership not judged by the clock")
	}
	tn.nodes[2].Acquire(tn.now, 8)
	tn.deliver(tn.take(all)...)
	promises := tn.take(all)
	tn.now = tn.now.Add(tn.nodes[2].lease) // stalled: no Tick
	tn.deliver(promises...)
	if ms := tn.take(func(m Message) bool { return m.Entries[0].Kind == KindPropose }); len(ms) != 0 {
		t.Fatalf("late responses counted: %v", ms)
	}
}

func TestBeliefFromSendWithDriftMargin(t *testing.T) {
	tn := newNet(t, 3, nil)
	sent := tn.now
	tn.nodes[1].Acquire(tn.now, 7)
	tn.advance(100 * time.Millisecond) // slow network
	tn.settle()
	until, _, ok := tn.nodes[1].OwnedExpiry(tn.now, 7)
	cfg := tn.nodes[1].cfg
	want := sent.Add(time.Duration(float64(cfg.LeaseTime) / (1 + cfg.Drift)))
	if !ok || until != want {
		t.Fatalf("belief until %v, want send+T/(1+δ) = %v", until, want)
	}
	// acceptors hold T from accept (after send): longer than the belief
	_, _, ok = tn.nodes[2].Accepted(until, 7)
	if !ok {
		t.Fatal("acceptor dropped the lease before the owner stopped believing")
	}
}

func TestPromiseOrdering(t *testing.T) {
	tn := newNet(t, 3, nil)
	a := tn.nodes[3]
	a.Step(tn.now, Message{From: 2, To: 3, Entries: []Entry{{Kind: KindPrepare, Ino: 7, Ballot: 100}}})
	a.Step(tn.now, Message{From: 1, To: 3, Entries: []Entry{{Kind: KindPropose, Ino: 7, Ballot: 50, Owner: 1}}})
	a.Step(tn.now, Message{From: 1, To: 3, Entries: []Entry{{Kind: KindPrepare, Ino: 7, Ballot: 60}}})
	rd := a.Ready()
	var kinds []Kind
	for _, m := range rd.Messages {
		if m.To == 1 {
			for _, e := range m.Entries {
				kinds = append(kinds, e.Kind)
			}
		}
	}
	if len(kinds) != 2 || kinds[0] != KindProposeReject || kinds[1] != KindPrepareReject {
		t.Fatalf("node 1 got %v", kinds)
	}
	if _, _, ok := a.Accepted(tn.now, 7); ok {
		t.Fatal("accepted a ballot below its promise")
	}
}

func TestAcceptorKeepsLiveLeaseOfOtherOwner(t *testing.T) {
	tn := newNet(t, 3, nil)
	a := tn.nodes[3]
	a.Step(tn.now, Message{From: 1, To: 3, Entries: []Entry{{Kind: KindPropose, Ino: 7, Ballot: 50, Owner: 1}}})
	// a higher ballot of another owner must not replace it while it lives
	a.Step(tn.now, Message{From: 2, To: 3, Entries: []Entry{{Kind: KindPropose, Ino: 7, Ballot: 90, Owner: 2}}})
	if o, b, _ := a.Accepted(tn.now, 7); o != 1 || b != 50 {
		t.Fatalf("accepted (%v,%v)", o, b)
	}
	// the same owner's later ballot does (a renewal)
	a.Step(tn.now, Message{From: 1, To: 3, Entries: []Entry{{Kind: KindPropose, Ino: 7, Ballot: 95, Owner: 1}}})
	if o, b, _ := a.Accepted(tn.now, 7); o != 1 || b != 95 {
		t.Fatalf("renewal not accepted: (%v,%v)", o, b)
	}
	// a proposer proposes only itself
	a.Step(tn.now, Message{From: 2, To: 3, Entries: []Entry{{Kind: KindPropose, Ino: 8, Ballot: 99, Owner: 1}}})
	if _, _, ok := a.Accepted(tn.now, 8); ok {
		t.Fatal("accepted a proposal for someone else")
	}
}

func TestReleaseOnlyByOwnerAndBallot(t *testing.T) {
	tn := newNet(t, 3, nil)
	a := tn.nodes[3]
	a.Step(tn.now, Message{From: 1, To: 3, Entries: []Entry{{Kind: KindPropose, Ino: 7, Ballot: 50, Owner: 1}}})
	for _, m := range []Message{
		{From: 2, To: 3, Entries: []Entry{{Kind: KindRelease, Ino: 7, Ballot: 50, Owner: 1}}}, // not from the owner
		{From: 2, To: 3, Entries: []Entry{{Kind: KindRelease, Ino: 7, Ballot: 50, Owner: 2}}}, // not the owner
		{From: 1, To: 3, Entries: []Entry{{Kind: KindRelease, Ino: 7, Ballot: 40, Owner: 1}}}, // an older lease
	} {
		a.Step(tn.now, m)
		if _, _, ok := a.Accepted(tn.now, 7); !ok {
			t.Fatalf("%v dropped the lease", m.Entries[0])
		}
	}
	a.Step(tn.now, Message{From: 1, To: 3, Entries: []Entry{{Kind: KindRelease, Ino: 7, Ballot: 50, Owner: 1}}})
	if _, _, ok := a.Accepted(tn.now, 7); ok {
		t.Fatal("owner's release ignored")
	}
}

func TestOwnLeaseOpenOnlyInMatchingRenewal(t *testing.T) {
	tn := newNet(t, 3, nil)
	tn.nodes[1].Acquire(tn.now, 7)
	tn.settle()
	tn.take(all)
	// node 1 gives it up locally but the acceptors still hold (1, b): a
	// fresh acquire must not treat that report as open
	tn.nodes[1].props[7].heldUntil = 0 // as if the belief had lapsed
	tn.nodes[1].Release(tn.now, 7)
	tn.take(all) // the release is lost
	tn.nodes[1].Acquire(tn.now, 7)
	tn.settle()
	if o := tn.owners(7); len(o) != 0 {
		t.Fatalf("re-acquired over its own unreleased lease: %v", o)
	}
}

func TestExtensionNeedsFreshAcceptQuorum(t *testing.T) {
	tn := newNet(t, 3, nil)
	tn.nodes[1].Acquire(tn.now, 7)
	tn.settle()
	before, _, _ := tn.nodes[1].OwnedExpiry(tn.now, 7)
	tn.advance(tn.nodes[1].lease * 3 / 4) // renewal round starts
	tn.deliver(tn.take(all)...)           // prepares
	tn.deliver(tn.take(all)...)           // promises: the prepare quorum alone extends nothing
	if until, _, _ := tn.nodes[1].OwnedExpiry(tn.now, 7); until != before {
		t.Fatalf("extended to %v on a prepare quorum", until)
	}
	tn.take(all) // proposes lost
	tn.advance(before.Sub(tn.now))
	if o := tn.owners(7); len(o) != 0 {
		t.Fatalf("still owner after the lease without a fresh accept quorum")
	}
	if tn.events[len(tn.events)-1].Kind != Lost {
		t.Fatalf("events %v", tn.events)
	}
}

func TestRenewalKeepsEpoch(t *testing.T) {
	tn := newNet(t, 3, nil)
	tn.nodes[1].Acquire(tn.now, 7)
	tn.settle()
	_, e1, _ := tn.nodes[1].OwnedExpiry(tn.now, 7)
	for range 10 {
		tn.advance(tn.nodes[1].lease / 4)
		tn.settle()
	}
	until, e2, ok := tn.nodes[1].OwnedExpiry(tn.now, 7)
	if !ok || e1 != e2 || until.Sub(tn.now) < tn.nodes[1].lease/4 {
		t.Fatalf("after renewals: ok=%v epoch %v→%v left %v", ok, e1, e2, until.Sub(tn.now))
	}
	if len(tn.events) != 1 {
		t.Fatalf("events %v", tn.events)
	}
}

func TestRestartQuarantine(t *testing.T) {
	tn := newNet(t, 3, nil)
	n3 := tn.boot(3, 2, nil) // restarted: forgot everything
	for _, e := range []Entry{{Kind: KindPrepare, Ino: 7, Ballot: 50}, {Kind: KindPropose, Ino: 7, Ballot: 50, Owner: 1}} {
		n3.Step(tn.now, Message{From: 1, To: 3, Entries: []Entry{e}})
	}
	if rd := n3.Ready(); len(rd.Messages) != 0 {
		t.Fatalf("quarantined node answered: %v", rd.Messages)
	}
	n3.Acquire(tn.now, 9)
	if rd := n3.Ready(); len(rd.Messages) != 0 {
		t.Fatalf("quarantined node proposed: %v", rd.Messages)
	}
	tn.advance(n3.cfg.Quarantine)
	tn.settle()
	if o := tn.owners(9); len(o) != 1 || o[0] != 3 {
		t.Fatalf("after quarantine: owners %v", o)
	}
}

func TestBallots(t *testing.T) {
	c := testConfig(3, []ids.ServerID{1, 2, 3}, 7)
	c.MinEpoch = ids.Epoch(makeBallot(41, 9, 1))
	n, err := New(c, 1)
	if err != nil {
		t.Fatal(err)
	}
	b := n.nextBallot()
	if ballotCounter(uint64(b)) != 42 || BallotBoot(b) != 7 || BallotServer(b) != 3 || b <= c.MinEpoch {
		t.Fatalf("ballot %s", FormatBallot(b))
	}
	// same counter, other boot: still distinct
	c.Boot = 8
	n2, _ := New(c, 1)
	if b2 := n2.nextBallot(); b2 == b {
		t.Fatal("ballot reused across boots")
	}
	// Lamport: a seen ballot lifts the next one above it
	n.see(ids.Epoch(makeBallot(1000, 1, 1)))
	if b := n.nextBallot(); ballotCounter(uint64(b)) != 1001 {
		t.Fatalf("ballot %s", FormatBallot(b))
	}
}

func TestLearnerNeverOutlivesOwner(t *testing.T) {
	tn := newNet(t, 3, nil)
	tn.nodes[1].Acquire(tn.now, 7)
	tn.settle()
	ownerUntil, _, _ := tn.nodes[1].OwnedExpiry(tn.now, 7)
	if o, ok := tn.nodes[2].Owner(tn.now, 7); !ok || o != 1 {
		t.Fatalf("learner: %v %v", o, ok)
	}
	if o, ok := tn.nodes[2].Owner(ownerUntil.Add(-tn.nodes[2].cfg.MaxDelay), 7); ok {
		t.Fatalf("learner still names %v within MaxDelay of the owner's expiry", o)
	}
	tn.nodes[1].Release(tn.now, 7)
	tn.settle()
	if o, ok := tn.nodes[2].Owner(tn.now, 7); ok {
		t.Fatalf("learner names %v after release", o)
	}
}

func TestIdleInstancesFreed(t *testing.T) {
	tn := newNet(t, 3, nil)
	for ino := range ids.Ino(100) {
		tn.nodes[1].Acquire(tn.now, ino)
	}
	tn.settle()
	for ino := range ids.Ino(100) {
		tn.nodes[1].Release(tn.now, ino)
	}
	tn.settle()
	tn.advance(3 * tn.nodes[1].cfg.LeaseTime)
	for _, id := range tn.peers {
		n := tn.nodes[id]
		if len(n.acc)+len(n.learnt)+len(n.props) != 0 {
			t.Errorf("n%d keeps %d acceptor, %d learner, %d proposer entries", id, len(n.acc), len(n.learnt), len(n.props))
		}
		if !n.NextDeadline().IsZero() {
			t.Errorf("n%d still wants a tick at %v", id, n.NextDeadline())
		}
	}
}

func TestRepeatedAcquireBacksOff(t *testing.T) {
	tn := newNet(t, 3, nil)
	tn.nodes[1].Acquire(tn.now, 7)
	tn.settle()
	tn.nodes[2].Acquire(tn.now, 7)
	tn.settle() // blocked by node 1's lease
	for range 5 {
		tn.nodes[2].Acquire(tn.now, 7)
	}
	if ms := tn.take(all); len(ms) != 0 {
		t.Fatalf("repeated Acquire sent %v", ms)
	}
}

func TestHandOver(t *testing.T) {
	tn := newNet(t, 3, nil)
	tn.nodes[1].Acquire(tn.now, 7)
	tn.settle()
	tn.nodes[2].Acquire(tn.now, 7)
	tn.settle()
	if o := tn.owners(7); len(o) != 1 || o[0] != 1 {
		t.Fatalf("owners %v", o)
	}
	tn.nodes[1].Release(tn.now, 7)
	tn.settle()
	tn.advance(0) // node 2 retries at once on the learnt release
	tn.settle()
	if o := tn.owners(7); len(o) != 1 || o[0] != 2 {
		t.Fatalf("after hand-over owners %v", o)
	}
	_, e2, _ := tn.nodes[2].OwnedExpiry(tn.now, 7)
	if e2 <= tn.events[0].Epoch {
		t.Fatalf("new epoch %v not above %v", e2, tn.events[0].Epoch)
	}
}

func TestValidate(t *testing.T) {
	peers := []ids.ServerID{1, 2, 3}
	for name, mut := range map[string]func(*Config){
		"zero id":          func(c *Config) { c.ID = 0 },
		"not a peer":       func(c *Config) { c.ID = 4 },
		"repeated peer":    func(c *Config) { c.Peers = []ids.ServerID{1, 1, 2} },
		"drift":            func(c *Config) { c.Drift = 1 },
		"short quarantine": func(c *Config) { c.Quarantine = c.LeaseTime },
		"max delay":        func(c *Config) { c.MaxDelay = c.LeaseTime },
		"lease":            func(c *Config) { c.LeaseTime = 0 },
	} {
		c := DefaultConfig(1, peers, 1)
		mut(&c)
		if err := c.Validate(); !errors.Is(err, ErrConfig) {
			t.Errorf("%s: %v", name, err)
		}
	}
	c := DefaultConfig(1, peers, 1)
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestStepMisaddressed(t *testing.T) {
	tn := newNet(t, 3, nil)
	if err := tn.nodes[1].Step(tn.now, Message{From: 2, To: 3}); !errors.Is(err, ErrMisaddressed) {
		t.Fatal(err)
	}
}

// TestReusedBallotScripted is the scripted case for the ReuseBallots bug,
// which random seeds rarely reach: a restarted node that reuses a ballot
// counts stale Accepted responses of its previous life and believes past
// the acceptors' timers. The correct node uses a new boot in its ballots.
func TestReusedBallotScripted(t *testing.T) {
	for _, broken := range []bool{false, true} {
		mut := func(c *Config) { c.Unsafe.ReuseBallots = broken }
		tn := newNet(t, 3, mut)
		tn.nodes[1].Acquire(tn.now, 7)
		tn.deliver(tn.take(all)...) // prepares
		tn.deliver(tn.take(all)...) // promises
		tn.deliver(tn.take(all)...) // proposes: acceptors 2, 3 accept now
		stale := tn.take(all)       // their Accepted responses straggle
		tn.boot(1, 2, mut)          // node 1 crashes before it hears them
		tn.advance(tn.nodes[1].cfg.Quarantine)
		tn.nodes[1].Acquire(tn.now, 7)
		tn.deliver(tn.take(all)...) // prepares
		tn.deliver(tn.take(all)...) // promises
		tn.take(all)                // proposes lost
		tn.deliver(stale...)        // stale accepts of the same ino arrive
		_, _, owns := tn.nodes[1].OwnedExpiry(tn.now, 7)
		if owns != broken {
			t.Fatalf("broken=%v: owns=%v", broken, owns)
		}
		if broken {
			// the acceptors accepted nothing of this life: no backing
			if _, _, ok := tn.nodes[2].Accepted(tn.now, 7); ok {
				t.Fatal("scenario: acceptor 2 still holds the old lease")
			}
		}
	}
}
