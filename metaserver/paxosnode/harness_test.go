package paxosnode

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasefs/leasefs/internal/clock"
	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/transport"
)

// testLease is T in the tests: short so fault tests finish in seconds, long
// enough that a loaded two-core machine still renews in time.
const testLease = 300 * time.Millisecond

var (
	identOnce sync.Once
	ident     *transport.Identity
	identErr  error
)

func testIdentity(t testing.TB) *transport.Identity {
	identOnce.Do(func() { ident, identErr = transport.NewIdentity() })
	if identErr != nil {
		t.Fatal(identErr)
	}
	return ident
}

func testLogger(t testing.TB) *slog.Logger {
	if os.Getenv("LEASEFS_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

// testServer is one server of a test cluster: a transport server whose
// handler sends peer frames to the current Node, as the metaserver will.
type testServer struct {
	id     ids.ServerID
	addr   string
	dir    string
	faults *transport.Faults // wraps both the server and its peer clients
	srv    *transport.Server
	node   atomic.Pointer[Node]
	// up and handle are the server on an in-memory network (testCluster.mem)
	up     atomic.Bool
	handle transport.Handler
	// closedAt is when the node was last closed (clock.Real), 0 while up:
	// a closed node believes nothing from then on.
	closedAt atomic.Int64
}

type testCluster struct {
	t       *testing.T
	servers map[ids.ServerID]*testServer // fixed at start
	peers   map[ids.ServerID]string
	mod     func(*Config)
	mem     bool // on an in-memory network (newSimCluster)
}

// newCluster starts n servers with ids 1..n on loopback QUIC; mod adjusts
// each config.
func newCluster(t *testing.T, n int, mod func(*Config)) *testCluster {
	t.Helper()
	return startCluster(t, n, mod, false)
}

// newSimCluster is newCluster on an in-memory network, for a test in a
// testing/synctest bubble: the nodes' timers and the tests' sleeps run on
// the bubble's clock, so a test that waits for leases to run out takes no
// wall-clock time, and its bounds are on the simulated clock, which load
// on the machine cannot stretch. Only a Cut of a server's Faults applies.
func newSimCluster(t *testing.T, n int, mod func(*Config)) *testCluster {
	t.Helper()
	return startCluster(t, n, mod, true)
}

func startCluster(t *testing.T, n int, mod func(*Config), mem bool) *testCluster {
	t.Helper()
	c := &testCluster{t: t, servers: map[ids.ServerID]*testServer{}, peers: map[ids.ServerID]string{}, mod: mod, mem: mem}
	for i := 1; i <= n; i++ {
		s := &testServer{id: ids.ServerID(i), dir: t.TempDir(), faults: transport.NewFaults(uint64(i))}
		if mem {
			s.addr = fmt.Sprintf("mem:%d", i)
		}
		c.listen(s, "127.0.0.1:0")
		if !mem {
			s.addr = s.srv.Addr().String()
		}
		c.servers[s.id] = s
		c.peers[s.id] = s.addr
	}
	for id := range c.servers {
		c.startNode(id)
	}
	t.Cleanup(func() {
		for _, s := range c.servers {
			if n := s.node.Load(); n != nil {
				n.Close()
			}
			if s.srv != nil {
				s.srv.Close()
			}
		}
	})
	return c
}

func (c *testCluster) listen(s *testServer, addr string) {
	c.t.Helper()
	h := func(ctx context.Context, req *transport.Request) []byte {
		if !IsPeerBody(req.Body) {
			return []byte("not a peer frame")
		}
		n := s.node.Load()
		if n == nil {
			return errReply(ErrClosed)
		}
		return n.HandlePeer(ctx, req)
	}
	if c.mem {
		s.handle = h
		s.up.Store(true)
		return
	}
	var err error
	for try := 0; try < 50; try++ {
		s.srv, err = transport.Listen(addr, transport.ServerConfig{
			Identity: testIdentity(c.t), Logger: testLogger(c.t), Faults: s.faults}, h)
		if err == nil {
			return
		}
		time.Sleep(20 * time.Millisecond) // the old socket of a restart may linger
	}
	c.t.Fatalf("listen %s: %v", addr, err)
}

func (c *testCluster) config(id ids.ServerID) Config {
	s := c.servers[id]
	cfg := DefaultConfig(id, c.peers, s.dir, testIdentity(c.t))
	cfg.LeaseTime = testLease
	cfg.IdleRelease = time.Minute
	cfg.Faults = s.faults
	cfg.Logger = testLogger(c.t)
	if c.mem {
		cfg.dial = func(from ids.ServerID, addr string, _ transport.ClientConfig) peerConn {
			var to ids.ServerID
			fmt.Sscanf(addr, "mem:%d", &to)
			return &memConn{c: c, from: from, to: to}
		}
	}
	if c.mod != nil {
		c.mod(&cfg)
	}
	return cfg
}

func (c *testCluster) startNode(id ids.ServerID) *Node {
	c.t.Helper()
	n, err := New(c.config(id))
	if err != nil {
		c.t.Fatal(err)
	}
	s := c.servers[id]
	s.closedAt.Store(0)
	s.node.Store(n)
	return n
}

func (c *testCluster) node(id ids.ServerID) *Node { return c.servers[id].node.Load() }

// kill closes a server's node and its transport server, like a crash.
func (c *testCluster) kill(id ids.ServerID) {
	s := c.servers[id]
	n := s.node.Load()
	s.closedAt.Store(int64(clock.Real{}.Now()))
	n.Close()
	s.node.Store(nil)
	s.up.Store(false)
	if s.srv != nil {
		s.srv.Close()
		s.srv = nil
	}
}

// memConn is a link of the in-memory network: a call runs the peer's
// handler at once, unless the peer is down or either end is cut off, in
// which case it is resent, as the transport does, until ctx ends.
type memConn struct {
	c        *testCluster
	from, to ids.ServerID
	closed   atomic.Bool
}

func (m *memConn) Call(ctx context.Context, h transport.Header, body []byte) ([]byte, error) {
	src, dst := m.c.servers[m.from], m.c.servers[m.to]
	for {
		if m.closed.Load() {
			return nil, transport.ErrClosed
		}
		if dst.up.Load() && !dst.faults.Spec().Cut && !src.faults.Spec().Cut {
			rep := dst.handle(ctx, &transport.Request{Header: h, Body: bytes.Clone(body)})
			return bytes.Clone(rep), nil
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

func (m *memConn) Close() error {
	m.closed.Store(true)
	return nil
}

// restart brings a killed server back on its address and data directory.
func (c *testCluster) restart(id ids.ServerID) *Node {
	s := c.servers[id]
	c.listen(s, s.addr)
	return c.startNode(id)
}

// waitReady waits until no node sits in its start-up quarantine.
func (c *testCluster) waitReady() {
	for _, s := range c.servers {
		if n := s.node.Load(); n != nil {
			for n.Quarantined() {
				time.Sleep(5 * time.Millisecond)
			}
		}
	}
}

// eventually polls cond every 5 ms until it holds or within passes.
func eventually(t *testing.T, within time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > within {
			t.Fatalf("%s: not within %v", what, within)
		}
		time.Sleep(5 * time.Millisecond)
	}
	return time.Since(start)
}

// acquireRetry calls Acquire until it succeeds, retrying on NotOwnerError
// (a stale learner view) and on timeouts of single attempts.
func acquireRetry(t *testing.T, n *Node, ino ids.Ino, within time.Duration) ids.Epoch {
	t.Helper()
	deadline := time.Now().Add(within)
	var last error
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), testLease)
		ep, err := n.Acquire(ctx, ino)
		cancel()
		if err == nil {
			return ep
		}
		last = err
		var no *NotOwnerError
		if !errors.As(err, &no) && !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("acquire %v on %v: %v", ino, n.ID(), err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("acquire %v on %v: not within %v (last: %v)", ino, n.ID(), within, last)
	return 0
}

// belief is one sampled ownership belief: at the node's clock reading at,
// it owned the inode until until (unless it released or closed before).
type belief struct {
	node      ids.ServerID
	at, until clock.Time
	epoch     ids.Epoch
}

// belief reads ino's ownership on the node's goroutine, with the clock
// reading the core judged it by.
func (n *Node) belief(ino ids.Ino) (belief, bool) {
	var b belief
	var ok bool
	n.query(func(now clock.Time) {
		var until clock.Time
		until, b.epoch, ok = n.core.OwnedExpiry(now, ino)
		b.node, b.at, b.until = n.ID(), now, until
	})
	return b, ok
}

// sampler checks invariant 1 (DESIGN.md) while a test runs: it samples
// every node's belief for each inode, one node after the other, and fails
// if one node owned an inode at the instant another was sampled owning it.
// All nodes of a test share the process's monotonic clock, so their
// readings compare. A node that releases an inode during the test must not
// be sampled for it.
type sampler struct {
	c       *testCluster
	inos    []ids.Ino
	stop    chan struct{}
	done    chan struct{}
	samples atomic.Int64
	owned   atomic.Int64
	mu      sync.Mutex
	errs    []string
}

func (c *testCluster) sample(inos []ids.Ino) *sampler {
	sm := &sampler{c: c, inos: inos, stop: make(chan struct{}), done: make(chan struct{})}
	go sm.run()
	c.t.Cleanup(sm.finish)
	return sm
}

func (sm *sampler) run() {
	defer close(sm.done)
	for {
		select {
		case <-sm.stop:
			return
		default:
		}
		for _, ino := range sm.inos {
			var bs []belief
			for id := ids.ServerID(1); int(id) <= len(sm.c.servers); id++ {
				n := sm.c.node(id)
				if n == nil {
					continue
				}
				if b, ok := n.belief(ino); ok {
					bs = append(bs, b)
				}
			}
			sm.samples.Add(1)
			if len(bs) > 0 {
				sm.owned.Add(1)
			}
			sm.check(ino, bs)
		}
		time.Sleep(time.Millisecond)
	}
}

func (sm *sampler) check(ino ids.Ino, bs []belief) {
	for i, a := range bs {
		for _, b := range bs[i+1:] {
			// a was sampled first; it still believed at b's sample unless
			// its lease ran out or its node closed before that
			end := a.until
			if c := clock.Time(sm.c.servers[a.node].closedAt.Load()); c != 0 && c < end {
				end = c
			}
			if !b.at.Before(end) {
				continue
			}
			sm.mu.Lock()
			sm.errs = append(sm.errs, fmt.Sprintf("invariant 1: %v owned by %v (epoch %v, until %d) and %v (epoch %v) at %d",
				ino, a.node, a.epoch, a.until, b.node, b.epoch, b.at))
			sm.mu.Unlock()
		}
	}
}

// finish stops the sampler and reports violations; safe to call twice.
func (sm *sampler) finish() {
	for _, e := range sm.violations() {
		sm.c.t.Error(e)
	}
}

// violations stops the sampler and returns (and forgets) what it found.
func (sm *sampler) violations() []string {
	select {
	case <-sm.stop:
	default:
		close(sm.stop)
	}
	<-sm.done
	sm.mu.Lock()
	defer sm.mu.Unlock()
	errs := sm.errs
	sm.errs = nil
	return errs
}
