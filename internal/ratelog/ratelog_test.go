package ratelog

import (
	"bytes"
	"log/slog"
	"net"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

// TestAllow: a peer gets its burst, then one line per period, and the line
// after dropped ones carries their count; another peer is not affected.
func TestAllow(t *testing.T) {
	l := NewLimiter(3, time.Second, 100)
	t0 := time.Unix(1000, 0)
	for i := range 3 {
		if ok, d := l.Allow("a", t0); !ok || d != 0 {
			t.Fatalf("line %d of the burst: %v %d", i, ok, d)
		}
	}
	for i := range 5 {
		if ok, _ := l.Allow("a", t0.Add(time.Duration(i)*100*time.Millisecond)); ok {
			t.Fatalf("line %d past the burst let through", i)
		}
	}
	if ok, d := l.Allow("b", t0); !ok || d != 0 {
		t.Fatalf("another peer: %v %d", ok, d)
	}
	if ok, d := l.Allow("a", t0.Add(time.Second)); !ok || d != 5 {
		t.Fatalf("after a period: %v, %d dropped, want true, 5", ok, d)
	}
	if ok, _ := l.Allow("a", t0.Add(time.Second)); ok {
		t.Fatal("a second line in the same period let through")
	}
	// a long quiet time gives back the burst, not more
	t1 := t0.Add(time.Hour)
	for i := range 3 {
		if ok, _ := l.Allow("a", t1); !ok {
			t.Fatalf("burst after quiet, line %d dropped", i)
		}
	}
	if ok, _ := l.Allow("a", t1); ok {
		t.Fatal("more than the burst after a quiet hour")
	}
}

// TestMaxPeers: the buckets are bounded; full ones are reused, and lines
// of peers that find no room are dropped and counted.
func TestMaxPeers(t *testing.T) {
	l := NewLimiter(1, time.Second, 2)
	t0 := time.Unix(1000, 0)
	l.Allow("a", t0)
	l.Allow("b", t0)
	if ok, _ := l.Allow("c", t0); ok || l.Overflow() != 1 {
		t.Fatalf("a third peer with two buckets in use: %v, overflow %d", ok, l.Overflow())
	}
	if len(l.peers) != 2 {
		t.Fatalf("%d buckets, want 2", len(l.peers))
	}
	// a and b are full again a period later: c gets a bucket
	if ok, _ := l.Allow("c", t0.Add(time.Second)); !ok {
		t.Fatal("a new peer refused once the others' buckets were full again")
	}
	if len(l.peers) > 2 {
		t.Fatalf("%d buckets, want at most 2", len(l.peers))
	}
}

// TestWarn: the slog side, on the real clock (in a bubble): the line
// after dropped ones says how many.
func TestWarn(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var buf bytes.Buffer
		log := slog.New(slog.NewTextHandler(&buf, nil))
		l := NewLimiter(2, time.Minute, 10)
		for range 10 {
			l.Warn(log, "10.0.0.1", "malformed request", "n", 1)
		}
		if n := strings.Count(buf.String(), "malformed request"); n != 2 {
			t.Fatalf("%d lines, want 2:\n%s", n, buf.String())
		}
		time.Sleep(time.Minute)
		l.Warn(log, "10.0.0.1", "malformed request")
		if !strings.Contains(buf.String(), "suppressed=8") {
			t.Fatalf("no count of the dropped lines:\n%s", buf.String())
		}
	})
}

func TestPeer(t *testing.T) {
	for addr, want := range map[string]string{
		(&net.UDPAddr{IP: net.IPv4(10, 1, 2, 3), Port: 5}).String(): "10.1.2.3",
		(&net.TCPAddr{IP: net.IPv6loopback, Port: 7}).String():      "::1",
		"@": "@", // a unix socket's peer
		"":  "",
	} {
		if got := Peer(addr); got != want {
			t.Errorf("Peer(%q) = %q, want %q", addr, got, want)
		}
	}
}
