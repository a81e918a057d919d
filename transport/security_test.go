package transport

import (
	"context"
	"crypto/tls"
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

	"github.com/leasefs/leasefs/internal/ids"
)

// rawDial makes a QUIC connection to the server as a client would, with
// key's certificate, and sends nothing.
func rawDial(t testing.TB, addr string, key *ClientKey) *quic.Conn {
	t.Helper()
	tlsConf := &tls.Config{
		InsecureSkipVerify: true,
		ServerName:         "leasefs",
		NextProtos:         []string{alpn},
		MinVersion:         tls.VersionTLS13,
		Certificates:       []tls.Certificate{key.cert},
	}
	qc, err := quic.DialAddr(ctxT(t, 10*time.Second), addr, tlsConf, quicConfig(maxCallbackStreams))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { qc.CloseWithError(0, "") })
	return qc
}

// TestImpostorRefused: a token holder that claims another client's id
// (it learnt it from the admin endpoint, say) is refused, however it
// tries; the real client keeps its callbacks, and a client that moved
// reconnects with its key and gets them again.
func TestImpostorRefused(t *testing.T) {
	var logs logBuffer
	s := listen(t, ServerConfig{Logger: slog.New(slog.NewTextHandler(&logs, nil))}, echo)
	var real, impostor atomic.Int32
	c := client(t, s.Addr().String(), ClientConfig{Callback: func(_ context.Context, body []byte) []byte {
		real.Add(1)
		return []byte("flushed")
	}})
	ctx := ctxT(t, 10*time.Second)
	if err := c.Dial(ctx); err != nil {
		t.Fatal(err)
	}
	other := mustKey()
	bad := NewClient(s.Addr().String(), ClientConfig{Token: identity(t).TokenValue(), Key: other, ClientID: cid,
		Callback: func(context.Context, []byte) []byte { impostor.Add(1); return []byte("acked without flushing") }})
	defer bad.Close()
	if err := bad.Dial(ctx); !errors.Is(err, ErrAuth) {
		t.Fatalf("impostor's dial: %v, want ErrAuth", err)
	}
	if !strings.Contains(logs.String(), "refused client: id not its key's") {
		t.Fatalf("refusal not logged: %s", logs.String())
	}
	for i := range 3 {
		reply, err := s.Callback(ctx, cid, []byte("revoke"))
		if err != nil || string(reply) != "flushed" {
			t.Fatalf("callback %d: %q %v", i, reply, err)
		}
	}
	if real.Load() != 3 || impostor.Load() != 0 {
		t.Fatalf("callbacks: %d to the client, %d to the impostor", real.Load(), impostor.Load())
	}
	// A peer server's id is no easier to claim without the cluster's key.
	peerish := NewClient(s.Addr().String(), ClientConfig{Token: identity(t).TokenValue(), Key: other, ClientID: 0xFFFF_FFFF_FFFF_FF02})
	defer peerish.Close()
	if err := peerish.Dial(ctx); !errors.Is(err, ErrAuth) {
		t.Fatalf("a peer id without the cluster key: %v, want ErrAuth", err)
	}
	// The same key from another socket (a client that moved) is the same
	// client: its newest connection gets the callbacks.
	var moved atomic.Int32
	c2 := client(t, s.Addr().String(), ClientConfig{Callback: func(context.Context, []byte) []byte {
		moved.Add(1)
		return []byte("flushed")
	}})
	if err := c2.Dial(ctx); err != nil {
		t.Fatal(err)
	}
	if reply, err := s.Callback(ctx, cid, []byte("revoke")); err != nil || string(reply) != "flushed" || moved.Load() != 1 {
		t.Fatalf("callback after reconnecting: %q %v (%d)", reply, err, moved.Load())
	}
}

