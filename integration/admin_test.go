package integration

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/leasefs/leasefs/internal/testnet"
	"github.com/leasefs/leasefs/transport"
)

// admin runs `leasefs admin` and returns its output.
func admin(t testing.TB, args ...string) string {
	t.Helper()
	return run(t, "", binary, append([]string{"admin"}, args...)...)
}

// mountClient asks a mount for its client id through its status socket.
func mountClient(t *testing.T, m *mount) (id string, recoveries int64) {
	t.Helper()
	id, st := mountStats(t, m)
	return id, st.Recoveries
}

// mountCounters are counters of a mount's client (client.Stats).
type mountCounters struct {
	Recoveries      int64 `json:"recoveries"`
	NacksReceived   int64 `json:"nacks_received"`
	Redirects       int64 `json:"redirects"`
	DataLost        int64 `json:"data_lost"`
	RemovedBehind   int64 `json:"removed_behind"`
	CreatedBehind   int64 `json:"created_behind"`
	CreatedWithData int64 `json:"created_with_data"`
	BehindBatches   int64 `json:"behind_batches"`
	DirtyBytes      int64 `json:"dirty_bytes"`
	Requests        int64 `json:"requests"`
	Servers         int   `json:"servers"`
}

// mountStats returns a mount's client id and counters.
func mountStats(t testing.TB, m *mount) (id string, _ mountCounters) {
	t.Helper()
	var st struct {
		Client string        `json:"client"`
		Stats  mountCounters `json:"stats"`
	}
	out := admin(t, "--mount", m.dir, "status", "--json")
	if err := json.Unmarshal([]byte(out), &st); err != nil || !strings.HasPrefix(st.Client, "client:") {
		t.Fatalf("mount status: %v\n%s", err, out)
	}
	return st.Client, st.Stats
}

// row reports whether some line of a table has all the fields, in order,
// each as whole whitespace-separated words.
func row(table string, fields ...string) bool {
	parts := make([]string, len(fields))
	for i, f := range fields {
		parts[i] = regexp.QuoteMeta(f)
	}
	// Whole fields only: "0" must not match "10".
	re := regexp.MustCompile(`(?m)^(?:.*\s)?` + strings.Join(parts, `\s+(?:.*\s)?`) + `(?:\s.*)?$`)
	return re.MatchString(table)
}

