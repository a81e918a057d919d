package blocks

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
)

// presigner hands out URLs presigned by s valid for a minute, as an
// owner would.
func presigner(s *S3Store) CapabilityFunc {
	return func(ctx context.Context, op Op, id ID) (string, error) {
		return s.Presign(ctx, op, id, time.Now().Add(time.Minute))
	}
}

// TestURLStoreContract: a store reached with presigned URLs only keeps
// the Store contract for reads and writes against a real gateway, and
// its blocks are the S3Store's.
func TestURLStoreContract(t *testing.T) {
	s3, _ := openS3(t, "p")
	us := NewURLStore(presigner(s3), nil)
	t.Cleanup(us.Close)
	testStoreContract(t, us)
	ctx := context.Background()
	id := NewID(3)
	data := randBytes(100_000, 7)
	if err := us.Put(ctx, id, data); err != nil {
		t.Fatal(err)
	}
	p := make([]byte, len(data))
	if n, err := s3.ReadAt(ctx, id, p, 0); n != len(data) || err != nil || !bytes.Equal(p, data) {
		t.Fatalf("the S3Store reads %d bytes, %v", n, err)
	}
	if err := us.Delete(ctx, id); !errors.Is(err, ErrNotServed) {
		t.Fatalf("Delete: %v", err)
	}
}

