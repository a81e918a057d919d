package client

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/lease"
	"github.com/leasefs/leasefs/transport"
	"github.com/leasefs/leasefs/wire"
)

// conn is the client's session with one server. Each server keeps its own
// client lease (Storage Tank's lease is between one client and one
// server), so the client keeps one per server it talks to.
type conn struct {
	addr string
	tr   *transport.Client
	open ctxMutex // one session opening at a time

	// guarded by Client.mu
	server  ids.ServerID // learnt when the session opened
	session wire.Session
	lease   *lease.Client // nil until a session opened
	lapsed  bool          // a lapse was logged
	// holds: the server granted a lock in this session, so the cache
	// is trusted only while this lease is valid, and losing the session
	// drops the cache.
	holds  bool
	blocks *connBlocks // set when a session opened

	gone bool // given up (guarded by servers.mu)
}

// servers is the cluster's servers as this client uses them. Requests go
// to the owner of their inode (Request.Home) as redirects taught the
// client, else to the home server: the first of the list that answers,
// the next one when it stops answering or says it cannot serve
// (wire.CodeUnavailable). Every server of a cluster shares one token.
type servers struct {
	mu      sync.Mutex
	addrs   []string
	cur     int                      // the home server, an index into addrs
	conns   map[string]*conn         // servers with a connection, by address
	byID    map[ids.ServerID]string  // where each server answered
	route   map[ids.Ino]ids.ServerID // owners learnt from redirects and grants
	sinceOK int                      // home failovers since a server last answered
	goneAt  map[string]time.Time     // when the client last gave each server up
	// lost are servers given up while they covered the cache, until
	// the recovery drops it: nothing cached is trusted meanwhile.
	lost map[*conn]struct{}
}

// maxRoutes bounds the owners the client remembers; beyond it they are
// forgotten (requests then go home first and are redirected again).
const maxRoutes = 200_000

// recentlyGone, in failover timeouts, is how long after giving a server up
// the client does not follow redirects to it.
const recentlyGone = 4

// maxRedirects is how many redirects one request follows before it asks
// the server it reaches to serve it anyway: owners learnt by a server may
// be stale while ownership moves.
const maxRedirects = 3

// errSendAgain: send the request again with a new header (its server could
// not serve it yet, or another request gave that server up).
var errSendAgain = errors.New("client: send again")

// errServerLost: the client gave up the server the request went to; the
// client recovers as after a NACK of that session, then sends it again.
var errServerLost = errors.New("client: server given up")

// newConn makes the (undialled) connection to addr.
func (c *Client) newConn(addr string) *conn {
	host, _ := os.Hostname()
	cn := &conn{addr: addr, open: newCtxMutex()}
	// a revocation names no server: its connection does
	callback := func(ctx context.Context, body []byte) []byte { return c.onCallback(ctx, cn, body) }
	cn.tr = transport.NewClient(addr, transport.ClientConfig{
		Token: c.cfg.Token, Key: c.key, Hostname: host, Logger: c.cfg.Logger,
		Faults: c.cfg.Faults, Callback: callback, DialTimeout: c.cfg.DialTimeout,
		Oldest: c.seqs.oldest,
	})
	return cn
}

// grantedBy returns the server that granted this client's lock on ino, as
// far as the client knows (0: unknown).
func (c *Client) grantedBy(ino ids.Ino) ids.ServerID {
	c.srv.mu.Lock()
	defer c.srv.mu.Unlock()
	if !c.clustered() {
		return 0
	}
	return c.srv.route[ino]
}

// connect dials the servers in order until one answers: it becomes home.
func (c *Client) connect(ctx context.Context) error {
	c.srv.addrs = c.cfg.Servers
	c.srv.conns = map[string]*conn{}
	c.srv.byID = map[ids.ServerID]string{}
	c.srv.route = map[ids.Ino]ids.ServerID{}
	c.srv.lost = map[*conn]struct{}{}
	c.srv.goneAt = map[string]time.Time{}
	var errs []error
	for i, addr := range c.cfg.Servers {
		cn := c.newConn(addr)
		dctx, cancel := context.WithTimeout(ctx, c.cfg.DialTimeout)
		err := cn.tr.Dial(dctx)
		cancel()
		if err == nil {
			c.srv.mu.Lock()
			c.srv.cur = i
			c.srv.conns[addr] = cn
			c.srv.mu.Unlock()
			return nil
		}
		cn.tr.Close()
		errs = append(errs, fmt.Errorf("%s: %w", addr, err))
	}
	return errors.Join(errs...)
}

