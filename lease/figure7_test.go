package lease

import (
	"bytes"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/leasefs/leasefs/internal/clock"
)

var update = flag.Bool("update", false, "rewrite docs/figure7.txt and docs/figure7.svg")

// Figure 7 of Burns, Rees and Long (ICDCS 2001): explicit renewal messages per
// request against τρ, for a client issuing a Poisson stream of requests of
// rate ρ, with opportunistic renewal (every acknowledged request renews) and
// with plain renew-at-expiry (only explicit renewals renew). The client always
// holds state, the worst case for renewal traffic.

var fig7Points = []float64{1, 2, 5, 10, 20}

const (
	fig7Requests = 2_000_000
	fig7Seed     = 7
	fig7RTT      = 10 * time.Millisecond
)

type fig7Row struct {
	tauRho                 float64
	requests               uint64
	oppRenewals, renewals  uint64 // opportunistic, renew-at-expiry
	oppAnalytic, plainAnal float64
}

// simulateRenewals drives the real Client through n Poisson requests of rate
// rho per second. Replies arrive after a fixed round trip; the client checks
// NeedsRenewal at every request and at RenewAt, as a shell's timer would.
func simulateRenewals(cfg Config, rho float64, n int, seed uint64, opportunistic bool) (requests, renewals uint64) {
	r := rand.New(rand.NewPCG(seed, uint64(rho*1000)))
	c := NewClient(cfg)
	now := clock.Time(1)
	c.Sent(now, false)
	c.Acked(now, now.Add(fig7RTT)) // the session opened
	next := now.Add(time.Duration(r.ExpFloat64() / rho * float64(time.Second)))
	for i := 0; i < n; {
		if ra := c.RenewAt(); ra.Before(next) {
			now = ra
			if c.NeedsRenewal(now, true) {
				c.Sent(now, true)
				c.Acked(now, now.Add(fig7RTT))
			}
			continue
		}
		now = next
		c.Sent(now, false)
		if opportunistic {
			c.Acked(now, now.Add(fig7RTT))
		}
		i++
		next = now.Add(time.Duration(r.ExpFloat64() / rho * float64(time.Second)))
	}
	s := c.Stats()
	return s.Requests - s.Renewals - 1, s.Renewals
}

func figure7(t *testing.T) []fig7Row {
	cfg := DefaultConfig()
	l := (cfg.Tau - cfg.RenewMargin).Seconds() // time between renewals when idle
	var rows []fig7Row
	for _, x := range fig7Points {
		rho := x / cfg.Tau.Seconds()
		reqs, opp := simulateRenewals(cfg, rho, fig7Requests, fig7Seed, true)
		reqs2, plain := simulateRenewals(cfg, rho, fig7Requests, fig7Seed, false)
		if reqs != fig7Requests || reqs2 != fig7Requests {
			t.Fatalf("τρ=%v: counted %d and %d requests, want %d", x, reqs, reqs2, fig7Requests)
		}
		// An idle gap of length g after a request brings floor(g/l)
		// renewals; gaps are exponential, so E = Σ_k e^{-ρkl}.
		q := math.Exp(-rho * l)
		rows = append(rows, fig7Row{tauRho: x, requests: reqs, oppRenewals: opp, renewals: plain,
			oppAnalytic: q / (1 - q), plainAnal: 1 / (rho * l)})
	}
	return rows
}

