package admin

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/leasefs/leasefs/internal/clock"
	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/metaserver/ownership"
)

// lockSource is a server with the given clients and locks.
type lockSource struct {
	fakeSource
	clients []ClientInfo
	locks   []LockInfo
	peers   []ownership.PeerStatus // a cluster: it owns the locked inodes
}

// Paths places every inode at /dir/N.
func (s lockSource) Paths(inos []ids.Ino, _ int) map[ids.Ino]PathInfo {
	out := map[ids.Ino]PathInfo{}
	for _, ino := range inos {
		out[ino] = PathInfo{Ino: ino, Path: fmt.Sprintf("/dir/%d", ino), Links: 1}
	}
	return out
}

func (s lockSource) Status() Status {
	return Status{Peers: append([]ownership.PeerStatus{}, s.peers...)}
}

func (s lockSource) Clients() []ClientInfo { return s.clients }
func (s lockSource) Locks() []LockInfo     { return s.locks }
func (s lockSource) Owners() []OwnerInfo {
	out := []OwnerInfo{}
	for _, l := range s.locks {
		if len(out) == 0 || out[len(out)-1].Ino != l.Ino {
			out = append(out, OwnerInfo{Ino: l.Ino, Owner: 1})
		}
	}
	return out
}

func client(i int) string { return ids.ClientID(i).String() }

// TestSummarize: counts by kind and mode, clients by number of locks (top
// 20), inodes by waiters then holders (only contended ones).
func TestSummarize(t *testing.T) {
	locks := []LockInfo{
		{Ino: 5, Kind: "data", Mode: "S", Client: client(1)},
		{Ino: 5, Kind: "data", Mode: "S", Client: client(2), Revoking: "none"},
		{Ino: 5, Kind: "data", Mode: "X", Client: client(3), Waiting: true},
		{Ino: 7, Kind: "flock", Mode: "write", Client: client(1)},
		{Ino: 7, Kind: "flock", Mode: "write", Client: client(2), Waiting: true},
		{Ino: 7, Kind: "flock", Mode: "write", Client: client(3), Waiting: true},
		{Ino: 9, Kind: "fcntl", Mode: "read", Client: client(1), Range: "0-EOF"},
		{Ino: 9, Kind: "fcntl", Mode: "read", Client: client(2), Range: "0-9"},
	}
	for i := range 30 { // clients 100..129 with 1..30 data locks each
		for j := range i + 1 {
			locks = append(locks, LockInfo{Ino: ids.Ino(1000 + j), Kind: "data", Mode: "S", Client: client(100 + i)})
		}
	}
	s := summarize(locks, []ClientInfo{{Client: client(129), Host: "h129", Mountpoint: "/mnt/x"}})
	if s.Locks != len(locks) || s.Waiting != 3 || s.Held != len(locks)-3 || s.Revoking != 1 || s.Clients != 33 || s.Inodes != 33 {
		t.Errorf("summary: %d locks, %d held, %d waiting, %d revoking, %d clients, %d inodes", s.Locks, s.Held, s.Waiting, s.Revoking, s.Clients, s.Inodes)
	}
	kinds := fmt.Sprint(s.Kinds)
	if want := "[{data 467 1 [{S 467}]} {flock 1 2 [{write 1}]} {fcntl 2 0 [{read 2}]}]"; kinds != want {
		t.Errorf("kinds %s, want %s", kinds, want)
	}
	if len(s.TopClients) != 20 {
		t.Fatalf("%d top clients, want 20", len(s.TopClients))
	}
	if c := s.TopClients[0]; c.Client != client(129) || c.Total != 30 || c.Data != 30 || c.Host != "h129" || c.Mountpoint != "/mnt/x" {
		t.Errorf("top client %+v", c)
	}
	if c := s.TopClients[19]; c.Total != 11 {
		t.Errorf("20th client %+v, want 11 locks", c)
	}
	// 1000 has 30 holders, 1001 29, ...; 5 and 7 have waiters and come first
	if len(s.Contended) != 32 || s.ContendedInodes != 32 { // 5, 7, 9 and 1000..1028
		t.Fatalf("%d contended inodes (%d in all): %+v", len(s.Contended), s.ContendedInodes, s.Contended)
	}
	want := []InodeContention{{Ino: 7, Holders: 1, Waiters: 2, Clients: 3}, {Ino: 5, Holders: 2, Waiters: 1, Clients: 3},
		{Ino: 1000, Holders: 30, Clients: 30}, {Ino: 1001, Holders: 29, Clients: 29}}
	for i, w := range want {
		if s.Contended[i] != w {
			t.Errorf("contended %d: %+v, want %+v", i, s.Contended[i], w)
		}
	}
	if e := summarize(nil, nil); e.Locks != 0 || len(e.Kinds) != 3 || e.TopClients == nil || e.Contended == nil {
		t.Errorf("summary of no locks: %+v", e)
	}
}

