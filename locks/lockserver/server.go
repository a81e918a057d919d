package lockserver

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/leasefs/leasefs/internal/clock"
	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/lease"
	"github.com/leasefs/leasefs/locks"
)

// ErrNack answers a request of a client the server is failing: it gets
// nothing but NACKs until its locks are stolen (Burns et al.).
var ErrNack = errors.New("lockserver: client failing")

// ErrConfig is returned by Config.Validate.
var ErrConfig = errors.New("lockserver: bad config")

// Config configures a Server.
type Config struct {
	// Lease is the clients' lease: a failing client's locks are stolen,
	// and a restarted server's grace ends, τ(1+δ) after they start.
	Lease lease.Config
	// DeliveryTimeout is how long a revocation may go unacknowledged while
	// the client sends nothing about the inode before the client fails.
	DeliveryTimeout time.Duration
	// MaxRevokeWait bounds how long a client that keeps sending requests
	// about the inode (flushing for the revocation) may take to
	// acknowledge; at least DeliveryTimeout.
	MaxRevokeWait time.Duration
	// Resend, if not zero, resends a revocation once when it has gone
	// unacknowledged that long (a transport without retries of its own).
	Resend time.Duration
	Data   locks.DataConfig
	Posix  locks.PosixConfig
	// Local reports the clients the server acts for itself (a hand-over's
	// pseudo client): they are sent no revocation and release by
	// themselves. Nil means none.
	Local func(ids.ClientID) bool
	// Unsafe breaks the protocol on purpose. TEST ONLY: the simulator
	// shows with it that it catches each bug; production leaves it zero.
	Unsafe Unsafe
}

// Unsafe lists deliberate protocol bugs. TEST ONLY.
type Unsafe struct {
	StealWithoutWait bool // a revocation not acknowledged in time steals at once, without failing the client for τ(1+δ)
	NoGrace          bool // a restarted server grants at once
	IgnoreDelta      bool // failing and grace last τ, not τ(1+δ)
}

// DefaultMaxRevokeWait bounds how long a client that keeps flushing may
// take to acknowledge a revocation: its whole dirty budget at a few MB/s.
const DefaultMaxRevokeWait = 30 * time.Second

// DefaultConfig returns production's settings for lease cfg and delivery
// timeout dt: revocations extended by progress up to 30 s, no resends
// (the transport retries), the tables' default bounds.
func DefaultConfig(cfg lease.Config, dt time.Duration) Config {
	return Config{Lease: cfg, DeliveryTimeout: dt, MaxRevokeWait: DefaultMaxRevokeWait,
		Data: locks.DefaultDataConfig(), Posix: locks.DefaultPosixConfig()}
}

// Validate checks the fields and how they relate.
func (c Config) Validate() error {
	if err := c.Lease.Validate(); err != nil {
		return err
	}
	switch {
	case c.DeliveryTimeout <= 0:
		return fmt.Errorf("%w: delivery timeout %v must be positive", ErrConfig, c.DeliveryTimeout)
	case c.MaxRevokeWait < c.DeliveryTimeout:
		return fmt.Errorf("%w: longest revocation %v below the delivery timeout %v", ErrConfig, c.MaxRevokeWait, c.DeliveryTimeout)
	case c.Resend < 0 || c.Resend >= c.DeliveryTimeout && c.Resend != 0:
		return fmt.Errorf("%w: resend after %v must be below the delivery timeout %v", ErrConfig, c.Resend, c.DeliveryTimeout)
	case c.Data.MaxWaiters < 1 || c.Posix.MaxLocks < 1 || c.Posix.MaxWaiters < 1:
		return fmt.Errorf("%w: table bounds must be at least 1", ErrConfig)
	}
	return nil
}

// Failure reports a client that started failing: from now on it gets only
// NACKs, and its locks are stolen at StealAt.
type Failure struct {
	Client  ids.ClientID
	Ino     ids.Ino // the revocation it did not acknowledge; 0 for Fail
	Reason  string
	StealAt clock.Time
}

// Ready is what the caller must do after a call (see the package doc).
// Its slices are valid until the next call into the Server, which reuses
// them.
type Ready struct {
	Grants      []locks.Grant  // wake the requests these grant
	Nacks       []locks.Grant  // granted to a failing client: NACK the requests instead
	Revokes     []locks.Revoke // deliver as callbacks
	PosixGrants []locks.PosixGrant
	Failed      []Failure      // stop delivering to them; NACK them
	Stolen      []ids.ClientID // locks stolen: forget their sessions
}

