package metaserver

import (
	"context"
	"fmt"
	"log/slog"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/leasefs/leasefs/client"
	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/locks"
	"github.com/leasefs/leasefs/transport"
	"github.com/leasefs/leasefs/wire"
)

// bareServer is a Server's session and lock state without a store or a
// network, for the sweep's timing under synctest.
func bareServer(cfg Config) *Server {
	s := &Server{cfg: cfg, log: slog.New(slog.DiscardHandler), sessions: map[ids.ClientID]*session{},
		opens: map[ids.Ino]int{}, purging: map[ids.Ino]struct{}{}, stop: make(chan struct{}), swept: make(chan struct{})}
	s.lm = newLockMgr(s, false)
	return s
}

func (s *Server) addSession(c ids.ClientID) *session {
	sess := &session{id: newSessionID(), client: c, openHandle: map[ids.Ino]int{}}
	sess.lastSeen.Store(time.Now().UnixNano())
	s.mu.Lock()
	s.sessions[c] = sess
	s.mu.Unlock()
	return sess
}

func (s *Server) known(c ids.ClientID) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sessions[c] != nil
}

// TestSweepDropsSilentSessions: one periodic sweep drops a session once
// nothing arrived in it for τ(1+δ) and a margin and no request of it is
// being handled, and steals its client's locks; a session whose client
// keeps sending, or with a request being handled, stays.
func TestSweepDropsSilentSessions(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := DefaultConfig()
		silence, every := cfg.silentAfter(), cfg.sweepEvery() // 10.1 s, 1 s
		s := bareServer(cfg)
		go s.sweepLoop(s.stop)
		defer close(s.stop)
		const silent, renewing, busy = ids.ClientID(1), ids.ClientID(2), ids.ClientID(3)
		s.addSession(silent)
		renew := s.addSession(renewing)
		s.addSession(busy)
		h, err := s.lm.acquire(context.Background(), silent, 10, locks.Shared)
		if err != nil {
			t.Fatal(err)
		}
		s.lm.done(h)
		inFlight := s.enter(busy, s.sessions[busy].id)

		// Until silence has passed, all stay; the renewing client sends a
		// request every τ/2.
		start := time.Now()
		for time.Since(start)+cfg.ClientLease/2 < silence {
			time.Sleep(cfg.ClientLease / 2)
			s.leave(s.enter(renewing, renew.id))
		}
		synctest.Wait()
		if !s.known(silent) || !s.known(renewing) || !s.known(busy) {
			t.Fatal("a session dropped before τ(1+δ) and the margin passed")
		}
		// the next sweep after silence drops the silent one
		time.Sleep(start.Add(silence + every).Sub(time.Now()))
		s.leave(s.enter(renewing, renew.id))
		synctest.Wait()
		if s.known(silent) {
			t.Fatal("the silent session was not dropped")
		}
		if hs := s.lm.core.Holders(10); len(hs) != 0 {
			t.Fatalf("the silent client's locks were not stolen: %v", hs)
		}
		if !s.known(renewing) || !s.known(busy) {
			t.Fatal("a session in use was dropped")
		}
		// The busy one's request ends: its reply renews the client's
		// lease, so it is silent from then on, and dropped a silence later.
		s.leave(inFlight)
		ended := time.Now()
		time.Sleep(silence - every)
		synctest.Wait()
		if !s.known(busy) {
			t.Fatal("dropped before τ(1+δ) and the margin after its last reply")
		}
		time.Sleep(ended.Add(silence + every).Sub(time.Now()))
		synctest.Wait()
		if s.known(busy) || s.known(renewing) {
			t.Fatal("kept sessions silent for longer than τ(1+δ) and the margin")
		}
	})
}