// TestPageOf: pages, links that keep the rest of the query, offsets out
// of range.
func TestPageOf(t *testing.T) {
	all := make([]int, 250)
	for i := range all {
		all[i] = i
	}
	q := func(s string) url.Values { v, _ := url.ParseQuery(s); return v }
	for _, c := range []struct {
		query                string
		first, last          int
		prev, next, firstRow string
	}{
		{"", 1, 100, "", "?locks=100", "0"},
		{"locks=100&owners=50", 101, 200, "?owners=50", "?locks=200&owners=50", "100"},
		{"locks=150", 151, 250, "?locks=50", "", "150"},
		{"locks=9999", 201, 250, "?locks=100", "", "200"},
		{"locks=-4", 1, 100, "", "?locks=100", "0"},
		{"locks=x", 1, 100, "", "?locks=100", "0"},
	} {
		p := pageOf(all, q(c.query), "locks", 100)
		if p.First != c.first || p.Last != c.last || p.Prev != c.prev || p.Next != c.next || p.Total != 250 || fmt.Sprint(p.Rows[0]) != c.firstRow {
			t.Errorf("?%s: rows %d-%d (first %d), prev %q, next %q", c.query, p.First, p.Last, p.Rows[0], p.Prev, p.Next)
		}
	}
	if p := pageOf(all, q("locks=100"), "locks", 100); p.Prev != "./" {
		t.Errorf("the link back to the first page: %q", p.Prev)
	}
	if p := pageOf([]int{}, q("locks=100"), "locks", 100); p.First != 0 || len(p.Rows) != 0 || p.Prev != "" || p.Next != "" {
		t.Errorf("page of nothing: %+v", p)
	}
}

// manyLocks is a table of n data locks of two clients, and the two
// clients.
func manyLocks(n int) lockSource {
	src := lockSource{clients: []ClientInfo{{Client: client(1), Host: "alpha", Mountpoint: "/mnt/a", State: "normal"},
		{Client: client(2), Host: "beta", Mountpoint: "/mnt/b", State: "normal"}}}
	for i := range n {
		src.locks = append(src.locks, LockInfo{Ino: ids.Ino(100 + i), Kind: "data", Mode: "X", Client: client(1 + i%2)})
	}
	return src
}

