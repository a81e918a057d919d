package transport

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
)

func TestParseFaults(t *testing.T) {
	s, err := ParseFaultSpec("drop=0.2,dup=0.2,delay=5ms,jitter=2ms,reorder=0.1,cut")
	if err != nil {
		t.Fatal(err)
	}
	want := FaultSpec{Drop: 0.2, Dup: 0.2, Delay: 5 * time.Millisecond, Jitter: 2 * time.Millisecond, Reorder: 0.1, Cut: true}
	if s != want {
		t.Fatalf("%+v", s)
	}
	back, err := ParseFaultSpec(s.String())
	if err != nil || back != s {
		t.Fatalf("round trip %q: %+v %v", s.String(), back, err)
	}
	if (FaultSpec{}).String() != "none" {
		t.Fatal("empty spec string")
	}
	for _, bad := range []string{"drop=2", "drop", "delay=x", "loss=0.1", "cut=maybe", "jitter=-1ms"} {
		if _, err := ParseFaultSpec(bad); err == nil || !strings.HasPrefix(err.Error(), "transport: faults: ") {
			t.Errorf("%q: %v", bad, err)
		}
	}
	f, err := ParseFaults("seed=42,dropin=0.5")
	if err != nil || f.Spec().DropIn != 0.5 || f.String() != "dropin=0.5" {
		t.Fatalf("ParseFaults: %v %v", f, err)
	}
}

// faultPair runs a server and a client that both inject faults.
func faultPair(t *testing.T, spec FaultSpec, h Handler, ccfg ClientConfig) (*Server, *Client, *Faults, *Faults) {
	sf, cf := NewFaults(1), NewFaults(2)
	sf.Set(spec)
	cf.Set(spec)
	s := listen(t, ServerConfig{Faults: sf}, h)
	ccfg.Faults = cf
	c := client(t, s.Addr().String(), ccfg)
	return s, c, sf, cf
}

