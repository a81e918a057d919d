package main

// leasefs admin: reads a server's admin endpoint (serve --admin) or a
// mount's status socket and prints tables.
//
// A mount serves its status as JSON over HTTP on a unix socket in a
// directory private to its user (internal/mountsock), and takes a sync
// request there.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/pprof"
	"net/url"
	"os"
	"runtime"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/leasefs/leasefs/internal/version"

	"github.com/spf13/pflag"

	"github.com/leasefs/leasefs/client"
	"github.com/leasefs/leasefs/internal/mountsock"
	"github.com/leasefs/leasefs/metaserver"
	"github.com/leasefs/leasefs/metaserver/admin"
	"github.com/leasefs/leasefs/transport"
)

// adminListen is serve's --admin flag.
var adminListen string

func addAdminFlag(fs *pflag.FlagSet) {
	fs.StringVar(&adminListen, "admin", "", "HOST:PORT for the admin endpoint (JSON API, /metrics, status page); "+
		"empty: off. It speaks TLS with the cluster's certificate (on a loopback address plain HTTP too) and\n"+
		"needs the admin token (DATA/admin-token) for everything but /metrics and /healthz")
}

// startAdmin starts srv's admin endpoint if --admin was given. It lives as
// long as the process.
func startAdmin(srv *metaserver.Server) error {
	if adminListen == "" {
		return nil
	}
	_, err := srv.ServeAdmin(admin.Config{Listen: adminListen})
	return err
}

// mountStatus is what a mount reports.
type mountStatus struct {
	Mountpoint string       `json:"mountpoint"`
	Version    version.Info `json:"version"`
	Server     string       `json:"server"`
	Client     string       `json:"client"`
	Session    string       `json:"session"`
	Pid        int          `json:"pid"`
	CPUs       int          `json:"cpus"` // GOMAXPROCS (mount --cpus)
	Stats      client.Stats `json:"stats"`
}

// serveMountStatus serves c's status, and takes sync requests, on the
// mount's status socket (mountsock.Listen; mountpoint is resolved) until
// the returned stop is called. A failure only logs: the mount works
// without it.
func serveMountStatus(c *client.Client, mountpoint string, log *slog.Logger) (stop func()) {
	ln, path, err := mountsock.Listen(mountpoint, log)
	if err != nil {
		log.Warn("admin: no status socket", "err", err)
		return func() {}
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /status", func(w http.ResponseWriter, r *http.Request) {
		st := c.Stats()
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(mountStatus{Mountpoint: mountpoint, Version: version.Get(), Server: c.Server(), Client: c.ID().String(),
			Session: st.Session.String(), Pid: os.Getpid(), CPUs: runtime.GOMAXPROCS(0), Stats: st})
	})
	// A sync sends everything the mount buffered (writes, attribute
	// changes, creates and removals sent behind the caller) to the server
	// and answers once it is there: sync(2) cannot ask a FUSE file system
	// for that (the kernel sends FUSE_SYNCFS to virtiofs only).
	mux.HandleFunc("POST /sync", func(w http.ResponseWriter, r *http.Request) {
		if err := c.FlushAll(r.Context()); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(syncReply{Mountpoint: mountpoint, DirtyBytes: c.Stats().DirtyBytes})
	})
	// Profiles of the mount process, for the owner of the socket only
	// (curl --unix-socket SOCKET http://x/debug/pprof/profile).
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = hs.Serve(ln) }()
	log.Debug("status socket", "path", path)
	return func() {
		_ = hs.Close()
		_ = os.Remove(path)
	}
}

// syncReply is a mount's answer to a sync: what it still buffers (written
// meanwhile), and which mount it is, so that the admin knows it reached
// the mount it asked.
type syncReply struct {
	Mountpoint string `json:"mountpoint"`
	DirtyBytes int64  `json:"dirty_bytes"`
}

