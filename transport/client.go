package transport

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/leasefs/leasefs/internal/ids"
)

// ClientConfig configures NewClient.
type ClientConfig struct {
	Token Token
	// Key proves the client's id on every connection (nil: a fresh one;
	// a client that talks to several servers gives each the same key).
	Key *ClientKey
	// ClientID is the id the client claims, by default Key's; a server
	// refuses any other unless Key is the cluster's (Identity.PeerKey).
	ClientID ids.ClientID
	Hostname string // announced to the server for its logs
	Logger   *slog.Logger
	Faults   *Faults // nil: no fault injection
	// Callback handles server-initiated messages; its return value is the
	// acknowledgement sent back. Called concurrently; nil acknowledges with
	// an empty body.
	Callback func(ctx context.Context, body []byte) []byte
	// DialTimeout bounds one dial attempt including authentication
	// (default 5s).
	DialTimeout time.Duration
	// Oldest, if set, returns the oldest seq the caller may still send
	// (again), in any session: requests carry it, and the server forgets
	// the replies to older ones (an idle session then keeps none). It
	// must count a seq from the moment it is chosen until the caller is
	// done with it, resends included. Nil: the server keeps its window.
	Oldest func() uint64
	// AttemptTimeout, if set, bounds one attempt of a Call; the request is
	// then resent (same header) on a fresh stream. Zero: an attempt ends only
	// when the connection is lost, which keep-alives detect within 10 s.
	AttemptTimeout time.Duration
}

// Client is one mount's connection to one server address. It dials lazily,
// redials after a lost connection and is safe for concurrent use.
type Client struct {
	addr string
	cfg  ClientConfig
	log  *slog.Logger

	mu      sync.Mutex
	closed  bool
	cur     *clientConn
	dialing chan struct{} // closed when the running dial ends
	dialErr error         // result of the last dial
	udp     *net.UDPConn
	tr      *quic.Transport
}

// clientConn is one authenticated connection with its pool of idle request
// streams. Each stream carries one request at a time and is reused, which
// saves a stream open per call.
type clientConn struct {
	qc   *quic.Conn
	mu   sync.Mutex
	idle []*clientStream
	// fails counts consecutive stream failures on a connection that still
	// looks alive; too many and we drop it.
	fails atomic.Int32
}

type clientStream struct {
	st      *quic.Stream
	head    [frameHead]byte
	scratch []byte
}

// NewClient makes a client for the server at addr. It does not dial.
func NewClient(addr string, cfg ClientConfig) *Client {
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = authTimeout
	}
	if cfg.Key == nil {
		k, err := NewClientKey()
		if err != nil {
			panic(err) // crypto/rand does not fail
		}
		cfg.Key = k
	}
	if cfg.ClientID == 0 {
		cfg.ClientID = cfg.Key.ID()
	}
	if len(cfg.Hostname) > maxHost {
		cfg.Hostname = cfg.Hostname[:maxHost]
	}
	return &Client{addr: addr, cfg: cfg, log: orDiscard(cfg.Logger)}
}

// ID is the client id the client claims (ClientConfig).
func (c *Client) ID() ids.ClientID { return c.cfg.ClientID }

// Dial connects and authenticates now, so a mount can fail fast with a clear
// error: ErrAuth, ErrWrongServer or ErrUnreachable (wrapped with details).
func (c *Client) Dial(ctx context.Context) error {
	_, err := c.conn(ctx)
	return err
}

// Close closes the connection; calls in progress and later fail with
// ErrClosed.
func (c *Client) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	cur, tr, udp := c.cur, c.tr, c.udp
	c.cur = nil
	c.mu.Unlock()
	if cur != nil {
		cur.qc.CloseWithError(closeNormal, "client closing")
	}
	if tr != nil {
		tr.Close()
		udp.Close()
	}
	return nil
}

