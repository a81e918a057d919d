package blocks

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/transport"
)

// blockServer is a Handler over a FileStore on a real TLS listener on the
// loopback, with the certificate of a fresh cluster identity.
type blockServer struct {
	store  atomic.Pointer[Store] // what the handler serves (a test may swap it)
	file   *FileStore
	signer *Signer
	ident  *transport.Identity
	url    string
	addr   string
}

func startServer(t testing.TB) *blockServer {
	t.Helper()
	ident, err := transport.NewIdentity()
	if err != nil {
		t.Fatal(err)
	}
	fs, err := OpenFileStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	signer, err := NewSigner(bytes.Repeat([]byte{7}, 32), nil)
	if err != nil {
		t.Fatal(err)
	}
	bs := &blockServer{file: fs, signer: signer, ident: ident}
	bs.serve(fs)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := NewHTTPServer(Handler(storeFunc{bs}, signer), ident.Cert)
	srv.ErrorLog = log.New(io.Discard, "", 0) // the wrong-pin test's handshake failures
	go srv.ServeTLS(ln, "", "")
	t.Cleanup(func() { srv.Close() })
	bs.addr = ln.Addr().String()
	bs.url = "https://" + bs.addr
	return bs
}

func (bs *blockServer) serve(s Store) { bs.store.Store(&s) }

// storeFunc lets a test swap the store a running handler serves.
type storeFunc struct{ bs *blockServer }

func (f storeFunc) cur() Store { return *f.bs.store.Load() }
func (f storeFunc) Put(ctx context.Context, id ID, data []byte) error {
	return f.cur().Put(ctx, id, data)
}
func (f storeFunc) ReadAt(ctx context.Context, id ID, p []byte, off int64) (int, error) {
	return f.cur().ReadAt(ctx, id, p, off)
}
func (f storeFunc) Delete(ctx context.Context, id ID) error { return f.cur().Delete(ctx, id) }
func (f storeFunc) List(ctx context.Context, ino ids.Ino, fn func(ID, int64, time.Time) error) error {
	return f.cur().List(ctx, ino, fn)
}
func (f storeFunc) Usage(ctx context.Context) (Usage, error) { return f.cur().Usage(ctx) }

// caps issues good capabilities, valid for a minute.
func (bs *blockServer) caps(_ context.Context, op Op, id ID) (string, error) {
	return bs.signer.Sign(Capability{Op: op, ID: id, Expiry: time.Now().Add(time.Minute)}), nil
}

func (bs *blockServer) remote(t testing.TB) *RemoteStore {
	r := NewRemoteStore(bs.url, bs.ident.CertHash(), bs.caps)
	t.Cleanup(r.Close)
	return r
}

// remoteH2 is a RemoteStore that speaks HTTP/2.
func (bs *blockServer) remoteH2(t testing.TB) *RemoteStore {
	r := newRemoteStore(bs.url, bs.ident.CertHash(), bs.caps, true)
	t.Cleanup(r.Close)
	return r
}

func TestRemoteRoundTrip(t *testing.T) {
	bs := startServer(t)
	t.Run("http1", func(t *testing.T) { testRoundTrip(t, bs, bs.remote(t), 1) })
	t.Run("http2", func(t *testing.T) { testRoundTrip(t, bs, bs.remoteH2(t), 2) })
}

func TestRemoteContract(t *testing.T) { testStoreContract(t, startServer(t).remote(t)) }

func testRoundTrip(t *testing.T, bs *blockServer, r *RemoteStore, proto int) {
	ctx := context.Background()
	data := randBytes(MaxBlock-777, 5)
	id := NewID(11)
	if err := r.Put(ctx, id, data); err != nil {
		t.Fatal(err)
	}
	// it is in the server's store, durable (Put returned before the 200)
	local := make([]byte, len(data))
	if n, err := bs.file.ReadAt(ctx, id, local, 0); n != len(data) || !bytes.Equal(local, data) {
		t.Fatalf("server's store: %d bytes, %v", n, err)
	}
	size := int64(len(data))
	for _, c := range []struct {
		off, n int64
		want   int
		eof    bool
	}{
		{0, size, len(data), false},
		{4097, 10000, 10000, false},
		{size - 5, 100, 5, true},
		{size, 1, 0, true},
		{MaxBlock + 1, 1, 0, true},
	} {
		p := make([]byte, c.n)
		n, err := r.ReadAt(ctx, id, p, c.off)
		if n != c.want || (err == io.EOF) != c.eof || err != nil && err != io.EOF {
			t.Fatalf("ReadAt(%d, %d) = %d, %v; want %d, eof %v", c.off, c.n, n, err, c.want, c.eof)
		}
		if n > 0 && !bytes.Equal(p[:n], data[c.off:c.off+int64(n)]) {
			t.Fatalf("ReadAt(%d, %d): wrong bytes", c.off, c.n)
		}
	}
	// verified reads work over the wire too
	p := make([]byte, 3*ChunkSize)
	if n, err := ReadVerified(ctx, r, id, size, Sum(data), p, 100); n != len(p) || err != nil || !bytes.Equal(p, data[100:100+len(p)]) {
		t.Fatalf("ReadVerified: %d, %v", n, err)
	}
	if _, err := r.ReadAt(ctx, NewID(11), make([]byte, 10), 0); !errors.Is(err, ErrNotFound) {
		t.Fatalf("missing block: %v", err)
	}
	if err := r.Put(ctx, id, data); err != nil {
		t.Fatalf("Put again: %v", err)
	}
	if err := r.Delete(ctx, id); !errors.Is(err, errors.ErrUnsupported) {
		t.Fatalf("remote Delete: %v", err)
	}
	if err := r.List(ctx, AllInodes, nil); !errors.Is(err, errors.ErrUnsupported) {
		t.Fatalf("remote List: %v", err)
	}
	resp, err := r.client.Get(bs.url + "/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.ProtoMajor != proto {
		t.Fatalf("protocol %s, want HTTP/%d", resp.Proto, proto)
	}
}

