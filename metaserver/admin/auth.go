package admin

// Who may use the admin endpoint.
//
// The credential is the admin token (transport.AdminToken): a key derived
// from the cluster secret, which does not give the secret back and so does
// not mount. The endpoint presents the cluster's certificate, which the
// admin client pins from its token, so the credential only ever goes to a
// server of the cluster, encrypted. A loopback listener also answers plain
// HTTP, for a browser on the machine: there the Host header must name the
// loopback, so that a web page whose name was rebound to 127.0.0.1 gets
// nothing, not even /metrics. Everywhere a request carrying an Origin other
// than the endpoint's own is refused: a page cannot post to /api/evict.
//
// A browser gets in with a cookie that a one-time link sets (`leasefs admin
// page` asks for one): the cookie is SameSite=Strict and HttpOnly, so other
// sites' pages neither send nor read it.

import (
	"crypto/rand"
	"crypto/subtle"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/leasefs/leasefs/internal/ratelog"
	"github.com/leasefs/leasefs/transport"
)

const (
	// loginLinkTTL is how long a login link is good for; it works once.
	loginLinkTTL = time.Minute
	// maxLoginLinks bounds the links issued and not yet used.
	maxLoginLinks = 16
	// cookieMaxAge is how long a browser keeps the status page's cookie
	// (a restart of the server ends it sooner: the value is per process).
	cookieMaxAge = 12 * time.Hour
	// sniffTimeout bounds the wait for a connection's first byte.
	sniffTimeout = 10 * time.Second
)

// adminAuth checks admin requests.
type adminAuth struct {
	log    *slog.Logger
	token  string // the admin credential, transport.AdminToken.String()
	tls    *tls.Config
	plain  bool // a loopback listener: plain HTTP too, Host checked
	cookie http.Cookie
	warns  *ratelog.Limiter

	mu     sync.Mutex
	logins map[string]time.Time // one-time login nonces → expiry
}

func newAdminAuth(id *transport.Identity, log *slog.Logger, addr net.Addr) (*adminAuth, error) {
	var v [32]byte
	if _, err := rand.Read(v[:]); err != nil {
		return nil, fmt.Errorf("admin: cookie: %w", err)
	}
	_, port, _ := net.SplitHostPort(addr.String())
	au := &adminAuth{log: log, token: id.TokenValue().Admin().String(), plain: isLoopback(addr),
		warns: ratelog.New(), logins: map[string]time.Time{},
		tls: &tls.Config{Certificates: []tls.Certificate{id.Cert}, NextProtos: []string{"http/1.1"}, MinVersion: tls.VersionTLS13}}
	// Cookies are per host, not per port: two servers on one machine
	// must not replace each other's.
	au.cookie = http.Cookie{Name: "leasefs_admin_" + port, Value: hex.EncodeToString(v[:]), Path: "/",
		MaxAge: int(cookieMaxAge / time.Second), HttpOnly: true, SameSite: http.SameSiteStrictMode}
	return au, nil
}

// listener serves TLS on ln, and plain HTTP too if ln is on the loopback.
func (au *adminAuth) listener(ln net.Listener) net.Listener {
	if !au.plain {
		// A plain HTTP request gets net/http's 400 ("client sent an
		// HTTP request to an HTTPS server") before any header is read.
		return tls.NewListener(ln, au.tls)
	}
	l := &sniffListener{Listener: ln, tls: au.tls, conns: make(chan net.Conn), done: make(chan struct{})}
	go l.run()
	return l
}

// guard admits a request to next, or answers it itself.
func (au *adminAuth) guard(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if au.plain && !loopbackHost(r.Host) {
			au.refuse(w, r, http.StatusForbidden, "Host "+r.Host+" is not this machine's loopback")
			return
		}
		if o := r.Header.Get("Origin"); o != "" && o != au.origin(r) {
			au.refuse(w, r, http.StatusForbidden, "Origin "+o+" is not this endpoint")
			return
		}
		switch r.URL.Path {
		case "/metrics", "/healthz", "/login":
			next.ServeHTTP(w, r)
			return
		}
		if ok, why := au.credential(r); !ok {
			au.refuse(w, r, http.StatusUnauthorized, why)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// credential reports whether r carries the admin token or the cookie, and
// if not, why.
func (au *adminAuth) credential(r *http.Request) (bool, string) {
	if c, err := r.Cookie(au.cookie.Name); err == nil &&
		subtle.ConstantTimeCompare([]byte(c.Value), []byte(au.cookie.Value)) == 1 {
		return true, ""
	}
	got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	got = strings.TrimSpace(got)
	switch {
	case !ok:
		return false, "send Authorization: Bearer <admin token> (DATA/admin-token), or use leasefs admin"
	case strings.HasPrefix(got, "lfs1-"):
		// the join token: never taken here, whatever the channel
		return false, "that is the join token, which the admin endpoint never takes: send the admin token (DATA/admin-token)"
	case subtle.ConstantTimeCompare([]byte(got), []byte(au.token)) != 1:
		return false, "wrong admin token"
	}
	return true, ""
}

// origin is the Origin a browser sends from a page of this endpoint.
func (au *adminAuth) origin(r *http.Request) string {
	if r.TLS != nil {
		return "https://" + r.Host
	}
	return "http://" + r.Host
}

func (au *adminAuth) refuse(w http.ResponseWriter, r *http.Request, code int, why string) {
	au.warns.Warn(au.log, ratelog.Peer(r.RemoteAddr), "admin: request refused", "remote", r.RemoteAddr,
		"method", r.Method, "path", r.URL.Path, "code", code, "why", why)
	if code == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `Bearer realm="leasefs admin"`)
		if r.URL.Path == "/" {
			w.Header().Set("Content-Type", "text/html; charset=utf-8")
			w.WriteHeader(code)
			_, _ = io.WriteString(w, loginHelp)
			return
		}
	}
	http.Error(w, fmt.Sprintf("%d %s: %s", code, http.StatusText(code), why), code)
}