// TestPeerKey: a connection with the cluster's key may claim any id (a
// server calling another under its peer id), and says it is a peer.
func TestPeerKey(t *testing.T) {
	var peer atomic.Bool
	s := listen(t, ServerConfig{}, func(_ context.Context, r *Request) []byte {
		peer.Store(r.Conn.Peer())
		return nil
	})
	const id = ids.ClientID(0xFFFF_FFFF_FFFF_FF03)
	c := client(t, s.Addr().String(), ClientConfig{Key: identity(t).PeerKey(id)})
	ctx := ctxT(t, 10*time.Second)
	if _, err := c.Call(ctx, Header{Client: id, Session: 5, Seq: 1}, nil); err != nil {
		t.Fatal(err)
	}
	if !peer.Load() {
		t.Fatal("a connection with the cluster key is not a peer")
	}
	// its sessions get reply caches without being opened, a few per peer
	for sess := range 10 {
		if _, err := c.Call(ctx, Header{Client: id, Session: ids.SessionID(10 + sess), Seq: 1}, nil); err != nil {
			t.Fatal(err)
		}
	}
	if st := s.Stats(); st.Sessions != 2+maxPeerSessions {
		t.Fatalf("%d sessions with a cache, want the 2 opened and %d of the peer", st.Sessions, maxPeerSessions)
	}
}

