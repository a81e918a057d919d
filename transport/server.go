package transport

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/internal/ratelog"
)

// Request is one request as the server application sees it.
type Request struct {
	Header
	Body []byte      // owned by the handler
	Conn *ServerConn // the connection it arrived on (a retry may arrive on another)
	// Idempotent, set by the handler, says that running the request
	// again does no harm (a read). The transport then keeps no copy of
	// the reply: a duplicate runs the handler again, and the reply goes
	// to Recycle once sent, so it may be a Buffer. A megabyte read's
	// reply kept for duplicates was fresh memory every time, and pushed
	// other replies out of the reply cache.
	Idempotent bool
}

// Handler executes a request and returns the reply body. It is called
// concurrently, at most once per (client, session, seq) while that seq is in
// the reply cache, unless the request is Idempotent. The transport keeps the
// returned slice for duplicates: do not modify it afterwards. ctx ends only
// when the server closes, not when the connection is lost, so that a retry
// on a new connection finds the reply.
type Handler func(ctx context.Context, req *Request) []byte

// ServerConfig configures Listen.
type ServerConfig struct {
	Identity *Identity
	Logger   *slog.Logger
	Faults   *Faults // nil: no fault injection
	// ReplyCacheSize is the number of finished replies kept per session
	// (default 1024). Older ones are forgotten and their seqs refused.
	ReplyCacheSize int
	// ReplyCacheBytes bounds the reply bytes kept per session (default
	// 32 MiB). Beyond it the oldest reply bodies are dropped (their seqs are
	// still remembered and a retry gets ErrReplyEvicted, never a second
	// execution).
	ReplyCacheBytes int
	// Receiving, if set, is called with the part of a big request body
	// read so far, every 64 KiB of it: how the server sees a client
	// making progress on a request that takes a while to arrive.
	Receiving func(client ids.ClientID, partial []byte)
}

const (
	defaultReplyCacheSize  = 1024
	defaultReplyCacheBytes = 32 << 20
)

// Server accepts authenticated QUIC connections and serves requests.
type Server struct {
	cfg   ServerConfig
	h     Handler
	log   *slog.Logger
	udp   *net.UDPConn
	tr    *quic.Transport
	ln    *quic.Listener
	ctx   context.Context // handlers' context: ends at Close
	stop  context.CancelFunc
	wg    sync.WaitGroup
	cbSeq atomic.Uint64
	warns *ratelog.Limiter // a peer's malformed requests log a few lines, not one each

	certHash [32]byte // the cluster's certificate: a peer server presents it too

	mu       sync.Mutex
	closed   bool
	latest   map[ids.ClientID]*ServerConn // a client's most recent authenticated connection
	conns    map[*ServerConn]struct{}
	sessions map[sessionKey]*replyCache
}

// ServerConn is one authenticated client connection.
type ServerConn struct {
	qc     *quic.Conn
	client ids.ClientID
	host   string
	peer   bool // proved the cluster's private key (a server)
}

// RemoteAddr is the client's address.
func (c *ServerConn) RemoteAddr() net.Addr { return c.qc.RemoteAddr() }

// Client is the client id the connection authenticated with.
func (c *ServerConn) Client() ids.ClientID { return c.client }

// Host is the hostname the client announced (for logs and admin output; not
// verified).
func (c *ServerConn) Host() string { return c.host }

// Peer reports whether the connection proved it holds the cluster's
// private key: another server of the cluster (ClientKey).
func (c *ServerConn) Peer() bool { return c.peer }

