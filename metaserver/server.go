// Package metaserver is the leasefs server: it authenticates clients over the
// transport, keeps their sessions, and serves file operations from its
// badger store.
package metaserver

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/transport"
	"github.com/leasefs/leasefs/wire"
)

// Config configures a server.
type Config struct {
	Dir             string // data directory: store, identity, token
	Listen          string // HOST:PORT for clients
	ServerID        ids.ServerID
	ClientLease     time.Duration // τ
	ClockDrift      float64       // δ
	DeliveryTimeout time.Duration // how long a callback may go unacknowledged
	Logger          *slog.Logger
	Faults          *transport.Faults
}

// DefaultConfig returns DESIGN.md's defaults.
func DefaultConfig() Config {
	return Config{
		Listen:          "127.0.0.1:7420",
		ServerID:        1,
		ClientLease:     2 * time.Second,
		ClockDrift:      0.05,
		DeliveryTimeout: 500 * time.Millisecond,
		Logger:          slog.Default(),
	}
}

// Validate checks the configuration and how its fields relate.
func (c *Config) Validate() error {
	switch {
	case c.Dir == "":
		return errors.New("metaserver: no data directory")
	case c.Listen == "":
		return errors.New("metaserver: no listen address")
	case c.ServerID == 0:
		return errors.New("metaserver: server id must be 1..255")
	case c.ClientLease <= 0:
		return errors.New("metaserver: client lease must be positive")
	case c.ClockDrift < 0 || c.ClockDrift >= 1:
		return errors.New("metaserver: clock drift must be in [0, 1)")
	case c.DeliveryTimeout <= 0 || c.DeliveryTimeout >= c.ClientLease:
		return errors.New("metaserver: delivery timeout must be positive and shorter than the client lease")
	}
	return nil
}

// session is what the server knows of one client's current session.
type session struct {
	id         ids.SessionID
	client     ids.ClientID
	host       string
	addr       string
	opened     time.Time
	lastSeen   atomic.Int64 // unix nanoseconds of the last request
	mu         sync.Mutex
	openHandle map[ids.Ino]int
}

// Server is a running leasefs server.
type Server struct {
	cfg   Config
	log   *slog.Logger
	store *Store
	id    *transport.Identity
	tr    *transport.Server
	start time.Time

	mu       sync.Mutex
	sessions map[ids.ClientID]*session
	opens    map[ids.Ino]int // open handles over all sessions, to keep unlinked files
	// writeMu serialises writes per inode (striped): each write updates the
	// inode's attributes, so concurrent writes of one file would only make
	// badger transactions conflict and retry; it also makes an O_APPEND
	// write's size read and write one step.
	writeMu [64]sync.Mutex
	lm      *lockMgr

	counters Counters
}

// Counters are the server's request and lease counters.
type Counters struct {
	Requests, Errors, NacksSent, SessionsOpened atomic.Int64
}

// Start opens the store (failing at once if another server uses the data
// directory), loads or creates the cluster identity and listens.
func Start(cfg Config) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	store, err := OpenStore(cfg.Dir, StoreOptions{ServerID: cfg.ServerID, Logger: cfg.Logger})
	if err != nil {
		return nil, err
	}
	id, created, err := transport.LoadOrCreateIdentity(cfg.Dir)
	if err != nil {
		store.Close()
		return nil, err
	}
	if created {
		cfg.Logger.Info("created cluster identity and token", "token_file", cfg.Dir+"/token")
	}
	s := &Server{cfg: cfg, log: cfg.Logger, store: store, id: id, start: time.Now(),
		sessions: map[ids.ClientID]*session{}, opens: map[ids.Ino]int{}}
	s.lm = newLockMgr(s, !created) // a fresh data directory had no clients to wait for
	s.tr, err = transport.Listen(cfg.Listen, transport.ServerConfig{Identity: id, Logger: cfg.Logger, Faults: cfg.Faults}, s.handle)
	if err != nil {
		store.Close()
		return nil, fmt.Errorf("metaserver: listen on %s: %w", cfg.Listen, err)
	}
	s.log.Info("serving", "listen", s.tr.Addr().String(), "data", cfg.Dir, "server_id", cfg.ServerID)
	return s, nil
}

// Addr is the address clients connect to.
func (s *Server) Addr() net.Addr { return s.tr.Addr() }

// Token is the cluster's join token.
func (s *Server) Token() string { return s.id.Token() }

// Close stops serving and closes the store.
func (s *Server) Close() error {
	err := s.tr.Close()
	if cerr := s.store.Close(); err == nil {
		err = cerr
	}
	return err
}

func newSessionID() ids.SessionID {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return ids.SessionID(binary.LittleEndian.Uint64(b[:]) | 1) // never 0: 0 means "no session"
}

