package main

import (
	"errors"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/leasefs/leasefs/client"
	"github.com/leasefs/leasefs/internal/version"
	"github.com/leasefs/leasefs/wire"
)

// A mount's own metrics (mount --metrics HOST:PORT): what its cache, its
// lease and its requests do, for Prometheus. They say nothing secret, so
// they are served as the servers' /metrics are, in plain HTTP to anyone
// who reaches the address (a loopback one keeps them on the machine).

// mountMetrics are the collectors a mount feeds as it runs.
type mountMetrics struct {
	requests *prometheus.HistogramVec
}

func newMountMetrics() *mountMetrics {
	return &mountMetrics{requests: prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "leasefs_mount_request_duration_seconds",
		Help:    "Requests this mount sent, by operation and result, with their round trips.",
		Buckets: prometheus.ExponentialBuckets(50e-6, 4, 10), // 50µs .. 13s
	}, []string{"op", "result"})}
}

// observe is client.Config.ObserveRequest.
func (m *mountMetrics) observe(op wire.Op, code wire.Code, d time.Duration) {
	m.requests.WithLabelValues(op.String(), code.Short()).Observe(d.Seconds())
}

// statsCollector reads the client's Stats once per scrape.
type statsCollector struct {
	c     *client.Client
	descs map[string]*prometheus.Desc
	kinds map[string]prometheus.ValueType
	get   map[string]func(client.Stats) float64
	order []string
}

func newStatsCollector(c *client.Client) *statsCollector {
	s := &statsCollector{c: c, descs: map[string]*prometheus.Desc{}, kinds: map[string]prometheus.ValueType{},
		get: map[string]func(client.Stats) float64{}}
	add := func(name, help string, kind prometheus.ValueType, f func(client.Stats) float64) {
		s.descs[name] = prometheus.NewDesc(name, help, nil, nil)
		s.kinds[name], s.get[name] = kind, f
		s.order = append(s.order, name)
	}
	counter, gauge := prometheus.CounterValue, prometheus.GaugeValue
	add("leasefs_mount_requests_total", "Requests sent, renewals included.", counter, func(st client.Stats) float64 { return float64(st.Requests) })
	add("leasefs_mount_lease_renewals_explicit_total", "Renewals sent because no other request renewed the lease in time.", counter,
		func(st client.Stats) float64 { return float64(st.LeaseStats.Renewals) })
	add("leasefs_mount_lease_renewals_implicit_total", "Lease renewals that came with other requests' replies (opportunistic renewal).", counter,
		func(st client.Stats) float64 {
			return float64(st.LeaseStats.Acks - min(st.LeaseStats.Acks, st.LeaseStats.Renewals))
		})
	add("leasefs_mount_nacks_received_total", "NACKs received: the server failed this mount's session.", counter, func(st client.Stats) float64 { return float64(st.NacksReceived) })
	add("leasefs_mount_recoveries_total", "Sessions recovered after a NACK or a lost server.", counter, func(st client.Stats) float64 { return float64(st.Recoveries) })
	add("leasefs_mount_revocations_total", "Lock revocations the servers sent this mount.", counter, func(st client.Stats) float64 { return float64(st.Revocations) })
	add("leasefs_mount_cache_hits_total", "Lookups and attribute reads answered from the cache.", counter, func(st client.Stats) float64 { return float64(st.Hits) })
	add("leasefs_mount_cache_misses_total", "Lookups and attribute reads that went to a server.", counter, func(st client.Stats) float64 { return float64(st.Misses) })
	add("leasefs_mount_read_bytes_total", "File data fetched from servers and the block store.", counter, func(st client.Stats) float64 { return float64(st.ReadBytes) })
	add("leasefs_mount_written_bytes_total", "File data sent: write-back and write-through, blocks put.", counter, func(st client.Stats) float64 { return float64(st.WrittenBytes) })
	add("leasefs_mount_prefetches_total", "Readahead requests.", counter, func(st client.Stats) float64 { return float64(st.Prefetches) })
	add("leasefs_mount_data_lost_total", "Buffered changes the servers refused or could not take (logged as DATA LOST).", counter, func(st client.Stats) float64 { return float64(st.DataLost) })
	add("leasefs_mount_dirty_bytes", "Buffered writes not yet at a server.", gauge, func(st client.Stats) float64 { return float64(st.DirtyBytes) })
	add("leasefs_mount_cached_data_bytes", "File data in the cache.", gauge, func(st client.Stats) float64 { return float64(st.CachedDataBytes) })
	add("leasefs_mount_cached_inodes", "Inodes in the cache.", gauge, func(st client.Stats) float64 { return float64(st.CachedInodes) })
	add("leasefs_mount_locks", "Data locks held.", gauge, func(st client.Stats) float64 { return float64(len(st.Locks)) })
	add("leasefs_mount_lease_left_seconds", "Time the lease with the home server has left.", gauge, func(st client.Stats) float64 { return st.LeaseLeft.Seconds() })
	return s
}

func (s *statsCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, n := range s.order {
		ch <- s.descs[n]
	}
}

func (s *statsCollector) Collect(ch chan<- prometheus.Metric) {
	st := s.c.Stats()
	for _, n := range s.order {
		ch <- prometheus.MustNewConstMetric(s.descs[n], s.kinds[n], s.get[n](st))
	}
}

// serveMountMetrics serves c's metrics at http://addr/metrics until stop.
func serveMountMetrics(addr string, c *client.Client, m *mountMetrics, log *slog.Logger) (stop func(), err error) {
	reg := prometheus.NewRegistry()
	v := version.Get()
	reg.MustRegister(newStatsCollector(c), m.requests,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "leasefs_build_info", Help: "Always 1; the labels say which build runs.",
			ConstLabels: prometheus.Labels{"version": v.Version, "commit": v.Commit, "goversion": v.Go}}, func() float64 { return 1 }),
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Warn("mount metrics endpoint stopped", "err", err)
		}
	}()
	log.Info("mount metrics", "url", "http://"+ln.Addr().String()+"/metrics")
	return func() { _ = srv.Close() }, nil
}