const (
	backoffMin = 20 * time.Millisecond
	backoffMax = time.Second
	// maxStreamFails: consecutive stream failures on a live-looking
	// connection before we drop it and redial.
	maxStreamFails = 3
)

// Call sends a request and returns the server application's reply. After a
// lost connection or a timed-out attempt it redials and resends the same
// header until ctx ends, relying on the server's reply cache for at-most-once
// execution. Errors: ctx.Err() wrapped when ctx ends; ErrAuth, ErrWrongServer,
// ErrTooLarge, ErrProtocol, ErrReplyEvicted, ErrClosed are returned at once.
func (c *Client) Call(ctx context.Context, h Header, body []byte) ([]byte, error) {
	return c.CallTail(ctx, h, body, nil)
}

// CallTail is Call of the request body followed by tail, written from
// where they are: a large tail (file data) is not copied into one buffer
// with the rest first. The caller keeps both unchanged until it returns.
func (c *Client) CallTail(ctx context.Context, h Header, body, tail []byte) ([]byte, error) {
	if n := len(body) + len(tail); n > MaxBody {
		return nil, fmt.Errorf("%w: request of %d bytes (max %d)", ErrTooLarge, n, MaxBody)
	}
	backoff := backoffMin
	for attempt := 0; ; attempt++ {
		cc, err := c.conn(ctx)
		if err == nil {
			var reply []byte
			reply, err = c.attempt(ctx, cc, h, body, tail)
			if err == nil {
				cc.fails.Store(0)
				return reply, nil
			}
			if final(err) {
				return nil, err
			}
			// (busy: the server answered; the connection is fine)
			if ctx.Err() == nil && cc.qc.Context().Err() == nil && !errors.Is(err, ErrBusy) && cc.fails.Add(1) >= maxStreamFails {
				cc.qc.CloseWithError(closeNormal, "too many stream failures")
			}
		} else if final(err) {
			return nil, err
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("transport: call %v to %s: %w (last error: %v)", h, c.addr, ctx.Err(), err)
		}
		c.log.Debug("retrying call", "req", h, "server", c.addr, "attempt", attempt+1, "err", err)
		t := time.NewTimer(backoff)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("transport: call %v to %s: %w (last error: %v)", h, c.addr, ctx.Err(), err)
		}
		backoff = min(2*backoff, backoffMax)
	}
}

