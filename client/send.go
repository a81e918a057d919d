package client

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/leasefs/leasefs/cache"
	"github.com/leasefs/leasefs/internal/clock"
	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/transport"
	"github.com/leasefs/leasefs/wire"
)

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
// by exactly those grants: no revocation can slip between. The request
// waits for the changes sent behind that it could observe first (waitFor).
func (c *Client) call(ctx context.Context, req *wire.Request, apply func(*cache.Cache, *wire.Reply)) (*wire.Reply, error) {
	wctx, cancel := c.opContext(ctx, interruptible(req))
	err := c.behind.waitFor(wctx, req)
	cancel()
	if err != nil {
		return nil, c.softErr(ctx, err)
	}
	return c.send(ctx, req, sendOpts{apply: apply})
}

// errRecovered tells a flush of buffered writes that the server NACKed it:
// the client recovered, and the writes may now only be reclaimed.
var errRecovered = errors.New("client: session recovered after NACK")

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

// sendOpts says how send sends a request. The zero value sends it to the
// owner of its inode, sends it again in a new session after a NACK, and
// applies the reply's grants and attributes to the cache.
type sendOpts struct {
	// apply runs on the cache with the reply, in the critical section that
	// applies its grants (call).
	apply func(*cache.Cache, *wire.Reply)
	// failOnNack: a NACKed request is not sent again in the new session
	// but fails with errRecovered (a flush's writes: they may only be
	// reclaimed).
	failOnNack bool
	// to, if set, is the only server the request goes to (a renewal of
	// its lease, a goodbye); send fails with errServerLost if the client
	// gives it up.
	to *conn
	// cacheGen, if set, is the cache generation a buffered change was
	// made in: if the cache was dropped since, send fails with
	// errRecovered unsent, as a NACK of it would have (set failOnNack).
	cacheGen uint64
}

// sendStep is what send does after an attempt.
type sendStep int

const (
	sendDone     sendStep = iota // return the attempt's reply or error
	sendAgain                    // send again with a new header
	sendRedirect                 // the server is not the inode's owner: follow the reply's
)

// send sends req (after call's waits, or without them where the caller
// must not wait: see the wait order in doc.go) until a server answers it,
// following redirects and recovering from NACKs and lost servers, and
// applies the reply (sendOpts).
func (c *Client) send(ctx context.Context, req *wire.Request, o sendOpts) (_ *wire.Reply, err error) {
	ctx, cancel := c.sendContext(ctx, req)
	defer cancel()
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
	sctx, cancelSoft := c.softContext(ctx)
	defer cancelSoft()
	redirects := 0
	for {
		cn := o.to
		if cn == nil {
			if cn, err = c.pick(sctx, req); err != nil {
				return nil, c.softErr(ctx, err)
			}
		}
		rep, step, err := c.attempt(ctx, sctx, cn, req, head, o)
		switch step {
		case sendAgain:
			continue
		case sendRedirect:
			c.Counters.Redirects.Add(1)
			if redirects++; redirects > maxRedirects || !c.follow(sctx, req.Home(), rep.Owner) {
				req.NoRedirect = true
				head = req.AppendHead(nil)
			}
			continue
		}
		return rep, err
	}
}

// sendContext is the context send runs under: ctx detached unless req is
// interruptible, and ended by Shutdown giving up, whoever waits: a mount
// must stop within its bound even when no server answers.
func (c *Client) sendContext(ctx context.Context, req *wire.Request) (context.Context, context.CancelFunc) {
	cancelDetach := context.CancelFunc(func() {})
	if !interruptible(req) {
		ctx, cancelDetach = detach(ctx)
	}
	ctx, cancelLife := context.WithCancel(ctx)
	stop := context.AfterFunc(c.life, cancelLife)
	return ctx, func() { stop(); cancelLife(); cancelDetach() }
}

// softContext is ctx bounded by a soft mount's timeout.
func (c *Client) softContext(ctx context.Context) (context.Context, context.CancelFunc) {
	if c.cfg.SoftTimeout > 0 {
		return context.WithTimeout(ctx, c.cfg.SoftTimeout)
	}
	return ctx, func() {}
}

// sending is one attempt to send a request: its header, and the time and
// the cache's generation when it went, for the lease and the grants its
// reply brings.
type sending struct {
	h  transport.Header
	at clock.Time
	// gen is the cache's generation (cache.Gen) when it went
	gen uint64
}

