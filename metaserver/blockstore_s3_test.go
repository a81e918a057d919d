package metaserver

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/leasefs/leasefs/blocks"
	"github.com/leasefs/leasefs/client"
	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/internal/s3gw"
	"github.com/leasefs/leasefs/wire"
)

// s3Env gives the test the gateway's credentials the way an operator
// gives a server its own: in the AWS environment variables.
func s3Env(t *testing.T) {
	t.Setenv("AWS_ACCESS_KEY_ID", s3gw.AccessKey)
	t.Setenv("AWS_SECRET_ACCESS_KEY", s3gw.SecretKey)
}

// TestS3BlockStore: a server whose blocks are in an object store
// announces it as "s3" with its endpoint; mounts put and read blocks
// there directly with presigned URLs (the server's endpoint serves
// nothing), or through that endpoint with --blocks-remote; either way
// the blocks are objects under the prefix.
func TestS3BlockStore(t *testing.T) {
	g := s3gw.Start(t)
	s3Env(t)
	s := startTestServerWith(t, func(cfg *Config) {
		cfg.Blocks = "s3://leasefs/cluster-1"
		cfg.S3Endpoint = g.Endpoint
		cfg.BlocksListen = "127.0.0.1:0"
	})
	if w := s.blocks.wire; w.Kind != "s3" || w.Dir != "s3://leasefs/cluster-1/" || w.Endpoint != g.Endpoint {
		t.Fatalf("announced %+v", s.blocks.wire)
	}
	var total int
	for i, remote := range []bool{false, true} {
		set := func(cfg *client.Config) { cfg.BlocksRemote = remote }
		a, b := connectWith(t, s, set), connectWith(t, s, set)
		want := "s3 direct " + g.Endpoint
		if remote {
			want = "remote https://"
		}
		if _, path := a.Blocks(); !strings.HasPrefix(path, want) {
			t.Fatalf("mount's path to the blocks: %q, want %q", path, want)
		}
		ino, size := writeReadBack(t, a, b, fmt.Sprintf("f%d", i), 10<<20+12345)
		total += size
		if served := s.blocks.served.Load(); served == 0 == remote {
			t.Fatalf("remote %v: the server's endpoint served %d requests", remote, served)
		}
		objs, err := g.Objects("leasefs")
		if err != nil {
			t.Fatal(err)
		}
		if nb := storeBlocks(t, s, ino); nb < 3 || len(objs) < nb {
			t.Fatalf("%d blocks of the file, %d objects in the bucket: %v", nb, len(objs), objs)
		}
		for _, o := range objs {
			if !strings.HasPrefix(o, "cluster-1/") {
				t.Fatalf("object %s outside the prefix", o)
			}
		}
	}
	if u := s.blocks.usage(s.log); u.Free != -1 || u.Bytes < int64(total) {
		t.Fatalf("usage %+v", u)
	}
}

// writeReadBack writes size bytes to a new file name with a, flushes,
// and reads them back with b.
func writeReadBack(t *testing.T, a, b *client.Client, name string, size int) (ids.Ino, int) {
	t.Helper()
	ctx := testContext(t)
	f := mustCreate(ctx, t, a, name)
	want := randData(size, 4)
	if _, err := a.Write(ctx, f.Ino, 0, want, false, false); err != nil {
		t.Fatal(err)
	}
	if err := a.Flush(ctx, f.Ino); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(want)+10)
	n := 0
	for n < len(want) {
		m, err := b.Read(ctx, f.Ino, uint64(n), got[n:])
		if err != nil || m == 0 {
			t.Fatalf("read at %d: %d, %v", n, m, err)
		}
		n += m
	}
	if !bytes.Equal(got[:n], want) {
		t.Fatal("read back differs")
	}
	return f.Ino, len(want)
}

