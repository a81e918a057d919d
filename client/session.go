package client

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/leasefs/leasefs/cache"
	"github.com/leasefs/leasefs/internal/clock"
	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/internal/version"
	"github.com/leasefs/leasefs/lease"
	"github.com/leasefs/leasefs/transport"
	"github.com/leasefs/leasefs/wire"
)

// openSession opens a new session on cn; a failing server NACKs it until it
// has stolen our old locks, so it retries until ctx ends.
func (c *Client) openSession(ctx context.Context, cn *conn) error {
	host, _ := os.Hostname()
	// Name and NewName say where and which release: the servers' clients list shows them
	body := (&wire.Request{Op: wire.OpOpenSession, Target: host, Name: c.cfg.Mountpoint, NewName: version.Get().String()}).Append(nil)
	for {
		// Sequence numbers never restart: the server's reply cache must
		// not mistake this open for an earlier one.
		c.mu.Lock()
		h := transport.Header{Client: c.id, Seq: c.nextSeq()}
		c.mu.Unlock()
		sent := c.clk.Now()
		actx, cancel := ctx, context.CancelFunc(func() {})
		if c.clustered() {
			actx, cancel = context.WithTimeout(ctx, c.cfg.FailoverTimeout)
		}
		raw, err := cn.tr.Call(actx, h, body)
		cancel()
		c.seqs.done(h.Seq)
		if err != nil {
			return err
		}
		rep, err := wire.ParseReply(raw)
		if err != nil {
			// a refusal names the server's release; say ours
			return fmt.Errorf("opening a session with %s: %w (this mount runs leasefs %s, wire version %d)", cn.addr, err, version.Get(), wire.Version)
		}
		if rep.Code == wire.CodeUnavailable {
			return rep.Err()
		}
		if rep.Code == wire.CodeNack {
			select {
			case <-time.After(100 * time.Millisecond):
				continue
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		if err := rep.Err(); err != nil {
			return err
		}
		if rep.Session == nil || rep.Session.Tau <= 0 {
			return errors.New("client: server sent no session")
		}
		s := rep.Session
		// Renewed at half-life: the kernel keeps names and attributes only
		// while the lease is renewed in time (kernelLoop drops them a
		// quarter before the end), so a server slow to answer for up to
		// τ/4 costs nothing. An idle client renews every τ/2.
		cfg := lease.Config{Tau: time.Duration(s.Tau), Delta: s.Delta, RenewMargin: time.Duration(s.Tau) / 2}
		if err := cfg.Validate(); err != nil {
			return fmt.Errorf("client: server's lease parameters: %w", err)
		}
		c.mu.Lock()
		cn.session = *s
		cn.server = s.Server
		if cn.lease == nil || cn.lease.Config() != cfg {
			cn.lease = lease.NewClient(cfg)
		}
		cn.holds = false
		if c.renewMargin == 0 {
			c.renewMargin = cfg.RenewMargin
		}
		cn.lease.Sent(sent, false)
		cn.lease.Acked(sent, c.clk.Now())
		c.mu.Unlock()
		if s.Server != 0 {
			c.srv.mu.Lock()
			c.srv.byID[s.Server] = cn.addr
			c.srv.mu.Unlock()
		}
		c.setBlocks(cn, s.Blocks)
		c.answered()
		c.log.Info("session opened", "server", cn.addr, "server_id", s.Server, "session", s.ID,
			"client_lease", time.Duration(s.Tau), "clock_drift", s.Delta)
		return nil
	}
}

// recoverSession handles the loss of the session `lost` on cn, by a NACK or by
// giving its server up: drop every cache, the kernel's too, open a new
// session there unless the server was given up (once, however many
// requests saw it), and reclaim buffered writes.
func (c *Client) recoverSession(ctx context.Context, cn *conn, lost ids.SessionID) error {
	dropped, err := c.renewSession(ctx, cn, lost)
	if dropped {
		c.wb.reclaim(ctx)
	}
	return err
}

// renewSession ends the lost session: if its server granted locks in it,
// it drops the caches (every cache, not just what that server granted: the
// client does not keep which server granted which lock, and losing a
// session is rare) and reports that it did. Then it opens a new session
// there, unless the server was given up. Once per lost session.
func (c *Client) renewSession(ctx context.Context, cn *conn, lost ids.SessionID) (dropped bool, _ error) {
	if err := c.recoverMu.lock(ctx); err != nil {
		return false, err
	}
	defer c.recoverMu.unlock()
	gone := c.isGone(cn)
	c.mu.Lock()
	if lost == 0 || cn.session.ID != lost || cn.lease == nil {
		c.mu.Unlock()
		return false, nil // another request already recovered
	}
	cn.lease.Nacked(c.clk.Now())
	cn.session.ID = 0 // a session is opened anew when next needed
	var inos []ids.Ino
	dropped = cn.holds
	if dropped {
		// what was written back from mappings and not sent, and the
		// pages the kernel still has, are based on the locks lost: they
		// go as a reclaim (mapped.go)
		known := map[ids.Ino]uint64{}
		for _, ino := range c.maps.queuedFiles() {
			if a, ok := c.cache.Attr(ino); ok {
				known[ino] = a.Version
			}
		}
		c.maps.nacked(c.cacheGen+1, known)
		inos = c.cache.DropAll()
		c.cacheGen++
		c.rel.reset() // the server forgot the locks
	}
	cn.holds = false
	c.srv.mu.Lock()
	delete(c.srv.lost, cn)
	c.srv.mu.Unlock()
	c.mu.Unlock()
	c.Counters.NacksReceived.Add(1)
	why := "NACK received: the server failed or forgot this client"
	if gone {
		why = "server given up"
	}
	c.log.Warn(why+"; recovering", "server", cn.addr, "session", lost, "cached_inodes_dropped", len(inos))
	// Not here: this may be a sender of changes behind, or a flush, that a
	// FUSE request holding the kernel's page locks waits for. The kernel's
	// names and attributes went when the lease neared its end
	// (kernelLoop); whatever is left goes within moments, long before the
	// server can have let anyone else change what this client cached
	// (it steals the locks τ(1+δ) after it began failing the client).
	for _, ino := range inos {
		c.invalidateLater(ino)
	}
	for _, ino := range c.maps.withPages() {
		c.invalidateLater(ino) // (stale, mapped.go: whether cached or not)
	}
	var err error
	if !gone {
		if err = c.ensureSession(ctx, cn); err != nil && c.clustered() {
			c.giveUp(cn, err.Error())
			err = nil
		}
	}
	// The caches are gone either way: when the new session could not be
	// opened in the caller's time (a renewal's), the next request opens it.
	c.Counters.Recoveries.Add(1)
	c.behind.resetInos()
	if err != nil {
		c.log.Info("recovery done: caches rebuilt on demand; the session opens again at the next request", "error", err)
	} else {
		c.log.Info("recovery done: caches rebuilt on demand")
	}
	return dropped, err
}

// onCallback answers server-initiated messages. A revocation is
// acknowledged only after the caches it covers are gone, kernel included.
func (c *Client) onCallback(ctx context.Context, cn *conn, body []byte) []byte {
	cb, err := wire.ParseCallback(body)
	if err != nil {
		return wire.ErrorReply(wire.Errf(wire.CodeBadMessage, "%v", err)).Append(nil)
	}
	if cb.Kind == wire.CallbackRevoke {
		return c.revoke(ctx, cn, cb).Append(nil)
	}
	return (&wire.Reply{}).Append(nil)
}

// revoke gives the lock on cb.Ino down to cb.Mode: buffered changes go to
// the server, then the kernel's pages are dropped (mapped.go), writing
// dirty ones back; under an X lock those reach the server before the
// acknowledgement too.
func (c *Client) revoke(ctx context.Context, cn *conn, cb *wire.Callback) *wire.Reply {
	c.Counters.Revocations.Add(1)
	c.mu.Lock()
	server := cn.server
	held, _ := c.cache.Mode(cb.Ino)
	c.cache.Revoke(cb.Ino, cb.Mode, cb.Seq) // stops buffering and local opens
	var opens uint32
	if cb.Mode == wire.LockNone {
		opens = c.cache.TakeOpens(cb.Ino)
	}
	c.mu.Unlock()
	// with the grants that fills were read under (ReadPage), what names
	// the lock a stale page came from
	c.log.Debug("revocation", "ino", cb.Ino, "seq", cb.Seq, "to", cb.Mode, "held", held, "server", server)
	// The server counts an X lock as ours until we acknowledge: written-
	// back pages can go under it now. Under S they would wait for an X
	// lock behind the request that revokes.
	heldX := held == wire.LockExclusive
	if !heldX {
		// A revocation of X may be in progress here: this one came
		// after it (one to S that a newer one to None overtook, or one
		// to None after a downgrade began). Acknowledged first, it
		// would take the X lock at the server from under that one,
		// whose sends would then queue behind the very request that
		// revokes, and wait for themselves.
		if err := c.maps.waitXRevoked(ctx, cb.Ino); err != nil {
			return wire.ErrorReply(wire.Errf(wire.CodeIO, "revocation of X in progress: %v", err))
		}
	}
	toNone := cb.Mode == wire.LockNone
	window := toNone // open until dropPages closes it
	c.maps.beginRevoke(cb.Ino, server, cb.Seq, heldX, toNone)
	defer func() { c.maps.endRevoke(cb.Ino, heldX, toNone, window) }()
	// Removals sent behind, and buffered writes, reach the server
	// before the lock goes: the next holder must see them. (A flush
	// the server refuses fails the file, not this acknowledgement:
	// Flush.)
	if err := c.behind.wait(ctx, cb.Ino); err != nil {
		return wire.ErrorReply(wire.Errf(wire.CodeIO, "changes sent behind before revocation: %v", err))
	}
	if err := c.wb.flushBuffered(ctx, cb.Ino); err != nil {
		return wire.ErrorReply(wire.Errf(wire.CodeIO, "flush before revocation: %v", err))
	}
	// Even if the grant has not reached the cache yet (Revoke found none):
	// a read holding that grant may be filling kernel pages right now,
	// and the kernel's invalidation waits for them.
	if toNone || c.maps.hasPages(cb.Ino) {
		c.dropPages(cb.Ino, toNone)
		window = false
	}
	if heldX {
		if err := c.sendMapped(ctx, cb.Ino); err != nil {
			return wire.ErrorReply(wire.Errf(wire.CodeIO, "flush of mapped pages before revocation: %v", err))
		}
	} else if c.maps.hasQueued(cb.Ino) {
		c.sendMappedLater(cb.Ino)
	}
	return &wire.Reply{Opens: opens}
}

// cached runs fn on the cache if the leases are valid, so nothing cached
// is trusted after a lease could have lapsed.
func (c *Client) cached(fn func(*cache.Cache) bool) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.leasesValid(c.clk.Now()) {
		return false
	}
	return fn(c.cache)
}

// leasesValid reports whether the lease with every server that granted
// this client a lock is valid at now: the client does not keep which
// server granted which lock, so it trusts its cache only then. Called with
// c.mu held.
func (c *Client) leasesValid(now clock.Time) bool {
	c.srv.mu.Lock()
	defer c.srv.mu.Unlock()
	if len(c.srv.lost) > 0 {
		return false // a server given up whose locks are not dropped yet
	}
	valid := false
	for _, cn := range c.srv.conns {
		if !cn.holds {
			continue
		}
		if !cn.lease.Valid(now) {
			return false
		}
		valid = true
	}
	return valid
}

// leaseRemaining is how long every lease that covers the cache still runs.
// Called with c.mu held.
func (c *Client) leaseRemaining(now clock.Time) time.Duration {
	c.srv.mu.Lock()
	defer c.srv.mu.Unlock()
	left := time.Duration(-1)
	for _, cn := range c.srv.conns {
		if cn.holds {
			if r := cn.lease.Remaining(now); left < 0 || r < left {
				left = r
			}
		}
	}
	return max(left, 0)
}

// renewLoop sends an explicit renewal to a server only when the client
// holds locks and no request renewed its lease there recently (Burns et
// al.: opportunistic renewal makes these rare for a busy client).
func (c *Client) renewLoop() {
	c.every(func() {
		var due []*conn
		c.mu.Lock()
		now := c.clk.Now()
		locked := c.cache.HoldsLocks()
		for _, cn := range c.live() {
			if !cn.holds {
				continue
			}
			if cn.lease.NeedsRenewal(now, locked) {
				due = append(due, cn)
			} else if !cn.lease.Valid(now) && locked && !cn.lapsed {
				cn.lapsed = true
				c.log.Warn("lease lapsed: server unreachable; cached data not trusted until it answers", "server", cn.addr)
			}
		}
		c.mu.Unlock()
		c.wb.flushOld(context.Background())
		c.maps.forgetReleased(releasedMemory * time.Duration(c.Session().Tau))
		for _, cn := range due {
			ctx, cancel := context.WithTimeout(context.Background(), time.Duration(cn.lease.Config().Tau))
			_, _ = c.send(ctx, &wire.Request{Op: wire.OpRenew}, sendOpts{to: cn})
			cancel()
		}
	})
}

// releasedMemory is how many client leases (τ) a mount remembers the
// grants it gave up for fills (mappedFiles.forgetReleased).
const releasedMemory = 2

// every calls fn every τ/16 until the client closes: often enough to act
// inside the lease's margins.
func (c *Client) every(fn func()) { c.tick(time.Duration(c.Session().Tau)/16, fn) }

// tick calls fn every period on the client's clock until the client
// closes. A call that takes longer than a period is followed by the next
// at once, as with a ticker.
func (c *Client) tick(period time.Duration, fn func()) {
	defer c.wg.Done()
	next := c.clk.Now().Add(period)
	t, fired := c.clk.NewTimer(period)
	defer t.Stop()
	for {
		select {
		case <-c.stop:
			return
		case <-fired:
			fn()
			now := c.clk.Now()
			if next = next.Add(period); next.Before(now) {
				next = now
			}
			t.Reset(next.Sub(now))
		}
	}
}

// kernelLoop drops the kernel's cached names and attributes (given with
// AttrTTL) while a lease that covers them still runs but was not renewed
// in time: the kernel answers from them without asking the mount. Apart
// from renewLoop, whose renewals can wait for an unreachable server.
func (c *Client) kernelLoop() {
	c.every(func() {
		c.mu.Lock()
		// AttrTTL stopped handing out TTLs when the margin began, half a
		// margin before this.
		drop := c.kernelCaches && c.leaseRemaining(c.clk.Now()) < c.renewMargin/2
		if drop {
			c.kernelCaches = false
		}
		locked := c.cache.HoldsLocks()
		c.mu.Unlock()
		if !drop {
			return
		}
		if locked {
			c.log.Info("lease not renewed near its end: the kernel's cached names and attributes dropped")
		}
		if h := c.hooks.Load(); h != nil && h.DropKernel != nil {
			h.DropKernel()
		}
		// and mapped pages, which the kernel serves without asking; in
		// the background, as a fill may wait for the server
		for _, ino := range c.maps.withPages() {
			c.invalidateLater(ino)
		}
	})
}
