package metaserver

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/leasefs/leasefs/internal/s3gw"
)

// s3Env gives the test the gateway's credentials the way an operator
// gives a server its own: in the AWS environment variables.
func s3Env(t *testing.T) {
	t.Setenv("AWS_ACCESS_KEY_ID", s3gw.AccessKey)
	t.Setenv("AWS_SECRET_ACCESS_KEY", s3gw.SecretKey)
}

// TestS3BlockStore: a server whose blocks are in an object store
// announces it as "s3"; mounts then put and read blocks through the
// server's endpoint, and the blocks are objects under the prefix.
func TestS3BlockStore(t *testing.T) {
	g := s3gw.Start(t)
	s3Env(t)
	s := startTestServerWith(t, func(cfg *Config) {
		cfg.Blocks = "s3://leasefs/cluster-1"
		cfg.S3Endpoint = g.Endpoint
		cfg.BlocksListen = "127.0.0.1:0"
	})
	if k := s.blocks.wire.Kind; k != "s3" || s.blocks.wire.Dir != "s3://leasefs/cluster-1/" {
		t.Fatalf("announced %+v", s.blocks.wire)
	}
	ctx := testContext(t)
	a, b := connect(t, s), connect(t, s)
	if _, path := a.Blocks(); !strings.HasPrefix(path, "remote https://") {
		t.Fatalf("mount's path to the blocks: %q", path)
	}
	f := mustCreate(ctx, t, a, "f")
	want := randData(10<<20+12345, 4)
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
	objs, err := g.Objects("leasefs")
	if err != nil {
		t.Fatal(err)
	}
	if nb := storeBlocks(t, s, f.Ino); nb < 3 || len(objs) != nb {
		t.Fatalf("%d blocks of the file, %d objects in the bucket: %v", nb, len(objs), objs)
	}
	for _, o := range objs {
		if !strings.HasPrefix(o, "cluster-1/") {
			t.Fatalf("object %s outside the prefix", o)
		}
	}
	if u := s.blocks.usage(s.log); u.Free != -1 || u.Bytes < int64(len(want)) {
		t.Fatalf("usage %+v", u)
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
