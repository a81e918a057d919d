package blocks

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/leasefs/leasefs/internal/s3gw"
)

const testBucket = "leasefs-blocks"

func s3Config(g *s3gw.Gateway, prefix string) S3Config {
	return S3Config{Endpoint: g.Endpoint, Bucket: testBucket, Prefix: prefix,
		AccessKey: s3gw.AccessKey, SecretKey: s3gw.SecretKey}
}

// openS3 starts a gateway and opens a store on it.
func openS3(t testing.TB, prefix string) (*S3Store, *s3gw.Gateway) {
	t.Helper()
	g := s3gw.Start(t)
	s, err := OpenS3Store(context.Background(), s3Config(g, prefix))
	if err != nil {
		t.Fatal(err)
	}
	return s, g
}

func TestS3StoreContract(t *testing.T) {
	s, _ := openS3(t, "")
	testStoreContract(t, s)
}

// TestS3StorePrefix: blocks are the objects PREFIX<ino>/<unique>, and
// stores on other prefixes of the bucket do not see them.
func TestS3StorePrefix(t *testing.T) {
	ctx := context.Background()
	a, g := openS3(t, "cluster-a")
	b, err := OpenS3Store(ctx, s3Config(g, "/cluster-b/"))
	if err != nil {
		t.Fatal(err)
	}
	idA, idB := NewID(3), NewID(3)
	if err := a.Put(ctx, idA, []byte("in a")); err != nil {
		t.Fatal(err)
	}
	if err := b.Put(ctx, idB, []byte("in b")); err != nil {
		t.Fatal(err)
	}
	objs, err := g.Objects(testBucket)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"cluster-a/" + idA.String(), "cluster-b/" + idB.String()}
	if !slices.Equal(objs, want) {
		t.Fatalf("bucket holds %v, want %v (no probe objects either)", objs, want)
	}
	if got := listAll(t, a, AllInodes); !slices.Equal(got, []string{idA.String()}) {
		t.Fatalf("store a lists %v", got)
	}
	if _, err := b.ReadAt(ctx, idA, make([]byte, 4), 0); !errors.Is(err, ErrNotFound) {
		t.Fatalf("store b reads a's block: %v", err)
	}
	if a.String() != "s3://"+testBucket+"/cluster-a/" {
		t.Fatalf("String() = %q", a.String())
	}
}

// TestS3StoreBucketCreated: a missing bucket is created at open, and an
// existing one is used.
func TestS3StoreBucketCreated(t *testing.T) {
	g := s3gw.Start(t)
	dir := filepath.Join(g.Dir, testBucket)
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("bucket before the open: %v", err)
	}
	for range 2 {
		s, err := OpenS3Store(context.Background(), s3Config(g, "p"))
		if err != nil {
			t.Fatal(err)
		}
		if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
			t.Fatalf("bucket after the open: %v", err)
		}
		if u, err := s.Usage(context.Background()); err != nil || u != (Usage{Free: -1}) {
			t.Fatalf("Usage = %+v, %v", u, err)
		}
	}
}

// checkOpenError checks that err is one line naming the endpoint and the
// bucket, and took less than limit.
func checkOpenError(t *testing.T, err error, took, limit time.Duration, endpoint string, wants ...string) {
	t.Helper()
	if err == nil {
		t.Fatal("open succeeded")
	}
	msg := err.Error()
	t.Logf("after %v: %s", took.Round(time.Millisecond), msg)
	if took > limit {
		t.Errorf("took %v, want under %v", took, limit)
	}
	if strings.Contains(msg, "\n") {
		t.Errorf("error spans lines: %q", msg)
	}
	for _, w := range append([]string{endpoint, testBucket}, wants...) {
		if !strings.Contains(msg, w) {
			t.Errorf("error does not say %q: %s", w, msg)
		}
	}
}

func TestS3StoreWrongCredentials(t *testing.T) {
	g := s3gw.Start(t)
	cfg := s3Config(g, "")
	cfg.SecretKey = "not the secret"
	start := time.Now()
	_, err := OpenS3Store(context.Background(), cfg)
	checkOpenError(t, err, time.Since(start), 5*time.Second, g.Endpoint, "Access Denied", "check the access key")
	cfg = s3Config(g, "")
	cfg.AccessKey = "nobody"
	start = time.Now()
	_, err = OpenS3Store(context.Background(), cfg)
	checkOpenError(t, err, time.Since(start), 5*time.Second, g.Endpoint, "check the access key")
}

