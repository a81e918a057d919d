// Package client is a mount's sessions with the leasefs servers: blocking,
// context-taking calls that fs/ turns FUSE operations into. It numbers
// requests, sends each to the owner of its inode (servers.go), keeps a
// session and a client lease (lease.Client) with each server it talks to,
// caches attributes and entries under the data locks the servers grant
// (cache.Cache), answers revocations, and recovers after a NACK.
package client

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/leasefs/leasefs/cache"
	"github.com/leasefs/leasefs/internal/clock"
	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/lease"
	"github.com/leasefs/leasefs/transport"
	"github.com/leasefs/leasefs/wire"
)

// Config configures a client.
type Config struct {
	// Servers are the cluster's servers (HOST:PORT), any subset; the
	// client uses one at a time and fails over to the next.
	Servers     []string
	Token       transport.Token
	Logger      *slog.Logger
	Faults      *transport.Faults
	DialTimeout time.Duration
	// FailoverTimeout: with several servers, a request unanswered this long
	// makes the client check that its server is alive (a renewal answered
	// within the same time), and fail over if not.
	FailoverTimeout time.Duration
	// SoftTimeout, when non-zero, fails operations that cannot reach the
	// server for this long with EIO (like NFS soft); zero blocks (hard).
	SoftTimeout time.Duration
	// CacheInodes bounds the inodes whose locks and attributes are cached.
	CacheInodes int
	// CacheBytes bounds the file data cached under locks (0: none).
	CacheBytes int64
}

// DefaultConfig returns a hard-mount configuration.
func DefaultConfig() Config {
	return Config{DialTimeout: 5 * time.Second, FailoverTimeout: 500 * time.Millisecond, Logger: slog.Default(), CacheInodes: 100_000, CacheBytes: 512 << 20}
}

// Validate checks the configuration.
func (c *Config) Validate() error {
	switch {
	case len(c.Servers) == 0 || slices.Contains(c.Servers, ""):
		return errors.New("client: no server address")
	case c.FailoverTimeout <= 0:
		return errors.New("client: failover timeout must be positive")
	case c.DialTimeout <= 0:
		return errors.New("client: dial timeout must be positive")
	case c.SoftTimeout < 0:
		return errors.New("client: soft timeout must not be negative")
	case c.CacheInodes <= 0:
		return errors.New("client: cache size must be positive")
	case c.CacheBytes < 0:
		return errors.New("client: data cache size must not be negative")
	}
	return nil
}

// ErrTimeout is returned by a soft mount's operation that could not reach the
// server within SoftTimeout.
var ErrTimeout = errors.New("client: server unreachable (soft timeout)")

// Counters are the client's request and lease counters.
type Counters struct {
	Requests, NacksReceived, Recoveries, Revocations atomic.Int64
	ReclaimsOK, ReclaimsRefused, DataLost            atomic.Int64
	Prefetches                                       atomic.Int64 // readahead requests sent
	Redirects                                        atomic.Int64 // redirects to an inode's owner followed
	RemovedBehind                                    atomic.Int64 // removals sent behind the caller
	CreatedBehind                                    atomic.Int64 // creates sent behind the caller
	CreatedWithData                                  atomic.Int64 // of them, sent with the file's data (flushWithCreate)
	BehindBatches                                    atomic.Int64 // requests that carried several of them (wire.OpBatch)
	LocksEvicted                                     atomic.Int64 // locks the cache dropped for space, given back
}

