// Package sim is a deterministic simulator for the PaxosLease core
// (lease/paxos): one seed draws the cluster, the fault profile (loss,
// duplication, reordering, delay and stragglers, partitions, crashes that
// wipe memory, restarts, event-loop stalls, clock rates within δ) and the
// workload. After every simulated event a checker asserts DESIGN.md's
// invariant 1 (at most one node believes it owns a resource) and that no
// belief outlives what a quorum of acceptors still allows. A liveness phase
// without faults follows: every contested resource must get an owner within
// a bounded time. The same seed always replays the same run.
package sim

import (
	"container/heap"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/leasefs/leasefs/internal/clock"
	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/lease/paxos"
)

// Options selects one run.
type Options struct {
	Seed uint64
	// Unsafe is copied into every node's config: the deliberately broken
	// variants the tests use to show that the checker catches bugs.
	Unsafe paxos.Unsafe
	// Trace records a readable line per event (slower; used to print a
	// failing seed).
	Trace bool
	// OnlyInvariant1 skips the acceptor-backing check, to see whether a
	// broken variant goes on to two owners at once.
	OnlyInvariant1 bool
}

// Result is the outcome of a run.
type Result struct {
	Seed      uint64
	Profile   string
	Violation string // empty when every check passed
	Safety    bool   // the violation is of safety (not liveness)
	Events    int
	Messages  int
	Acquired  int // Acquired events seen
	Trace     []string
}

const (
	leaseTime   = time.Second
	maxDelay    = 20 * time.Millisecond
	safetyPhase = 24 * leaseTime
	// liveBound: after faults stop, every contested resource must have an
	// owner within this: the longest quarantine, stragglers still in
	// flight (≤ 3T), acceptor timers running out (T) and a few rounds.
	liveBound  = 8 * leaseTime
	probeEvery = leaseTime / 40
)

type evKind uint8

const (
	evDeliver evKind = iota
	evWake
	evWant  // workload: a node starts or stops wanting a resource
	evFault // draw the next fault
	evHeal  // end a partition
	evRestart
	evStallEnd
	evRate
	evProbe
	evLive
)

type event struct {
	at   int64
	seq  uint64
	kind evKind
	node ids.ServerID
	ino  ids.Ino
	gen  uint64
	data []byte
}

type queue []*event

func (q queue) Len() int { return len(q) }
func (q queue) Less(i, j int) bool {
	if q[i].at != q[j].at {
		return q[i].at < q[j].at
	}
	return q[i].seq < q[j].seq
}
func (q queue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *queue) Push(x any)   { *q = append(*q, x.(*event)) }
func (q *queue) Pop() any {
	old := *q
	e := old[len(old)-1]
	*q = old[:len(old)-1]
	return e
}

// node is one simulated server: the core plus its clock and event loop.
type node struct {
	id   ids.ServerID
	core *paxos.Node // nil while down
	boot uint16
	// local clock: base + (real-realBase)*rate, rate within [1, 1+δ], so
	// any two clocks measure any interval within a factor 1+δ.
	base, realBase int64
	rate           float64
	wakeGen        uint64
	stalledUntil   int64
	deferred       []*event // events that arrived while the loop stalled
	wants          map[ids.Ino]bool
}

func (n *node) local(real int64) clock.Time {
	return clock.Time(n.base + int64(float64(real-n.realBase)*n.rate))
}

func (n *node) toReal(t clock.Time) int64 {
	d := float64(int64(t)-n.base) / n.rate
	r := n.realBase + int64(d)
	for n.local(r) < t { // round up
		r++
	}
	return r
}

type sim struct {
	opt    Options
	rng    *rand.Rand
	now    int64
	seq    uint64
	q      queue
	nodes  []*node
	peers  []ids.ServerID
	inos   []ids.Ino
	drift  float64
	quorum int
	res    Result

	// fault profile
	loss, dup, straggle float64
	faultEvery          time.Duration
	live                bool
	side                map[ids.ServerID]bool // partition: true on one side
	liveStart           int64
	owned               map[ids.Ino]bool // liveness: has had an owner since liveStart
}

func (s *sim) push(e *event) {
	s.seq++
	e.seq = s.seq
	heap.Push(&s.q, e)
}

func (s *sim) tracef(format string, a ...any) {
	if s.opt.Trace {
		s.res.Trace = append(s.res.Trace, fmt.Sprintf("%12.6fs ", time.Duration(s.now).Seconds())+fmt.Sprintf(format, a...))
	}
}

