package integration

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/leasefs/leasefs/internal/s3gw"
	"github.com/leasefs/leasefs/internal/testnet"
)

// TestS3Blocks: a server whose blocks are in an object store (versitygw on
// the loopback): two mounts with --blocks-remote write and read 20 MiB
// through the server's block endpoint, the blocks are objects under the
// prefix, and after rm the bucket holds none of them.
func TestS3Blocks(t *testing.T) {
	requireFUSE(t)
	g := s3gw.Start(t)
	// the server's credentials, as an operator gives them
	t.Setenv("AWS_ACCESS_KEY_ID", s3gw.AccessKey)
	t.Setenv("AWS_SECRET_ACCESS_KEY", s3gw.SecretKey)
	s := startServer(t, "--blocks", "s3://leasefs/c1", "--s3-endpoint", g.Endpoint,
		"--client-lease", "1s", "--delivery-timeout", "250ms", "--blocks-listen", testnet.TCPAddr(t))
	objects := func() []string {
		objs, err := g.Objects("leasefs")
		must(t, err)
		return objs
	}
	if objs := objects(); len(objs) != 0 {
		t.Fatalf("a fresh bucket holds %v", objs)
	}
	a, b := startMount(t, s, "--blocks-remote"), startMount(t, s, "--blocks-remote")
	for _, m := range []*mount{a, b} {
		if path := mountBlockPath(t, m); !strings.HasPrefix(path, "remote https://") {
			t.Fatalf("mount %s does not reach the blocks through the server: %q", m.dir, path)
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
	if n := tcpConns(t, blocksListen(s)); n == 0 {
		t.Fatalf("no connection to the server's block endpoint %s", blocksListen(s))
	}
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

// TestS3BlocksDirect: mounts of an s3-backed server hold no key and
// reach the object store directly with presigned URLs: their status says
// so, no connection is made to the server's block endpoint, and 20 MiB
// written on one mount reads back on the other, as does an overwrite in
// the other direction at once after close.
func TestS3BlocksDirect(t *testing.T) {
	requireFUSE(t)
	g := s3gw.Start(t)
	t.Setenv("AWS_ACCESS_KEY_ID", s3gw.AccessKey)
	t.Setenv("AWS_SECRET_ACCESS_KEY", s3gw.SecretKey)
	s := startServer(t, "--blocks", "s3://leasefs/direct", "--s3-endpoint", g.Endpoint,
		"--client-lease", "1s", "--delivery-timeout", "250ms", "--blocks-listen", testnet.TCPAddr(t))
	// the mounts hold no key: the servers' are in the test's environment only
	os.Unsetenv("AWS_ACCESS_KEY_ID")
	os.Unsetenv("AWS_SECRET_ACCESS_KEY")
	a, b := startMount(t, s), startMount(t, s)
	for _, m := range []*mount{a, b} {
		if path := mountBlockPath(t, m); path != "s3 direct "+g.Endpoint {
			t.Fatalf("mount %s reaches the blocks by %q, want s3 direct %s", m.dir, path, g.Endpoint)
		}
	}
	want := randomBytes(20 << 20)
	pa, pb := filepath.Join(a.dir, "big"), filepath.Join(b.dir, "big")
	start := time.Now()
	must(t, os.WriteFile(pa, want, 0o644))
	f, err := os.Open(pa)
	must(t, err)
	must(t, f.Sync())
	f.Close()
	wrote := time.Since(start)
	start = time.Now()
	wantSame(t, pb, want)
	t.Logf("20 MiB written in %v, read back on the other mount in %v", wrote.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
	// read-after-write the other way
	patch := randomBytes(1<<20 + 4567)
	f, err = os.OpenFile(pb, os.O_WRONLY, 0)
	must(t, err)
	_, err = f.WriteAt(patch, 5<<20+123)
	must(t, err)
	must(t, f.Close())
	copy(want[5<<20+123:], patch)
	wantSame(t, pa, want)
	objs, err := g.Objects("leasefs")
	must(t, err)
	if len(objs) < 5 {
		t.Fatalf("20 MiB written, the bucket holds %v", objs)
	}
	if n := tcpConns(t, blocksListen(s)); n != 0 {
		t.Fatalf("%d connections to the server's block endpoint %s", n, blocksListen(s))
	}
}

// tcpConns counts the TCP connections on the loopback whose one end is
// addr (HOST:PORT), listeners aside.
func tcpConns(t *testing.T, addr string) int {
	t.Helper()
	_, port, err := net.SplitHostPort(addr)
	must(t, err)
	p, err := strconv.Atoi(port)
	must(t, err)
	hexPort := fmt.Sprintf(":%04X", p)
	n := 0
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			// sl local_address rem_address st ...
			fs := strings.Fields(line)
			if len(fs) > 3 && fs[3] != "0A" && (strings.HasSuffix(fs[1], hexPort) || strings.HasSuffix(fs[2], hexPort)) {
				n++
			}
		}
	}
	return n
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
