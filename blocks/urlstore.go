package blocks

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/leasefs/leasefs/internal/ids"
)

// URLStore is a Store whose blocks are objects of an S3-compatible store,
// reached with presigned URLs: the CapabilityFunc returns, for each
// request, a URL that allows exactly that operation on that block for a
// while (S3Store.Presign, called by the inode's owner). The store holds no
// key. Safe for concurrent use.
type URLStore struct {
	urls   CapabilityFunc
	forget func(Op, ID)
	client *http.Client
}

var _ Store = (*URLStore)(nil)

// NewURLStore returns a store that asks urls for a presigned URL before
// each request. If forget is not nil, a request refused (403) is made once
// more with a new URL after forget(op, id): a URL the caller kept may have
// run out on the way, since S3 counts expiries in whole seconds on the
// store's clock.
//
// It speaks HTTP/1.1 with at most maxConns connections per endpoint, kept
// alive, as RemoteStore does, and trusts the system's roots for https.
func NewURLStore(urls CapabilityFunc, forget func(Op, ID)) *URLStore {
	tr := &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		TLSClientConfig:       &tls.Config{MinVersion: tls.VersionTLS12},
		MaxConnsPerHost:       maxConns,
		MaxIdleConnsPerHost:   maxConns,
		IdleConnTimeout:       time.Minute,
		TLSHandshakeTimeout:   10 * time.Second,
		ResponseHeaderTimeout: time.Minute,
		// a block is not compressible text; and a gzipped answer to a
		// ranged GET would not be the range's bytes
		DisableCompression: true,
	}
	return &URLStore{urls: urls, forget: forget, client: &http.Client{Transport: tr}}
}

// Close closes the store's idle connections.
func (s *URLStore) Close() { s.client.CloseIdleConnections() }

// do sends the request newReq builds on a URL for op on id, and asks once
// more after a refusal (see NewURLStore).
func (s *URLStore) do(ctx context.Context, what string, op Op, id ID, newReq func(u string) (*http.Request, error)) (*http.Response, error) {
	for try := 0; ; try++ {
		u, err := s.urls(ctx, op, id)
		if err != nil {
			return nil, fmt.Errorf("blocks: %s %s: presigned URL: %w", what, id, err)
		}
		req, err := newReq(u)
		if err != nil {
			return nil, fmt.Errorf("blocks: %s %s: %w", what, id, redactURL(err))
		}
		resp, err := s.client.Do(req)
		if err != nil {
			return nil, fmt.Errorf("blocks: %s %s: s3 %s: %w", what, id, req.URL.Host, redactURL(err))
		}
		if resp.StatusCode != http.StatusForbidden || try > 0 || s.forget == nil {
			return resp, nil
		}
		io.Copy(io.Discard, io.LimitReader(resp.Body, 4096)) // keep the connection
		resp.Body.Close()
		s.forget(op, id)
	}
}

// redactURL drops the URL from a request error: a presigned URL is a
// credential while it lasts, and does not belong in logs.
func redactURL(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

// Put stores the block with one PUT of its exact length (a presigned PUT
// takes no chunked body); the object appears whole or not at all.
func (s *URLStore) Put(ctx context.Context, id ID, data []byte) error {
	if len(data) > MaxBlock {
		return fmt.Errorf("blocks: put %s: %d bytes: %w", id, len(data), ErrTooBig)
	}
	resp, err := s.do(ctx, "put", OpWrite, id, func(u string) (*http.Request, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPut, u, bytes.NewReader(data))
		if err == nil {
			req.ContentLength = int64(len(data)) // also for an empty block
		}
		return req, err
	})
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return s3StatusError("put", id, resp)
	}
	io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
	return nil
}

