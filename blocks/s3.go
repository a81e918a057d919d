package blocks

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"syscall"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
	"github.com/minio/minio-go/v7/pkg/s3utils"

	"github.com/leasefs/leasefs/internal/ids"
)

const (
	// s3OpenTimeout bounds OpenS3Store: an endpoint that does not answer
	// is an error at start, not a hang.
	s3OpenTimeout = 15 * time.Second
	// s3Retries is how many times a request is tried: a blip is retried
	// here, an outage goes to the caller, whose mount decides whether to
	// wait (hard) or fail (soft). minio-go's default of 10 would hold
	// each call for about 8 s first.
	s3Retries = 3
	// s3DefaultRegion is signed into requests to non-AWS endpoints,
	// which mostly ignore it; naming one saves the bucket-location lookup
	// some gateways do not serve.
	s3DefaultRegion = "us-east-1"
	// s3ProbeName is the start of the probe object's key below the
	// prefix: not a block id, so List never reports it.
	s3ProbeName = ".leasefs-probe-"
)

// badKeyCodes are the answers to a key the store does not know or a
// wrong secret (versitygw answers the first with a 404).
var badKeyCodes = map[string]bool{"InvalidAccessKeyId": true, "SignatureDoesNotMatch": true, "XAdminUserNotFound": true}

// S3Config says where an S3Store keeps its blocks.
type S3Config struct {
	// Endpoint is host[:port], or a URL (http:// or https://) whose
	// scheme then sets Secure.
	Endpoint string
	Bucket   string
	// Prefix is put before each block's key; a "/" is added if missing.
	Prefix string
	// Region defaults to us-east-1 for endpoints other than AWS; for AWS
	// an empty Region is looked up from the bucket.
	Region string
	// AccessKey and SecretKey, if empty, come from the environment
	// (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY) or else the shared
	// credentials file (~/.aws/credentials, AWS_PROFILE).
	AccessKey string
	SecretKey string
	// Secure is HTTPS.
	Secure bool
}

// S3Store is a Store on an S3-compatible object store: one object per
// block, named Prefix + ID.String(), so that one inode's blocks are the
// objects under Prefix + "<ino>/". Safe for concurrent use.
type S3Store struct {
	client *minio.Client
	bucket string
	prefix string
	where  string // endpoint and bucket, for errors
}

var _ Store = (*S3Store)(nil)

// ParseS3Spec reads "s3://BUCKET[/PREFIX]"; the prefix it returns is empty
// or ends in "/".
func ParseS3Spec(spec string) (bucket, prefix string, err error) {
	rest, ok := strings.CutPrefix(spec, "s3://")
	if !ok {
		return "", "", fmt.Errorf("blocks: %q: want s3://BUCKET[/PREFIX]", spec)
	}
	bucket, prefix, _ = strings.Cut(rest, "/")
	if err := s3utils.CheckValidBucketNameStrict(bucket); err != nil {
		return "", "", fmt.Errorf("blocks: %q: bucket: %w", spec, err)
	}
	return bucket, normPrefix(prefix), nil
}

func normPrefix(p string) string {
	p = strings.Trim(p, "/")
	if p == "" {
		return ""
	}
	return p + "/"
}

// s3Endpoint splits cfg.Endpoint into the host minio-go dials and whether
// it speaks TLS.
func s3Endpoint(cfg S3Config) (host string, secure bool, err error) {
	if !strings.Contains(cfg.Endpoint, "://") {
		if cfg.Endpoint == "" {
			return "", false, errors.New("no endpoint")
		}
		return cfg.Endpoint, cfg.Secure, nil
	}
	u, err := url.Parse(cfg.Endpoint)
	if err != nil {
		return "", false, err
	}
	if u.Scheme != "http" && u.Scheme != "https" || u.Host == "" || strings.Trim(u.Path, "/") != "" {
		return "", false, fmt.Errorf("endpoint %q: want host[:port] or http(s)://host[:port]", cfg.Endpoint)
	}
	return u.Host, u.Scheme == "https", nil
}

