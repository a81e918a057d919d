package metaserver

// The admin endpoint: a JSON API, Prometheus metrics and a status page for
// operators (issue 7). It only reads the server's state, under the same
// mutexes the server uses (s.mu for sessions, s.lm.mu for the lock tables,
// never both at once), except for evict, which fails a client exactly as a
// delivery error would.
//
// Endpoints (GET unless noted):
//
//	/                    status page (HTML, refreshes itself)
//	/api/status          AdminStatus
//	/api/clients         []ClientInfo
//	/api/locks           []LockInfo
//	/api/owners          []OwnerInfo
//	/api/counters        AdminCounters
//	/api/checksum        ChecksumInfo (a hash of every replicated record)
//	POST /api/evict?client=ID   EvictResult
//	POST /api/peer-cut?on=1|0   cut the links to the other servers (only with --peer-faults: tests)
//	POST /api/login-link LoginLink: a one-time link that opens the status page in a browser
//	/login?once=NONCE    sets the status page's cookie, once per link
//	/debug/pprof/...     profiles of the server process
//	/metrics             Prometheus text format
//	/healthz             "ok"
//
// # Auth
//
// Everything but /metrics, /healthz and /login needs the admin credential:
// "Authorization: Bearer <admin token>" (DATA/admin-token, or derived from
// the join token by `leasefs admin`), or the cookie a login link sets. The
// join token itself is never accepted. The endpoint speaks TLS with the
// cluster's certificate, which admin clients pin as mounts do; a loopback
// listener also speaks plain HTTP (a browser on the machine; told apart by
// the first byte), and checks the Host header against DNS rebinding. A
// request whose Origin is not the endpoint itself is refused (a web page
// posting to it). See admin_auth.go.

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/locks"
	"github.com/leasefs/leasefs/transport"
	"github.com/leasefs/leasefs/wire"
)

// Admin errors.
var (
	ErrAdminUnknownClient = errors.New("metaserver: admin: no such client")
	ErrAdminBadClient     = errors.New("metaserver: admin: bad client id")
)

// AdminConfig configures ServeAdmin.
type AdminConfig struct {
	Listen string // HOST:PORT; "127.0.0.1:0" picks a free loopback port
	// Refresh is the status page's refresh period (default 2 s).
	Refresh time.Duration
}

// Admin is a running admin endpoint.
type Admin struct {
	s       *Server
	ln      net.Listener
	http    *http.Server
	refresh time.Duration
	reg     *prometheus.Registry
	m       *metrics
	auth    *adminAuth
}

// metrics are the Prometheus collectors a server feeds while an admin
// endpoint is running.
type metrics struct {
	requests    *prometheus.HistogramVec
	revocations *prometheus.HistogramVec
}

func newMetrics() *metrics {
	return &metrics{requests: prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "leasefs_request_duration_seconds",
		Help:    "Requests served, by operation and result, with their latency.",
		Buckets: prometheus.ExponentialBuckets(50e-6, 4, 10), // 50µs .. 13s
	}, []string{"op", "result"}),
		revocations: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "leasefs_revocation_duration_seconds",
			Help:    "Lock revocation round trips (callback sent to acknowledgement), by result.",
			Buckets: prometheus.ExponentialBuckets(50e-6, 4, 10),
		}, []string{"result"})}
}

// observeRevocation records one revocation callback's round trip, if an
// admin endpoint is running.
func (s *Server) observeRevocation(d time.Duration, acked bool) {
	v, ok := servers.Load(s)
	if !ok {
		return
	}
	result := "acked"
	if !acked {
		result = "delivery-error"
	}
	v.(*metrics).revocations.WithLabelValues(result).Observe(d.Seconds())
}

// observe records one request.
func (m *metrics) observe(op wire.Op, code wire.Code, d time.Duration) {
	m.requests.WithLabelValues(op.String(), code.String()).Observe(d.Seconds())
}

// servers maps a Server to its metrics while an admin endpoint runs: Server
// has no field for them and server.go is not ours to grow.
var servers sync.Map // *Server -> *metrics

type observedKey struct{}