// TestS3StoreEndpointDown: nothing listening, a gateway stopped, and a
// listener that never answers each fail the open within its timeout.
func TestS3StoreEndpointDown(t *testing.T) {
	t.Run("refused", func(t *testing.T) {
		t.Parallel()
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		ln.Close()
		cfg := S3Config{Endpoint: addr, Bucket: testBucket, AccessKey: "k", SecretKey: "s"}
		start := time.Now()
		_, err = OpenS3Store(context.Background(), cfg)
		checkOpenError(t, err, time.Since(start), 5*time.Second, addr, "connection refused")
	})
	t.Run("silent", func(t *testing.T) {
		t.Parallel()
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		go func() {
			// accept and hold the connections, never answer
			var held []net.Conn
			defer func() {
				for _, c := range held {
					c.Close()
				}
			}()
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				held = append(held, c)
			}
		}()
		url := "http://" + ln.Addr().String()
		cfg := S3Config{Endpoint: url, Bucket: testBucket, AccessKey: "k", SecretKey: "s"}
		start := time.Now()
		_, err = OpenS3Store(context.Background(), cfg)
		checkOpenError(t, err, time.Since(start), s3OpenTimeout+3*time.Second, url, "no answer within")
	})
}

// TestS3StoreCredentialSources: without keys in the config they come
// from the AWS environment variables, else the shared credentials file;
// with neither, the open says so.
func TestS3StoreCredentialSources(t *testing.T) {
	g := s3gw.Start(t)
	home := t.TempDir()
	t.Setenv("HOME", home)
	for _, v := range []string{"AWS_ACCESS_KEY_ID", "AWS_ACCESS_KEY", "AWS_SECRET_ACCESS_KEY", "AWS_SECRET_KEY",
		"AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE"} {
		t.Setenv(v, "")
		os.Unsetenv(v)
	}
	cfg := s3Config(g, "")
	cfg.AccessKey, cfg.SecretKey = "", ""
	open := func() error {
		_, err := OpenS3Store(context.Background(), cfg)
		return err
	}
	if err := open(); err == nil || !strings.Contains(err.Error(), "credentials") {
		t.Fatalf("open without credentials: %v", err)
	}
	creds := fmt.Sprintf("[default]\naws_access_key_id = %s\naws_secret_access_key = %s\n", s3gw.AccessKey, s3gw.SecretKey)
	if err := os.MkdirAll(filepath.Join(home, ".aws"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(home, ".aws", "credentials"), []byte(creds), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := open(); err != nil {
		t.Fatalf("open with ~/.aws/credentials: %v", err)
	}
	os.Remove(filepath.Join(home, ".aws", "credentials"))
	t.Setenv("AWS_ACCESS_KEY_ID", s3gw.AccessKey)
	t.Setenv("AWS_SECRET_ACCESS_KEY", s3gw.SecretKey)
	if err := open(); err != nil {
		t.Fatalf("open with the environment's credentials: %v", err)
	}
}

func TestParseS3Spec(t *testing.T) {
	for spec, want := range map[string][2]string{
		"s3://bucket":           {"bucket", ""},
		"s3://bucket/":          {"bucket", ""},
		"s3://bucket/pre":       {"bucket", "pre/"},
		"s3://bucket/a/b/":      {"bucket", "a/b/"},
		"s3://my.bucket-1/x//y": {"my.bucket-1", "x//y/"},
	} {
		b, p, err := ParseS3Spec(spec)
		if err != nil || b != want[0] || p != want[1] {
			t.Errorf("ParseS3Spec(%q) = %q, %q, %v; want %q, %q", spec, b, p, err, want[0], want[1])
		}
	}
	for _, bad := range []string{"", "bucket", "s3:/bucket", "file:/x", "s3://", "s3:///pre", "s3://Bucket_Caps", "s3://b"} {
		if _, _, err := ParseS3Spec(bad); err == nil {
			t.Errorf("ParseS3Spec(%q) accepted", bad)
		}
	}
}

// TestS3StoreErrorKinds: the object store's answers become the errors
// the Store contract names.
func TestS3StoreErrorKinds(t *testing.T) {
	s := &S3Store{where: "s3 endpoint x bucket y"}
	id := NewID(1)
	for _, c := range []struct {
		resp minio.ErrorResponse
		want error
	}{
		{minio.ErrorResponse{Code: "NoSuchKey", StatusCode: 404}, ErrNotFound},
		{minio.ErrorResponse{Code: "XMinioStorageFull", StatusCode: 507}, syscall.ENOSPC},
		{minio.ErrorResponse{Code: "InsufficientStorage", StatusCode: 507}, syscall.ENOSPC},
		{minio.ErrorResponse{Code: "SomethingElse", StatusCode: 507}, syscall.ENOSPC},
		{minio.ErrorResponse{Code: "QuotaExceeded", StatusCode: 403}, syscall.ENOSPC},
		{minio.ErrorResponse{Code: "EntityTooLarge", StatusCode: 400}, ErrTooBig},
		{minio.ErrorResponse{Code: "NoSuchBucket", StatusCode: 404}, nil},
		{minio.ErrorResponse{Code: "AccessDenied", StatusCode: 403}, nil},
	} {
		err := s.error("put", id, c.resp)
		for _, kind := range []error{ErrNotFound, syscall.ENOSPC, ErrTooBig} {
			if errors.Is(err, kind) != (kind == c.want) {
				t.Errorf("%s (%d): %v; want %v", c.resp.Code, c.resp.StatusCode, err, c.want)
			}
		}
		if !strings.Contains(err.Error(), id.String()) || !strings.Contains(err.Error(), s.where) {
			t.Errorf("%s: %v does not name the block and the store", c.resp.Code, err)
		}
	}
}

// TestS3StoreFull: a gateway on a full file system answers Puts that do
// not fit with ENOSPC, and works again once blocks are deleted.
func TestS3StoreFull(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting a tmpfs needs root")
	}
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=6m,mode=0700"); err != nil {
		t.Skipf("mount tmpfs: %v", err)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(dir, 0); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
	g := s3gw.StartDir(t, dir)
	t.Cleanup(g.Stop) // before the unmount
	ctx := context.Background()
	s, err := OpenS3Store(ctx, s3Config(g, ""))
	if err != nil {
		t.Fatal(err)
	}
	var put []ID
	for i := range 4 {
		id := NewID(1)
		err := s.Put(ctx, id, randBytes(MaxBlock/2, uint64(i)))
		if err == nil {
			put = append(put, id)
			continue
		}
		if !errors.Is(err, syscall.ENOSPC) {
			t.Fatalf("Put %d on a full store: %v, want ENOSPC", i, err)
		}
		break
	}
	if len(put) == 4 {
		t.Fatal("8 MiB went into a 6 MiB file system")
	}
	if got := listAll(t, s, AllInodes); len(got) != len(put) {
		t.Fatalf("store lists %d blocks, %d were put", len(got), len(put))
	}
	for _, id := range put {
		if err := s.Delete(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Put(ctx, NewID(1), randBytes(MaxBlock/2, 9)); err != nil {
		t.Fatalf("Put after deletes: %v", err)
	}
}

// TestS3StoreRangeIgnored: a server that answers a ranged GET with the
// whole object (200, no Content-Range), as HTTP allows, still gives
// ReadAt the right bytes. versitygw honours ranges, so this one is a
// stand-in that serves one object for any GET.
func TestS3StoreRangeIgnored(t *testing.T) {
	data := randBytes(100_000, 3)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(len(data)))
		w.Header().Set("Last-Modified", time.Now().UTC().Format(http.TimeFormat))
		w.Header().Set("ETag", `"x"`)
		w.Write(data)
	}))
	defer srv.Close()
	c, err := minio.New(strings.TrimPrefix(srv.URL, "http://"), &minio.Options{
		Creds: credentials.NewStaticV4("k", "s", ""), Region: s3DefaultRegion, BucketLookup: minio.BucketLookupPath})
	if err != nil {
		t.Fatal(err)
	}
	s := &S3Store{client: c, bucket: testBucket}
	ctx := context.Background()
	id := NewID(2)
	p := make([]byte, 1000)
	if n, err := s.ReadAt(ctx, id, p, 5000); n != 1000 || err != nil || !bytes.Equal(p, data[5000:6000]) {
		t.Fatalf("ReadAt(5000): %d, %v", n, err)
	}
	if n, err := s.ReadAt(ctx, id, p, int64(len(data))-10); n != 10 || err != io.EOF || !bytes.Equal(p[:10], data[len(data)-10:]) {
		t.Fatalf("ReadAt at the end: %d, %v", n, err)
	}
	if n, err := s.ReadAt(ctx, id, p, int64(len(data))+10); n != 0 || err != io.EOF {
		t.Fatalf("ReadAt past the end: %d, %v", n, err)
	}
}