// TestAdmin: a server with --admin and two mounts; the CLI tables show the
// traffic and the flock; the status page renders in headless Chromium;
// evicting one mount's client makes it recover while the other proceeds.
func TestAdmin(t *testing.T) {
	s := startServer(t, "--admin", testnet.TCPAddr(t), "--client-lease", "500ms", "--delivery-timeout", "100ms")
	a, b := startMount(t, s), startMount(t, s)
	srv := s.adminArgs()

	must(t, os.WriteFile(filepath.Join(a.dir, "x"), []byte("from a"), 0o644))
	must(t, os.WriteFile(filepath.Join(b.dir, "y"), []byte("from b"), 0o644))
	lockf, err := os.OpenFile(filepath.Join(a.dir, "lock"), os.O_CREATE|os.O_RDWR, 0o644)
	must(t, err)
	defer lockf.Close()
	must(t, syscall.Flock(int(lockf.Fd()), syscall.LOCK_EX))
	var lockIno uint64
	if st, err := lockf.Stat(); err == nil {
		lockIno = st.Sys().(*syscall.Stat_t).Ino
	}
	idA, _ := mountClient(t, a)
	idB, _ := mountClient(t, b)
	if idA == idB {
		t.Fatalf("both mounts report client %s", idA)
	}

	status := admin(t, append(srv, "status")...)
	if !row(status, "sessions", "2") || !row(status, "failing", "0") || !row(status, "peers", "none") ||
		!row(status, "version", "devel") || !strings.Contains(status, runtime.Version()) {
		t.Errorf("status table:\n%s", status)
	}
	clients := admin(t, append(srv, "clients")...)
	if !row(clients, idA, a.dir, "normal") || !row(clients, idB, b.dir, "normal") || !row(clients, idA, "devel") {
		t.Errorf("clients table lacks %s and %s as normal:\n%s", idA, idB, clients)
	}
	lockTable := admin(t, append(srv, "locks")...)
	if !row(lockTable, itoa(int(lockIno)), "/lock", "flock", "write", idA, "held") {
		t.Errorf("locks table lacks the flock of %s on inode %d:\n%s", idA, lockIno, lockTable)
	}
	if !row(lockTable, "data", idB) {
		t.Errorf("locks table lacks a data lock of %s:\n%s", idB, lockTable)
	}
	must(t, os.MkdirAll(filepath.Join(a.dir, "d1", "d2"), 0o755))
	must(t, os.Link(filepath.Join(a.dir, "lock"), filepath.Join(a.dir, "d1", "d2", "lock2")))
	must(t, a.sync())
	if p := admin(t, append(srv, "path", itoa(int(lockIno)))...); !row(p, itoa(int(lockIno)), "/lock", "2") && !row(p, itoa(int(lockIno)), "/d1/d2/lock2", "2") {
		t.Errorf("admin path %d:\n%s", lockIno, p)
	}
	if p := admin(t, append(srv, "inode", "/d1/d2/lock2")...); !row(p, itoa(int(lockIno)), "/d1/d2/lock2", "2") {
		t.Errorf("admin inode /d1/d2/lock2:\n%s", p)
	}
	if out, err := runErr("", binary, append(append([]string{"admin"}, srv...), "path", "123456789")...); err == nil || !strings.Contains(out, "no such inode") {
		t.Errorf("admin path of a made-up inode: %v\n%s", err, out)
	}
	owners := admin(t, append(srv, "owners")...)
	if !row(owners, itoa(int(lockIno)), "server:1", "0") {
		t.Errorf("owners table:\n%s", owners)
	}
	counters := admin(t, append(srv, "counters")...)
	if !row(counters, "sessions_opened", "2") || !row(counters, "clients_failed", "0") {
		t.Errorf("counters table:\n%s", counters)
	}
	mstat := admin(t, "--mount", a.dir, "status")
	if !row(mstat, "client", idA) || !row(mstat, "lease left") || !row(mstat, "nacks received", "0") || !row(mstat, "version", "devel") {
		t.Errorf("mount status:\n%s", mstat)
	}
	if out, err := runErr("", binary, append(append([]string{"admin"}, srv...), "evict", "client:00000000000000ff")...); err == nil ||
		!strings.Contains(out, "no such client") {
		t.Errorf("evicting an unknown client: %v\n%s", err, out)
	}

	for _, args := range [][]string{{"version"}, {"--version"}} {
		if out := run(t, "", binary, args...); !strings.HasPrefix(out, "leasefs devel") || !strings.Contains(out, runtime.Version()) {
			t.Errorf("leasefs %s: %q", args[0], out)
		}
	}

	t.Run("chromium", func(t *testing.T) { statusPage(t, s, idA, idB) })

	// Evict a: it is NACKed; b goes on working meanwhile.
	out := admin(t, append(srv, "evict", idA)...)
	if !strings.Contains(out, idA+" evicted") {
		t.Fatalf("evict: %s", out)
	}
	if clients := admin(t, append(srv, "clients")...); !row(clients, idA, "failing") || !row(clients, idB, "normal") {
		t.Errorf("clients after evict:\n%s", clients)
	}
	must(t, os.WriteFile(filepath.Join(b.dir, "during"), []byte("b proceeds"), 0o644))
	if got, err := os.ReadFile(filepath.Join(b.dir, "x")); err != nil || string(got) != "from a" {
		t.Errorf("b reads x during a's eviction: %q %v", got, err)
	}
	// a's next operations work after its NACK recovery.
	start := time.Now()
	must(t, os.WriteFile(filepath.Join(a.dir, "after"), []byte("a recovered"), 0o644))
	if got, err := os.ReadFile(filepath.Join(a.dir, "during")); err != nil || string(got) != "b proceeds" {
		t.Errorf("a reads b's file after recovery: %q %v", got, err)
	}
	t.Logf("a's first operation after eviction took %v", time.Since(start))
	// The recovery counts itself done after it opened the new session,
	// which a's operations may already have used.
	waitFor(t, 5*time.Second, "mount a to count and log its recovery", func() bool {
		_, rec := mountClient(t, a)
		return rec >= 1 && strings.Contains(a.output(), "recovery done")
	})
	if !strings.Contains(a.output(), "NACK received") {
		t.Errorf("mount a logged no NACK")
	}
	waitFor(t, 5*time.Second, "a back to normal in the clients table", func() bool {
		return row(admin(t, append(srv, "clients")...), idA, "normal")
	})
	if got, err := os.ReadFile(filepath.Join(b.dir, "after")); err != nil || string(got) != "a recovered" {
		t.Errorf("b reads a's file written after recovery: %q %v", got, err)
	}
	counters = admin(t, append(srv, "counters")...)
	if !row(counters, "clients_failed", "1") || !row(counters, "clients_expired", "1") || row(counters, "nacks_sent", "0") {
		t.Errorf("counters after eviction:\n%s", counters)
	}
	if lt := admin(t, append(srv, "locks")...); strings.Contains(lt, "flock") {
		t.Errorf("a's flock survived its eviction:\n%s", lt)
	}
}

