package metaserver

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/leasefs/leasefs/internal/version"

	"github.com/leasefs/leasefs/internal/clock"
	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/internal/ratelog"
	"github.com/leasefs/leasefs/metaserver/admin"
	"github.com/leasefs/leasefs/metaserver/ownership"
	"github.com/leasefs/leasefs/metaserver/paxosnode"
	"github.com/leasefs/leasefs/metaserver/replica"
	"github.com/leasefs/leasefs/metaserver/store"
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
	// MaxSessions bounds the client sessions (one per client); an open
	// beyond it, when no session is silent, is refused as unavailable.
	MaxSessions int
	Logger      *slog.Logger
	// Clock is the lock manager's clock; nil is clock.Real.
	Clock  clock.Clock
	Faults *transport.Faults
	// PeerFaults, if set, injects faults on the links to the other servers
	// only (tests: cut a server off from its peers while its clients still
	// reach it). While its Cut is on, peer requests are not answered.
	PeerFaults *transport.Faults

	// Cluster mode (package ownership). Peers maps every server of the
	// cluster, this one included, to the HOST:PORT it serves on; nil or
	// just this server is a single server (no PaxosLease at all).
	Peers          map[ids.ServerID]string
	OwnershipLease time.Duration // PaxosLease period T
	// IdleRelease: an inode nobody used (and on which no client holds a
	// lock) for this long is released. A later fresh acquire of it costs a
	// grace of τ(1+δ), so keep it well above T.
	IdleRelease time.Duration
	AntiEntropy time.Duration // how often replicas compare themselves with their peers
	// MaxFileSize, if not zero, is the largest file the server takes, below
	// the protocol's wire.MaxFileSize, which mounts check for themselves
	// (tests: a mount flushing buffered writes the server refuses).
	MaxFileSize uint64
	// Identity, if set, is the cluster identity the server must use (a
	// server joining a cluster): a fresh data directory takes it, one that
	// holds another cluster's identity refuses to start (ErrOtherCluster).
	Identity *transport.Identity
	// Blocks is the block store, "file:DIR" or "s3://BUCKET[/PREFIX]"
	// ("": none), served to mounts on other hosts (and to every mount,
	// for s3) over TLS at BlocksListen (HOST:PORT over TCP; "": Listen's
	// host and port). File data larger than wire.InlineMax lives there.
	Blocks       string
	BlocksListen string
	// S3Endpoint (host:port or an http(s) URL) and S3Region say where an
	// s3 block store is; its credentials come from the AWS environment
	// variables or shared credentials file (blocks.OpenS3Store).
	S3Endpoint, S3Region string
	// OrphanDelay is how old a block no map names must be before the
	// collector deletes it (0: DefaultOrphanDelay): longer than a mount
	// takes from putting a block to committing it.
	OrphanDelay time.Duration

	// gcEvery, if set, is how often the block collector runs (tests;
	// 0: DefaultGCEvery).
	gcEvery time.Duration
	// beforeFetch, if set, is called before anti-entropy copies ino from
	// peer p (tests: hold a copy back to force an interleaving).
	beforeFetch func(p ids.ServerID, ino ids.Ino)
	// statfs, if set, stands for the data directory's file system (tests:
	// a full disk without filling one; store.Options.Statfs).
	statfs func(dir string) (avail, total int64, err error)
}

// ErrOtherCluster: the data directory holds another cluster's identity.
var ErrOtherCluster = errors.New("metaserver: data directory belongs to another cluster")

// DefaultConfig returns DESIGN.md's defaults.
func DefaultConfig() Config {
	return Config{
		Listen:          "127.0.0.1:7420",
		ServerID:        1,
		ClientLease:     2 * time.Second,
		ClockDrift:      0.05,
		DeliveryTimeout: 500 * time.Millisecond,
		MaxSessions:     10_000,
		Logger:          slog.Default(),
		OwnershipLease:  2 * time.Second,
		IdleRelease:     time.Minute,
		AntiEntropy:     10 * time.Second,
	}
}

// clustered reports whether c asks for cluster mode: more than one server.
func (c *Config) clustered() bool { return len(c.Peers) > 1 }

