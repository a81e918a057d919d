package admin

// The status page and the paged lock API: a server may hold tens of
// thousands of locks, so both show summaries and one page of rows, never
// the whole table.

import (
	"cmp"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/leasefs/leasefs/internal/ids"
)

// Page sizes. The API's maximum keeps one answer to a few MB; `leasefs
// admin locks` pages through at that size.
const (
	LocksLimitDefault = 1000
	LocksLimitMax     = 10000
	pageLockRows      = 100 // lock rows on the status page
	pageOwnerRows     = 50
	pageClientRows    = 100
	topClients        = 20
	topContended      = 50
)

// LockPage is /api/locks?offset=N&limit=M: the locks from Offset on, in
// inode order, and how many there are in all. Pages are cut from the table
// as it is at each request: locks taken or dropped between two requests
// can shift rows from one page to the next.
type LockPage struct {
	Total  int        `json:"total"`
	Offset int        `json:"offset"`
	Limit  int        `json:"limit"`
	Locks  []LockInfo `json:"locks"`
}

// LockSummary sums up the lock table (/api/locks/summary and the page).
type LockSummary struct {
	Locks    int         `json:"locks"` // held locks and queued requests
	Held     int         `json:"held"`
	Waiting  int         `json:"waiting"`
	Revoking int         `json:"revoking"`
	Inodes   int         `json:"inodes"`
	Clients  int         `json:"clients"`
	Kinds    []KindCount `json:"kinds"`
	// TopClients are the clients with the most locks (at most 20).
	TopClients []ClientLocks `json:"top_clients"`
	// Contended are the inodes with the most waiters, then the most
	// holders (at most 50), of the ContendedInodes that have a waiter or
	// more than one holder.
	Contended       []InodeContention `json:"contended"`
	ContendedInodes int               `json:"contended_inodes"`
}

// KindCount counts the locks of one kind ("data", "flock", "fcntl").
type KindCount struct {
	Kind    string      `json:"kind"`
	Held    int         `json:"held"`
	Waiting int         `json:"waiting"`
	Modes   []ModeCount `json:"modes"` // held, by mode
}

// ModeCount counts the held locks of one mode.
type ModeCount struct {
	Mode string `json:"mode"`
	N    int    `json:"n"`
}

// ClientLocks counts one client's locks.
type ClientLocks struct {
	Client     string `json:"client"`
	Host       string `json:"host,omitempty"`
	Mountpoint string `json:"mountpoint,omitempty"`
	Data       int    `json:"data"`  // held data locks
	Posix      int    `json:"posix"` // held flock and fcntl locks
	Waiting    int    `json:"waiting"`
	Total      int    `json:"total"`
}

// InodeContention is who holds and waits for one inode.
type InodeContention struct {
	Ino     ids.Ino `json:"ino"`
	Path    string  `json:"path,omitempty"`
	Holders int     `json:"holders"`
	Waiters int     `json:"waiters"`
	Clients int     `json:"clients"`
}

var lockKinds = []string{"data", "flock", "fcntl"}