// attempt sends req to cn once and deals with the answer: a server that
// cannot serve now means sending again, a NACK or a lost server makes the
// client recover (afterLoss), a reply is applied (accept).
func (c *Client) attempt(ctx, sctx context.Context, cn *conn, req *wire.Request, head []byte, o sendOpts) (*wire.Reply, sendStep, error) {
	s, err := c.stamp(cn, req, o.cacheGen)
	if err != nil {
		return nil, sendDone, err
	}
	c.Counters.Requests.Add(1)
	// the reply's grants are held against the releases under way
	// (evict.go) until they are applied
	answered := c.rel.sent()
	rep, err := c.roundTrip(ctx, sctx, cn, s.h, head, req.Data)
	c.seqs.done(s.h.Seq)
	if err == nil {
		if f := c.cfg.ObserveRequest; f != nil {
			f(req.Op, rep.Code, c.clk.Now().Sub(s.at))
		}
		if req.Op == wire.OpWrite && rep.Code == wire.CodeOK {
			c.Counters.WrittenBytes.Add(int64(len(req.Data)))
		}
	}
	if err != nil || rep.Code == wire.CodeNack {
		answered()
	}
	switch {
	case errors.Is(err, errSendAgain) && o.to == nil:
		return nil, sendAgain, nil
	case errors.Is(err, errServerLost) || err == nil && rep.Code == wire.CodeNack:
		step, err := c.afterLoss(ctx, cn, s.h.Session, o)
		return nil, step, err
	case err != nil:
		return nil, sendDone, err
	}
	return c.accept(ctx, cn, req, rep, s, o.apply, answered)
}

// stamp numbers an attempt to send req to cn and tells cn's lease it went;
// it fails with errRecovered if the cache was dropped since cacheGen
// (sendOpts).
func (c *Client) stamp(cn *conn, req *wire.Request, cacheGen uint64) (sending, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if cacheGen != 0 && cacheGen != c.cacheGen {
		return sending{}, errRecovered
	}
	s := sending{h: transport.Header{Client: c.id, Session: cn.session.ID, Seq: c.nextSeq()}, at: c.clk.Now(), gen: c.cache.Gen()}
	if cn.lease != nil {
		cn.lease.Sent(s.at, req.Op == wire.OpRenew)
	}
	return s, nil
}

// afterLoss recovers from the loss of the session lost on cn (a NACK, or
// the server given up) and says what becomes of the request: a NACKed
// request was not executed, and goes again unless o says otherwise.
func (c *Client) afterLoss(ctx context.Context, cn *conn, lost ids.SessionID, o sendOpts) (sendStep, error) {
	if err := c.recoverSession(ctx, cn, lost); err != nil {
		return sendDone, err
	}
	switch {
	case o.failOnNack:
		return sendDone, errRecovered
	case o.to != nil:
		return sendDone, errServerLost
	}
	return sendAgain, nil
}

// accept takes a server's reply: it renews cn's lease, and applies the
// reply's grants and attributes (and apply) if it came in the session it
// was sent in, unless it is a redirect. It calls answered once the grants
// are applied.
func (c *Client) accept(ctx context.Context, cn *conn, req *wire.Request, rep *wire.Reply, s sending, apply func(*cache.Cache, *wire.Reply), answered func()) (*wire.Reply, sendStep, error) {
	c.mu.Lock()
	current := s.h.Session == cn.session.ID
	if current {
		cn.lease.Acked(s.at, c.clk.Now())
		if cn.lapsed {
			cn.lapsed = false
			c.log.Info("lease renewed: server reachable again, cache still valid", "server", cn.addr)
		}
	}
	if rep.Code == wire.CodeRedirect {
		c.mu.Unlock()
		answered()
		return rep, sendRedirect, nil
	}
	if current {
		c.applyLocked(ctx, cn, rep, s.gen, apply)
	}
	server := cn.server
	c.mu.Unlock()
	answered()
	for _, g := range rep.Grants {
		c.learnOwner(g.Ino, server)
	}
	if rep.Code == wire.CodeNoSpace && req.Op != wire.OpSetXattr {
		// (a setxattr gets it for a names list too long, not a full
		// disk)
		c.noteNoSpace()
	}
	return rep, sendDone, rep.Err()
}

// applyLocked applies a reply from cn, to a request sent at the cache's
// generation gen, to the cache: its grants, its attributes and apply, in
// one step. Called with c.mu held.
func (c *Client) applyLocked(ctx context.Context, cn *conn, rep *wire.Reply, gen uint64, apply func(*cache.Cache, *wire.Reply)) {
	if len(rep.Grants) > 0 {
		cn.holds = true
	}
	if from, ok := ctx.Value(replyFromKey{}).(*ids.ServerID); ok {
		*from = cn.server // for a grant's sequence number (ReadPage)
	}
	c.cache.ApplyReply(c.rel.filter(rep.Grants), gen, func() {
		if rep.Attr != nil {
			c.cache.SetAttr(rep.Attr)
		}
		if apply != nil {
			apply(c.cache, rep)
		}
	})
	// given back by the background goroutine: this one may be what the
	// release waits for (a sender of changes behind)
	c.takeEvictedLocked()
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
