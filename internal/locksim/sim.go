// Package locksim is a deterministic, seeded simulator of DESIGN.md's
// invariant 2 ("at any real time no two clients hold conflicting locks on an
// inode"). It drives production's cores (the lock server lockserver.Server,
// which metaserver runs, the client's lease.Client and its sequence rules
// lockclient.Rules, which cache runs) with one server and several clients,
// adapters that only add sessions, the reply cache, retransmissions and a
// workload, over a simulated
// network that loses, duplicates, delays and reorders messages, with client
// freezes, partitions, server restarts (table wiped, grace period) and clock
// rates that drift within δ. After every event a checker compares what every
// client believes at that real time.
//
// A run is a safety phase with faults followed by a fault-free liveness phase
// in which every client must again get locks. Everything is drawn from the
// seed, so a failing seed replays exactly (Config.Trace prints the events).
//
// Broken variants (Broken) switch off one safety rule each, to test the
// tester: each must be caught. All but LeaseFromReceive are the cores' own
// Unsafe switches; that one makes the client pass the wrong start to
// lease.Client.Acked, the caller's duty.
package locksim

import (
	"container/heap"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/leasefs/leasefs/internal/clock"
	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/lease"
	"github.com/leasefs/leasefs/locks"
)

// Broken switches off one safety rule, to check that the checker notices.
type Broken struct {
	LeaseFromReceive bool // client starts its lease when the reply arrives
	StealWithoutWait bool // lockserver.Unsafe: server steals as soon as a callback times out
	NoGrace          bool // lockserver.Unsafe: restarted server grants at once
	IgnoreDelta      bool // lockserver.Unsafe: server waits τ instead of τ(1+δ)
	// IgnoreSeq (lockclient.Unsafe): the client applies every revocation
	// and grant whatever its sequence number and acknowledges with the
	// highest number seen.
	IgnoreSeq bool
}

func (b Broken) String() string {
	var s []string
	if b.LeaseFromReceive {
		s = append(s, "lease-from-receive")
	}
	if b.StealWithoutWait {
		s = append(s, "steal-without-wait")
	}
	if b.NoGrace {
		s = append(s, "no-grace")
	}
	if b.IgnoreDelta {
		s = append(s, "ignore-delta")
	}
	if b.IgnoreSeq {
		s = append(s, "ignore-seq")
	}
	if len(s) == 0 {
		return "correct"
	}
	return strings.Join(s, ",")
}

// Faults is the fault profile of the safety phase.
type Faults struct {
	Loss, Dup          float64       // per message
	MinDelay, MaxDelay time.Duration // uniform one-way delay
	LongDelay          float64       // fraction of messages delayed up to LongDelayMax
	LongDelayMax       time.Duration
	FreezeEvery        time.Duration // mean time between client freezes (0: none)
	FreezeMax          time.Duration
	PartitionEvery     time.Duration // mean time between client partitions
	PartitionMax       time.Duration
	RestartEvery       time.Duration // mean time between server crashes
	DownMax            time.Duration
	DriftEvery         time.Duration // mean time between clock rate changes
	// ExtremeRates pins the server's clock at rate 1+δ and the clients' at
	// 1, the worst case for the τ(1+δ) rule.
	ExtremeRates bool
}

// Config is one run.
type Config struct {
	Seed            uint64
	Clients, Inodes int
	Lease           lease.Config
	DeliveryTimeout time.Duration
	Safety          time.Duration // real time with faults
	Liveness        time.Duration // fault-free real time after it
	Faults          Faults
	Broken          Broken
	Trace           bool // record every event in Result.Trace
}