func errUnavailable(format string, a ...any) error {
	return wire.Errf(wire.CodeUnavailable, format, a...)
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
	case c.MaxFileSize > wire.MaxFileSize:
		return fmt.Errorf("metaserver: largest file size must not exceed %d", uint64(wire.MaxFileSize))
	case c.MaxSessions <= 0:
		return errors.New("metaserver: max sessions must be positive")
	}
	if c.Blocks != "" {
		spec, err := parseBlocksSpec(c.Blocks)
		if err != nil {
			return err
		}
		if spec.kind == "s3" && c.S3Endpoint == "" {
			return fmt.Errorf("metaserver: block store %s needs an S3 endpoint", c.Blocks)
		}
	}
	if !c.clustered() {
		return nil
	}
	switch {
	case c.Peers[c.ServerID] == "":
		return fmt.Errorf("metaserver: peers do not include this server (%v)", c.ServerID)
	case c.OwnershipLease <= 0:
		return errors.New("metaserver: ownership lease must be positive")
	case c.IdleRelease != 0 && c.IdleRelease < c.OwnershipLease:
		return errors.New("metaserver: idle release must not be shorter than the ownership lease")
	case c.AntiEntropy <= 0:
		return errors.New("metaserver: anti-entropy period must be positive")
	}
	return nil
}

// session is what the server knows of one client's current session.
type session struct {
	id       ids.SessionID
	client   ids.ClientID
	host     string
	addr     string
	mount    string // the client's mountpoint, as it says
	release  string // the client's leasefs version, as it says
	opened   time.Time
	openSeq  uint64       // the seq of the open that made it (sessions.go)
	lastSeen atomic.Int64 // unix nanoseconds a request last arrived or ended
	active   int          // requests being handled (guarded by Server.mu)

	mu         sync.Mutex
	openHandle map[ids.Ino]int
}

// Server is a running leasefs server.
type Server struct {
	cfg   Config
	log   *slog.Logger
	store *store.Store
	repl  *replica.Replica // the replication layer over store
	id    *transport.Identity
	tr    *transport.Server
	start time.Time

	// running is read-held by every request being handled, so that
	// Close closes the store after them: the transport does not wait for
	// its handlers, and one still running against a closed badger
	// panics ("DB Closed"). closed, under running, turns later ones away.
	running sync.RWMutex
	closed  bool

	mu       sync.Mutex
	sessions map[ids.ClientID]*session
	opens    map[ids.Ino]int // open handles over all sessions, to keep unlinked files
	purging  map[ids.Ino]struct{}
	// writeMu serialises writes per inode (striped): each write updates the
	// inode's attributes, so concurrent writes of one file would only make
	// badger transactions conflict and retry; it also makes an O_APPEND
	// write's size read and write one step.
	writeMu [64]sync.Mutex
	lm      *lockMgr
	owner   *ownership.Owner // nil on a single server
	blocks  *blockServer     // nil without a block store
	stop    chan struct{}    // ends the sweep (sessions.go)
	swept   chan struct{}    // closed when it ended

	counters Counters
	warns    *ratelog.Limiter              // a peer's malformed requests log a few lines, not one each
	metrics  atomic.Pointer[admin.Metrics] // while an admin endpoint runs
}

// Counters are the server's request and lease counters.
type Counters struct {
	Requests, Errors, NacksSent, SessionsOpened atomic.Int64
	// SessionsSwept: sessions of silent clients dropped (sessions.go)
	SessionsSwept atomic.Int64
	// Replayed: resent changes found already applied (store.Store.Applied)
	Replayed atomic.Int64
	// Bytes: request and reply bodies, the sign of bulk data moving
	Bytes atomic.Int64
	// Compactions and CompactedBytes: blocks the server wrote to merge a
	// file's pieces (compact.go), and their bytes
	Compactions, CompactedBytes atomic.Int64
}