// homeConn returns the home server's connection, made if need be.
func (c *Client) homeConn() *conn {
	c.srv.mu.Lock()
	defer c.srv.mu.Unlock()
	return c.connLocked(c.srv.addrs[c.srv.cur])
}

// connLocked returns the connection to addr, made if need be. Called with
// c.srv.mu held.
func (c *Client) connLocked(addr string) *conn {
	cn := c.srv.conns[addr]
	if cn == nil {
		cn = c.newConn(addr)
		c.srv.conns[addr] = cn
	}
	return cn
}

// hasSession reports whether cn has a session open. Called with c.mu held.
func (cn *conn) hasSession() bool { return cn.lease != nil && cn.session.ID != 0 }

// Server returns the address of the home server.
func (c *Client) Server() string {
	c.srv.mu.Lock()
	defer c.srv.mu.Unlock()
	return c.srv.addrs[c.srv.cur]
}

func (c *Client) clustered() bool { return len(c.cfg.Servers) > 1 }

// pick returns the connection req goes to, with a session open: its
// inode's owner if the client learnt one, else home.
func (c *Client) pick(ctx context.Context, req *wire.Request) (*conn, error) {
	for {
		cn := c.routed(req)
		if cn == nil {
			cn = c.homeConn()
		}
		err := c.ensureSession(ctx, cn)
		if err == nil {
			return cn, nil
		}
		if ctx.Err() != nil || !c.clustered() {
			return nil, err
		}
		c.giveUp(cn, err.Error())
	}
}

// routed returns the live connection to the owner learnt for req's inode.
func (c *Client) routed(req *wire.Request) *conn {
	if req.NoRedirect || req.Home() == 0 {
		return nil
	}
	c.srv.mu.Lock()
	defer c.srv.mu.Unlock()
	owner, ok := c.srv.route[req.Home()]
	if !ok {
		return nil
	}
	return c.srv.conns[c.srv.byID[owner]]
}

// learnOwner records that server owns ino.
func (c *Client) learnOwner(ino ids.Ino, server ids.ServerID) {
	if ino == 0 || server == 0 || !c.clustered() {
		return
	}
	c.srv.mu.Lock()
	defer c.srv.mu.Unlock()
	if c.srv.route[ino] == server {
		return
	}
	if len(c.srv.route) >= maxRoutes {
		clear(c.srv.route)
	}
	c.srv.route[ino] = server
}

// ensureSession opens a session on cn unless it has one.
func (c *Client) ensureSession(ctx context.Context, cn *conn) error {
	c.mu.Lock()
	ok := cn.hasSession()
	c.mu.Unlock()
	if ok {
		return nil
	}
	if err := cn.open.lock(ctx); err != nil {
		return err
	}
	defer cn.open.unlock()
	c.mu.Lock()
	ok = cn.hasSession()
	c.mu.Unlock()
	if ok {
		return nil
	}
	c.srv.mu.Lock()
	gone := cn.gone
	c.srv.mu.Unlock()
	if gone {
		return errSendAgain
	}
	return c.openSession(ctx, cn)
}

// follow makes owner's connection ready for ino's requests; false if the
// client cannot reach owner (then the request is served where it is).
func (c *Client) follow(ctx context.Context, ino ids.Ino, owner ids.ServerID) bool {
	c.srv.mu.Lock()
	addr, known := c.srv.byID[owner]
	var unknown []string
	if !known {
		for _, a := range c.srv.addrs {
			if c.srv.conns[a] == nil {
				unknown = append(unknown, a)
			}
		}
	}
	c.srv.mu.Unlock()
	if !known {
		// Servers answer with their id when a session opens: ask the
		// ones never asked until the owner is among them.
		for _, a := range unknown {
			if c.probe(ctx, a) == owner {
				addr, known = a, true
				break
			}
		}
		if !known {
			return false
		}
	}
	c.srv.mu.Lock()
	if time.Since(c.srv.goneAt[addr]) < recentlyGone*c.cfg.FailoverTimeout {
		// a redirect to a server that just stopped answering: its
		// leases run out soon, and the server we reached takes over
		c.srv.mu.Unlock()
		return false
	}
	cn := c.connLocked(addr)
	c.srv.mu.Unlock()
	if err := c.ensureSession(ctx, cn); err != nil {
		c.log.Warn("cannot reach the owner a server redirected to; asking to be served where we are",
			"owner", owner, "addr", addr, "err", err)
		c.giveUp(cn, err.Error())
		return false
	}
	c.learnOwner(ino, owner)
	return true
}

