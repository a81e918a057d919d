package metaserver

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/leasefs/leasefs/internal/clock"
	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/lease"
	"github.com/leasefs/leasefs/locks"
	"github.com/leasefs/leasefs/metaserver/paxosnode"
	"github.com/leasefs/leasefs/wire"
)

// errNack answers a client the server is failing or does not know.
var errNack = wire.Errf(wire.CodeNack, "client lease failed: drop caches and recover")

type holdKey struct {
	client ids.ClientID
	ino    ids.Ino
}

// lockMgr is the I/O shell around the pure lock tables and the failing-client
// set: it delivers revocations, times clients out and wakes waiters. One
// mutex serialises every call into the cores.
type lockMgr struct {
	s   *Server
	clk clock.Real

	mu      sync.Mutex
	changed *sync.Cond // inflight dropped
	data    *locks.DataTable
	posix   *locks.PosixTable
	failing *lease.FailingSet
	// waiting requests, woken by grants computed in other goroutines
	// Several requests of one client may wait for the same inode: the
	// table queues the client once, and its grant wakes them all.
	waiters map[holdKey][]waiter
	pwait   map[locks.WaiterID]chan struct{}
	// inflight counts operations executing under a client's lock on an
	// inode; a revocation is completed only when they are done, so no
	// client can be granted a conflicting lock while such an operation
	// still changes the inode.
	inflight map[holdKey]int
	// flushing holds, for each revocation being delivered, when its
	// client last sent a request about the inode (holdKey → *atomic.Int64,
	// Unix nanoseconds): the flush a revocation asks for (noteProgress).
	flushing sync.Map
	stats    lockStats
}

// maxRevokeWait bounds how long a client that keeps flushing may take to
// acknowledge a revocation: its whole dirty budget at a few MB/s.
const maxRevokeWait = 30 * time.Second

// noteProgress records that client sent a request about ino: if a
// revocation of its lock on ino is being delivered, the client is
// flushing for it, and alive.
func (m *lockMgr) noteProgress(client ids.ClientID, ino ids.Ino) {
	if ino == 0 {
		return
	}
	if v, ok := m.flushing.Load(holdKey{client, ino}); ok {
		v.(*atomic.Int64).Store(time.Now().UnixNano())
	}
}

// deliveryContext is the context of delivering a revocation to client:
// it ends when the delivery timeout passed without a request of the
// client about ino (it acknowledges after flushing what it buffered, and
// a large flush takes longer than the timeout), or after maxRevokeWait.
// A client that stopped answering is still failed within the timeout.
func (m *lockMgr) deliveryContext(client ids.ClientID, ino ids.Ino) (context.Context, context.CancelFunc) {
	key := holdKey{client, ino}
	last := new(atomic.Int64)
	start := time.Now()
	last.Store(start.UnixNano())
	if v, loaded := m.flushing.LoadOrStore(key, last); loaded {
		last = v.(*atomic.Int64) // another revocation of the same lock
	}
	ctx, cancel := context.WithDeadline(context.Background(), start.Add(maxRevokeWait))
	timeout := m.s.cfg.DeliveryTimeout
	go func() {
		t := time.NewTimer(timeout)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			idle := time.Since(time.Unix(0, last.Load()))
			if idle >= timeout {
				cancel()
				return
			}
			t.Reset(timeout - idle)
		}
	}()
	return ctx, func() {
		cancel()
		m.flushing.CompareAndDelete(key, last)
	}
}

type lockStats struct {
	Granted, Revoked, Stolen, ClientsFailed, DeliveryErrors int64
}