// Start opens the store (failing at once if another server uses the data
// directory), loads or creates the cluster identity and listens.
func Start(cfg Config) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, log: cfg.Logger, start: time.Now(), warns: ratelog.New(),
		sessions: map[ids.ClientID]*session{}, opens: map[ids.Ino]int{}, purging: map[ids.Ino]struct{}{},
		stop: make(chan struct{}), swept: make(chan struct{})}
	opts := store.Options{ServerID: cfg.ServerID, Logger: cfg.Logger, MaxFileSize: cfg.MaxFileSize, Statfs: cfg.statfs,
		GarbageDelay: garbageDelay(&cfg)}
	if cfg.clustered() {
		s.owner = ownership.New(ownership.Config{ServerID: cfg.ServerID, Peers: cfg.Peers, Dir: cfg.Dir,
			OwnershipLease: cfg.OwnershipLease, ClientLease: cfg.ClientLease, ClockDrift: cfg.ClockDrift,
			DeliveryTimeout: cfg.DeliveryTimeout, IdleRelease: cfg.IdleRelease, AntiEntropy: cfg.AntiEntropy,
			Faults: cfg.Faults, PeerFaults: cfg.PeerFaults, Logger: cfg.Logger, Clock: cfg.Clock,
			BeforeFetch: cfg.beforeFetch})
		opts.Stamp = replica.Stamp(s.owner.OwnerEpoch)
		opts.Replicate = s.owner.Replicate
		opts.Uncommitted = s.owner.Uncommitted
		opts.OnAllocIno = s.owner.OnAlloc
		opts.NoOrphanPurge = true
	}
	st, err := store.Open(cfg.Dir, opts)
	if err != nil {
		return nil, err
	}
	s.store, s.repl = st, replica.New(st)
	id, created, err := loadIdentity(cfg)
	if err != nil {
		st.Close()
		return nil, err
	}
	s.id = id
	switch {
	case created && cfg.Identity != nil:
		cfg.Logger.Info("joined the cluster: installed its identity in a fresh data directory", "token_file", cfg.Dir+"/token")
	case created:
		cfg.Logger.Info("created cluster identity and token", "token_file", cfg.Dir+"/token")
	}
	s.lm = newLockMgr(s, !created) // a fresh data directory had no clients to wait for
	if cfg.Blocks != "" {
		if s.blocks, err = startBlocks(&cfg, id, &s.metrics); err != nil {
			st.Close()
			return nil, err
		}
		err := s.blocks.guardPuts(st, cfg.Dir)
		if err == nil {
			err = s.convertAtStart()
		}
		if err != nil {
			s.closeBlocks()
			st.Close()
			return nil, err
		}
	}
	s.tr, err = transport.Listen(cfg.Listen, transport.ServerConfig{Identity: id, Logger: cfg.Logger, Faults: cfg.Faults,
		Receiving: s.receiving}, s.serve)
	if err != nil {
		s.closeBlocks()
		st.Close()
		return nil, fmt.Errorf("metaserver: listen on %s: %w", cfg.Listen, err)
	}
	if s.owner != nil {
		minEpoch, err := s.repl.MaxEpoch()
		if err == nil {
			err = s.owner.Start(id, s.repl, ownerLocks{s.lm}, minEpoch)
		}
		if err != nil {
			s.tr.Close()
			s.closeBlocks()
			st.Close()
			return nil, err
		}
	}
	go func() {
		defer close(s.swept)
		s.sweepLoop(s.stop)
	}()
	if s.blocks != nil {
		s.startBlockGC()
		s.log.Info("block store", "blocks", cfg.Blocks, "store_id", s.blocks.wire.StoreID,
			"blocks_listen", s.blocks.ln.Addr().String())
	}
	s.log.Info("serving", "version", version.Get().String(), "listen", s.tr.Addr().String(), "data", cfg.Dir, "server_id", cfg.ServerID)
	return s, nil
}

// loadIdentity loads or creates the data directory's identity, or installs
// cfg.Identity in a fresh one. created reports a fresh data directory.
func loadIdentity(cfg Config) (*transport.Identity, bool, error) {
	if cfg.Identity == nil {
		return transport.LoadOrCreateIdentity(cfg.Dir)
	}
	data, err := os.ReadFile(filepath.Join(cfg.Dir, "identity"))
	switch {
	case err == nil:
		have, err := transport.ParseIdentity(data)
		if err != nil {
			return nil, false, err
		}
		if have.TokenValue() != cfg.Identity.TokenValue() {
			return nil, false, fmt.Errorf("%w: %s holds the identity of cluster %x..., not the given %x...",
				ErrOtherCluster, cfg.Dir, hashPrefix(have), hashPrefix(cfg.Identity))
		}
		id, _, err := transport.LoadOrCreateIdentity(cfg.Dir)
		return id, false, err
	case errors.Is(err, fs.ErrNotExist):
		if err := transport.SaveIdentity(cfg.Dir, cfg.Identity); err != nil {
			return nil, false, err
		}
		id, _, err := transport.LoadOrCreateIdentity(cfg.Dir)
		return id, true, err
	default:
		return nil, false, fmt.Errorf("metaserver: read identity: %w", err)
	}
}