// probe opens a session with the server at addr to learn its id (0 if it
// does not answer).
func (c *Client) probe(ctx context.Context, addr string) ids.ServerID {
	c.srv.mu.Lock()
	cn := c.connLocked(addr)
	c.srv.mu.Unlock()
	if err := c.ensureSession(ctx, cn); err != nil {
		c.giveUp(cn, err.Error())
		return 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return cn.server
}

// giveUp stops using cn: its server stopped answering or cannot serve.
// Requests that were on it recover (errServerLost) as after a NACK; if it
// was home, the next server of the list becomes home. After a whole round
// of home failovers without an answer it pauses, so a cluster with no
// server able to serve is not hammered.
func (c *Client) giveUp(cn *conn, why string) {
	c.mu.Lock()
	c.srv.mu.Lock()
	if cn.gone {
		c.srv.mu.Unlock()
		c.mu.Unlock()
		return
	}
	cn.gone = true
	c.srv.goneAt[cn.addr] = time.Now()
	if cn.holds && cn.hasSession() {
		c.srv.lost[cn] = struct{}{}
	}
	if c.srv.conns[cn.addr] == cn {
		delete(c.srv.conns, cn.addr)
	}
	// Owners learnt may be that server or stale: ask anew.
	clear(c.srv.route)
	wasHome := c.srv.addrs[c.srv.cur] == cn.addr
	pause := false
	next := ""
	if wasHome {
		c.srv.cur = (c.srv.cur + 1) % len(c.srv.addrs)
		c.srv.sinceOK++
		pause = c.srv.sinceOK%len(c.srv.addrs) == 0
		next = c.srv.addrs[c.srv.cur]
	}
	c.srv.mu.Unlock()
	c.mu.Unlock()
	cn.tr.Close()
	if wasHome {
		c.log.Warn("failing over to another server", "from", cn.addr, "to", next, "why", why)
	} else {
		c.log.Warn("giving up a server", "server", cn.addr, "why", why)
	}
	if pause {
		time.Sleep(200 * time.Millisecond)
	}
}

// isGone reports whether cn was given up.
func (c *Client) isGone(cn *conn) bool {
	c.srv.mu.Lock()
	defer c.srv.mu.Unlock()
	return cn.gone
}

// live returns the connections in use.
func (c *Client) live() []*conn {
	c.srv.mu.Lock()
	defer c.srv.mu.Unlock()
	out := make([]*conn, 0, len(c.srv.conns))
	for _, cn := range c.srv.conns {
		out = append(out, cn)
	}
	return out
}

// answered notes that a server answered.
func (c *Client) answered() {
	c.srv.mu.Lock()
	c.srv.sinceOK = 0
	c.srv.mu.Unlock()
}

// alive asks cn's server whether it still answers at all (a renewal, which
// waits for nothing): a request may rightly wait long for a lock.
func (c *Client) alive(cn *conn, session ids.SessionID) bool {
	c.mu.Lock()
	h := transport.Header{Client: c.id, Session: session, Seq: c.nextSeq()}
	c.mu.Unlock()
	defer c.seqs.done(h.Seq)
	ctx, cancel := context.WithTimeout(context.Background(), c.cfg.FailoverTimeout)
	defer cancel()
	_, err := cn.tr.Call(ctx, h, (&wire.Request{Op: wire.OpRenew}).Append(nil))
	return err == nil
}

// nextSeq chooses the seq of a request, counted in flight until
// seqs.done: requests carry the oldest in flight, and the servers forget
// the replies to older ones (transport.ClientConfig.Oldest). A request
// resent with the same header (after a timed-out attempt) stays in
// flight between the sends. Called with c.mu held.
func (c *Client) nextSeq() uint64 {
	c.seq++
	c.seqs.add(c.seq)
	return c.seq
}

// seqsInFlight holds the seqs chosen and not done with, ascending (they
// are chosen in order under Client.mu).
type seqsInFlight struct {
	mu  sync.Mutex
	fly []uint64
}

func (q *seqsInFlight) add(seq uint64) {
	q.mu.Lock()
	q.fly = append(q.fly, seq)
	q.mu.Unlock()
}

func (q *seqsInFlight) done(seq uint64) {
	q.mu.Lock()
	if i, ok := slices.BinarySearch(q.fly, seq); ok {
		q.fly = slices.Delete(q.fly, i, i+1)
	}
	q.mu.Unlock()
}

// oldest returns the oldest seq in flight (0: none).
func (q *seqsInFlight) oldest() uint64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.fly) == 0 {
		return 0
	}
	return q.fly[0]
}