// summarize sums up locks; clients names hosts and mountpoints.
func summarize(locks []LockInfo, clients []ClientInfo) LockSummary {
	s := LockSummary{Locks: len(locks), Kinds: []KindCount{}, TopClients: []ClientLocks{}, Contended: []InodeContention{}}
	kinds := map[string]*KindCount{}
	modes := map[string]map[string]int{}
	for _, k := range lockKinds {
		kinds[k] = &KindCount{Kind: k}
	}
	byClient := map[string]*ClientLocks{}
	// one slice and two maps, not a map per inode: 10,000 inodes summed up
	// in a few ms
	var inodes []InodeContention
	byIno := map[ids.Ino]int{}
	type pair struct {
		ino    ids.Ino
		client string
	}
	pairs := map[pair]bool{}
	for _, l := range locks {
		k := kinds[l.Kind]
		if k == nil {
			k = &KindCount{Kind: l.Kind}
			kinds[l.Kind] = k
		}
		c := byClient[l.Client]
		if c == nil {
			c = &ClientLocks{Client: l.Client}
			byClient[l.Client] = c
		}
		i, ok := byIno[l.Ino]
		if !ok {
			i = len(inodes)
			byIno[l.Ino] = i
			inodes = append(inodes, InodeContention{Ino: l.Ino})
		}
		in := &inodes[i]
		if p := (pair{l.Ino, l.Client}); !pairs[p] {
			pairs[p] = true
			in.Clients++
		}
		c.Total++
		switch {
		case l.Waiting:
			s.Waiting++
			k.Waiting++
			c.Waiting++
			in.Waiters++
			continue
		case l.Kind == "data":
			c.Data++
		default:
			c.Posix++
		}
		s.Held++
		k.Held++
		in.Holders++
		if l.Revoking != "" {
			s.Revoking++
		}
		if modes[k.Kind] == nil {
			modes[k.Kind] = map[string]int{}
		}
		modes[k.Kind][l.Mode]++
	}
	s.Inodes, s.Clients = len(byIno), len(byClient)
	for _, k := range kinds {
		for m, n := range modes[k.Kind] {
			k.Modes = append(k.Modes, ModeCount{Mode: m, N: n})
		}
		slices.SortFunc(k.Modes, func(a, b ModeCount) int { return cmp.Compare(a.Mode, b.Mode) })
		s.Kinds = append(s.Kinds, *k)
	}
	slices.SortFunc(s.Kinds, func(a, b KindCount) int { return cmp.Compare(kindOrder(a.Kind), kindOrder(b.Kind)) })

	info := map[string]ClientInfo{}
	for _, ci := range clients {
		info[ci.Client] = ci
	}
	for _, c := range byClient {
		c.Host, c.Mountpoint = info[c.Client].Host, info[c.Client].Mountpoint
		s.TopClients = append(s.TopClients, *c)
	}
	slices.SortFunc(s.TopClients, func(a, b ClientLocks) int {
		return cmp.Or(cmp.Compare(b.Total, a.Total), cmp.Compare(a.Client, b.Client))
	})
	s.TopClients = s.TopClients[:min(len(s.TopClients), topClients)]

	for _, in := range inodes {
		if in.Waiters > 0 || in.Holders > 1 {
			s.Contended = append(s.Contended, in)
		}
	}
	s.ContendedInodes = len(s.Contended)
	slices.SortFunc(s.Contended, func(a, b InodeContention) int {
		return cmp.Or(cmp.Compare(b.Waiters, a.Waiters), cmp.Compare(b.Holders, a.Holders), cmp.Compare(a.Ino, b.Ino))
	})
	s.Contended = s.Contended[:min(len(s.Contended), topContended)]
	return s
}

// kindOrder puts the known kinds first, in lockKinds order.
func kindOrder(k string) string {
	if i := slices.Index(lockKinds, k); i >= 0 {
		return strconv.Itoa(i)
	}
	return "9" + k
}

// errBadPage: offset or limit is not a number in range.
type errBadPage struct{ msg string }

func (e errBadPage) Error() string { return "admin: " + e.msg }

// pageParams reads offset (default 0) and limit (default def, at most
// most) from q.
func pageParams(q url.Values, def, most int) (offset, limit int, err error) {
	offset, limit = 0, def
	if v := q.Get("offset"); v != "" {
		if offset, err = strconv.Atoi(v); err != nil || offset < 0 {
			return 0, 0, errBadPage{fmt.Sprintf("offset %q: want a number from 0", v)}
		}
	}
	if v := q.Get("limit"); v != "" {
		if limit, err = strconv.Atoi(v); err != nil || limit < 1 || limit > most {
			return 0, 0, errBadPage{fmt.Sprintf("limit %q: want a number from 1 to %d", v, most)}
		}
	}
	return offset, limit, nil
}

// window returns the rows [offset, offset+limit) of all, clipped.
func window[T any](all []T, offset, limit int) []T {
	lo := min(offset, len(all))
	return all[lo:min(lo+limit, len(all))]
}

func (a *Endpoint) locksAPI(w http.ResponseWriter, r *http.Request) {
	offset, limit, err := pageParams(r.URL.Query(), LocksLimitDefault, LocksLimitMax)
	if err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
		return
	}
	all := a.src.Locks()
	writeJSON(w, http.StatusOK, LockPage{Total: len(all), Offset: offset, Limit: limit,
		Locks: withPaths(a.src, slices.Clip(window(all, offset, limit)), lockAt)})
}

// pager is one page of a table on the status page, with links to the
// pages before and after it (param=OFFSET in the page's own query).
type pager[T any] struct {
	Rows        []T
	Total       int
	First, Last int // 1-based row numbers shown; First 0: none
	Prev, Next  string
}

// pageOf cuts the page of all that the query parameter param asks for,
// of size rows; an offset past the end shows the last page.
func pageOf[T any](all []T, q url.Values, param string, rows int) pager[T] {
	off, _ := strconv.Atoi(q.Get(param))
	if off >= len(all) {
		off = (max(len(all)-1, 0) / rows) * rows
	}
	off = max(off, 0)
	p := pager[T]{Rows: window(all, off, rows), Total: len(all)}
	if len(p.Rows) > 0 {
		p.First, p.Last = off+1, off+len(p.Rows)
	}
	if off > 0 {
		p.Prev = pageLink(q, param, max(off-rows, 0))
	}
	if off+rows < len(all) {
		p.Next = pageLink(q, param, off+rows)
	}
	return p
}

