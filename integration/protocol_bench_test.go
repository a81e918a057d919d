package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/leasefs/leasefs/client"
	"github.com/leasefs/leasefs/internal/testnet"
	"github.com/leasefs/leasefs/metaserver"
	adminapi "github.com/leasefs/leasefs/metaserver/admin"
	"github.com/leasefs/leasefs/transport"
)

// Benchmarks of the protocol costs. Run them with
//
//	go test ./integration -run '^$' -bench 'RequestRate|LockPingPong|CachedStat|Reread' -benchtime 1x
//
// Each b.N iteration is one fixed-size pass, so -benchtime 1x is one pass and
// -benchtime 3x three; the metrics are over all passes of the last call.
// LEASEFS_PERF_FULL=1 uses the full sizes (10,000 files, 256 MiB) and
// longer request and ping-pong runs.

var perfFullSizes = os.Getenv("LEASEFS_PERF_FULL") == "1"

// protoSizes are the fixed amounts of work of one pass.
type protoSizes struct {
	requests int // round trips per request-rate pass (split over the goroutines)
	rounds   int // ping-pong round trips per pass
	files    int // files stat'ed by BenchmarkCachedStat
	rereadMB int // MiB written and re-read by BenchmarkReread
}

func protoSize() protoSizes {
	if perfFullSizes {
		return protoSizes{requests: 100_000, rounds: 5000, files: 10_000, rereadMB: 256}
	}
	return protoSizes{requests: 20_000, rounds: 1000, files: 2000, rereadMB: 64}
}

// dataDir is a server data directory on tmpfs when there is one (so badger's
// synced writes do not measure a disk), else an ordinary temp directory.
func dataDir(t testing.TB) string {
	t.Helper()
	var st syscall.Statfs_t
	const tmpfsMagic = 0x01021994
	if err := syscall.Statfs("/dev/shm", &st); err != nil || st.Type != tmpfsMagic {
		return t.TempDir()
	}
	return tmpfsDir(t, "proto")
}

// BenchmarkRequestRate measures how many requests per second one client
// pushes to one in-process server over QUIC: StatFs is never cached by the
// client, so each one is a full round trip to the server's handler. With
// inflight 1 the requests go one at a time; with more, that many goroutines
// share the client and the requests are pipelined over concurrent streams.
func BenchmarkRequestRate(b *testing.B) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	cfg := metaserver.DefaultConfig()
	cfg.Dir, cfg.Listen, cfg.Logger = dataDir(b), "127.0.0.1:0", log
	srv, err := metaserver.Start(cfg)
	must(b, err)
	b.Cleanup(func() { srv.Close() })
	tok, err := transport.ParseToken(srv.Token())
	must(b, err)
	ccfg := client.DefaultConfig()
	ccfg.Servers, ccfg.Token, ccfg.Logger = []string{srv.Addr().String()}, tok, log
	ctx := context.Background()
	c, err := client.New(ctx, ccfg)
	must(b, err)
	b.Cleanup(func() { c.Close() })

	sz := protoSize()
	for _, inflight := range []int{1, 16, 64} {
		b.Run("inflight="+strconv.Itoa(inflight), func(b *testing.B) {
			var total time.Duration
			var done int64
			for range b.N {
				srvBefore := srv.AdminView().Counters().Requests
				per := sz.requests / inflight
				var wg sync.WaitGroup
				errs := make(chan error, inflight)
				start := time.Now()
				for range inflight {
					wg.Go(func() {
						for range per {
							if _, err := c.StatFs(ctx); err != nil {
								errs <- err
								return
							}
						}
					})
				}
				wg.Wait()
				total += time.Since(start)
				close(errs)
				for err := range errs {
					b.Fatal(err)
				}
				n := int64(per * inflight)
				// every StatFs must have reached the server, or this
				// measures a cache
				if got := srv.AdminView().Counters().Requests - srvBefore; got < n {
					b.Fatalf("server saw %d requests, want at least %d", got, n)
				}
				done += n
			}
			b.ReportMetric(float64(total.Nanoseconds())/float64(done), "ns/req")
			b.ReportMetric(float64(done)/total.Seconds(), "req/s")
		})
	}
}

// startProtoLeasefs is startPerfLeasefs with the server's admin endpoint
// on, so a benchmark can count the requests that reached the server.
func startProtoLeasefs(b *testing.B) (m *mount, s *server) {
	b.Helper()
	requireFUSE(b)
	s = &server{dir: tmpfsDir(b, "data"), addr: testnet.UDPAddr(b), extra: []string{"--log-level", "info", "--admin", testnet.TCPAddr(b)}}
	s.tokenFile = filepath.Join(s.dir, "token")
	s.start(b)
	return startMount(b, s, "--log-level", "info"), s
}

