package metaserver

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/leasefs/leasefs/internal/clock"
	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/lease"
	"github.com/leasefs/leasefs/locks"
	"github.com/leasefs/leasefs/locks/lockserver"
	"github.com/leasefs/leasefs/metaserver/paxosnode"
	"github.com/leasefs/leasefs/wire"
)

// errNack answers a client the server is failing or does not know.
var errNack = wire.Errf(wire.CodeNack, "client lease failed: drop caches and recover")

type holdKey struct {
	client ids.ClientID
	ino    ids.Ino
}

// lockMgr is the I/O shell around the lock server core
// (locks/lockserver): it feeds it requests, acknowledgements and time,
// and does what it says: wakes waiting requests, delivers revocations,
// forgets the sessions of clients whose locks were stolen. One mutex
// serialises every call into the core; one timer of the injected clock is
// set to its next deadline.
type lockMgr struct {
	s   *Server
	clk clock.Clock

	mu    sync.Mutex
	core  *lockserver.Server
	timer clock.Timer // set to timerAt, the core's next deadline
	at    clock.Time
	// waiting requests, woken by grants computed in other goroutines.
	// Several requests of one client may wait for the same inode: the
	// table queues the client once, and its grant wakes them all.
	waiters map[holdKey][]waiter
	pwait   map[locks.WaiterID]chan struct{}
	// deliveries: the revocations being delivered to each client, to
	// stop when it fails or loses its locks
	deliveries map[ids.ClientID]map[uint64]context.CancelFunc
	delivery   uint64
	// revoking mirrors the core's revocations outstanding, so that a
	// request's progress note costs no lock when there are none
	revoking       atomic.Int64
	deliveryErrors int64
	// self, during unlockFor, takes the grant for its key into own (a
	// request granted at once) instead of a waiter's channel
	self  holdKey
	own   locks.Grant
	found bool
}

// newLockMgr builds the lock shell; restarted says whether the data
// directory served clients before (only then is there a grace period).
func newLockMgr(s *Server, restarted bool) *lockMgr {
	lcfg := lease.Config{Tau: s.cfg.ClientLease, Delta: s.cfg.ClockDrift, RenewMargin: s.cfg.ClientLease / 4}
	cfg := lockserver.DefaultConfig(lcfg, s.cfg.DeliveryTimeout)
	// a hand-over's pseudo client (package ownership) releases the lock
	// itself as soon as the hand-over is done
	cfg.Local = func(c ids.ClientID) bool { _, peer := paxosnode.PeerOf(c); return peer }
	clk := s.cfg.Clock
	if clk == nil {
		clk = clock.Real{}
	}
	core, err := lockserver.New(cfg, clk.Now(), restarted)
	if err != nil {
		panic(err) // Config.Validate checked the lease and the delivery timeout
	}
	m := &lockMgr{s: s, clk: clk, core: core, waiters: map[holdKey][]waiter{}, pwait: map[locks.WaiterID]chan struct{}{},
		deliveries: map[ids.ClientID]map[uint64]context.CancelFunc{}}
	m.mu.Lock()
	m.unlock()
	return m
}

// unlock does what the core asks, sets the timer to its next deadline and
// releases mu; it logs and forgets sessions after, since the server's
// mutex comes before mu.
func (m *lockMgr) unlock() { m.unlockFor(holdKey{}) }

// unlockFor is unlock that also returns self's grant, if Ready has one,
// and marks an operation in flight under it.
func (m *lockMgr) unlockFor(self holdKey) (own locks.Grant, found bool) {
	m.self, m.found = self, false
	rd := m.core.Ready()
	for _, g := range rd.Grants {
		m.wake(g, false)
	}
	for _, g := range rd.Nacks {
		m.wake(g, true)
	}
	for _, r := range rd.Revokes {
		m.deliver(r)
	}
	for _, g := range rd.PosixGrants {
		if ch := m.pwait[g.Waiter]; ch != nil {
			delete(m.pwait, g.Waiter)
			close(ch)
		}
	}
	for _, f := range rd.Failed {
		m.stopDeliveries(f.Client)
	}
	for _, c := range rd.Stolen {
		m.stopDeliveries(c)
		m.nackWaiters(c)
	}
	m.revoking.Store(int64(m.core.Revoking()))
	m.arm()
	var now clock.Time
	if len(rd.Failed) > 0 {
		now = m.clk.Now()
	}
	failed, stolen := slices.Clone(rd.Failed), slices.Clone(rd.Stolen) // the core reuses rd
	own, found = m.own, m.found
	m.self, m.own, m.found = holdKey{}, locks.Grant{}, false
	m.mu.Unlock()
	for _, f := range failed {
		m.s.log.Warn("client failing: NACKing its requests until its lease has surely expired",
			"client", f.Client, "ino", f.Ino, "reason", f.Reason, "steal_in", f.StealAt.Sub(now))
	}
	for _, c := range stolen {
		m.s.log.Warn("client timed out: locks stolen, session forgotten", "client", c)
		m.s.dropSession(c)
	}
	return own, found
}

