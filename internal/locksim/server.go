package locksim

import (
	"errors"

	"github.com/leasefs/leasefs/internal/clock"
	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/locks"
	"github.com/leasefs/leasefs/locks/lockserver"
)

type session struct {
	id      ids.SessionID
	openReq uint64 // request id of the OpenSession that created it
}

type cached struct {
	done  bool
	reply *msg
}

type cbKey struct {
	c   ids.ClientID
	ino ids.Ino
}

// server is the simulated server: sessions and the at-most-once reply
// cache (the transport's part) around the production lock server core.
type server struct {
	w           *world
	clk         nodeClock
	up          bool
	incarnation uint64
	nextSession uint64
	core        *lockserver.Server
	sessions    map[ids.ClientID]session
	cache       map[ids.ClientID]map[uint64]*cached
	pending     map[cbKey]uint64 // deferred lock replies: request id
	wakeAt      int64
}

func newServer(w *world, clk nodeClock) *server {
	s := &server{w: w, clk: clk}
	s.reset(false)
	s.up = true
	return s
}

// reset wipes everything a crash loses: the server keeps no lock state on
// disk (DESIGN.md: a restarted server knows no sessions).
func (s *server) reset(restarted bool) {
	s.incarnation++
	cfg := s.w.cfg
	b := cfg.Broken
	dt := cfg.DeliveryTimeout
	core, err := lockserver.New(lockserver.Config{Lease: cfg.Lease, DeliveryTimeout: dt, MaxRevokeWait: 15 * cfg.Lease.Tau,
		Resend: dt / 2, Data: locks.DataConfig{MaxWaiters: 16}, Posix: locks.DefaultPosixConfig(),
		Unsafe: lockserver.Unsafe{StealWithoutWait: b.StealWithoutWait, NoGrace: b.NoGrace, IgnoreDelta: b.IgnoreDelta}},
		s.now(), restarted)
	if err != nil {
		panic(err)
	}
	s.core = core
	s.sessions = map[ids.ClientID]session{}
	s.cache = map[ids.ClientID]map[uint64]*cached{}
	s.pending = map[cbKey]uint64{}
}

func (s *server) now() clock.Time { return s.clk.local(s.w.now) }

func (s *server) crash() {
	s.w.tracef("server crash")
	s.up = false
}

func (s *server) restart() {
	s.up = true
	s.reset(true)
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
	defer s.ready()
	now := s.now()
	c := m.client
	if m.kind == mCallbackAck {
		s.callbackAck(m, now)
		return
	}
	// Nothing but a NACK for a client being timed out (Burns et al.).
	if s.core.Failing(c) {
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
	if m.ino != 0 {
		s.core.Progress(now, c, m.ino)
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
		s.pending[cbKey{c, m.ino}] = m.req
		if _, err := s.core.Request(now, c, m.ino, m.mode); err != nil {
			delete(s.pending, cbKey{c, m.ino})
			s.reply(m, msg{err: true})
		}
	case mRelease:
		_ = s.core.Release(now, c, m.ino, m.mode, m.seq)
		s.reply(m, msg{})
	case mReclaim:
		g, err := s.core.Reclaim(now, c, m.ino, m.mode)
		if err != nil {
			s.reply(m, msg{err: true})
			return
		}
		s.w.stats.Reclaims++
		s.reply(m, msg{grant: true, ino: g.Ino, mode: g.Mode, seq: g.Seq})
	case mRenew:
		s.reply(m, msg{})
	}
}

func (s *server) callbackAck(m *msg, now clock.Time) {
	if sess, ok := s.sessions[m.client]; !ok || sess.id != m.session {
		return
	}
	err := s.core.Acked(now, m.client, m.ino, m.mode, m.seq)
	if err != nil && !errors.Is(err, locks.ErrNotHeld) && !errors.Is(err, locks.ErrStale) {
		s.w.fail("server: release on callback ack: %v", err)
	}
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
		if s.core.Forget(now, c) == nil {
			s.forget(c)
		}
	}
	s.nextSession++
	id := ids.SessionID(s.incarnation<<32 | s.nextSession)
	s.sessions[c] = session{id: id, openReq: m.req}
	s.cache[c] = map[uint64]*cached{}
	_, grace := s.core.InGrace()
	s.reply(m, msg{session: id, grace: grace})
}

// forget drops c's session, whose locks the core stole.
func (s *server) forget(c ids.ClientID) {
	s.w.stats.Steals++
	s.w.tracef("server steals locks of client %d", c)
	delete(s.sessions, c)
	delete(s.cache, c)
	for k := range s.pending {
		if k.c == c {
			delete(s.pending, k)
		}
	}
}

// ready does what the core asks, then arms the timer.
func (s *server) ready() {
	rd := s.core.Ready()
	for _, f := range rd.Failed {
		s.w.stats.Fails++
		s.w.tracef("server fails client %d (ino %d: %s)", f.Client, f.Ino, f.Reason)
	}
	for _, c := range rd.Stolen {
		s.forget(c)
	}
	for _, g := range append(rd.Grants, rd.Nacks...) {
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
		if s.core.Failing(g.Client) {
			continue // never an ACK to a client being timed out
		}
		cp := r
		s.w.send(0, int(g.Client), &cp)
	}
	for _, rv := range rd.Revokes {
		s.w.stats.Revokes++
		s.w.send(0, int(rv.Client), &msg{kind: mRevoke, client: rv.Client, session: s.sessions[rv.Client].id, ino: rv.Ino, mode: rv.To, seq: rv.Seq})
	}
	s.schedule()
}

func (s *server) wake(rt int64) {
	if rt == s.wakeAt {
		s.wakeAt = 0
	}
	if !s.up {
		return
	}
	s.core.Tick(s.now())
	s.ready()
}

// schedule arms the server's one timer at the core's next deadline.
func (s *server) schedule() {
	if !s.up {
		return
	}
	next := s.core.NextDeadline()
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