// handle is the transport's entry point: one request in, one reply out.
func (s *Server) handle(ctx context.Context, tr *transport.Request) []byte {
	if h := s.observed(ctx); h != nil { // admin metrics (admin.go)
		return h(ctx, tr)
	}
	s.counters.Requests.Add(1)
	req, err := wire.ParseRequest(tr.Body)
	if err != nil {
		s.log.Warn("malformed request", "client", tr.Client, "err", err)
		return wire.ErrorReply(wire.Errf(wire.CodeBadMessage, "%v", err)).Append(nil)
	}
	if s.lm.isFailing(tr.Client) {
		// Burns et al.: while the timer runs every request gets a NACK
		// and nothing else happens for the client.
		s.counters.NacksSent.Add(1)
		return wire.ErrorReply(errNack).Append(nil)
	}
	if req.Op == wire.OpOpenSession {
		return s.openSession(tr, req).Append(nil)
	}
	sess := s.session(tr.Client, tr.Session)
	if sess == nil {
		s.counters.NacksSent.Add(1)
		return (&wire.Reply{Code: wire.CodeNack, Msg: "unknown session"}).Append(nil)
	}
	sess.lastSeen.Store(time.Now().UnixNano())
	rep := s.dispatch(ctx, sess, req)
	if rep.Code != wire.CodeOK {
		s.counters.Errors.Add(1)
	}
	return rep.Append(nil)
}

func (s *Server) session(c ids.ClientID, id ids.SessionID) *session {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sess := s.sessions[c]; sess != nil && sess.id == id {
		return sess
	}
	return nil
}

func (s *Server) openSession(tr *transport.Request, req *wire.Request) *wire.Reply {
	sess := &session{id: newSessionID(), client: tr.Client, host: req.Target, opened: time.Now(),
		openHandle: map[ids.Ino]int{}}
	if tr.Conn != nil {
		sess.addr = tr.Conn.RemoteAddr().String()
	}
	sess.lastSeen.Store(time.Now().UnixNano())
	s.mu.Lock()
	old := s.sessions[tr.Client]
	s.sessions[tr.Client] = sess
	s.mu.Unlock()
	if old != nil {
		s.forgetSession(old)
	}
	// A client opens a session with an empty cache: whatever it held
	// before is free.
	s.lm.forgetClient(tr.Client)
	s.counters.SessionsOpened.Add(1)
	s.log.Info("session opened", "client", tr.Client, "session", sess.id, "host", req.Target, "addr", sess.addr)
	return &wire.Reply{Session: &wire.Session{ID: sess.id, Server: s.cfg.ServerID,
		Tau: int64(s.cfg.ClientLease), Delta: s.cfg.ClockDrift}}
}

// dropSession forgets a client's current session (it timed out).
func (s *Server) dropSession(c ids.ClientID) {
	s.mu.Lock()
	sess := s.sessions[c]
	delete(s.sessions, c)
	s.mu.Unlock()
	if sess != nil {
		s.forgetSession(sess)
	}
}

// forgetSession drops a session's open handles and reply cache.
func (s *Server) forgetSession(sess *session) {
	sess.mu.Lock()
	handles := sess.openHandle
	sess.openHandle = map[ids.Ino]int{}
	sess.mu.Unlock()
	for ino, n := range handles {
		for ; n > 0; n-- {
			s.closeHandle(ino)
		}
	}
	s.tr.ForgetSession(sess.client, sess.id)
}

func (s *Server) openHandle(sess *session, ino ids.Ino) {
	sess.mu.Lock()
	sess.openHandle[ino]++
	sess.mu.Unlock()
	s.mu.Lock()
	s.opens[ino]++
	s.mu.Unlock()
}

// releaseHandle drops one of the session's handles on ino.
func (s *Server) releaseHandle(sess *session, ino ids.Ino) {
	sess.mu.Lock()
	had := sess.openHandle[ino] > 0
	if had {
		if sess.openHandle[ino]--; sess.openHandle[ino] == 0 {
			delete(sess.openHandle, ino)
		}
	}
	sess.mu.Unlock()
	if had {
		s.closeHandle(ino)
	}
}

// closeHandle drops one open handle and purges the inode when it was the
// last handle of an unlinked file. Purges happen under s.mu so that an
// open counted there can never see its inode vanish.
func (s *Server) closeHandle(ino ids.Ino) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.opens[ino]--; s.opens[ino] > 0 {
		return
	}
	delete(s.opens, ino)
	if err := s.store.Purge(ino); err != nil && wire.CodeOf(err) != wire.CodeNotFound {
		s.log.Warn("purge unlinked inode", "ino", ino, "err", err)
	}
}

// removed purges an inode that lost its last link, unless it is open.
func (s *Server) removed(a *Attr) {
	if a == nil || a.Nlink > 0 || a.Mode&syscall.S_IFMT == syscall.S_IFDIR {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.opens[a.Ino] > 0 {
		return
	}
	if err := s.store.Purge(a.Ino); err != nil {
		s.log.Warn("purge unlinked inode", "ino", a.Ino, "err", err)
	}
}

func toWire(a Attr) *wire.Attr {
	return &wire.Attr{Ino: a.Ino, Mode: a.Mode, Nlink: a.Nlink, Uid: a.Uid, Gid: a.Gid, Rdev: a.Rdev,
		Size: a.Size, Blocks: a.Blocks, Atime: a.Atime, Mtime: a.Mtime, Ctime: a.Ctime, Version: a.Version}
}

func attrReply(a Attr, err error) *wire.Reply {
	if err != nil {
		return wire.ErrorReply(err)
	}
	return &wire.Reply{Attr: toWire(a)}
}

func errReply(err error) *wire.Reply {
	if err != nil {
		return wire.ErrorReply(err)
	}
	return &wire.Reply{}
}
