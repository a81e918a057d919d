package admin

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
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/leasefs/leasefs/internal/version"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/leasefs/leasefs/internal/clock"
	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/metaserver/ownership"
	"github.com/leasefs/leasefs/transport"
	"github.com/leasefs/leasefs/wire"
)

// Admin errors.
var (
	ErrUnknownClient = errors.New("admin: no such client")
	ErrBadClient     = errors.New("admin: bad client id")
	// ErrNoPeerFaults: peer-cut asked of a server started without peer
	// fault injection.
	ErrNoPeerFaults = errors.New("admin: server started without --peer-faults")
)

// Config configures Serve.
type Config struct {
	Listen string // HOST:PORT; "127.0.0.1:0" picks a free loopback port
	// Refresh is the status page's refresh period (default 2 s), and the
	// trends' sampling period.
	Refresh time.Duration
	// Clock times the trends' sampling (nil: the real clock).
	Clock clock.Clock
	// TokenFile names the file that holds the admin token (DATA/admin-token),
	// for the log.
	TokenFile string
}

// Source is the server an endpoint serves. Its methods are called from
// the endpoint's HTTP handlers, concurrently.
type Source interface {
	Status() Status
	Clients() []ClientInfo
	Locks() []LockInfo
	Owners() []OwnerInfo
	Counters() Counters
	// Checksum reads the whole store.
	Checksum() (ChecksumInfo, error)
	// Evict fails client c at once (ErrUnknownClient if the server has no
	// session of c).
	Evict(c ids.ClientID) (EvictResult, error)
	// CutPeers cuts the links to the other servers (on) or restores them
	// (ErrNoPeerFaults unless the server injects peer faults: tests).
	CutPeers(on bool) error
	// Observe starts feeding m with the server's requests and
	// revocations; stop ends it.
	Observe(m *Metrics) (stop func())
	// Paths says where inos are in the namespace, as far as a scan of at
	// most maxScan directory entries finds them (files keep no pointer to
	// their directories); those it could not place are left out.
	Paths(inos []ids.Ino, maxScan int) map[ids.Ino]PathInfo
	// Inode returns the inode at path (from the root).
	Inode(path string) (PathInfo, error)
}

// PathInfo is where an inode is in the namespace: one path from the root
// (of a hard-linked file, one of its names) and its link count.
type PathInfo struct {
	Ino   ids.Ino `json:"ino"`
	Path  string  `json:"path"`
	Links uint32  `json:"links"`
}

// How many directory entries a path lookup scans at most: for the rows of
// a listing together, and for one inode asked for by itself.
const (
	pathScanRows = 200_000
	pathScanOne  = 10_000_000
)

// Endpoint is a running admin endpoint.
type Endpoint struct {
	src     Source
	log     *slog.Logger
	ln      net.Listener
	http    *http.Server
	refresh time.Duration
	reg     *prometheus.Registry
	m       *Metrics
	stop    func()
	auth    *adminAuth
	trends  *sampler
}

// Metrics are the Prometheus collectors a server feeds while an endpoint
// runs (Source.Observe).
type Metrics struct {
	requests    *prometheus.HistogramVec
	revocations *prometheus.HistogramVec
	blockCalls  *prometheus.HistogramVec
	// for the trends: finer latency buckets than the histogram's, and
	// whole request and reply bodies
	latency           latencyHist
	bytesIn, bytesOut atomic.Int64
}

func newMetrics() *Metrics {
	return &Metrics{requests: prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "leasefs_request_duration_seconds",
		Help:    "Requests served, by operation and result, with their latency.",
		Buckets: prometheus.ExponentialBuckets(50e-6, 4, 10), // 50µs .. 13s
	}, []string{"op", "result"}),
		revocations: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "leasefs_revocation_duration_seconds",
			Help:    "Lock revocation round trips (callback sent to acknowledgement), by result.",
			Buckets: prometheus.ExponentialBuckets(50e-6, 4, 10),
		}, []string{"result"}),
		blockCalls: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "leasefs_block_store_duration_seconds",
			Help:    "Calls the server made to its block store (its own puts and reads, those it serves to mounts, the collector's), by operation and result (ok, error), with their latency.",
			Buckets: prometheus.ExponentialBuckets(50e-6, 4, 10),
		}, []string{"op", "result"})}
}