// RandomConfig draws a run's whole profile from seed.
func RandomConfig(seed uint64) Config {
	r := rand.New(rand.NewPCG(seed, 0x10c5))
	tau := time.Second
	pick := func(xs ...float64) float64 { return xs[r.IntN(len(xs))] }
	c := Config{
		Seed:            seed,
		Clients:         2 + r.IntN(3),
		Inodes:          1 + r.IntN(3),
		Lease:           lease.Config{Tau: tau, Delta: pick(0, 0.05, 0.2, 0.5), RenewMargin: tau / 8},
		DeliveryTimeout: time.Duration(pick(4, 20)) * tau / 80,
		Safety:          30 * tau,
		Liveness:        30 * tau,
		Faults: Faults{
			Loss:         pick(0, 0.01, 0.05, 0.2),
			Dup:          pick(0, 0.05, 0.2),
			MinDelay:     time.Millisecond,
			MaxDelay:     time.Duration(pick(2, 10, 50)) * time.Millisecond,
			LongDelay:    pick(0, 0.01, 0.05),
			LongDelayMax: time.Duration(pick(0.3, 1, 2) * float64(tau)),
		},
	}
	f := &c.Faults
	// The delivery timeout must cover an ordinary round trip, or the
	// server fails healthy clients forever (DESIGN.md: τ/4 by default).
	f.MaxDelay = min(f.MaxDelay, c.DeliveryTimeout/4)
	if r.IntN(4) != 0 {
		f.FreezeEvery, f.FreezeMax = time.Duration(pick(2, 5, 10)*float64(tau)), time.Duration(pick(0.5, 2, 4)*float64(tau))
	}
	if r.IntN(4) != 0 {
		f.PartitionEvery, f.PartitionMax = time.Duration(pick(2, 5, 10)*float64(tau)), time.Duration(pick(0.5, 2, 4)*float64(tau))
	}
	if r.IntN(3) != 0 {
		f.RestartEvery, f.DownMax = time.Duration(pick(5, 10, 20)*float64(tau)), time.Duration(pick(0.1, 0.5, 2)*float64(tau))
	}
	if r.IntN(2) == 0 {
		f.DriftEvery = time.Duration(pick(1, 5) * float64(tau))
	}
	f.ExtremeRates = r.IntN(3) == 0
	return c
}

// Stats counts what happened in a run.
type Stats struct {
	Events, Messages, Dropped       int
	Grants, Revokes, Reclaims       int
	Fails, Steals, Nacks, Restarts  int
	Freezes, Partitions             int
	LivenessGrants                  int
	MaxBelieversPerInode            int
	ExplicitRenewals, ClientRequest uint64
}

// Result is a run's outcome. Violation is empty when the run passed.
type Result struct {
	Config    Config
	Violation string
	Stats     Stats
	Trace     []string
}

// Replay returns how to rerun a failing seed.
func (r Result) Replay() string {
	b := ""
	if r.Config.Broken != (Broken{}) {
		b = " LOCKSIM_BROKEN=" + r.Config.Broken.String()
	}
	return fmt.Sprintf("LOCKSIM_SEED=%d%s go test ./internal/locksim -run TestReplay -v", r.Config.Seed, b)
}

// --- simulated clocks -------------------------------------------------------

// nodeClock is a node's monotonic clock: piecewise linear in real time with
// a rate in [1, 1+δ], so any two clocks' rates are within a factor 1+δ.
type nodeClock struct {
	baseReal, baseLocal int64
	rate                float64
}

func (c *nodeClock) local(rt int64) clock.Time {
	return clock.Time(c.baseLocal + int64(math.Floor(float64(rt-c.baseReal)*c.rate)))
}

// real returns the first real time at which the clock shows at least l.
func (c *nodeClock) real(l clock.Time) int64 {
	rt := c.baseReal + int64(math.Ceil(float64(int64(l)-c.baseLocal)/c.rate))
	for c.local(rt) < l {
		rt++
	}
	return rt
}

func (c *nodeClock) setRate(rt int64, rate float64) {
	c.baseLocal = int64(c.local(rt))
	c.baseReal = rt
	c.rate = rate
}

// --- events -----------------------------------------------------------------

type evKind uint8