// observed returns a handler that times s.handle and records it, or nil when
// no admin endpoint runs or ctx is already inside it. handle() calls it first:
//
//	if h := s.observed(ctx); h != nil { return h(ctx, tr) }
func (s *Server) observed(ctx context.Context) transport.Handler {
	v, ok := servers.Load(s)
	if !ok || ctx.Value(observedKey{}) != nil {
		return nil
	}
	m := v.(*metrics)
	return func(ctx context.Context, tr *transport.Request) []byte {
		// The op is the request's second byte and the result the reply's
		// u16 after the version byte (wire.Request/Reply.Append). The op
		// is read first: handle may give the body back for reuse.
		op, code := wire.Op(0), wire.CodeBadMessage
		if len(tr.Body) > 1 {
			op = wire.Op(tr.Body[1])
		}
		start := time.Now()
		out := s.handle(context.WithValue(ctx, observedKey{}, true), tr)
		if len(out) > 2 {
			code = wire.Code(uint16(out[1]) | uint16(out[2])<<8)
		}
		m.observe(op, code, time.Since(start))
		return out
	}
}

// ServeAdmin starts the admin endpoint on cfg.Listen.
func (s *Server) ServeAdmin(cfg AdminConfig) (*Admin, error) {
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("metaserver: admin listen on %s: %w", cfg.Listen, err)
	}
	a := &Admin{s: s, refresh: cfg.Refresh, reg: prometheus.NewRegistry(), m: newMetrics()}
	if a.refresh <= 0 {
		a.refresh = 2 * time.Second
	}
	if a.auth, err = newAdminAuth(s, ln.Addr()); err != nil {
		ln.Close()
		return nil, err
	}
	a.ln = a.auth.listener(ln)
	a.register()
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", a.page)
	mux.HandleFunc("GET /api/status", jsonOf(a.s.AdminStatus))
	mux.HandleFunc("GET /api/clients", jsonOf(a.s.AdminClients))
	mux.HandleFunc("GET /api/locks", jsonOf(a.s.AdminLocks))
	mux.HandleFunc("GET /api/owners", jsonOf(a.s.AdminOwners))
	mux.HandleFunc("GET /api/counters", jsonOf(a.s.AdminCounters))
	mux.HandleFunc("GET /api/checksum", func(w http.ResponseWriter, r *http.Request) {
		c, err := a.s.AdminChecksum()
		if err != nil {
			writeJSON(w, http.StatusInternalServerError, map[string]string{"error": err.Error()})
			return
		}
		writeJSON(w, http.StatusOK, c)
	})
	mux.HandleFunc("POST /api/evict", a.evict)
	mux.HandleFunc("POST /api/peer-cut", a.peerCut)
	mux.HandleFunc("POST /api/login-link", a.auth.loginLink)
	mux.HandleFunc("GET /login", a.auth.login)
	mux.Handle("GET /metrics", promhttp.HandlerFor(a.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = io.WriteString(w, "ok\n")
	})
	// Profiles of the server process, behind the credential as the rest
	// (curl -k -H "Authorization: Bearer $(cat DATA/admin-token)" https://ADMIN/debug/pprof/profile).
	mux.HandleFunc("GET /debug/pprof/", pprof.Index)
	mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
	a.http = &http.Server{Handler: a.auth.guard(mux), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: time.Minute,
		ErrorLog: slog.NewLogLogger(s.log.Handler(), slog.LevelDebug)}
	servers.Store(s, a.m)
	go func() { _ = a.http.Serve(a.ln) }()
	s.log.Info("admin endpoint", "listen", ln.Addr().String(), "tls", true, "plain_http", a.auth.plain,
		"credential", filepath.Join(s.cfg.Dir, "admin-token"))
	return a, nil
}

// Addr is the admin endpoint's address.
func (a *Admin) Addr() net.Addr { return a.ln.Addr() }

// Close stops the admin endpoint.
func (a *Admin) Close() error {
	servers.CompareAndDelete(a.s, a.m)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	return a.http.Shutdown(ctx)
}

func isLoopback(addr net.Addr) bool {
	ta, ok := addr.(*net.TCPAddr)
	return ok && ta.IP.IsLoopback()
}

func jsonOf[T any](f func() T) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) { writeJSON(w, http.StatusOK, f()) }
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

func (a *Admin) evict(w http.ResponseWriter, r *http.Request) {
	c, err := ParseClientID(r.URL.Query().Get("client"))
	if err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
		return
	}
	res, err := a.s.Evict(c)
	switch {
	case errors.Is(err, ErrAdminUnknownClient):
		writeJSON(w, http.StatusNotFound, map[string]string{"error": err.Error()})
	case err != nil:
		writeJSON(w, http.StatusInternalServerError, map[string]string{"error": err.Error()})
	default:
		a.s.log.Warn("admin: client evicted", "client", c, "remote", r.RemoteAddr)
		writeJSON(w, http.StatusOK, res)
	}
}