// TestURLStoreDenied: a URL for another operation or block, or past its
// expiry, is refused (ErrDenied); with forget, a refused request is made
// once more with a new URL.
func TestURLStoreDenied(t *testing.T) {
	s3, _ := openS3(t, "")
	ctx := context.Background()
	id, other := NewID(4), NewID(4)
	if err := s3.Put(ctx, id, []byte("block four")); err != nil {
		t.Fatal(err)
	}
	// another block's URL pointed at this block's object
	wrong := func(_ context.Context, op Op, id ID) (string, error) {
		u, err := s3.Presign(ctx, op, other, time.Now().Add(time.Minute))
		return strings.Replace(u, other.String(), id.String(), 1), err
	}
	us := NewURLStore(wrong, nil)
	defer us.Close()
	if _, err := us.ReadAt(ctx, id, make([]byte, 4), 0); !errors.Is(err, ErrDenied) {
		t.Fatalf("read with another block's URL: %v", err)
	}
	swapped := func(_ context.Context, op Op, id ID) (string, error) {
		return s3.Presign(ctx, OpRead+OpWrite-op, id, time.Now().Add(time.Minute))
	}
	us = NewURLStore(swapped, nil)
	defer us.Close()
	if err := us.Put(ctx, other, []byte("x")); !errors.Is(err, ErrDenied) {
		t.Fatalf("put with a read URL: %v", err)
	}
	if _, err := s3.ReadAt(ctx, other, make([]byte, 1), 0); !errors.Is(err, ErrNotFound) {
		t.Fatalf("after a refused put: %v", err)
	}

	// a refusal, then a good URL after forget
	var asked, forgot atomic.Int32
	flaky := func(ctx context.Context, op Op, id ID) (string, error) {
		if asked.Add(1) == 1 {
			return wrong(ctx, op, id)
		}
		return presigner(s3)(ctx, op, id)
	}
	us = NewURLStore(flaky, func(Op, ID) { forgot.Add(1) })
	defer us.Close()
	p := make([]byte, 20)
	if n, err := us.ReadAt(ctx, id, p, 0); n != 10 || err != io.EOF || string(p[:n]) != "block four" {
		t.Fatalf("read after a refusal: %d, %v", n, err)
	}
	if asked.Load() != 2 || forgot.Load() != 1 {
		t.Fatalf("asked %d times, forgot %d", asked.Load(), forgot.Load())
	}

	// expired: the gateway checks against its clock, the wall clock; a
	// URL lasts at least a second, so this waits one out
	u, err := s3.Presign(ctx, OpRead, id, time.Now().Add(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	end, ok := URLExpiry(u)
	if !ok || end.After(time.Now().Add(time.Second)) {
		t.Fatalf("a URL for a second ends at %v (%v)", end, ok)
	}
	us = NewURLStore(func(context.Context, Op, ID) (string, error) { return u, nil }, nil)
	defer us.Close()
	if _, err := us.ReadAt(ctx, id, make([]byte, 4), 0); err != nil && time.Now().Before(end) {
		t.Fatalf("read before the URL's expiry: %v", err)
	}
	time.Sleep(time.Until(end) + 50*time.Millisecond)
	if _, err := us.ReadAt(ctx, id, make([]byte, 4), 0); !errors.Is(err, ErrDenied) || !strings.Contains(err.Error(), "expired") {
		t.Fatalf("read with an expired URL: %v", err)
	}
}

// newTestMinio is a client of an endpoint it never reaches: presigning
// needs no answer when the region is known.
func newTestMinio(host string) (*minio.Client, error) {
	return minio.New(host, &minio.Options{Creds: credentials.NewStaticV4("k", "s", ""),
		Region: s3DefaultRegion, BucketLookup: minio.BucketLookupPath})
}

// TestPresignBounds: a URL ends no later than asked, and at most a
// second earlier; one asked for less than a second lasts a second at most.
func TestPresignBounds(t *testing.T) {
	s3 := &S3Store{bucket: testBucket}
	var err error
	if s3.client, err = newTestMinio("127.0.0.1:9"); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, d := range []time.Duration{300 * time.Millisecond, time.Second, 1500 * time.Millisecond, 2 * time.Second, 10*time.Second + 700*time.Millisecond} {
		for _, op := range []Op{OpRead, OpWrite} {
			now := time.Now()
			until := now.Add(d)
			u, err := s3.Presign(ctx, op, NewID(1), until)
			if err != nil {
				t.Fatal(err)
			}
			end, ok := URLExpiry(u)
			if !ok {
				t.Fatalf("%s: no expiry", u)
			}
			if d >= time.Second && (end.After(until) || end.Before(until.Add(-time.Second))) {
				t.Errorf("%v %v: ends at %v, asked %v", op, d, end, until)
			}
			if d < time.Second && end.After(now.Add(time.Second)) {
				t.Errorf("%v %v: ends at %v, over a second after %v", op, d, end, now)
			}
			if !strings.Contains(u, "X-Amz-Signature=") {
				t.Errorf("not presigned: %s", u)
			}
		}
	}
	if _, err := s3.Presign(ctx, Op(9), NewID(1), time.Now().Add(time.Minute)); err == nil {
		t.Error("presigned an unknown operation")
	}
}

// TestURLStoreErrorKinds: the object store's answers become the errors
// the Store contract names, a range ignored (200) still gives the range,
// and no error carries the URL (a credential while it lasts).
func TestURLStoreErrorKinds(t *testing.T) {
	data := randBytes(50_000, 4)
	var answer atomic.Value // "status code"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a := answer.Load().(string)
		if a == "whole" {
			w.Header().Set("Content-Length", strconv.Itoa(len(data)))
			w.Write(data)
			return
		}
		status, code, _ := strings.Cut(a, " ")
		n, _ := strconv.Atoi(status)
		w.WriteHeader(n)
		io.WriteString(w, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>"+code+"</Code><Message>says "+code+"</Message></Error>")
	}))
	defer srv.Close()
	us := NewURLStore(func(context.Context, Op, ID) (string, error) {
		return srv.URL + "/bucket/key?X-Amz-Signature=secret", nil
	}, nil)
	defer us.Close()
	ctx := context.Background()
	id := NewID(1)
	for _, c := range []struct {
		answer string
		want   error
	}{
		{"404 NoSuchKey", ErrNotFound},
		{"507 XMinioStorageFull", syscall.ENOSPC},
		{"507 Other", syscall.ENOSPC},
		{"403 QuotaExceeded", syscall.ENOSPC},
		{"400 EntityTooLarge", ErrTooBig},
		{"403 AccessDenied", ErrDenied},
		{"403 SignatureDoesNotMatch", ErrDenied},
		{"404 NoSuchBucket", nil},
		{"500 InternalError", nil},
	} {
		answer.Store(c.answer)
		err := us.Put(ctx, id, []byte("x"))
		_, rerr := us.ReadAt(ctx, id, make([]byte, 5), 0)
		for _, e := range []error{err, rerr} {
			for _, kind := range []error{ErrNotFound, syscall.ENOSPC, ErrTooBig, ErrDenied} {
				if errors.Is(e, kind) != (kind == c.want) {
					t.Errorf("%s: %v; want %v", c.answer, e, c.want)
				}
			}
			if e == nil || !strings.Contains(e.Error(), id.String()) || !strings.Contains(e.Error(), "says") {
				t.Errorf("%s: %v does not name the block and say what the store said", c.answer, e)
			}
		}
	}
	answer.Store("whole")
	p := make([]byte, 1000)
	if n, err := us.ReadAt(ctx, id, p, 5000); n != 1000 || err != nil || !bytes.Equal(p, data[5000:6000]) {
		t.Fatalf("range ignored: %d, %v", n, err)
	}
	if n, err := us.ReadAt(ctx, id, p, int64(len(data))-10); n != 10 || err != io.EOF {
		t.Fatalf("range ignored, at the end: %d, %v", n, err)
	}

	// an endpoint that is gone, and one whose certificate the system
	// does not trust
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gone := "http://" + ln.Addr().String() + "/b/k?X-Amz-Signature=secret"
	ln.Close()
	tlsSrv := httptest.NewUnstartedServer(http.NotFoundHandler())
	tlsSrv.Config.ErrorLog = log.New(io.Discard, "", 0) // the refused handshake
	tlsSrv.StartTLS()
	defer tlsSrv.Close()
	for _, u := range []string{gone, tlsSrv.URL + "/b/k?X-Amz-Signature=secret"} {
		us := NewURLStore(func(context.Context, Op, ID) (string, error) { return u, nil }, nil)
		err := us.Put(ctx, id, []byte("x"))
		us.Close()
		if err == nil || strings.Contains(err.Error(), "secret") || errors.Is(err, ErrNotFound) {
			t.Errorf("put to %s: %v", u, err)
		}
	}
}