// pageLink is the page's own query with param set to off.
func pageLink(q url.Values, param string, off int) string {
	q2 := url.Values{}
	for k, v := range q {
		q2[k] = v
	}
	if off == 0 {
		q2.Del(param)
	} else {
		q2.Set(param, strconv.Itoa(off))
	}
	if len(q2) == 0 {
		return "./"
	}
	return "?" + q2.Encode()
}

// statusData is what status.html renders.
type statusData struct {
	Status   Status
	Clients  pager[ClientInfo]
	Summary  LockSummary
	Locks    pager[LockInfo]
	Owners   pager[OwnerInfo]
	Counters Counters
	Trends   []chart
	// TrendSpan is how far back the charts reach ("10 min").
	TrendSpan string
	Refresh   int
	Now       time.Time
}

func (a *Endpoint) page(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	st, clients, locks, trends := a.src.Status(), a.src.Clients(), a.src.Locks(), a.trends.trends()
	// A single server owns every locked inode at epoch 0: the table would
	// repeat the lock list's inodes, at the cost of another walk of it.
	var owners []OwnerInfo
	if len(st.Peers) > 0 {
		owners = a.src.Owners()
	}
	data := statusData{Status: st, Clients: pageOf(clients, q, "clients", pageClientRows),
		Summary: summarize(locks, clients), Locks: pageOf(locks, q, "locks", pageLockRows),
		Owners: pageOf(owners, q, "owners", pageOwnerRows), Counters: a.src.Counters(),
		Trends: charts(trends), TrendSpan: span(trends),
		Refresh: max(1, int(a.refresh/time.Second)), Now: time.Now()}
	placeShown(a.src, &data)
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	if err := statusTmpl.Execute(w, data); err != nil {
		a.log.Warn("admin: render status page", "err", err)
	}
}

// chart is one trend as the page draws it.
type chart struct {
	Name    string
	Current string // the last sample's value
	Peak    string // the largest in the window
	SVG     template.HTML
}

// Sparkline size in CSS pixels.
const sparkW, sparkH = 300, 36

// minSlots is the fewest samples a chart's width is made for: a young
// server's first points are not stretched over the whole width.
const minSlots = 30

// charts draws the trends: one sparkline each, time running left to right
// over the samples held (at least minSlots periods), the last at the right.
func charts(t Trends) []chart {
	slots := max(len(t.Samples), minSlots)
	series := []struct {
		name string
		v    func(TrendSample) float64
		f    func(float64) string
	}{
		{"Requests", func(s TrendSample) float64 { return s.RequestsPerSec }, perSec},
		{"Latency p50", func(s TrendSample) float64 { return float64(s.LatencyP50) }, latency},
		{"Latency p99", func(s TrendSample) float64 { return float64(s.LatencyP99) }, latency},
		{"NACKs sent", func(s TrendSample) float64 { return s.NacksPerSec }, perSec},
		{"Revocations", func(s TrendSample) float64 { return s.RevocationsPerSec }, perSec},
		{"Bytes in", func(s TrendSample) float64 { return s.BytesInPerSec }, bytesPerSec},
		{"Bytes out", func(s TrendSample) float64 { return s.BytesOutPerSec }, bytesPerSec},
	}
	out := make([]chart, 0, len(series))
	for _, se := range series {
		vs := make([]float64, len(t.Samples))
		for i, s := range t.Samples {
			vs[i] = se.v(s)
		}
		c := chart{Name: se.name, Current: "-", Peak: "-", SVG: sparkline(se.name, vs, slots)}
		if len(vs) > 0 {
			c.Current, c.Peak = se.f(vs[len(vs)-1]), se.f(slices.Max(vs))
		}
		out = append(out, c)
	}
	return out
}

// sparkline draws vs (oldest first) as an inline SVG polyline in slots
// positions, the last at the right edge, scaled to the largest value.
func sparkline(name string, vs []float64, slots int) template.HTML {
	var b strings.Builder
	fmt.Fprintf(&b, `<svg class="spark" width="%d" height="%d" viewBox="0 0 %d %d" role="img" aria-label="%s">`,
		sparkW, sparkH, sparkW, sparkH, template.HTMLEscapeString(name))
	fmt.Fprintf(&b, `<line x1="0" y1="%d" x2="%d" y2="%d" class="axis"/>`, sparkH-1, sparkW, sparkH-1)
	if len(vs) > 0 {
		peak := max(slices.Max(vs), 1e-9)
		step := float64(sparkW) / float64(max(slots-1, 1))
		b.WriteString(`<polyline points="`)
		for i, v := range vs {
			x := float64(sparkW) - float64(len(vs)-1-i)*step
			y := float64(sparkH-2) - (float64(sparkH-4) * max(v, 0) / peak)
			if i > 0 {
				b.WriteByte(' ')
			}
			b.WriteString(strconv.FormatFloat(max(x, 0), 'f', 1, 64))
			b.WriteByte(',')
			b.WriteString(strconv.FormatFloat(y, 'f', 1, 64))
		}
		b.WriteString(`"/>`)
	}
	b.WriteString(`</svg>`)
	return template.HTML(b.String()) // numbers and an escaped name
}