// peerCut switches the partition from the other servers on (?on=1) or off
// (?on=0); only on a server started with peer fault injection (tests).
func (a *Admin) peerCut(w http.ResponseWriter, r *http.Request) {
	f := a.s.cfg.PeerFaults
	if f == nil {
		writeJSON(w, http.StatusConflict, map[string]string{"error": "server started without --peer-faults"})
		return
	}
	on, err := strconv.ParseBool(r.URL.Query().Get("on"))
	if err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "want ?on=1 or ?on=0"})
		return
	}
	f.Cut(on)
	a.s.log.Warn("admin: links to the other servers switched", "cut", on, "remote", r.RemoteAddr)
	writeJSON(w, http.StatusOK, map[string]bool{"cut": on})
}

// ParseClientID accepts "client:0123456789abcdef" (ClientID.String) or the
// bare hex digits.
func ParseClientID(s string) (ids.ClientID, error) {
	v, err := strconv.ParseUint(strings.TrimPrefix(s, "client:"), 16, 64)
	if err != nil || s == "" {
		return 0, fmt.Errorf("%w %q: want client:HEX", ErrAdminBadClient, s)
	}
	return ids.ClientID(v), nil
}

// Snapshots. Client ids are strings in JSON: 64-bit numbers lose precision
// in JavaScript and jq.

// AdminStatus is the server's overall state.
type AdminStatus struct {
	ServerID     ids.ServerID  `json:"server_id"`
	Listen       string        `json:"listen"`
	Started      time.Time     `json:"started"`
	Uptime       time.Duration `json:"uptime_ns"`
	CPUs         int           `json:"cpus"` // GOMAXPROCS (serve --cpus)
	ClientLease  time.Duration `json:"client_lease_ns"`
	ClockDrift   float64       `json:"clock_drift"`
	InGrace      bool          `json:"in_grace"` // restart grace: no new locks
	Peers        []PeerStatus  `json:"peers"`    // empty: a single server
	Cluster      *ClusterStats `json:"cluster,omitempty"`
	StoreLSM     int64         `json:"store_lsm_bytes"`
	StoreVlog    int64         `json:"store_vlog_bytes"`
	Sessions     int           `json:"sessions"`
	Failing      int           `json:"failing"`
	LockedInodes int           `json:"locked_inodes"`
}

// PeerStatus is one other server of the cluster (none on a single server).
// Reachable: its last peer call succeeded.
type PeerStatus struct {
	ID        ids.ServerID `json:"id"`
	Addr      string       `json:"addr"`
	Reachable bool         `json:"reachable"`
	LastOK    time.Time    `json:"last_ok,omitzero"`
}

// ClientInfo is one client as far as the server knows it.
type ClientInfo struct {
	Client   string    `json:"client"`
	Session  string    `json:"session,omitempty"`
	Host     string    `json:"host,omitempty"`
	Addr     string    `json:"addr,omitempty"`
	Opened   time.Time `json:"opened"`
	LastSeen time.Time `json:"last_request"`
	// State is "normal" (stateless serving: no timer), or "failing" with
	// FailingLeft until its locks are stolen. Forgotten clients are gone
	// from the server and so from this list.
	State       string        `json:"state"`
	FailingLeft time.Duration `json:"failing_left_ns,omitempty"`
	DataLocks   int           `json:"data_locks"`
	OpenFiles   int           `json:"open_files"`
}

// LockInfo is one lock or queued request on an inode.
type LockInfo struct {
	Ino    ids.Ino `json:"ino"`
	Path   string  `json:"path,omitempty"` // not tracked yet: inodes have no parent pointer
	Kind   string  `json:"kind"`           // "data", "flock" or "fcntl"
	Mode   string  `json:"mode"`           // S/X for data locks, read/write for POSIX locks
	Client string  `json:"client"`
	// Waiting is a queued request rather than a held lock.
	Waiting bool `json:"waiting,omitempty"`
	// Revoking is the mode a held data lock is being revoked down to.
	Revoking string `json:"revoking,omitempty"`
	Range    string `json:"range,omitempty"` // fcntl byte range
}

