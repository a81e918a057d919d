package locksim

import (
	"errors"
	"slices"

	"github.com/leasefs/leasefs/internal/clock"
	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/lease"
	"github.com/leasefs/leasefs/locks"
)

type session struct {
	id      ids.SessionID
	openReq uint64 // request id of the OpenSession that created it
}

type cached struct {
	done  bool
	reply *msg
}

type callback struct {
	to               locks.Mode
	seq              uint64
	resendAt, expire clock.Time
	resent           bool
}

type cbKey struct {
	c   ids.ClientID
	ino ids.Ino
}

// server is the simulated server shell around the pure cores: it does what
// metaserver must do with them.
type server struct {
	w           *world
	clk         nodeClock
	up          bool
	incarnation uint64
	nextSession uint64
	cfg         lease.Config // the server's view; IgnoreDelta zeroes δ here
	table       *locks.DataTable
	failing     *lease.FailingSet
	sessions    map[ids.ClientID]session
	cache       map[ids.ClientID]map[uint64]*cached
	pending     map[cbKey]uint64 // deferred lock replies: request id
	callbacks   map[cbKey]*callback
	wakeAt      int64
}

func newServer(w *world, clk nodeClock) *server {
	s := &server{w: w, clk: clk, cfg: w.cfg.Lease}
	if w.cfg.Broken.IgnoreDelta {
		s.cfg.Delta = 0
	}
	s.reset()
	s.up = true
	return s
}

// reset wipes everything a crash loses: the server keeps no lock state on
// disk (DESIGN.md: a restarted server knows no sessions).
func (s *server) reset() {
	s.incarnation++
	s.table = locks.NewDataTable(locks.DataConfig{MaxWaiters: 16})
	s.failing = lease.NewFailingSet(s.cfg)
	s.sessions = map[ids.ClientID]session{}
	s.cache = map[ids.ClientID]map[uint64]*cached{}
	s.pending = map[cbKey]uint64{}
	s.callbacks = map[cbKey]*callback{}
}

func (s *server) now() clock.Time { return s.clk.local(s.w.now) }

func (s *server) crash() {
	s.w.tracef("server crash")
	s.up = false
	s.reset()
}

func (s *server) restart() {
	s.up = true
	now := s.now()
	if !s.w.cfg.Broken.NoGrace {
		g := lease.NewGrace(s.cfg, now)
		s.table.SetGrace(g.Until())
	}
	s.w.tracef("server restart, incarnation %d", s.incarnation)
	s.schedule()
}

func (s *server) reply(req *msg, r msg) {
	r.kind, r.client, r.req = mReply, req.client, req.req
	if r.session == 0 {
		r.session = req.session
	}
	if !r.nack {
		if m := s.cache[req.client]; m != nil {
			m[req.req] = &cached{done: true, reply: &r}
		}
	} else {
		s.w.stats.Nacks++
	}
	s.w.send(0, int(req.client), &r)
}

func (s *server) receive(m *msg) {
	if !s.up {
		return
	}
	now := s.now()
	c := m.client
	if m.kind == mCallbackAck {
		s.callbackAck(m, now)
		return
	}
	// Nothing but a NACK for a client being timed out (Burns et al.).
	if s.failing.Failing(c, now) {
		s.reply(m, msg{nack: true})
		return
	}
	if m.kind == mOpen {
		s.open(m, now)
		return
	}
	if sess, ok := s.sessions[c]; !ok || sess.id != m.session {
		s.reply(m, msg{nack: true})
		return
	}
	if e := s.cache[c][m.req]; e != nil {
		if e.done { // a retransmission or duplicate: at most once
			cp := *e.reply
			s.w.send(0, int(c), &cp)
		}
		return
	}
	s.cache[c][m.req] = &cached{}
	switch m.kind {
	case mLock:
		out, err := s.table.Request(c, m.ino, m.mode)
		if err != nil {
			s.reply(m, msg{err: true})
			return
		}
		s.pending[cbKey{c, m.ino}] = m.req
		s.apply(out, now)
	case mRelease:
		out, _ := s.table.Release(c, m.ino, m.mode, m.seq)
		s.reply(m, msg{})
		s.apply(out, now)
	case mReclaim:
		g, err := s.table.Reclaim(c, m.ino, m.mode)
		if err != nil {
			s.reply(m, msg{err: true})
			return
		}
		s.w.stats.Reclaims++
		s.reply(m, msg{grant: true, ino: g.Ino, mode: g.Mode, seq: g.Seq})
	case mRenew:
		s.reply(m, msg{})
	}
	s.schedule()
}

func (s *server) open(m *msg, now clock.Time) {
	c := m.client
	if old, ok := s.sessions[c]; ok {
		if m.req < old.openReq {
			return // an old duplicate
		}
		if m.req == old.openReq {
			if e := s.cache[c][m.req]; e != nil && e.done {
				cp := *e.reply
				s.w.send(0, int(c), &cp)
			}
			return
		}
		// The client only opens a session after a NACK, having dropped
		// every lock of the old one.
		s.forget(c, now)
	}
	s.nextSession++
	id := ids.SessionID(s.incarnation<<32 | s.nextSession)
	s.sessions[c] = session{id: id, openReq: m.req}
	s.cache[c] = map[uint64]*cached{}
	_, grace := s.table.InGrace()
	s.reply(m, msg{session: id, grace: grace})
	s.schedule()
}