// quic-go must work over the wrapper: 20% loss and 20% duplication in both
// directions, every call succeeds and runs exactly once.
func TestCallsUnderLossAndDup(t *testing.T) {
	var mu sync.Mutex
	runs := map[uint64]int{}
	h := func(_ context.Context, r *Request) []byte {
		mu.Lock()
		runs[r.Seq]++
		mu.Unlock()
		return append([]byte("re:"), r.Body...)
	}
	_, c, sf, cf := faultPair(t, FaultSpec{Drop: 0.2, Dup: 0.2}, h, ClientConfig{})
	ctx := ctxT(t, 40*time.Second)
	var wg sync.WaitGroup
	errs := make(chan error, 100)
	for w := range 4 {
		wg.Go(func() {
			for i := range 25 {
				seq := uint64(w*25 + i + 1)
				body := make([]byte, 100+int(seq)*300) // some calls span several packets
				body[0] = byte(seq)
				reply, err := c.Call(ctx, Header{Client: cid, Session: 1, Seq: seq}, body)
				if err != nil {
					errs <- fmt.Errorf("seq %d: %w", seq, err)
					return
				}
				if len(reply) != len(body)+3 || reply[3] != byte(seq) {
					errs <- fmt.Errorf("seq %d: bad reply", seq)
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if len(runs) != 100 {
		t.Fatalf("%d distinct requests ran, want 100", len(runs))
	}
	for seq, n := range runs {
		if n != 1 {
			t.Fatalf("seq %d ran %d times", seq, n)
		}
	}
	ss, cs := sf.Stats(), cf.Stats()
	if ss.Dropped == 0 || cs.Dropped == 0 || ss.Duplicated == 0 || cs.Duplicated == 0 {
		t.Fatalf("faults not injected: server %+v client %+v", ss, cs)
	}
	t.Logf("server %+v\nclient %+v", ss, cs)
}

func TestDelayReorder(t *testing.T) {
	_, c, _, cf := faultPair(t, FaultSpec{Delay: 3 * time.Millisecond, Jitter: 2 * time.Millisecond, Reorder: 0.2, Dup: 0.1}, echo, ClientConfig{})
	ctx := ctxT(t, 20*time.Second)
	for i := range 30 {
		body := make([]byte, 5000)
		body[4999] = byte(i)
		reply, err := c.Call(ctx, Header{Client: cid, Session: 1, Seq: uint64(i + 1)}, body)
		if err != nil || len(reply) != 5003 || reply[5002] != byte(i) {
			t.Fatalf("call %d: %v", i, err)
		}
	}
	if st := cf.Stats(); st.Reordered == 0 || st.Delayed == 0 {
		t.Fatalf("no reordering: %+v", st)
	}
}

// A reply lost in a partition: the client's attempt times out, it resends the
// same header, and the server answers from its reply cache. The handler runs
// exactly once.
func TestLostReplyExecutedOnce(t *testing.T) {
	var runs atomic.Int32
	sf := NewFaults(1)
	h := func(_ context.Context, r *Request) []byte {
		if runs.Add(1) == 1 {
			// lose this reply (and everything else) for a while
			sf.Cut(true)
			time.AfterFunc(400*time.Millisecond, func() { sf.Cut(false) })
		}
		return []byte("done")
	}
	s := listen(t, ServerConfig{Faults: sf}, h)
	c := client(t, s.Addr().String(), ClientConfig{AttemptTimeout: 150 * time.Millisecond})
	reply, err := c.Call(ctxT(t, 10*time.Second), Header{Client: cid, Session: 1, Seq: 1}, []byte("mkdir"))
	if err != nil || string(reply) != "done" {
		t.Fatalf("%q %v", reply, err)
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("handler ran %d times", n)
	}
	if sf.Stats().Dropped == 0 {
		t.Fatal("nothing was dropped; the test proved nothing")
	}
}

// A duplicate arriving while the first execution still runs waits for it.
func TestDuplicateInFlightWaits(t *testing.T) {
	var runs atomic.Int32
	release := make(chan struct{})
	h := func(_ context.Context, r *Request) []byte {
		runs.Add(1)
		<-release
		return []byte("slow")
	}
	s := listen(t, ServerConfig{}, h)
	c := client(t, s.Addr().String(), ClientConfig{AttemptTimeout: 100 * time.Millisecond})
	var logged atomic.Int32
	c.log = slog.New(countHandler{&logged})
	time.AfterFunc(600*time.Millisecond, func() { close(release) })
	reply, err := c.Call(ctxT(t, 10*time.Second), Header{Client: cid, Session: 1, Seq: 1}, nil)
	if err != nil || string(reply) != "slow" {
		t.Fatalf("%q %v", reply, err)
	}
	if runs.Load() != 1 {
		t.Fatalf("ran %d times", runs.Load())
	}
	if logged.Load() < 2 {
		t.Fatalf("only %d retries; duplicates were not exercised", logged.Load())
	}
}

// countHandler counts log records (retries are logged at debug level).
type countHandler struct{ n *atomic.Int32 }

func (h countHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h countHandler) Handle(context.Context, slog.Record) error {
	h.n.Add(1)
	return nil
}
func (h countHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h countHandler) WithGroup(string) slog.Handler      { return h }

// A connection lost after the handler ran: the client redials, resends, and
// gets the cached reply.
func TestLostConnectionExecutedOnce(t *testing.T) {
	var runs atomic.Int32
	h := func(_ context.Context, r *Request) []byte {
		if runs.Add(1) == 1 {
			r.Conn.qc.CloseWithError(0, "test: drop connection before the reply")
		}
		return []byte("once")
	}
	s := listen(t, ServerConfig{}, h)
	c := client(t, s.Addr().String(), ClientConfig{})
	reply, err := c.Call(ctxT(t, 10*time.Second), Header{Client: cid, Session: 1, Seq: 1}, nil)
	if err != nil || string(reply) != "once" {
		t.Fatalf("%q %v", reply, err)
	}
	if runs.Load() != 1 {
		t.Fatalf("ran %d times", runs.Load())
	}
	// a new seq runs; after ForgetSession the session has no reply cache, and
	// an old seq runs again (the application refuses requests of sessions it
	// forgot)
	c.Call(ctxT(t, 10*time.Second), Header{Client: cid, Session: 1, Seq: 2}, nil)
	s.ForgetSession(cid, 1)
	c.Call(ctxT(t, 10*time.Second), Header{Client: cid, Session: 1, Seq: 1}, nil)
	if runs.Load() != 3 {
		t.Fatalf("ran %d times, want 3", runs.Load())
	}
}

// A partition shorter than the idle timeout: calls block, then complete on
// the same connection with nothing lost.
func TestBriefPartition(t *testing.T) {
	_, c, _, cf := faultPair(t, FaultSpec{}, echo, ClientConfig{})
	ctx := ctxT(t, 20*time.Second)
	if _, err := c.Call(ctx, Header{Client: cid, Session: 1, Seq: 1}, nil); err != nil {
		t.Fatal(err)
	}
	conn := c.cur
	cf.Cut(true)
	time.AfterFunc(time.Second, func() { cf.Cut(false) })
	start := time.Now()
	reply, err := c.Call(ctx, Header{Client: cid, Session: 1, Seq: 2}, []byte("x"))
	if err != nil || string(reply) != "re:x" {
		t.Fatalf("%q %v", reply, err)
	}
	if d := time.Since(start); d < 900*time.Millisecond {
		t.Fatalf("call returned after %v during a 1s partition", d)
	}
	if c.cur != conn {
		t.Fatal("a brief partition should not cost the connection")
	}
	// while cut, a call with a short context fails with the context's error
	cf.Cut(true)
	short, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if _, err := c.Call(short, Header{Client: cid, Session: 1, Seq: 3}, nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("cut call: %v", err)
	}
	cf.Cut(false)
}

// Server restart on the same port with the same identity: the next call
// succeeds within a few seconds, whether the old server went away cleanly or
// crashed (then the stateless reset tells the client at once).
func TestServerRestart(t *testing.T) {
	for _, crash := range []bool{false, true} {
		t.Run(fmt.Sprintf("crash=%v", crash), func(t *testing.T) {
			s := listen(t, ServerConfig{}, echo)
			addr := s.Addr().String()
			c := client(t, addr, ClientConfig{})
			ctx := ctxT(t, 20*time.Second)
			if _, err := c.Call(ctx, Header{Client: cid, Session: 1, Seq: 1}, nil); err != nil {
				t.Fatal(err)
			}
			old := c.cur
			if crash {
				// no CONNECTION_CLOSE leaves: like SIGKILL
				s.udp.Close()
			}
			s.Close()
			s2, err := Listen(addr, ServerConfig{Identity: identity(t)}, func(_ context.Context, r *Request) []byte {
				return []byte("new")
			})
			if err != nil {
				t.Fatal(err)
			}
			defer s2.Close()
			start := time.Now()
			reply, err := c.Call(ctx, Header{Client: cid, Session: 1, Seq: 2}, nil)
			if err != nil || string(reply) != "new" {
				t.Fatalf("%q %v", reply, err)
			}
			d := time.Since(start)
			t.Logf("first call after restart took %v", d)
			if d > 3*time.Second {
				t.Fatalf("took %v to notice the restart", d)
			}
			if c.cur == old {
				t.Fatal("still on the old connection")
			}
		})
	}
}

// The stateless reset must be what ends the old connection after a crash,
// not the idle timeout.
func TestStatelessResetKeyStable(t *testing.T) {
	id := identity(t)
	if *statelessResetKey(id.Secret) != *statelessResetKey(id.Secret) {
		t.Fatal("reset key not deterministic")
	}
	other := id.Secret
	other[0] ^= 1
	if *statelessResetKey(other) == *statelessResetKey(id.Secret) {
		t.Fatal("reset key ignores the secret")
	}
	var _ *quic.StatelessResetKey = statelessResetKey(id.Secret)
}