// Client is one mount's connection to leasefs.
type Client struct {
	cfg Config
	log *slog.Logger
	id  ids.ClientID
	key *transport.ClientKey // proves id to every server (servers.go)
	srv servers
	clk clock.Real
	// noSpaceUntil (a clock.Time): the server refused a change for want
	// of space, lately; until then changes go to the server as they are
	// made (spaceShort).
	noSpaceUntil atomic.Int64
	// inFlight numbers the client's changes (wire.Request.ReqID: a
	// resend after a failover must not apply a change twice) and knows
	// which are unanswered.
	inFlight changesInFlight

	// hooks are the kernel side's (SetHooks): set while revocations may
	// already come in, hence atomic.
	hooks atomic.Pointer[Hooks]

	mu  sync.Mutex
	seq uint64
	// seqs: the seqs chosen and not done with (servers.go)
	seqs  seqsInFlight
	cache *cache.Cache
	// cacheGen counts cache drops (from 1): changes buffered in an earlier
	// generation were made under locks since lost (dirtyFile.gen).
	cacheGen uint64
	// renewMargin is how long before a lease lapses the client renews it
	// (τ/2 of the first session; every server of a cluster has the same τ).
	renewMargin time.Duration
	// kernelCaches: the kernel may hold names or attributes given with a
	// TTL (AttrTTL) since renewLoop last dropped them.
	kernelCaches bool

	wb        writeback
	maps      mappedFiles // the kernel's pages of mapped files (mapped.go)
	ra        readAhead
	behind    behind   // removals and creates sent behind the caller
	inos      inoPool  // inode numbers for creates behind the caller
	rel       releases // evicted locks to give back (evict.go)
	recoverMu ctxMutex // one recovery at a time
	stop      chan struct{}
	wg        sync.WaitGroup
	// life ends when Shutdown gives up on the servers (abort): every
	// request still waiting for one fails then (send).
	life  context.Context
	abort context.CancelFunc
	// statfs is the last usage a server reported (StatFs).
	statfs atomic.Pointer[wire.StatFs]

	Counters Counters
}

// Lock and wait order.
//
// The client's goroutines: FUSE requests (fs/); the senders of changes sent
// behind the caller (behind.go: sendBehind, one per directory with changes
// queued, and a Flush that takes a held batch along, flushWithCreate); the
// write-back's flushes (a file's mu held while its writes are sent,
// sendWrites' workers); revocation handlers (onCallback); renewLoop
// (renewals, flushOld); kernelLoop; the background goroutine (evict.go:
// gives back locks the cache evicted, drops kernel caches for others);
// prefetches (readahead.go); refillInos; reclaims of files created behind,
// after a NACK.
//
// What each may wait for (besides the server, and c.mu and the other
// mutexes below, which no one holds across a wait):
//
//	FUSE request      changes behind of its inodes (waitFor), a slot behind,
//	                  a file's mu, recoverMu, a conn's open, a prefetch
//	flush             changes behind of its file, then the file's mu
//	revocation        changes behind of its inode, the file's mu, the kernel
//	background        changes behind, a file's mu, the kernel
//	sender (behind)   an rmdir's directory emptied (its children's senders),
//	                  recoverMu, a conn's open
//	recovery          recoverMu, a conn's open; files' mu only by tryLock
//
// Nothing waits for the background goroutine or a revocation handler, and
// the server does not make a holder's requests wait for its own revocation
// (it lets them run). What keeps the graph without a cycle:
//
//   - send, and all it runs (recovery, reclaim), never waits for changes
//     sent behind nor takes a file's mu but by tryLock: it runs on the
//     senders and on flushes holding a file's mu. waitFor runs before send
//     (callWith), never inside. The locks a reply's grants push out of the
//     cache are given back by the background goroutine (takeEvictedLocked),
//     which waits for the inode's changes behind and flushes it first: given
//     back by the sender that got the reply, a lock waited for that
//     sender's own batch, and the mount hung.
//   - The kernel's invalidation (Hooks.Invalidate) may wait for page locks
//     held by a FUSE request, which may wait for anything above: only a
//     revocation handler and the background goroutine call it; others hand
//     it over (invalidateLater).
//   - Mutexes held only around memory: c.mu before c.srv.mu, c.inos.mu,
//     behind.mu and c.rel.mu; a file's mu before c.mu and c.wb.mu
//     (bufferChange, retire, loseFile); c.ra.mu before c.mu (readDone);
//     changesInFlight.mu innermost.
//   - A wait that can hold up a FUSE request takes the request's context
//     (opContext): deaf to FUSE interrupts but for lock waits, bounded by
//     its caller's deadline and a soft mount's timeout.