func (s *sim) fail(format string, a ...any) {
	if s.res.Violation == "" {
		s.res.Safety = !strings.HasPrefix(format, "liveness")
		s.res.Violation = fmt.Sprintf("t=%.6fs: ", time.Duration(s.now).Seconds()) + fmt.Sprintf(format, a...)
		s.tracef("VIOLATION %s", s.res.Violation)
	}
}

func (s *sim) config(id ids.ServerID, boot uint16) paxos.Config {
	c := paxos.DefaultConfig(id, s.peers, boot)
	c.LeaseTime = leaseTime
	c.Drift = s.drift
	c.MaxDelay = maxDelay
	c.RetryBackoff = 30 * time.Millisecond
	c.Unsafe = s.opt.Unsafe
	c.Quarantine = c.MinQuarantine()
	if c.Unsafe.ShortQuarantine {
		c.Quarantine = 0
	}
	return c
}

// Run runs one seed to completion or to the first violation.
func Run(opt Options) Result {
	s := &sim{opt: opt, rng: rand.New(rand.NewPCG(opt.Seed, opt.Seed^0x9e3779b97f4a7c15)), side: map[ids.ServerID]bool{}, owned: map[ids.Ino]bool{}}
	s.res.Seed = opt.Seed
	r := s.rng
	nn := 3 + 2*r.IntN(2)
	s.quorum = nn/2 + 1
	s.drift = []float64{0.01, 0.05, 0.2}[r.IntN(3)]
	s.loss = r.Float64() * 0.3
	s.dup = r.Float64() * 0.3
	s.straggle = r.Float64() * []float64{0.01, 0.05, 0.3}[r.IntN(3)]
	s.faultEvery = time.Duration(1+r.IntN(8)) * leaseTime / 2
	nino := 1 + r.IntN(3)
	for i := range nino {
		s.inos = append(s.inos, ids.Ino(10+i))
	}
	for i := 1; i <= nn; i++ {
		s.peers = append(s.peers, ids.ServerID(i))
	}
	s.res.Profile = fmt.Sprintf("nodes=%d inos=%d δ=%v loss=%.2f dup=%.2f straggle=%.3f faultEvery=%v",
		nn, nino, s.drift, s.loss, s.dup, s.straggle, s.faultEvery)
	s.tracef("profile %s", s.res.Profile)
	for _, id := range s.peers {
		n := &node{id: id, rate: 1 + r.Float64()*s.drift, base: r.Int64N(int64(1000 * time.Second)), wants: map[ids.Ino]bool{}}
		s.nodes = append(s.nodes, n)
		s.boot(n)
		for _, ino := range s.inos {
			s.push(&event{at: r.Int64N(int64(3 * leaseTime)), kind: evWant, node: id, ino: ino})
		}
		s.push(&event{at: r.Int64N(int64(5 * leaseTime)), kind: evRate, node: id})
	}
	s.push(&event{at: int64(s.faultEvery), kind: evFault})
	s.push(&event{at: 0, kind: evProbe})
	s.push(&event{at: int64(safetyPhase), kind: evLive})
	end := int64(safetyPhase + liveBound)
	for s.q.Len() > 0 && s.res.Violation == "" {
		e := heap.Pop(&s.q).(*event)
		if e.at > end {
			break
		}
		s.now = e.at
		s.res.Events++
		s.deliver(e)
		s.check()
	}
	if s.res.Violation == "" {
		for _, ino := range s.inos {
			if !s.owned[ino] {
				s.fail("liveness: %v got no owner within %v after faults stopped", ino, liveBound)
			}
		}
	}
	return s.res
}

func (s *sim) node(id ids.ServerID) *node { return s.nodes[id-1] }

func (s *sim) boot(n *node) {
	n.boot++
	core, err := paxos.New(s.config(n.id, n.boot), n.local(s.now))
	if err != nil {
		panic(err)
	}
	n.core = core
	n.wakeGen++
	s.tracef("n%d boots (boot %d), quarantined", n.id, n.boot)
	for _, ino := range s.inos {
		if n.wants[ino] {
			core.Acquire(n.local(s.now), ino)
		}
	}
	s.flush(n)
}

// flush sends what the core produced and re-arms its timer.
func (s *sim) flush(n *node) {
	if n.core == nil {
		return
	}
	rd := n.core.Ready()
	for _, ev := range rd.Events {
		s.tracef("n%d event %v epoch=%s", n.id, ev.Kind, paxos.FormatBallot(ev.Epoch))
		if ev.Kind == paxos.Acquired {
			s.res.Acquired++
		}
	}
	for i := range rd.Messages {
		m := &rd.Messages[i]
		s.res.Messages++
		fate := s.transmit(m.To, m.Append(nil))
		if s.opt.Trace {
			var es []string
			for _, e := range m.Entries {
				es = append(es, e.String())
			}
			s.tracef("n%d → n%d: %s%s", m.From, m.To, strings.Join(es, "; "), fate)
		}
	}
	n.wakeGen++
	if dl := n.core.NextDeadline(); !dl.IsZero() {
		at := max(n.toReal(dl), s.now)
		s.push(&event{at: at, kind: evWake, node: n.id, gen: n.wakeGen})
	}
}

