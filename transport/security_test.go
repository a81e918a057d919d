package transport

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasefs/leasefs/internal/ids"
)

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

}