// OwnerInfo is an inode's ownership. With a single server every inode in
// use is owned by it at epoch 0 without a PaxosLease, so Expiry is zero.
type OwnerInfo struct {
	Ino    ids.Ino      `json:"ino"`
	Owner  ids.ServerID `json:"owner"`
	Epoch  ids.Epoch    `json:"epoch"`
	Expiry time.Time    `json:"expiry,omitzero"`
	// Held is how long this epoch has made the server owner, Idle since
	// the inode was last used (cluster only).
	Held time.Duration `json:"held,omitempty"`
	Idle time.Duration `json:"idle,omitempty"`
}

// AdminCounters are the server's counters since start.
type AdminCounters struct {
	Requests       int64 `json:"requests"`
	Errors         int64 `json:"errors"`
	NacksSent      int64 `json:"nacks_sent"`
	SessionsOpened int64 `json:"sessions_opened"`
	LocksGranted   int64 `json:"locks_granted"`
	LocksRevoked   int64 `json:"locks_revoked"`
	LocksStolen    int64 `json:"locks_stolen"`
	ClientsFailed  int64 `json:"clients_failed"`
	ClientsExpired int64 `json:"clients_expired"`
	DeliveryErrors int64 `json:"delivery_errors"`
	Replayed       int64 `json:"replayed"` // resent changes answered without applying them twice
}

// AdminStatus returns the server's state.
func (s *Server) AdminStatus() AdminStatus {
	lsm, vlog := s.store.Size()
	st := AdminStatus{ServerID: s.cfg.ServerID, Listen: s.Addr().String(), Started: s.start,
		Uptime: time.Since(s.start).Round(time.Millisecond), CPUs: runtime.GOMAXPROCS(0), ClientLease: s.cfg.ClientLease,
		ClockDrift: s.cfg.ClockDrift, Peers: []PeerStatus{}, StoreLSM: lsm, StoreVlog: vlog}
	if s.cl != nil {
		st.Peers = s.cl.peerStatus()
		cs := s.cl.Stats()
		st.Cluster = &cs
	}
	s.mu.Lock()
	st.Sessions = len(s.sessions)
	s.mu.Unlock()
	s.lm.mu.Lock()
	st.Failing = s.lm.failing.Len()
	st.LockedInodes = len(s.lm.data.All())
	_, st.InGrace = s.lm.data.InGrace()
	s.lm.mu.Unlock()
	return st
}

// AdminClients returns every client with a session or a failing timer, in
// client id order.
func (s *Server) AdminClients() []ClientInfo {
	byID := map[ids.ClientID]*ClientInfo{}
	s.mu.Lock()
	sessions := make([]*session, 0, len(s.sessions))
	for _, sess := range s.sessions {
		sessions = append(sessions, sess)
	}
	s.mu.Unlock()
	for _, sess := range sessions {
		sess.mu.Lock()
		open := 0
		for _, n := range sess.openHandle {
			open += n
		}
		sess.mu.Unlock()
		byID[sess.client] = &ClientInfo{Client: sess.client.String(), Session: sess.id.String(), Host: sess.host,
			Addr: sess.addr, Opened: sess.opened, LastSeen: time.Unix(0, sess.lastSeen.Load()),
			State: "normal", OpenFiles: open}
	}
	s.lm.mu.Lock()
	now := s.lm.clk.Now()
	for _, c := range s.lm.failing.Clients() {
		ci := byID[c]
		if ci == nil {
			ci = &ClientInfo{Client: c.String()}
			byID[c] = ci
		}
		ci.State = "failing"
		ci.FailingLeft, _ = s.lm.failing.Remaining(c, now)
	}
	for c, ci := range byID {
		ci.DataLocks = len(s.lm.data.HeldBy(c))
	}
	s.lm.mu.Unlock()
	keys := make([]ids.ClientID, 0, len(byID))
	for c := range byID {
		keys = append(keys, c)
	}
	slices.Sort(keys)
	out := make([]ClientInfo, 0, len(keys))
	for _, c := range keys {
		out = append(out, *byID[c])
	}
	return out
}

