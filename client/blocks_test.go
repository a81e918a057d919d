package client

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/leasefs/leasefs/blocks"
	"github.com/leasefs/leasefs/internal/clock"
	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/metaserver"
	"github.com/leasefs/leasefs/transport"
	"github.com/leasefs/leasefs/wire"
)

// startBlockServer runs a server in this process with a block store in
// its data directory, served on a free port.
func startBlockServer(t *testing.T) *metaserver.Server {
	t.Helper()
	return startServerWith(t, func(cfg *metaserver.Config) {
		cfg.Blocks = "file:" + filepath.Join(cfg.Dir, "blocks")
		cfg.BlocksListen = "127.0.0.1:0"
	})
}

func remoteBlocks(c *Config) { c.BlocksRemote = true }

// TestBlocksPath: a client on the server's host opens the block directory
// itself; told to treat the server as remote, it uses the endpoint; a
// server without a block store announces none.
func TestBlocksPath(t *testing.T) {
	s := startBlockServer(t)
	st, path := connectTo(t, s, func(*Config) {}).Blocks()
	if _, ok := st.(*blocks.FileStore); !ok || !strings.HasPrefix(path, "local ") {
		t.Errorf("same host: %T %q, want the local directory", st, path)
	}
	remote := connectTo(t, s, remoteBlocks)
	st, path = remote.Blocks()
	if _, ok := st.(*blocks.RemoteStore); !ok || path != "remote https://"+s.BlocksAddr().String() {
		t.Errorf("--blocks-remote: %T %q, want the endpoint %v", st, path, s.BlocksAddr())
	}
	if got := remote.Stats().Blocks; got != path {
		t.Errorf("status says %q, want %q", got, path)
	}
	if st, path := connectTo(t, startServer(t), func(*Config) {}).Blocks(); st != nil || path != "none" {
		t.Errorf("no block store: %T %q", st, path)
	}
}

// TestBlocksRemoteUnderLocks: through the endpoint, a block put under the
// file's X lock reads back under another client's S lock; a client
// without the lock in the right mode gets no capability.
func TestBlocksRemoteUnderLocks(t *testing.T) {
	s := startBlockServer(t)
	a, b, c := connectTo(t, s, remoteBlocks), connectTo(t, s, remoteBlocks), connectTo(t, s, remoteBlocks)
	within(t, 30*time.Second, "blocks under locks", func(ctx context.Context) error {
		f := createFile(ctx, t, a, ids.RootIno, "f")
		if _, err := a.Write(ctx, f.Ino, 0, []byte("x"), false, false); err != nil {
			return err
		}
		as, _ := a.Blocks()
		id := blocks.NewID(f.Ino)
		data := bytes.Repeat([]byte("block"), 1000)
		if err := as.Put(ctx, id, data); err != nil {
			return fmt.Errorf("put under X: %w", err)
		}
		// c never touched the file: no lock, no capability
		cs, _ := c.Blocks()
		if _, err := cs.ReadAt(ctx, id, make([]byte, 10), 0); !errors.Is(err, wire.Err(wire.CodeAccess)) {
			t.Errorf("read without a lock: %v, want refused", err)
		}
		// b's read takes S, revoking a's X
		if _, err := b.Read(ctx, f.Ino, 0, make([]byte, 1)); err != nil {
			return err
		}
		bs, _ := b.Blocks()
		got := make([]byte, len(data))
		if n, err := bs.ReadAt(ctx, id, got, 0); err != nil || n != len(data) || !bytes.Equal(got, data) {
			t.Errorf("read under S: %d, %v", n, err)
		}
		if err := bs.Put(ctx, blocks.NewID(f.Ino), data); !errors.Is(err, wire.Err(wire.CodeAccess)) {
			t.Errorf("put under S: %v, want refused", err)
		}
		if err := as.Put(ctx, blocks.NewID(f.Ino), data); !errors.Is(err, wire.Err(wire.CodeAccess)) {
			t.Errorf("put after X was revoked: %v, want refused", err)
		}
		return nil
	})
}

