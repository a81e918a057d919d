package metaserver

import (
	"time"

	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/transport"
	"github.com/leasefs/leasefs/wire"
)

// Sessions are bounded (Config.MaxSessions) and those of clients that
// went silent are dropped by one periodic sweep, not by a timer per
// client: the server keeps no lease timer while it serves (Burns et al.).
//
// # Safety
//
// A client's lease runs from the time it sent a request, so it ends, on
// the server's clock, at most τ(1+δ) after the request arrived. A session
// that received nothing for longer than that (silentAfter adds a margin)
// and has no request being handled therefore belongs to a client whose
// lease has lapsed: it trusts none of its locks, and they may be stolen
// without a revocation, as after a failed one. Its next request gets a
// NACK ("unknown session") and it recovers, reclaiming buffered writes.

// enter returns the client's session if id is it, counting a request
// being handled in it (leave ends it); nil if the server does not know
// the session.
func (s *Server) enter(c ids.ClientID, id ids.SessionID) *session {
	s.mu.Lock()
	defer s.mu.Unlock()
	sess := s.sessions[c]
	if sess == nil || sess.id != id {
		return nil
	}
	sess.active++
	sess.lastSeen.Store(time.Now().UnixNano())
	return sess
}

// leave ends a request entered in sess. Its reply renews the client's
// lease, so the session counts as seen now too: a request that waited
// long (for a lock) is not followed by a sweep before the client could
// renew.
func (s *Server) leave(sess *session) {
	s.mu.Lock()
	sess.active--
	sess.lastSeen.Store(time.Now().UnixNano())
	s.mu.Unlock()
}

// silentAfter is how long a session may receive nothing before the sweep
// drops it: τ(1+δ), when the client's lease has surely lapsed, and a
// margin of 4τ, so that a client stopped for a few leases (a debugger, a
// paused VM) finds its session and its cache on return, as DESIGN.md's
// stateless serving promises: its next request renews the lease. With the
// defaults, 10 s: as long as a QUIC connection lives without packets.
func (c *Config) silentAfter() time.Duration {
	return time.Duration(float64(c.ClientLease)*(1+c.ClockDrift)) + 4*c.ClientLease
}

// sweepEvery is the sweep's period.
func (c *Config) sweepEvery() time.Duration { return c.ClientLease / 2 }

// sweepLoop drops silent sessions until stop closes.
func (s *Server) sweepLoop(stop <-chan struct{}) {
	t := time.NewTicker(s.cfg.sweepEvery())
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case now := <-t.C:
			s.sweep(now)
		}
	}
}

// sweep drops the sessions silent since before now - silentAfter, with
// no request being handled, and of clients not being failed (whose
// timer steals their locks). It returns how many it dropped.
func (s *Server) sweep(now time.Time) int {
	cutoff := now.Add(-s.cfg.silentAfter()).UnixNano()
	s.mu.Lock()
	var silent []*session
	for _, sess := range s.sessions {
		if sess.active == 0 && sess.lastSeen.Load() < cutoff {
			silent = append(silent, sess)
		}
	}
	s.mu.Unlock()
	n := 0
	for _, sess := range silent {
		if s.lm.isFailing(sess.client) {
			continue
		}
		if s.dropSilent(sess, cutoff) {
			n++
		}
	}
	return n
}

// dropSilent forgets sess and steals its client's locks, if it is still
// the client's session and still silent. The steal happens under s.mu, so
// that a session the client opens meanwhile (which starts with no locks)
// cannot lose the locks granted in it.
func (s *Server) dropSilent(sess *session, cutoff int64) bool {
	s.mu.Lock()
	if s.sessions[sess.client] != sess || sess.active != 0 || sess.lastSeen.Load() >= cutoff {
		s.mu.Unlock()
		return false
	}
	delete(s.sessions, sess.client)
	s.lm.forgetClient(sess.client)
	s.mu.Unlock()
	s.forgetSession(sess)
	s.counters.SessionsSwept.Add(1)
	s.log.Info("session of a silent client dropped: its lease has lapsed, its locks are stolen",
		"client", sess.client, "session", sess.id, "silent", time.Since(time.Unix(0, sess.lastSeen.Load())).Round(time.Millisecond))
	return true
}

// errTooManySessions answers a session open on a server that has
// MaxSessions sessions of clients that are not silent.
var errTooManySessions = wire.Errf(wire.CodeUnavailable, "server busy: too many client sessions")

// openSession opens a new session for the client, or answers a copy of the
// open that made its current one (the first reply was lost, or a copy
// arrived late): a second session would steal the locks granted in the
// first. An older open than that is stale and refused.
func (s *Server) openSession(tr *transport.Request, req *wire.Request) *wire.Reply {
	c, seq := tr.Client, tr.Seq
	sess := &session{id: newSessionID(), client: c, host: req.Target, mount: req.Name, release: req.NewName, opened: time.Now(),
		openSeq: seq, openHandle: map[ids.Ino]int{}}
	if tr.Conn != nil {
		sess.addr = tr.Conn.RemoteAddr().String()
	}
	sess.lastSeen.Store(time.Now().UnixNano())
	for swept := false; ; swept = true {
		s.mu.Lock()
		old := s.sessions[c]
		if old != nil && seq != 0 && seq <= old.openSeq {
			s.mu.Unlock()
			if seq < old.openSeq {
				return wire.ErrorReply(wire.Errf(wire.CodeInvalid, "stale session open (seq %d, the current session's is %d)", seq, old.openSeq))
			}
			return s.sessionReply(old)
		}
		if old != nil || len(s.sessions) < s.cfg.MaxSessions {
			s.sessions[c] = sess
			// the reply cache exists before the client can use the session
			s.tr.OpenSession(c, sess.id)
			s.mu.Unlock()
			if old != nil {
				s.forgetSession(old)
			}
			break
		}
		s.mu.Unlock()
		if swept {
			s.log.Warn("session refused: too many sessions", "client", c, "host", req.Target, "max", s.cfg.MaxSessions)
			return wire.ErrorReply(errTooManySessions)
		}
		s.sweep(time.Now())
	}
	// A client opens a session with an empty cache: whatever it held
	// before is free.
	s.lm.forgetClient(c)
	s.counters.SessionsOpened.Add(1)
	s.log.Info("session opened", "client", c, "session", sess.id, "host", req.Target, "addr", sess.addr,
		"mountpoint", req.Name, "version", req.NewName)
	return s.sessionReply(sess)
}

func (s *Server) sessionReply(sess *session) *wire.Reply {
	rep := &wire.Reply{Session: &wire.Session{ID: sess.id, Server: s.cfg.ServerID,
		Tau: int64(s.cfg.ClientLease), Delta: s.cfg.ClockDrift}}
	if s.blocks != nil {
		rep.Session.Blocks = s.blocks.announce(s.store)
	}
	return rep
}