// New connects to the server, authenticates and opens a session. It fails
// within the dial timeout with a clear error when the server is unreachable
// or refuses the token.
func New(ctx context.Context, cfg Config) (*Client, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	key, err := transport.NewClientKey()
	if err != nil {
		return nil, err
	}
	c := &Client{cfg: cfg, log: cfg.Logger, id: key.ID(), key: key, cacheGen: 1,
		cache: cache.New(cfg.CacheInodes), stop: make(chan struct{}), recoverMu: newCtxMutex()}
	c.life, c.abort = context.WithCancel(context.Background())
	c.cache.SetDataBudget(cfg.CacheBytes)
	c.maps.gen = c.cacheGen
	c.behind.init(c.sendBehind)
	c.rel.init()
	if err := c.connect(ctx); err != nil {
		return nil, fmt.Errorf("client: connect: %w", err)
	}
	dctx, cancel := context.WithTimeout(ctx, cfg.DialTimeout*time.Duration(len(cfg.Servers)))
	defer cancel()
	if _, err := c.pick(dctx, &wire.Request{Op: wire.OpRenew}); err != nil {
		addr := c.Server()
		for _, cn := range c.live() {
			cn.tr.Close()
		}
		return nil, fmt.Errorf("client: open session with %s: %w", addr, err)
	}
	// the usage a soft mount's statfs falls back on while the server
	// cannot be reached (StatFs)
	_, _ = c.StatFs(dctx)
	c.wg.Add(3)
	go c.renewLoop()
	go c.kernelLoop()
	go c.background()
	// inode numbers for the first creates behind the caller
	c.inos.mu.Lock()
	c.askInosLocked()
	c.inos.mu.Unlock()
	return c, nil
}

// Hooks connect the client to the kernel side of a mount (fs).
type Hooks struct {
	// Invalidate drops the kernel's caches of an inode (page cache and
	// attributes). Called without locks held.
	Invalidate func(ino ids.Ino)
	// DropKernel drops every name and attribute the kernel caches, before
	// a lease lapses. Called without locks held.
	DropKernel func()
	// PathOf names an inode for log messages ("" if unknown).
	PathOf func(ino ids.Ino) string
}

// SetHooks installs the kernel side's hooks.
func (c *Client) SetHooks(h Hooks) { c.hooks.Store(&h) }

// Invalidate drops the kernel's caches of ino, if a kernel side is set.
func (c *Client) Invalidate(ino ids.Ino) {
	if h := c.hooks.Load(); h != nil && h.Invalidate != nil {
		h.Invalidate(ino)
	}
}

// PathOf names ino for log messages ("" if unknown).
func (c *Client) PathOf(ino ids.Ino) string {
	if h := c.hooks.Load(); h != nil && h.PathOf != nil {
		return h.PathOf(ino)
	}
	return ""
}

// ID returns the client id.
func (c *Client) ID() ids.ClientID { return c.id }

// Session returns the session with the home server as it announced it.
func (c *Client) Session() wire.Session {
	cn := c.homeConn()
	c.mu.Lock()
	defer c.mu.Unlock()
	return cn.session
}

// openSession opens a new session on cn; a failing server NACKs it until it
// has stolen our old locks, so it retries until ctx ends.
func (c *Client) openSession(ctx context.Context, cn *conn) error {
	host, _ := os.Hostname()
	body := (&wire.Request{Op: wire.OpOpenSession, Target: host}).Append(nil)
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
			return err
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
		c.answered()
		c.log.Info("session opened", "server", cn.addr, "server_id", s.Server, "session", s.ID,
			"client_lease", time.Duration(s.Tau), "clock_drift", s.Delta)
		return nil
	}
}

// Call sends req and returns the server's reply, applying the locks and
// attributes it carries. A reply with an error code is returned as an error
// carrying that code (wire.CodeOf). After a NACK the client drops its cache,
// opens a new session and sends req again: a NACKed request was not executed.
func (c *Client) Call(ctx context.Context, req *wire.Request) (*wire.Reply, error) {
	return c.call(ctx, req, nil)
}

// call is Call with apply run on the cache in the same critical section
// that applies the reply's grants (for every reply the server gave, errors
// included: a not-found is worth caching too), so what it caches is covered
// by exactly those grants: no revocation can slip between.
func (c *Client) call(ctx context.Context, req *wire.Request, apply func(*cache.Cache, *wire.Reply)) (*wire.Reply, error) {
	return c.callWith(ctx, req, apply, false)
}

// errRecovered tells a flush of buffered writes that the server NACKed it:
// the client recovered, and the writes may now only be reclaimed.
var errRecovered = errors.New("client: session recovered after NACK")