// rawSession opens a session with a transport client of its own and
// returns a call in it.
func rawSession(t *testing.T, s *Server) (*transport.Client, ids.SessionID, func(*wire.Request) *wire.Reply) {
	t.Helper()
	tok, _ := transport.ParseToken(s.Token())
	tc := transport.NewClient(s.Addr().String(), transport.ClientConfig{Token: tok})
	t.Cleanup(func() { tc.Close() })
	var mu sync.Mutex
	seq := uint64(100)
	var sess ids.SessionID
	call := func(r *wire.Request) *wire.Reply {
		t.Helper()
		mu.Lock()
		seq++
		h := transport.Header{Client: tc.ID(), Session: sess, Seq: seq}
		mu.Unlock()
		if r.Op == wire.OpOpenSession {
			h.Session = 0
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		raw, err := tc.Call(ctx, h, r.Append(nil))
		if err != nil {
			t.Fatal(err)
		}
		rep, err := wire.ParseReply(raw)
		if err != nil {
			t.Fatal(err)
		}
		return rep
	}
	rep := call(&wire.Request{Op: wire.OpOpenSession})
	if rep.Session == nil {
		t.Fatalf("open: %v", rep.Err())
	}
	sess = rep.Session.ID
	return tc, sess, call
}

// TestMadeUpSessionsLeaveNothing (issue 26, 4b): requests under session
// ids the server never gave out are NACKed and leave no reply cache.
func TestMadeUpSessionsLeaveNothing(t *testing.T) {
	s := startTestServer(t)
	tok, _ := transport.ParseToken(s.Token())
	tc := transport.NewClient(s.Addr().String(), transport.ClientConfig{Token: tok})
	defer tc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	getattr := (&wire.Request{Op: wire.OpGetAttr, Ino: ids.RootIno}).Append(nil)
	for i := range 2000 {
		raw, err := tc.Call(ctx, transport.Header{Client: tc.ID(), Session: ids.SessionID(i), Seq: uint64(i + 1)}, getattr)
		if err != nil {
			t.Fatal(err)
		}
		if rep, _ := wire.ParseReply(raw); rep.Code != wire.CodeNack {
			t.Fatalf("session %d: %v, want a NACK", i, rep.Code)
		}
	}
	if st := s.tr.Stats(); st.Sessions != 0 || st.ReplyEntries != 0 {
		t.Fatalf("after 2000 made-up sessions: %+v", st)
	}
	// a real session has a cache, until it is gone
	tc2, _, call := rawSession(t, s)
	if st := s.tr.Stats(); st.Sessions != 1 {
		t.Fatalf("one session open: %+v", st)
	}
	call(&wire.Request{Op: wire.OpGoodbye})
	tc2.Close()
	if st := s.tr.Stats(); st.Sessions != 0 || st.ReplyEntries != 0 {
		t.Fatalf("after goodbye: %+v", st)
	}
}

// TestOpenSessionOnce: a copy of a session open (its reply was lost, or
// it arrived late) gets the session the first made, which keeps its
// locks; an older open is refused.
func TestOpenSessionOnce(t *testing.T) {
	s := startTestServer(t)
	tok, _ := transport.ParseToken(s.Token())
	tc := transport.NewClient(s.Addr().String(), transport.ClientConfig{Token: tok})
	defer tc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	call := func(h transport.Header, r *wire.Request) *wire.Reply {
		raw, err := tc.Call(ctx, h, r.Append(nil))
		if err != nil {
			t.Fatal(err)
		}
		rep, err := wire.ParseReply(raw)
		if err != nil {
			t.Fatal(err)
		}
		return rep
	}
	open := &wire.Request{Op: wire.OpOpenSession}
	first := call(transport.Header{Client: tc.ID(), Seq: 5}, open)
	if first.Session == nil {
		t.Fatal(first.Err())
	}
	rep := call(transport.Header{Client: tc.ID(), Session: first.Session.ID, Seq: 6}, &wire.Request{Op: wire.OpGetAttr, Ino: ids.RootIno})
	if len(rep.Grants) != 1 || rep.Grants[0].Ino != ids.RootIno {
		t.Fatalf("no lock on the root: %+v", rep)
	}
	again := call(transport.Header{Client: tc.ID(), Seq: 5}, open)
	if again.Session == nil || again.Session.ID != first.Session.ID {
		t.Fatalf("a copy of the open made another session: %+v", again.Session)
	}
	if hs := s.lm.core.Holders(ids.RootIno); len(hs) != 1 || hs[0].Client != tc.ID() {
		t.Fatalf("the copy stole the session's locks: %v", hs)
	}
	if stale := call(transport.Header{Client: tc.ID(), Seq: 4}, open); stale.Code != wire.CodeInvalid {
		t.Fatalf("an older open: %v, want refused", stale.Code)
	}
	if rep := call(transport.Header{Client: tc.ID(), Session: first.Session.ID, Seq: 7}, &wire.Request{Op: wire.OpRenew}); rep.Code != wire.CodeOK {
		t.Fatalf("the session after the copies: %v", rep.Code)
	}
}

// TestMaxSessions: sessions are bounded; an open beyond the bound sweeps
// silent sessions first and is refused only if none is.
func TestMaxSessions(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Dir = t.TempDir()
	cfg.Listen = "127.0.0.1:0"
	cfg.Logger = slog.New(slog.DiscardHandler)
	cfg.MaxSessions = 2
	cfg.ClientLease, cfg.DeliveryTimeout = 300*time.Millisecond, 75*time.Millisecond
	s, err := Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() }) // after the clients' cleanups
	rawSession(t, s)
	rawSession(t, s)
	tok, _ := transport.ParseToken(s.Token())
	tc := transport.NewClient(s.Addr().String(), transport.ClientConfig{Token: tok})
	defer tc.Close()
	open := func(seq uint64) *wire.Reply {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		raw, err := tc.Call(ctx, transport.Header{Client: tc.ID(), Seq: seq}, (&wire.Request{Op: wire.OpOpenSession}).Append(nil))
		if err != nil {
			t.Fatal(err)
		}
		rep, _ := wire.ParseReply(raw)
		return rep
	}
	if rep := open(1); rep.Code != wire.CodeUnavailable {
		t.Fatalf("a third session: %v, want unavailable", rep.Code)
	}
	// the two others say nothing more: once silent (as if the time had
	// passed), they make room
	s.mu.Lock()
	for _, sess := range s.sessions {
		sess.lastSeen.Store(time.Now().Add(-cfg.silentAfter() - time.Second).UnixNano())
	}
	s.mu.Unlock()
	if rep := open(2); rep.Session == nil {
		t.Fatalf("a session after the others went silent: %v", rep.Err())
	}
	if n := s.counters.SessionsSwept.Load(); n != 2 {
		t.Fatalf("%d sessions swept, want 2", n)
	}
}