// Empty reports whether there is nothing to do.
func (r *Ready) Empty() bool {
	return len(r.Grants)+len(r.Nacks)+len(r.Revokes)+len(r.PosixGrants)+len(r.Failed)+len(r.Stolen) == 0
}

// Stats counts what the server did.
type Stats struct {
	Granted, Revoked, Stolen, ClientsFailed int64
}

type key struct {
	c   ids.ClientID
	ino ids.Ino
}

// callback is a revocation being delivered.
type callback struct {
	to       locks.Mode
	seq      uint64
	sent     clock.Time // first delivery of a revocation of this lock: MaxRevokeWait runs from here
	last     clock.Time // delivery or the client's last request about the inode
	resendAt clock.Time // zero: no resend
}

type release struct {
	to  locks.Mode
	seq uint64
}

// Server is the lock server's state. Not safe for concurrent use.
type Server struct {
	cfg       Config
	data      *locks.DataTable
	posix     *locks.PosixTable
	failing   *lease.FailingSet
	callbacks map[key]*callback
	inflight  map[key]int
	deferred  map[key][]release // releases waiting for operations in flight
	ready     Ready
	stats     Stats
}

// New returns a server started at now. restarted says whether clients of
// an earlier incarnation may still trust locks it granted: then it grants
// nothing but reclaims for τ(1+δ).
func New(cfg Config, now clock.Time, restarted bool) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Data.GraceExempt == nil {
		cfg.Data.GraceExempt = cfg.Local
	}
	lcfg := cfg.Lease
	if cfg.Unsafe.IgnoreDelta {
		lcfg.Delta = 0
	}
	s := &Server{cfg: cfg, data: locks.NewDataTable(cfg.Data), posix: locks.NewPosixTable(cfg.Posix),
		failing: lease.NewFailingSet(lcfg), callbacks: map[key]*callback{}, inflight: map[key]int{},
		deferred: map[key][]release{}}
	if restarted && !cfg.Unsafe.NoGrace {
		s.data.SetGrace(lease.NewGrace(lcfg, now).Until())
	}
	return s, nil
}

// Ready returns and clears what the caller must do.
func (s *Server) Ready() Ready {
	r := s.ready
	s.ready = Ready{Grants: r.Grants[:0], Nacks: r.Nacks[:0], Revokes: r.Revokes[:0],
		PosixGrants: r.PosixGrants[:0], Failed: r.Failed[:0], Stolen: r.Stolen[:0]}
	return r
}

// NextDeadline is when Tick must next be called; zero if never (until the
// next call).
func (s *Server) NextDeadline() clock.Time {
	var next clock.Time
	set := func(t clock.Time) {
		if !t.IsZero() && (next.IsZero() || t.Before(next)) {
			next = t
		}
	}
	for _, cb := range s.callbacks {
		set(s.expiry(cb))
		set(cb.resendAt)
	}
	if s.failing.Len() > 0 {
		d, _ := s.failing.NextDeadline()
		set(d)
	}
	if d, ok := s.data.NextDeadline(); ok {
		set(d)
	}
	return next
}

// expiry is when an unacknowledged revocation fails its client: the
// delivery timeout after the client last showed progress, at most
// MaxRevokeWait after the first delivery.
func (s *Server) expiry(cb *callback) clock.Time {
	return min(cb.last.Add(s.cfg.DeliveryTimeout), cb.sent.Add(s.cfg.MaxRevokeWait))
}

// Failing reports whether c is being failed: every request of it must get
// a NACK.
func (s *Server) Failing(c ids.ClientID) bool { return s.failing.Failing(c, 0) }

func (s *Server) local(c ids.ClientID) bool { return s.cfg.Local != nil && s.cfg.Local(c) }