// Listen starts a server on addr ("host:port"; port 0 picks one).
func Listen(addr string, cfg ServerConfig, h Handler) (*Server, error) {
	if cfg.Identity == nil {
		return nil, errors.New("transport: listen: no identity")
	}
	if h == nil {
		return nil, errors.New("transport: listen: no handler")
	}
	if cfg.ReplyCacheSize <= 0 {
		cfg.ReplyCacheSize = defaultReplyCacheSize
	}
	if cfg.ReplyCacheBytes <= 0 {
		cfg.ReplyCacheBytes = defaultReplyCacheBytes
	}
	uaddr, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		return nil, fmt.Errorf("transport: listen %s: %w", addr, err)
	}
	udp, err := net.ListenUDP("udp", uaddr)
	if err != nil {
		return nil, fmt.Errorf("transport: listen %s: %w", addr, err)
	}
	var pc net.PacketConn = udp
	if cfg.Faults != nil {
		pc = cfg.Faults.Wrap(udp)
	}
	tr := &quic.Transport{Conn: pc, StatelessResetKey: statelessResetKey(cfg.Identity.Secret)}
	tlsConf := &tls.Config{
		Certificates: []tls.Certificate{cfg.Identity.Cert},
		NextProtos:   []string{alpn},
		MinVersion:   tls.VersionTLS13,
		// Any certificate, no CA: the key in it is what the client id
		// is checked against (ClientKey). TLS checks that the client
		// holds its private key.
		ClientAuth: tls.RequireAnyClientCert,
	}
	ln, err := tr.Listen(tlsConf, quicConfig(maxStreams))
	if err != nil {
		tr.Close()
		udp.Close()
		return nil, fmt.Errorf("transport: listen %s: %w", addr, err)
	}
	ctx, stop := context.WithCancel(context.Background())
	s := &Server{
		cfg: cfg, h: h, log: orDiscard(cfg.Logger), warns: ratelog.New(),
		udp: udp, tr: tr, ln: ln, ctx: ctx, stop: stop,
		certHash: cfg.Identity.CertHash(),
		latest:   make(map[ids.ClientID]*ServerConn),
		conns:    make(map[*ServerConn]struct{}),
		sessions: make(map[sessionKey]*replyCache),
	}
	s.wg.Add(1)
	go s.acceptLoop()
	return s, nil
}

// Addr is the address the server listens on.
func (s *Server) Addr() net.Addr { return s.udp.LocalAddr() }

// Close stops accepting, closes every connection and waits for the
// connection loops (not for running handlers, whose ctx it cancels).
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	conns := make([]*ServerConn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	s.stop()
	s.ln.Close()
	for _, c := range conns {
		c.qc.CloseWithError(closeNormal, "server closing")
	}
	err := s.tr.Close()
	s.udp.Close()
	s.wg.Wait()
	return err
}

// Connected reports whether the client has an authenticated connection.
func (s *Server) Connected(client ids.ClientID) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.latest[client]
	return c != nil && c.qc.Context().Err() == nil
}

// ForgetSession drops the reply cache of a session (after the lease layer
// forgot it); a later request of that session executes as new.
func (s *Server) ForgetSession(client ids.ClientID, session ids.SessionID) {
	s.mu.Lock()
	delete(s.sessions, sessionKey{client, session})
	s.mu.Unlock()
}

// Callback sends body to the client's most recent authenticated connection
// and returns the client application's reply (its acknowledgement). It fails
// at once with ErrNotConnected if the client has no live connection; it does
// not retry (the lease layer decides what an unacknowledged callback means).
func (s *Server) Callback(ctx context.Context, client ids.ClientID, body []byte) ([]byte, error) {
	if len(body) > MaxBody {
		return nil, ErrTooLarge
	}
	s.mu.Lock()
	c := s.latest[client]
	closed := s.closed
	s.mu.Unlock()
	if closed {
		return nil, ErrClosed
	}
	if c == nil || c.qc.Context().Err() != nil {
		return nil, fmt.Errorf("%w: %v", ErrNotConnected, client)
	}
	st, err := c.qc.OpenStreamSync(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("transport: callback to %v: %w", client, ctx.Err())
		}
		return nil, fmt.Errorf("%w: %v: %v", ErrNotConnected, client, err)
	}
	stop := context.AfterFunc(ctx, func() { cancelStream(st) })
	defer stop()
	var scratch []byte
	var head [frameHead]byte
	h := Header{Client: client, Seq: s.cbSeq.Add(1)}
	err = writeFrame(st, &scratch, kindCallback, h, body, nil)
	if err == nil {
		err = st.Close()
	}
	var f frame
	if err == nil {
		f, err = readFrame(st, &head)
	}
	if err != nil {
		cancelStream(st)
		if ctx.Err() != nil {
			return nil, fmt.Errorf("transport: callback to %v: %w", client, ctx.Err())
		}
		return nil, fmt.Errorf("transport: callback to %v: connection failed: %w", client, err)
	}
	if f.kind != kindCallbackReply {
		cancelStream(st)
		return nil, fmt.Errorf("%w: callback answered with %v", ErrProtocol, f.kind)
	}
	return f.body, nil
}

func cancelStream(st *quic.Stream) {
	st.CancelRead(streamCancel)
	st.CancelWrite(streamCancel)
}

func (s *Server) acceptLoop() {
	defer s.wg.Done()
	for {
		qc, err := s.ln.Accept(s.ctx)
		if err != nil {
			return
		}
		s.wg.Add(1)
		go s.serveConn(qc)
	}
}

