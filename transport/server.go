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
	"os"
	"slices"
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
	// ReplyCacheTotal bounds the reply bytes kept over all sessions
	// (default 256 MiB), dropped oldest first the same way.
	ReplyCacheTotal int
	// MaxBuffered bounds the bytes of request bodies held over all
	// connections (default 256 MiB), MaxBufferedPerConn those of one
	// connection (default 64 MiB): a body is reserved whole before it is
	// read, until its handler returns; one that does not fit waits, and
	// after BodyWait (default 10 s) is refused (ErrBusy, which the client
	// retries).
	MaxBuffered        int64
	MaxBufferedPerConn int64
	BodyWait           time.Duration
	// MaxConns bounds the authenticated connections (default 4096); more
	// are refused (ErrBusy). One client id keeps at most 4: a newer one
	// closes its oldest (a client that moved reconnects before its old
	// connection timed out).
	MaxConns int
	// MaxPending bounds the connections that have not proven the secret
	// yet (default 256): each waits up to 5 s for its hello, and a newer
	// one closes the oldest, so a flood of silent connections cannot lock
	// out a client whose hello follows its handshake at once.
	MaxPending int
	// Receiving, if set, is called with the part of a big request body
	// read so far, every 64 KiB of it: how the server sees a client
	// making progress on a request that takes a while to arrive.
	Receiving func(client ids.ClientID, partial []byte)
}

const (
	defaultReplyCacheSize  = 1024
	defaultReplyCacheBytes = 32 << 20
	defaultReplyCacheTotal = 256 << 20
	defaultMaxBuffered     = 256 << 20
	defaultMaxBufferedConn = 64 << 20
	defaultBodyWait        = 10 * time.Second
	defaultMaxConns        = 4096
	// maxConnsPerClient: connections one client id keeps; more close its
	// oldest.
	maxConnsPerClient = 4
	defaultMaxPending = 256
	// bodyStall: a request body that makes no progress this long is
	// refused, giving back its reservation.
	bodyStall = 10 * time.Second
	// maxCallbackReply bounds a client's answer to a callback (a
	// wire.Reply of a few bytes).
	maxCallbackReply = 64 << 10
	// smallBody: bodies up to this size are reserved without waiting
	// (at most maxStreams of them per connection).
	smallBody = 4 << 10
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

	replies  *replyStore
	bodies   *budget // request bodies held, over all connections
	certHash [32]byte

	mu      sync.Mutex
	closed  bool
	latest  map[ids.ClientID]*ServerConn   // a client's most recent authenticated connection
	byID    map[ids.ClientID][]*ServerConn // a client's connections, oldest first
	conns   map[*ServerConn]struct{}
	pending map[*quic.Conn]uint64 // not authenticated yet: the order they came in
	pendSeq uint64
}