// ReadAt reads the range with one ranged GET.
func (s *URLStore) ReadAt(ctx context.Context, id ID, p []byte, off int64) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	if off < 0 || off >= MaxBlock {
		return 0, io.EOF
	}
	resp, err := s.do(ctx, "read", OpRead, id, func(u string) (*http.Request, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
		if err == nil {
			req.Header.Set("Range", "bytes="+strconv.FormatInt(off, 10)+"-"+strconv.FormatInt(off+int64(len(p))-1, 10))
		}
		return req, err
	})
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	size := resp.ContentLength
	switch resp.StatusCode {
	case http.StatusPartialContent:
		if size > int64(len(p)) {
			return 0, fmt.Errorf("blocks: read %s: s3 %s sent %d bytes for %d", id, resp.Request.URL.Host, size, len(p))
		}
	case http.StatusOK:
		// the whole object, range ignored: skip to off
		if _, err := io.CopyN(io.Discard, resp.Body, off); err != nil {
			return 0, io.EOF
		}
		if size >= 0 {
			size -= off
		}
	case http.StatusRequestedRangeNotSatisfiable:
		return 0, io.EOF // at or past the end (or an empty block)
	default:
		return 0, s3StatusError("read", id, resp)
	}
	return readBody(resp.Body, p, size, id)
}

// readBody reads the answer's size bytes (-1: unknown, up to its end)
// into p.
func readBody(body io.Reader, p []byte, size int64, id ID) (int, error) {
	want := len(p)
	if size >= 0 && size < int64(want) {
		want = int(size)
	}
	n, err := io.ReadFull(body, p[:want])
	switch {
	case size < 0 && (err == io.EOF || err == io.ErrUnexpectedEOF):
		return n, io.EOF
	case err != nil:
		return n, fmt.Errorf("blocks: read %s: %w", id, err) // a cut answer, not the block's end
	case n < len(p):
		return n, io.EOF
	}
	return n, nil
}

// s3StatusError turns an object store's refusal into the error the Store
// contract names, as S3Store does; a 403 other than a full quota is
// ErrDenied (a URL expired, or for another operation or block).
func s3StatusError(what string, id ID, resp *http.Response) error {
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	var e struct{ Code, Message string }
	text := strings.Join(strings.Fields(string(body)), " ")
	if xml.Unmarshal(body, &e) == nil && e.Code != "" {
		text = e.Code + ": " + e.Message
	}
	where := "s3 " + resp.Request.URL.Host
	kind := s3Kind(resp.StatusCode, e.Code)
	if kind == nil && resp.StatusCode == http.StatusForbidden {
		kind = ErrDenied
	}
	if kind == nil {
		return fmt.Errorf("blocks: %s %s: %s: %s: %s", what, id, where, resp.Status, text)
	}
	return fmt.Errorf("blocks: %s %s: %s: %s: %s: %w", what, id, where, resp.Status, text, kind)
}

// s3Kind is the Store contract's error for an object store's answer
// (status and S3 error code), nil for none of them: a missing object is
// ErrNotFound, a full store ENOSPC, an object over the store's limit
// ErrTooBig.
func s3Kind(status int, code string) error {
	switch {
	case code == "NoSuchKey" || status == http.StatusNotFound && code != "NoSuchBucket":
		return ErrNotFound
	case status == http.StatusInsufficientStorage || code == "XMinioStorageFull" ||
		code == "InsufficientStorage" || code == "QuotaExceeded":
		return syscall.ENOSPC
	case code == "EntityTooLarge" || status == http.StatusRequestEntityTooLarge:
		return ErrTooBig
	}
	return nil
}

// Delete is not served: only the servers delete objects.
func (s *URLStore) Delete(context.Context, ID) error { return ErrNotServed }

// List is not served: only the servers list objects.
func (s *URLStore) List(context.Context, ids.Ino, func(ID, int64, time.Time) error) error {
	return ErrNotServed
}

// Usage is not served: only the servers list objects.
func (s *URLStore) Usage(context.Context) (Usage, error) { return Usage{}, ErrNotServed }

// URLExpiry is when a presigned URL (AWS Signature Version 4, query form)
// stops being accepted, by the object store's clock; false if u is not
// one.
func URLExpiry(u string) (time.Time, bool) {
	pu, err := url.Parse(u)
	if err != nil {
		return time.Time{}, false
	}
	q := pu.Query()
	date, err := time.Parse("20060102T150405Z", q.Get("X-Amz-Date"))
	if err != nil {
		return time.Time{}, false
	}
	secs, err := strconv.ParseInt(q.Get("X-Amz-Expires"), 10, 32)
	if err != nil || secs < 0 {
		return time.Time{}, false
	}
	return date.Add(time.Duration(secs) * time.Second), true
}
