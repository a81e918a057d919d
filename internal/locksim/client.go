package locksim

import (
	"slices"
	"time"

	"github.com/leasefs/leasefs/internal/clock"
	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/lease"
	"github.com/leasefs/leasefs/locks"
	"github.com/leasefs/leasefs/locks/lockclient"
)

type outReq struct {
	kind      msgKind
	ino       ids.Ino
	mode      locks.Mode
	seq       uint64
	session   ids.SessionID
	firstSent clock.Time // lease starts here: the server replied after it
	firstReal int64
	lastSent  clock.Time
}

// client is a simulated client: its lease, the locks it believes it holds, and
// a workload that takes and releases locks at random.
type client struct {
	w        *world
	node     int
	id       ids.ClientID
	clk      nodeClock
	lease    *lease.Client
	session  ids.SessionID
	opening  bool
	openAt   clock.Time // next OpenSession attempt (backoff after a NACK)
	believed map[ids.Ino]locks.Mode
	seqs     map[ids.Ino]*lockclient.Inode // production's sequence-number rules
	rules    lockclient.Rules
	out      map[uint64]*outReq
	busy     map[ids.Ino]bool // one lock operation per inode at a time
	hold     map[ids.Ino]clock.Time
	nextReq  uint64
	nextWork clock.Time

	reclaim      map[ids.Ino]locks.Mode
	reclaimUntil clock.Time

	frozen    bool
	inbox     []*msg
	cut       int
	wakeAt    int64
	lastGrant int64
}

func newClient(w *world, node int, clk nodeClock) *client {
	return &client{w: w, node: node, id: ids.ClientID(node), clk: clk, lease: lease.NewClient(w.cfg.Lease),
		believed: map[ids.Ino]locks.Mode{}, seqs: map[ids.Ino]*lockclient.Inode{}, out: map[uint64]*outReq{},
		rules: lockclient.Rules{Unsafe: lockclient.Unsafe{IgnoreSeq: w.cfg.Broken.IgnoreSeq}},
		busy:  map[ids.Ino]bool{}, hold: map[ids.Ino]clock.Time{}, lastGrant: -1}
}

func (c *client) now() clock.Time { return c.clk.local(c.w.now) }

func (c *client) seq(ino ids.Ino) *lockclient.Inode {
	in := c.seqs[ino]
	if in == nil {
		in = &lockclient.Inode{}
		c.seqs[ino] = in
	}
	return in
}

// believes is what the client would act on now: a lock it was granted,
// trusted only while its lease is valid on its own clock.
func (c *client) believes(ino ids.Ino) locks.Mode {
	if !c.lease.Valid(c.now()) {
		return locks.None
	}
	return c.believed[ino]
}

func (c *client) rto() time.Duration { return c.w.cfg.Lease.Tau / 16 }

func (c *client) send(kind msgKind, ino ids.Ino, mode locks.Mode, seq uint64) {
	now := c.now()
	c.nextReq++
	o := &outReq{kind: kind, ino: ino, mode: mode, seq: seq, session: c.session, firstSent: now, firstReal: c.w.now, lastSent: now}
	c.out[c.nextReq] = o
	if kind == mLock || kind == mRelease || kind == mReclaim {
		c.busy[ino] = true
	}
	c.lease.Sent(now, kind == mRenew)
	c.transmit(c.nextReq, o)
}

func (c *client) transmit(req uint64, o *outReq) {
	c.w.tracef("client %d sends %v r%d ino%d %v", c.node, o.kind, req, o.ino, o.mode)
	c.w.send(c.node, 0, &msg{kind: o.kind, client: c.id, session: o.session, req: req, ino: o.ino, mode: o.mode, seq: o.seq})
}

func (c *client) receive(m *msg) {
	if c.frozen {
		c.inbox = append(c.inbox, m) // the kernel buffers it
		return
	}
	now := c.now()
	switch m.kind {
	case mRevoke:
		if m.session != c.session {
			return
		}
		in := c.seq(m.ino)
		if c.rules.Revoked(in, m.seq) && c.believed[m.ino] > m.mode {
			// Flush and drop caches, then acknowledge.
			if m.mode == locks.None {
				delete(c.believed, m.ino)
			} else {
				c.believed[m.ino] = m.mode
			}
		}
		ack := c.rules.Ack(in, m.seq)
		c.w.send(c.node, 0, &msg{kind: mCallbackAck, client: c.id, session: c.session, ino: m.ino, mode: m.mode, seq: ack})
	case mReply:
		o := c.out[m.req]
		if o == nil {
			return // a duplicate, or a reply from before a NACK
		}
		delete(c.out, m.req)
		if o.kind == mLock || o.kind == mRelease || o.kind == mReclaim {
			delete(c.busy, o.ino)
		}
		if m.nack {
			c.nacked(now)
			return
		}
		if c.w.cfg.Broken.LeaseFromReceive {
			c.lease.Acked(now, now)
		} else {
			c.lease.Acked(o.firstSent, now)
		}
		switch o.kind {
		case mOpen:
			c.opened(m, now)
		case mLock, mReclaim:
			if m.grant {
				c.granted(m, now)
			}
		}
	}
	c.wake(c.w.now)
}

func (c *client) granted(m *msg, now clock.Time) {
	if _, newest := c.rules.Granted(c.seq(m.ino), m.seq); !newest {
		return // a revocation or a grant with a later number already applies
	}
	if m.mode > c.believed[m.ino] {
		c.believed[m.ino] = m.mode
	}
	c.lastGrant = c.w.now
	if !c.w.faulty {
		c.w.stats.LivenessGrants++
	}
	c.hold[m.ino] = now.Add(time.Duration(c.w.r.Int64N(int64(c.w.cfg.Lease.Tau / 2))))
}