// ServerConn is one authenticated client connection.
type ServerConn struct {
	qc     *quic.Conn
	client ids.ClientID
	host   string
	peer   bool    // proved the cluster's private key (a server)
	bodies *budget // request bodies held on this connection
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
	if cfg.ReplyCacheTotal <= 0 {
		cfg.ReplyCacheTotal = defaultReplyCacheTotal
	}
	if cfg.MaxBuffered <= 0 {
		cfg.MaxBuffered = defaultMaxBuffered
	}
	if cfg.MaxBufferedPerConn <= 0 {
		cfg.MaxBufferedPerConn = defaultMaxBufferedConn
	}
	// every body must fit: one of MaxBody is never refused for its size
	cfg.MaxBuffered = max(cfg.MaxBuffered, MaxBody)
	cfg.MaxBufferedPerConn = max(min(cfg.MaxBufferedPerConn, cfg.MaxBuffered), MaxBody)
	if cfg.BodyWait <= 0 {
		cfg.BodyWait = defaultBodyWait
	}
	if cfg.MaxConns <= 0 {
		cfg.MaxConns = defaultMaxConns
	}
	if cfg.MaxPending <= 0 {
		cfg.MaxPending = defaultMaxPending
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
		replies:  newReplyStore(cfg.ReplyCacheSize, cfg.ReplyCacheBytes, cfg.ReplyCacheTotal),
		bodies:   newBudget(cfg.MaxBuffered),
		certHash: cfg.Identity.CertHash(),
		latest:   make(map[ids.ClientID]*ServerConn),
		byID:     make(map[ids.ClientID][]*ServerConn),
		conns:    make(map[*ServerConn]struct{}),
		pending:  make(map[*quic.Conn]uint64),
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

// OpenSession makes the reply cache of a session the application opened
// for client, before the client learns of it. Requests under sessions
// never opened (a made-up id, one forgotten) get no reply cache: they run
// as they come, for the application to refuse. Requests of a peer server
// (ServerConn.Peer) get one for the sessions they use.
func (s *Server) OpenSession(client ids.ClientID, session ids.SessionID) {
	s.replies.open(sessionKey{client, session})
}

// ForgetSession drops the reply cache of a session (after the lease layer
// forgot it).
func (s *Server) ForgetSession(client ids.ClientID, session ids.SessionID) {
	s.replies.forget(sessionKey{client, session})
}

// ServerStats is what the server holds for its peers.
type ServerStats struct {
	Conns, Pending int // connections authenticated, and waiting for their hello
	// Sessions with a reply cache, the entries and reply bytes they keep
	Sessions, ReplyEntries, ReplyBytes int
	BufferedBytes                      int64 // request bodies reserved (being read, or handled)
}

// Stats returns what the server holds now.
func (s *Server) Stats() ServerStats {
	var st ServerStats
	st.Sessions, st.ReplyEntries, st.ReplyBytes = s.replies.stats()
	st.BufferedBytes = s.bodies.inUse()
	s.mu.Lock()
	st.Conns, st.Pending = len(s.conns), len(s.pending)
	s.mu.Unlock()
	return st
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
		f, err = readFrameMax(st, &head, maxCallbackReply)
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
	if !s.addPending(qc) {
		qc.CloseWithError(closeNormal, "server closing")
		return
	}
	sc, err := s.authenticate(qc)
	s.mu.Lock()
	delete(s.pending, qc)
	s.mu.Unlock()
	if err != nil {
		return
	}
	s.log.Debug("client connected", "client", sc.client, "host", sc.host, "addr", qc.RemoteAddr(), "peer", sc.peer)
	defer func() {
		s.mu.Lock()
		delete(s.conns, sc)
		if s.latest[sc.client] == sc {
			delete(s.latest, sc.client)
		}
		cs := slices.DeleteFunc(s.byID[sc.client], func(c *ServerConn) bool { return c == sc })
		if len(cs) == 0 {
			delete(s.byID, sc.client)
		} else {
			s.byID[sc.client] = cs
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

// addPending counts a connection that has yet to prove the secret,
// closing the oldest such beyond MaxPending; false if the server closed.
// Finding the oldest takes a pass over the pending, only when there are
// too many: during a flood of connections, each of which cost a handshake.
func (s *Server) addPending(qc *quic.Conn) bool {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return false
	}
	var evict *quic.Conn
	if len(s.pending) >= s.cfg.MaxPending {
		first := uint64(0)
		for c, n := range s.pending {
			if evict == nil || n < first {
				evict, first = c, n
			}
		}
		delete(s.pending, evict)
	}
	s.pendSeq++
	s.pending[qc] = s.pendSeq
	s.mu.Unlock()
	if evict != nil {
		evict.CloseWithError(closeProto, "no hello in time")
	}
	return true
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
	// The hello is read at its real size at most: nothing more is taken
	// from a peer that has not proven the secret.
	f, err := readFrameMax(st, &head, maxHello)
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
	sc := &ServerConn{qc: qc, client: f.Client, host: m.host,
		peer: sha256.Sum256(cert.Raw) == s.certHash, bodies: newBudget(s.cfg.MaxBufferedPerConn)}
	if !sc.peer && f.Client != clientIDOf(cert) {
		// The id is the key's: whoever learnt another client's id
		// cannot take over its callbacks or its session.
		s.warns.Warn(s.log, peer, "refused client: id not its key's", "addr", qc.RemoteAddr(), "client", f.Client, "host", m.host)
		return nil, refuse(fmt.Sprintf("client id %v is not the one of the connection's key", f.Client))
	}
	if err := s.admit(sc); err != nil {
		writeFrame(st, &scratch, kindError, f.Header, errorBody(errCodeBusy, err.Error()), nil)
		st.Close()
		qc.CloseWithError(closeNormal, err.Error())
		return nil, err
	}
	if err := writeFrame(st, &scratch, kindHelloOK, f.Header, nil, nil); err != nil {
		qc.CloseWithError(closeProto, "hello reply")
		return nil, err
	}
	st.Close()
	return sc, nil
}

// admit adds an authenticated connection, within MaxConns; beyond
// maxConnsPerClient of its client the oldest of them is closed.
func (s *Server) admit(sc *ServerConn) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return ErrClosed
	}
	if len(s.conns) >= s.cfg.MaxConns {
		s.mu.Unlock()
		s.warns.Warn(s.log, ratelog.Peer(sc.RemoteAddr().String()), "refused client: too many connections", "client", sc.client, "addr", sc.RemoteAddr(), "max", s.cfg.MaxConns)
		return fmt.Errorf("%w: %d connections", ErrBusy, s.cfg.MaxConns)
	}
	cs := s.byID[sc.client]
	var replaced []*ServerConn
	for len(cs) >= maxConnsPerClient && !sc.peer { // servers are trusted
		replaced = append(replaced, cs[0])
		delete(s.conns, cs[0])
		cs = cs[1:]
	}
	s.byID[sc.client] = append(cs, sc)
	s.conns[sc] = struct{}{}
	s.latest[sc.client] = sc
	s.mu.Unlock()
	for _, c := range replaced {
		c.qc.CloseWithError(closeNormal, "replaced by a newer connection of the client")
	}
	return nil
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
	stall := func() { st.SetReadDeadline(time.Now().Add(bodyStall)) }
	for {
		f, n, err := readHead(st, &head, MaxBody)
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
		if err := s.reserve(sc, int64(n)); err != nil {
			if !errors.Is(err, ErrBusy) {
				st.CancelWrite(streamCancel)
				st.CancelRead(streamCancel)
				return
			}
			s.warns.Warn(s.log, ratelog.Peer(sc.RemoteAddr().String()), "request body refused: server busy", "client", sc.client, "addr", sc.RemoteAddr(), "bytes", n)
			fail(f.Header, errCodeBusy, err)
			return
		}
		var body []byte
		if n <= smallBody { // (with its head, mostly: no deadline to set)
			body, err = readBody(st, n, nil, nil)
		} else {
			body, err = readBody(st, n, progress, stall)
			st.SetReadDeadline(time.Time{})
		}
		if err != nil {
			s.unreserve(sc, int64(n))
			if errors.Is(err, os.ErrDeadlineExceeded) {
				s.warns.Warn(s.log, ratelog.Peer(sc.RemoteAddr().String()), "request body stalled", "client", sc.client, "addr", sc.RemoteAddr(), "bytes", n)
			}
			st.CancelWrite(streamCancel)
			st.CancelRead(streamCancel)
			return
		}
		req := &Request{Header: f.Header, Body: body, Conn: sc}
		reply, code, err := s.execute(sc, req, f.oldest)
		s.unreserve(sc, int64(n))
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

// reserve takes n bytes of the connection's and the server's body budgets,
// waiting up to BodyWait: ErrBusy then, another error if the connection
// or the server closed. A small body (a renewal, a lookup) never waits
// behind bulk data: it may overdraw, by at most its stream's share.
func (s *Server) reserve(sc *ServerConn, n int64) error {
	if n <= smallBody {
		sc.bodies.take(n)
		s.bodies.take(n)
		return nil
	}
	ctx, cancel := context.WithTimeout(sc.qc.Context(), s.cfg.BodyWait)
	defer cancel()
	stop := context.AfterFunc(s.ctx, cancel)
	defer stop()
	err := sc.bodies.acquire(ctx, n)
	if err == nil {
		if err = s.bodies.acquire(ctx, n); err != nil {
			sc.bodies.release(n)
		}
	}
	if err != nil && errors.Is(err, context.DeadlineExceeded) && s.ctx.Err() == nil {
		return fmt.Errorf("%w: %d bytes of request bodies held", ErrBusy, s.bodies.inUse())
	}
	return err
}

func (s *Server) unreserve(sc *ServerConn, n int64) {
	s.bodies.release(n)
	sc.bodies.release(n)
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

// execute runs the handler at most once per (client, session, seq) of a
// session with a reply cache; oldest is the client's oldest seq in flight.
func (s *Server) execute(sc *ServerConn, req *Request, oldest uint64) ([]byte, errCode, error) {
	rc := s.replies.lookup(sessionKey{req.Client, req.Session}, sc.peer)
	if rc == nil {
		// a session the application did not open: it refuses the request
		return s.unlessClosing(req, s.h(s.ctx, req))
	}
	e, run, err := s.replies.begin(rc, req.Seq, oldest)
	if err != nil {
		return nil, errCodeEvicted, fmt.Errorf("%w: %v", err, req.Header)
	}
	if run {
		reply := s.h(s.ctx, req)
		s.replies.finish(rc, req.Seq, e, reply, req.Idempotent)
		return s.unlessClosing(req, reply)
	}
	// A duplicate: wait for the first execution, wherever it runs.
	if done := s.replies.wait(e); done != nil {
		select {
		case <-done:
		case <-sc.qc.Context().Done():
			return nil, errCodeShutdown, errServerShutdown
		case <-s.ctx.Done():
		}
	}
	if s.ctx.Err() != nil {
		// closing, whichever case select took: the first execution's
		// reply may be its handler giving up
		return nil, errCodeShutdown, errServerShutdown
	}
	reply, ok, rerun := s.replies.result(e)
	if rerun {
		return s.unlessClosing(req, s.h(s.ctx, req))
	}
	if !ok {
		return nil, errCodeEvicted, fmt.Errorf("%w: %v (reply body dropped)", ErrReplyEvicted, req.Header)
	}
	return reply, 0, nil
}