// TestBlocksEndpointChecksCapabilities: the server's endpoint refuses a
// request with no capability, one signed under another key, an expired
// one and one for another operation.
func TestBlocksEndpointChecksCapabilities(t *testing.T) {
	s := startBlockServer(t)
	tok, err := transport.ParseToken(s.Token())
	if err != nil {
		t.Fatal(err)
	}
	url := "https://" + s.BlocksAddr().String()
	key := tok.BlockKey()
	right, _ := blocks.NewSigner(key[:], nil)
	var other [32]byte
	rand.Read(other[:])
	forger, _ := blocks.NewSigner(other[:], nil)
	id := blocks.NewID(5)
	signed := func(sg *blocks.Signer, op blocks.Op, exp time.Duration) blocks.CapabilityFunc {
		return func(_ context.Context, _ blocks.Op, id blocks.ID) (string, error) {
			return sg.Sign(blocks.Capability{Op: op, ID: id, Expiry: time.Now().Add(exp)}), nil
		}
	}
	ctx := context.Background()
	put := func(caps blocks.CapabilityFunc) error {
		rs := blocks.NewRemoteStore(url, tok.CertHash, caps)
		defer rs.Close()
		return rs.Put(ctx, id, []byte("data"))
	}
	if err := put(signed(right, blocks.OpWrite, time.Minute)); err != nil {
		t.Fatalf("a valid capability: %v", err)
	}
	for name, caps := range map[string]blocks.CapabilityFunc{
		"forged":  signed(forger, blocks.OpWrite, time.Minute),
		"expired": signed(right, blocks.OpWrite, -time.Minute),
		"read":    signed(right, blocks.OpRead, time.Minute),
		"garbage": func(context.Context, blocks.Op, blocks.ID) (string, error) { return "x", nil },
	} {
		if err := put(caps); !errors.Is(err, blocks.ErrDenied) {
			t.Errorf("%s capability: %v, want denied", name, err)
		}
	}
	// none at all, and a client that does not pin the certificate
	req, _ := http.NewRequest(http.MethodGet, url+"/blocks/"+id.String(), nil)
	tr := &http.Transport{TLSClientConfig: transport.PinnedTLS(tok.CertHash)}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("no capability: %s, want 403", resp.Status)
	}
}

// TestBlocksShortLease: capabilities under a client lease shorter than a
// second (the cluster tests' τ) are valid when issued.
func TestBlocksShortLease(t *testing.T) {
	cfg := metaserver.DefaultConfig()
	cfg.Dir = t.TempDir()
	cfg.Listen = "127.0.0.1:0"
	cfg.ClientLease = 300 * time.Millisecond
	cfg.DeliveryTimeout = 100 * time.Millisecond
	cfg.Blocks = "file:" + filepath.Join(cfg.Dir, "blocks")
	cfg.BlocksListen = "127.0.0.1:0"
	cfg.Logger = slog.New(slog.DiscardHandler)
	s, err := metaserver.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	a := connectTo(t, s, remoteBlocks)
	within(t, 30*time.Second, "puts under a short lease", func(ctx context.Context) error {
		f := createFile(ctx, t, a, ids.RootIno, "f")
		if _, err := a.Write(ctx, f.Ino, 0, []byte("x"), false, false); err != nil {
			return err
		}
		st, _ := a.Blocks()
		for i := range 8 {
			if err := st.Put(ctx, blocks.NewID(f.Ino), []byte("data")); err != nil {
				return fmt.Errorf("put %d: %w", i, err)
			}
			time.Sleep(130 * time.Millisecond)
		}
		return nil
	})
}

// TestCapCache: a capability is served until its time, then asked again;
// the cache stays bounded.
func TestCapCache(t *testing.T) {
	var cc capCache
	id := blocks.NewID(3)
	rd := capKey{blocks.OpRead, id, false}
	cc.put(rd, "cap", 0, 100)
	if got, ok := cc.get(rd, 99); !ok || got != "cap" {
		t.Fatalf("before its time: %q %v", got, ok)
	}
	if _, ok := cc.get(capKey{blocks.OpWrite, id, false}, 50); ok {
		t.Fatal("a read capability served for a write")
	}
	if _, ok := cc.get(capKey{blocks.OpRead, id, true}, 50); ok {
		t.Fatal("a capability served for a URL")
	}
	if _, ok := cc.get(rd, 100); ok {
		t.Fatal("served at its time")
	}
	cc.put(rd, "cap", 0, 100)
	cc.forget(rd)
	if _, ok := cc.get(rd, 50); ok {
		t.Fatal("served after forget")
	}
	cc.put(rd, "expired", 100, 90)
	if _, ok := cc.get(rd, 95); ok {
		t.Fatal("kept one that was out of time when put")
	}
	for i := range capCacheMax + 10 {
		cc.put(capKey{blocks.OpRead, blocks.NewID(ids.Ino(i)), false}, "c", clock.Time(i), clock.Time(i+5))
	}
	if len(cc.m) > capCacheMax {
		t.Fatalf("%d capabilities kept", len(cc.m))
	}
}