const (
	evDeliver evKind = iota
	evWake
	evFreeze
	evUnfreeze
	evPartition
	evHeal
	evCrash
	evRestart
	evDrift
	evEndSafety
)

type event struct {
	at   int64
	seq  uint64
	kind evKind
	node int // 0 server, 1.. clients
	msg  *msg
	arg  int
}

type eventQueue []*event

func (q eventQueue) Len() int { return len(q) }
func (q eventQueue) Less(i, j int) bool {
	if q[i].at != q[j].at {
		return q[i].at < q[j].at
	}
	return q[i].seq < q[j].seq
}
func (q eventQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *eventQueue) Push(x any)   { *q = append(*q, x.(*event)) }
func (q *eventQueue) Pop() any     { o := *q; e := o[len(o)-1]; *q = o[:len(o)-1]; return e }
func (q eventQueue) peek() *event  { return q[0] }
func (q eventQueue) empty() bool   { return len(q) == 0 }
func (k evKind) String() string {
	return [...]string{"deliver", "wake", "freeze", "unfreeze", "partition", "heal", "crash", "restart", "drift", "end-safety"}[k]
}

// --- messages ---------------------------------------------------------------

type msgKind uint8

const (
	mOpen msgKind = iota
	mLock
	mRelease
	mReclaim
	mRenew
	mCallbackAck
	mReply
	mRevoke
)

func (k msgKind) String() string {
	return [...]string{"open", "lock", "release", "reclaim", "renew", "cb-ack", "reply", "revoke"}[k]
}

type msg struct {
	kind    msgKind
	client  ids.ClientID
	session ids.SessionID
	req     uint64
	ino     ids.Ino
	mode    locks.Mode // lock, reclaim: wanted; release, revoke, cb-ack: to
	seq     uint64
	// replies
	nack  bool
	grant bool
	err   bool
	grace bool
}

func (m *msg) String() string {
	s := fmt.Sprintf("%v c%d s%d r%d", m.kind, m.client, m.session, m.req)
	switch m.kind {
	case mLock, mReclaim, mRelease, mRevoke, mCallbackAck:
		s += fmt.Sprintf(" ino%d %v seq%d", m.ino, m.mode, m.seq)
	case mReply:
		switch {
		case m.nack:
			s += " NACK"
		case m.grant:
			s += fmt.Sprintf(" grant ino%d %v seq%d", m.ino, m.mode, m.seq)
		case m.err:
			s += " err"
		}
		if m.grace {
			s += " grace"
		}
	}
	return s
}

// --- the world --------------------------------------------------------------

type world struct {
	cfg     Config
	r       *rand.Rand
	now     int64
	q       eventQueue
	evSeq   uint64
	srv     *server
	clients []*client // index i is node i+1
	faulty  bool      // safety phase
	stats   Stats
	trace   []string
	failure string
}

// Run executes one simulation.
func Run(cfg Config) Result {
	if err := cfg.Lease.Validate(); err != nil {
		panic(fmt.Sprintf("locksim: %v", err))
	}
	w := &world{cfg: cfg, r: rand.New(rand.NewPCG(cfg.Seed, 0x5eed)), faulty: true}
	delta := cfg.Lease.Delta
	rate := func() float64 { return 1 + delta*w.r.Float64() }
	srvRate := rate()
	if cfg.Faults.ExtremeRates {
		srvRate = 1 + delta
	}
	w.srv = newServer(w, nodeClock{rate: srvRate, baseLocal: int64(time.Hour)})
	for i := 0; i < cfg.Clients; i++ {
		cr := rate()
		if cfg.Faults.ExtremeRates {
			cr = 1
		}
		c := newClient(w, i+1, nodeClock{rate: cr, baseLocal: int64(time.Duration(i+2) * time.Hour)})
		w.clients = append(w.clients, c)
		w.push(&event{at: int64(w.r.IntN(int(cfg.Lease.Tau / 10))), kind: evWake, node: i + 1})
	}
	f := cfg.Faults
	w.scheduleFault(evFreeze, f.FreezeEvery)
	w.scheduleFault(evPartition, f.PartitionEvery)
	w.scheduleFault(evCrash, f.RestartEvery)
	w.scheduleFault(evDrift, f.DriftEvery)
	w.push(&event{at: int64(cfg.Safety), kind: evEndSafety})
	end := int64(cfg.Safety + cfg.Liveness)
	for !w.q.empty() && w.failure == "" {
		e := heap.Pop(&w.q).(*event)
		if e.at > end {
			break
		}
		w.now = e.at
		w.stats.Events++
		w.handle(e)
		w.check()
	}
	if w.failure == "" {
		w.checkLiveness()
	}
	for _, c := range w.clients {
		s := c.lease.Stats()
		w.stats.ExplicitRenewals += s.Renewals
		w.stats.ClientRequest += s.Requests
	}
	return Result{Config: cfg, Violation: w.failure, Stats: w.stats, Trace: w.trace}
}

