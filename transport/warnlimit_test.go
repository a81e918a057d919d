package transport

import (
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/leasefs/leasefs/internal/ratelog"
)

// TestRefusalsLogBounded: a peer that keeps connecting with a wrong token,
// or keeps sending malformed frames, logs a burst of WARN lines, not one
// per attempt; every attempt is still refused.
func TestRefusalsLogBounded(t *testing.T) {
	var logs logBuffer
	s := listen(t, ServerConfig{Logger: slog.New(slog.NewTextHandler(&logs, nil))}, echo)
	tok := identity(t).TokenValue()
	tok.Secret[0] ^= 1
	const attempts = 3 * ratelog.DefaultBurst
	for i := range attempts {
		c := NewClient(s.Addr().String(), ClientConfig{Token: tok, Key: testKey, Hostname: "testhost"})
		if err := c.Dial(ctxT(t, 10*time.Second)); !errors.Is(err, ErrAuth) {
			t.Fatalf("attempt %d: %v, want ErrAuth", i, err)
		}
		c.Close()
	}
	// the burst, and perhaps one more if the attempts took a refill period
	if n := strings.Count(logs.String(), "refused client: bad token"); n < 1 || n > ratelog.DefaultBurst+1 {
		t.Fatalf("%d attempts with a bad token logged %d lines, want 1..%d", attempts, n, ratelog.DefaultBurst+1)
	}

	c := client(t, s.Addr().String(), ClientConfig{})
	for i := range attempts {
		st := rawStream(t, c)
		b := appendFrame(nil, frame{kind: kindRequest, Header: Header{Client: cid, Session: 1, Seq: uint64(i + 1)}})
		b[4] = 9 // unknown frame version
		if _, err := st.Write(b); err != nil {
			t.Fatal(err)
		}
		var head [frameHead]byte
		if f, err := readFrame(st, &head); err != nil || f.kind != kindError {
			t.Fatalf("bad frame %d: %v %v", i, f.kind, err)
		}
	}
	if n := strings.Count(logs.String(), "unsupported frame version"); n > ratelog.DefaultBurst+1 {
		t.Fatalf("%d bad frames logged %d lines, want at most %d", attempts, n, ratelog.DefaultBurst+1)
	}
	// the connection still serves proper calls
	if r, err := c.Call(ctxT(t, 10*time.Second), Header{Client: cid, Session: 1, Seq: 1000}, []byte("x")); err != nil || string(r) != "re:x" {
		t.Fatalf("after bad frames: %q %v", r, err)
	}
}
