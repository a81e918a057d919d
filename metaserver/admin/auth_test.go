package admin

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/internal/ratelog"
	"github.com/leasefs/leasefs/metaserver/ownership"
	"github.com/leasefs/leasefs/transport"
)

// syncBuf is a log sink tests can read while the endpoint writes.
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

// fakeSource is a server with no clients, locks or peers.
type fakeSource struct{}

func (fakeSource) Status() Status                  { return Status{Peers: []ownership.PeerStatus{}} }
func (fakeSource) Clients() []ClientInfo           { return []ClientInfo{} }
func (fakeSource) Locks() []LockInfo               { return []LockInfo{} }
func (fakeSource) Owners() []OwnerInfo             { return []OwnerInfo{} }
func (fakeSource) Counters() Counters              { return Counters{} }
func (fakeSource) Checksum() (ChecksumInfo, error) { return ChecksumInfo{}, nil }
func (fakeSource) CutPeers(bool) error             { return ErrNoPeerFaults }
func (fakeSource) Observe(*Metrics) (stop func())  { return func() {} }
func (fakeSource) Paths([]ids.Ino, int) map[ids.Ino]PathInfo {
	return map[ids.Ino]PathInfo{}
}
func (fakeSource) Inode(string) (PathInfo, error) { return PathInfo{}, errors.New("no namespace") }
func (fakeSource) Evict(c ids.ClientID) (EvictResult, error) {
	return EvictResult{}, fmt.Errorf("%w: %v", ErrUnknownClient, c)
}

// testEndpoint is an endpoint and the cluster identity it serves with.
type testEndpoint struct {
	*Endpoint
	id *transport.Identity
}

// adminToken is the admin credential of the endpoint's cluster.
func (a testEndpoint) adminToken() string { return a.id.TokenValue().Admin().String() }

// startAdmin runs an endpoint of a fresh cluster identity, for fakeSource,
// on cfg.Listen (default: a loopback port).
func startAdmin(t *testing.T, cfg Config) (testEndpoint, *syncBuf) {
	t.Helper()
	return startAdminOf(t, cfg, fakeSource{})
}