func runAdmin(argv []string) error {
	fs := newFlags("admin", "(--server HOST:PORT --token-file F | --mount MOUNTPOINT) [--json] COMMAND [ARG]",
		"Show what a leasefs server or mount is doing, or act on it. --server is the server's\n"+
			"--admin address, not its client port. --token-file is the server's DATA/admin-token, or\n"+
			"the join token (DATA/token), from which the admin token is derived here: the join token's\n"+
			"secret is never sent. The endpoint must present the cluster's certificate, which the\n"+
			"token pins; the connection is TLS.\n\n"+
			"Server commands:\n"+
			"  status          server id, uptime, lease parameters, peers, store size\n"+
			"  clients         sessions: client, host, mountpoint, address, lease state, last request, locks, uptime, version\n"+
			"  locks           data locks (S/X), flock and fcntl locks, queued requests\n"+
			"  owners          inodes this server owns: epoch, lease expiry (single server: all its own, epoch 0)\n"+
			"  counters        request, NACK, lock and failure counters\n"+
			"  checksum        hash of every replicated record: equal on servers whose replicas agree\n"+
			"  path INO        where inode INO is: a path from the root (one of a hard-linked file's names), links\n"+
			"  inode PATH      the inode at PATH (from the file system's root)\n"+
			"  evict CLIENT    fail CLIENT now: it gets NACKs, its locks are stolen after τ(1+δ)\n"+
			"  page            print a link that opens the status page in a browser (once, within a minute)\n"+
			"Mount commands:\n"+
			"  status          session, lease time left, cache size, locks, counters\n"+
			"  sync            send what the mount buffered (writes, attribute changes, creates and removals\n"+
			"                  sent behind the caller) to the server now, and wait until it is there")
	var server, mount, tokenFile string
	var asJSON bool
	fs.StringVar(&server, "server", "", "the server's admin endpoint HOST:PORT (serve --admin)")
	fs.StringVar(&mount, "mount", "", "ask the mount at MOUNTPOINT instead of a server")
	fs.StringVar(&tokenFile, "token-file", "", "with --server: the server's DATA/admin-token, or the join token DATA/token")
	fs.BoolVar(&asJSON, "json", false, "print the JSON the endpoint returned instead of a table")
	if err := parse(fs, argv); err != nil {
		return err
	}
	args := fs.Args()
	if len(args) == 0 || (server == "") == (mount == "") {
		fs.Usage()
		return errUsage
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if mount != "" {
		if (args[0] != "status" && args[0] != "sync") || len(args) != 1 {
			return fmt.Errorf("a mount answers only: status, sync")
		}
		return adminMount(ctx, mount, args[0], asJSON)
	}
	if tokenFile == "" {
		return errors.New("--server needs --token-file: the server's DATA/admin-token (or its join token, DATA/token)")
	}
	tok, err := transport.ReadAdminTokenFile(tokenFile)
	if err != nil {
		return err
	}
	ac := newAdminClient(server, tok)
	defer ac.close()
	var body []byte
	var printer func(io.Writer, []byte) error
	switch cmd := args[0]; {
	case cmd == "evict" && len(args) == 2:
		body, err = ac.do(ctx, "POST", "/api/evict?client="+url.QueryEscape(args[1]))
		printer = printEvict
	case cmd == "path" && len(args) == 2:
		body, err = ac.do(ctx, "GET", "/api/path?ino="+url.QueryEscape(args[1]))
		printer = printPath
	case cmd == "inode" && len(args) == 2:
		body, err = ac.do(ctx, "GET", "/api/inode?path="+url.QueryEscape(args[1]))
		printer = printPath
	case len(args) != 1:
		fs.Usage()
		return errUsage
	case cmd == "page":
		body, err = ac.do(ctx, "POST", "/api/login-link")
		printer = printLoginLink
	case cmd == "locks":
		body, err = allLocks(ctx, ac)
		printer = printLocks
	case adminGets[cmd] != "":
		body, err = ac.do(ctx, "GET", adminGets[cmd])
		printer = adminPrinters[cmd]
	default:
		return fmt.Errorf("unknown admin command %q", cmd)
	}
	if err != nil {
		return err
	}
	return show(os.Stdout, body, asJSON, printer)
}

// adminGets are the server commands that read an API path, and
// adminPrinters their tables.
var (
	adminGets = map[string]string{"status": "/api/status", "clients": "/api/clients",
		"owners": "/api/owners", "counters": "/api/counters", "checksum": "/api/checksum"}
	adminPrinters = map[string]func(io.Writer, []byte) error{"status": printStatus, "clients": printClients,
		"locks": printLocks, "owners": printOwners, "counters": printCounters, "checksum": printChecksum}
)

// adminClient talks to a server's admin endpoint over TLS, accepting only
// the certificate the token pins, and authenticates with the admin token:
// a key derived from the cluster secret, useless for mounting. Nothing is
// sent before the certificate checked out.
type adminClient struct {
	addr string
	tok  transport.AdminToken
	tr   *http.Transport
	hc   *http.Client
}

func newAdminClient(addr string, tok transport.AdminToken) *adminClient {
	tlsConf := transport.PinnedTLS(tok.CertHash)
	tlsConf.NextProtos = []string{"http/1.1"}
	// Proxy nil: to the address given, not through $HTTPS_PROXY.
	tr := &http.Transport{Proxy: nil, TLSClientConfig: tlsConf, TLSHandshakeTimeout: 10 * time.Second}
	return &adminClient{addr: addr, tok: tok, tr: tr, hc: &http.Client{Transport: tr}}
}

func (ac *adminClient) close() { ac.tr.CloseIdleConnections() }

func (ac *adminClient) do(ctx context.Context, method, path string) ([]byte, error) {
	body, err := fetch(ctx, ac.hc, method, "https://"+ac.addr+path, ac.tok.String())
	switch {
	case errors.Is(err, transport.ErrWrongServer):
		return nil, fmt.Errorf("admin endpoint %s does not present the cluster certificate the token pins "+
			"(another cluster's server, or not a leasefs server): nothing sent", ac.addr)
	case errors.Is(err, http.ErrSchemeMismatch):
		return nil, fmt.Errorf("admin endpoint %s answered in plain HTTP, not TLS (not a leasefs admin endpoint, "+
			"or an older release's): nothing sent", ac.addr)
	}
	return body, err
}

// adminMount runs cmd (status or sync) on the mount at mp through its
// status socket, and fails unless the mount that answered is the one at mp.
func adminMount(ctx context.Context, mp, cmd string, asJSON bool) error {
	resolved, _, err := mountsock.Mount(mp)
	if err != nil {
		return err
	}
	hc := mountsock.Client(mp)
	var body []byte
	var answered string
	if cmd == "sync" {
		// as long as the server takes to store it: no timeout (^C stops waiting)
		body, err = fetch(context.Background(), hc, "POST", "http://mount/sync", "")
		if err == nil {
			var r syncReply
			if r, err = decode[syncReply](body); err == nil {
				answered = r.Mountpoint
			}
		}
	} else {
		body, err = fetch(ctx, hc, "GET", "http://mount/status", "")
		if err == nil {
			var st mountStatus
			if st, err = decode[mountStatus](body); err == nil {
				answered = st.Mountpoint
			}
		}
	}
	if err == nil && answered != resolved {
		err = fmt.Errorf("the socket answered for %q, not this mount", answered)
	}
	if err != nil {
		return fmt.Errorf("mount %s: %w", resolved, err)
	}
	if cmd == "sync" {
		return nil
	}
	return show(os.Stdout, body, asJSON, printMount)
}

func fetch(ctx context.Context, hc *http.Client, method, u, token string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, method, u, nil)
	if err != nil {
		return nil, err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		msg := strings.TrimSpace(string(body))
		var e struct{ Error string }
		if json.Unmarshal(body, &e) == nil && e.Error != "" {
			msg = e.Error
		}
		return nil, fmt.Errorf("%s: %s", resp.Status, msg)
	}
	return body, nil
}

