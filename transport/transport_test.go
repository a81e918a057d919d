package transport

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
)

var (
	testIDOnce sync.Once
	testID     *Identity
	// testKey is the tests' clients' key, and cid its client id
	testKey = mustKey()
	cid     = testKey.ID()
)

func mustKey() *ClientKey {
	k, err := NewClientKey()
	if err != nil {
		panic(err)
	}
	return k
}

// identity returns one identity shared by the tests (key generation is the
// slow part of setup).
func identity(t testing.TB) *Identity {
	testIDOnce.Do(func() {
		var err error
		testID, err = NewIdentity()
		if err != nil {
			t.Fatal(err)
		}
	})
	return testID
}

// echo replies "re:" + body.
func echo(_ context.Context, r *Request) []byte {
	return append([]byte("re:"), r.Body...)
}

// listen starts a server on which sessions 1 and 2 of cid are open.
func listen(t testing.TB, cfg ServerConfig, h Handler) *Server {
	t.Helper()
	if cfg.Identity == nil {
		cfg.Identity = identity(t)
	}
	s, err := Listen("127.0.0.1:0", cfg, h)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	s.OpenSession(cid, 1)
	s.OpenSession(cid, 2)
	return s
}

func client(t testing.TB, addr string, cfg ClientConfig) *Client {
	t.Helper()
	if cfg.Token == (Token{}) {
		cfg.Token = identity(t).TokenValue()
	}
	if cfg.Key == nil {
		cfg.Key = testKey
	}
	if cfg.Hostname == "" {
		cfg.Hostname = "testhost"
	}
	c := NewClient(addr, cfg)
	t.Cleanup(func() { c.Close() })
	return c
}