func (s *sim) cut(a, b ids.ServerID) bool { return s.side[a] != s.side[b] }

// transmit puts a message on the simulated network and says what became of
// it, for the trace.
func (s *sim) transmit(to ids.ServerID, data []byte) string {
	from := ids.ServerID(data[1])
	copies := 1
	if !s.live {
		if s.cut(from, to) {
			return " (cut off)"
		}
		if s.rng.Float64() < s.loss {
			return " (lost)"
		}
		if s.rng.Float64() < s.dup {
			copies = 2
		}
	}
	var fate []string
	for range copies {
		d := s.rng.Int64N(int64(maxDelay) + 1)
		if !s.live && s.rng.Float64() < s.straggle {
			d = s.rng.Int64N(int64(3 * leaseTime)) // far beyond any bound: safety must not care
			fate = append(fate, fmt.Sprintf("straggles %v", time.Duration(d).Round(time.Millisecond)))
		}
		s.push(&event{at: s.now + d, kind: evDeliver, node: to, data: data})
	}
	if copies == 2 {
		fate = append(fate, "duplicated")
	}
	if len(fate) == 0 {
		return ""
	}
	return " (" + strings.Join(fate, ", ") + ")"
}

func (s *sim) deliver(e *event) {
	switch e.kind {
	case evDeliver, evWake, evWant:
		n := s.node(e.node)
		if n.core == nil {
			if e.kind == evWant {
				s.want(n, e)
			}
			return
		}
		if s.now < n.stalledUntil {
			n.deferred = append(n.deferred, e)
			return
		}
		s.run(n, e)
	case evStallEnd:
		n := s.node(e.node)
		if n.core == nil || s.now < n.stalledUntil {
			return
		}
		// a stalled loop wakes to a backlog in no particular order, timer
		// included: this is what timer-order bugs trip over
		d := n.deferred
		n.deferred = nil
		s.rng.Shuffle(len(d), func(i, j int) { d[i], d[j] = d[j], d[i] })
		s.tracef("n%d resumes with %d queued events", n.id, len(d))
		for _, q := range d {
			s.run(n, q)
			if n.core == nil {
				break
			}
		}
		n.core.Tick(n.local(s.now))
		s.flush(n)
	case evRate:
		n := s.node(e.node)
		n.base, n.realBase = int64(n.local(s.now)), s.now
		if !s.live {
			n.rate = 1 + s.rng.Float64()*s.drift
		}
		s.flush(n) // re-arm the timer at the new rate
		s.push(&event{at: s.now + s.rng.Int64N(int64(5*leaseTime)) + 1, kind: evRate, node: n.id})
	case evFault:
		if !s.live {
			s.fault()
			s.push(&event{at: s.now + s.rng.Int64N(int64(s.faultEvery)) + 1, kind: evFault})
		}
	case evHeal:
		s.side = map[ids.ServerID]bool{}
		s.tracef("partition healed")
	case evRestart:
		if n := s.node(e.node); n.core == nil {
			s.boot(n)
		}
	case evProbe:
		s.push(&event{at: s.now + int64(probeEvery), kind: evProbe})
	case evLive:
		s.startLiveness()
	}
}

// run delivers one event to a running node's loop.
func (s *sim) run(n *node, e *event) {
	now := n.local(s.now)
	switch e.kind {
	case evDeliver:
		m, err := paxos.Parse(e.data)
		if err != nil {
			panic(fmt.Sprintf("sim: parse: %v", err))
		}
		if err := n.core.Step(now, m); err != nil {
			panic(err)
		}
	case evWake:
		if e.gen != n.wakeGen {
			return
		}
		n.core.Tick(now)
	case evWant:
		s.want(n, e)
		return
	}
	s.flush(n)
}

// want toggles a node's wish for a resource during the safety phase.
func (s *sim) want(n *node, e *event) {
	if s.live {
		return
	}
	w := !n.wants[e.ino]
	n.wants[e.ino] = w
	if n.core != nil {
		if w {
			s.tracef("n%d wants %v", n.id, e.ino)
			n.core.Acquire(n.local(s.now), e.ino)
		} else {
			s.tracef("n%d releases %v", n.id, e.ino)
			n.core.Release(n.local(s.now), e.ino)
		}
		s.flush(n)
	}
	hold := s.rng.Int64N(int64(4 * leaseTime))
	if !w {
		hold = s.rng.Int64N(int64(2 * leaseTime))
	}
	s.push(&event{at: s.now + hold + 1, kind: evWant, node: n.id, ino: e.ino})
}