func (w *world) push(e *event) {
	w.evSeq++
	e.seq = w.evSeq
	heap.Push(&w.q, e)
}

func (w *world) tracef(format string, args ...any) {
	if w.cfg.Trace {
		w.trace = append(w.trace, fmt.Sprintf("%12.6f ", float64(w.now)/1e9)+fmt.Sprintf(format, args...))
	}
}

func (w *world) fail(format string, args ...any) {
	if w.failure == "" {
		w.failure = fmt.Sprintf("t=%.6fs: ", float64(w.now)/1e9) + fmt.Sprintf(format, args...)
		w.tracef("VIOLATION %s", w.failure)
	}
}

// exp draws an exponential duration of the given mean.
func (w *world) exp(mean time.Duration) int64 {
	return int64(w.r.ExpFloat64() * float64(mean))
}

func (w *world) scheduleFault(k evKind, every time.Duration) {
	if every > 0 {
		w.push(&event{at: w.now + w.exp(every), kind: k})
	}
}

func (w *world) handle(e *event) {
	f := w.cfg.Faults
	switch e.kind {
	case evDeliver:
		w.tracef("deliver -> %d: %v", e.node, e.msg)
		if e.node == 0 {
			w.srv.receive(e.msg)
		} else {
			w.clients[e.node-1].receive(e.msg)
		}
	case evWake:
		if e.node == 0 {
			w.srv.wake(e.at)
		} else {
			w.clients[e.node-1].wake(e.at)
		}
	case evFreeze:
		if !w.faulty {
			return
		}
		c := w.clients[w.r.IntN(len(w.clients))]
		if !c.frozen {
			c.frozen = true
			w.stats.Freezes++
			w.tracef("freeze client %d", c.node)
			w.push(&event{at: w.now + 1 + int64(w.r.Int64N(int64(f.FreezeMax))), kind: evUnfreeze, node: c.node})
		}
		w.scheduleFault(evFreeze, f.FreezeEvery)
	case evUnfreeze:
		w.clients[e.node-1].unfreeze()
	case evPartition:
		if !w.faulty {
			return
		}
		c := w.clients[w.r.IntN(len(w.clients))]
		if c.cut == 0 {
			c.cut = 1 + w.r.IntN(3) // 1: both ways, 2: to server, 3: from server
			w.stats.Partitions++
			w.tracef("partition client %d mode %d", c.node, c.cut)
			w.push(&event{at: w.now + 1 + int64(w.r.Int64N(int64(f.PartitionMax))), kind: evHeal, node: c.node})
		}
		w.scheduleFault(evPartition, f.PartitionEvery)
	case evHeal:
		w.tracef("heal client %d", e.node)
		w.clients[e.node-1].cut = 0
	case evCrash:
		if !w.faulty {
			return
		}
		if w.srv.up {
			w.srv.crash()
			w.stats.Restarts++
			w.push(&event{at: w.now + 1 + int64(w.r.Int64N(int64(f.DownMax))), kind: evRestart})
		}
		w.scheduleFault(evCrash, f.RestartEvery)
	case evRestart:
		w.srv.restart()
	case evDrift:
		if !w.faulty || f.ExtremeRates {
			return
		}
		d := w.cfg.Lease.Delta
		n := w.r.IntN(len(w.clients) + 1)
		rate := 1 + d*w.r.Float64()
		if n == 0 {
			w.srv.clk.setRate(w.now, rate)
			w.srv.schedule()
		} else {
			c := w.clients[n-1]
			c.clk.setRate(w.now, rate)
			c.schedule()
		}
		w.tracef("drift node %d rate %.4f", n, rate)
		w.scheduleFault(evDrift, f.DriftEvery)
	case evEndSafety:
		w.faulty = false
		w.tracef("end of safety phase: healing everything")
		for _, c := range w.clients {
			c.cut = 0
			if c.frozen {
				c.unfreeze()
			}
		}
		if !w.srv.up {
			w.srv.restart()
		}
	}
}