// s3Creds returns the config's key, or else the environment's or the
// shared credentials file's; finding none is an error, not anonymous
// requests that each fail.
func s3Creds(cfg S3Config) (*credentials.Credentials, error) {
	if cfg.AccessKey != "" || cfg.SecretKey != "" {
		return credentials.NewStaticV4(cfg.AccessKey, cfg.SecretKey, ""), nil
	}
	c := credentials.NewChainCredentials([]credentials.Provider{&credentials.EnvAWS{}, &credentials.FileAWSCredentials{}})
	v, err := c.Get()
	if err == nil && v.SignerType.IsAnonymous() {
		err = errors.New("none in AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or the shared credentials file")
	}
	if err != nil {
		return nil, fmt.Errorf("credentials: %w", err)
	}
	return c, nil
}

// OpenS3Store connects to the object store, creates the bucket if it is
// missing and checks that it can put, get, list and delete an object
// there. It fails within s3OpenTimeout, with one line naming the endpoint
// and bucket.
func OpenS3Store(ctx context.Context, cfg S3Config) (*S3Store, error) {
	ctx, cancel := context.WithTimeout(ctx, s3OpenTimeout)
	defer cancel()
	s := &S3Store{bucket: cfg.Bucket, prefix: normPrefix(cfg.Prefix),
		where: fmt.Sprintf("s3 endpoint %s bucket %s", cfg.Endpoint, cfg.Bucket)}
	fail := func(step string, err error) error {
		if ctx.Err() != nil && !errors.Is(err, syscall.ECONNREFUSED) {
			err = fmt.Errorf("no answer within %v: %w", s3OpenTimeout, err)
		}
		var e minio.ErrorResponse
		if errors.As(err, &e) && (e.StatusCode == http.StatusForbidden || badKeyCodes[e.Code]) {
			err = fmt.Errorf("%w (check the access key and secret, and that they may use the bucket)", err)
		}
		return fmt.Errorf("blocks: %s: %s: %w", s.where, step, oneLine{err})
	}
	if err := s3utils.CheckValidBucketNameStrict(cfg.Bucket); err != nil {
		return nil, fail("bucket name", err)
	}
	host, secure, err := s3Endpoint(cfg)
	if err != nil {
		return nil, fail("endpoint", err)
	}
	creds, err := s3Creds(cfg)
	if err != nil {
		return nil, fail("open", err)
	}
	opts := &minio.Options{Creds: creds, Secure: secure, Region: cfg.Region, MaxRetries: s3Retries,
		TrailingHeaders: true, BucketLookup: minio.BucketLookupPath}
	if aws := s3utils.IsAmazonEndpoint(url.URL{Host: host}); aws {
		opts.BucketLookup = minio.BucketLookupAuto // AWS prefers virtual-hosted names
	} else if opts.Region == "" {
		opts.Region = s3DefaultRegion
	}
	if s.client, err = minio.New(host, opts); err != nil {
		return nil, fail("open", err)
	}
	if err := s.makeBucket(ctx, opts.Region); err != nil {
		return nil, fail("bucket", err)
	}
	if step, err := s.probe(ctx); err != nil {
		return nil, fail(step, err)
	}
	return s, nil
}

// makeBucket creates the bucket unless it exists; another server
// creating it at the same time is fine.
func (s *S3Store) makeBucket(ctx context.Context, region string) error {
	ok, err := s.client.BucketExists(ctx, s.bucket)
	if err != nil || ok {
		return err
	}
	err = s.client.MakeBucket(ctx, s.bucket, minio.MakeBucketOptions{Region: region})
	if code := s3Code(err); code == "BucketAlreadyOwnedByYou" || code == "BucketAlreadyExists" {
		return nil // if someone else's, the probe says so
	}
	return err
}