// Request records one request: its latency d, and the sizes of its body
// and its reply's.
func (m *Metrics) Request(op wire.Op, code wire.Code, d time.Duration, in, out int) {
	m.requests.WithLabelValues(op.String(), code.Short()).Observe(d.Seconds())
	m.latency.observe(d)
	m.bytesIn.Add(int64(in))
	m.bytesOut.Add(int64(out))
}

// BlockStoreCall records one call to the block store (put, read, delete,
// list) by the server, and whether it failed.
func (m *Metrics) BlockStoreCall(op string, failed bool, d time.Duration) {
	result := "ok"
	if failed {
		result = "error"
	}
	m.blockCalls.WithLabelValues(op, result).Observe(d.Seconds())
}

// Revocation records one revocation callback's round trip.
func (m *Metrics) Revocation(d time.Duration, acked bool) {
	result := "acked"
	if !acked {
		result = "delivery-error"
	}
	m.revocations.WithLabelValues(result).Observe(d.Seconds())
}

// Serve starts an admin endpoint for src on cfg.Listen, with the cluster's
// identity id (its certificate, and the admin token derived from its
// secret).
func Serve(cfg Config, src Source, id *transport.Identity, log *slog.Logger) (*Endpoint, error) {
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("admin: listen on %s: %w", cfg.Listen, err)
	}
	a := &Endpoint{src: src, log: log, refresh: cfg.Refresh, reg: prometheus.NewRegistry(), m: newMetrics()}
	if a.refresh <= 0 {
		a.refresh = 2 * time.Second
	}
	if a.auth, err = newAdminAuth(id, log, ln.Addr()); err != nil {
		ln.Close()
		return nil, err
	}
	a.ln = a.auth.listener(ln)
	a.register()
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", a.page)
	mux.HandleFunc("GET /api/status", jsonOf(src.Status))
	mux.HandleFunc("GET /api/clients", jsonOf(src.Clients))
	mux.HandleFunc("GET /api/locks", a.locksAPI)
	mux.HandleFunc("GET /api/locks/summary", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, summarize(src.Locks(), src.Clients()))
	})
	mux.HandleFunc("GET /api/trends", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, a.trends.trends())
	})
	mux.HandleFunc("GET /api/owners", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, withPaths(src, src.Owners(), ownerAt))
	})
	mux.HandleFunc("GET /api/path", a.pathAPI)
	mux.HandleFunc("GET /api/inode", a.inodeAPI)
	mux.HandleFunc("GET /api/counters", jsonOf(src.Counters))
	mux.HandleFunc("GET /api/checksum", func(w http.ResponseWriter, r *http.Request) {
		c, err := src.Checksum()
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
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelDebug)}
	a.stop = src.Observe(a.m)
	a.trends = newSampler(a.refresh, cfg.Clock, a.totals)
	a.trends.start()
	go func() { _ = a.http.Serve(a.ln) }()
	log.Info("admin endpoint", "listen", ln.Addr().String(), "tls", true, "plain_http", a.auth.plain,
		"credential", cfg.TokenFile)
	return a, nil
}

// Addr is the admin endpoint's address.
func (a *Endpoint) Addr() net.Addr { return a.ln.Addr() }

// Close stops the admin endpoint.
func (a *Endpoint) Close() error {
	a.stop()
	a.trends.stop()
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

func (a *Endpoint) evict(w http.ResponseWriter, r *http.Request) {
	c, err := ParseClientID(r.URL.Query().Get("client"))
	if err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
		return
	}
	res, err := a.src.Evict(c)
	switch {
	case errors.Is(err, ErrUnknownClient):
		writeJSON(w, http.StatusNotFound, map[string]string{"error": err.Error()})
	case err != nil:
		writeJSON(w, http.StatusInternalServerError, map[string]string{"error": err.Error()})
	default:
		a.log.Warn("admin: client evicted", "client", c, "remote", r.RemoteAddr)
		writeJSON(w, http.StatusOK, res)
	}
}

// peerCut switches the partition from the other servers on (?on=1) or off
// (?on=0); only on a server started with peer fault injection (tests).
func (a *Endpoint) peerCut(w http.ResponseWriter, r *http.Request) {
	on, err := strconv.ParseBool(r.URL.Query().Get("on"))
	if err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "want ?on=1 or ?on=0"})
		return
	}
	if err := a.src.CutPeers(on); err != nil {
		writeJSON(w, http.StatusConflict, map[string]string{"error": err.Error()})
		return
	}
	a.log.Warn("admin: links to the other servers switched", "cut", on, "remote", r.RemoteAddr)
	writeJSON(w, http.StatusOK, map[string]bool{"cut": on})
}