func show(w io.Writer, body []byte, asJSON bool, printer func(io.Writer, []byte) error) error {
	if asJSON {
		_, err := w.Write(body)
		return err
	}
	return printer(w, body)
}

func decode[T any](body []byte) (T, error) {
	var v T
	err := json.Unmarshal(body, &v)
	if err != nil {
		err = fmt.Errorf("bad reply: %w", err)
	}
	return v, err
}

func table(w io.Writer, header string, rows func(tw io.Writer)) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, header)
	rows(tw)
	return tw.Flush()
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func printStatus(w io.Writer, body []byte) error {
	st, err := decode[admin.Status](body)
	if err != nil {
		return err
	}
	peers := "none (single server)"
	if len(st.Peers) > 0 {
		var ps []string
		for _, p := range st.Peers {
			ps = append(ps, fmt.Sprintf("%v %s reachable=%v", p.ID, p.Addr, p.Reachable))
		}
		peers = strings.Join(ps, ", ")
	}
	return table(w, "FIELD\tVALUE", func(tw io.Writer) {
		fmt.Fprintf(tw, "server\t%v\n", st.ServerID)
		fmt.Fprintf(tw, "version\t%s\n", st.Version)
		fmt.Fprintf(tw, "listen\t%s\n", st.Listen)
		fmt.Fprintf(tw, "uptime\t%v\n", st.Uptime.Round(time.Second))
		fmt.Fprintf(tw, "cpus\t%d\n", st.CPUs)
		fmt.Fprintf(tw, "client lease\t%v (δ %g)\n", st.ClientLease, st.ClockDrift)
		fmt.Fprintf(tw, "in grace\t%v\n", st.InGrace)
		fmt.Fprintf(tw, "peers\t%s\n", peers)
		fmt.Fprintf(tw, "store\t%d bytes (LSM %d, value log %d)\n", st.StoreLSM+st.StoreVlog, st.StoreLSM, st.StoreVlog)
		fmt.Fprintf(tw, "blocks\t%d bytes in %d blocks, %d bytes free; %d store errors\n", st.BlockBytes, st.Blocks, st.BlockFree, st.BlockStoreErrors)
		fmt.Fprintf(tw, "sessions\t%d\n", st.Sessions)
		fmt.Fprintf(tw, "failing\t%d\n", st.Failing)
		fmt.Fprintf(tw, "locked inodes\t%d\n", st.LockedInodes)
	})
}