func TestFigure7(t *testing.T) {
	rows := figure7(t)
	for _, r := range rows {
		n := float64(r.requests)
		// Measured counts agree with the model within 5 standard deviations.
		exp := r.oppAnalytic * n
		if d := math.Abs(float64(r.oppRenewals) - exp); d > 5*math.Sqrt(exp)+2 {
			t.Errorf("τρ=%v: %d opportunistic renewals, model %.1f", r.tauRho, r.oppRenewals, exp)
		}
		if got := float64(r.renewals) / n; math.Abs(got-r.plainAnal)/r.plainAnal > 0.02 {
			t.Errorf("τρ=%v: renew-at-expiry %.4g per request, model %.4g", r.tauRho, got, r.plainAnal)
		}
		if r.tauRho == 10 {
			if got := float64(r.oppRenewals) / n; got > 1e-3 || got == 0 {
				t.Errorf("τρ=10: %.3g explicit renewals per request, want (0, 1e-3]", got)
			}
			if r.oppRenewals*100 > r.renewals {
				t.Errorf("τρ=10: opportunistic %d not 100x below renew-at-expiry %d", r.oppRenewals, r.renewals)
			}
		}
	}
	// Exponential fall: log(renewals per request) against τρ is a line of
	// slope -(τ-margin)/τ over the points with enough events to measure.
	var xs, ys []float64
	for i, r := range rows {
		if i > 0 && r.oppRenewals > rows[i-1].oppRenewals {
			t.Errorf("renewals rose from τρ=%v to %v", rows[i-1].tauRho, r.tauRho)
		}
		if r.oppRenewals >= 30 {
			xs = append(xs, r.tauRho)
			ys = append(ys, math.Log(float64(r.oppRenewals)/float64(r.requests)))
		}
	}
	if len(xs) < 4 {
		t.Fatalf("only %d points measurable", len(xs))
	}
	slope, resid := fitLine(xs, ys)
	cfg := DefaultConfig()
	want := -(cfg.Tau - cfg.RenewMargin).Seconds() / cfg.Tau.Seconds()
	if math.Abs(slope-want) > 0.1*math.Abs(want) || resid > 0.5 {
		t.Errorf("log fit slope %.3f (want %.3f), max residual %.2f: not exponential", slope, want, resid)
	}
	t.Logf("log-linear slope %.3f per unit τρ (model %.3f), max residual %.3f", slope, want, resid)

	txt, svg := renderFigure7(rows, slope)
	txtPath, svgPath := filepath.Join("..", "docs", "figure7.txt"), filepath.Join("..", "docs", "figure7.svg")
	if *update {
		if err := os.WriteFile(txtPath, txt, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(svgPath, svg, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	for _, f := range []struct {
		path string
		want []byte
	}{{txtPath, txt}, {svgPath, svg}} {
		got, err := os.ReadFile(f.path)
		if err != nil || !bytes.Equal(got, f.want) {
			t.Errorf("%s is stale (%v): regenerate with go test ./lease -run Figure7 -update", f.path, err)
		}
	}
}

// fitLine returns the least-squares slope and the largest residual.
func fitLine(xs, ys []float64) (slope, maxResid float64) {
	var sx, sy, sxx, sxy float64
	n := float64(len(xs))
	for i := range xs {
		sx += xs[i]
		sy += ys[i]
		sxx += xs[i] * xs[i]
		sxy += xs[i] * ys[i]
	}
	slope = (n*sxy - sx*sy) / (n*sxx - sx*sx)
	icept := (sy - slope*sx) / n
	for i := range xs {
		maxResid = max(maxResid, math.Abs(ys[i]-(icept+slope*xs[i])))
	}
	return slope, maxResid
}

func renderFigure7(rows []fig7Row, slope float64) (txt, svg []byte) {
	cfg := DefaultConfig()
	var b strings.Builder
	fmt.Fprintf(&b, "# Figure 7 (Burns, Rees, Long, ICDCS 2001) on lease.Client: explicit renewals per request\n")
	fmt.Fprintf(&b, "# Poisson requests of rate rho, client always holding state; tau=%v, renew margin=%v, rtt=%v,\n", cfg.Tau, cfg.RenewMargin, fig7RTT)
	fmt.Fprintf(&b, "# %d requests per point, seed %d. Regenerate: go test ./lease -run Figure7 -update\n", fig7Requests, fig7Seed)
	fmt.Fprintf(&b, "# model: opportunistic q/(1-q), q=exp(-rho(tau-margin)); renew-at-expiry 1/(rho(tau-margin))\n")
	fmt.Fprintf(&b, "# paper at tau*rho=10: about 1e-1 renew-at-expiry, 5e-5 opportunistic (zero margin)\n")
	fmt.Fprintf(&b, "# measured log-linear slope %.3f per unit tau*rho (model %.3f)\n", slope, -(cfg.Tau-cfg.RenewMargin).Seconds()/cfg.Tau.Seconds())
	fmt.Fprintf(&b, "%-7s %-12s %-12s %-12s %-16s %s\n", "tau*rho", "opp_count", "opp/request", "opp_model", "expiry/request", "expiry_model")
	for _, r := range rows {
		n := float64(r.requests)
		opp := fmt.Sprintf("%.3g", float64(r.oppRenewals)/n)
		if r.oppRenewals == 0 {
			opp = fmt.Sprintf("<%.1g", 1/n)
		}
		fmt.Fprintf(&b, "%-7g %-12d %-12s %-12.3g %-16.4g %.4g\n", r.tauRho, r.oppRenewals, opp, r.oppAnalytic, float64(r.renewals)/n, r.plainAnal)
	}
	txt = []byte(b.String())

	// Plot: x linear 0..20, y log10 from 1e-9 to 1e1.
	const (
		w, h           = 640, 440
		left, right    = 70, 20
		top, bottom    = 30, 60
		xmax           = 20.0
		ylo, yhi       = -9.0, 1.0
		plotW, plotH   = w - left - right, h - top - bottom
		oppColor       = "#1f77b4"
		plainColor     = "#d62728"
		modelDashArray = "5,4"
	)
	px := func(x float64) float64 { return left + x/xmax*plotW }
	py := func(y float64) float64 { return top + (yhi-math.Log10(y))/(yhi-ylo)*plotH }
	var s strings.Builder
	fmt.Fprintf(&s, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", w, h, w, h)
	fmt.Fprintf(&s, `<rect width="%d" height="%d" fill="white"/>`+"\n", w, h)
	fmt.Fprintf(&s, `<text x="%d" y="18" text-anchor="middle" font-size="14">Explicit renewals per request (Burns et al. Figure 7, leasefs lease.Client)</text>`+"\n", w/2)
	for e := int(ylo); e <= int(yhi); e++ {
		y := py(math.Pow(10, float64(e)))
		fmt.Fprintf(&s, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/>`+"\n", left, y, w-right, y)
		fmt.Fprintf(&s, `<text x="%d" y="%.1f" text-anchor="end">1e%d</text>`+"\n", left-6, y+4, e)
	}
	for x := 0; x <= int(xmax); x += 5 {
		fmt.Fprintf(&s, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#ddd"/>`+"\n", px(float64(x)), top, px(float64(x)), h-bottom)
		fmt.Fprintf(&s, `<text x="%.1f" y="%d" text-anchor="middle">%d</text>`+"\n", px(float64(x)), h-bottom+16, x)
	}
	fmt.Fprintf(&s, `<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="black"/>`+"\n", left, top, plotW, plotH)
	fmt.Fprintf(&s, `<text x="%d" y="%d" text-anchor="middle">τρ (lease period × request rate)</text>`+"\n", left+plotW/2, h-bottom+36)
	fmt.Fprintf(&s, `<text x="16" y="%d" text-anchor="middle" transform="rotate(-90 16 %d)">explicit renewals per request (log)</text>`+"\n", top+plotH/2, top+plotH/2)
	l := (cfg.Tau - cfg.RenewMargin).Seconds() / cfg.Tau.Seconds()
	curve := func(f func(x float64) float64, color string) {
		var pts []string
		for x := 0.5; x <= xmax+1e-9; x += 0.25 {
			if v := f(x); v >= math.Pow(10, ylo) && v <= math.Pow(10, yhi) {
				pts = append(pts, fmt.Sprintf("%.1f,%.1f", px(x), py(v)))
			}
		}
		fmt.Fprintf(&s, `<polyline fill="none" stroke="%s" stroke-dasharray="%s" points="%s"/>`+"\n", color, modelDashArray, strings.Join(pts, " "))
	}
	curve(func(x float64) float64 { q := math.Exp(-x * l); return q / (1 - q) }, oppColor)
	curve(func(x float64) float64 { return 1 / (x * l) }, plainColor)
	for _, r := range rows {
		n := float64(r.requests)
		if r.oppRenewals > 0 {
			fmt.Fprintf(&s, `<circle cx="%.1f" cy="%.1f" r="4" fill="%s"/>`+"\n", px(r.tauRho), py(float64(r.oppRenewals)/n), oppColor)
		} else {
			// None observed: mark the measurement's upper bound.
			x, y := px(r.tauRho), py(1/n)
			fmt.Fprintf(&s, `<path d="M%.1f %.1f l-5 -8 h10 z" fill="none" stroke="%s"/>`+"\n", x, y+4, oppColor)
		}
		fmt.Fprintf(&s, `<rect x="%.1f" y="%.1f" width="8" height="8" fill="%s"/>`+"\n", px(r.tauRho)-4, py(float64(r.renewals)/n)-4, plainColor)
	}
	lx, ly := w-right-260, top+16
	legend := []struct{ mark, text string }{
		{fmt.Sprintf(`<circle cx="%d" cy="%d" r="4" fill="%s"/>`, lx+10, ly, oppColor), "opportunistic renewal (measured)"},
		{fmt.Sprintf(`<path d="M%d %d l-5 -8 h10 z" fill="none" stroke="%s"/>`, lx+10, ly+22, oppColor), "none in 2e6 requests (upper bound)"},
		{fmt.Sprintf(`<rect x="%d" y="%d" width="8" height="8" fill="%s"/>`, lx+6, ly+36, plainColor), "renew at expiry (measured)"},
		{fmt.Sprintf(`<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black" stroke-dasharray="%s"/>`, lx, ly+60, lx+20, ly+60, modelDashArray), "model"},
	}
	fmt.Fprintf(&s, `<rect x="%d" y="%d" width="255" height="84" fill="white" stroke="#999"/>`+"\n", lx-6, ly-12)
	for i, it := range legend {
		fmt.Fprintf(&s, "%s\n", it.mark)
		fmt.Fprintf(&s, `<text x="%d" y="%d">%s</text>`+"\n", lx+26, ly+4+i*20, it.text)
	}
	s.WriteString("</svg>\n")
	return txt, []byte(s.String())
}
