package integration

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/leasefs/leasefs/internal/s3gw"
)

// TestS3Blocks: a server whose blocks are in an object store (versitygw on
// the loopback): two mounts write and read 20 MiB through the server's
// block endpoint, the blocks are objects under the prefix, and after rm
// the bucket holds none of them.
func TestS3Blocks(t *testing.T) {
	requireFUSE(t)
	g := s3gw.Start(t)
	// the server's credentials, as an operator gives them
	t.Setenv("AWS_ACCESS_KEY_ID", s3gw.AccessKey)
	t.Setenv("AWS_SECRET_ACCESS_KEY", s3gw.SecretKey)
	s := startServer(t, "--blocks", "s3://leasefs/c1", "--s3-endpoint", g.Endpoint,
		"--client-lease", "1s", "--delivery-timeout", "250ms")
	objects := func() []string {
		objs, err := g.Objects("leasefs")
		must(t, err)
		return objs
	}
	if objs := objects(); len(objs) != 0 {
		t.Fatalf("a fresh bucket holds %v", objs)
	}
	a, b := startMount(t, s), startMount(t, s)
	for _, m := range []*mount{a, b} {
		if out := m.output(); !strings.Contains(out, "remote https://") {
			t.Fatalf("mount %s does not reach the blocks through the server:\n%s", m.dir, out)
		}
	}
	want := randomBytes(20 << 20)
	path := filepath.Join(a.dir, "big")
	must(t, os.WriteFile(path, want, 0o644))
	f, err := os.Open(path)
	must(t, err)
	must(t, f.Sync())
	f.Close()
	wantSame(t, filepath.Join(b.dir, "big"), want)
	objs := objects()
	if len(objs) < 5 {
		t.Fatalf("20 MiB written, the bucket holds %v", objs)
	}
	for _, o := range objs {
		if !strings.HasPrefix(o, "c1/") {
			t.Fatalf("object %s outside the prefix c1/", o)
		}
	}
	must(t, os.Remove(filepath.Join(b.dir, "big")))
	start := time.Now()
	waitFor(t, 60*time.Second, "the file's objects deleted", func() bool { return len(objects()) == 0 })
	t.Logf("%d objects, all gone %v after rm", len(objs), time.Since(start).Round(time.Second))
}

// TestS3BlocksStartFails: a server whose object store refuses its key
// exits at start with one line naming the endpoint and bucket.
func TestS3BlocksStartFails(t *testing.T) {
	g := s3gw.Start(t)
	t.Setenv("AWS_ACCESS_KEY_ID", s3gw.AccessKey)
	t.Setenv("AWS_SECRET_ACCESS_KEY", "wrong")
	out, err := runErr("", binary, "serve", "--data", t.TempDir(), "--listen", "127.0.0.1:0",
		"--blocks", "s3://leasefs", "--s3-endpoint", g.Endpoint)
	if err == nil {
		t.Fatalf("server started with a wrong key:\n%s", out)
	}
	if !strings.Contains(out, g.Endpoint) || !strings.Contains(out, "bucket leasefs") || !strings.Contains(out, "check the access key") {
		t.Fatalf("start error does not say what failed:\n%s", out)
	}
}