// ParseClientID accepts "client:0123456789abcdef" (ClientID.String) or the
// bare hex digits.
func ParseClientID(s string) (ids.ClientID, error) {
	v, err := strconv.ParseUint(strings.TrimPrefix(s, "client:"), 16, 64)
	if err != nil || s == "" {
		return 0, fmt.Errorf("%w %q: want client:HEX", ErrBadClient, s)
	}
	return ids.ClientID(v), nil
}

// Snapshots. Client ids are strings in JSON: 64-bit numbers lose precision
// in JavaScript and jq.

// Status is the server's overall state.
type Status struct {
	ServerID    ids.ServerID           `json:"server_id"`
	Version     version.Info           `json:"version"`
	Listen      string                 `json:"listen"`
	Started     time.Time              `json:"started"`
	Uptime      time.Duration          `json:"uptime_ns"`
	CPUs        int                    `json:"cpus"` // GOMAXPROCS (serve --cpus)
	ClientLease time.Duration          `json:"client_lease_ns"`
	ClockDrift  float64                `json:"clock_drift"`
	InGrace     bool                   `json:"in_grace"` // restart grace: no new locks
	Peers       []ownership.PeerStatus `json:"peers"`    // empty: a single server
	Cluster     *ownership.Stats       `json:"cluster,omitempty"`
	StoreLSM    int64                  `json:"store_lsm_bytes"`
	StoreVlog   int64                  `json:"store_vlog_bytes"`
	BlockBytes  int64                  `json:"block_bytes"`      // the block store's blocks
	Blocks      int64                  `json:"blocks"`           // how many
	BlockFree   int64                  `json:"block_free_bytes"` // room left there (-1: unknown)
	// BlockStoreErrors counts the server's calls to its block store that
	// failed (an object store's outage shows here first).
	BlockStoreErrors int64 `json:"block_store_errors"`
	Sessions         int   `json:"sessions"`
	Failing          int   `json:"failing"`
	LockedInodes     int   `json:"locked_inodes"`
}

// ClientInfo is one client as far as the server knows it.
type ClientInfo struct {
	Client  string `json:"client"`
	Session string `json:"session,omitempty"`
	Host    string `json:"host,omitempty"`
	Addr    string `json:"addr,omitempty"`
	// Mountpoint and Version are what the mount said at its session's
	// open; Uptime is the session's age.
	Mountpoint string        `json:"mountpoint,omitempty"`
	Version    string        `json:"version,omitempty"`
	Uptime     time.Duration `json:"uptime_ns"`
	Opened     time.Time     `json:"opened"`
	LastSeen   time.Time     `json:"last_request"`
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
	Path   string  `json:"path,omitempty"` // where found (Source.Paths); empty: not found
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
	Path   string       `json:"path,omitempty"`
	Owner  ids.ServerID `json:"owner"`
	Epoch  ids.Epoch    `json:"epoch"`
	Expiry time.Time    `json:"expiry,omitzero"`
	// Held is how long this epoch has made the server owner, Idle since
	// the inode was last used (cluster only).
	Held time.Duration `json:"held,omitempty"`
	Idle time.Duration `json:"idle,omitempty"`
}

// Counters are the server's counters since start.
type Counters struct {
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
	Replayed       int64 `json:"replayed"`   // resent changes answered without applying them twice
	WireBytes      int64 `json:"wire_bytes"` // request and reply bodies over QUIC
	// blocks written to merge files' small pieces, and their bytes
	Compactions    int64 `json:"compactions"`
	CompactedBytes int64 `json:"compacted_bytes"`
}

// ChecksumInfo is a server's replica checksum: equal on two servers if and
// only if they store the same replicated records.
type ChecksumInfo struct {
	Server   ids.ServerID `json:"server"`
	Checksum string       `json:"checksum"` // hex SHA-256
	Took     string       `json:"took"`
}

// EvictResult answers an eviction.
type EvictResult struct {
	Client  string        `json:"client"`
	StealIn time.Duration `json:"steal_in_ns"`
}