// callWith is call; with failOnNack a NACKed request is not sent again in
// the new session but fails with errRecovered.
func (c *Client) callWith(ctx context.Context, req *wire.Request, apply func(*cache.Cache, *wire.Reply), failOnNack bool) (*wire.Reply, error) {
	wctx, cancel := c.opContext(ctx, interruptible(req))
	err := c.waitFor(wctx, req)
	cancel()
	if err != nil {
		return nil, c.softErr(ctx, err)
	}
	return c.send(ctx, req, apply, failOnNack, nil, 0)
}

// interruptible reports whether req gives way to a signal (EINTR): only a
// lock wait, which can block for as long as another user likes. Anything
// else finishes: Go programs get signals all the time (SIGURG), and an
// EINTR from open or stat breaks tools that never expect it.
func interruptible(req *wire.Request) bool { return req.Op == wire.OpPosixLock && req.Lk.Wait }

// internalCtx marks a context of the client's own (cancelAlways): its
// cancellation holds wherever it goes.
type internalCtx struct{}

// cancelAlways marks ctx as the client's own: detach keeps its
// cancellation (Close stopping the background goroutine).
func cancelAlways(ctx context.Context) context.Context {
	return context.WithValue(ctx, internalCtx{}, true)
}

// detach returns ctx without its cancellation (a FUSE interrupt: see
// interruptible), but with its deadline, which bounds internal callers
// (a lock's release, the renewal of a lease, Close). The client's own
// contexts (cancelAlways) keep their cancellation too.
func detach(ctx context.Context) (context.Context, context.CancelFunc) {
	if ctx.Value(internalCtx{}) != nil {
		return ctx, func() {}
	}
	d, ok := ctx.Deadline()
	ctx = context.WithoutCancel(ctx)
	if ok {
		return context.WithDeadline(ctx, d)
	}
	return ctx, func() {}
}

// opContext is the context an operation waits under in the client before
// it sends (for changes sent behind, a file's flush, a slot): ctx detached
// unless interruptible, bounded by a soft mount's timeout, and ended by
// Shutdown giving up (as send's are). A wait that can hold up a FUSE
// request takes it; softErr turns its end into the error the operation
// returns.
func (c *Client) opContext(ctx context.Context, interruptible bool) (context.Context, context.CancelFunc) {
	cancelDetach := context.CancelFunc(func() {})
	if !interruptible {
		ctx, cancelDetach = detach(ctx)
	}
	var cancel context.CancelFunc
	if c.cfg.SoftTimeout > 0 {
		ctx, cancel = context.WithTimeout(ctx, c.cfg.SoftTimeout)
	} else {
		ctx, cancel = context.WithCancel(ctx)
	}
	stop := context.AfterFunc(c.life, cancel)
	return ctx, func() { stop(); cancel(); cancelDetach() }
}