// AdminLocks returns every data lock, POSIX lock and queued request, in
// inode order.
func (s *Server) AdminLocks() []LockInfo {
	// POSIX locks need an open file, so the open inodes cover them; the
	// POSIX table has no iterator of its own.
	s.mu.Lock()
	inos := make([]ids.Ino, 0, len(s.opens))
	for ino := range s.opens {
		inos = append(inos, ino)
	}
	s.mu.Unlock()
	out := []LockInfo{}
	s.lm.mu.Lock()
	defer s.lm.mu.Unlock()
	for _, il := range s.lm.data.All() {
		inos = append(inos, il.Ino)
		for _, h := range il.Holders {
			li := LockInfo{Ino: il.Ino, Kind: "data", Mode: h.Mode.String(), Client: h.Client.String()}
			if h.Revoking != h.Mode {
				li.Revoking = h.Revoking.String()
			}
			out = append(out, li)
		}
		for _, w := range il.Waiters {
			out = append(out, LockInfo{Ino: il.Ino, Kind: "data", Mode: w.Mode.String(), Client: w.Client.String(), Waiting: true})
		}
	}
	slices.Sort(inos)
	for _, ino := range slices.Compact(inos) {
		for _, lk := range s.lm.posix.Locks(ino) {
			out = append(out, posixInfo(ino, lk, false))
		}
		for _, g := range s.lm.posix.Waiting(ino) {
			out = append(out, posixInfo(ino, g.Lock, true))
		}
	}
	slices.SortStableFunc(out, func(a, b LockInfo) int {
		switch {
		case a.Ino < b.Ino:
			return -1
		case a.Ino > b.Ino:
			return 1
		}
		return 0
	})
	return out
}

func posixInfo(ino ids.Ino, lk locks.PosixLock, waiting bool) LockInfo {
	li := LockInfo{Ino: ino, Kind: "fcntl", Mode: lk.Type.String(), Client: lk.Owner.Client.String(), Waiting: waiting}
	if lk.Flock {
		li.Kind = "flock"
	} else if lk.End == locks.ToEOF {
		li.Range = fmt.Sprintf("%d-EOF", lk.Start)
	} else {
		li.Range = fmt.Sprintf("%d-%d", lk.Start, lk.End)
	}
	return li
}

// AdminOwners returns the ownership of every inode with locks. A single
// server owns every inode itself, at epoch 0, without expiry; a cluster
// server lists the PaxosLeases it holds.
func (s *Server) AdminOwners() []OwnerInfo {
	out := []OwnerInfo{}
	if s.cl != nil {
		n := s.cl.node.Load()
		if n == nil {
			return out
		}
		now := time.Now()
		s.cl.mu.Lock()
		allocated, aheadTo := s.cl.allocated, s.cl.aheadTo
		s.cl.mu.Unlock()
		for _, o := range n.Owned() {
			if allocated < o.Ino && o.Ino < aheadTo {
				continue // acquired ahead of its allocation: no inode yet
			}
			out = append(out, OwnerInfo{Ino: o.Ino, Owner: s.cfg.ServerID, Epoch: o.Epoch, Expiry: now.Add(o.Left),
				Held: o.Held.Round(time.Millisecond), Idle: o.Idle.Round(time.Millisecond)})
		}
		slices.SortFunc(out, func(a, b OwnerInfo) int { return cmpIno(a.Ino, b.Ino) })
		return out
	}
	var last ids.Ino
	for _, l := range s.AdminLocks() {
		if l.Ino != last {
			out = append(out, OwnerInfo{Ino: l.Ino, Owner: s.cfg.ServerID})
			last = l.Ino
		}
	}
	return out
}

// ChecksumInfo is a server's replica checksum: equal on two servers if and
// only if they store the same replicated records.
type ChecksumInfo struct {
	Server   ids.ServerID `json:"server"`
	Checksum string       `json:"checksum"` // hex SHA-256
	Took     string       `json:"took"`
}

// AdminChecksum computes the replica checksum (reads the whole store).
func (s *Server) AdminChecksum() (ChecksumInfo, error) {
	start := time.Now()
	sum, err := s.store.Checksum()
	if err != nil {
		return ChecksumInfo{}, err
	}
	return ChecksumInfo{Server: s.cfg.ServerID, Checksum: fmt.Sprintf("%x", sum),
		Took: time.Since(start).Round(time.Microsecond).String()}, nil
}

// AdminCounters returns the counters.
func (s *Server) AdminCounters() AdminCounters {
	c := AdminCounters{Requests: s.counters.Requests.Load(), Errors: s.counters.Errors.Load(),
		NacksSent: s.counters.NacksSent.Load(), SessionsOpened: s.counters.SessionsOpened.Load(),
		Replayed: s.counters.Replayed.Load()}
	s.lm.mu.Lock()
	st, fs := s.lm.stats, s.lm.failing.Stats()
	s.lm.mu.Unlock()
	c.LocksGranted, c.LocksRevoked, c.LocksStolen = st.Granted, st.Revoked, st.Stolen
	c.ClientsFailed, c.DeliveryErrors, c.ClientsExpired = st.ClientsFailed, st.DeliveryErrors, int64(fs.Expired)
	return c
}