// arm sets the one timer to the core's next deadline. Called with mu held.
func (m *lockMgr) arm() {
	next := m.core.NextDeadline()
	if next == m.at {
		return
	}
	m.at = next
	if next.IsZero() {
		if m.timer != nil {
			m.timer.Stop()
		}
		return
	}
	d := clock.Until(m.clk, next)
	if m.timer == nil {
		m.timer = m.clk.AfterFunc(d, m.tick)
	} else {
		m.timer.Reset(d)
	}
}

func (m *lockMgr) tick() {
	m.mu.Lock()
	m.at = 0 // fired: arm again even for the same deadline
	m.core.Tick(m.clk.Now())
	m.unlock()
}

// wake hands grant g to the waiting requests it covers. Called with mu held.
func (m *lockMgr) wake(g locks.Grant, nack bool) {
	key := holdKey{g.Client, g.Ino}
	if key == m.self && !nack {
		m.own, m.found = g, true
		m.core.Begin(g.Client, g.Ino)
	}
	// Only waiters that asked for no more than g: a client's read
	// granted S at once must not wake its own write waiting for X.
	rest := m.waiters[key][:0]
	for _, w := range m.waiters[key] {
		if w.mode > g.Mode {
			rest = append(rest, w)
			continue
		}
		if !nack {
			m.core.Begin(g.Client, g.Ino)
		}
		w.ch <- woken{g, nack}
	}
	if len(rest) == 0 {
		delete(m.waiters, key)
	} else {
		m.waiters[key] = rest
	}
}

// noteProgress records that client sent a request about ino: if a
// revocation of its lock on ino is being delivered, the client is
// flushing for it, and alive (the core extends the revocation's deadline).
func (m *lockMgr) noteProgress(client ids.ClientID, ino ids.Ino) {
	if ino == 0 || m.revoking.Load() == 0 {
		return
	}
	m.mu.Lock()
	m.core.Progress(m.clk.Now(), client, ino)
	m.unlock()
}

func (m *lockMgr) isFailing(c ids.ClientID) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.core.Failing(c)
}

// held is a lock an operation executes under; done must be called after.
type held struct {
	key   holdKey
	grant locks.Grant
	fresh bool // the client held no lock on the inode before
}

// waiter is one operation waiting for a grant.
type waiter struct {
	ch   chan woken
	mode locks.Mode
}

type woken struct {
	g    locks.Grant
	nack bool // granted while the client was being failed
}

// acquire gets mode on ino for client c, waiting for revocations, and
// marks an operation in flight under it.
func (m *lockMgr) acquire(ctx context.Context, c ids.ClientID, ino ids.Ino, mode locks.Mode) (held, error) {
	key := holdKey{c, ino}
	m.mu.Lock()
	fresh := m.core.Mode(c, ino) == locks.None
	queued, err := m.core.Request(m.clk.Now(), c, ino, mode)
	if err != nil {
		m.unlock()
		if errors.Is(err, lockserver.ErrNack) {
			return held{}, errNack
		}
		// a client's requests can queue past the table's bound in a loop
		m.s.warns.Warn(m.s.log, c.String(), "lock request refused", "client", c, "ino", ino, "mode", mode, "err", err)
		return held{}, wire.Errf(wire.CodeAgain, "%v", err)
	}
	if !queued {
		g, ok := m.unlockFor(key) // granted at once
		if !ok {
			return held{}, wire.Errf(wire.CodeAgain, "lock on %v granted to nobody", ino)
		}
		return held{key, g, fresh}, nil
	}
	ch := make(chan woken, 1)
	m.waiters[key] = append(m.waiters[key], waiter{ch, mode})
	m.unlock()
	select {
	case w := <-ch:
		if w.nack {
			// the steal clears the grant
			return held{}, errNack
		}
		return held{key, w.g, fresh}, nil
	case <-ctx.Done():
		m.mu.Lock()
		select {
		case w := <-ch: // granted while we gave up: undo
			if !w.nack {
				m.core.End(m.clk.Now(), c, ino)
			}
		default:
		}
		if !m.dropWaiter(key, ch) {
			_ = m.core.Cancel(m.clk.Now(), c, ino)
		}
		m.unlock()
		return held{}, ctx.Err()
	}
}