// probe puts, reads back, lists and deletes an object under the prefix,
// and names the step that failed.
func (s *S3Store) probe(ctx context.Context) (step string, err error) {
	var b [16]byte
	rand.Read(b[:])
	key := s.prefix + s3ProbeName + hex.EncodeToString(b[:])
	data := []byte("leasefs probe " + hex.EncodeToString(b[:]))
	if err := s.putObject(ctx, key, data); err != nil {
		return "put", err
	}
	defer func() {
		// gone already if the probe passed; otherwise a try, bounded
		if err != nil {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			s.client.RemoveObject(rctx, s.bucket, key, minio.RemoveObjectOptions{})
		}
	}()
	got := make([]byte, len(data)+1)
	n, err := s.readAt(ctx, key, got, 0)
	if err != io.EOF || !bytes.Equal(got[:n], data) {
		return "get", fmt.Errorf("read back %d bytes (%v), want %d", n, err, len(data))
	}
	found := false
	for obj := range s.client.ListObjectsIter(ctx, s.bucket, minio.ListObjectsOptions{Prefix: key, Recursive: true}) {
		if obj.Err != nil {
			return "list", obj.Err
		}
		found = found || obj.Key == key
	}
	if !found {
		return "list", fmt.Errorf("object %s put but not listed", key)
	}
	if err := s.client.RemoveObject(ctx, s.bucket, key, minio.RemoveObjectOptions{}); err != nil {
		return "delete", err
	}
	return "", nil
}

// String names the store: s3://BUCKET/PREFIX.
func (s *S3Store) String() string { return "s3://" + s.bucket + "/" + s.prefix }

func (s *S3Store) key(id ID) string {
	return string(id.appendText([]byte(s.prefix)))
}

// putObject stores data under key with one PUT of its exact length,
// unsigned but with its CRC-32C in a trailer, which the store checks
// (BadDigest if the bytes changed on the way), as the AWS SDKs now send
// by default. minio-go's default over plain HTTP, a streaming signature,
// hashes every 64 KiB with SHA-256; Content-MD5 costs an MD5 of the block.
func (s *S3Store) putObject(ctx context.Context, key string, data []byte) error {
	opts := minio.PutObjectOptions{
		ContentType:          "application/octet-stream",
		DisableMultipart:     true,
		DisableContentSha256: true,
		Checksum:             minio.ChecksumCRC32C,
	}
	_, err := s.client.PutObject(ctx, s.bucket, key, bytes.NewReader(data), int64(len(data)), opts)
	return err
}

// Put stores the block with one PUT: the object appears whole or not at
// all, and is durable once the store answered.
func (s *S3Store) Put(ctx context.Context, id ID, data []byte) error {
	if len(data) > MaxBlock {
		return fmt.Errorf("blocks: put %s: %d bytes: %w", id, len(data), ErrTooBig)
	}
	if err := s.putObject(ctx, s.key(id), data); err != nil {
		return s.error("put", id, err)
	}
	return nil
}

// ReadAt reads the range with one ranged GET.
func (s *S3Store) ReadAt(ctx context.Context, id ID, p []byte, off int64) (int, error) {
	n, err := s.readAt(ctx, s.key(id), p, off)
	if err != nil && err != io.EOF {
		return n, s.error("read", id, err)
	}
	return n, err
}

func (s *S3Store) readAt(ctx context.Context, key string, p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, fmt.Errorf("negative offset %d", off)
	}
	if len(p) == 0 {
		return 0, nil
	}
	var opts minio.GetObjectOptions
	opts.SetRange(off, off+int64(len(p))-1)
	body, info, hdr, err := minio.Core{Client: s.client}.GetObject(ctx, s.bucket, key, opts)
	if err != nil {
		if s3Code(err) == "InvalidRange" {
			return 0, io.EOF // at or past the end (or an empty block)
		}
		return 0, err
	}
	defer body.Close()
	if hdr.Get("Content-Range") == "" && off > 0 {
		// the whole object, range ignored: skip to off
		if _, err := io.CopyN(io.Discard, body, off); err != nil {
			return 0, io.EOF
		}
		info.Size -= off
	}
	want := len(p)
	if info.Size >= 0 && info.Size < int64(want) {
		want = int(info.Size)
	}
	n, err := io.ReadFull(body, p[:want])
	if err != nil {
		return n, err // a cut answer, not the block's end
	}
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