// loginHelp is what a browser without the cookie gets at /.
const loginHelp = `<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>leasefs admin: sign in</title></head>
<body style="font: 14px/1.4 system-ui, sans-serif; margin: 1.5em">
<h1 style="font-size: 1.4em">leasefs admin</h1>
<p>The status page needs the admin credential. On a machine with the server's
<code>DATA/admin-token</code> (or the join token), run</p>
<pre>leasefs admin --server ADDRESS --token-file DATA/admin-token page</pre>
<p>and open the link it prints within a minute: it signs this browser in (once).</p>
</body></html>
`

// LoginLink answers POST /api/login-link.
type LoginLink struct {
	URL     string    `json:"url"`
	Expires time.Time `json:"expires"`
}

// loginLink issues a one-time link that signs a browser in.
func (au *adminAuth) loginLink(w http.ResponseWriter, r *http.Request) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		writeJSON(w, http.StatusInternalServerError, map[string]string{"error": err.Error()})
		return
	}
	nonce := hex.EncodeToString(b[:])
	now := time.Now()
	au.mu.Lock()
	for n, exp := range au.logins {
		if now.After(exp) {
			delete(au.logins, n)
		}
	}
	full := len(au.logins) >= maxLoginLinks
	if !full {
		au.logins[nonce] = now.Add(loginLinkTTL)
	}
	au.mu.Unlock()
	if full {
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": "too many login links not yet used: wait a minute"})
		return
	}
	scheme := "https"
	if au.plain {
		scheme = "http" // no certificate warning in the browser
	}
	u := url.URL{Scheme: scheme, Host: r.Host, Path: "/login", RawQuery: "once=" + nonce}
	writeJSON(w, http.StatusOK, LoginLink{URL: u.String(), Expires: now.Add(loginLinkTTL)})
}

// login takes a one-time link: it sets the cookie and sends the browser
// to the status page.
func (au *adminAuth) login(w http.ResponseWriter, r *http.Request) {
	nonce := r.URL.Query().Get("once")
	au.mu.Lock()
	exp, ok := au.logins[nonce]
	delete(au.logins, nonce)
	au.mu.Unlock()
	if !ok || time.Now().After(exp) {
		au.refuse(w, r, http.StatusUnauthorized, "login link unknown, used or expired")
		return
	}
	c := au.cookie
	c.Secure = r.TLS != nil
	http.SetCookie(w, &c)
	au.log.Info("admin: browser signed in", "remote", r.RemoteAddr)
	http.Redirect(w, r, "/", http.StatusSeeOther)
}

// loopbackHost reports whether a Host header names the loopback:
// "localhost" or a loopback address, with or without a port.
func loopbackHost(host string) bool {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// sniffListener hands out a loopback listener's connections as TLS or
// plain by their first byte (22: a TLS handshake record). The first byte
// is awaited in a goroutine per connection, so a silent one holds up
// nobody else.
type sniffListener struct {
	net.Listener
	tls   *tls.Config
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

func (l *sniffListener) run() {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				l.shut()
				return
			}
			time.Sleep(50 * time.Millisecond) // out of descriptors: as net/http does
			continue
		}
		go l.sniff(c)
	}
}

func (l *sniffListener) sniff(c net.Conn) {
	var b [1]byte
	_ = c.SetReadDeadline(time.Now().Add(sniffTimeout))
	if _, err := io.ReadFull(c, b[:]); err != nil {
		c.Close()
		return
	}
	_ = c.SetReadDeadline(time.Time{})
	var out net.Conn = &prefixConn{Conn: c, first: b[:]}
	if b[0] == 22 {
		out = tls.Server(out, l.tls)
	}
	select {
	case l.conns <- out:
	case <-l.done:
		c.Close()
	}
}

func (l *sniffListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *sniffListener) Close() error {
	l.shut()
	return l.Listener.Close()
}

func (l *sniffListener) shut() { l.once.Do(func() { close(l.done) }) }

// prefixConn gives back the bytes read to tell the protocol apart.
type prefixConn struct {
	net.Conn
	first []byte
}

func (c *prefixConn) Read(p []byte) (int, error) {
	if len(c.first) > 0 {
		n := copy(p, c.first)
		c.first = c.first[n:]
		return n, nil
	}
	return c.Conn.Read(p)
}