// dropWaiter removes the waiter on ch and reports whether others of the
// client still wait for the inode. Called with mu held.
func (m *lockMgr) dropWaiter(key holdKey, ch chan woken) bool {
	rest := slices.DeleteFunc(m.waiters[key], func(w waiter) bool { return w.ch == ch })
	if len(rest) > 0 {
		m.waiters[key] = rest
		return true
	}
	delete(m.waiters, key)
	return false
}

// done ends an operation under h.
func (m *lockMgr) done(h held) {
	m.mu.Lock()
	m.core.End(m.clk.Now(), h.key.client, h.key.ino)
	m.unlock()
}

// deliver starts delivering one revocation. Called with mu held.
func (m *lockMgr) deliver(r locks.Revoke) {
	// The core fails the client when the revocation's deadline passes,
	// and the delivery stops then; the timeout only ends a delivery the
	// core no longer waits for (a newer revocation's acknowledgement).
	ctx, cancel := context.WithTimeout(context.Background(), lockserver.DefaultMaxRevokeWait+m.s.cfg.DeliveryTimeout)
	m.delivery++
	id := m.delivery
	if m.deliveries[r.Client] == nil {
		m.deliveries[r.Client] = map[uint64]context.CancelFunc{}
	}
	m.deliveries[r.Client][id] = cancel
	go m.revoke(ctx, id, r)
}

// nackWaiters answers every request of c still waiting for a lock with a
// NACK: the steal dropped c's place in the queues, so no grant will wake
// them, and the client (in a new session by then, or gone) would wait for
// their replies for ever. Called with mu held.
func (m *lockMgr) nackWaiters(c ids.ClientID) {
	for key, ws := range m.waiters {
		if key.client != c {
			continue
		}
		for _, w := range ws {
			w.ch <- woken{nack: true}
		}
		delete(m.waiters, key)
	}
}

// stopDeliveries ends the deliveries to c. Called with mu held.
func (m *lockMgr) stopDeliveries(c ids.ClientID) {
	for _, cancel := range m.deliveries[c] {
		cancel()
	}
	delete(m.deliveries, c)
}

// revoke delivers one revocation and tells the core whether the client
// acknowledged it (Burns et al.: a delivery error starts the server's
// only lease timer).
func (m *lockMgr) revoke(ctx context.Context, id uint64, r locks.Revoke) {
	cb := (&wire.Callback{Kind: wire.CallbackRevoke, Ino: r.Ino, Mode: wire.LockMode(r.To), Seq: r.Seq}).Append(nil)
	start := m.clk.Now()
	raw, err := m.s.tr.Callback(ctx, r.Client, cb)
	if err == nil {
		var rep *wire.Reply
		if rep, err = wire.ParseReply(raw); err == nil {
			err = rep.Err()
		}
		if err == nil {
			// counted while the lock still protects the file
			m.s.openedLocally(r.Client, r.Ino, rep.Opens)
		}
	}
	m.s.observeRevocation(m.clk.Now().Sub(start), err == nil)
	m.mu.Lock()
	if d := m.deliveries[r.Client]; d != nil {
		if cancel := d[id]; cancel != nil {
			cancel()
			delete(d, id)
		}
		if len(d) == 0 {
			delete(m.deliveries, r.Client)
		}
	}
	now := m.clk.Now()
	if err != nil {
		m.deliveryErrors++
		m.core.Undelivered(now, r.Client, r.Ino, "revocation not acknowledged: "+err.Error())
	} else if err := m.core.Acked(now, r.Client, r.Ino, r.To, r.Seq); err != nil && !errors.Is(err, locks.ErrNotHeld) {
		m.s.log.Debug("release after revocation", "client", r.Client, "ino", r.Ino, "err", err)
	}
	m.unlock()
}