func hashPrefix(id *transport.Identity) []byte {
	h := id.CertHash()
	return h[:4]
}

// Addr is the address clients connect to.
func (s *Server) Addr() net.Addr { return s.tr.Addr() }

// Token is the cluster's join token.
func (s *Server) Token() string { return s.id.Token() }

// Close stops serving and closes the store. In a cluster it is a crash as
// far as ownership goes: held leases run out at the peers.
func (s *Server) Close() error {
	if s.owner != nil {
		s.owner.Close(context.Background(), false)
	}
	select {
	case <-s.stop:
	default:
		close(s.stop)
		<-s.swept
	}
	err := s.tr.Close() // ends the handlers' context: waits give up
	s.closeBlocks()
	// Wait for the requests being handled, a while: one stuck longer is
	// left to fail against the closed store.
	for deadline := time.Now().Add(handlersWait); ; time.Sleep(time.Millisecond) {
		if s.running.TryLock() {
			s.closed = true
			s.running.Unlock()
			break
		}
		if time.Now().After(deadline) {
			s.log.Warn("closing the store with requests still being handled")
			break
		}
	}
	if cerr := s.store.Close(); err == nil {
		err = cerr
	}
	return err
}

// closeBlocks stops the block endpoint, once.
func (s *Server) closeBlocks() {
	if s.blocks != nil {
		s.blocks.close()
	}
}

// handlersWait bounds how long Close waits for requests being handled.
const handlersWait = 5 * time.Second

// serve is the transport's entry point: handle, unless the server closed.
func (s *Server) serve(ctx context.Context, tr *transport.Request) []byte {
	s.running.RLock()
	defer s.running.RUnlock()
	if s.closed {
		return wire.ErrorReply(errUnavailable("server closed")).Append(nil)
	}
	return s.handle(ctx, tr)
}

// Shutdown stops gracefully: in a cluster it first hands every owned inode
// over (so that other servers acquire without waiting for the leases to
// run out), within ctx; then it closes.
func (s *Server) Shutdown(ctx context.Context) error {
	if s.owner != nil {
		s.owner.Close(ctx, true)
	}
	return s.Close()
}

func newSessionID() ids.SessionID {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return ids.SessionID(binary.LittleEndian.Uint64(b[:]) | 1) // never 0: 0 means "no session"
}