func printClients(w io.Writer, body []byte) error {
	cs, err := decode[[]admin.ClientInfo](body)
	if err != nil {
		return err
	}
	return table(w, "CLIENT\tHOST\tMOUNTPOINT\tADDRESS\tSTATE\tLAST REQUEST\tDATA LOCKS\tOPEN FILES\tUP\tVERSION", func(tw io.Writer) {
		for _, c := range cs {
			state := c.State
			if c.State == "failing" {
				state = fmt.Sprintf("failing (%v left)", c.FailingLeft.Round(time.Millisecond))
			}
			last := "-"
			if !c.LastSeen.IsZero() {
				last = time.Since(c.LastSeen).Round(time.Millisecond).String() + " ago"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\t%v\t%s\n", c.Client, dash(c.Host), dash(c.Mountpoint), dash(c.Addr), state, last,
				c.DataLocks, c.OpenFiles, c.Uptime.Round(time.Second), dash(c.Version))
		}
	})
}

// allLocks reads every page of /api/locks and returns them as one
// admin.LockPage. A table that changes meanwhile can show a lock twice or
// miss one that moved between pages.
func allLocks(ctx context.Context, ac *adminClient) ([]byte, error) {
	all := admin.LockPage{Locks: []admin.LockInfo{}}
	for {
		body, err := ac.do(ctx, "GET", fmt.Sprintf("/api/locks?offset=%d&limit=%d", len(all.Locks), admin.LocksLimitMax))
		if err != nil {
			return nil, err
		}
		p, err := decode[admin.LockPage](body)
		if err != nil {
			return nil, err
		}
		all.Locks = append(all.Locks, p.Locks...)
		if len(p.Locks) == 0 || len(all.Locks) >= p.Total {
			all.Total, all.Limit = len(all.Locks), len(all.Locks)
			b, err := json.MarshalIndent(all, "", "  ")
			return append(b, '\n'), err
		}
	}
}

func printLocks(w io.Writer, body []byte) error {
	p, err := decode[admin.LockPage](body)
	if err != nil {
		return err
	}
	return table(w, "INODE\tPATH\tKIND\tMODE\tCLIENT\tSTATE\tRANGE", func(tw io.Writer) {
		for _, l := range p.Locks {
			state := "held"
			switch {
			case l.Waiting:
				state = "waiting"
			case l.Revoking != "":
				state = "revoking to " + l.Revoking
			}
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\n", uint64(l.Ino), dash(l.Path), l.Kind, l.Mode, l.Client, state, dash(l.Range))
		}
	})
}

func printOwners(w io.Writer, body []byte) error {
	owners, err := decode[[]admin.OwnerInfo](body)
	if err != nil {
		return err
	}
	return table(w, "INODE\tPATH\tOWNER\tEPOCH\tEXPIRY", func(tw io.Writer) {
		for _, o := range owners {
			exp := "- (single server)"
			if !o.Expiry.IsZero() {
				exp = o.Expiry.Format(time.RFC3339Nano)
			}
			fmt.Fprintf(tw, "%d\t%s\t%v\t%d\t%s\n", uint64(o.Ino), dash(o.Path), o.Owner, uint64(o.Epoch), exp)
		}
	})
}

