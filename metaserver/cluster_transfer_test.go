package metaserver

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/leasefs/leasefs/client"
	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/metaserver/store"
	"github.com/leasefs/leasefs/transport"
	"github.com/leasefs/leasefs/wire"
)

// untilAvailable runs fn again while it fails with CodeUnavailable, for
// up to 30 s: a client of one server gets the error while the server sits
// out its quarantine after a restart, while its first ballots are still
// below an epoch another owner used meanwhile, or when its leases lapsed on
// a loaded host.
func untilAvailable(t *testing.T, what string, fn func() error) {
	t.Helper()
	var err error
	for deadline := time.Now().Add(30 * time.Second); ; {
		if err = fn(); wire.CodeOf(err) != wire.CodeUnavailable || time.Now().After(deadline) {
			break
		}
		t.Logf("%s: %v; again", what, err)
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// writeBig writes data to ino through c a MiB at a time, each piece
// fsynced, and again if the server was unavailable meanwhile (a piece
// buffered but not fsynced may be dropped when its lease lapses).
func writeBig(ctx context.Context, t *testing.T, c *client.Client, ino ids.Ino, data []byte) {
	t.Helper()
	for off := 0; off < len(data); off += 1 << 20 {
		untilAvailable(t, fmt.Sprintf("writing at %d", off), func() error {
			if _, err := c.Write(ctx, ino, uint64(off), data[off:min(off+1<<20, len(data))], false, false); err != nil {
				return err
			}
			return c.Fsync(ctx, ino)
		})
	}
}

// readBig reads ino through c in 1 MiB reads.
func readBig(ctx context.Context, t *testing.T, c *client.Client, ino ids.Ino) []byte {
	t.Helper()
	var out []byte
	untilAvailable(t, "reading the file", func() error {
		a, err := c.GetAttr(ctx, ino)
		if err != nil {
			return fmt.Errorf("getattr: %w", err)
		}
		out = make([]byte, 0, a.Size)
		for off := uint64(0); off < a.Size; off += 1 << 20 {
			b := make([]byte, 1<<20)
			n, err := c.Read(ctx, ino, off, b)
			if err != nil {
				return fmt.Errorf("read at %d: %w", off, err)
			}
			out = append(out, b[:n]...)
		}
		return nil
	})
	return out
}

// fillDir creates n entries in dir through c, one at a time (creates in
// one directory conflict with each other).
func fillDir(ctx context.Context, t *testing.T, c *client.Client, dir ids.Ino, n int) {
	t.Helper()
	for i := range n {
		untilAvailable(t, fmt.Sprintf("create %d", i), func() error {
			_, err := c.Create(ctx, dir, fmt.Sprintf("entry-%06d", i), 0o100644, 0, 0, 0, 0)
			if wire.CodeOf(err) == wire.CodeExists {
				return nil // a try resent after an unavailable server made it
			}
			return err
		})
	}
}

// TestClusterTransferCatchUp: a 64 MiB file, then a directory of 20,000
// entries, are written through server 1 while server 3 is down; each time
// server 3 restarts and anti-entropy brings it up to date (their states
// are far bigger than one peer call), until all three checksums agree.
func TestClusterTransferCatchUp(t *testing.T) {
	if testing.Short() {
		t.Skip("writes 64 MiB and 20,000 entries")
	}
	tc := newTestCluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c := tc.connect(1, 2)

	tc.kill(3)
	var a *wire.Attr
	untilAvailable(t, "create", func() (err error) {
		a, err = c.Create(ctx, ids.RootIno, "big", 0o100644, 0, 0, 0, 0)
		return err
	})
	data := randBytes(9, 64<<20)
	start := time.Now()
	writeBig(ctx, t, c, a.Ino, data)
	t.Logf("wrote 64 MiB through server 1 with server 3 down in %v", time.Since(start).Round(time.Millisecond))
	start = time.Now()
	logs := &logBuffer{}
	tc.startLogged(3, logs)
	caught := tc.caughtUp(3, a.Ino, 2*time.Minute)
	tc.converge(time.Minute)
	t.Logf("64 MiB file: restarted server 3 held it %v after its start, all checksums agreed after %v; its copy: %s",
		caught.Round(time.Millisecond), time.Since(start).Round(time.Millisecond), fetchOf(logs, a.Ino))

	tc.kill(3)
	var d *wire.Attr
	untilAvailable(t, "mkdir", func() (err error) {
		d, err = c.Mkdir(ctx, ids.RootIno, "many", 0o755, 0, 0, 0)
		return err
	})
	start = time.Now()
	fillDir(ctx, t, c, d.Ino, 20000)
	t.Logf("created 20,000 entries through server 1 with server 3 down in %v", time.Since(start).Round(time.Millisecond))
	start = time.Now()
	logs = &logBuffer{}
	tc.startLogged(3, logs)
	caught = tc.caughtUp(3, d.Ino, 2*time.Minute)
	tc.converge(2 * time.Minute)
	copied := fetchOf(logs, d.Ino)
	if copied == "none logged" {
		copied = fmt.Sprintf("pushed to it by the owner (state pushes: server 1 %d, server 2 %d)",
			tc.srv[1].owner.Stats().StatePushes, tc.srv[2].owner.Stats().StatePushes)
	}
	t.Logf("20,000-entry directory: restarted server 3 held it %v after its start, all checksums (the directory "+
		"and its 20,000 new inodes) agreed after %v; the directory's state: %s", caught.Round(time.Millisecond),
		time.Since(start).Round(time.Millisecond), copied)
	st := tc.srv[3].owner.Stats()
	if st.CaughtUp == 0 {
		t.Fatalf("server 3 fetched nothing: %+v", st)
	}

	// server 3 serves both from its own replica once 1 and 2 are gone...
	// it cannot (no majority), so check its store directly
	if got := must[[]byte](t)(tc.srv[3].store.Read(a.Ino, 0, len(data)+1)); !bytes.Equal(got, data) {
		t.Fatalf("server 3's replica of the file: %d bytes, not the %d written", len(got), len(data))
	}
	if ents := must[[]store.DirEntry](t)(tc.srv[3].store.ReadDir(d.Ino, 0, 30000)); len(ents) != 20000 {
		t.Fatalf("server 3's replica of the directory: %d entries", len(ents))
	}
	for id, s := range tc.srv {
		if n := staged(t, s); n != 0 {
			t.Errorf("server %v: %d staging records left", id, n)
		}
	}
}

// caughtUp waits until server id holds ino at the state the other running
// servers agree on, and returns how long that took. It polls 'E' records:
// converge's checksums of every store would take a CPU of their own away
// from the copy being timed.
func (tc *testCluster) caughtUp(id ids.ServerID, ino ids.Ino, within time.Duration) time.Duration {
	tc.t.Helper()
	start := time.Now()
	for {
		var want replState
		agree := true
		for other, s := range tc.srv {
			if other == id {
				continue
			}
			st := stateOf(tc.t, s, ino)
			if want != (replState{}) && st != want {
				agree = false
			}
			want = st
		}
		if agree && want.version > 0 && stateOf(tc.t, tc.srv[id], ino) == want {
			return time.Since(start)
		}
		if time.Since(start) > within {
			tc.t.Fatalf("server %v did not catch up %v within %v", id, ino, within)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// fetchOf is what a server logged of its anti-entropy copy of ino.
func fetchOf(logs *logBuffer, ino ids.Ino) string {
	l := logs.lines(`msg="fetched inode state"`, "ino="+ino.String()+" ")
	if len(l) == 0 {
		return "none logged"
	}
	_, rest, _ := strings.Cut(l[0], "from=")
	return "from=" + rest
}

// logBuffer collects a server's debug log.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) lines(substr ...string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
next:
	for _, line := range strings.Split(l.b.String(), "\n") {
		for _, s := range substr {
			if !strings.Contains(line, s) {
				continue next
			}
		}
		out = append(out, line)
	}
	return out
}

// TestClusterTransferLaggingOwner: a 64 MiB file is written through server
// 1 while server 3 is down; 3 comes back, 1 dies, and a client of 3 reads
// the file: 3 becomes its owner while it lags, so it recovers the file's
// whole state from server 2, a page per call, and serves it completely and
// correctly. (A 64 MiB decoy, written first, keeps 3's anti-entropy busy
// meanwhile: it fetches inodes in inode order, and would otherwise race
// the recovery for the file.)
func TestClusterTransferLaggingOwner(t *testing.T) {
	if testing.Short() {
		t.Skip("writes 64 MiB")
	}
	tc := newTestCluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// closed before server 1 dies: a client of a dead server only does
	// not close (it keeps renewing)
	c1 := tc.connectUnmanaged(1)
	tc.kill(3)
	var decoy, a *wire.Attr
	untilAvailable(t, "create", func() (err error) {
		if decoy, err = c1.Create(ctx, ids.RootIno, "decoy", 0o100644, 0, 0, 0, 0); err != nil {
			return err
		}
		a, err = c1.Create(ctx, ids.RootIno, "big", 0o100644, 0, 0, 0, 0)
		return err
	})
	writeBig(ctx, t, c1, decoy.Ino, randBytes(11, 64<<20))
	data := randBytes(10, 64<<20)
	writeBig(ctx, t, c1, a.Ino, data)
	behind := stateOf(t, tc.srv[2], a.Ino)

	c1.Close()
	logs := &logBuffer{}
	// 3's links to its peers are slowed down, so that its copies take
	// long enough to be caught in the act: on a busy machine the copy
	// from 1 came and went between two looks at the stage, and 3 had
	// caught up by the time it became the owner.
	slow, err := transport.ParseFaults("delay=1ms")
	if err != nil {
		t.Fatal(err)
	}
	// 3's anti-entropy copy of the file from 2 is held back until the
	// read below is done: otherwise that copy (2.4 s here under CI's load)
	// may finish before 3 has waited out 1's ownership lease, and 3 would
	// not lag when it becomes the owner
	release := make(chan struct{})
	var releaseOnce sync.Once
	releaseCopies := func() { releaseOnce.Do(func() { close(release) }) }
	t.Cleanup(releaseCopies) // before the servers close: a held copy blocks the node's close
	tc.startLogged(3, logs, func(c *Config) {
		c.PeerFaults = slow
		c.beforeFetch = func(p ids.ServerID, ino ids.Ino) {
			if p == 2 && ino == a.Ino {
				<-release
			}
		}
	})
	// 1 dies while 3's anti-entropy copies from it (3 has staged a page):
	// that copy fails, and 3 becomes the file's owner while it lags
	for deadline := time.Now().Add(10 * time.Second); staged(t, tc.srv[3]) == 0 && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	tc.kill(1)
	c3 := tc.connect(3)
	for tc.srv[3].owner.Quarantined() {
		time.Sleep(5 * time.Millisecond)
	}
	// by its inode number, not a lookup: what this test is about is
	// the file's recovery, not its name's
	start := time.Now()
	got := readBig(ctx, t, c3, a.Ino)
	took := time.Since(start)
	releaseCopies()
	if !bytes.Equal(got, data) {
		i := 0
		for i < len(got) && i < len(data) && got[i] == data[i] {
			i++
		}
		t.Fatalf("through server 3: %d bytes, want %d; first difference at %d", len(got), len(data), i)
	}
	copied := logs.lines(`msg="copied inode state"`, "ino="+a.Ino.String()+" ", "from=")
	t.Logf("read of 64 MiB through the lagging new owner: %v (server 2 was at %v/%d)",
		took.Round(time.Millisecond), behind.epoch, behind.version)
	for _, l := range copied {
		t.Logf("server 3: %s", l)
	}
	if len(copied) == 0 {
		t.Fatalf("server 3 did not recover the file by copying it: it did not lag; anti-entropy: %q",
			logs.lines(`msg="fetched inode state"`, "ino="+a.Ino.String()+" "))
	}
	if st := tc.srv[3].owner.Stats(); st.Recoveries == 0 {
		t.Fatalf("server 3 recovered nothing: %+v", st)
	}
	// and it can go on writing it, with server 2 as its majority
	writeBig(ctx, t, c3, a.Ino, []byte("after"))
	if got := readBig(ctx, t, c3, a.Ino); !bytes.Equal(got[:5], []byte("after")) || !bytes.Equal(got[5:], data[5:]) {
		t.Fatalf("after the write: %q...", got[:5])
	}
}

// connectUnmanaged is connect without the close at cleanup: the caller
// closes it.
func (tc *testCluster) connectUnmanaged(servers ...ids.ServerID) *client.Client {
	tc.t.Helper()
	cfg := client.DefaultConfig()
	for _, id := range servers {
		cfg.Servers = append(cfg.Servers, tc.addrs[id])
	}
	cfg.Token = tc.ident.TokenValue()
	cfg.Logger = testLogger().With("client", servers)
	cfg.FailoverTimeout = 200 * time.Millisecond
	c, err := client.New(context.Background(), cfg)
	if err != nil {
		tc.t.Fatal(err)
	}
	return c
}

// startLogged starts server id like start, its debug log going to w.
func (tc *testCluster) startLogged(id ids.ServerID, w *logBuffer, opts ...func(*Config)) *Server {
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
	cfg.Logger = slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug})).With("server", id)
	for _, o := range opts {
		o(&cfg)
	}
	s, err := Start(cfg)
	if err != nil {
		tc.t.Fatal(err)
	}
	tc.srv[id] = s
	return s
}