// apply turns a table outcome into what the caller must do.
func (s *Server) apply(now clock.Time, out locks.Outcome) {
	for _, g := range out.Grants {
		s.stats.Granted++
		if s.Failing(g.Client) {
			// never an ACK to a client being failed; the steal clears it
			s.ready.Nacks = append(s.ready.Nacks, g)
			continue
		}
		s.ready.Grants = append(s.ready.Grants, g)
	}
	for _, r := range out.Revokes {
		s.stats.Revoked++
		if s.Failing(r.Client) || s.local(r.Client) {
			// a failing client loses the lock with the steal; a local
			// one releases by itself
			continue
		}
		k := key{r.Client, r.Ino}
		cb := &callback{to: r.To, seq: r.Seq, sent: now, last: now}
		if old := s.callbacks[k]; old != nil {
			cb.sent = old.sent
		}
		if s.cfg.Resend > 0 {
			cb.resendAt = now.Add(s.cfg.Resend)
		}
		s.callbacks[k] = cb
		s.ready.Revokes = append(s.ready.Revokes, r)
	}
}

// Request asks for mode on ino for c. The grant, at once or later, comes
// in Ready().Grants; queued reports that it waits. ErrNack if c is failing,
// a table error (locks.ErrTooManyWaiters, locks.ErrBadMode) otherwise.
func (s *Server) Request(now clock.Time, c ids.ClientID, ino ids.Ino, mode locks.Mode) (queued bool, err error) {
	if s.Failing(c) {
		return false, ErrNack
	}
	out, err := s.data.Request(c, ino, mode)
	if err != nil {
		return false, err
	}
	s.apply(now, out)
	return out.Queued, nil
}

// Cancel withdraws c's queued request on ino.
func (s *Server) Cancel(now clock.Time, c ids.ClientID, ino ids.Ino) error {
	out, err := s.data.Cancel(c, ino)
	if err == nil {
		s.apply(now, out)
	}
	return err
}

// Reclaim grants c, during the grace period, the lock it trusted before the
// server restarted (locks.DataTable.Reclaim).
func (s *Server) Reclaim(now clock.Time, c ids.ClientID, ino ids.Ino, mode locks.Mode) (locks.Grant, error) {
	if s.Failing(c) {
		return locks.Grant{}, ErrNack
	}
	g, err := s.data.Reclaim(c, ino, mode)
	if err == nil {
		s.stats.Granted++
	}
	return g, err
}

// Begin marks an operation executing under c's lock on ino: a release of
// that lock waits until End.
func (s *Server) Begin(c ids.ClientID, ino ids.Ino) { s.inflight[key{c, ino}]++ }

// End ends an operation Begin marked, and applies the releases that
// waited for it.
func (s *Server) End(now clock.Time, c ids.ClientID, ino ids.Ino) {
	k := key{c, ino}
	if s.inflight[k]--; s.inflight[k] > 0 {
		return
	}
	delete(s.inflight, k)
	rs := s.deferred[k]
	delete(s.deferred, k)
	for _, r := range rs {
		s.release(now, k, r.to, r.seq)
	}
}

// Release gives c's lock on ino down to `to` (the client evicted it or
// closed), with the sequence number of its grant; once operations in
// flight under it end.
func (s *Server) Release(now clock.Time, c ids.ClientID, ino ids.Ino, to locks.Mode, seq uint64) error {
	return s.release(now, key{c, ino}, to, seq)
}

func (s *Server) release(now clock.Time, k key, to locks.Mode, seq uint64) error {
	if s.inflight[k] > 0 {
		s.deferred[k] = append(s.deferred[k], release{to, seq})
		return nil
	}
	out, err := s.data.Release(k.c, k.ino, to, seq)
	s.apply(now, out)
	return err
}

// Progress records that c sent a request about ino: if a revocation of its
// lock on ino is being delivered, the client is flushing for it, and alive.
func (s *Server) Progress(now clock.Time, c ids.ClientID, ino ids.Ino) {
	if cb := s.callbacks[key{c, ino}]; cb != nil && now.After(cb.last) {
		cb.last = now
	}
}

// Acked applies c's acknowledgement of a revocation down to `to` with
// sequence number seq: the lock goes down once operations in flight under
// it end. A failing client's acknowledgements change nothing: its locks go
// with the steal. The error is the table's (locks.ErrNotHeld, ErrStale for
// an acknowledgement a newer grant overtook).
func (s *Server) Acked(now clock.Time, c ids.ClientID, ino ids.Ino, to locks.Mode, seq uint64) error {
	if s.Failing(c) {
		return nil
	}
	k := key{c, ino}
	if cb := s.callbacks[k]; cb != nil && seq >= cb.seq {
		delete(s.callbacks, k)
	}
	return s.release(now, k, to, seq)
}