// serveConn authenticates a connection on its first stream, then serves
// request streams. No stream other than the hello is accepted before the
// proof checks out.
func (s *Server) serveConn(qc *quic.Conn) {
	defer s.wg.Done()
	sc, err := s.authenticate(qc)
	if err != nil {
		return
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		qc.CloseWithError(closeNormal, "server closing")
		return
	}
	s.conns[sc] = struct{}{}
	s.latest[sc.client] = sc
	s.mu.Unlock()
	s.log.Debug("client connected", "client", sc.client, "host", sc.host, "addr", qc.RemoteAddr())
	defer func() {
		s.mu.Lock()
		delete(s.conns, sc)
		if s.latest[sc.client] == sc {
			delete(s.latest, sc.client)
		}
		s.mu.Unlock()
		s.log.Debug("client disconnected", "client", sc.client, "addr", qc.RemoteAddr())
	}()
	for {
		st, err := qc.AcceptStream(qc.Context())
		if err != nil {
			return
		}
		go s.serveStream(sc, st)
	}
}

func (s *Server) authenticate(qc *quic.Conn) (*ServerConn, error) {
	ctx, cancel := context.WithTimeout(qc.Context(), authTimeout)
	defer cancel()
	st, err := qc.AcceptStream(ctx)
	if err != nil {
		qc.CloseWithError(closeProto, "no hello")
		return nil, err
	}
	st.SetDeadline(time.Now().Add(authTimeout))
	var head [frameHead]byte
	f, err := readFrame(st, &head)
	if err == nil && f.kind != kindHello {
		err = fmt.Errorf("%w: first frame is %v, not hello", ErrProtocol, f.kind)
	}
	var m hello
	if err == nil {
		m, err = parseHello(f.body)
	}
	if err != nil {
		s.warns.Warn(s.log, ratelog.Peer(qc.RemoteAddr().String()), "refused client: bad hello", "addr", qc.RemoteAddr(), "err", err)
		qc.CloseWithError(closeProto, "bad hello")
		return nil, err
	}
	tlsState := qc.ConnectionState().TLS
	want, err := authProof(s.cfg.Identity.Secret, tlsState)
	if err != nil {
		qc.CloseWithError(closeProto, "tls exporter")
		return nil, err
	}
	var scratch []byte
	refuse := func(why string) error {
		writeFrame(st, &scratch, kindRefused, f.Header, []byte(why), nil)
		st.Close()
		// The close code tells the client too, should the frame not arrive first.
		qc.CloseWithError(closeRefused, why)
		return ErrAuth
	}
	peer := ratelog.Peer(qc.RemoteAddr().String())
	if !hmac.Equal(want[:], m.proof[:]) {
		s.warns.Warn(s.log, peer, "refused client: bad token", "addr", qc.RemoteAddr(), "client", f.Client, "host", m.host)
		return nil, refuse("bad token")
	}
	if len(tlsState.PeerCertificates) == 0 { // TLS requires one; never trust that alone
		return nil, refuse("no client certificate")
	}
	cert := tlsState.PeerCertificates[0]
	sc := &ServerConn{qc: qc, client: f.Client, host: m.host, peer: sha256.Sum256(cert.Raw) == s.certHash}
	if !sc.peer && f.Client != clientIDOf(cert) {
		// The id is the key's: whoever learnt another client's id
		// cannot take over its callbacks or its session.
		s.warns.Warn(s.log, peer, "refused client: id not its key's", "addr", qc.RemoteAddr(), "client", f.Client, "host", m.host)
		return nil, refuse(fmt.Sprintf("client id %v is not the one of the connection's key", f.Client))
	}
	if err := writeFrame(st, &scratch, kindHelloOK, f.Header, nil, nil); err != nil {
		qc.CloseWithError(closeProto, "hello reply")
		return nil, err
	}
	st.Close()
	return sc, nil
}