// newLockMgr builds the lock shell; restarted says whether the data
// directory served clients before (only then is there a grace period).
func newLockMgr(s *Server, restarted bool) *lockMgr {
	lcfg := lease.Config{Tau: s.cfg.ClientLease, Delta: s.cfg.ClockDrift, RenewMargin: s.cfg.ClientLease / 4}
	m := &lockMgr{s: s,
		data:     locks.NewDataTable(locks.DefaultDataConfig()),
		posix:    locks.NewPosixTable(locks.DefaultPosixConfig()),
		failing:  lease.NewFailingSet(lcfg),
		waiters:  map[holdKey][]waiter{},
		pwait:    map[locks.WaiterID]chan struct{}{},
		inflight: map[holdKey]int{},
	}
	m.changed = sync.NewCond(&m.mu)
	// A restarted server grants no lock for τ(1+δ): clients of the previous
	// incarnation may trust their locks until their leases lapse.
	if !restarted {
		return m
	}
	grace := lcfg.FailTimeout()
	m.data.SetGrace(m.clk.Now().Add(grace))
	time.AfterFunc(grace, func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		m.dispatch(m.data.Tick(m.clk.Now()))
	})
	return m
}

func (m *lockMgr) isFailing(c ids.ClientID) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.failing.Failing(c, m.clk.Now())
}

// held is a lock an operation executes under; done must be called after.
type held struct {
	key   holdKey
	grant locks.Grant
	fresh bool // the client held no lock on the inode before
}

// waiter is one operation waiting for a grant.
type waiter struct {
	ch   chan locks.Grant
	mode locks.Mode
}

// acquire gets mode on ino for client c, waiting for revocations, and
// marks an operation in flight under it.
func (m *lockMgr) acquire(ctx context.Context, c ids.ClientID, ino ids.Ino, mode locks.Mode) (held, error) {
	key := holdKey{c, ino}
	m.mu.Lock()
	if m.failing.Failing(c, m.clk.Now()) {
		m.mu.Unlock()
		return held{}, errNack
	}
	fresh := m.data.Mode(c, ino) == locks.None
	out, err := m.data.Request(c, ino, mode)
	if err != nil {
		m.mu.Unlock()
		// a client's requests can queue past the table's bound in a loop
		m.s.warns.Warn(m.s.log, c.String(), "lock request refused", "client", c, "ino", ino, "mode", mode, "err", err)
		return held{}, wire.Errf(wire.CodeAgain, "%v", err)
	}
	var ch chan locks.Grant
	if out.Queued {
		ch = make(chan locks.Grant, 1)
		m.waiters[key] = append(m.waiters[key], waiter{ch, mode})
	}
	own, ok := m.dispatchFor(out, key)
	m.mu.Unlock()
	if ok {
		return held{key, own, fresh}, nil
	}
	select {
	case g := <-ch:
		if m.isFailing(c) {
			// Granted while the client was being failed: it must get a
			// NACK, never a lock; the steal clears the grant.
			m.done(held{key: key, grant: g})
			return held{}, errNack
		}
		return held{key, g, fresh}, nil
	case <-ctx.Done():
		m.mu.Lock()
		defer m.mu.Unlock()
		select {
		case g := <-ch: // granted while we gave up: undo
			m.inflight[key]--
			m.changed.Broadcast()
			_ = g
		default:
		}
		rest := slices.DeleteFunc(m.waiters[key], func(w waiter) bool { return w.ch == ch })
		if len(rest) > 0 {
			m.waiters[key] = rest
			return held{}, ctx.Err()
		}
		delete(m.waiters, key)
		if out, err := m.data.Cancel(c, ino); err == nil {
			m.dispatch(out)
		}
		return held{}, ctx.Err()
	}
}

// done ends an operation under h.
func (m *lockMgr) done(h held) {
	m.mu.Lock()
	if m.inflight[h.key]--; m.inflight[h.key] <= 0 {
		delete(m.inflight, h.key)
	}
	m.changed.Broadcast()
	m.mu.Unlock()
}

// dispatch acts on an outcome: wakes granted waiters, sends revocations.
// Called with mu held.
func (m *lockMgr) dispatch(out locks.Outcome) { m.dispatchFor(out, holdKey{}) }