// send is callWith; a non-nil to sends req to that server only (a
// renewal of its lease) and fails if the client gives it up. A non-zero
// gen sends a buffered change made in cache generation gen: if the cache
// was dropped since, it fails with errRecovered unsent (failOnNack must be
// set), as a NACK of it would have.
func (c *Client) send(ctx context.Context, req *wire.Request, apply func(*cache.Cache, *wire.Reply), failOnNack bool, to *conn, gen uint64) (_ *wire.Reply, err error) {
	if !interruptible(req) {
		var cancel context.CancelFunc
		ctx, cancel = detach(ctx)
		defer cancel()
	}
	// Shutdown ends every wait for a server, whoever waits: a mount must
	// stop within its bound even when no server answers.
	ctx, cancelLife := context.WithCancel(ctx)
	defer cancelLife()
	defer context.AfterFunc(c.life, cancelLife)()
	defer func() {
		if err != nil && c.life.Err() != nil {
			err = ErrClosed
		}
	}()
	if req.Op.Changes() {
		req.Oldest = c.inFlight.add(&req.ReqID, req.OriginIno())
		defer func() {
			if !errors.Is(err, errRecovered) {
				// (a NACKed flush write stays in flight: its reclaim
				// sends it again)
				c.inFlight.done(req.ReqID)
			}
		}()
	}
	// the data goes from where it is, after the rest (a write's bytes are
	// not copied into the request)
	head := req.AppendHead(nil)
	// A soft mount's timeout covers every send of the request, resends
	// after a failover or an unavailable server included.
	sctx := ctx
	if c.cfg.SoftTimeout > 0 {
		var cancel context.CancelFunc
		sctx, cancel = context.WithTimeout(ctx, c.cfg.SoftTimeout)
		defer cancel()
	}
	redirects := 0
	for {
		cn := to
		if cn == nil {
			if cn, err = c.pick(sctx, req); err != nil {
				return nil, c.softErr(ctx, err)
			}
		}
		c.mu.Lock()
		if gen != 0 && gen != c.cacheGen {
			c.mu.Unlock()
			return nil, errRecovered
		}
		h := transport.Header{Client: c.id, Session: cn.session.ID, Seq: c.nextSeq()}
		sent := c.clk.Now()
		sentGen := c.cache.Gen()
		if cn.lease != nil {
			cn.lease.Sent(sent, req.Op == wire.OpRenew)
		}
		c.mu.Unlock()
		c.Counters.Requests.Add(1)
		// the reply's grants are held against the releases under way
		// (evict.go) until they are applied
		answered := c.rel.sent()
		rep, err := c.roundTrip(ctx, sctx, cn, h, head, req.Data)
		c.seqs.done(h.Seq)
		if err != nil || rep.Code == wire.CodeNack {
			answered()
		}
		if errors.Is(err, errSendAgain) && to == nil {
			continue
		}
		if errors.Is(err, errServerLost) || err == nil && rep.Code == wire.CodeNack {
			if err := c.recover(ctx, cn, h.Session); err != nil {
				return nil, err
			}
			if failOnNack {
				return nil, errRecovered
			}
			if to != nil {
				return nil, errServerLost
			}
			continue
		}
		if err != nil {
			return nil, err
		}
		c.mu.Lock()
		current := h.Session == cn.session.ID
		if current {
			cn.lease.Acked(sent, c.clk.Now())
			if cn.lapsed {
				cn.lapsed = false
				c.log.Info("lease renewed: server reachable again, cache still valid", "server", cn.addr)
			}
		}
		if rep.Code == wire.CodeRedirect {
			c.mu.Unlock()
			answered()
			c.Counters.Redirects.Add(1)
			if redirects++; redirects > maxRedirects || !c.follow(sctx, req.Home(), rep.Owner) {
				req.NoRedirect = true
				head = req.AppendHead(nil)
			}
			continue
		}
		if current {
			if len(rep.Grants) > 0 {
				cn.holds = true
			}
			if from, ok := ctx.Value(replyFromKey{}).(*ids.ServerID); ok {
				*from = cn.server // for a grant's sequence number (ReadPage)
			}
			c.cache.ApplyReply(c.rel.filter(rep.Grants), sentGen, func() {
				if rep.Attr != nil {
					c.cache.SetAttr(rep.Attr)
				}
				if apply != nil {
					apply(c.cache, rep)
				}
			})
			// given back by the background goroutine: this one may be
			// what the release waits for (a sender of changes behind)
			c.takeEvictedLocked()
		}
		server := cn.server
		c.mu.Unlock()
		answered()
		for _, g := range rep.Grants {
			c.learnOwner(g.Ino, server)
		}
		if rep.Code == wire.CodeNoSpace && req.Op != wire.OpSetXattr {
			// (a setxattr gets it for a names list too long, not a
			// full disk)
			c.noteNoSpace()
		}
		return rep, rep.Err()
	}
}

// noSpaceHold is how long after the server refused a change for want of
// space the client keeps making changes at the server as they are made.
const noSpaceHold = 2 * time.Second

func (c *Client) noteNoSpace() { c.noSpaceUntil.Store(int64(c.clk.Now().Add(noSpaceHold))) }

// spaceShort reports whether the server lately refused a change for want
// of space: writes are then not buffered and creates not sent behind, so
// that each gets its ENOSPC instead of being taken and lost at its flush.
func (c *Client) spaceShort() bool { return c.clk.Now().Before(clock.Time(c.noSpaceUntil.Load())) }

// softErr is what a soft mount's operation fails with when its deadline
// (sctx) ended while ctx did not.
func (c *Client) softErr(ctx context.Context, err error) error {
	switch {
	case err != nil && c.life.Err() != nil:
		return ErrClosed // Shutdown gave up on the servers
	case ctx.Err() == nil && c.cfg.SoftTimeout > 0 && errors.Is(err, context.DeadlineExceeded):
		return ErrTimeout
	}
	return err
}

// unavailableRetry is how long a client of a single server waits before
// sending a request again that the server could not serve.
const unavailableRetry = 200 * time.Millisecond

