package integration

import (
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/leasefs/leasefs/internal/testnet"
)

// The performance suite on a cluster of three servers, against
// one server and go-fuse's loopback in the same run:
//
//	go test ./integration -run '^$' -bench PerfCluster -benchtime 3x -timeout 60m
//
// The cluster runs with the production timings (no short test leases), every
// data directory on tmpfs, so the difference is the cluster's protocol:
// ownership of each inode and replication of every change to a majority.

// startPerfCluster starts n servers of one cluster with their data
// directories on tmpfs, logging at info level, with the default leases. It is
// startCluster for benchmarks (which have no *testing.T) and tmpfs.
func startPerfCluster(t testing.TB, n int) *testCluster {
	t.Helper()
	requireFUSE(t)
	c := &testCluster{}
	var peers []string
	for i := 1; i <= n; i++ {
		s := &clusterServer{server: &server{dir: tmpfsDir(t, "data"+strconv.Itoa(i)), addr: testnet.UDPAddr(t)},
			id: i, admin: testnet.TCPAddr(t)}
		s.tokenFile = filepath.Join(s.dir, "token")
		c.servers = append(c.servers, s)
		peers = append(peers, strconv.Itoa(i)+"="+s.addr)
	}
	c.identityFile = filepath.Join(c.servers[0].dir, "identity")
	c.tokenFile = c.servers[0].tokenFile
	c.blocksDir = tmpfsDir(t, "blocks")
	for i, s := range c.servers {
		s.extra = []string{"--log-level", "info", "--id", strconv.Itoa(s.id), "--peers", strings.Join(peers, ","),
			"--admin", s.admin, "--blocks", "file:" + c.blocksDir}
		if i > 0 {
			s.extra = append(s.extra, "--identity-file", c.identityFile)
		}
		s.start(t)
	}
	return c
}

// mountPerfCluster mounts c trying its servers in order, logging at info
// level, with the default failover timeout.
func mountPerfCluster(t testing.TB, c *testCluster) *mount {
	t.Helper()
	order := make([]int, len(c.servers))
	for i := range order {
		order[i] = i
	}
	s := &server{addr: strings.Join(c.addrs(order...), ","), tokenFile: c.tokenFile}
	return startMount(t, s, "--log-level", "info")
}

// clusterRSSLines is rssLine for a cluster: one line per server, then the
// mount.
func clusterRSSLines(when string, c *testCluster, m *mount) string {
	var out strings.Builder
	for _, s := range c.servers {
		fmt.Fprintf(&out, "RSS %-12s %s\n", when, rssOf("cluster server "+strconv.Itoa(s.id), s.proc))
	}
	fmt.Fprintf(&out, "RSS %-12s %s\n", when, rssOf("cluster mount   ", m.proc))
	return out.String()
}

// BenchmarkPerfCluster runs every workload once per b.N on a one-server
// mount, a mount of a three-server cluster and the loopback, in turn, and
// reports the medians: the cluster against one server (time_single /
// time_cluster, 1.0 is a cluster that costs nothing) and each against the
// loopback (time_loopback / time_leasefs, 1.0 is the FUSE limit).
func BenchmarkPerfCluster(b *testing.B) {
	sz := perfSizesFromEnv()
	s, m := startPerfLeasefs(b)
	c := startPerfCluster(b, 3)
	cm := mountPerfCluster(b, c)
	loop := mountLoopback(b)
	e := newPerfEnv(b, sz, tmpfsDir(b, "scratch"), false)
	atRest := rssLine("at rest", s, m) + "\n" + clusterRSSLines("at rest", c, cm)

	sides := []perfSide{{name: "single", root: m.dir, settle: m.sync}, {name: "cluster", root: cm.dir, settle: cm.sync}, {name: "loopback", root: loop}}
	rows := runPerfPasses(b, e, sides, func(b *testing.B, med []time.Duration) {
		one, three, lo := med[0].Seconds(), med[1].Seconds(), med[2].Seconds()
		b.ReportMetric(float64(med[1].Nanoseconds()), "ns/op")
		b.ReportMetric(one, "single-s")
		b.ReportMetric(three, "cluster-s")
		b.ReportMetric(lo, "loopback-s")
		b.ReportMetric(one/three, "single/cluster")
	})
	var out strings.Builder
	fmt.Fprintf(&out, "\nleasefs on 1 server vs a 3-server cluster vs go-fuse loopback (passthrough off), tmpfs, sizes %+v\n", sz)
	fmt.Fprintf(&out, "ratios are of times: sgl/clu 1.0 = the cluster costs nothing; loop/x 1.0 = the FUSE limit\n")
	fmt.Fprintf(&out, "%-26s %12s %12s %12s %8s %8s %8s\n", "workload", "single", "cluster", "loopback",
		"sgl/clu", "loop/sgl", "loop/clu")
	for _, r := range rows {
		one, three, lo := r.med[0], r.med[1], r.med[2]
		fmt.Fprintf(&out, "%-26s %12s %12s %12s %8.2f %8.2f %8.2f\n", r.name,
			one.Round(time.Microsecond), three.Round(time.Microsecond), lo.Round(time.Microsecond),
			one.Seconds()/three.Seconds(), lo.Seconds()/one.Seconds(), lo.Seconds()/three.Seconds())
	}
	fmt.Fprintf(&out, "%s%s\n%s%s\n%s\n", atRest, rssLine("after suite", s, m), clusterRSSLines("after suite", c, cm),
		disruptions(cm), lapses(c))
	fmt.Print(out.String())
}

// disruptions counts what the mount's log says went wrong: a failover or a
// NACK during a benchmark means its times include a recovery.
func disruptions(m *mount) string {
	log := m.output()
	return fmt.Sprintf("cluster mount: %d failovers, %d NACKs, %d DATA LOST",
		strings.Count(log, "failing over to another server"), strings.Count(log, "NACK received"),
		strings.Count(log, "DATA LOST"))
}

// lapses counts, per server, the inode ownerships that lapsed instead of
// being renewed or released: each costs the next request for the inode a
// recovery, and maybe a grace.
func lapses(c *testCluster) string {
	var out []string
	for _, s := range c.servers {
		out = append(out, fmt.Sprintf("server %d: %d", s.id, strings.Count(s.output(), "paxosnode: ownership lapsed")))
	}
	return "ownerships lapsed: " + strings.Join(out, ", ")
}

// TestClusterPerfSmoke runs every workload of the suite at the tiny size,
// with the data checks, on a mount of a three-server cluster: real tools
// (tar, diff, rm -rf, appends) through ownership and replication.
func TestClusterPerfSmoke(t *testing.T) {
	c := startPerfCluster(t, 3)
	m := mountPerfCluster(t, c)
	runPerfSmoke(t, m.dir)
	t.Log("\n" + clusterRSSLines("after smoke", c, m) + disruptions(m) + "\n" + lapses(c))
}