func ctxT(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func TestCallRoundTrip(t *testing.T) {
	var gotConn atomic.Pointer[ServerConn]
	s := listen(t, ServerConfig{}, func(ctx context.Context, r *Request) []byte {
		gotConn.Store(r.Conn)
		return echo(ctx, r)
	})
	c := client(t, s.Addr().String(), ClientConfig{Hostname: "box1"})
	ctx := ctxT(t, 10*time.Second)
	if err := c.Dial(ctx); err != nil {
		t.Fatal(err)
	}
	if c.ID() != cid || !s.Connected(cid) {
		t.Fatalf("server does not see client %v (%v) connected", c.ID(), cid)
	}
	for i := range 50 {
		body := fmt.Appendf(nil, "hello %d", i)
		reply, err := c.Call(ctx, Header{Client: cid, Session: 1, Seq: uint64(i + 1)}, body)
		if err != nil {
			t.Fatal(err)
		}
		if want := "re:" + string(body); string(reply) != want {
			t.Fatalf("reply %q, want %q", reply, want)
		}
	}
	sc := gotConn.Load()
	if sc.Client() != cid || sc.Host() != "box1" || sc.RemoteAddr() == nil || sc.Peer() {
		t.Fatalf("conn: client %v host %q addr %v", sc.Client(), sc.Host(), sc.RemoteAddr())
	}
	// empty bodies both ways
	s2 := listen(t, ServerConfig{}, func(context.Context, *Request) []byte { return nil })
	c2 := client(t, s2.Addr().String(), ClientConfig{})
	reply, err := c2.Call(ctx, Header{Client: cid, Session: 1, Seq: 1}, nil)
	if err != nil || len(reply) != 0 {
		t.Fatalf("empty call: %q, %v", reply, err)
	}
}

func TestConcurrentCalls(t *testing.T) {
	s := listen(t, ServerConfig{}, func(ctx context.Context, r *Request) []byte {
		time.Sleep(time.Millisecond)
		return echo(ctx, r)
	})
	c := client(t, s.Addr().String(), ClientConfig{})
	ctx := ctxT(t, 20*time.Second)
	var wg sync.WaitGroup
	var seq atomic.Uint64
	errs := make(chan error, 1000)
	for range 32 {
		wg.Go(func() {
			for range 20 {
				n := seq.Add(1)
				body := fmt.Appendf(nil, "%d", n)
				reply, err := c.Call(ctx, Header{Client: cid, Session: 1, Seq: n}, body)
				if err != nil {
					errs <- err
					return
				}
				if string(reply) != "re:"+string(body) {
					errs <- fmt.Errorf("seq %d: reply %q", n, reply)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// logBuffer collects log lines for assertions.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func TestAuthWrongSecret(t *testing.T) {
	var logs logBuffer
	var served atomic.Int32
	s := listen(t, ServerConfig{Logger: slog.New(slog.NewTextHandler(&logs, nil))},
		func(ctx context.Context, r *Request) []byte { served.Add(1); return nil })
	tok := identity(t).TokenValue()
	tok.Secret[0] ^= 1
	c := client(t, s.Addr().String(), ClientConfig{Token: tok})
	start := time.Now()
	err := c.Dial(ctxT(t, 10*time.Second))
	if !errors.Is(err, ErrAuth) {
		t.Fatalf("Dial: %v, want ErrAuth", err)
	}
	// Call must not retry a refusal forever.
	_, err = c.Call(ctxT(t, 10*time.Second), Header{Client: cid, Session: 1, Seq: 1}, []byte("x"))
	if !errors.Is(err, ErrAuth) {
		t.Fatalf("Call: %v, want ErrAuth", err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("refusal took %v", d)
	}
	if served.Load() != 0 {
		t.Fatal("handler ran for an unauthenticated client")
	}
	if s.Connected(cid) {
		t.Fatal("refused client counts as connected")
	}
	if l := logs.String(); !strings.Contains(l, "refused client: bad token") || !strings.Contains(l, "127.0.0.1:") {
		t.Fatalf("refusal not logged with address: %q", l)
	}
}

func TestAuthWrongCert(t *testing.T) {
	other, err := NewIdentity()
	if err != nil {
		t.Fatal(err)
	}
	s := listen(t, ServerConfig{Identity: other}, echo)
	// our token pins identity(t)'s certificate, but carries the right secret
	tok := identity(t).TokenValue()
	tok.Secret = other.Secret
	c := client(t, s.Addr().String(), ClientConfig{Token: tok})
	err = c.Dial(ctxT(t, 10*time.Second))
	if !errors.Is(err, ErrWrongServer) {
		t.Fatalf("Dial: %v, want ErrWrongServer", err)
	}
	_, err = c.Call(ctxT(t, 10*time.Second), Header{Client: cid, Session: 1, Seq: 1}, nil)
	if !errors.Is(err, ErrWrongServer) {
		t.Fatalf("Call: %v, want ErrWrongServer", err)
	}
}

func TestDialUnreachable(t *testing.T) {
	s := listen(t, ServerConfig{}, echo)
	addr := s.Addr().String()
	s.Close()
	c := client(t, addr, ClientConfig{DialTimeout: 500 * time.Millisecond})
	start := time.Now()
	err := c.Dial(ctxT(t, 10*time.Second))
	if !errors.Is(err, ErrUnreachable) {
		t.Fatalf("Dial: %v, want ErrUnreachable", err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("took %v", d)
	}
	// Call keeps trying until its context ends.
	ctx, cancel := context.WithTimeout(context.Background(), 700*time.Millisecond)
	defer cancel()
	_, err = c.Call(ctx, Header{Client: cid, Session: 1, Seq: 1}, nil)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Call: %v, want deadline exceeded", err)
	}
}

func TestCallback(t *testing.T) {
	s := listen(t, ServerConfig{}, echo)
	var got atomic.Value
	c := client(t, s.Addr().String(), ClientConfig{Callback: func(_ context.Context, body []byte) []byte {
		got.Store(string(body))
		return append([]byte("ack:"), body...)
	}})
	ctx := ctxT(t, 10*time.Second)
	if _, err := s.Callback(ctx, cid, []byte("revoke")); !errors.Is(err, ErrNotConnected) {
		t.Fatalf("callback before connect: %v, want ErrNotConnected", err)
	}
	if err := c.Dial(ctx); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		body := fmt.Appendf(nil, "revoke %d", i)
		reply, err := s.Callback(ctx, cid, body)
		if err != nil {
			t.Fatal(err)
		}
		if string(reply) != "ack:"+string(body) || got.Load() != string(body) {
			t.Fatalf("reply %q, client saw %q", reply, got.Load())
		}
	}
	// a client that is gone: fail fast
	c.Close()
	deadline := time.Now().Add(5 * time.Second)
	for s.Connected(cid) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	start := time.Now()
	if _, err := s.Callback(ctx, cid, []byte("x")); !errors.Is(err, ErrNotConnected) {
		t.Fatalf("callback after close: %v, want ErrNotConnected", err)
	}
	if time.Since(start) > time.Second {
		t.Fatal("callback to a gone client did not fail fast")
	}
}

func TestCallbackTimeout(t *testing.T) {
	s := listen(t, ServerConfig{}, echo)
	block := make(chan struct{})
	defer close(block)
	c := client(t, s.Addr().String(), ClientConfig{Callback: func(ctx context.Context, body []byte) []byte {
		<-block
		return nil
	}})
	if err := c.Dial(ctxT(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err := s.Callback(ctx, cid, []byte("x"))
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("callback: %v, want deadline exceeded", err)
	}
}

func TestTooLarge(t *testing.T) {
	s := listen(t, ServerConfig{}, func(_ context.Context, r *Request) []byte {
		if string(r.Body) == "big" {
			return make([]byte, MaxBody+1)
		}
		return []byte("ok")
	})
	c := client(t, s.Addr().String(), ClientConfig{})
	ctx := ctxT(t, 10*time.Second)
	if _, err := c.Call(ctx, Header{Client: cid, Session: 1, Seq: 1}, make([]byte, MaxBody+1)); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("oversized request: %v", err)
	}
	if _, err := c.Call(ctx, Header{Client: cid, Session: 1, Seq: 2}, []byte("big")); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("oversized reply: %v", err)
	}
	// exactly MaxBody is fine, and the client still works
	reply, err := c.Call(ctx, Header{Client: cid, Session: 1, Seq: 3}, make([]byte, MaxBody))
	if err != nil || string(reply) != "ok" {
		t.Fatalf("MaxBody request: %q, %v", reply, err)
	}
}

func TestLargeCalls(t *testing.T) {
	s := listen(t, ServerConfig{}, func(_ context.Context, r *Request) []byte {
		// reply with the body reversed so corruption anywhere shows
		out := make([]byte, len(r.Body))
		for i, b := range r.Body {
			out[len(out)-1-i] = b
		}
		return out
	})
	c := client(t, s.Addr().String(), ClientConfig{})
	ctx := ctxT(t, 20*time.Second)
	for i, n := range []int{1, smallFrame, smallFrame + 1, 1 << 20, 4 << 20} {
		body := make([]byte, n)
		for j := range body {
			body[j] = byte(j*7 + i)
		}
		reply, err := c.Call(ctx, Header{Client: cid, Session: 1, Seq: uint64(i + 1)}, body)
		if err != nil {
			t.Fatal(err)
		}
		for j := range body {
			if reply[len(reply)-1-j] != body[j] {
				t.Fatalf("size %d: byte %d differs", n, j)
			}
		}
	}
}

func TestClosedClient(t *testing.T) {
	s := listen(t, ServerConfig{}, echo)
	c := client(t, s.Addr().String(), ClientConfig{})
	ctx := ctxT(t, 10*time.Second)
	if _, err := c.Call(ctx, Header{Client: cid, Session: 1, Seq: 1}, nil); err != nil {
		t.Fatal(err)
	}
	c.Close()
	if _, err := c.Call(ctx, Header{Client: cid, Session: 1, Seq: 2}, nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("call after close: %v", err)
	}
}

func TestClientIDMustMatchConnection(t *testing.T) {
	var served atomic.Int32
	s := listen(t, ServerConfig{}, func(context.Context, *Request) []byte { served.Add(1); return nil })
	c := client(t, s.Addr().String(), ClientConfig{})
	_, err := c.Call(ctxT(t, 10*time.Second), Header{Client: cid + 1, Session: 1, Seq: 1}, nil)
	if !errors.Is(err, ErrProtocol) {
		t.Fatalf("spoofed client id: %v, want ErrProtocol", err)
	}
	if served.Load() != 0 {
		t.Fatal("request with a foreign client id was served")
	}
}

// rawStream opens a request stream on an authenticated connection, for
// sending frames the Client would never send.
func rawStream(t testing.TB, c *Client) *quic.Stream {
	t.Helper()
	cc, err := c.conn(ctxT(t, 10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	st, err := cc.qc.OpenStreamSync(ctxT(t, 10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	st.SetDeadline(time.Now().Add(10 * time.Second))
	return st
}

func TestBadFramesFromPeer(t *testing.T) {
	var logs logBuffer
	var served atomic.Int32
	s := listen(t, ServerConfig{Logger: slog.New(slog.NewTextHandler(&logs, nil))},
		func(context.Context, *Request) []byte { served.Add(1); return []byte("ok") })
	c := client(t, s.Addr().String(), ClientConfig{})
	cases := []struct {
		name string
		raw  func() []byte
		want error
		log  string
	}{
		{"unknown version", func() []byte {
			b := appendFrame(nil, frame{kind: kindRequest, Header: Header{Client: cid, Session: 1, Seq: 1}})
			b[4] = 9
			return b
		}, ErrProtocol, "unsupported frame version"},
		{"oversized", func() []byte {
			b := appendHead(nil, kindRequest, Header{Client: cid, Session: 1, Seq: 2}, 0, MaxBody+1)
			return append(b, make([]byte, 1000)...) // the rest never comes
		}, ErrTooLarge, "request too large"},
		{"wrong kind", func() []byte {
			return appendFrame(nil, frame{kind: kindCallbackReply, Header: Header{Client: cid, Session: 1, Seq: 3}})
		}, ErrProtocol, ""},
	}
	for _, tc := range cases {
		st := rawStream(t, c)
		if _, err := st.Write(tc.raw()); err != nil {
			t.Fatal(err)
		}
		var head [frameHead]byte
		f, err := readFrame(st, &head)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if f.kind != kindError {
			t.Fatalf("%s: got %v frame, want error", tc.name, f.kind)
		}
		if err := remoteError(f.body); !errors.Is(err, tc.want) {
			t.Fatalf("%s: %v, want %v", tc.name, err, tc.want)
		}
		if tc.log != "" && !strings.Contains(logs.String(), tc.log) {
			t.Fatalf("%s: not logged: %s", tc.name, logs.String())
		}
	}
	if served.Load() != 0 {
		t.Fatal("a bad frame reached the handler")
	}
	// the connection still serves proper calls
	if r, err := c.Call(ctxT(t, 10*time.Second), Header{Client: cid, Session: 1, Seq: 10}, nil); err != nil || string(r) != "ok" {
		t.Fatalf("after bad frames: %q %v", r, err)
	}
}

// A request with a seq older than the reply cache's window is refused rather
// than executed again.
func TestEvictedSeqRefused(t *testing.T) {
	var runs atomic.Int32
	s := listen(t, ServerConfig{ReplyCacheSize: 4}, func(context.Context, *Request) []byte { runs.Add(1); return nil })
	c := client(t, s.Addr().String(), ClientConfig{})
	ctx := ctxT(t, 10*time.Second)
	for seq := uint64(1); seq <= 10; seq++ {
		if _, err := c.Call(ctx, Header{Client: cid, Session: 1, Seq: seq}, nil); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.Call(ctx, Header{Client: cid, Session: 1, Seq: 2}, nil); !errors.Is(err, ErrReplyEvicted) {
		t.Fatalf("old seq: %v", err)
	}
	if runs.Load() != 10 {
		t.Fatalf("ran %d times", runs.Load())
	}
	// other sessions are independent
	if _, err := c.Call(ctx, Header{Client: cid, Session: 2, Seq: 2}, nil); err != nil {
		t.Fatal(err)
	}
}

func TestCloseDoesNotHangOrLeak(t *testing.T) {
	before := runtime.NumGoroutine()
	block := make(chan struct{})
	s, err := Listen("127.0.0.1:0", ServerConfig{Identity: identity(t)}, func(ctx context.Context, r *Request) []byte {
		select {
		case <-block:
		case <-ctx.Done(): // Close cancels handlers' context
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	c := NewClient(s.Addr().String(), ClientConfig{Token: identity(t).TokenValue(), Key: testKey})
	done := make(chan error, 1)
	go func() {
		_, err := c.Call(context.Background(), Header{Client: cid, Session: 1, Seq: 1}, nil)
		done <- err
	}()
	time.Sleep(100 * time.Millisecond)
	// closing the client ends a call in progress with ErrClosed
	c.Close()
	select {
	case err := <-done:
		if !errors.Is(err, ErrClosed) {
			t.Fatalf("call during Close: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Call did not return after Close")
	}
	closed := make(chan struct{})
	go func() { s.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("Server.Close hangs on a running handler")
	}
	close(block)
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before+2 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > before+2 {
		buf := make([]byte, 1<<20)
		t.Fatalf("%d goroutines before, %d after close:\n%s", before, n, buf[:runtime.Stack(buf, true)])
	}
}

// A reply in a frame version we do not speak is a protocol error, returned
// at once, not retried forever.
func TestClientRejectsUnknownReplyVersion(t *testing.T) {
	var head [frameHead]byte
	b := appendFrame(nil, frame{kind: kindReply, Header: Header{Seq: 1}})
	b[4] = 3
	_, err := readFrame(bytes.NewReader(b), &head)
	if !errors.Is(err, ErrProtocol) || !final(err) {
		t.Fatalf("%v: not a final protocol error", err)
	}
}

// TestIdempotentRerun: a duplicate of a request its handler marked
// Idempotent runs the handler again (the transport kept no reply), and
// the reply, a pooled Buffer, arrives whole both times; a duplicate of
// any other request is answered from the reply cache without running.
func TestIdempotentRerun(t *testing.T) {
	var runs atomic.Int32
	s := listen(t, ServerConfig{}, func(_ context.Context, req *Request) []byte {
		runs.Add(1)
		if string(req.Body) != "read" {
			return []byte("once")
		}
		req.Idempotent = true
		b := Buffer(256 << 10)
		for i := range b {
			b[i] = byte(i % 251)
		}
		return b
	})
	c := client(t, s.Addr().String(), ClientConfig{})
	ctx := ctxT(t, 10*time.Second)
	want := make([]byte, 256<<10)
	for i := range want {
		want[i] = byte(i % 251)
	}
	h := Header{Client: cid, Session: 1, Seq: 1}
	for i := range 2 {
		got, err := c.Call(ctx, h, []byte("read"))
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("read %d: %d bytes, %v", i, len(got), err)
		}
	}
	if n := runs.Load(); n != 2 {
		t.Fatalf("an idempotent request and its duplicate ran %d times, want 2", n)
	}
	h.Seq = 2
	for range 2 {
		if got, err := c.Call(ctx, h, []byte("write")); err != nil || string(got) != "once" {
			t.Fatalf("write: %q %v", got, err)
		}
	}
	if n := runs.Load(); n != 3 {
		t.Fatalf("a change and its duplicate ran %d times in all, want 3", n)
	}
}

// A closing server ends its handlers' context; what a handler answers then
// (here "interrupted", as the metadata server's do) must not reach the
// client as the request's reply: the client gets no reply and may send the
// request elsewhere. (Seen as an fsync failing with EINTR when a cluster
// test killed the file's owner.)
func TestNoReplyWhileClosing(t *testing.T) {
	s := listen(t, ServerConfig{}, func(ctx context.Context, r *Request) []byte {
		if ctx.Err() != nil {
			return []byte("interrupted")
		}
		return []byte("done")
	})
	c := client(t, s.Addr().String(), ClientConfig{})
	if reply, err := c.Call(ctxT(t, 10*time.Second), Header{Client: cid, Session: 1, Seq: 1}, nil); err != nil || string(reply) != "done" {
		t.Fatalf("before closing: %q %v", reply, err)
	}
	// the first step of Close, with the connection still up
	s.stop()
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	reply, err := c.Call(ctx, Header{Client: cid, Session: 1, Seq: 2}, nil)
	if err == nil {
		t.Fatalf("a closing server answered %q", reply)
	}
}