func TestRemoteWrongPin(t *testing.T) {
	bs := startServer(t)
	other, _ := transport.NewIdentity()
	r := NewRemoteStore(bs.url, other.CertHash(), bs.caps)
	defer r.Close()
	err := r.Put(context.Background(), NewID(1), []byte("x"))
	if !errors.Is(err, transport.ErrWrongServer) {
		t.Fatalf("Put to a server with another certificate: %v", err)
	}
	if u, _ := bs.file.Usage(context.Background()); u.Blocks != 0 {
		t.Fatalf("%d blocks stored", u.Blocks)
	}
}

// TestRemoteCapabilities: a request whose capability is missing, forged,
// expired, for the other operation or for another block gets 403, and
// RemoteStore says ErrDenied.
func TestRemoteCapabilities(t *testing.T) {
	ctx := context.Background()
	bs := startServer(t)
	id := NewID(4)
	if err := bs.file.Put(ctx, id, []byte("secret")); err != nil {
		t.Fatal(err)
	}
	forger, _ := NewSigner(bytes.Repeat([]byte{8}, 32), nil)
	soon := time.Now().Add(time.Minute)
	good := Capability{Op: OpRead, ID: id, Expiry: soon}
	cases := map[string]string{
		"missing":   "",
		"garbage":   "not a capability",
		"forged":    forger.Sign(good),
		"expired":   bs.signer.Sign(Capability{Op: OpRead, ID: id, Expiry: time.Now().Add(-time.Second)}),
		"write":     bs.signer.Sign(Capability{Op: OpWrite, ID: id, Expiry: soon}),
		"other id":  bs.signer.Sign(Capability{Op: OpRead, ID: NewID(4), Expiry: soon}),
		"other ino": bs.signer.Sign(Capability{Op: OpRead, ID: ID{Ino: 5, Unique: id.Unique}, Expiry: soon}),
	}
	// a flipped bit in a good capability's signature or body
	g := []byte(bs.signer.Sign(good))
	g[len(g)/2] ^= 1
	cases["tampered"] = string(g)
	for name, c := range cases {
		r := NewRemoteStore(bs.url, bs.ident.CertHash(), func(context.Context, Op, ID) (string, error) { return c, nil })
		n, err := r.ReadAt(ctx, id, make([]byte, 6), 0)
		if !errors.Is(err, ErrDenied) || n != 0 {
			t.Errorf("read with a %s capability: %d, %v", name, n, err)
		}
		if err := r.Put(ctx, NewID(4), []byte("x")); !errors.Is(err, ErrDenied) {
			t.Errorf("put with a %s capability: %v", name, err)
		}
		r.Close()
	}
	// a read capability does not write the block, a write one does
	r := NewRemoteStore(bs.url, bs.ident.CertHash(), func(context.Context, Op, ID) (string, error) {
		return bs.signer.Sign(good), nil
	})
	defer r.Close()
	if err := r.Put(ctx, id, []byte("overwritten")); !errors.Is(err, ErrDenied) {
		t.Errorf("put with a read capability: %v", err)
	}
	if n, err := r.ReadAt(ctx, id, make([]byte, 6), 0); n != 6 || err != nil {
		t.Errorf("read with a good capability: %d, %v", n, err)
	}
	if u, _ := bs.file.Usage(ctx); u.Blocks != 1 || u.Bytes != 6 {
		t.Errorf("store holds %+v after refused puts", u)
	}
}