// startAdminOf runs an endpoint for src as startAdmin does.
func startAdminOf(t *testing.T, cfg Config, src Source) (testEndpoint, *syncBuf) {
	t.Helper()
	id, err := transport.NewIdentity()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Listen == "" {
		cfg.Listen = "127.0.0.1:0"
	}
	logs := &syncBuf{}
	e, err := Serve(cfg, src, id, slog.New(slog.NewTextHandler(logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return testEndpoint{e, id}, logs
}

// adminDo sends one request to a's endpoint, over TLS pinned to the
// cluster certificate if pinned, else plain HTTP; set changes the request.
func adminDo(t *testing.T, a testEndpoint, pinned bool, method, path string, set func(*http.Request)) (*http.Response, string) {
	t.Helper()
	scheme, tr := "http", &http.Transport{Proxy: nil}
	if pinned {
		scheme = "https"
		tr.TLSClientConfig = transport.PinnedTLS(a.id.CertHash())
	}
	defer tr.CloseIdleConnections()
	_, port, _ := net.SplitHostPort(a.Addr().String())
	req, err := http.NewRequest(method, scheme+"://127.0.0.1:"+port+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if set != nil {
		set(req)
	}
	hc := &http.Client{Transport: tr, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

func bearer(tok string) func(*http.Request) {
	return func(r *http.Request) { r.Header.Set("Authorization", "Bearer "+tok) }
}

// TestAdminLoopbackAuth: on loopback, everything but /metrics and
// /healthz needs the admin credential, over plain HTTP or TLS; the join
// token is refused; refusals log a bounded number of lines.
func TestAdminLoopbackAuth(t *testing.T) {
	a, logs := startAdmin(t, Config{})
	tok := a.adminToken()
	closed := []string{"/", "/api/status", "/api/clients", "/api/locks", "/api/owners", "/api/counters",
		"/api/checksum", "/debug/pprof/", "/debug/pprof/profile?seconds=1", "/debug/pprof/heap"}
	for _, pinned := range []bool{false, true} {
		for _, p := range closed {
			for _, cred := range []string{"", "wrong", a.id.Token(), tok + "x"} {
				set := bearer(cred)
				if cred == "" {
					set = nil
				}
				if resp, body := adminDo(t, a, pinned, "GET", p, set); resp.StatusCode != http.StatusUnauthorized {
					t.Errorf("tls %v: GET %s with %.12q: %d, want 401\n%s", pinned, p, cred, resp.StatusCode, body)
				}
			}
			if resp, body := adminDo(t, a, pinned, "GET", p, bearer(tok)); resp.StatusCode != http.StatusOK {
				t.Errorf("tls %v: GET %s with the admin token: %d\n%.300s", pinned, p, resp.StatusCode, body)
			}
		}
		for _, p := range []string{"/api/evict?client=1", "/api/login-link", "/api/peer-cut?on=1"} {
			if resp, _ := adminDo(t, a, pinned, "POST", p, nil); resp.StatusCode != http.StatusUnauthorized {
				t.Errorf("tls %v: POST %s without credential: %d, want 401", pinned, p, resp.StatusCode)
			}
		}
		for _, p := range []string{"/metrics", "/healthz"} {
			if resp, body := adminDo(t, a, pinned, "GET", p, nil); resp.StatusCode != http.StatusOK {
				t.Errorf("tls %v: GET %s without credential: %d\n%s", pinned, p, resp.StatusCode, body)
			}
		}
	}
	// The join token: refused, and told why.
	if resp, body := adminDo(t, a, true, "GET", "/api/status", bearer(a.id.Token())); resp.StatusCode != http.StatusUnauthorized ||
		!strings.Contains(body, "join token") {
		t.Errorf("the join token: %d %s", resp.StatusCode, body)
	}
	// A browser without the cookie gets told how to sign in.
	if resp, body := adminDo(t, a, false, "GET", "/", nil); !strings.Contains(body, "leasefs admin --server") ||
		!strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") {
		t.Errorf("page without credential: %s", body)
	}
	if n := strings.Count(logs.String(), "admin: request refused"); n < 1 || n > ratelog.DefaultBurst+1 {
		t.Errorf("%d refusal lines logged, want 1..%d", n, ratelog.DefaultBurst+1)
	}
}

// TestAdminHostOrigin: a loopback endpoint answers only requests naming
// the loopback in Host (a page whose name was rebound to 127.0.0.1 gets
// nothing, not even /metrics), and refuses requests from another origin
// even with the credential.
func TestAdminHostOrigin(t *testing.T) {
	a, _ := startAdmin(t, Config{})
	tok := a.adminToken()
	_, port, _ := net.SplitHostPort(a.Addr().String())
	for _, host := range []string{"evil.example:" + port, "evil.example", "127.0.0.1.nip.io:" + port, "10.0.0.1:" + port} {
		for _, p := range []string{"/metrics", "/healthz", "/api/status", "/"} {
			for _, pinned := range []bool{false, true} {
				resp, _ := adminDo(t, a, pinned, "GET", p, func(r *http.Request) { r.Host = host; bearer(tok)(r) })
				if resp.StatusCode != http.StatusForbidden {
					t.Errorf("tls %v: Host %s, GET %s: %d, want 403", pinned, host, p, resp.StatusCode)
				}
			}
		}
	}
	for _, host := range []string{"localhost:" + port, "127.0.0.1:" + port, "[::1]:" + port, "127.0.0.1"} {
		if resp, _ := adminDo(t, a, false, "GET", "/api/status", func(r *http.Request) { r.Host = host; bearer(tok)(r) }); resp.StatusCode != 200 {
			t.Errorf("Host %s: %d, want 200", host, resp.StatusCode)
		}
	}
	for _, origin := range []string{"http://evil.example", "null", "https://127.0.0.1:" + port, "http://localhost:" + port} {
		resp, _ := adminDo(t, a, false, "POST", "/api/evict?client=client:00000000000000ff", func(r *http.Request) {
			r.Header.Set("Origin", origin)
			bearer(tok)(r)
		})
		if resp.StatusCode != http.StatusForbidden {
			t.Errorf("POST with Origin %s: %d, want 403", origin, resp.StatusCode)
		}
	}
	// the endpoint's own pages may post (same origin)
	resp, _ := adminDo(t, a, false, "POST", "/api/evict?client=client:00000000000000ff", func(r *http.Request) {
		r.Header.Set("Origin", "http://127.0.0.1:"+port)
		bearer(tok)(r)
	})
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("same-origin evict of an unknown client: %d, want 404", resp.StatusCode)
	}
}

// TestAdminLoginLink: a one-time link sets a cookie that opens the status
// page; the link works once; a wrong cookie gets nothing.
func TestAdminLoginLink(t *testing.T) {
	a, _ := startAdmin(t, Config{})
	resp, body := adminDo(t, a, true, "POST", "/api/login-link", bearer(a.adminToken()))
	var link LoginLink
	if resp.StatusCode != 200 || json.Unmarshal([]byte(body), &link) != nil || !strings.HasPrefix(link.URL, "http://127.0.0.1:") {
		t.Fatalf("login link: %d %s", resp.StatusCode, body)
	}
	path := link.URL[strings.Index(link.URL, "/login"):]
	resp, body = adminDo(t, a, false, "GET", path, nil)
	cookies := resp.Cookies()
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/" || len(cookies) != 1 {
		t.Fatalf("login: %d %v %s", resp.StatusCode, resp.Header, body)
	}
	c := cookies[0]
	if !c.HttpOnly || c.SameSite != http.SameSiteStrictMode || c.MaxAge <= 0 {
		t.Errorf("cookie %+v: want HttpOnly, SameSite=Strict, persistent", c)
	}
	withCookie := func(c *http.Cookie) func(*http.Request) { return func(r *http.Request) { r.AddCookie(c) } }
	if resp, body := adminDo(t, a, false, "GET", "/", withCookie(c)); resp.StatusCode != 200 || !strings.Contains(body, "Sessions / failing") {
		t.Errorf("status page with the cookie: %d %.200s", resp.StatusCode, body)
	}
	if resp, _ := adminDo(t, a, false, "GET", "/api/clients", withCookie(c)); resp.StatusCode != 200 {
		t.Errorf("API with the cookie: %d", resp.StatusCode)
	}
	if resp, _ := adminDo(t, a, false, "GET", path, nil); resp.StatusCode != http.StatusUnauthorized || len(resp.Cookies()) != 0 {
		t.Errorf("login link used twice: %d %v", resp.StatusCode, resp.Cookies())
	}
	bad := *c
	bad.Value = strings.Repeat("0", len(c.Value))
	if resp, _ := adminDo(t, a, false, "GET", "/", withCookie(&bad)); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("wrong cookie: %d", resp.StatusCode)
	}
}

// TestAdminRemoteTLSOnly: an endpoint off the loopback speaks only TLS: a
// plain HTTP request carrying the join token is refused before any header
// is read, and over TLS the join token is refused too.
func TestAdminRemoteTLSOnly(t *testing.T) {
	a, logs := startAdmin(t, Config{Listen: "0.0.0.0:0"}) // every address: not loopback
	_, port, _ := net.SplitHostPort(a.Addr().String())

	c, err := net.Dial("tcp", "127.0.0.1:"+port)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, "GET /api/status HTTP/1.1\r\nHost: server.example\r\nAuthorization: Bearer "+a.id.Token()+"\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), "HTTPS") {
		t.Fatalf("plain HTTP to a non-loopback endpoint: %d %s", resp.StatusCode, body)
	}
	if strings.Contains(logs.String(), "admin: request refused") {
		t.Fatalf("a plain HTTP request reached the handlers:\n%s", logs)
	}

	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: transport.PinnedTLS(a.id.CertHash())}}
	get := func(tok string) int {
		req, _ := http.NewRequest("GET", "https://server.example:"+port+"/api/status", nil)
		req.URL.Host = "127.0.0.1:" + port
		req.Host = "server.example:" + port // any name: TLS, not Host, keeps rebinding out here
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := get(a.id.Token()); code != http.StatusUnauthorized {
		t.Errorf("join token over TLS: %d, want 401", code)
	}
	if code := get(a.adminToken()); code != http.StatusOK {
		t.Errorf("admin token over TLS: %d, want 200", code)
	}
	// A client that pins another certificate refuses the endpoint.
	other, err := transport.NewIdentity()
	if err != nil {
		t.Fatal(err)
	}
	hc = &http.Client{Transport: &http.Transport{TLSClientConfig: transport.PinnedTLS(other.CertHash())}}
	if _, err := hc.Get("https://127.0.0.1:" + port + "/healthz"); !errors.Is(err, transport.ErrWrongServer) {
		t.Errorf("pinning another certificate: %v, want ErrWrongServer", err)
	}
}

func TestParseClientID(t *testing.T) {
	c := ids.ClientID(0xfedcba9876543210)
	for _, in := range []string{c.String(), "fedcba9876543210"} {
		if got, err := ParseClientID(in); err != nil || got != c {
			t.Errorf("ParseClientID(%q) = %v, %v", in, got, err)
		}
	}
	for _, in := range []string{"", "client:", "client:xyz", "12345678901234567"} {
		if _, err := ParseClientID(in); err == nil {
			t.Errorf("ParseClientID(%q) accepted", in)
		}
	}
}
