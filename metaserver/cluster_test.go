package metaserver

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/leasefs/leasefs/client"
	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/internal/testnet"
	"github.com/leasefs/leasefs/metaserver/store"
	"github.com/leasefs/leasefs/transport"
	"github.com/leasefs/leasefs/wire"
)

// testCluster is three servers in this process on loopback, with short
// leases: T = τ = 300 ms.
type testCluster struct {
	t     *testing.T
	ident *transport.Identity
	addrs map[ids.ServerID]string
	dirs  map[ids.ServerID]string
	srv   map[ids.ServerID]*Server
	opts  []func(ids.ServerID, *Config)
}

const (
	testLease       = 300 * time.Millisecond
	testClientLease = 300 * time.Millisecond
)

func testLogger() *slog.Logger {
	if os.Getenv("LEASEFS_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

// newTestCluster starts n servers, each configured by opts too.
func newTestCluster(t *testing.T, n int, opts ...func(ids.ServerID, *Config)) *testCluster {
	t.Helper()
	ident, err := transport.NewIdentity()
	if err != nil {
		t.Fatal(err)
	}
	tc := &testCluster{t: t, ident: ident, addrs: map[ids.ServerID]string{}, dirs: map[ids.ServerID]string{},
		srv: map[ids.ServerID]*Server{}, opts: opts}
	for i := 1; i <= n; i++ {
		id := ids.ServerID(i)
		tc.addrs[id] = testnet.UDPAddr(t)
		tc.dirs[id] = t.TempDir()
	}
	for id := range tc.addrs {
		tc.start(id)
	}
	t.Cleanup(func() {
		for _, s := range tc.srv {
			s.Close()
		}
	})
	// every server sits out its quarantine, T(1+δ), after start
	time.Sleep(testLease * 11 / 10)
	return tc
}

func (tc *testCluster) start(id ids.ServerID) *Server {
	tc.t.Helper()
	cfg := DefaultConfig()
	cfg.Dir = tc.dirs[id]
	cfg.Listen = tc.addrs[id]
	cfg.ServerID = id
	cfg.ClientLease = testClientLease
	cfg.DeliveryTimeout = testClientLease / 4
	cfg.OwnershipLease = testLease
	cfg.IdleRelease = 4 * testLease
	cfg.AntiEntropy = 200 * time.Millisecond
	cfg.Peers = tc.addrs
	cfg.Identity = tc.ident
	cfg.Logger = testLogger().With("server", id)
	for _, o := range tc.opts {
		o(id, &cfg)
	}
	s, err := Start(cfg)
	if err != nil {
		tc.t.Fatal(err)
	}
	tc.srv[id] = s
	return s
}

func (tc *testCluster) kill(id ids.ServerID) {
	tc.srv[id].Close()
	delete(tc.srv, id)
}

// connect makes a client of the given servers, in order of preference.
func (tc *testCluster) connect(servers ...ids.ServerID) *client.Client {
	tc.t.Helper()
	c := tc.connectUnmanaged(servers...)
	tc.t.Cleanup(func() { c.Close() })
	return c
}

// checksums returns every running server's store checksum.
func (tc *testCluster) checksums() map[ids.ServerID][32]byte {
	out := map[ids.ServerID][32]byte{}
	for id, s := range tc.srv {
		sum, err := s.repl.Checksum()
		if err != nil {
			tc.t.Fatal(err)
		}
		out[id] = sum
	}
	return out
}

// converge waits until every running server's checksum is the same.
func (tc *testCluster) converge(within time.Duration) time.Duration {
	tc.t.Helper()
	start := time.Now()
	for {
		sums := tc.checksums()
		var first [32]byte
		same, i := true, 0
		for _, s := range sums {
			if i == 0 {
				first = s
			} else if s != first {
				same = false
			}
			i++
		}
		if same {
			return time.Since(start)
		}
		if time.Since(start) > within {
			tc.t.Fatalf("replicas did not converge within %v: %x", within, sums)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func writeSync(ctx context.Context, t *testing.T, c *client.Client, ino ids.Ino, off uint64, data []byte) {
	t.Helper()
	if _, err := c.Write(ctx, ino, off, data, false, false); err != nil {
		t.Fatalf("write at %d: %v", off, err)
	}
	if err := c.Fsync(ctx, ino); err != nil {
		t.Fatalf("fsync after write at %d: %v", off, err)
	}
}

func readAll(ctx context.Context, t *testing.T, c *client.Client, ino ids.Ino) []byte {
	t.Helper()
	a, err := c.GetAttr(ctx, ino)
	if err != nil {
		t.Fatalf("getattr: %v", err)
	}
	data := make([]byte, a.Size)
	n, err := c.Read(ctx, ino, 0, data)
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	return data[:n]
}

// TestClusterHandover: a file written through server 1 is read and written
// through server 2 (ownership moves by hand-over: 1 revokes its client's
// locks, which flushes, then releases), then read back through 1.
func TestClusterHandover(t *testing.T) {
	tc := newTestCluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c1 := tc.connect(1)
	c2 := tc.connect(2)

	a, err := c1.Create(ctx, ids.RootIno, "f", 0o100644, 0, 0, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	writeSync(ctx, t, c1, a.Ino, 0, []byte("hello "))
	// buffered but not fsynced: the hand-over's revocation must flush it
	if _, err := c1.Write(ctx, a.Ino, 6, []byte("there "), false, false); err != nil {
		t.Fatal(err)
	}

	start := time.Now()
	b, err := c2.Lookup(ctx, ids.RootIno, "f")
	if err != nil {
		t.Fatal(err)
	}
	if got := readAll(ctx, t, c2, b.Ino); string(got) != "hello there " {
		t.Fatalf("through server 2: %q", got)
	}
	moved := time.Since(start)
	writeSync(ctx, t, c2, b.Ino, 12, []byte("world"))

	start = time.Now()
	if got := readAll(ctx, t, c1, a.Ino); string(got) != "hello there world" {
		t.Fatalf("back through server 1: %q", got)
	}
	back := time.Since(start)
	st1, st2 := tc.srv[1].owner.Stats(), tc.srv[2].owner.Stats()
	t.Logf("lookup+read through 2 (hand-over of root and file): %v; read back through 1: %v", moved, back)
	t.Logf("server 1: %+v", st1)
	t.Logf("server 2: %+v", st2)
	if st1.HandoversGiven == 0 || st2.HandoversGiven == 0 {
		t.Fatalf("expected hand-overs both ways: %+v / %+v", st1, st2)
	}
	// the fresh cluster's root was never served before server 1 took it,
	// and every later move was a hand-over: nothing waits out a grace
	if st1.GracesStarted+st2.GracesStarted != 0 {
		t.Fatalf("graces: %+v / %+v", st1, st2)
	}
	if d := tc.converge(5 * time.Second); d > 0 {
		t.Logf("replicas converged after %v more", d)
	}

	// admin: server 1 owns the file again, with an epoch and an expiry
	var found bool
	for _, o := range tc.srv[1].AdminView().Owners() {
		if o.Ino == a.Ino {
			found = o.Owner == 1 && o.Epoch != 0 && o.Expiry.After(time.Now().Add(-testLease))
		}
	}
	if !found {
		t.Fatalf("owners of server 1: %+v", tc.srv[1].AdminView().Owners())
	}
	if st := tc.srv[1].AdminView().Status(); len(st.Peers) != 2 || st.Cluster == nil {
		t.Fatalf("status peers: %+v", st.Peers)
	}
	c1sum, _ := tc.srv[1].AdminView().Checksum()
	c3sum, _ := tc.srv[3].AdminView().Checksum()
	if c1sum.Checksum != c3sum.Checksum {
		t.Fatalf("checksums differ: %v / %v", c1sum, c3sum)
	}
}

// TestClusterCrossedHandovers: server 1 wants the root while server 2
// owns it, and at the same moment server 2 wants a file server 1 owns;
// each must hand its inode over while waiting for the other's. The file
// is server 1's first inode, 2^56+1, which a mutex striped by inode
// number modulo a power of two put on the root's stripe: each hand-over
// then waited for the other side's acquire to give up (acquireFor).
func TestClusterCrossedHandovers(t *testing.T) {
	tc := newTestCluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c1, c2 := tc.connect(1), tc.connect(2)
	f, err := c1.Create(ctx, ids.RootIno, "f", 0o100644, 0, 0, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if f.Ino%64 != ids.RootIno%64 {
		t.Fatalf("server 1's first inode is %v: this test wants one equal to the root modulo 64", f.Ino)
	}
	bound := tc.srv[1].owner.GiveUpAfter()
	var slowest time.Duration
	for i := range 20 {
		writeSync(ctx, t, c1, f.Ino, 0, []byte{byte(i)})                                                 // 1 owns f
		if _, err := c2.Create(ctx, ids.RootIno, fmt.Sprint("g", i), 0o100644, 0, 0, 0, 0); err != nil { // 2 owns the root
			t.Fatal(err)
		}
		start := time.Now()
		var wg sync.WaitGroup
		errs := make([]error, 2)
		wg.Add(2)
		go func() { // 1 wants the root
			defer wg.Done()
			_, errs[0] = c1.Lookup(ctx, ids.RootIno, fmt.Sprint("g", i))
		}()
		go func() { // 2 wants f
			defer wg.Done()
			if _, errs[1] = c2.Write(ctx, f.Ino, 1, []byte{byte(i)}, false, false); errs[1] == nil {
				errs[1] = c2.Fsync(ctx, f.Ino)
			}
		}()
		wg.Wait()
		took := time.Since(start)
		slowest = max(slowest, took)
		if errs[0] != nil || errs[1] != nil {
			t.Fatalf("round %d: lookup through 1: %v; write through 2: %v", i, errs[0], errs[1])
		}
		if took >= bound {
			t.Fatalf("round %d: crossed hand-overs took %v, at least the %v an acquire waits before it gives up", i, took, bound)
		}
	}
	t.Logf("20 rounds of crossed hand-overs; slowest %v (an acquire gives up after %v)", slowest, bound)
}

// TestClusterGroupCommit: changes a server makes concurrently go to each
// replica together, a batch per call, and every one of them arrives.
func TestClusterGroupCommit(t *testing.T) {
	tc := newTestCluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const workers, files = 16, 20
	clients := make([]*client.Client, workers)
	dirs := make([]ids.Ino, workers)
	for w := range workers {
		clients[w] = tc.connect(1)
		d, err := clients[w].Mkdir(ctx, ids.RootIno, fmt.Sprint("d", w), 0o755, 0, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		dirs[w] = d.Ino
	}
	before := tc.srv[1].owner.Stats()
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range files {
				if _, err := clients[w].Create(ctx, dirs[w], fmt.Sprint("f", i), 0o100644, 0, 0, 0, 0); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	after := tc.srv[1].owner.Stats()
	changes, calls := after.Replicated-before.Replicated, after.ReplCalls-before.ReplCalls
	t.Logf("%d concurrent creates: %d changes replicated in %d calls to the 2 replicas", workers*files, changes, calls)
	if changes < workers*files {
		t.Fatalf("%d changes replicated for %d creates", changes, workers*files)
	}
	if calls >= 2*workers*files {
		t.Fatalf("%d calls to 2 replicas for %d creates: none batched", calls, workers*files)
	}
	tc.converge(10 * time.Second)
	for w := range workers {
		ents, err := tc.srv[3].store.ReadDir(dirs[w], 0, 100)
		if err != nil || len(ents) != files {
			t.Fatalf("server 3's replica of d%d: %d entries, %v", w, len(ents), err)
		}
	}
}

// TestClusterCreateAhead: a server owns the inode numbers it will
// allocate next before it allocates them, so that a create waits for no
// PaxosLease round; the new files are served and replicated as usual.
func TestClusterCreateAhead(t *testing.T) {
	tc := newTestCluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c := tc.connect(1)
	const files = 100
	before := tc.srv[1].owner.Stats()
	inos := createNumbered(ctx, t, c, files)
	for _, o := range tc.srv[1].AdminView().Owners() {
		if o.Ino > inos[len(inos)-1] {
			t.Fatalf("admin owners lists %v, acquired ahead but not allocated yet", o.Ino)
		}
	}
	ahead := tc.srv[1].owner.Stats().AllocAhead - before.AllocAhead
	t.Logf("%d of %d new inodes were owned before they were allocated", ahead, files)
	if ahead < files/2 {
		t.Fatalf("only %d of %d new inodes were owned ahead", ahead, files)
	}
	tc.converge(10 * time.Second)
	for i, ino := range inos {
		if got := must[[]byte](t)(tc.srv[2].store.Read(ino, 0, 100)); string(got) != fmt.Sprint("file ", i) {
			t.Fatalf("server 2's replica of f%d: %q", i, got)
		}
	}
}

// TestClusterRestartNoGrace: a server that restarted more than τ(1+δ)
// ago serves the inodes it owned before it died without a grace: every
// lease its clients had then has run out. (It used to wait out a grace on
// each of them, since the last owner it could not ask was itself.)
func TestClusterRestartNoGrace(t *testing.T) {
	tc := newTestCluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c := tc.connectUnmanaged(1)
	const files = 5
	inos := createNumbered(ctx, t, c, files)
	c.Close()
	tc.kill(1)
	tc.start(1)
	// its quarantine, and its clients' leases from before
	time.Sleep(max(testLease, testClientLease) * 11 / 10)
	c = tc.connect(1)
	for i, ino := range inos {
		untilAvailable(t, "read", func() error {
			got := make([]byte, 100)
			n, err := c.Read(ctx, ino, 0, got)
			if err == nil && string(got[:n]) != fmt.Sprint("file ", i) {
				t.Fatalf("f%d: %q", i, got[:n])
			}
			return err
		})
	}
	if st := tc.srv[1].owner.Stats(); st.Recoveries == 0 || st.GracesStarted != 0 {
		t.Fatalf("restarted server 1: %+v", st)
	}
}

// TestClusterFailover: a client writes and fsyncs in a loop through server
// 1; server 1 is killed; the client fails over and goes on; every write
// whose fsync returned is there afterwards, read through another server.
// Then the killed server restarts, catches up, and all checksums agree.
func TestClusterFailover(t *testing.T) {
	tc := newTestCluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	c := tc.connect(1, 2, 3)
	a, err := c.Create(ctx, ids.RootIno, "log", 0o100644, 0, 0, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var acked []byte
	var lastAck, killedAt time.Time
	var maxStall time.Duration
	done := make(chan error, 1)
	stop := make(chan struct{})
	go func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				done <- nil
				return
			default:
			}
			rec := []byte(fmt.Sprintf("record %04d\n", i))
			mu.Lock()
			off := uint64(len(acked))
			mu.Unlock()
			if _, err := c.Write(ctx, a.Ino, off, rec, false, false); err != nil {
				done <- fmt.Errorf("write %d: %w", i, err)
				return
			}
			if err := c.Fsync(ctx, a.Ino); err != nil {
				done <- fmt.Errorf("fsync %d: %w", i, err)
				return
			}
			now := time.Now()
			mu.Lock()
			acked = append(acked, rec...)
			if !lastAck.IsZero() && now.Sub(lastAck) > maxStall {
				maxStall = now.Sub(lastAck)
			}
			lastAck = now
			mu.Unlock()
		}
	}()
	time.Sleep(500 * time.Millisecond)
	mu.Lock()
	before := len(acked)
	killedAt = time.Now()
	mu.Unlock()
	tc.kill(1)
	// wait for the writer to get past the failover
	deadline := time.Now().Add(15 * time.Second)
	for {
		mu.Lock()
		resumed := lastAck.After(killedAt) && len(acked) > before+10*12
		mu.Unlock()
		if resumed {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("writer did not resume within 15 s of the kill")
		}
		select {
		case err := <-done:
			t.Fatalf("writer stopped after the kill: %v", err)
		case <-time.After(20 * time.Millisecond):
		}
	}
	close(stop)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	want := append([]byte(nil), acked...)
	stall := maxStall
	mu.Unlock()
	t.Logf("kill of the owner: longest stall between acknowledged writes %v (T = %v, τ = %v); %d records before, %d after",
		stall, testLease, testClientLease, before/12, (len(want)-before)/12)

	for _, id := range []ids.ServerID{3, 2} {
		r := tc.connect(id)
		got := readAll(ctx, t, r, a.Ino)
		if !bytes.Equal(got, want) {
			i := 0
			for i < len(got) && i < len(want) && got[i] == want[i] {
				i++
			}
			lo := max(i-30, 0)
			t.Fatalf("through server %v: %d bytes, want %d acknowledged; first difference at %d: %q, want %q",
				id, len(got), len(want), i, got[lo:min(i+30, len(got))], want[lo:min(i+30, len(want))])
		}
	}

	// restart the killed server: it sits out its quarantine and catches up
	start := time.Now()
	tc.start(1)
	d := tc.converge(10 * time.Second)
	t.Logf("restarted server converged (checksums of all three agree) %v after its start", time.Since(start).Round(time.Millisecond))
	_ = d
	for tc.srv[1].owner.Quarantined() {
		time.Sleep(10 * time.Millisecond)
	}
	got := readAll(ctx, t, tc.connect(1), a.Ino)
	if !bytes.Equal(got, want) {
		t.Fatalf("through the restarted server: %d bytes, want %d", len(got), len(want))
	}
}

// TestClusterFencing: once ownership moved, the former owner can change
// nothing: its own store refuses the change, and replicas refuse changes
// stamped with its old epoch.
func TestClusterFencing(t *testing.T) {
	tc := newTestCluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c1 := tc.connect(1)
	a, err := c1.Create(ctx, ids.RootIno, "f", 0o100644, 0, 0, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	writeSync(ctx, t, c1, a.Ino, 0, []byte("v1"))
	// the inode's attribute and replication state records, as the owner
	// wrote them
	var old []store.Write
	err = tc.srv[1].store.View(func(tx *store.Tx) error {
		for _, kind := range []byte{store.RecAttr, store.RecRepl} {
			key := tx.Key(kind, a.Ino, nil)
			if _, err := tx.Get(key, func(v []byte) error {
				old = append(old, store.Write{Key: bytes.Clone(key), Value: bytes.Clone(v)})
				return nil
			}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil || len(old) != 2 {
		t.Fatalf("records of %v: %d, %v", a.Ino, len(old), err)
	}
	// ownership moves to server 2
	c2 := tc.connect(2)
	writeSync(ctx, t, c2, a.Ino, 0, []byte("v2"))

	// server 1's own store: not the owner any more
	if err := tc.srv[1].store.SetXattr(a.Ino, "user.x", []byte("stale"), 0, 1); wire.CodeOf(err) != wire.CodeUnavailable {
		t.Fatalf("former owner's local change: %v, want unavailable", err)
	}
	// a change stamped with the old epoch, sent to every replica as the
	// former owner would: a replica that took it would count towards a
	// majority
	before := tc.srv[1].owner.Stats().StaleRejected
	if err := tc.srv[1].owner.Replicate(old); wire.CodeOf(err) != wire.CodeUnavailable ||
		tc.srv[1].owner.Stats().StaleRejected != before+1 {
		t.Fatalf("a change of the old epoch: %v, stale rejections %d (before %d)", err,
			tc.srv[1].owner.Stats().StaleRejected, before)
	}
	if got := readAll(ctx, t, c2, a.Ino); string(got) != "v2" {
		t.Fatalf("after the stale attempts: %q", got)
	}
	if got := readAll(ctx, t, tc.connect(3), a.Ino); string(got) != "v2" {
		t.Fatalf("through server 3: %q", got)
	}
}

// createNumbered creates /f0 … /f(n-1), file i holding "file i" synced,
// and returns their inode numbers.
func createNumbered(ctx context.Context, t *testing.T, c *client.Client, n int) []ids.Ino {
	t.Helper()
	var inos []ids.Ino
	for i := range n {
		a, err := c.Create(ctx, ids.RootIno, fmt.Sprint("f", i), 0o100644, 0, 0, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		writeSync(ctx, t, c, a.Ino, 0, []byte(fmt.Sprint("file ", i)))
		inos = append(inos, a.Ino)
	}
	return inos
}

// TestClusterBatchNoRedirect: a client that knows only server 2 sends a
// batch of removals in a directory server 1 owns. Server 2 redirects it;
// the client cannot reach server 1, so it sends the batch again asking
// server 2 to serve it anyway (NoRedirect), which must hold for every
// change in the batch, not only the batch: else server 2 redirects the
// changes forever.
func TestClusterBatchNoRedirect(t *testing.T) {
	tc := newTestCluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c1 := tc.connect(1)
	d, err := c1.Mkdir(ctx, ids.RootIno, "d", 0o40755, 0, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	var subs []*wire.Request
	for i := range 4 {
		a, err := c1.Create(ctx, d.Ino, fmt.Sprint("f", i), 0o100644, 0, 0, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		subs = append(subs, &wire.Request{Op: wire.OpUnlink, Parent: d.Ino, Name: fmt.Sprint("f", i), Ino: a.Ino,
			Flags: wire.RemoveIfIno, ReqID: uint64(1000 + i), Oldest: 1000})
	}
	c2 := tc.connect(2)
	done := make(chan error, 1)
	go func() {
		rep, err := c2.Call(ctx, &wire.Request{Op: wire.OpBatch, Parent: d.Ino, Data: wire.AppendBatch(nil, subs)})
		if err == nil {
			var reps []*wire.Reply
			if reps, err = wire.ParseBatchReplies(rep.Data, len(subs)); err == nil {
				for _, r := range reps {
					if err = r.Err(); err != nil {
						break
					}
				}
			}
		}
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("batch through server 2: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the batch through server 2 did not finish: redirected forever?")
	}
	for i := range 4 {
		if _, err := c1.Lookup(ctx, d.Ino, fmt.Sprint("f", i)); wire.CodeOf(err) != wire.CodeNotFound {
			t.Errorf("f%d after the batch removed it: %v", i, err)
		}
	}
}

// TestClusterNoInoRanges: a cluster server hands out no inode numbers (a
// new inode's owner acquires it as it makes it), so its clients' creates
// wait for it; one with a number of the client's choosing is refused.
func TestClusterNoInoRanges(t *testing.T) {
	tc := newTestCluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := tc.connect(1)
	if _, err := c.Call(ctx, &wire.Request{Op: wire.OpAllocInos, Size: 8}); wire.CodeOf(err) != wire.CodeInvalid {
		t.Fatalf("alloc-inos in a cluster: %v, want invalid", err)
	}
	untilAvailable(t, "create", func() error {
		_, err := c.Call(ctx, &wire.Request{Op: wire.OpCreate, Parent: ids.RootIno, Name: "f", Mode: 0o100644,
			Ino: ids.MakeIno(1, 1<<40), Flags: wire.CreateOpen | wire.CreateIno})
		if wire.CodeOf(err) == wire.CodeInvalid {
			return nil
		}
		if err == nil {
			t.Fatal("a create with the client's number was made in a cluster")
		}
		return err
	})
}

// TestClusterReplicaFull: a replica with no space refuses a change and
// stays up; while the others still make a majority the change goes
// through, and when they do not the owner reports ENOSPC (not "try
// again", which had the client resend it for ever). With the space back,
// writes work and the replicas converge.
func TestClusterReplicaFull(t *testing.T) {
	var isFull [4]atomic.Bool
	tc := newTestCluster(t, 3, func(id ids.ServerID, cfg *Config) {
		cfg.statfs = func(dir string) (int64, int64, error) {
			var st syscall.Statfs_t
			if err := syscall.Statfs(dir, &st); err != nil {
				return 0, 0, err
			}
			if isFull[id].Load() {
				return 0, 1 << 30, nil
			}
			return int64(st.Bavail) * st.Frsize, int64(st.Blocks) * st.Frsize, nil
		}
	})
	c := tc.connect(1)
	ctx := context.Background()
	a, err := c.Create(ctx, ids.RootIno, "f", 0o644, 0, 0, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	data := make([]byte, 256<<10)
	writeSync(ctx, t, c, a.Ino, 0, data)
	full := func(id ids.ServerID, on bool) { isFull[id].Store(on) }
	// within bounds the test's own: a change refused as "unavailable"
	// was sent again for ever
	bounded := func(what string, fn func() error) error {
		done := make(chan error, 1)
		go func() { done <- fn() }()
		select {
		case err := <-done:
			return err
		case <-time.After(20 * time.Second):
			t.Fatalf("%s did not return", what)
			return nil
		}
	}

	full(3, true)
	if err := bounded("a write with one replica full", func() error {
		if _, err := c.Write(ctx, a.Ino, 256<<10, data, false, false); err != nil {
			return err
		}
		return c.Fsync(ctx, a.Ino)
	}); err != nil || c.LostGen(a.Ino) != 0 {
		t.Fatalf("a write with one replica of three full: %v, lost %d", err, c.LostGen(a.Ino))
	}

	full(2, true)
	err = bounded("a write with two replicas full", func() error {
		if _, err := c.Write(ctx, a.Ino, 512<<10, data, false, false); err != nil {
			return err
		}
		return c.Fsync(ctx, a.Ino)
	})
	// buffered, the write is refused at its flush: the file reports it
	if err != nil || c.LostGen(a.Ino) != 1 || wire.CodeOf(c.LostErr(a.Ino)) != wire.CodeNoSpace {
		t.Fatalf("a write with two replicas of three full: %v, lost %d (%v), want ENOSPC reported", err, c.LostGen(a.Ino), c.LostErr(a.Ino))
	}
	// and the next one, sent as it is made, gets it at once
	err = bounded("another write", func() error { _, err := c.Write(ctx, a.Ino, 512<<10, data, false, false); return err })
	if wire.CodeOf(err) != wire.CodeNoSpace {
		t.Fatalf("another write: %v, want ENOSPC", err)
	}
	for id, s := range tc.srv {
		if s.closed {
			t.Fatalf("server %v closed", id)
		}
	}

	full(2, false)
	full(3, false)
	if err := bounded("a write with the space back", func() error {
		if _, err := c.Write(ctx, a.Ino, 512<<10, data, false, false); err != nil {
			return err
		}
		return c.Fsync(ctx, a.Ino)
	}); err != nil {
		t.Fatalf("a write with the space back: %v", err)
	}
	tc.converge(10 * time.Second)
}