// final reports errors that retrying cannot fix.
func final(err error) bool {
	for _, e := range []error{ErrAuth, ErrWrongServer, ErrTooLarge, ErrProtocol, ErrReplyEvicted, ErrClosed} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// attempt sends the request once on a pooled stream and reads the reply.
func (c *Client) attempt(ctx context.Context, cc *clientConn, h Header, body, tail []byte) ([]byte, error) {
	actx := ctx
	if c.cfg.AttemptTimeout > 0 {
		var cancel context.CancelFunc
		actx, cancel = context.WithTimeout(ctx, c.cfg.AttemptTimeout)
		defer cancel()
	}
	cs, err := cc.get(actx)
	if err != nil {
		return nil, err
	}
	var stop func() bool
	if actx.Done() != nil {
		stop = context.AfterFunc(actx, func() { cancelStream(cs.st) })
	}
	var oldest uint64
	if c.cfg.Oldest != nil {
		oldest = min(c.cfg.Oldest(), h.Seq)
	}
	err = writeFrameOldest(cs.st, &cs.scratch, kindRequest, h, oldest, body, tail)
	var f frame
	if err == nil {
		f, err = readFrame(cs.st, &cs.head)
	}
	if stop != nil && !stop() {
		// the stream was cancelled under us; do not reuse it
		return nil, fmt.Errorf("transport: attempt: %w", actx.Err())
	}
	if err != nil {
		cancelStream(cs.st)
		return nil, err
	}
	switch {
	case f.kind == kindReply && f.Header == h:
		cc.put(cs)
		return f.body, nil
	case f.kind == kindError:
		cancelStream(cs.st)
		return nil, remoteError(f.body)
	default:
		cancelStream(cs.st)
		return nil, fmt.Errorf("%w: %v frame for %v in reply to %v", ErrProtocol, f.kind, f.Header, h)
	}
}

func (cc *clientConn) get(ctx context.Context) (*clientStream, error) {
	cc.mu.Lock()
	if n := len(cc.idle); n > 0 {
		cs := cc.idle[n-1]
		cc.idle[n-1] = nil
		cc.idle = cc.idle[:n-1]
		cc.mu.Unlock()
		return cs, nil
	}
	cc.mu.Unlock()
	st, err := cc.qc.OpenStreamSync(ctx)
	if err != nil {
		return nil, err
	}
	return &clientStream{st: st}, nil
}

func (cc *clientConn) put(cs *clientStream) {
	if cap(cs.scratch) > 2*smallFrame {
		cs.scratch = nil
	}
	cc.mu.Lock()
	if len(cc.idle) < maxStreams {
		cc.idle = append(cc.idle, cs)
		cs = nil
	}
	cc.mu.Unlock()
	if cs != nil {
		cs.st.Close()
	}
}

// conn returns the live connection, dialing (once, for all callers) if there
// is none.
func (c *Client) conn(ctx context.Context) (*clientConn, error) {
	c.mu.Lock()
	for {
		if c.closed {
			c.mu.Unlock()
			return nil, ErrClosed
		}
		if cc := c.cur; cc != nil && cc.qc.Context().Err() == nil {
			c.mu.Unlock()
			return cc, nil
		}
		c.cur = nil
		ch := c.dialing
		if ch == nil {
			break
		}
		c.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, fmt.Errorf("%w: %s: %w", ErrUnreachable, c.addr, ctx.Err())
		}
		c.mu.Lock()
		if c.cur == nil && c.dialErr != nil {
			err := c.dialErr
			c.mu.Unlock()
			return nil, err
		}
	}
	ch := make(chan struct{})
	c.dialing = ch
	c.mu.Unlock()

	cc, err := c.dial(ctx)

	c.mu.Lock()
	c.dialing = nil
	c.dialErr = err
	if err == nil {
		if c.closed {
			cc.qc.CloseWithError(closeNormal, "client closing")
			cc, err = nil, ErrClosed
		} else {
			c.cur = cc
		}
	}
	c.mu.Unlock()
	close(ch)
	return cc, err
}

func (c *Client) transport() (*quic.Transport, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, ErrClosed
	}
	if c.tr != nil {
		return c.tr, nil
	}
	udp, err := net.ListenUDP("udp", nil)
	if err != nil {
		return nil, fmt.Errorf("transport: client socket: %w", err)
	}
	var pc net.PacketConn = udp
	if c.cfg.Faults != nil {
		pc = c.cfg.Faults.Wrap(udp)
	}
	c.udp, c.tr = udp, &quic.Transport{Conn: pc}
	return c.tr, nil
}

func (c *Client) dial(ctx context.Context) (*clientConn, error) {
	tr, err := c.transport()
	if err != nil {
		return nil, err
	}
	raddr, err := net.ResolveUDPAddr("udp", c.addr)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrUnreachable, c.addr, err)
	}
	dctx, cancel := context.WithTimeout(ctx, c.cfg.DialTimeout)
	defer cancel()
	var mismatch atomic.Bool
	want := c.cfg.Token.CertHash
	tlsConf := &tls.Config{
		// The token pins the certificate by hash; there is no CA to check.
		InsecureSkipVerify: true,
		VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
			if len(raw) == 0 || sha256.Sum256(raw[0]) != want {
				mismatch.Store(true)
				return ErrWrongServer
			}
			return nil
		},
		ServerName:   "leasefs",
		NextProtos:   []string{alpn},
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{c.cfg.Key.cert},
	}
	qc, err := tr.Dial(dctx, raddr, tlsConf, quicConfig(maxCallbackStreams))
	if err != nil {
		if mismatch.Load() {
			return nil, fmt.Errorf("%w (server %s)", ErrWrongServer, c.addr)
		}
		return nil, c.dialError(ctx, err)
	}
	if err := c.hello(dctx, qc); err != nil {
		if errors.Is(err, ErrAuth) || errors.Is(err, ErrProtocol) {
			qc.CloseWithError(closeNormal, "refused")
			return nil, err
		}
		qc.CloseWithError(closeProto, "hello failed")
		return nil, c.dialError(ctx, err)
	}
	cc := &clientConn{qc: qc}
	go c.acceptCallbacks(cc)
	c.log.Debug("connected", "server", c.addr, "local", qc.LocalAddr())
	return cc, nil
}