// TestHelloBounded: a hello that announces more than a hello can be is
// refused on its head: the server neither waits for nor allocates it.
func TestHelloBounded(t *testing.T) {
	var logs logBuffer
	s := listen(t, ServerConfig{Logger: slog.New(slog.NewTextHandler(&logs, nil))}, echo)
	qc := rawDial(t, s.Addr().String(), testKey)
	st, err := qc.OpenStreamSync(ctxT(t, 10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Write(appendHead(nil, kindHello, Header{Client: cid}, 0, MaxBody)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-qc.Context().Done():
	case <-ctxT(t, 10*time.Second).Done():
		t.Fatal("connection not closed")
	}
	var ae *quic.ApplicationError
	if err := context.Cause(qc.Context()); !errors.As(err, &ae) || ae.ErrorCode != closeProto {
		t.Fatalf("closed with %v", err)
	}
	if l := logs.String(); !strings.Contains(l, "bad hello") || !strings.Contains(l, "too large") {
		t.Fatalf("not refused for its size: %s", l)
	}
}

// TestPendingBounded: connections that never send their hello are
// bounded; the oldest are closed to make room, and a client that says
// hello at once still gets in.
func TestPendingBounded(t *testing.T) {
	const max = 8
	s := listen(t, ServerConfig{MaxPending: max}, echo)
	var silent []*quic.Conn
	for range 3 * max {
		silent = append(silent, rawDial(t, s.Addr().String(), mustKey()))
		if p := s.Stats().Pending; p > max {
			t.Fatalf("%d connections pending, bound %d", p, max)
		}
	}
	c := client(t, s.Addr().String(), ClientConfig{})
	if _, err := c.Call(ctxT(t, 10*time.Second), Header{Client: cid, Session: 1, Seq: 1}, []byte("x")); err != nil {
		t.Fatal(err)
	}
	for i, qc := range silent[:max] {
		select {
		case <-qc.Context().Done():
		case <-ctxT(t, 10*time.Second).Done():
			t.Fatalf("silent connection %d still open", i)
		}
	}
}

// TestUnopenedSessions: requests under sessions the application never
// opened leave nothing behind (they run, for it to refuse), however many.
func TestUnopenedSessions(t *testing.T) {
	var runs atomic.Int32
	s := listen(t, ServerConfig{}, func(context.Context, *Request) []byte { runs.Add(1); return []byte("nack") })
	c := client(t, s.Addr().String(), ClientConfig{})
	ctx := ctxT(t, 20*time.Second)
	for i := range 500 {
		if _, err := c.Call(ctx, Header{Client: cid, Session: ids.SessionID(1000 + i), Seq: 1}, nil); err != nil {
			t.Fatal(err)
		}
	}
	if st := s.Stats(); st.Sessions != 2 || st.ReplyEntries != 0 || st.ReplyBytes != 0 {
		t.Fatalf("after 500 made-up sessions: %+v", st)
	}
	if runs.Load() != 500 {
		t.Fatalf("ran %d", runs.Load())
	}
}

// TestBodyBudget: streams that announce big bodies and send little hold
// no more than the budgets allow: the connection's, then the server's;
// one that cannot get room in time is refused (ErrBusy), a stalled body
// gives its room back, and proper calls go on.
func TestBodyBudget(t *testing.T) {
	s := listen(t, ServerConfig{MaxBuffered: 3 * MaxBody, MaxBufferedPerConn: 2 * MaxBody, BodyWait: 200 * time.Millisecond},
		func(_ context.Context, r *Request) []byte { return fmt.Appendf(nil, "%d", len(r.Body)) })
	announce := func(c *Client, seq uint64) *quic.Stream {
		st := rawStream(t, c)
		if _, err := st.Write(appendHead(nil, kindRequest, Header{Client: cid, Session: 1, Seq: seq}, 0, MaxBody)); err != nil {
			t.Fatal(err)
		}
		return st
	}
	c1 := client(t, s.Addr().String(), ClientConfig{})
	c2 := NewClient(s.Addr().String(), ClientConfig{Token: identity(t).TokenValue(), Key: testKey})
	defer c2.Close()
	var streams []*quic.Stream
	for i := range 4 {
		streams = append(streams, announce(c1, uint64(i+1)))
	}
	for i := range 4 {
		streams = append(streams, announce(c2, uint64(i+10)))
	}
	// Reservations are made in the streams' goroutines: wait for them to
	// settle (two per connection fit, and three over both).
	waitStats(t, s, func(st ServerStats) bool { return st.BufferedBytes == 3*MaxBody })
	// the ones that found no room are refused with ErrBusy
	var busy atomic.Int32
	var wg sync.WaitGroup
	for _, st := range streams {
		wg.Go(func() {
			st.SetReadDeadline(time.Now().Add(2 * time.Second))
			var head [frameHead]byte
			f, err := readFrame(st, &head)
			if err == nil && f.kind == kindError && errors.Is(remoteError(f.body), ErrBusy) {
				busy.Add(1)
			}
		})
	}
	wg.Wait()
	if n := busy.Load(); n != 5 {
		t.Fatalf("%d streams refused as busy, want 5", n)
	}
	if b := s.Stats().BufferedBytes; b > 3*MaxBody {
		t.Fatalf("%d bytes reserved, bound %d", b, 3*MaxBody)
	}
	// the senders give up: their room comes back
	for _, st := range streams {
		cancelStream(st)
	}
	waitStats(t, s, func(st ServerStats) bool { return st.BufferedBytes == 0 })
	reply, err := c1.Call(ctxT(t, 10*time.Second), Header{Client: cid, Session: 1, Seq: 100}, make([]byte, MaxBody))
	if err != nil || string(reply) != fmt.Sprint(MaxBody) {
		t.Fatalf("after the budget freed: %q %v", reply, err)
	}
}

// TestBusyRetried: a call the server refuses for want of room is sent
// again by the client until it fits, and runs once.
func TestBusyRetried(t *testing.T) {
	release := make(chan struct{})
	var runs atomic.Int32
	var logs logBuffer
	s := listen(t, ServerConfig{MaxBuffered: MaxBody, BodyWait: 50 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(&logs, nil))}, func(_ context.Context, r *Request) []byte {
		if runs.Add(1) == 1 {
			<-release // holds its body's room
		}
		return []byte("ok")
	})
	c := client(t, s.Addr().String(), ClientConfig{})
	ctx := ctxT(t, 20*time.Second)
	first := make(chan error, 1)
	go func() {
		_, err := c.Call(ctx, Header{Client: cid, Session: 1, Seq: 1}, make([]byte, MaxBody))
		first <- err
	}()
	waitStats(t, s, func(st ServerStats) bool { return st.BufferedBytes == MaxBody })
	second := make(chan error, 1)
	go func() {
		_, err := c.Call(ctx, Header{Client: cid, Session: 1, Seq: 2}, make([]byte, 64<<10))
		second <- err
	}()
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(logs.String(), "server busy"); {
		if time.Now().After(deadline) {
			t.Fatal("the second call was never refused as busy")
		}
		time.Sleep(10 * time.Millisecond)
	}
	// a small request does not wait behind bulk data
	if _, err := c.Call(ctx, Header{Client: cid, Session: 1, Seq: 3}, make([]byte, smallBody)); err != nil {
		t.Fatal(err)
	}
	close(release)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if err := <-second; err != nil {
		t.Fatalf("a call refused as busy, then room: %v", err)
	}
	if runs.Load() != 3 {
		t.Fatalf("ran %d times, want 3", runs.Load())
	}
}

// TestMaxConns: authenticated connections are bounded in all, and per
// client id (a newer one closes the oldest).
func TestMaxConns(t *testing.T) {
	s := listen(t, ServerConfig{MaxConns: 6}, echo)
	ctx := ctxT(t, 20*time.Second)
	var same []*Client
	for range maxConnsPerClient + 2 {
		c := client(t, s.Addr().String(), ClientConfig{})
		if err := c.Dial(ctx); err != nil {
			t.Fatal(err)
		}
		same = append(same, c)
	}
	if n := s.Stats().Conns; n != maxConnsPerClient {
		t.Fatalf("one client id holds %d connections, want %d", n, maxConnsPerClient)
	}
	for _, c := range same[:2] { // the oldest were closed
		c.mu.Lock()
		cur := c.cur
		c.mu.Unlock()
		select {
		case <-cur.qc.Context().Done():
		case <-ctx.Done():
			t.Fatal("an old connection of the client is still open")
		}
	}
	for range 2 {
		if err := client(t, s.Addr().String(), ClientConfig{Key: mustKey()}).Dial(ctx); err != nil {
			t.Fatal(err)
		}
	}
	extra := client(t, s.Addr().String(), ClientConfig{Key: mustKey()})
	if err := extra.Dial(ctx); !errors.Is(err, ErrUnreachable) || !strings.Contains(err.Error(), "busy") {
		t.Fatalf("dial beyond MaxConns: %v, want a busy server", err)
	}
	if n := s.Stats().Conns; n != 6 {
		t.Fatalf("%d connections, bound 6", n)
	}
}

// TestCallbackReplyBounded: a client's answer to a callback is read at a
// callback reply's size at most.
func TestCallbackReplyBounded(t *testing.T) {
	s := listen(t, ServerConfig{}, echo)
	c := client(t, s.Addr().String(), ClientConfig{Callback: func(context.Context, []byte) []byte {
		return make([]byte, maxCallbackReply+1)
	}})
	ctx := ctxT(t, 10*time.Second)
	if err := c.Dial(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Callback(ctx, cid, []byte("revoke")); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("oversized callback reply: %v", err)
	}
}

func waitStats(t *testing.T, s *Server, cond func(ServerStats) bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond(s.Stats()) {
		if time.Now().After(deadline) {
			t.Fatalf("stats: %+v", s.Stats())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// BenchmarkAnnouncedBodies prints the heap in use (after a collection;
// this process holds both ends) while 3 authenticated connections have
// 255 streams each (all the server allows, the hello's aside) announce a
// body of MaxBody and send 64 KiB of it:
// before bodies were reserved and read as they come, each stream had its
// 4 MiB allocated at once (3 connections: +575 MB).
//
//	go test ./transport -run '^$' -bench AnnouncedBodies -benchtime 1x -v
func BenchmarkAnnouncedBodies(b *testing.B) {
	const conns, streams = 3, maxStreams - 1
	heap := func() uint64 {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapInuse + ms.StackInuse
	}
	for range b.N {
		s := listen(b, ServerConfig{}, echo)
		base := heap()
		var all []*quic.Stream
		var wg sync.WaitGroup
		part := make([]byte, 64<<10) // one for all, so the heap is the server's
		for range conns {
			c := client(b, s.Addr().String(), ClientConfig{Key: mustKey()})
			for i := range streams {
				st := rawStream(b, c)
				all = append(all, st)
				wg.Go(func() {
					// (what the server does not read waits in QUIC's flow
					// control, up to the connection's window)
					st.SetWriteDeadline(time.Now().Add(3 * time.Second))
					h := appendHead(nil, kindRequest, Header{Client: c.ID(), Session: 1, Seq: uint64(i + 1)}, 0, MaxBody)
					if _, err := st.Write(h); err == nil {
						st.Write(part)
					}
				})
			}
		}
		time.Sleep(2 * time.Second) // the server reads what came
		during, st := heap(), s.Stats()
		for _, st := range all {
			cancelStream(st)
		}
		wg.Wait()
		b.Logf("%d connections x %d streams announcing %d bytes and sending 64 KiB: heap and stacks %.1f MiB before, %.1f during (%d bytes reserved, bound %d per connection, %d in all)",
			conns, streams, MaxBody, float64(base)/(1<<20), float64(during)/(1<<20), st.BufferedBytes, defaultMaxBufferedConn, defaultMaxBuffered)
	}
}