func printCounters(w io.Writer, body []byte) error {
	// Print in the API's field order, whatever it grows to.
	var m map[string]json.Number
	if err := json.Unmarshal(body, &m); err != nil {
		return fmt.Errorf("bad reply: %w", err)
	}
	var order []string
	dec := json.NewDecoder(strings.NewReader(string(body)))
	_, _ = dec.Token()
	for dec.More() {
		k, err := dec.Token()
		if err != nil {
			break
		}
		order = append(order, k.(string))
		_, _ = dec.Token()
	}
	return table(w, "COUNTER\tVALUE", func(tw io.Writer) {
		for _, k := range order {
			fmt.Fprintf(tw, "%s\t%s\n", k, m[k])
		}
	})
}

func printEvict(w io.Writer, body []byte) error {
	ev, err := decode[admin.EvictResult](body)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s evicted: NACKed from now on; its locks are stolen in %v\n", ev.Client, ev.StealIn.Round(time.Millisecond))
	return err
}

func printMount(w io.Writer, body []byte) error {
	ms, err := decode[mountStatus](body)
	if err != nil {
		return err
	}
	st := ms.Stats
	if err := table(w, "FIELD\tVALUE", func(tw io.Writer) {
		fmt.Fprintf(tw, "mountpoint\t%s\n", ms.Mountpoint)
		fmt.Fprintf(tw, "server\t%s (sessions with %d)\n", ms.Server, st.Servers)
		fmt.Fprintf(tw, "client\t%s\n", ms.Client)
		fmt.Fprintf(tw, "version\t%s\n", ms.Version)
		fmt.Fprintf(tw, "session\t%s\n", ms.Session)
		fmt.Fprintf(tw, "pid, cpus\t%d, %d\n", ms.Pid, ms.CPUs)
		fmt.Fprintf(tw, "lease left\t%v\n", st.LeaseLeft.Round(time.Millisecond))
		fmt.Fprintf(tw, "cached inodes\t%d (hits %d, misses %d)\n", st.CachedInodes, st.Hits, st.Misses)
		fmt.Fprintf(tw, "cached data\t%d KiB (buffered writes %d KiB)\n", st.CachedDataBytes>>10, st.DirtyBytes>>10)
		fmt.Fprintf(tw, "locks held\t%d\n", len(st.Locks))
		fmt.Fprintf(tw, "requests\t%d (explicit renewals %d)\n", st.Requests, st.LeaseStats.Renewals)
		fmt.Fprintf(tw, "nacks received\t%d\n", st.NacksReceived)
		fmt.Fprintf(tw, "recoveries\t%d\n", st.Recoveries)
		fmt.Fprintf(tw, "revocations\t%d\n", st.Revocations)
		fmt.Fprintf(tw, "redirects\t%d\n", st.Redirects)
		fmt.Fprintf(tw, "removals, creates sent behind\t%d, %d (in %d batches of several; %d creates with the file's data)\n",
			st.RemovedBehind, st.CreatedBehind, st.BehindBatches, st.CreatedWithData)
		fmt.Fprintf(tw, "block store\t%s\n", st.Blocks)
	}); err != nil {
		return err
	}
	if len(st.Locks) == 0 {
		return nil
	}
	fmt.Fprintln(w)
	return table(w, "INODE\tMODE\tSEQ", func(tw io.Writer) {
		for _, g := range st.Locks {
			fmt.Fprintf(tw, "%d\t%v\t%d\n", uint64(g.Ino), g.Mode, g.Seq)
		}
	})
}

func printLoginLink(w io.Writer, body []byte) error {
	l, err := decode[admin.LoginLink](body)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "Open within %v, once, in a browser on a machine that reaches the endpoint:\n%s\n",
		time.Until(l.Expires).Round(time.Second), l.URL)
	return err
}

func printChecksum(w io.Writer, body []byte) error {
	c, err := decode[admin.ChecksumInfo](body)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "server %v  checksum %s  (%s)\n", c.Server, c.Checksum, c.Took)
	return err
}

func printPath(w io.Writer, body []byte) error {
	p, err := decode[admin.PathInfo](body)
	if err != nil {
		return err
	}
	return table(w, "INODE\tPATH\tLINKS", func(tw io.Writer) {
		fmt.Fprintf(tw, "%d\t%s\t%d\n", uint64(p.Ino), p.Path, p.Links)
	})
}