// roundTrip sends one request on cn. sctx is ctx bounded by a soft mount's
// deadline.
func (c *Client) roundTrip(ctx, sctx context.Context, cn *conn, h transport.Header, head, data []byte) (*wire.Reply, error) {
	for {
		actx, cancelAttempt := sctx, context.CancelFunc(func() {})
		if c.clustered() {
			actx, cancelAttempt = context.WithTimeout(sctx, c.cfg.FailoverTimeout)
		}
		raw, err := cn.tr.CallTail(actx, h, head, data)
		cancelAttempt()
		if err == nil {
			rep, err := wire.ParseReply(raw)
			if err == nil && rep.Code == wire.CodeUnavailable {
				if c.clustered() {
					c.giveUp(cn, rep.Msg)
					return nil, errServerLost
				}
				// the only server we know cannot serve now (a cluster
				// server restarting or cut off): a hard mount waits
				c.log.Debug("server cannot serve now; retrying", "why", rep.Msg)
				t := time.NewTimer(unavailableRetry)
				select {
				case <-t.C:
					return nil, errSendAgain
				case <-sctx.Done():
					t.Stop()
					return nil, c.softErr(ctx, sctx.Err())
				}
			}
			c.answered()
			return rep, err
		}
		if c.clustered() && sctx.Err() == nil {
			if errors.Is(err, transport.ErrClosed) && c.isGone(cn) {
				return nil, errServerLost // another request gave it up
			}
			if errors.Is(err, context.DeadlineExceeded) && c.alive(cn, h.Session) {
				continue // slow, not gone: the same header again runs at most once
			}
			c.giveUp(cn, err.Error())
			return nil, errServerLost
		}
		return nil, c.softErr(ctx, err)
	}
}

// recover handles the loss of the session `lost` on cn, by a NACK or by
// giving its server up: drop every cache, the kernel's too, open a new
// session there unless the server was given up (once, however many
// requests saw it), and reclaim buffered writes.
func (c *Client) recover(ctx context.Context, cn *conn, lost ids.SessionID) error {
	dropped, err := c.renewSession(ctx, cn, lost)
	if dropped {
		c.reclaim(ctx)
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
	if !gone {
		if err := c.ensureSession(ctx, cn); err != nil {
			if !c.clustered() {
				return dropped, err
			}
			c.giveUp(cn, err.Error())
		}
	}
	c.Counters.Recoveries.Add(1)
	c.resetInos()
	c.log.Info("recovery done: caches rebuilt on demand")
	return dropped, nil
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
	// The server counts an X lock as ours until we acknowledge: written-
	// back pages can go under it now. Under S they would wait for an X
	// lock behind the request that revokes.
	heldX := held == wire.LockExclusive
	toNone := cb.Mode == wire.LockNone
	window := toNone // open until dropPages closes it
	c.maps.beginRevoke(cb.Ino, server, cb.Seq, heldX, toNone)
	defer func() { c.maps.endRevoke(cb.Ino, heldX, window) }()
	// Removals sent behind, and buffered writes, reach the server
	// before the lock goes: the next holder must see them. (A flush
	// the server refuses fails the file, not this acknowledgement:
	// Flush.)
	if err := c.behind.wait(ctx, cb.Ino); err != nil {
		return wire.ErrorReply(wire.Errf(wire.CodeIO, "changes sent behind before revocation: %v", err))
	}
	if err := c.flushBuffered(ctx, cb.Ino); err != nil {
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
		c.flushOld(context.Background())
		for _, cn := range due {
			ctx, cancel := context.WithTimeout(context.Background(), time.Duration(cn.lease.Config().Tau))
			_, _ = c.send(ctx, &wire.Request{Op: wire.OpRenew}, nil, false, cn, 0)
			cancel()
		}
	})
}