// send puts m on the wire from node from to node to, applying the faults.
func (w *world) send(from, to int, m *msg) {
	w.stats.Messages++
	f := w.cfg.Faults
	cl := from
	if to != 0 {
		cl = to
	}
	c := w.clients[cl-1]
	if w.faulty {
		if c.cut == 1 || c.cut == 2 && to == 0 || c.cut == 3 && from == 0 || w.r.Float64() < f.Loss {
			w.stats.Dropped++
			w.tracef("drop %d->%d: %v", from, to, m)
			return
		}
	}
	copies := 1
	if w.faulty && w.r.Float64() < f.Dup {
		copies = 2
	}
	for i := 0; i < copies; i++ {
		d := int64(f.MinDelay) + w.r.Int64N(int64(f.MaxDelay-f.MinDelay)+1)
		if w.faulty && f.LongDelay > 0 && w.r.Float64() < f.LongDelay {
			d += w.r.Int64N(int64(f.LongDelayMax) + 1)
		}
		cp := *m
		w.push(&event{at: w.now + d, kind: evDeliver, node: to, msg: &cp})
	}
}

// check is the invariant: at this real time no two clients believe
// conflicting locks on one inode.
func (w *world) check() {
	for ino := ids.Ino(1); ino <= ids.Ino(w.cfg.Inodes); ino++ {
		var holders []string
		x, n := 0, 0
		for _, c := range w.clients {
			m := c.believes(ino)
			if m == locks.None {
				continue
			}
			n++
			if m == locks.Exclusive {
				x++
			}
			holders = append(holders, fmt.Sprintf("client %d %v (lease until %.6fs real)", c.node, m, float64(c.clk.real(c.lease.Expiry()))/1e9))
		}
		w.stats.MaxBelieversPerInode = max(w.stats.MaxBelieversPerInode, n)
		if x > 0 && n > 1 {
			w.fail("conflicting locks on ino %d: %s", ino, strings.Join(holders, "; "))
		}
	}
}

// checkLiveness requires every client to have been granted a lock in the
// second half of the fault-free phase and to have no lock request waiting
// longer than a bound at the end.
func (w *world) checkLiveness() {
	from := int64(w.cfg.Safety + w.cfg.Liveness/2)
	bound := 8 * w.cfg.Lease.FailTimeout()
	for _, c := range w.clients {
		if c.lastGrant < from {
			w.fail("liveness: client %d got no lock after %.3fs (last grant %.3fs)", c.node, float64(from)/1e9, float64(c.lastGrant)/1e9)
			return
		}
		for _, o := range c.out {
			if o.kind == mLock && time.Duration(w.now-o.firstReal) > bound {
				w.fail("liveness: client %d waits %.3fs for %v on ino %d", c.node, float64(w.now-o.firstReal)/1e9, o.mode, o.ino)
				return
			}
		}
	}
}