func (c *Client) dialError(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("%w: %s: %w", ErrUnreachable, c.addr, ctx.Err())
	}
	return fmt.Errorf("%w: %s: %v", ErrUnreachable, c.addr, err)
}

// hello proves the secret on the connection's first stream.
func (c *Client) hello(ctx context.Context, qc *quic.Conn) error {
	proof, err := authProof(c.cfg.Token.Secret, qc.ConnectionState().TLS)
	if err != nil {
		return err
	}
	st, err := qc.OpenStreamSync(ctx)
	if err != nil {
		return refusedOr(err)
	}
	if d, ok := ctx.Deadline(); ok {
		st.SetDeadline(d)
	}
	var head [frameHead]byte
	var scratch []byte
	h := Header{Client: c.cfg.ClientID}
	body := hello{proof: proof, host: c.cfg.Hostname}.append(nil)
	if err := writeFrame(st, &scratch, kindHello, h, body, nil); err != nil {
		return refusedOr(err)
	}
	f, err := readFrame(st, &head)
	if err != nil {
		return refusedOr(err)
	}
	switch f.kind {
	case kindHelloOK:
		st.Close()
		return nil
	case kindRefused:
		return fmt.Errorf("%w (server %s: %s)", ErrAuth, c.addr, f.body)
	case kindError: // busy: dialled again later
		return remoteError(f.body)
	}
	return fmt.Errorf("%w: %v frame in reply to hello", ErrProtocol, f.kind)
}

// refusedOr maps the server's close codes during the hello to final errors:
// "refused" to ErrAuth (the refusal frame and the close race), "protocol" to
// ErrProtocol.
func refusedOr(err error) error {
	var ae *quic.ApplicationError
	if errors.As(err, &ae) && ae.Remote {
		switch ae.ErrorCode {
		case closeRefused:
			return fmt.Errorf("%w (%s)", ErrAuth, ae.ErrorMessage)
		case closeProto: // e.g. a server speaking another protocol version
			return fmt.Errorf("%w: server closed the connection: %s", ErrProtocol, ae.ErrorMessage)
		}
	}
	return err
}

// acceptCallbacks serves server-initiated streams until the connection ends.
func (c *Client) acceptCallbacks(cc *clientConn) {
	ctx := cc.qc.Context()
	for {
		st, err := cc.qc.AcceptStream(ctx)
		if err != nil {
			return
		}
		go c.serveCallback(ctx, st)
	}
}

func (c *Client) serveCallback(ctx context.Context, st *quic.Stream) {
	var head [frameHead]byte
	f, err := readFrame(st, &head)
	if err != nil || f.kind != kindCallback {
		if err == nil {
			err = fmt.Errorf("%w: %v frame on a callback stream", ErrProtocol, f.kind)
		}
		c.log.Warn("bad callback from server", "server", c.addr, "err", err)
		cancelStream(st)
		return
	}
	var reply []byte
	if c.cfg.Callback != nil {
		reply = c.cfg.Callback(ctx, f.body)
	}
	var scratch []byte
	if err := writeFrame(st, &scratch, kindCallbackReply, f.Header, reply, nil); err != nil {
		cancelStream(st)
		return
	}
	st.Close()
}