// fail starts the one lease timer the server ever runs for a client: it
// NACKs the client for τ(1+δ), then steals its locks and forgets it.
func (m *lockMgr) fail(c ids.ClientID, why string) {
	m.mu.Lock()
	m.core.Fail(m.clk.Now(), c, why)
	m.unlock()
}

// release drops c's lock on ino (the client evicted it or closed cleanly),
// once the operations in flight under it are done.
func (m *lockMgr) release(c ids.ClientID, ino ids.Ino, to locks.Mode, seq uint64) {
	m.mu.Lock()
	_ = m.core.Release(m.clk.Now(), c, ino, to, seq)
	m.unlock()
}

// forgetClient releases everything of a client that told us it holds
// nothing (new session after NACK, or goodbye). A failing client keeps its
// locks until their steal.
func (m *lockMgr) forgetClient(c ids.ClientID) {
	m.mu.Lock()
	if m.core.Forget(m.clk.Now(), c) == nil {
		m.stopDeliveries(c)
		m.nackWaiters(c)
	}
	m.unlock()
}

// posixLock serves flock and fcntl requests.
func (m *lockMgr) posixLock(ctx context.Context, c ids.ClientID, ino ids.Ino, r wire.PosixLk) (*wire.PosixLk, error) {
	lk := locks.PosixLock{Owner: locks.Owner{Client: c, Owner: r.Owner}, Pid: r.Pid, Flock: r.Flock,
		Type: locks.LockType(r.Type), Start: r.Start, End: r.End}
	m.mu.Lock()
	switch {
	case r.Get:
		conflict, found, err := m.core.PosixGet(c, ino, lk)
		m.unlock()
		if err != nil {
			return nil, posixErr(err)
		}
		if !found {
			return &wire.PosixLk{Type: uint8(locks.Unlock)}, nil
		}
		return &wire.PosixLk{Flock: conflict.Flock, Type: uint8(conflict.Type), Start: conflict.Start,
			End: conflict.End, Pid: conflict.Pid, Owner: conflict.Owner.Owner}, nil
	case !r.Wait || lk.Type == locks.Unlock:
		err := m.core.PosixSet(c, ino, lk)
		m.unlock()
		if err != nil {
			return nil, posixErr(err)
		}
		return &wire.PosixLk{}, nil
	}
	id, granted, err := m.core.PosixSetWait(c, ino, lk)
	if err != nil || granted {
		m.unlock()
		if err != nil {
			return nil, posixErr(err)
		}
		return &wire.PosixLk{}, nil
	}
	ch := make(chan struct{})
	m.pwait[id] = ch
	m.unlock()
	select {
	case <-ch:
		return &wire.PosixLk{}, nil
	case <-ctx.Done():
		m.mu.Lock()
		defer m.unlock()
		select {
		case <-ch: // granted as we gave up: keep it, the kernel retries or unlocks
			return &wire.PosixLk{}, nil
		default:
		}
		delete(m.pwait, id)
		_ = m.core.PosixCancel(id)
		return nil, wire.Err(wire.CodeInterrupted)
	}
}

func posixErr(err error) error {
	switch {
	case errors.Is(err, lockserver.ErrNack):
		return errNack
	case errors.Is(err, locks.ErrConflict):
		return wire.Errf(wire.CodeAgain, "%v", err)
	case errors.Is(err, locks.ErrDeadlock):
		return wire.Errf(wire.CodeDeadlock, "%v", err)
	}
	return wire.Errf(wire.CodeInvalid, "%v", err)
}

// releaseOwner drops the POSIX locks of one lock owner (file closed).
func (m *lockMgr) releaseOwner(c ids.ClientID, owner uint64, ino ids.Ino) {
	m.mu.Lock()
	m.core.PosixReleaseOwner(c, owner, ino)
	m.unlock()
}