func (s *sim) fault() {
	r := s.rng
	n := s.nodes[r.IntN(len(s.nodes))]
	// crashes weigh most: a restart forgets promises and resets the
	// ballot counter, which is where subtle bugs hide
	switch []int{0, 0, 1, 1, 1, 2, 2, 3}[r.IntN(8)] {
	case 0: // partition
		if len(s.side) > 0 {
			return
		}
		// a random non-empty proper subset is cut off from the rest
		mask := 1 + r.IntN(1<<len(s.nodes)-2)
		var a, b []ids.ServerID
		for i, m := range s.nodes {
			s.side[m.id] = mask&(1<<i) != 0
			if s.side[m.id] {
				a = append(a, m.id)
			} else {
				b = append(b, m.id)
			}
		}
		d := int64(leaseTime)/2 + r.Int64N(int64(4*leaseTime))
		s.tracef("partition %v | %v for %v", a, b, time.Duration(d))
		s.push(&event{at: s.now + d, kind: evHeal})
	case 1: // crash, restart later with memory wiped
		if n.core == nil {
			return
		}
		n.core, n.deferred, n.stalledUntil = nil, nil, 0
		d := r.Int64N(int64(3 * leaseTime))
		s.tracef("n%d crashes, restarts in %v", n.id, time.Duration(d))
		s.push(&event{at: s.now + d, kind: evRestart, node: n.id})
	case 2: // event loop stall (GC pause, swapped out)
		if n.core == nil || s.now < n.stalledUntil {
			return
		}
		d := r.Int64N(int64(2 * leaseTime))
		n.stalledUntil = s.now + d
		s.tracef("n%d stalls for %v", n.id, time.Duration(d))
		s.push(&event{at: n.stalledUntil, kind: evStallEnd, node: n.id})
	case 3: // clock rate change
		s.push(&event{at: s.now, kind: evRate, node: n.id})
	}
}

func (s *sim) startLiveness() {
	s.live = true
	s.liveStart = s.now
	s.side = map[ids.ServerID]bool{}
	s.tracef("faults stop; liveness phase")
	for _, n := range s.nodes {
		if n.core == nil {
			s.boot(n)
		}
	}
	for _, n := range s.nodes {
		if s.now < n.stalledUntil {
			n.stalledUntil = s.now
			s.push(&event{at: s.now, kind: evStallEnd, node: n.id})
		}
	}
	// every resource gets at least one contender, most get several
	for _, ino := range s.inos {
		k := 1 + s.rng.IntN(len(s.nodes))
		for i, n := range s.nodes {
			w := i < k
			if n.wants[ino] != w {
				n.wants[ino] = w
				if w {
					n.core.Acquire(n.local(s.now), ino)
				} else {
					n.core.Release(n.local(s.now), ino)
				}
			}
		}
		s.tracef("contenders for %v: %d", ino, k)
	}
	for _, n := range s.nodes {
		s.flush(n)
	}
}

// check asserts the invariants at the current instant.
func (s *sim) check() {
	for _, ino := range s.inos {
		var owner *node
		for _, n := range s.nodes {
			if n.core == nil {
				continue
			}
			now := n.local(s.now)
			if !n.core.Owns(now, ino) {
				continue
			}
			if owner != nil {
				s.fail("invariant 1: n%d and n%d both own %v", owner.id, n.id, ino)
				return
			}
			owner = n
			if s.live {
				s.owned[ino] = true
			}
			if s.opt.OnlyInvariant1 {
				continue
			}
			b, ok := n.core.LeaseBallot(now, ino)
			if !ok {
				// a broken variant may claim ownership without a lease
				b = 0
			}
			backing := 0
			for _, a := range s.nodes {
				if a.core == nil || a.core.Quarantined(a.local(s.now)) {
					backing++ // forgot everything and answers nothing yet
					continue
				}
				// any live lease of this owner at the acceptor keeps rivals
				// out (a later ballot of the same owner replaces it)
				o, _, ok := a.core.Accepted(a.local(s.now), ino)
				if ok && o == n.id {
					backing++
				}
			}
			if backing < s.quorum {
				s.fail("n%d believes it owns %v (lease %s) but only %d acceptors still hold it", n.id, ino, paxos.FormatBallot(b), backing)
				return
			}
		}
	}
}