// dispatchFor is dispatch that also returns self's own grant, if any,
// instead of waking a waiter for it.
func (m *lockMgr) dispatchFor(out locks.Outcome, self holdKey) (locks.Grant, bool) {
	var own locks.Grant
	found := false
	for _, g := range out.Grants {
		key := holdKey{g.Client, g.Ino}
		m.stats.Granted++
		if key == self {
			own, found = g, true
			m.inflight[key]++
		}
		// Only waiters that asked for no more than g: a client's read
		// granted S at once must not wake its own write waiting for X.
		rest := m.waiters[key][:0]
		for _, w := range m.waiters[key] {
			if w.mode > g.Mode {
				rest = append(rest, w)
				continue
			}
			m.inflight[key]++
			w.ch <- g
		}
		if len(rest) == 0 {
			delete(m.waiters, key)
		} else {
			m.waiters[key] = rest
		}
	}
	for _, r := range out.Revokes {
		m.stats.Revoked++
		go m.revoke(r)
	}
	return own, found
}

// revoke delivers one revocation and completes it, or fails the client
// when its application does not acknowledge in time (Burns et al.: a
// delivery error starts the server's only lease timer).
func (m *lockMgr) revoke(r locks.Revoke) {
	if _, peer := paxosnode.PeerOf(r.Client); peer {
		// a hand-over's pseudo client (package ownership): it releases
		// the lock itself as soon as the hand-over is done
		return
	}
	ctx, cancel := m.deliveryContext(r.Client, r.Ino)
	defer cancel()
	cb := (&wire.Callback{Kind: wire.CallbackRevoke, Ino: r.Ino, Mode: wire.LockMode(r.To), Seq: r.Seq}).Append(nil)
	start := time.Now()
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
	m.s.observeRevocation(time.Since(start), err == nil)
	if err != nil {
		m.s.log.Warn("revocation not acknowledged; failing client", "client", r.Client, "ino", r.Ino, "err", err)
		m.fail(r.Client, "revocation not acknowledged")
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	key := holdKey{r.Client, r.Ino}
	for m.inflight[key] > 0 {
		m.changed.Wait()
	}
	out, err := m.data.Release(r.Client, r.Ino, r.To, r.Seq)
	if err != nil && !errors.Is(err, locks.ErrNotHeld) {
		m.s.log.Debug("release after revocation", "client", r.Client, "ino", r.Ino, "err", err)
	}
	m.dispatch(out)
}

// fail starts the one lease timer the server ever runs for a client: it
// NACKs the client for τ(1+δ), then steals its locks and forgets it.
func (m *lockMgr) fail(c ids.ClientID, why string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.clk.Now()
	if m.failing.Failing(c, now) {
		return
	}
	m.stats.ClientsFailed++
	deadline := m.failing.Fail(c, now)
	m.s.log.Warn("client failing: NACKing its requests until its lease has surely expired",
		"client", c, "reason", why, "steal_in", deadline.Sub(now))
	time.AfterFunc(deadline.Sub(now), m.expire)
}

// expire steals the locks of clients whose failing timer ran out.
func (m *lockMgr) expire() {
	m.mu.Lock()
	expired := m.failing.Expired(m.clk.Now())
	for _, c := range expired {
		m.stealLocked(c)
	}
	m.mu.Unlock()
	for _, c := range expired {
		m.s.log.Warn("client timed out: locks stolen, session forgotten", "client", c)
		m.s.dropSession(c)
	}
}

// stealLocked takes every data and POSIX lock of c. Called with mu held.
func (m *lockMgr) stealLocked(c ids.ClientID) {
	out := m.data.Steal(c)
	m.stats.Stolen += int64(len(out.Grants))
	for k := range m.inflight {
		if k.client == c {
			delete(m.inflight, k)
		}
	}
	m.changed.Broadcast()
	m.dispatch(out)
	m.posixGranted(m.posix.Steal(c))
}

// release drops c's lock on ino (the client evicted it or closed cleanly).
func (m *lockMgr) release(c ids.ClientID, ino ids.Ino, to locks.Mode, seq uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	key := holdKey{c, ino}
	for m.inflight[key] > 0 {
		m.changed.Wait()
	}
	if out, err := m.data.Release(c, ino, to, seq); err == nil {
		m.dispatch(out)
	}
}

// forgetClient releases everything of a client that told us it holds
// nothing (new session after NACK, or goodbye).
func (m *lockMgr) forgetClient(c ids.ClientID) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.stealLocked(c)
}