// TestS3URLsEndWithLease: the URLs an owner presigns are only for a
// client holding the file's lock in the operation's mode, and stop
// working once the lease they were issued under has run out: a mount whose
// lease lapsed cannot use its old URLs.
func TestS3URLsEndWithLease(t *testing.T) {
	g := s3gw.Start(t)
	s3Env(t)
	const tau = time.Second
	s := startTestServerWith(t, func(cfg *Config) {
		cfg.Blocks = "s3://leasefs"
		cfg.S3Endpoint = g.Endpoint
		cfg.BlocksListen = "127.0.0.1:0"
		cfg.ClientLease, cfg.DeliveryTimeout = tau, tau/4
	})
	a, b := connect(t, s), connect(t, s)
	ino, _ := writeReadBack(t, a, b, "f", 5<<20)
	var id blocks.ID
	if err := s.blocks.store.List(context.Background(), ino, func(bid blocks.ID, _ int64, _ time.Time) error {
		id = bid
		return nil
	}); err != nil || id.Ino != ino {
		t.Fatalf("no block of %v: %v", ino, err)
	}
	ctx := testContext(t)
	ask := func(c *client.Client, flags uint32) (string, error) {
		rep, err := c.Call(ctx, &wire.Request{Op: wire.OpBlockAccess, Ino: ino, Flags: wire.BlockURL | flags,
			Data: wire.AppendUniques(nil, [][16]byte{id.Unique})})
		if err != nil {
			return "", err
		}
		return rep.Names[0], nil
	}
	// b read the file: it holds an S lock, which allows reads only
	if _, err := ask(b, wire.BlockWrite); wire.CodeOf(err) != wire.CodeAccess {
		t.Fatalf("a write URL under an S lock: %v", err)
	}
	issued := time.Now()
	u, err := ask(b, 0)
	if err != nil {
		t.Fatal(err)
	}
	if end, ok := blocks.URLExpiry(u); !ok || end.After(issued.Add(tau+time.Second/10)) {
		t.Fatalf("URL ends at %v, issued at %v under a lease of %v", end, issued, tau)
	}
	get := func() int {
		resp, err := http.Get(u)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := get(); code != http.StatusOK && time.Since(issued) < tau/2 {
		t.Fatalf("GET with a fresh URL: %d", code)
	}
	// the lease the URL was issued under has run out, whether or not b
	// renewed it since: the URL is refused
	time.Sleep(time.Until(issued.Add(tau + 50*time.Millisecond)))
	if code := get(); code != http.StatusForbidden {
		t.Fatalf("GET after the lease it was issued under: %d, want 403", code)
	}
	// a server whose blocks are a directory presigns nothing
	fs := startBlockTestServer(t)
	c := connect(t, fs)
	if _, err := c.Call(ctx, &wire.Request{Op: wire.OpBlockAccess, Ino: ino, Flags: wire.BlockURL,
		Data: wire.AppendUniques(nil, [][16]byte{id.Unique})}); wire.CodeOf(err) != wire.CodeNotSupported {
		t.Fatalf("URL from a file store: %v", err)
	}
}

// TestS3BlockStoreConfig: an s3 store without an endpoint is refused, and
// one that does not answer fails the start with one line naming it.
func TestS3BlockStoreConfig(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Dir = t.TempDir()
	cfg.Listen = "127.0.0.1:0"
	cfg.Logger = slog.New(slog.DiscardHandler)
	cfg.Blocks = "s3://leasefs"
	if _, err := Start(cfg); err == nil || !strings.Contains(err.Error(), "endpoint") {
		t.Fatalf("s3 without an endpoint: %v", err)
	}
	cfg.Blocks = "s3://Not_A_Bucket"
	cfg.S3Endpoint = "127.0.0.1:1"
	if _, err := Start(cfg); err == nil || !strings.Contains(err.Error(), "bucket") {
		t.Fatalf("a bad bucket name: %v", err)
	}
	g := s3gw.Start(t)
	g.Stop()
	s3Env(t)
	cfg.Blocks, cfg.S3Endpoint = "s3://leasefs", g.Endpoint
	start := time.Now()
	_, err := Start(cfg)
	if err == nil || !strings.Contains(err.Error(), g.Endpoint) || strings.Contains(err.Error(), "\n") {
		t.Fatalf("a stopped gateway: %v", err)
	}
	if d := time.Since(start); d > 16*time.Second {
		t.Fatalf("start failed after %v", d)
	}
	t.Logf("start against a stopped gateway: %v", err)
}