// every calls fn every τ/16 until the client closes: often enough to act
// inside the lease's margins.
func (c *Client) every(fn func()) {
	defer c.wg.Done()
	t := time.NewTicker(time.Duration(c.Session().Tau) / 16)
	defer t.Stop()
	for {
		select {
		case <-c.stop:
			return
		case <-t.C:
			fn()
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

// Stats describes the client for `leasefs admin --mount`.
type Stats struct {
	Session         ids.SessionID // with the home server
	Servers         int           // servers the client has sessions with
	LeaseLeft       time.Duration
	LeaseStats      lease.ClientStats
	CachedInodes    int
	CachedDataBytes int64
	DirtyBytes      int64 // buffered writes not yet at the server
	Hits, Misses    int64
	Locks           []wire.Grant
	Requests        int64
	NacksReceived   int64
	Recoveries      int64
	Revocations     int64
	Redirects       int64
	RemovedBehind   int64
	CreatedBehind   int64
	CreatedWithData int64
	BehindBatches   int64
	ReclaimsOK      int64
	ReclaimsRefused int64
	DataLost        int64
	Prefetches      int64
}

// Stats returns the client's state and counters.
func (c *Client) Stats() Stats {
	home := c.homeConn()
	c.mu.Lock()
	defer c.mu.Unlock()
	hits, misses, n := c.cache.Stats()
	st := Stats{Session: home.session.ID, Servers: len(c.live()), LeaseLeft: c.leaseRemaining(c.clk.Now()),
		CachedInodes: n, CachedDataBytes: c.cache.DataBytes(), DirtyBytes: c.wb.total.Load(), Hits: hits, Misses: misses, Locks: c.cache.Locks(),
		Requests: c.Counters.Requests.Load(), NacksReceived: c.Counters.NacksReceived.Load(),
		Recoveries: c.Counters.Recoveries.Load(), Revocations: c.Counters.Revocations.Load(),
		Redirects: c.Counters.Redirects.Load(), RemovedBehind: c.Counters.RemovedBehind.Load(), CreatedBehind: c.Counters.CreatedBehind.Load(), CreatedWithData: c.Counters.CreatedWithData.Load(), BehindBatches: c.Counters.BehindBatches.Load(), ReclaimsOK: c.Counters.ReclaimsOK.Load(), ReclaimsRefused: c.Counters.ReclaimsRefused.Load(),
		DataLost: c.Counters.DataLost.Load(), Prefetches: c.Counters.Prefetches.Load()}
	if home.lease != nil {
		st.LeaseStats = home.lease.Stats()
	}
	return st
}

// Close is Shutdown within 30 s.
func (c *Client) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return c.Shutdown(ctx)
}

// changesInFlight is the set of change requests not yet answered, with
// the inode each is recorded with at the server (wire.Request.OriginIno).
// Each request carries the oldest of them recorded with the same inode
// (wire.Request.Oldest): a server that meets a change older than one a
// later change of the inode named as the oldest knows the client has
// finished with it (a stale copy at a server the client gave up on, which
// may get to run much later, once it owns the inode), and must not apply
// it. Counted per inode, so that a change stuck elsewhere (a directory's,
// another file's) does not keep every other inode's copies applicable:
// the server keeps only the last few ids per client and inode.
type changesInFlight struct {
	mu      sync.Mutex
	last    uint64             // the last number given to a change
	pending map[uint64]ids.Ino // id → the inode it is recorded with
}

// add records *id as a change recorded with origin, giving it the next
// number first if it has none, and returns the oldest change of origin
// in flight. Numbering and recording are one step: a request numbered
// before another but recorded after it would let the other name an
// oldest change past it, and the server refuse it as a stale copy.
func (f *changesInFlight) add(id *uint64, origin ids.Ino) uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.pending == nil {
		f.pending = map[uint64]ids.Ino{}
	}
	if *id == 0 {
		f.last++
		*id = f.last
	}
	f.pending[*id] = origin
	oldest := *id
	for other, o := range f.pending {
		if o == origin {
			oldest = min(oldest, other)
		}
	}
	return oldest
}

func (f *changesInFlight) done(id uint64) {
	f.mu.Lock()
	delete(f.pending, id)
	f.mu.Unlock()
}

// ctxMutex is a mutex whose lock gives up when a context ends: for locks
// held across requests to a server, which a FUSE request may wait for.
type ctxMutex chan struct{}

func newCtxMutex() ctxMutex { return make(ctxMutex, 1) }

// lock locks m, or returns ctx's error if ctx ends first.
func (m ctxMutex) lock(ctx context.Context) error {
	select {
	case m <- struct{}{}:
		return nil
	default:
	}
	select {
	case m <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// tryLock locks m if nobody holds it.
func (m ctxMutex) tryLock() bool {
	select {
	case m <- struct{}{}:
		return true
	default:
		return false
	}
}

func (m ctxMutex) unlock() { <-m }