// statusPage loads the status page in headless Chromium, signed in by the
// one-time link of `leasefs admin page`, and checks that the rendered DOM
// shows both clients and the flock, and still does in a later browser run
// on the cookie the first one kept; then takes a screenshot.
func statusPage(t *testing.T, s *server, idA, idB string) {
	bin := ""
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			bin = p
			break
		}
	}
	if bin == "" {
		t.Skip("chromium not installed (.ci/run installs it)")
	}
	dir := t.TempDir()
	flags := []string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
		"--user-data-dir=" + filepath.Join(dir, "profile"), "--window-size=1280,900"}
	url := "http://" + s.adminAddr() + "/"
	if dom := run(t, dir, bin, append(flags, "--dump-dom", url)...); strings.Contains(dom, idA) || !strings.Contains(dom, "leasefs admin --server") {
		t.Errorf("the status page without signing in:\n%s", dom)
	}
	link := regexp.MustCompile(`http://\S+/login\?once=[0-9a-f]+`).FindString(admin(t, append(s.adminArgs(), "page")...))
	if link == "" {
		t.Fatal("leasefs admin page printed no link")
	}
	dom := run(t, dir, bin, append(flags, "--dump-dom", link)...)
	for _, want := range []string{idA, idB, "flock", "2 sessions", "none (single server)"} {
		if !strings.Contains(dom, want) {
			t.Errorf("rendered status page lacks %q:\n%s", want, dom)
		}
	}
	// another browser run, on the cookie the first one kept
	if dom := run(t, dir, bin, append(flags, "--dump-dom", url)...); !strings.Contains(dom, idA) {
		t.Errorf("the status page on the kept cookie lacks %s:\n%s", idA, dom)
	}
	shot := filepath.Join(dir, "status.png")
	run(t, dir, bin, append(flags, "--screenshot="+shot, url)...)
	if st, err := os.Stat(shot); err != nil || st.Size() < 1000 {
		t.Errorf("screenshot %s: %v", shot, err)
	} else {
		t.Logf("screenshot: %s (%d bytes)", shot, st.Size())
	}
}

