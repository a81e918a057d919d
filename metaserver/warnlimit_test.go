package metaserver

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/leasefs/leasefs/internal/ratelog"
	"github.com/leasefs/leasefs/transport"
	"github.com/leasefs/leasefs/wire"
)

// TestMalformedLogBounded: a client that sends malformed requests in a
// loop gets CodeBadMessage for each, and the server logs a burst of WARN
// lines for it, not one per request.
func TestMalformedLogBounded(t *testing.T) {
	logs := &syncBuf{}
	cfg := DefaultConfig()
	cfg.Dir = t.TempDir()
	cfg.Listen = "127.0.0.1:0"
	cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
	s, err := Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	tok, _ := transport.ParseToken(s.Token())
	tc := transport.NewClient(s.Addr().String(), transport.ClientConfig{Token: tok})
	defer tc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	const n = 3 * ratelog.DefaultBurst
	for i := range n {
		raw, err := tc.Call(ctx, transport.Header{Client: tc.ID(), Seq: uint64(i + 1)}, []byte{wire.Version, 2, 3})
		if err != nil {
			t.Fatal(err)
		}
		if rep, err := wire.ParseReply(raw); err != nil || rep.Code != wire.CodeBadMessage {
			t.Fatalf("garbage %d: %v %v", i, rep, err)
		}
	}
	if got := strings.Count(logs.String(), "malformed request"); got < 1 || got > ratelog.DefaultBurst+1 {
		t.Fatalf("%d malformed requests logged %d lines, want 1..%d", n, got, ratelog.DefaultBurst+1)
	}
}
