package metaserver

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/metaserver/admin"
	"github.com/leasefs/leasefs/wire"
)

// syncBuf is a log sink tests can read while the server writes.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// startAdminServer runs a server with a short lease (so eviction completes
// quickly) and an admin endpoint on loopback.
func startAdminServer(t *testing.T, acfg admin.Config) (*Server, *admin.Endpoint, *syncBuf) {
	t.Helper()
	logs := &syncBuf{}
	cfg := DefaultConfig()
	cfg.Dir = t.TempDir()
	cfg.Listen = "127.0.0.1:0"
	cfg.ClientLease = 300 * time.Millisecond
	cfg.DeliveryTimeout = 100 * time.Millisecond
	cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
	s, err := Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	acfg.Listen = "127.0.0.1:0"
	a, err := s.ServeAdmin(acfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	return s, a, logs
}

func adminGet(t *testing.T, a *admin.Endpoint, method, path, token string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, "http://"+a.Addr().String()+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

func adminJSON[T any](t *testing.T, s *Server, a *admin.Endpoint, path string) T {
	t.Helper()
	code, b := adminGet(t, a, "GET", path, adminToken(s))
	if code != 200 {
		t.Fatalf("GET %s: %d %s", path, code, b)
	}
	var v T
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("GET %s: %v\n%s", path, err, b)
	}
	return v
}

// adminToken is the admin credential of s.
func adminToken(s *Server) string { return s.id.TokenValue().Admin().String() }

func findClient(cs []admin.ClientInfo, c ids.ClientID) *admin.ClientInfo {
	for i := range cs {
		if cs[i].Client == c.String() {
			return &cs[i]
		}
	}
	return nil
}

// TestAdminAPI drives two clients and checks each endpoint against what
// they did, then evicts one and watches it recover while the other works.
func TestAdminAPI(t *testing.T) {
	s, a, logs := startAdminServer(t, admin.Config{})
	tok := adminToken(s)
	c1, c2 := connect(t, s), connect(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	fa, err := c1.Create(ctx, ids.RootIno, "a", 0o100644, 0, 0, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	// O_TRUNC: an open the server counts (under a lock the client holds,
	// others are made locally)
	if _, err := c1.Open(ctx, fa.Ino, syscall.O_RDWR|syscall.O_TRUNC); err != nil {
		t.Fatal(err)
	}
	if _, err := c1.Write(ctx, fa.Ino, 0, []byte("hello"), false, false); err != nil {
		t.Fatal(err)
	}
	if _, err := c1.PosixLock(ctx, fa.Ino, wire.PosixLk{Flock: true, Type: syscall.F_WRLCK, Owner: 77, Pid: 1234}); err != nil {
		t.Fatal(err)
	}
	fb, err := c2.Create(ctx, ids.RootIno, "b", 0o100644, 0, 0, 0, 0)
	if err != nil {
		t.Fatal(err)
	}

	st := adminJSON[admin.Status](t, s, a, "/api/status")
	if st.ServerID != 1 || st.Sessions != 2 || st.Failing != 0 || st.Listen != s.Addr().String() || len(st.Peers) != 0 {
		t.Errorf("status: %+v", st)
	}

	cs := adminJSON[[]admin.ClientInfo](t, s, a, "/api/clients")
	if len(cs) != 2 {
		t.Fatalf("clients: %+v", cs)
	}
	i1, i2 := findClient(cs, c1.ID()), findClient(cs, c2.ID())
	if i1 == nil || i2 == nil {
		t.Fatalf("clients %+v lack %v or %v", cs, c1.ID(), c2.ID())
	}
	if i1.State != "normal" || i1.OpenFiles != 1 || i1.DataLocks < 1 || i1.Session != c1.Session().ID.String() || i1.Addr == "" {
		t.Errorf("client 1: %+v", *i1)
	}
	if i2.OpenFiles != 0 || time.Since(i2.LastSeen) > 10*time.Second {
		t.Errorf("client 2: %+v", *i2)
	}

	ls := adminJSON[admin.LockPage](t, s, a, "/api/locks").Locks
	var flock, dataA, dataB bool
	for _, l := range ls {
		switch {
		case l.Ino == fa.Ino && l.Kind == "flock" && l.Mode == "write" && l.Client == c1.ID().String() && !l.Waiting:
			flock = true
		case l.Ino == fa.Ino && l.Kind == "data" && l.Client == c1.ID().String():
			dataA = true
		case l.Ino == fb.Ino && l.Kind == "data" && l.Client == c2.ID().String():
			dataB = true
		}
	}
	if !flock || !dataA || !dataB {
		t.Errorf("locks (flock %v, data a %v, data b %v): %+v", flock, dataA, dataB, ls)
	}

	owners := adminJSON[[]admin.OwnerInfo](t, s, a, "/api/owners")
	found := false
	for _, o := range owners {
		if o.Owner != 1 || o.Epoch != 0 {
			t.Errorf("owner %+v: want server 1, epoch 0", o)
		}
		found = found || o.Ino == fa.Ino
	}
	if !found {
		t.Errorf("owners %+v lack %v", owners, fa.Ino)
	}

	ctr := adminJSON[admin.Counters](t, s, a, "/api/counters")
	if ctr.SessionsOpened != 2 || ctr.Requests < 6 || ctr.LocksGranted < 2 || ctr.ClientsFailed != 0 || ctr.NacksSent != 0 {
		t.Errorf("counters: %+v", ctr)
	}

	// A conflicting request makes the server revoke c1's lock on a.
	if _, err := c2.Read(ctx, fa.Ino, 0, make([]byte, 5)); err != nil {
		t.Fatal(err)
	}

	// Metrics in the Prometheus text format.
	code, body := adminGet(t, a, "GET", "/metrics", "")
	if code != 200 {
		t.Fatalf("/metrics: %d", code)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		t.Fatalf("parse /metrics: %v\n%s", err, body)
	}
	if g := fams["leasefs_sessions"]; g == nil || g.Metric[0].GetGauge().GetValue() != 2 {
		t.Errorf("leasefs_sessions: %v", g)
	}
	if n := histCount(fams["leasefs_request_duration_seconds"], "create", "ok"); n != 2 {
		t.Errorf("create/ok requests in histogram: %d, want 2", n)
	}
	if n := histCount(fams["leasefs_request_duration_seconds"], "open-session", "ok"); n != 2 {
		t.Errorf("open-session/ok requests in histogram: %d, want 2", n)
	}
	var revocations uint64
	if f := fams["leasefs_revocation_duration_seconds"]; f != nil {
		for _, m := range f.Metric {
			revocations += m.GetHistogram().GetSampleCount()
		}
	}
	if revocations < 1 {
		t.Errorf("no revocation round trip recorded in leasefs_revocation_duration_seconds")
	}
	if c := fams["leasefs_locks_granted_total"]; c == nil || c.Metric[0].GetCounter().GetValue() < 2 {
		t.Errorf("leasefs_locks_granted_total: %v", c)
	}

	// Status page.
	code, page := adminGet(t, a, "GET", "/", tok)
	for _, want := range []string{c1.ID().String(), c2.ID().String(), "flock", fa.Ino.String(), "2 sessions"} {
		if code != 200 || !strings.Contains(string(page), want) {
			t.Errorf("status page (%d) lacks %q", code, want)
		}
	}

	// Evict: bad and unknown ids first.
	if code, _ := adminGet(t, a, "POST", "/api/evict?client=zz", tok); code != 400 {
		t.Errorf("evict bad id: %d", code)
	}
	if code, _ := adminGet(t, a, "POST", "/api/evict?client=client:00000000000000ff", tok); code != 404 {
		t.Errorf("evict unknown client: %d", code)
	}
	if code, _ := adminGet(t, a, "GET", "/api/evict?client="+c1.ID().String(), tok); code != http.StatusMethodNotAllowed {
		t.Errorf("evict by GET: %d", code)
	}
	code, b := adminGet(t, a, "POST", "/api/evict?client="+c1.ID().String(), tok)
	var ev admin.EvictResult
	if code != 200 || json.Unmarshal(b, &ev) != nil || ev.Client != c1.ID().String() || ev.StealIn <= 0 {
		t.Fatalf("evict: %d %s", code, b)
	}
	cs = adminJSON[[]admin.ClientInfo](t, s, a, "/api/clients")
	if i1 := findClient(cs, c1.ID()); i1 == nil || i1.State != "failing" || i1.FailingLeft <= 0 {
		t.Errorf("evicted client: %+v", cs)
	}
	if !strings.Contains(logs.String(), "evicted by admin") {
		t.Errorf("no log line for the eviction")
	}
	// The other client proceeds meanwhile.
	if _, err := c2.Write(ctx, fb.Ino, 0, []byte("other"), false, false); err != nil {
		t.Fatalf("client 2 during eviction: %v", err)
	}
	// The evicted one recovers: NACK, new session after τ(1+δ), then works.
	if _, err := c1.Create(ctx, ids.RootIno, "after", 0o100644, 0, 0, 0, 0); err != nil {
		t.Fatalf("client 1 after eviction: %v", err)
	}
	if st := c1.Stats(); st.NacksReceived < 1 || st.Recoveries < 1 {
		t.Errorf("client 1 stats after eviction: %+v", st)
	}
	ctr = adminJSON[admin.Counters](t, s, a, "/api/counters")
	if ctr.ClientsFailed != 1 || ctr.NacksSent < 1 || ctr.SessionsOpened != 3 || ctr.ClientsExpired != 1 {
		t.Errorf("counters after eviction: %+v", ctr)
	}
	cs = adminJSON[[]admin.ClientInfo](t, s, a, "/api/clients")
	if i1 := findClient(cs, c1.ID()); i1 == nil || i1.State != "normal" || i1.Session != c1.Session().ID.String() {
		t.Errorf("client 1 after recovery: %+v", cs)
	}
	// Its flock was stolen with the rest of its locks.
	for _, l := range adminJSON[admin.LockPage](t, s, a, "/api/locks").Locks {
		if l.Kind == "flock" {
			t.Errorf("flock survived eviction: %+v", l)
		}
	}
}

func histCount(f *dto.MetricFamily, op, result string) uint64 {
	if f == nil {
		return 0
	}
	for _, m := range f.Metric {
		labels := map[string]string{}
		for _, l := range m.Label {
			labels[l.GetName()] = l.GetValue()
		}
		if labels["op"] == op && labels["result"] == result {
			return m.GetHistogram().GetSampleCount()
		}
	}
	return 0
}