// TestSilentClientRecovers: a client cut off for longer than its lease
// loses its session to the sweep (its locks, its open handles and its
// reply cache go), gets a NACK when it is back, and recovers.
func TestSilentClientRecovers(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Dir = t.TempDir()
	cfg.Listen = "127.0.0.1:0"
	cfg.Logger = slog.New(slog.DiscardHandler)
	cfg.ClientLease, cfg.DeliveryTimeout = 300*time.Millisecond, 75*time.Millisecond
	s, err := Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() }) // after the clients' cleanups
	faults := transport.NewFaults(1)
	c := connectWith(t, s, func(cc *client.Config) { cc.Faults = faults })
	t.Cleanup(func() { faults.Cut(false) }) // before the client's goodbye
	ctx := context.Background()
	a, err := c.Create(ctx, ids.RootIno, "f", syscall.S_IFREG|0o644, 0, 0, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	// (O_TRUNC: an open the server counts, not one made under the lock)
	if _, err := c.Open(ctx, a.Ino, syscall.O_RDWR|syscall.O_TRUNC); err != nil {
		t.Fatal(err)
	}
	if len(s.lm.core.HeldBy(c.ID())) == 0 || s.unopened(a.Ino) {
		t.Fatal("no lock or open handle to lose")
	}
	faults.Cut(true)
	deadline := time.Now().Add(10 * time.Second)
	for s.counters.SessionsSwept.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the silent client's session was not swept")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if held := s.lm.core.HeldBy(c.ID()); len(held) != 0 {
		t.Fatalf("locks left to a swept session: %v", held)
	}
	if !s.unopened(a.Ino) {
		t.Fatal("open handles left to a swept session")
	}
	if st := s.tr.Stats(); st.Sessions != 0 {
		t.Fatalf("reply caches left: %+v", st)
	}
	faults.Cut(false)
	if _, err := c.GetAttr(ctx, a.Ino); err != nil {
		t.Fatalf("after coming back: %v", err)
	}
	if c.Counters.NacksReceived.Load() == 0 || c.Counters.Recoveries.Load() == 0 {
		t.Fatalf("the client came back without a NACK and a recovery (%d, %d)",
			c.Counters.NacksReceived.Load(), c.Counters.Recoveries.Load())
	}
}

// TestNoStateForMadeUpInodes (issue 26, 4e): POSIX locks and open counts
// are kept for inodes that exist only.
func TestNoStateForMadeUpInodes(t *testing.T) {
	s := startTestServer(t)
	_, _, call := rawSession(t, s)
	const made = ids.Ino(1<<40 + 12345)
	lk := wire.PosixLk{Type: syscall.F_WRLCK, Start: 0, End: 100, Pid: 1, Owner: 9}
	if rep := call(&wire.Request{Op: wire.OpPosixLock, Ino: made, Lk: lk}); rep.Code != wire.CodeNotFound {
		t.Fatalf("lock on a made-up inode: %v, want not found", rep.Code)
	}
	lk.Wait = true
	if rep := call(&wire.Request{Op: wire.OpPosixLock, Ino: made, Lk: lk}); rep.Code != wire.CodeNotFound {
		t.Fatalf("waiting lock on a made-up inode: %v, want not found", rep.Code)
	}
	if n := s.lm.core.PosixLen(); n != 0 {
		t.Fatalf("%d inodes in the POSIX lock table", n)
	}
	call(&wire.Request{Op: wire.OpRenew, Ino: made, Opens: 1000})
	s.mu.Lock()
	n := len(s.opens)
	s.mu.Unlock()
	if n != 0 {
		t.Fatalf("open counts for a made-up inode: %d", n)
	}
	// nor data locks: what a request finds missing it is not granted
	for _, op := range []wire.Op{wire.OpGetAttr, wire.OpOpen, wire.OpRead, wire.OpGetXattr} {
		rep := call(&wire.Request{Op: op, Ino: made, Size: 10, Name: "user.x"})
		if rep.Code != wire.CodeNotFound || len(rep.Grants) != 0 {
			t.Fatalf("%v of a made-up inode: %v, grants %v", op, rep.Code, rep.Grants)
		}
	}
	s.lm.mu.Lock()
	held := s.lm.core.Holders(made)
	s.lm.mu.Unlock()
	if len(held) != 0 {
		t.Fatalf("data locks on a made-up inode: %v", held)
	}
	// on a real inode all of it works
	if rep := call(&wire.Request{Op: wire.OpGetAttr, Ino: ids.RootIno}); len(rep.Grants) != 1 {
		t.Fatalf("getattr of the root: %v, grants %v", rep.Code, rep.Grants)
	}
	lk.Wait = false
	if rep := call(&wire.Request{Op: wire.OpPosixLock, Ino: ids.RootIno, Lk: lk}); rep.Code != wire.CodeOK {
		t.Fatalf("lock on the root: %v", rep.Err())
	}
}