// register adds the server's collectors to a's registry. Gauges and
// counters read the snapshots at scrape time.
func (a *Endpoint) register() {
	s := a.src
	counter := func(name, help string, f func(Counters) int64) {
		a.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help},
			func() float64 { return float64(f(s.Counters())) }))
	}
	counter("leasefs_requests_total", "Requests received (all results).", func(c Counters) int64 { return c.Requests })
	counter("leasefs_request_errors_total", "Requests answered with an error.", func(c Counters) int64 { return c.Errors })
	counter("leasefs_nacks_sent_total", "NACKs sent to failing or unknown clients.", func(c Counters) int64 { return c.NacksSent })
	counter("leasefs_sessions_opened_total", "Client sessions opened.", func(c Counters) int64 { return c.SessionsOpened })
	counter("leasefs_locks_granted_total", "Data locks granted.", func(c Counters) int64 { return c.LocksGranted })
	counter("leasefs_locks_revoked_total", "Data lock revocations sent.", func(c Counters) int64 { return c.LocksRevoked })
	counter("leasefs_locks_stolen_total", "Data locks stolen from timed-out clients.", func(c Counters) int64 { return c.LocksStolen })
	counter("leasefs_clients_failed_total", "Clients failed (revocation unacknowledged or evicted).", func(c Counters) int64 { return c.ClientsFailed })
	counter("leasefs_compactions_total", "Blocks written to merge the small pieces of files.", func(c Counters) int64 { return c.Compactions })
	counter("leasefs_compacted_bytes_total", "Bytes rewritten by compactions.", func(c Counters) int64 { return c.CompactedBytes })
	counter("leasefs_clients_expired_total", "Failed clients whose timer ran out (locks stolen, session forgotten).", func(c Counters) int64 { return c.ClientsExpired })
	counter("leasefs_wire_bytes_total", "Bytes of request and reply bodies over QUIC (file data of files up to 64 KiB included; larger files' data goes to the block store).", func(c Counters) int64 { return c.WireBytes })
	gauge := func(name, help string, f func(Status) float64) {
		a.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help},
			func() float64 { return f(s.Status()) }))
	}
	gauge("leasefs_sessions", "Client sessions the server knows.", func(st Status) float64 { return float64(st.Sessions) })
	gauge("leasefs_failing_clients", "Clients being timed out (NACKed).", func(st Status) float64 { return float64(st.Failing) })
	gauge("leasefs_locked_inodes", "Inodes with data locks held or requested.", func(st Status) float64 { return float64(st.LockedInodes) })
	gauge("leasefs_store_bytes", "Bytes of the metadata store (badger LSM plus value log).", func(st Status) float64 { return float64(st.StoreLSM + st.StoreVlog) })
	gauge("leasefs_block_bytes", "Bytes of file data in the block store (counted every 10 s).", func(st Status) float64 { return float64(st.BlockBytes) })
	gauge("leasefs_blocks", "Blocks in the block store (counted every 10 s).", func(st Status) float64 { return float64(st.Blocks) })
	a.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "leasefs_block_store_errors_total",
		Help: "Calls the server made to its block store that failed."},
		func() float64 { return float64(s.Status().BlockStoreErrors) }))
	gauge("leasefs_block_free_bytes", "Room left in the block store's file system (-1: unknown).", func(st Status) float64 { return float64(st.BlockFree) })
	v := version.Get()
	a.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "leasefs_build_info",
		Help:        "Always 1; the labels say which build runs.",
		ConstLabels: prometheus.Labels{"version": v.Version, "commit": v.Commit, "goversion": v.Go}}, func() float64 { return 1 }))
	a.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	a.reg.MustRegister(a.m.requests, a.m.revocations, a.m.blockCalls)
}

//go:embed status.html
var statusHTML string

var statusTmpl = template.Must(template.New("status").Funcs(template.FuncMap{
	"dur":   func(d time.Duration) string { return d.Round(time.Millisecond).String() },
	"ago":   func(t time.Time) string { return time.Since(t).Round(time.Millisecond).String() + " ago" },
	"until": func(t time.Time) string { return time.Until(t).Round(time.Millisecond).String() },
	"mib":   func(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) },
}).Parse(statusHTML))

// totals reads the counts the trends are made of.
func (a *Endpoint) totals() trendTotals {
	c := a.src.Counters()
	return trendTotals{wall: time.Now(), requests: c.Requests, nacks: c.NacksSent, revocations: c.LocksRevoked,
		bytesIn: a.m.bytesIn.Load(), bytesOut: a.m.bytesOut.Load(), latency: a.m.latency.snapshot()}
}