// handle answers one request (serve).
func (s *Server) handle(ctx context.Context, tr *transport.Request) []byte {
	if s.owner != nil && paxosnode.IsPeerBody(tr.Body) {
		return s.owner.HandlePeer(ctx, tr)
	}
	if h := s.observed(ctx); h != nil { // admin metrics (adminview.go)
		return h(ctx, tr)
	}
	s.counters.Requests.Add(1)
	s.counters.Bytes.Add(int64(len(tr.Body)))
	if v := wire.BodyVersion(tr.Body); v != wire.Version {
		s.warns.Warn(s.log, peerOf(tr), "request of another leasefs release refused", "client", tr.Client, "wire_version", v, "ours", wire.Version)
		return wire.Refusal(fmt.Sprintf("the server runs leasefs %s, which speaks wire version %d, not %d: run one release on servers and mounts",
			version.Get(), wire.Version, v))
	}
	req, err := wire.ParseRequest(tr.Body)
	if err != nil {
		s.warns.Warn(s.log, peerOf(tr), "malformed request", "client", tr.Client, "err", err)
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
	sess := s.enter(tr.Client, tr.Session)
	if sess == nil {
		s.counters.NacksSent.Add(1)
		return (&wire.Reply{Code: wire.CodeNack, Msg: "unknown session"}).Append(nil)
	}
	defer s.leave(sess)
	s.lm.noteProgress(sess.client, req.Ino)
	var rep *wire.Reply
	if req.Op == wire.OpBatch {
		rep = s.batch(ctx, sess, req)
	} else {
		rep = s.execute(ctx, sess, req)
		s.account(sess, req, rep)
	}
	// Only Data points into the body, and the store copied it (badger's
	// commit, a replica change's clone) before the request returned.
	transport.Recycle(tr.Body)
	s.counters.Bytes.Add(int64(len(rep.Data)))
	if req.Op != wire.OpRead && req.Op != wire.OpLookupBlocks {
		return rep.Append(nil)
	}
	// A read can run again: the transport keeps no copy of its reply,
	// which can then be a pooled buffer too (room for the reply around
	// the data, which the reply copies; ops_data.go, readData).
	tr.Idempotent = true
	out := rep.Append(transport.Buffer(len(rep.Data) + 4<<10)[:0])
	transport.Recycle(rep.Data)
	return out
}

// peerOf is the key under which a request's log lines are limited: the
// address of the connection it came on.
func peerOf(tr *transport.Request) string {
	if tr.Conn == nil {
		return tr.Client.String()
	}
	return ratelog.Peer(tr.Conn.RemoteAddr().String())
}

// account counts a failed request, and logs it if the server, not the
// application, is to blame. An answer a request is asked in order to get
// (normalAnswer) is no failure.
func (s *Server) account(sess *session, req *wire.Request, rep *wire.Reply) {
	switch {
	case normalAnswer(req, rep.Code):
	case rep.Code == wire.CodeIO, rep.Code == wire.CodeAgain, rep.Code == wire.CodeUnavailable:
		// the server's trouble, not the application's: say what happened
		s.counters.Errors.Add(1)
		s.log.Warn("request failed", "client", sess.client, "op", req.Op, "ino", req.Ino, "parent", req.Parent,
			"code", rep.Code, "msg", rep.Msg)
	default:
		s.counters.Errors.Add(1)
	}
}

// normalAnswer reports whether code answers r as the application asked:
// success, or what it probes for. A lookup of a name that does not exist
// (every shell's PATH search, every make), an extended attribute that is
// not set (ls -l asks for two of every file), a create of a name that
// exists (mkdir -p, O_EXCL lock files), a POSIX lock held by another
// (F_SETLK, flock -n) or a wait for one interrupted.
func normalAnswer(r *wire.Request, code wire.Code) bool {
	switch code {
	case wire.CodeOK, wire.CodeRedirect:
		return true
	case wire.CodeNotFound:
		return r.Op == wire.OpLookup
	case wire.CodeNoData:
		return r.Op == wire.OpGetXattr
	case wire.CodeExists:
		return r.Op == wire.OpCreate || r.Op == wire.OpMkdir || r.Op == wire.OpSymlink || r.Op == wire.OpLink
	case wire.CodeAgain, wire.CodeInterrupted:
		return r.Op == wire.OpPosixLock
	}
	return false
}

// batch executes the changes of a wire.OpBatch in order. A change answered
// with a NACK, a redirect or "unavailable" ends the batch with that answer:
// the client sends the whole batch again (to the owner, in a new session),
// and the changes executed before it are answered from their ReqIDs. The
// locks granted for the changes travel in the batch reply, where the
// client applies them as for any reply.
func (s *Server) batch(ctx context.Context, sess *session, req *wire.Request) *wire.Reply {
	subs, err := wire.ParseBatch(req.Data)
	if err != nil {
		s.warns.Warn(s.log, ratelog.Peer(sess.addr), "malformed batch", "client", sess.client, "err", err)
		return wire.ErrorReply(wire.Errf(wire.CodeBadMessage, "%v", err))
	}
	s.counters.Requests.Add(int64(len(subs) - 1)) // the batch counted as one already
	out := &wire.Reply{}
	reps := make([]*wire.Reply, 0, len(subs))
	for _, sub := range subs {
		// a client that followed redirects long enough asks for the batch
		sub.NoRedirect = sub.NoRedirect || req.NoRedirect
		rep := s.execute(ctx, sess, sub)
		s.account(sess, sub, rep)
		switch rep.Code {
		case wire.CodeNack, wire.CodeRedirect, wire.CodeUnavailable:
			rep.Grants = append(out.Grants, rep.Grants...)
			return rep
		}
		out.Grants = append(out.Grants, rep.Grants...)
		rep.Grants = nil
		reps = append(reps, rep)
	}
	out.Data = wire.AppendBatchReplies(nil, reps)
	return out
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
	if s.tr != nil {
		s.tr.ForgetSession(sess.client, sess.id)
	}
}

// openHandle counts n open handles of the session on ino, unless ino is
// being purged (false: it is gone).
func (s *Server) openHandle(sess *session, ino ids.Ino, n int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.purging[ino]; ok {
		return false
	}
	sess.mu.Lock()
	sess.openHandle[ino] += n
	sess.mu.Unlock()
	s.opens[ino] += n
	return true
}

// openedLocally counts the handles a client opened on ino under its data
// lock without asking, reported as it gives the lock up (wire.Reply.Opens).
func (s *Server) openedLocally(c ids.ClientID, ino ids.Ino, n uint32) {
	if n == 0 || ino == 0 || !s.exists(ino) {
		return
	}
	s.mu.Lock()
	sess := s.sessions[c]
	s.mu.Unlock()
	if sess != nil {
		s.openHandle(sess, ino, int(n))
	}
}

// exists reports whether ino is an inode of the store: a client's open
// counts and POSIX locks are kept for those only, not for any number a
// client makes up.
func (s *Server) exists(ino ids.Ino) bool {
	_, err := s.store.GetAttr(ino)
	return err == nil
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
// last handle of an unlinked file.
func (s *Server) closeHandle(ino ids.Ino) {
	s.mu.Lock()
	if s.opens[ino]--; s.opens[ino] > 0 {
		s.mu.Unlock()
		return
	}
	delete(s.opens, ino)
	s.purgeUnlock(ino)
}

// purgeUnlock purges ino, an inode no handle has open if it is unlinked
// (Purge leaves a linked one alone). Called with s.mu held, it releases it
// for the purge, which takes a transaction per 4096 pages of a big file;
// meanwhile an open of ino fails (openHandle), so no handle sees it vanish.
func (s *Server) purgeUnlock(ino ids.Ino) {
	if _, ok := s.purging[ino]; ok {
		s.mu.Unlock()
		return
	}
	s.purging[ino] = struct{}{}
	s.mu.Unlock()
	err := s.store.Purge(ino)
	s.mu.Lock()
	delete(s.purging, ino)
	s.mu.Unlock()
	if err != nil && wire.CodeOf(err) != wire.CodeNotFound {
		s.log.Warn("purge unlinked inode", "ino", ino, "err", err)
	}
}

// receiving notes a client's progress on a big request still arriving
// (a flush a revocation waits for: see lockMgr.deliveryContext).
func (s *Server) receiving(client ids.ClientID, partial []byte) {
	if ino, ok := wire.PeekIno(partial); ok {
		s.lm.noteProgress(client, ino)
	}
}

// unopened reports whether no handle of ino is open: an unlink under an X
// lock on ino (no open can start) may then purge it at once.
func (s *Server) unopened(ino ids.Ino) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.opens[ino] == 0
}

// removed purges an inode that lost its last link, unless it is open.
func (s *Server) removed(a *store.Attr) {
	if a == nil || a.Nlink > 0 || a.Mode&syscall.S_IFMT == syscall.S_IFDIR {
		return
	}
	s.mu.Lock()
	if s.opens[a.Ino] > 0 {
		s.mu.Unlock()
		return
	}
	s.purgeUnlock(a.Ino)
}

func toWire(a store.Attr) *wire.Attr {
	return &wire.Attr{Ino: a.Ino, Mode: a.Mode, Nlink: a.Nlink, Uid: a.Uid, Gid: a.Gid, Rdev: a.Rdev,
		Size: a.Size, Blocks: a.Blocks, Atime: a.Atime, Mtime: a.Mtime, Ctime: a.Ctime, Version: a.Version, Change: a.Change}
}

func attrReply(a store.Attr, err error) *wire.Reply {
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

// BytesMoved returns the request and reply bodies' bytes so far.
func (s *Server) BytesMoved() int64 { return s.counters.Bytes.Load() }