// TestLocksAPI: /api/locks pages with offset and limit, says the total,
// and refuses limits out of range.
func TestLocksAPI(t *testing.T) {
	a, _ := startAdminOf(t, Config{}, manyLocks(2500))
	tok := bearer(a.adminToken())
	get := func(path string) (int, LockPage) {
		resp, body := adminDo(t, a, false, "GET", path, tok)
		var p LockPage
		if resp.StatusCode == http.StatusOK {
			if err := json.Unmarshal([]byte(body), &p); err != nil {
				t.Fatalf("%s: %v", path, err)
			}
		}
		return resp.StatusCode, p
	}
	if code, p := get("/api/locks"); code != 200 || p.Total != 2500 || p.Offset != 0 || p.Limit != LocksLimitDefault || len(p.Locks) != LocksLimitDefault || p.Locks[0].Ino != 100 || p.Locks[0].Path != "/dir/100" {
		t.Errorf("default page: %d, total %d, offset %d, limit %d, %d locks", code, p.Total, p.Offset, p.Limit, len(p.Locks))
	}
	if code, p := get("/api/locks?offset=2400&limit=500"); code != 200 || p.Total != 2500 || len(p.Locks) != 100 || p.Locks[0].Ino != 2500 {
		t.Errorf("last page: %d, total %d, %d locks", code, p.Total, len(p.Locks))
	}
	if code, p := get("/api/locks?offset=3000"); code != 200 || p.Total != 2500 || len(p.Locks) != 0 || p.Locks == nil {
		t.Errorf("past the end: %d, total %d, %v", code, p.Total, p.Locks)
	}
	for _, bad := range []string{"limit=0", fmt.Sprintf("limit=%d", LocksLimitMax+1), "offset=-1", "offset=x", "limit=y"} {
		if code, _ := get("/api/locks?" + bad); code != http.StatusBadRequest {
			t.Errorf("?%s: %d, want 400", bad, code)
		}
	}
	resp, body := adminDo(t, a, false, "GET", "/api/locks/summary", tok)
	var s LockSummary
	if err := json.Unmarshal([]byte(body), &s); resp.StatusCode != 200 || err != nil || s.Locks != 2500 || len(s.TopClients) != 2 ||
		!strings.Contains(body, `"top_clients"`) || !strings.Contains(body, `"contended_inodes": 0`) {
		t.Errorf("summary: %d %v\n%.500s", resp.StatusCode, err, body)
	}
}

// TestStatusPage10k: at 10,000 locks the page shows the summaries and one
// page of 100 locks, with a link to the next; it stays small.
func TestStatusPage10k(t *testing.T) {
	a, _ := startAdminOf(t, Config{}, manyLocks(10000))
	tok := bearer(a.adminToken())
	// ten full minutes of trends, all of them changing
	a.trends.mu.Lock()
	for i := range 400 {
		var h latencyHist
		for j := range i {
			h.observe(time.Duration(j+1) * 7 * time.Microsecond)
		}
		n := int64(i * i * 1013)
		a.trends.ring.add(trendTotals{at: clock.Time(i+1) * clock.Time(2*time.Second), wall: time.Now(), requests: n,
			nacks: n / 7, revocations: n / 3, bytesIn: n * 1001, bytesOut: n * 3003, latency: h.snapshot()})
	}
	a.trends.mu.Unlock()
	start := time.Now()
	resp, page := adminDo(t, a, false, "GET", "/", tok)
	took := time.Since(start)
	if resp.StatusCode != 200 {
		t.Fatalf("GET /: %d\n%s", resp.StatusCode, page)
	}
	t.Logf("status page at 10,000 locks: %d bytes in %v", len(page), took)
	if len(page) > 150<<10 {
		t.Errorf("status page of %d bytes, want under 150 KB", len(page))
	}
	for _, want := range []string{"10000 locks: 10000 held, 0 waiting", "on 10000 inodes, by 2 clients",
		"<td>data</td><td>10000</td><td>0</td><td>X 10000</td>",
		"<td>" + client(1) + "</td><td>alpha</td><td>/mnt/a</td><td>5000</td>",
		`href="?locks=100" rel="next"`, "rows 1&ndash;100 of 10000", "every inode in use (10000 locked)",
		"<td>Requests</td>", `<svg class="spark"`, "(last 10 min of at most 10 min, one point per 2 s)"} {
		if !strings.Contains(page, want) {
			t.Errorf("status page lacks %q", want)
		}
	}
	if n := strings.Count(page, "<polyline"); n != 7 {
		t.Errorf("%d sparklines, want 7", n)
	}
	if n := len(regexp.MustCompile(`<td>held</td>`).FindAllString(page, -1)); n != 100 {
		t.Errorf("%d lock rows on the page, want 100", n)
	}
	if strings.Contains(page, "<script") || strings.Contains(page, "http://") || strings.Contains(page, "https://") {
		t.Errorf("the page loads something")
	}
	_, last := adminDo(t, a, false, "GET", "/?locks=9900", tok)
	if !strings.Contains(last, "<td>ino:10099</td>") || strings.Contains(last, "<td>ino:9999</td><td>data") ||
		!strings.Contains(last, `href="?locks=9800" rel="prev"`) || !strings.Contains(last, "rows 9901&ndash;10000 of 10000\n</p>") {
		t.Errorf("the last page of locks lacks inode 10099 or has the wrong links:\n%s", last)
	}
}

