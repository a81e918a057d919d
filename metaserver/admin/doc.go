// Package admin is a server's admin endpoint: a JSON API, Prometheus
// metrics and a status page for operators. It only reads the server's
// state (a Source), except for evict, which fails a client exactly as a
// delivery error would.
//
// Endpoints (GET unless noted):
//
//	/                    status page (HTML, refreshes itself): summaries, trends, one page of each table
//	                     (?locks=N, ?owners=N, ?clients=N: the row to start at)
//	/api/status          Status
//	/api/clients         []ClientInfo
//	/api/locks?offset=N&limit=M   LockPage: M locks (default 1000, at most 10000) from the Nth, and the total
//	/api/locks/summary   LockSummary: counts by kind, the top clients, the most contended inodes
//	/api/trends          Trends: request rate, latency, NACKs, revocations, bytes in and out,
//	                     one sample per refresh period over the last 10 minutes
//	/api/owners          []OwnerInfo
//	/api/counters        Counters
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
// posting to it). See auth.go.
//
// # Caller's duties
//
// The server implements Source (its methods are called concurrently from
// the HTTP handlers), feeds the Metrics that Source.Observe hands it with
// every request and revocation until stop is called, and Closes the
// endpoint before it closes itself.
package admin