// BenchmarkIdleSessions prints the heap in use (after a collection, this
// process: the server and its clients) with 1,000 clients connected, then
// with a session each in which they sent 20 requests, then once they are
// gone without a goodbye and the sweep dropped their sessions, with what
// the transport keeps for sessions at each step. The server process
// alone, by its RSS: go test ./integration -bench ServerBounds.
//
//	go test ./metaserver -run '^$' -bench IdleSessions -benchtime 1x -v
func BenchmarkIdleSessions(b *testing.B) {
	const clients = 1000
	heap := func() uint64 {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapInuse + ms.StackInuse
	}
	for range b.N {
		cfg := DefaultConfig()
		cfg.Dir = b.TempDir()
		cfg.Listen = "127.0.0.1:0"
		cfg.Logger = slog.New(slog.DiscardHandler)
		s, err := Start(cfg)
		if err != nil {
			b.Fatal(err)
		}
		tok, _ := transport.ParseToken(s.Token())
		each := func(fn func(i int) error) {
			var wg sync.WaitGroup
			sem := make(chan struct{}, 16)
			for i := range clients {
				wg.Go(func() {
					sem <- struct{}{}
					defer func() { <-sem }()
					if err := fn(i); err != nil {
						b.Error(err)
					}
				})
			}
			wg.Wait()
		}
		tcs := make([]*transport.Client, clients)
		seqs := make([]atomic.Uint64, clients)
		base := heap()
		each(func(i int) error {
			tcs[i] = transport.NewClient(s.Addr().String(), transport.ClientConfig{Token: tok, Oldest: seqs[i].Load})
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			return tcs[i].Dial(ctx)
		})
		connected := heap()
		each(func(i int) error {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			call := func(h transport.Header, r *wire.Request) (*wire.Reply, error) {
				seqs[i].Store(h.Seq)
				raw, err := tcs[i].Call(ctx, h, r.Append(nil))
				if err != nil {
					return nil, err
				}
				return wire.ParseReply(raw)
			}
			rep, err := call(transport.Header{Client: tcs[i].ID(), Seq: 1}, &wire.Request{Op: wire.OpOpenSession})
			if err != nil || rep.Session == nil {
				return fmt.Errorf("open: %v %v", err, rep)
			}
			for n := range 20 {
				h := transport.Header{Client: tcs[i].ID(), Session: rep.Session.ID, Seq: uint64(n + 2)}
				if _, err := call(h, &wire.Request{Op: wire.OpGetAttr, Ino: ids.RootIno}); err != nil {
					return err
				}
			}
			return nil
		})
		opened, openedSt := heap(), s.tr.Stats()
		each(func(i int) error { err := tcs[i].Close(); tcs[i] = nil; return err })
		time.Sleep(2 * time.Second) // the server sees the connections go
		dropped := s.sweep(time.Now().Add(cfg.silentAfter() + time.Second))
		swept, sweptSt := heap(), s.tr.Stats()
		s.Close()
		mib := func(n uint64) float64 { return float64(n) / (1 << 20) }
		b.Logf("heap and stacks in use, %d clients: %.1f MiB before, %.1f connected (%.0f KiB each, both ends), "+
			"%.1f with a session of 20 requests each (%.1f KiB per session; transport %+v), "+
			"%.1f once gone and %d sessions swept (transport %+v)",
			clients, mib(base), mib(connected), float64(connected-base)/1024/clients,
			mib(opened), float64(int64(opened)-int64(connected))/1024/clients, openedSt,
			mib(swept), dropped, sweptSt)
	}
}