// TestMountSync: `leasefs admin --mount M sync` returns once everything the
// mount buffered is at the server: a mount killed right after it (no
// unmount, so no flush of its own) lost nothing. What it had buffered, all
// under X locks: a file created behind the caller, writes to a file another
// process holds open, and a change of times of a closed file (tar's utimes).
func TestMountSync(t *testing.T) {
	// a's packets take 20 ms: what it sends behind is still on its way
	// when the sync starts
	a, b, d := behindMounts(t, startServer(t), "delay=20ms")
	_, before := mountStats(t, a)
	f, err := os.OpenFile(filepath.Join(d, "empty"), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	must(t, err)
	must(t, f.Close())
	must(t, os.WriteFile(filepath.Join(d, "stamped"), []byte("tar"), 0o644))
	stamp := time.Date(2009, 11, 10, 23, 0, 0, 0, time.UTC)
	must(t, os.Chtimes(filepath.Join(d, "stamped"), stamp, stamp))
	// Another process writes and keeps the file open: a close of any copy
	// of the descriptor flushes the file, and this test process starts
	// processes (admin), whose copies close at exec.
	startHelper(t, "TestMountSyncHolder", filepath.Join(d, "open"), "written")
	_, st := mountStats(t, a)
	if n := st.CreatedBehind - before.CreatedBehind; n < 3 {
		t.Fatalf("%d creates went behind, want 3", n)
	}
	if st.DirtyBytes != int64(len(syncHeld)) {
		t.Fatalf("%d bytes buffered before the sync, want %d", st.DirtyBytes, len(syncHeld))
	}

	admin(t, "--mount", a.dir, "sync")
	if _, st := mountStats(t, a); st.DirtyBytes != 0 {
		t.Fatalf("%d bytes still buffered after the sync", st.DirtyBytes)
	}
	a.kill() // within flushAge of the writes: the mount flushed nothing itself

	got, err := os.ReadFile(filepath.Join(b.dir, "d", "open"))
	must(t, err)
	if !bytes.Equal(got, syncHeld) {
		t.Fatalf("the open file holds %d bytes at the server, want the %d written before the sync", len(got), len(syncHeld))
	}
	fi, err := os.Stat(filepath.Join(b.dir, "d", "stamped"))
	must(t, err)
	if !fi.ModTime().Equal(stamp) {
		t.Fatalf("mtime %v at the server, want %v", fi.ModTime(), stamp)
	}
	if _, err := os.Stat(filepath.Join(b.dir, "d", "empty")); err != nil {
		t.Fatalf("the file created behind is not at the server: %v", err)
	}
}

var syncHeld = bytes.Repeat([]byte("buffered "), 20000)

// TestMountSyncHolder is TestMountSync's writer process: it writes
// syncHeld to the file its argument names and keeps it open until its test
// is done.
func TestMountSyncHolder(t *testing.T) {
	path := helperArg()
	if path == "" {
		t.Skip("run by TestMountSync")
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	must(t, err)
	_, err = f.Write(syncHeld)
	must(t, err)
	helperWait("written")
	_ = f.Close()
}

// TestCPUs: a mount and a server use the CPUs --cpus gives them, or
// GOMAXPROCS from the environment; by default a mount half the machine's
// (at least 1), and a server one once idle (cmd/leasefs/cpus.go; all
// while busy, TestCPUPolicy).
func TestCPUs(t *testing.T) {
	cpus := func(args ...string) int {
		var st struct{ CPUs int }
		out := admin(t, append(args, "status", "--json")...)
		if err := json.Unmarshal([]byte(out), &st); err != nil {
			t.Fatalf("status: %v\n%s", err, out)
		}
		return st.CPUs
	}
	orEnv := func(n int) int {
		if env := os.Getenv("GOMAXPROCS"); env != "" {
			n, _ = strconv.Atoi(env)
		}
		return n
	}
	s := startServer(t, "--admin", testnet.TCPAddr(t), "--cpus", "3")
	if n := cpus(s.adminArgs()...); n != 3 {
		t.Errorf("serve --cpus 3: the server uses %d", n)
	}
	idle := startServer(t, "--admin", testnet.TCPAddr(t))
	want := orEnv(1)
	waitFor(t, 10*time.Second, fmt.Sprintf("the idle server to use %d CPUs", want), func() bool {
		return cpus(idle.adminArgs()...) == want
	})
	if n := cpus("--mount", startMount(t, s, "--cpus", "3").dir); n != 3 {
		t.Errorf("mount --cpus 3: the mount uses %d", n)
	}
	// this process's default is the mount's
	if n, want := cpus("--mount", startMount(t, s).dir), orEnv(max(1, runtime.GOMAXPROCS(0)/2)); n != want {
		t.Errorf("by default the mount uses %d CPUs, want %d", n, want)
	}
}

// TestAdminEndpointAuth: a server's loopback admin endpoint answers
// /metrics and /healthz to anyone, the rest only with the admin token;
// `leasefs admin` works with the join token file (it derives the admin
// token) and refuses a server of another cluster (its token pins another
// certificate).
func TestAdminEndpointAuth(t *testing.T) {
	s := startServer(t, "--admin", testnet.TCPAddr(t))
	for path, want := range map[string]int{"/metrics": 200, "/healthz": 200, "/api/status": 401, "/api/clients": 401,
		"/debug/pprof/": 401, "/": 401} {
		resp, err := http.Get("http://" + s.adminAddr() + path)
		must(t, err)
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("GET %s without credential: %d, want %d", path, resp.StatusCode, want)
		}
	}
	// over TLS as well, pinned
	tok, err := transport.ReadAdminTokenFile(s.tokenFile)
	must(t, err)
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: transport.PinnedTLS(tok.CertHash)}}
	resp, err := hc.Get("https://" + s.adminAddr() + "/api/status")
	must(t, err)
	resp.Body.Close()
	if resp.StatusCode != 401 {
		t.Errorf("GET /api/status over TLS without credential: %d", resp.StatusCode)
	}
	if _, err := os.Stat(filepath.Join(s.dir, "admin-token")); err != nil {
		t.Fatalf("no admin-token in the data directory: %v", err)
	}

	out := admin(t, "--server", s.adminAddr(), "--token-file", s.tokenFile, "status")
	if !row(out, "server", "server:1") {
		t.Errorf("status with the join token file:\n%s", out)
	}
	other := startServer(t)
	out, err = runErr("", binary, "admin", "--server", s.adminAddr(), "--token-file", other.tokenFile, "status")
	if err == nil || !strings.Contains(out, "does not present the cluster certificate") {
		t.Errorf("admin with another cluster's token: %v\n%s", err, out)
	}
}