// adminCounters reads a server's counters from its admin endpoint.
func adminCounters(t testing.TB, s *server) adminapi.Counters {
	t.Helper()
	var c adminapi.Counters
	must(t, json.Unmarshal(s.adminCall(t, "GET", "/api/counters"), &c))
	return c
}

// BenchmarkLockPingPong moves one file's X lock back and forth between two
// mounts of one server: A writes a byte at offset 0, then B does (each
// write needs X, so the server revokes the other mount's lock first). One A
// write plus one B write is one round trip. The revoke latency is estimated
// as the mean contended write minus the mean statfs on the same mount (one
// uncached FUSE-to-server round trip): what remains is the revocation
// callback, the other client's flush and acknowledgement, and the grant.
func BenchmarkLockPingPong(b *testing.B) {
	requireFUSE(b)
	admin := testnet.TCPAddr(b)
	s := &server{dir: dataDir(b), addr: testnet.UDPAddr(b), extra: []string{"--log-level", "info", "--admin", admin}}
	s.tokenFile = filepath.Join(s.dir, "token")
	s.start(b)
	ma := startMount(b, s, "--log-level", "info")
	mb := startMount(b, s, "--log-level", "info")
	p := filepath.Join(ma.dir, "pingpong")
	must(b, os.WriteFile(p, []byte{0}, 0o644))
	fa, err := os.OpenFile(p, os.O_RDWR, 0)
	must(b, err)
	b.Cleanup(func() { fa.Close() })
	fb, err := os.OpenFile(filepath.Join(mb.dir, "pingpong"), os.O_RDWR, 0)
	must(b, err)
	b.Cleanup(func() { fb.Close() })

	// the baseline round trip: statfs is answered by the server each time
	const statfsN = 2000
	var st syscall.Statfs_t
	start := time.Now()
	for range statfsN {
		must(b, syscall.Statfs(mb.dir, &st))
	}
	rtt := time.Since(start) / statfsN

	sz := protoSize()
	var total time.Duration
	var rounds, revoked int64
	for range b.N {
		before := adminCounters(b, s)
		start := time.Now()
		for i := range sz.rounds {
			if _, err := fa.WriteAt([]byte{byte(2 * i)}, 0); err != nil {
				b.Fatalf("write on A, round %d: %v", i, err)
			}
			if _, err := fb.WriteAt([]byte{byte(2*i + 1)}, 0); err != nil {
				b.Fatalf("write on B, round %d: %v", i, err)
			}
		}
		total += time.Since(start)
		after := adminCounters(b, s)
		rounds += int64(sz.rounds)
		revoked += after.LocksRevoked - before.LocksRevoked
		// the last write wins on both sides (single-system image)
		var buf [1]byte
		for _, f := range []*os.File{fa, fb} {
			if _, err := f.ReadAt(buf[:], 0); err != nil {
				b.Fatal(err)
			}
			if want := byte(2*(sz.rounds-1) + 1); buf[0] != want {
				b.Fatalf("%s reads %d after the ping-pong, want %d", f.Name(), buf[0], want)
			}
		}
	}
	// Each write must have taken the lock from the other side; fewer
	// revocations would mean this measured something cheaper.
	if revoked < 2*rounds-1 {
		b.Fatalf("%d revocations for %d round trips, want about 2 per round trip", revoked, rounds)
	}
	write := total / time.Duration(2*rounds)
	b.ReportMetric(float64(rounds)/total.Seconds(), "roundtrips/s")
	b.ReportMetric(float64(write.Microseconds()), "us/write")
	b.ReportMetric(float64(rtt.Microseconds()), "us/statfs")
	b.ReportMetric(float64((write - rtt).Microseconds()), "us/revoke")
	b.ReportMetric(float64(revoked)/float64(rounds), "revokes/roundtrip")
}

// statAll lstat's dir/f0 .. dir/f{n-1} and checks each is an empty file.
func statAll(dir string, n int) error {
	var st syscall.Stat_t
	for i := range n {
		if err := syscall.Lstat(filepath.Join(dir, "f"+strconv.Itoa(i)), &st); err != nil {
			return fmt.Errorf("stat %d: %w", i, err)
		}
		if st.Size != 0 || st.Mode&syscall.S_IFMT != syscall.S_IFREG {
			return fmt.Errorf("stat %d: size %d mode %o", i, st.Size, st.Mode)
		}
	}
	return nil
}