// Delete removes the block's object; S3 answers a missing one as done.
func (s *S3Store) Delete(ctx context.Context, id ID) error {
	err := s.client.RemoveObject(ctx, s.bucket, s.key(id), minio.RemoveObjectOptions{})
	if err != nil && s3Code(err) != "NoSuchKey" {
		return s.error("delete", id, err)
	}
	return nil
}

// List lists the objects under the inode's prefix (or the store's);
// objects whose names are not block ids are skipped.
func (s *S3Store) List(ctx context.Context, ino ids.Ino, fn func(ID, int64, time.Time) error) error {
	prefix := s.prefix
	if ino != AllInodes {
		prefix += fmt.Sprintf("%016x/", uint64(ino))
	}
	for obj := range s.client.ListObjectsIter(ctx, s.bucket, minio.ListObjectsOptions{Prefix: prefix, Recursive: true}) {
		if obj.Err != nil {
			return fmt.Errorf("blocks: list %s: %s: %w", prefix, s.where, obj.Err)
		}
		id, err := ParseID(strings.TrimPrefix(obj.Key, s.prefix))
		if err != nil {
			continue // the probe, or not ours
		}
		if err := fn(id, obj.Size, obj.LastModified); err != nil {
			return err
		}
	}
	// a cancelled listing ends without saying so
	return ctx.Err()
}

// Usage counts the objects by listing them all; an object store's free
// room is not known (Free is -1).
func (s *S3Store) Usage(ctx context.Context) (Usage, error) {
	u, err := countBlocks(ctx, s)
	u.Free = -1
	return u, err
}

// s3Code is the S3 error code of err ("" if it is not an S3 answer).
func s3Code(err error) string {
	var e minio.ErrorResponse
	if errors.As(err, &e) {
		return e.Code
	}
	return ""
}

// error turns an object store's answer into the error the Store contract
// names (s3Kind).
func (s *S3Store) error(what string, id ID, err error) error {
	var e minio.ErrorResponse
	if !errors.As(err, &e) {
		return fmt.Errorf("blocks: %s %s: %s: %w", what, id, s.where, err)
	}
	kind := s3Kind(e.StatusCode, e.Code)
	if kind == nil {
		return fmt.Errorf("blocks: %s %s: %s: %w", what, id, s.where, err)
	}
	return fmt.Errorf("blocks: %s %s: %s: %v: %w", what, id, s.where, e.Error(), kind)
}

// Presign returns a URL with which anyone, without a key, may do op on
// block id (a GET of any range for OpRead, a PUT of the whole block for
// OpWrite) until no later than until. S3 counts a URL's life in whole
// seconds from the second it was signed in, so the URL ends at the last
// such second at or before until, and may last a little less than asked;
// but at least one second, which for an until less than a second away may
// end after it.
func (s *S3Store) Presign(ctx context.Context, op Op, id ID, until time.Time) (string, error) {
	for try := 0; ; try++ {
		secs := max(1, until.Sub(time.Now().Truncate(time.Second))/time.Second)
		var u *url.URL
		var err error
		switch op {
		case OpRead:
			u, err = s.client.PresignedGetObject(ctx, s.bucket, s.key(id), secs*time.Second, nil)
		case OpWrite:
			u, err = s.client.PresignedPutObject(ctx, s.bucket, s.key(id), secs*time.Second)
		default:
			return "", fmt.Errorf("blocks: presign %v %s: no such operation", op, id)
		}
		if err != nil {
			return "", s.error("presign "+op.String(), id, err)
		}
		// minio-go signs at its own reading of the clock: if a second
		// began since ours, the URL ends a second later than planned
		end, ok := URLExpiry(u.String())
		if !ok || !end.After(until) || secs == 1 || try > 0 {
			return u.String(), nil
		}
	}
}

// oneLine is an error printed on one line (a server's message may hold
// newlines).
type oneLine struct{ error }

func (e oneLine) Error() string {
	return strings.Join(strings.Fields(e.error.Error()), " ")
}

func (e oneLine) Unwrap() error { return e.error }

// Endpoint is the object store's URL (scheme and host), which the URLs
// Presign returns name.
func (s *S3Store) Endpoint() string {
	u := s.client.EndpointURL()
	return u.Scheme + "://" + u.Host
}