// TestMetrics: /metrics has the Go and process collectors, the build, and
// request results as short codes (a lookup of a missing name: enoent).
func TestMetrics(t *testing.T) {
	s := startServer(t, "--admin", testnet.TCPAddr(t))
	m := startMount(t, s, "--blocks-remote") // its blocks go through the server's store calls
	if _, err := os.Stat(filepath.Join(m.dir, "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("stat of a missing name: %v", err)
	}
	must(t, os.WriteFile(filepath.Join(m.dir, "f"), []byte("x"), 0o644))
	must(t, os.WriteFile(filepath.Join(m.dir, "big"), bytes.Repeat([]byte("y"), 1<<20), 0o644))
	resp, err := http.Get("http://" + s.adminAddr() + "/metrics")
	must(t, err)
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	must(t, err)
	for _, want := range []string{
		`leasefs_build_info{commit="",goversion="` + runtime.Version() + `",version="devel"} 1`,
		`leasefs_request_duration_seconds_count{op="lookup",result="enoent"}`,
		`leasefs_request_duration_seconds_count{op="create",result="ok"}`,
		"go_goroutines ", "process_resident_memory_bytes ", "leasefs_wire_bytes_total ", "leasefs_block_free_bytes ",
		"leasefs_block_store_errors_total 0", `leasefs_block_store_duration_seconds_count{op="put",result="ok"} 1`,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}

// TestMountMetrics: mount --metrics serves the mount's own metrics: its
// requests by operation and result, cache, lease renewals, bytes.
func TestMountMetrics(t *testing.T) {
	s := startServer(t)
	addr := testnet.TCPAddr(t)
	m := startMount(t, s, "--metrics", addr)
	if _, err := os.Stat(filepath.Join(m.dir, "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("stat of a missing name: %v", err)
	}
	must(t, os.WriteFile(filepath.Join(m.dir, "f"), bytes.Repeat([]byte("x"), 1000), 0o644))
	must(t, m.sync())
	resp, err := http.Get("http://" + addr + "/metrics")
	must(t, err)
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	must(t, err)
	for _, want := range []string{
		`leasefs_mount_request_duration_seconds_count{op="lookup",result="enoent"}`,
		`leasefs_mount_request_duration_seconds_count{op="write",result="ok"} 1`,
		"leasefs_mount_written_bytes_total 1000", "leasefs_mount_cache_hits_total ",
		"leasefs_mount_lease_renewals_implicit_total ", "leasefs_mount_lease_renewals_explicit_total ",
		"leasefs_mount_nacks_received_total 0", "leasefs_mount_dirty_bytes 0", `leasefs_build_info{`, "go_goroutines ",
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("mount /metrics lacks %q:\n%s", want, grepLines(string(body), "leasefs_mount"))
		}
	}
}

// grepLines returns the lines of s that contain sub.
func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) && !strings.HasPrefix(l, "#") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