// serveStream serves requests on one long-lived stream, one at a time, until
// the client closes it.
func (s *Server) serveStream(sc *ServerConn, st *quic.Stream) {
	var head [frameHead]byte
	var scratch []byte
	// fail answers with a transport error and gives up the stream.
	fail := func(h Header, c errCode, err error) {
		writeFrame(st, &scratch, kindError, h, errorBody(c, err.Error()), nil)
		st.Close()
		st.CancelRead(streamCancel)
	}
	var progress func([]byte)
	if s.cfg.Receiving != nil {
		progress = func(partial []byte) { s.cfg.Receiving(sc.client, partial) }
	}
	for {
		f, err := readFrameReporting(st, &head, progress)
		if err != nil {
			switch {
			case errors.Is(err, io.EOF):
				st.Close()
			case errors.Is(err, errFrameVersion):
				s.warns.Warn(s.log, ratelog.Peer(sc.RemoteAddr().String()), "request with unsupported frame version", "client", sc.client, "addr", sc.RemoteAddr(), "err", err)
				fail(Header{}, errCodeVersion, err)
			case errors.Is(err, ErrTooLarge):
				s.warns.Warn(s.log, ratelog.Peer(sc.RemoteAddr().String()), "request too large", "client", sc.client, "addr", sc.RemoteAddr(), "err", err)
				fail(Header{}, errCodeTooLarge, err)
			case errors.Is(err, errFrameKind), errors.Is(err, errFrameShort):
				s.warns.Warn(s.log, ratelog.Peer(sc.RemoteAddr().String()), "malformed request", "client", sc.client, "addr", sc.RemoteAddr(), "err", err)
				fail(Header{}, errCodeMalformed, err)
			default: // stream or connection gone
				st.CancelWrite(streamCancel)
			}
			return
		}
		if f.kind != kindRequest {
			fail(f.Header, errCodeMalformed, fmt.Errorf("%w: %v frame on a request stream", ErrProtocol, f.kind))
			return
		}
		if f.Client != sc.client {
			// A connection speaks for the client it authenticated as only, so
			// nobody can read or poison another client's reply cache.
			s.warns.Warn(s.log, ratelog.Peer(sc.RemoteAddr().String()), "request for another client id", "conn", sc.client, "request", f.Client, "addr", sc.RemoteAddr())
			fail(f.Header, errCodeMalformed, fmt.Errorf("%w: client id %v differs from the connection's", ErrProtocol, f.Client))
			return
		}
		req := &Request{Header: f.Header, Body: f.body, Conn: sc}
		reply, code, err := s.execute(sc, req)
		if err == nil && len(reply) > MaxBody {
			s.log.Error("handler reply too large", "req", f.Header, "bytes", len(reply))
			code, err = errCodeTooLarge, fmt.Errorf("%w: reply of %d bytes", ErrTooLarge, len(reply))
		}
		if err != nil {
			if code == errCodeShutdown {
				st.CancelWrite(streamCancel)
				return
			}
			err = writeFrame(st, &scratch, kindError, f.Header, errorBody(code, err.Error()), nil)
		} else {
			err = writeFrame(st, &scratch, kindReply, f.Header, reply, nil)
		}
		if err != nil {
			st.CancelRead(streamCancel)
			return
		}
		if req.Idempotent {
			Recycle(reply) // QUIC copied it into its frames
		}
		// Don't pin a large scratch buffer on an idle stream.
		if cap(scratch) > 2*smallFrame {
			scratch = nil
		}
	}
}

// unlessClosing passes on a handler's reply unless the server is closing:
// Close ends the handlers' context, so the reply may be the handler giving
// up ("interrupted"), which is no answer to the request. The client, whose
// stream is reset instead, sends it again, to another server if need be.
func (s *Server) unlessClosing(req *Request, reply []byte) ([]byte, errCode, error) {
	if s.ctx.Err() != nil {
		if req.Idempotent {
			Recycle(reply)
		}
		return nil, errCodeShutdown, errServerShutdown
	}
	return reply, 0, nil
}

// execute runs the handler at most once per (client, session, seq).
func (s *Server) execute(sc *ServerConn, req *Request) ([]byte, errCode, error) {
	key := sessionKey{req.Client, req.Session}
	s.mu.Lock()
	rc := s.sessions[key]
	if rc == nil {
		rc = newReplyCache(s.cfg.ReplyCacheSize, s.cfg.ReplyCacheBytes)
		s.sessions[key] = rc
	}
	s.mu.Unlock()

	e, run, err := rc.begin(req.Seq)
	if err != nil {
		return nil, errCodeEvicted, fmt.Errorf("%w: %v", err, req.Header)
	}
	if run {
		reply := s.h(s.ctx, req)
		rc.finish(req.Seq, e, reply, req.Idempotent)
		return s.unlessClosing(req, reply)
	}
	// A duplicate: wait for the first execution, wherever it runs.
	select {
	case <-e.done:
	case <-sc.qc.Context().Done():
		return nil, errCodeShutdown, errServerShutdown
	case <-s.ctx.Done():
	}
	if s.ctx.Err() != nil {
		// closing, whichever case select took: the first execution's
		// reply may be its handler giving up
		return nil, errCodeShutdown, errServerShutdown
	}
	reply, ok, rerun := rc.result(e)
	if rerun {
		return s.unlessClosing(req, s.h(s.ctx, req))
	}
	if !ok {
		return nil, errCodeEvicted, fmt.Errorf("%w: %v (reply body dropped)", ErrReplyEvicted, req.Header)
	}
	return reply, 0, nil
}