// forget steals c's locks and drops its session.
func (s *server) forget(c ids.ClientID, now clock.Time) {
	s.w.stats.Steals++
	s.w.tracef("server steals locks of client %d", c)
	out := s.table.Steal(c)
	delete(s.sessions, c)
	delete(s.cache, c)
	for k := range s.pending {
		if k.c == c {
			delete(s.pending, k)
		}
	}
	for k := range s.callbacks {
		if k.c == c {
			delete(s.callbacks, k)
		}
	}
	s.apply(out, now)
}

func (s *server) callbackAck(m *msg, now clock.Time) {
	c := m.client
	if s.failing.Failing(c, now) {
		return
	}
	if sess, ok := s.sessions[c]; !ok || sess.id != m.session {
		return
	}
	k := cbKey{c, m.ino}
	if cb := s.callbacks[k]; cb != nil && m.seq >= cb.seq {
		delete(s.callbacks, k)
	}
	out, err := s.table.Release(c, m.ino, m.mode, m.seq)
	if err != nil && !errors.Is(err, locks.ErrNotHeld) && !errors.Is(err, locks.ErrStale) {
		s.w.fail("server: release on callback ack: %v", err)
	}
	s.apply(out, now)
	s.schedule()
}

// apply sends the grants and revocations an outcome asks for.
func (s *server) apply(out locks.Outcome, now clock.Time) {
	for _, g := range out.Grants {
		k := cbKey{g.Client, g.Ino}
		req, ok := s.pending[k]
		if !ok {
			continue
		}
		delete(s.pending, k)
		s.w.stats.Grants++
		r := msg{grant: true, ino: g.Ino, mode: g.Mode, seq: g.Seq, kind: mReply, client: g.Client, req: req, session: s.sessions[g.Client].id}
		if m := s.cache[g.Client]; m != nil {
			m[req] = &cached{done: true, reply: &r}
		}
		if s.failing.Failing(g.Client, now) {
			continue // never an ACK to a client being timed out
		}
		cp := r
		s.w.send(0, int(g.Client), &cp)
	}
	for _, rv := range out.Revokes {
		if s.failing.Failing(rv.Client, now) {
			continue
		}
		s.w.stats.Revokes++
		dt := s.w.cfg.DeliveryTimeout
		s.callbacks[cbKey{rv.Client, rv.Ino}] = &callback{to: rv.To, seq: rv.Seq, resendAt: now.Add(dt / 2), expire: now.Add(dt)}
		s.sendRevoke(rv.Client, rv.Ino, rv.To, rv.Seq)
	}
}

func (s *server) sendRevoke(c ids.ClientID, ino ids.Ino, to locks.Mode, seq uint64) {
	s.w.send(0, int(c), &msg{kind: mRevoke, client: c, session: s.sessions[c].id, ino: ino, mode: to, seq: seq})
}

func (s *server) wake(rt int64) {
	if rt == s.wakeAt {
		s.wakeAt = 0
	}
	if !s.up {
		return
	}
	now := s.now()
	keys := make([]cbKey, 0, len(s.callbacks))
	for k := range s.callbacks {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b cbKey) int {
		if a.c != b.c {
			return int(a.c) - int(b.c)
		}
		return int(a.ino) - int(b.ino)
	})
	for _, k := range keys {
		cb := s.callbacks[k]
		if cb == nil {
			continue
		}
		switch {
		case !now.Before(cb.expire):
			// Not acknowledged within the delivery timeout: fail the
			// client (DESIGN.md "Client leases").
			delete(s.callbacks, k)
			s.w.stats.Fails++
			s.w.tracef("server fails client %d (callback ino %d unacked)", k.c, k.ino)
			if s.w.cfg.Broken.StealWithoutWait {
				s.forget(k.c, now)
				continue
			}
			s.failing.Fail(k.c, now)
			for k2 := range s.callbacks {
				if k2.c == k.c {
					delete(s.callbacks, k2)
				}
			}
		case !cb.resent && !now.Before(cb.resendAt):
			cb.resent = true // the transport's retry
			s.sendRevoke(k.c, k.ino, cb.to, cb.seq)
		}
	}
	for _, c := range s.failing.Expired(now) {
		s.forget(c, now)
	}
	s.apply(s.table.Tick(now), now)
	s.schedule()
}

// schedule arms the server's one timer at its cores' next deadline.
func (s *server) schedule() {
	if !s.up {
		return
	}
	var next clock.Time
	set := func(t clock.Time) {
		if next == 0 || t < next {
			next = t
		}
	}
	for _, cb := range s.callbacks {
		if !cb.resent {
			set(cb.resendAt)
		}
		set(cb.expire)
	}
	if d, ok := s.failing.NextDeadline(); ok {
		set(d)
	}
	if d, ok := s.table.NextDeadline(); ok {
		set(d)
	}
	if next == 0 {
		return
	}
	rt := max(s.clk.real(next), s.w.now)
	if s.wakeAt > s.w.now && s.wakeAt <= rt {
		return
	}
	s.wakeAt = rt
	s.w.push(&event{at: rt, kind: evWake, node: 0})
}