// span says how far back the samples reach.
func span(t Trends) string {
	d := time.Duration(len(t.Samples)) * t.Period
	if d < 2*time.Minute {
		return fmt.Sprintf("%.0f s", d.Seconds())
	}
	return fmt.Sprintf("%.0f min", d.Minutes())
}

func perSec(v float64) string {
	switch {
	case v >= 100:
		return fmt.Sprintf("%.0f/s", v)
	case v >= 1:
		return fmt.Sprintf("%.1f/s", v)
	}
	return fmt.Sprintf("%.2f/s", v)
}

func latency(v float64) string {
	d := time.Duration(v)
	switch {
	case d >= time.Second:
		return d.Round(time.Millisecond).String()
	case d >= time.Millisecond:
		return d.Round(10 * time.Microsecond).String()
	}
	return d.Round(time.Microsecond).String()
}

func bytesPerSec(v float64) string {
	switch {
	case v >= 1<<30:
		return fmt.Sprintf("%.1f GiB/s", v/(1<<30))
	case v >= 1<<20:
		return fmt.Sprintf("%.1f MiB/s", v/(1<<20))
	case v >= 1<<10:
		return fmt.Sprintf("%.1f KiB/s", v/(1<<10))
	}
	return fmt.Sprintf("%.0f B/s", v)
}

// placeShown fills in the paths of the inodes the page shows: one scan
// for them all.
func placeShown(src Source, d *statusData) {
	inos := append(append(inosOf(d.Locks.Rows, lockAt), inosOf(d.Summary.Contended, contendedAt)...), inosOf(d.Owners.Rows, ownerAt)...)
	if len(inos) == 0 {
		return
	}
	paths := src.Paths(inos, pathScanRows)
	setPaths(d.Locks.Rows, paths, lockAt)
	setPaths(d.Summary.Contended, paths, contendedAt)
	setPaths(d.Owners.Rows, paths, ownerAt)
}

// withPaths fills in the paths of rows' inodes, where at says they are.
func withPaths[T any](src Source, rows []T, at func(*T) (ids.Ino, *string)) []T {
	setPaths(rows, src.Paths(inosOf(rows, at), pathScanRows), at)
	return rows
}

// Where each kind of row keeps its inode and its path.
func lockAt(l *LockInfo) (ids.Ino, *string)             { return l.Ino, &l.Path }
func contendedAt(c *InodeContention) (ids.Ino, *string) { return c.Ino, &c.Path }
func ownerAt(o *OwnerInfo) (ids.Ino, *string)           { return o.Ino, &o.Path }

func inosOf[T any](rows []T, at func(*T) (ids.Ino, *string)) []ids.Ino {
	inos := make([]ids.Ino, len(rows))
	for i := range rows {
		inos[i], _ = at(&rows[i])
	}
	return inos
}

func setPaths[T any](rows []T, paths map[ids.Ino]PathInfo, at func(*T) (ids.Ino, *string)) {
	for i := range rows {
		ino, path := at(&rows[i])
		*path = paths[ino].Path
	}
}

// pathAPI answers /api/path?ino=N: where inode N is.
func (a *Endpoint) pathAPI(w http.ResponseWriter, r *http.Request) {
	n, err := strconv.ParseUint(strings.TrimPrefix(r.URL.Query().Get("ino"), "ino:"), 10, 64)
	if err != nil || n == 0 {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "want ?ino=N (a positive inode number)"})
		return
	}
	p, ok := a.src.Paths([]ids.Ino{ids.Ino(n)}, pathScanOne)[ids.Ino(n)]
	if !ok {
		writeJSON(w, http.StatusNotFound, map[string]string{"error": fmt.Sprintf("inode %d: no such inode, or no directory names it", n)})
		return
	}
	writeJSON(w, http.StatusOK, p)
}

// inodeAPI answers /api/inode?path=P: the inode at P.
func (a *Endpoint) inodeAPI(w http.ResponseWriter, r *http.Request) {
	path := r.URL.Query().Get("path")
	if !strings.HasPrefix(path, "/") {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "want ?path=/A/B (from the file system's root)"})
		return
	}
	p, err := a.src.Inode(path)
	if err != nil {
		writeJSON(w, http.StatusNotFound, map[string]string{"error": fmt.Sprintf("%s: %v", path, err)})
		return
	}
	writeJSON(w, http.StatusOK, p)
}