// Undelivered reports that a revocation of c's lock on ino could not be
// delivered or was refused: c fails (Burns et al.: a delivery error starts
// the server's only lease timer). Nothing happens if no revocation of that
// lock is outstanding (acknowledged meanwhile, or the client failed).
func (s *Server) Undelivered(now clock.Time, c ids.ClientID, ino ids.Ino, why string) {
	if s.callbacks[key{c, ino}] == nil {
		return
	}
	s.fail(now, c, ino, why)
}

// Fail starts failing c (an administrator's eviction, an inode's
// ownership lost): NACKs from now on, its locks stolen τ(1+δ) later.
func (s *Server) Fail(now clock.Time, c ids.ClientID, why string) { s.fail(now, c, 0, why) }

func (s *Server) fail(now clock.Time, c ids.ClientID, ino ids.Ino, why string) {
	if s.Failing(c) {
		return
	}
	s.stats.ClientsFailed++
	at := s.failing.Fail(c, now)
	for k := range s.callbacks {
		if k.c == c {
			delete(s.callbacks, k)
		}
	}
	s.ready.Failed = append(s.ready.Failed, Failure{Client: c, Ino: ino, Reason: why, StealAt: at})
}

// InodeGrace grants no client lock on ino before until: this server took
// the inode over without a clean hand-over, and the previous owner's
// clients may trust their locks until then (the ownership grace).
func (s *Server) InodeGrace(ino ids.Ino, until clock.Time) { s.data.SetInodeGrace(ino, until) }

// InodeGraceUntil reports whether ino's grace runs, and until when.
func (s *Server) InodeGraceUntil(ino ids.Ino) (clock.Time, bool) { return s.data.InodeGrace(ino) }

// EndInodeGrace ends ino's grace (the inode left this server).
func (s *Server) EndInodeGrace(now clock.Time, ino ids.Ino) { s.apply(now, s.data.EndInodeGrace(ino)) }

// Forget takes every lock of c at once: it told the server it holds
// nothing (a new session, a goodbye) or its lease surely lapsed (silent
// for long). A failing client is not forgotten before its steal: it may
// still trust its locks (ErrNack).
func (s *Server) Forget(now clock.Time, c ids.ClientID) error {
	if s.Failing(c) {
		return ErrNack
	}
	s.steal(now, c)
	return nil
}

func (s *Server) steal(now clock.Time, c ids.ClientID) {
	out := s.data.Steal(c)
	s.stats.Stolen += int64(len(out.Grants))
	for k := range s.callbacks {
		if k.c == c {
			delete(s.callbacks, k)
		}
	}
	for k := range s.inflight {
		if k.c == c {
			delete(s.inflight, k)
		}
	}
	for k := range s.deferred {
		if k.c == c {
			delete(s.deferred, k)
		}
	}
	s.apply(now, out)
	s.ready.PosixGrants = append(s.ready.PosixGrants, s.posix.Steal(c)...)
}

// Tick acts on the deadlines that passed: revocations not acknowledged
// fail their clients (or are resent once, Config.Resend), failing clients
// whose τ(1+δ) ran out lose their locks, and grace periods end.
func (s *Server) Tick(now clock.Time) {
	keys := make([]key, 0, len(s.callbacks))
	for k := range s.callbacks {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b key) int {
		if a.c != b.c {
			return cmp(a.c, b.c)
		}
		return cmp(a.ino, b.ino)
	})
	for _, k := range keys {
		cb := s.callbacks[k]
		switch {
		case cb == nil:
		case !now.Before(s.expiry(cb)):
			delete(s.callbacks, k)
			if s.cfg.Unsafe.StealWithoutWait {
				s.steal(now, k.c)
				s.ready.Stolen = append(s.ready.Stolen, k.c)
				continue
			}
			s.fail(now, k.c, k.ino, "revocation not acknowledged")
		case !cb.resendAt.IsZero() && !now.Before(cb.resendAt):
			cb.resendAt = 0
			s.ready.Revokes = append(s.ready.Revokes, locks.Revoke{Client: k.c, Ino: k.ino, To: cb.to, Seq: cb.seq})
		}
	}
	for _, c := range s.failing.Expired(now) {
		s.steal(now, c)
		s.ready.Stolen = append(s.ready.Stolen, c)
	}
	s.apply(now, s.data.Tick(now))
}

func cmp[T ~uint64](a, b T) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