// EvictResult answers an eviction.
type EvictResult struct {
	Client  string        `json:"client"`
	StealIn time.Duration `json:"steal_in_ns"`
}

// Evict fails client c at once, as a delivery error would: it gets NACKs
// from now on and its locks are stolen after τ(1+δ).
func (s *Server) Evict(c ids.ClientID) (EvictResult, error) {
	s.mu.Lock()
	_, known := s.sessions[c]
	s.mu.Unlock()
	if !known {
		return EvictResult{}, fmt.Errorf("%w: %v", ErrAdminUnknownClient, c)
	}
	s.lm.fail(c, "evicted by admin")
	s.lm.mu.Lock()
	left, _ := s.lm.failing.Remaining(c, s.lm.clk.Now())
	s.lm.mu.Unlock()
	return EvictResult{Client: c.String(), StealIn: left}, nil
}

// register adds the server's collectors to a's registry. Gauges and
// counters read the snapshots at scrape time.
func (a *Admin) register() {
	s := a.s
	counter := func(name, help string, f func(AdminCounters) int64) {
		a.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help},
			func() float64 { return float64(f(s.AdminCounters())) }))
	}
	counter("leasefs_requests_total", "Requests received (all results).", func(c AdminCounters) int64 { return c.Requests })
	counter("leasefs_request_errors_total", "Requests answered with an error.", func(c AdminCounters) int64 { return c.Errors })
	counter("leasefs_nacks_sent_total", "NACKs sent to failing or unknown clients.", func(c AdminCounters) int64 { return c.NacksSent })
	counter("leasefs_sessions_opened_total", "Client sessions opened.", func(c AdminCounters) int64 { return c.SessionsOpened })
	counter("leasefs_locks_granted_total", "Data locks granted.", func(c AdminCounters) int64 { return c.LocksGranted })
	counter("leasefs_locks_revoked_total", "Data lock revocations sent.", func(c AdminCounters) int64 { return c.LocksRevoked })
	counter("leasefs_locks_stolen_total", "Data locks stolen from timed-out clients.", func(c AdminCounters) int64 { return c.LocksStolen })
	counter("leasefs_clients_failed_total", "Clients failed (revocation unacknowledged or evicted).", func(c AdminCounters) int64 { return c.ClientsFailed })
	counter("leasefs_clients_expired_total", "Failed clients whose timer ran out (locks stolen, session forgotten).", func(c AdminCounters) int64 { return c.ClientsExpired })
	gauge := func(name, help string, f func(AdminStatus) float64) {
		a.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help},
			func() float64 { return f(s.AdminStatus()) }))
	}
	gauge("leasefs_sessions", "Client sessions the server knows.", func(st AdminStatus) float64 { return float64(st.Sessions) })
	gauge("leasefs_failing_clients", "Clients being timed out (NACKed).", func(st AdminStatus) float64 { return float64(st.Failing) })
	gauge("leasefs_locked_inodes", "Inodes with data locks held or requested.", func(st AdminStatus) float64 { return float64(st.LockedInodes) })
	gauge("leasefs_store_bytes", "Bytes stored (badger LSM plus value log).", func(st AdminStatus) float64 { return float64(st.StoreLSM + st.StoreVlog) })
	a.reg.MustRegister(a.m.requests, a.m.revocations)
}

//go:embed status.html
var statusHTML string

var statusTmpl = template.Must(template.New("status").Funcs(template.FuncMap{
	"dur": func(d time.Duration) string { return d.Round(time.Millisecond).String() },
	"ago": func(t time.Time) string { return time.Since(t).Round(time.Millisecond).String() + " ago" },
	"mib": func(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) },
}).Parse(statusHTML))

func (a *Admin) page(w http.ResponseWriter, r *http.Request) {
	data := struct {
		Status   AdminStatus
		Clients  []ClientInfo
		Locks    []LockInfo
		Owners   []OwnerInfo
		Counters AdminCounters
		Refresh  int
		Now      time.Time
	}{a.s.AdminStatus(), a.s.AdminClients(), a.s.AdminLocks(), a.s.AdminOwners(), a.s.AdminCounters(),
		max(1, int(a.refresh/time.Second)), time.Now()}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	if err := statusTmpl.Execute(w, data); err != nil {
		a.s.log.Warn("admin: render status page", "err", err)
	}
}
