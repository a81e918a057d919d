package paxos

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/leasefs/leasefs/internal/clock"
	"github.com/leasefs/leasefs/internal/ids"
)

var rewrite = flag.Bool("rewrite", false, "rewrite testdata/*.txt with the actual output")

// harness is a tiny cluster with a perfect, manually driven network, for the
// readable scenarios in testdata (datadriven style: command, "----", output).
type harness struct {
	t       *testing.T
	now     time.Duration // real time since the cluster started
	nodes   map[ids.ServerID]*Node
	peers   []ids.ServerID
	boots   map[ids.ServerID]uint16
	pending []Message
	cut     map[ids.ServerID]bool // partitioned away from everyone
	out     strings.Builder
}

// clock of node id: same rate, different origin, to show nothing compares
// clocks across nodes.
func (h *harness) clock(id ids.ServerID) clock.Time {
	return clock.Time(int64(id)*int64(1000*time.Second) + int64(h.now) + 1)
}

func testConfig(id ids.ServerID, peers []ids.ServerID, boot uint16) Config {
	c := DefaultConfig(id, peers, boot)
	c.LeaseTime = time.Second
	c.Drift = 0.05
	c.MaxDelay = 10 * time.Millisecond
	c.RetryBackoff = 50 * time.Millisecond
	c.Quarantine = c.MinQuarantine()
	return c
}

func (h *harness) start(id ids.ServerID) {
	h.boots[id]++
	n, err := New(testConfig(id, h.peers, h.boots[id]), h.clock(id))
	if err != nil {
		h.t.Fatal(err)
	}
	h.nodes[id] = n
}

func (h *harness) collect(id ids.ServerID) {
	n := h.nodes[id]
	if n == nil {
		return
	}
	rd := n.Ready()
	h.pending = append(h.pending, rd.Messages...)
	for _, e := range rd.Events {
		fmt.Fprintf(&h.out, "n%d: %v %v epoch=%s\n", id, e.Kind, uint64(e.Ino), FormatBallot(e.Epoch))
	}
}

func (h *harness) advance(d time.Duration, deliver string) {
	end := h.now + d
	for {
		// run each node's timers in time order
		next := end
		for _, id := range h.peers {
			if n := h.nodes[id]; n != nil {
				if dl := n.NextDeadline(); !dl.IsZero() {
					if at := time.Duration(dl - h.clock(id) + clock.Time(h.now)); at < next {
						next = max(at, h.now)
					}
				}
			}
		}
		h.now = next
		for _, id := range h.peers {
			if n := h.nodes[id]; n != nil {
				if dl := n.NextDeadline(); !dl.IsZero() && !h.clock(id).Before(dl) {
					n.Tick(h.clock(id))
					if dl := n.NextDeadline(); !dl.IsZero() && !h.clock(id).Before(dl) {
						h.t.Fatalf("n%d: deadline %d not after now %d after Tick", id, dl, h.clock(id))
					}
					h.collect(id)
				}
			}
		}
		if deliver != "" {
			h.deliver(deliver == "verbose")
		}
		if h.now == end {
			return
		}
	}
}

func (h *harness) deliver(verbose bool) {
	for len(h.pending) > 0 {
		m := h.pending[0]
		h.pending = h.pending[1:]
		to := h.nodes[m.To]
		lost := to == nil || h.cut[m.From] || h.cut[m.To]
		if verbose {
			var es []string
			for _, e := range m.Entries {
				es = append(es, e.String())
			}
			tag := ""
			if lost {
				tag = " (lost)"
			}
			fmt.Fprintf(&h.out, "n%d→n%d%s: %s\n", m.From, m.To, tag, strings.Join(es, "; "))
		}
		if lost {
			continue
		}
		if err := to.Step(h.clock(m.To), m); err != nil {
			h.t.Fatal(err)
		}
		h.collect(m.To)
	}
}