func (m *lockMgr) posixGranted(gs []locks.PosixGrant) {
	for _, g := range gs {
		if ch := m.pwait[g.Waiter]; ch != nil {
			delete(m.pwait, g.Waiter)
			close(ch)
		}
	}
}

// posixLock serves flock and fcntl requests.
func (m *lockMgr) posixLock(ctx context.Context, c ids.ClientID, ino ids.Ino, r wire.PosixLk) (*wire.PosixLk, error) {
	lk := locks.PosixLock{Owner: locks.Owner{Client: c, Owner: r.Owner}, Pid: r.Pid, Flock: r.Flock,
		Type: locks.LockType(r.Type), Start: r.Start, End: r.End}
	m.mu.Lock()
	if m.failing.Failing(c, m.clk.Now()) {
		m.mu.Unlock()
		return nil, errNack
	}
	switch {
	case r.Get:
		conflict, found, err := m.posix.Get(ino, lk)
		m.mu.Unlock()
		if err != nil {
			return nil, wire.Errf(wire.CodeInvalid, "%v", err)
		}
		if !found {
			return &wire.PosixLk{Type: uint8(locks.Unlock)}, nil
		}
		return &wire.PosixLk{Flock: conflict.Flock, Type: uint8(conflict.Type), Start: conflict.Start,
			End: conflict.End, Pid: conflict.Pid, Owner: conflict.Owner.Owner}, nil
	case !r.Wait || lk.Type == locks.Unlock:
		gs, err := m.posix.Set(ino, lk)
		m.posixGranted(gs)
		m.mu.Unlock()
		if errors.Is(err, locks.ErrConflict) {
			return nil, wire.Errf(wire.CodeAgain, "%v", err)
		}
		if err != nil {
			return nil, wire.Errf(wire.CodeInvalid, "%v", err)
		}
		return &wire.PosixLk{}, nil
	}
	id, gs, err := m.posix.SetWait(ino, lk)
	if err != nil {
		m.mu.Unlock()
		if errors.Is(err, locks.ErrDeadlock) {
			return nil, wire.Errf(wire.CodeDeadlock, "%v", err)
		}
		return nil, wire.Errf(wire.CodeInvalid, "%v", err)
	}
	mine := slices.ContainsFunc(gs, func(g locks.PosixGrant) bool { return g.Waiter == id })
	var ch chan struct{}
	if !mine {
		ch = make(chan struct{})
		m.pwait[id] = ch
	}
	m.posixGranted(gs)
	m.mu.Unlock()
	if mine {
		return &wire.PosixLk{}, nil
	}
	select {
	case <-ch:
		return &wire.PosixLk{}, nil
	case <-ctx.Done():
		m.mu.Lock()
		defer m.mu.Unlock()
		select {
		case <-ch: // granted as we gave up: keep it, the kernel retries or unlocks
			return &wire.PosixLk{}, nil
		default:
		}
		delete(m.pwait, id)
		_ = m.posix.Cancel(id)
		return nil, wire.Err(wire.CodeInterrupted)
	}
}

// releaseOwner drops the POSIX locks of one lock owner (file closed).
func (m *lockMgr) releaseOwner(c ids.ClientID, owner uint64, ino ids.Ino) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.posixGranted(m.posix.ReleaseOwner(c, owner, ino))
}