// BenchmarkCachedStat creates the files on one mount, stats them all once
// (which fills the caches) and times a second pass right after it, and a
// third one after go-fuse loopback's 1 s attribute and entry timeouts have
// run out (there the kernel must ask the file system again); the same on
// the loopback. ratio = loopback time / leasefs time.
func BenchmarkCachedStat(b *testing.B) {
	m, s := startProtoLeasefs(b)
	loop := mountLoopback(b)
	n := protoSize().files
	var second, late [2][]time.Duration // [leasefs, loopback]
	var reqs, lateReqs int64            // server requests during leasefs's timed passes
	pass := 0
	for range b.N {
		pass++
		for side, root := range []string{m.dir, loop} {
			dir := filepath.Join(root, "stat"+strconv.Itoa(pass))
			must(b, os.Mkdir(dir, 0o755))
			for i := range n {
				fd, err := syscall.Open(filepath.Join(dir, "f"+strconv.Itoa(i)), syscall.O_CREAT|syscall.O_EXCL|syscall.O_WRONLY|syscall.O_CLOEXEC, 0o644)
				must(b, err)
				must(b, syscall.Close(fd))
			}
			must(b, statAll(dir, n))
			var c0, c1, c2 int64
			if side == 0 {
				c0 = adminCounters(b, s).Requests
			}
			start := time.Now()
			must(b, statAll(dir, n))
			second[side] = append(second[side], time.Since(start))
			if side == 0 {
				c1 = adminCounters(b, s).Requests
			}
			time.Sleep(1100 * time.Millisecond)
			if side == 0 {
				c1b := adminCounters(b, s).Requests // renewals while asleep
				start = time.Now()
				must(b, statAll(dir, n))
				late[side] = append(late[side], time.Since(start))
				c2 = adminCounters(b, s).Requests
				reqs += c1 - c0
				lateReqs += c2 - c1b
				continue
			}
			start = time.Now()
			must(b, statAll(dir, n))
			late[side] = append(late[side], time.Since(start))
		}
	}
	l, p := median(second[0]), median(second[1])
	ll, lp := median(late[0]), median(late[1])
	b.ReportMetric(float64(l.Nanoseconds())/float64(n), "ns/stat")
	b.ReportMetric(float64(p.Nanoseconds())/float64(n), "loopback-ns/stat")
	b.ReportMetric(p.Seconds()/l.Seconds(), "ratio")
	b.ReportMetric(float64(ll.Nanoseconds())/float64(n), "late-ns/stat")
	b.ReportMetric(float64(lp.Nanoseconds())/float64(n), "late-loopback-ns/stat")
	b.ReportMetric(lp.Seconds()/ll.Seconds(), "late-ratio")
	// a client alone with its files makes no server round trip
	// for cached stats (the admin endpoint's HTTP reads are not counted).
	b.ReportMetric(float64(reqs)/float64(b.N*n), "server-req/stat")
	b.ReportMetric(float64(lateReqs)/float64(b.N*n), "late-server-req/stat")
}

// BenchmarkReread writes a file, reads it fully once and times a second
// full read (1 MiB reads, each chunk checked), on leasefs and on the
// loopback. ratio = loopback time / leasefs time; the target is 1.0.
func BenchmarkReread(b *testing.B) {
	m, s := startProtoLeasefs(b)
	loop := mountLoopback(b)
	mib := protoSize().rereadMB
	var reqs int64 // server requests during leasefs's timed reads
	e := &perfEnv{base: make([]byte, chunkSize)}
	r := rand.New(rand.NewPCG(1, 2))
	for i := range e.base {
		e.base[i] = byte(r.Uint32())
	}
	var times [2][]time.Duration // [leasefs, loopback]
	pass := 0
	for range b.N {
		pass++
		for side, root := range []string{m.dir, loop} {
			p := filepath.Join(root, "reread"+strconv.Itoa(pass))
			must(b, e.writeSeq(p, mib))
			must(b, e.readSeq(p, mib))
			var c0 int64
			if side == 0 {
				c0 = adminCounters(b, s).Requests
			}
			start := time.Now()
			must(b, e.readSeq(p, mib))
			times[side] = append(times[side], time.Since(start))
			if side == 0 {
				reqs += adminCounters(b, s).Requests - c0
			}
			must(b, os.Remove(p)) // keeps tmpfs use at one file per side
		}
	}
	l, p := median(times[0]), median(times[1])
	b.ReportMetric(float64(l.Nanoseconds()), "ns/op")
	b.ReportMetric(float64(mib)/l.Seconds(), "MiB/s")
	b.ReportMetric(float64(mib)/p.Seconds(), "loopback-MiB/s")
	b.ReportMetric(p.Seconds()/l.Seconds(), "ratio")
	b.ReportMetric(float64(reqs)/float64(b.N*mib), "server-req/MiB")
}