// TestStatusPageCluster: a cluster server's page pages the inodes it
// owns as it pages the locks.
func TestStatusPageCluster(t *testing.T) {
	src := manyLocks(120)
	src.peers = []ownership.PeerStatus{{ID: 2, Addr: "127.0.0.1:1", Reachable: true}}
	a, _ := startAdminOf(t, Config{}, src)
	_, page := adminDo(t, a, false, "GET", "/?owners=50&locks=100", bearer(a.adminToken()))
	for _, want := range []string{"<h2>Ownership (120)</h2>", "<td>ino:150</td><td>/dir/150</td><td>server:1</td>", "rows 51&ndash;100 of 120",
		`href="?locks=100" rel="prev"`, `href="?locks=100&amp;owners=100" rel="next"`, "rows 101&ndash;120 of 120"} {
		if !strings.Contains(page, want) {
			t.Errorf("cluster status page lacks %q", want)
		}
	}
	if strings.Contains(page, "<td>ino:149</td><td>server:1</td>") || strings.Contains(page, "Single server") {
		t.Errorf("cluster status page shows owners off its page, or says single server")
	}
}

// TestCharts: each trend is a sparkline of one point per sample, the last
// at the right edge, with its current and peak value.
func TestCharts(t *testing.T) {
	tr := Trends{Period: 2 * time.Second, Window: TrendWindow}
	for i := range 300 {
		tr.Samples = append(tr.Samples, TrendSample{RequestsPerSec: float64(i), LatencyP50: time.Duration(i) * time.Microsecond,
			LatencyP99: 3 * time.Millisecond, BytesInPerSec: 3 << 20, BytesOutPerSec: 512})
	}
	cs := charts(tr)
	if len(cs) != 7 {
		t.Fatalf("%d charts", len(cs))
	}
	byName := map[string]chart{}
	size := 0
	for _, c := range cs {
		byName[c.Name] = c
		size += len(c.SVG)
	}
	if c := byName["Requests"]; c.Current != "299/s" || c.Peak != "299/s" {
		t.Errorf("requests chart: %+v", c)
	}
	if c := byName["Latency p99"]; c.Current != "3ms" {
		t.Errorf("p99 chart: now %q", c.Current)
	}
	if c := byName["Bytes in"]; c.Current != "3.0 MiB/s" {
		t.Errorf("bytes in chart: now %q", c.Current)
	}
	if c := byName["Bytes out"]; c.Current != "512 B/s" {
		t.Errorf("bytes out chart: now %q", c.Current)
	}
	pts := regexp.MustCompile(`points="([^"]*)"`).FindStringSubmatch(string(byName["Requests"].SVG))
	if pts == nil || len(strings.Fields(pts[1])) != 300 || !strings.HasPrefix(pts[1], "0.0,34.0 ") || !strings.HasSuffix(pts[1], " 300.0,2.0") {
		t.Errorf("requests polyline: %.200s", byName["Requests"].SVG)
	}
	if size > 40<<10 {
		t.Errorf("charts of %d bytes", size)
	}
	// a young server's line is not stretched over the whole width
	young := charts(Trends{Period: 2 * time.Second, Window: TrendWindow, Samples: tr.Samples[:2]})
	if pts := regexp.MustCompile(`points="([^"]*)"`).FindStringSubmatch(string(young[0].SVG)); pts == nil || !strings.HasPrefix(pts[1], "289.7,") {
		t.Errorf("two samples: %s", young[0].SVG)
	}
	if s := span(Trends{Period: 2 * time.Second, Samples: tr.Samples[:20]}); s != "40 s" {
		t.Errorf("span of 20 samples: %s", s)
	}
	if s := span(tr); s != "10 min" {
		t.Errorf("span of 300 samples: %s", s)
	}
	if none := charts(Trends{Period: 2 * time.Second, Window: TrendWindow}); none[0].Current != "-" || strings.Contains(string(none[0].SVG), "polyline") {
		t.Errorf("no samples: %+v", none[0])
	}
}