// TestRemoteBodies: a PUT over MaxBlock gets 413, one without a length
// 411, one whose body is shorter than its Content-Length 400 and stores
// nothing; bad ranges get 416; a full disk is 507 and ENOSPC to the caller.
func TestRemoteBodies(t *testing.T) {
	ctx := context.Background()
	bs := startServer(t)
	r := bs.remote(t)
	id := NewID(2)
	capW, _ := bs.caps(ctx, OpWrite, id)
	capR, _ := bs.caps(ctx, OpRead, id)
	do := func(method string, body io.Reader, length int64, hdr ...string) int {
		req, _ := http.NewRequest(method, bs.url+pathPrefix+id.String(), body)
		req.ContentLength = length
		for i := 0; i < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		resp, err := r.client.Do(req)
		if err != nil {
			t.Fatalf("%s: %v", method, err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if got := do("PUT", bytes.NewReader(make([]byte, MaxBlock+1)), MaxBlock+1, CapabilityHeader, capW); got != 413 {
		t.Errorf("oversized PUT: %d", got)
	}
	if err := r.Put(ctx, id, make([]byte, MaxBlock+1)); !errors.Is(err, ErrTooBig) {
		t.Errorf("oversized Put: %v", err)
	}
	if got := do("PUT", io.MultiReader(strings.NewReader("abc")), -1, CapabilityHeader, capW); got != 411 {
		t.Errorf("PUT without a length: %d", got)
	}
	for _, rg := range []string{"bytes=5-1", "bytes=-5", "bytes=0-1,3-4", "items=0-1", fmt.Sprintf("bytes=%d-%d", MaxBlock, MaxBlock+9)} {
		if got := do("GET", nil, 0, CapabilityHeader, capR, "Range", rg); got != 416 {
			t.Errorf("GET Range %s: %d", rg, got)
		}
	}
	if got := do("GET", nil, 0, "Range", "bytes=5-1"); got != 403 {
		t.Errorf("GET with a bad range and no capability: %d", got)
	}
	if got := do("DELETE", nil, 0, CapabilityHeader, capW); got != 405 {
		t.Errorf("DELETE: %d", got)
	}
	if got := shortPUT(t, bs, id, capW); !strings.Contains(got, " 400 ") {
		t.Errorf("PUT with a short body: %q", got)
	}
	if u, _ := bs.file.Usage(ctx); u.Blocks != 0 {
		t.Errorf("%d blocks stored after refused PUTs", u.Blocks)
	}

	bs.serve(fullStore{bs.file})
	defer bs.serve(bs.file)
	if err := r.Put(ctx, id, []byte("x")); !errors.Is(err, syscall.ENOSPC) {
		t.Errorf("Put to a full store: %v", err)
	}
}

type fullStore struct{ *FileStore }

func (fullStore) Put(_ context.Context, id ID, _ []byte) error {
	return fmt.Errorf("blocks: put %s: %w", id, syscall.ENOSPC)
}

// shortPUT sends, over HTTP/1.1, a PUT whose body stops short of its
// Content-Length, and returns the status line of the answer.
func shortPUT(t *testing.T, bs *blockServer, id ID, capability string) string {
	conf := transport.PinnedTLS(bs.ident.CertHash())
	conf.NextProtos = []string{"http/1.1"}
	c, err := tls.Dial("tcp", bs.addr, conf)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "PUT %s%s HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n%s: %s\r\n\r\n", pathPrefix, id, CapabilityHeader, capability)
	c.Write(make([]byte, 500))
	c.CloseWrite()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	line, _ := io.ReadAll(io.LimitReader(c, 64))
	first, _, _ := strings.Cut(string(line), "\r\n")
	return first
}

func TestRemoteParallelReads(t *testing.T) {
	bs := startServer(t)
	t.Run("http1", func(t *testing.T) { testParallelReads(t, bs.remote(t)) })
	t.Run("http2", func(t *testing.T) { testParallelReads(t, bs.remoteH2(t)) })
}

func testParallelReads(t *testing.T, r *RemoteStore) {
	ctx := context.Background()
	const blocks = 6
	var idsList []ID
	var datas [][]byte
	for i := range blocks {
		id, data := NewID(20), randBytes(MaxBlock/2+i, uint64(i))
		if err := r.Put(ctx, id, data); err != nil {
			t.Fatal(err)
		}
		idsList, datas = append(idsList, id), append(datas, data)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for g := range 16 {
		wg.Go(func() {
			for k := range 8 {
				i := (g + k) % blocks
				off := int64(g*4099+k*65536) % int64(len(datas[i]))
				p := make([]byte, min(300_000, len(datas[i])-int(off)))
				n, err := r.ReadAt(ctx, idsList[i], p, off)
				if err != nil || n != len(p) || !bytes.Equal(p, datas[i][off:off+int64(n)]) {
					errs <- fmt.Errorf("reader %d: block %d at %d: %d bytes, %v", g, i, off, n, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