// nacked drops everything held at the server and opens a new session. Locks
// trusted under a still-valid lease may be reclaimed if the server turns out
// to have restarted, but only until that lease would have lapsed: after that
// the old server may have stolen them.
func (c *client) nacked(now clock.Time) {
	if c.lease.Valid(now) {
		c.reclaim = map[ids.Ino]locks.Mode{}
		for ino, m := range c.believed {
			c.reclaim[ino] = m
		}
		c.reclaimUntil = c.lease.Expiry()
	}
	c.lease.Nacked(now)
	c.w.tracef("client %d NACKed", c.node)
	c.believed = map[ids.Ino]locks.Mode{}
	c.out = map[uint64]*outReq{}
	c.busy = map[ids.Ino]bool{}
	c.hold = map[ids.Ino]clock.Time{}
	c.session = 0
	c.opening = false
	c.openAt = now.Add(c.rto())
}

func (c *client) opened(m *msg, now clock.Time) {
	c.opening = false
	c.session = m.session
	c.seqs = map[ids.Ino]*lockclient.Inode{} // a new incarnation numbers afresh
	if m.grace && now.Before(c.reclaimUntil) {
		inos := make([]ids.Ino, 0, len(c.reclaim))
		for ino := range c.reclaim {
			inos = append(inos, ino)
		}
		slices.Sort(inos)
		for _, ino := range inos {
			c.send(mReclaim, ino, c.reclaim[ino], 0)
		}
	}
	c.reclaim = nil
}

func (c *client) unfreeze() {
	c.frozen = false
	c.w.tracef("unfreeze client %d with %d buffered messages", c.node, len(c.inbox))
	in := c.inbox
	c.inbox = nil
	// Buffered messages are read in any order (several streams).
	c.w.r.Shuffle(len(in), func(i, j int) { in[i], in[j] = in[j], in[i] })
	for i, m := range in {
		c.receive(m)
		if i < len(in)-1 {
			c.w.check() // the belief may change between two reads
		}
	}
	c.wake(c.w.now)
}

func (c *client) wake(rt int64) {
	if rt == c.wakeAt {
		c.wakeAt = 0
	}
	if c.frozen {
		return
	}
	now := c.now()
	if c.session == 0 {
		if !c.opening && !now.Before(c.openAt) {
			c.opening = true
			c.send(mOpen, 0, 0, 0)
		}
	} else {
		c.work(now)
	}
	// Retransmit what is unanswered (the transport's retries).
	reqs := make([]uint64, 0, len(c.out))
	for r := range c.out {
		reqs = append(reqs, r)
	}
	slices.Sort(reqs)
	for _, r := range reqs {
		o := c.out[r]
		if now.Sub(o.lastSent) >= c.rto() {
			o.lastSent = now
			c.transmit(r, o)
		}
	}
	c.schedule()
}

// work is the workload: take a lock on a random inode now and then, hold it
// for a while, release it; renew the lease explicitly when holding locks.
func (c *client) work(now clock.Time) {
	inos := make([]ids.Ino, 0, len(c.hold))
	for ino := range c.hold {
		inos = append(inos, ino)
	}
	slices.Sort(inos)
	for _, ino := range inos {
		if now.Before(c.hold[ino]) || c.busy[ino] {
			continue
		}
		delete(c.hold, ino)
		if c.believed[ino] != locks.None {
			delete(c.believed, ino) // drop before telling the server
			c.send(mRelease, ino, locks.None, c.seq(ino).Grant())
		}
	}
	if !now.Before(c.nextWork) {
		tau := c.w.cfg.Lease.Tau
		c.nextWork = now.Add(time.Duration(c.w.exp(tau / 3)))
		ino := ids.Ino(1 + c.w.r.IntN(c.w.cfg.Inodes))
		mode := locks.Shared
		if c.w.r.IntN(2) == 0 {
			mode = locks.Exclusive
		}
		if !c.busy[ino] && c.believed[ino] < mode {
			c.send(mLock, ino, mode, 0)
		}
	}
	renewing := false
	for _, o := range c.out {
		renewing = renewing || o.kind == mRenew
	}
	if !renewing && c.lease.NeedsRenewal(now, len(c.believed) > 0) {
		c.send(mRenew, 0, 0, 0)
	}
}

func (c *client) schedule() {
	if c.frozen {
		return
	}
	now := c.now()
	var next clock.Time
	set := func(t clock.Time) {
		if next == 0 || t < next {
			next = t
		}
	}
	if c.session == 0 {
		if !c.opening {
			set(c.openAt)
		}
	} else {
		set(c.nextWork)
		for ino, t := range c.hold {
			if !c.busy[ino] { // else the reply wakes us
				set(t)
			}
		}
		renewing := false
		for _, o := range c.out {
			renewing = renewing || o.kind == mRenew
		}
		if len(c.believed) > 0 && !renewing {
			if ra := c.lease.RenewAt(); ra != 0 {
				// NeedsRenewal paces retries by half the margin.
				if ra.After(now) {
					set(ra)
				} else {
					set(now.Add(c.w.cfg.Lease.RenewMargin / 2))
				}
			}
		}
	}
	for _, o := range c.out {
		set(o.lastSent.Add(c.rto()))
	}
	if next == 0 {
		return
	}
	rt := max(c.clk.real(next), c.w.now)
	if rt == c.w.now {
		rt++ // always progress
	}
	if c.wakeAt > c.w.now && c.wakeAt <= rt {
		return
	}
	c.wakeAt = rt
	c.w.push(&event{at: rt, kind: evWake, node: c.node})
}