func (h *harness) run(cmd string, args map[string]string) string {
	h.out.Reset()
	node := func() ids.ServerID { v, _ := strconv.Atoi(args["node"]); return ids.ServerID(v) }
	ino := func() ids.Ino { v, _ := strconv.Atoi(args["ino"]); return ids.Ino(v) }
	switch cmd {
	case "cluster":
		n, _ := strconv.Atoi(args["n"])
		h.nodes, h.boots, h.cut, h.peers, h.pending, h.now = map[ids.ServerID]*Node{}, map[ids.ServerID]uint16{}, map[ids.ServerID]bool{}, nil, nil, 0
		for i := 1; i <= n; i++ {
			h.peers = append(h.peers, ids.ServerID(i))
		}
		for _, id := range h.peers {
			h.start(id)
		}
		h.advance(testConfig(1, h.peers, 1).Quarantine, "")
	case "acquire":
		h.nodes[node()].Acquire(h.clock(node()), ino())
		h.collect(node())
	case "release":
		h.nodes[node()].Release(h.clock(node()), ino())
		h.collect(node())
	case "deliver":
		h.deliver(true)
	case "deliver-quiet":
		h.deliver(false)
	case "drop":
		fmt.Fprintf(&h.out, "dropped %d messages\n", len(h.pending))
		h.pending = nil
	case "advance":
		d, err := time.ParseDuration(args["d"])
		if err != nil {
			h.t.Fatal(err)
		}
		h.advance(d, args["deliver"])
	case "cut":
		h.cut[node()] = true
	case "heal":
		h.cut = map[ids.ServerID]bool{}
	case "crash":
		h.nodes[node()] = nil
	case "restart":
		h.start(node())
	case "owners":
		for _, id := range h.peers {
			n := h.nodes[id]
			if n == nil {
				fmt.Fprintf(&h.out, "n%d: down\n", id)
				continue
			}
			c := h.clock(id)
			o, ok := n.Owner(c, ino())
			exp, ep, own := n.OwnedExpiry(c, ino())
			switch {
			case own:
				fmt.Fprintf(&h.out, "n%d: owner epoch=%s for %v\n", id, FormatBallot(ep), exp.Sub(c))
			case ok:
				fmt.Fprintf(&h.out, "n%d: learnt owner n%d\n", id, o)
			default:
				fmt.Fprintf(&h.out, "n%d: no owner known\n", id)
			}
		}
	default:
		h.t.Fatalf("unknown command %q", cmd)
	}
	fmt.Fprintf(&h.out, "")
	if h.out.Len() == 0 {
		return "ok\n"
	}
	return h.out.String()
}

// TestScenarios runs testdata/*.txt; -rewrite regenerates the expected output.
func TestScenarios(t *testing.T) {
	files, _ := filepath.Glob("testdata/*.txt")
	if len(files) == 0 {
		t.Fatal("no scenarios")
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			data, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			h := &harness{t: t}
			var rewritten strings.Builder
			blocks := strings.Split(strings.TrimSpace(string(data)), "\n\n")
			for _, blk := range blocks {
				cmdPart, want, _ := strings.Cut(blk, "----\n")
				var cmdLine string
				for _, l := range strings.Split(cmdPart, "\n") {
					if strings.HasPrefix(l, "#") || strings.TrimSpace(l) == "" || l == "----" {
						rewritten.WriteString(l + "\n")
						continue
					}
					cmdLine = l
				}
				if cmdLine == "" {
					rewritten.WriteString("\n")
					continue
				}
				rewritten.WriteString(cmdLine + "\n")
				fields := strings.Fields(cmdLine)
				args := map[string]string{}
				for _, a := range fields[1:] {
					k, v, _ := strings.Cut(a, "=")
					args[k] = v
				}
				got := h.run(fields[0], args)
				rewritten.WriteString("----\n" + got + "\n")
				if !*rewrite && strings.TrimSpace(got) != strings.TrimSpace(want) {
					t.Errorf("%s:\n%s\ngot:\n%s\nwant:\n%s", f, cmdLine, got, want)
				}
			}
			if *rewrite {
				if err := os.WriteFile(f, []byte(rewritten.String()), 0o644); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}
