package client

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/metaserver"
	"github.com/leasefs/leasefs/transport"
	"github.com/leasefs/leasefs/wire"
)

// startServer runs a metadata server in this process.
func startServer(t *testing.T) *metaserver.Server {
	t.Helper()
	return startServerWith(t, func(*metaserver.Config) {})
}

// startServerWith is startServer with the configuration changed by set.
func startServerWith(t *testing.T, set func(*metaserver.Config)) *metaserver.Server {
	t.Helper()
	cfg := metaserver.DefaultConfig()
	cfg.Dir = t.TempDir()
	cfg.Listen = "127.0.0.1:0"
	cfg.Logger = slog.New(slog.DiscardHandler)
	set(&cfg)
	s, err := metaserver.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// connectTo opens a client of s, its configuration changed by set.
func connectTo(t *testing.T, s *metaserver.Server, set func(*Config)) *Client {
	t.Helper()
	tok, err := transport.ParseToken(s.Token())
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.Servers = []string{s.Addr().String()}
	cfg.Token = tok
	cfg.Logger = slog.New(slog.DiscardHandler)
	set(&cfg)
	c, err := New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// within runs fn and fails the test, with every goroutine's stack, if it
// has not returned by the deadline: a hang of the client's waits (which
// fn cannot interrupt) shows as a failure, not as a test that never ends.
func within(t *testing.T, d time.Duration, what string, fn func(ctx context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- fn(ctx) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	case <-ctx.Done():
		buf := make([]byte, 8<<20)
		buf = buf[:runtime.Stack(buf, true)]
		// straight out too: the cleanup may hang on the same waits
		fmt.Fprintf(os.Stderr, "%s: hung for %v; goroutines:\n%s", what, d, buf)
		t.Fatalf("%s: hung for %v (goroutines on stderr)", what, d)
	}
}

// TestEvictionDuringCreatesBehind: a client whose cache holds few inodes
// gives back locks it evicts for space while it creates files behind the
// caller, as a metadata benchmark does on a mount whose cache is full. The
// sender of a directory's batch gave back the evicted locks itself, and the
// release of the directory's lock (or of a file created in the batch)
// waited for that very batch: the mount hung for good, CreateOpen waiting
// for a slot behind.
func TestEvictionDuringCreatesBehind(t *testing.T) {
	s := startServer(t)
	c := connectTo(t, s, func(cfg *Config) { cfg.CacheInodes = 16 })
	within(t, 60*time.Second, "creates with evictions", func(ctx context.Context) error {
		for round := range 3 {
			d, err := c.Mkdir(ctx, ids.RootIno, fmt.Sprint("d", round), 0o40755, 0, 0, 0)
			if err != nil {
				return err
			}
			for i := range 2000 {
				name := fmt.Sprint("f", i)
				// as the kernel does before an O_CREAT|O_EXCL open
				if _, err := c.Lookup(ctx, d.Ino, name); wire.CodeOf(err) != wire.CodeNotFound {
					return fmt.Errorf("lookup %s: %v", name, err)
				}
				a, err := c.CreateOpen(ctx, d.Ino, name, 0o100644, 0, 0, 0)
				if err != nil {
					return fmt.Errorf("create %s: %w", name, err)
				}
				if err := c.Flush(ctx, a.Ino); err != nil {
					return err
				}
				if err := c.Release(ctx, a.Ino); err != nil {
					return err
				}
			}
		}
		return c.FlushAll(ctx)
	})
	t.Logf("%d creates sent behind, %d locks evicted, %d requests", c.Counters.CreatedBehind.Load(),
		c.Counters.LocksEvicted.Load(), c.Counters.Requests.Load())
	if n := c.Counters.CreatedBehind.Load(); n == 0 {
		t.Error("no create was sent behind the caller")
	}
	if n := c.Counters.LocksEvicted.Load(); n == 0 {
		t.Error("no lock was evicted")
	}
	// every file is there, seen from another client
	other := connectTo(t, s, func(*Config) {})
	ctx := context.Background()
	for round := range 3 {
		d, err := other.Lookup(ctx, ids.RootIno, fmt.Sprint("d", round))
		if err != nil {
			t.Fatal(err)
		}
		ents, err := other.ListingByName(ctx, d.Ino)
		if err != nil {
			t.Fatal(err)
		}
		if len(ents) != 2000 {
			t.Errorf("d%d holds %d files, want 2000", round, len(ents))
		}
	}
}

// TestReleasesFloor: while an evicted lock's release is under way, and
// until every request sent before its answer has its reply, grants of the
// inode with the released grant's number or below stay out of the cache;
// a newer grant goes in. A release never sent keeps nothing out; one whose
// answer never came keeps its floor until the cache is dropped.
func TestReleasesFloor(t *testing.T) {
	var r releases
	r.init()
	kept := func(g wire.Grant) bool { return len(r.filter([]wire.Grant{g})) == 1 }
	regrant, newer := wire.Grant{Ino: 5, Mode: wire.LockShared, Seq: 7}, wire.Grant{Ino: 5, Mode: wire.LockShared, Seq: 8}
	r.floors[5] = floor{seq: 7} // evicted (takeEvictedLocked)
	early := r.sent()           // a request sent before the release's answer
	if kept(regrant) || !kept(newer) || !kept(wire.Grant{Ino: 6, Seq: 1}) {
		t.Fatal("a pending release's floor: the re-grant is applied, or a newer grant or another inode's is not")
	}
	r.done(regrant, true, true)
	late := r.sent() // sent after the answer: meets no re-grant
	if kept(regrant) {
		t.Fatal("the floor went while a request sent before the release's answer is unanswered")
	}
	late()
	if kept(regrant) {
		t.Fatal("a request sent after the answer let the floor go")
	}
	early()
	if !kept(regrant) || len(r.floors) != 0 || len(r.answered) != 0 {
		t.Fatalf("floors left once every earlier request was answered: %v %v", r.floors, r.answered)
	}

	r.floors[5] = floor{seq: 7}
	r.done(regrant, false, false) // never sent: the server holds the lock for us
	if !kept(regrant) {
		t.Fatal("a release never sent keeps its grant out")
	}
	r.floors[5] = floor{seq: 7}
	r.done(regrant, true, false) // sent, no answer: it may still arrive
	if kept(regrant) {
		t.Fatal("a release that may still reach the server let its grant back")
	}
	r.reset()
	if !kept(regrant) {
		t.Fatal("a dropped cache keeps a floor")
	}
}

// TestEvictedLockNotRegranted: a client evicts its shared lock on a file
// and, before the release reaches the server, asks about the file: the
// server grants the lock it still holds for the client again, under the
// same number. Taken into the cache, that grant outlived the release, and
// the client went on serving the file's attributes from its cache after
// another client had changed the file (no revocation: the server no longer
// counted the first client a holder).
func TestEvictedLockNotRegranted(t *testing.T) {
	s := startServer(t)
	a := connectTo(t, s, func(cfg *Config) { cfg.CacheInodes = 4 })
	b := connectTo(t, s, func(*Config) {})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	x, err := b.Create(ctx, ids.RootIno, "x", 0o100644, 0, 0, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Write(ctx, x.Ino, 0, []byte("v1"), false, false); err != nil {
		t.Fatal(err)
	}
	if err := b.Flush(ctx, x.Ino); err != nil {
		t.Fatal(err)
	}
	var others []ids.Ino
	for i := range 16 {
		o, err := b.Create(ctx, ids.RootIno, fmt.Sprint("o", i), 0o100644, 0, 0, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		others = append(others, o.Ino)
	}

	held, release, released := make(chan struct{}), make(chan struct{}), make(chan struct{})
	hook := func(g wire.Grant) func() {
		if g.Ino != x.Ino {
			return func() {}
		}
		close(held)
		<-release
		return func() { close(released) }
	}
	a.rel.giveBackHook.Store(&hook)
	if _, err := a.GetAttr(ctx, x.Ino); err != nil { // A's S lock on x
		t.Fatal(err)
	}
	// A's cache holds 4 inodes: looking at others evicts x, sooner or later
	for i := 0; ; i++ {
		select {
		case <-held:
		case <-ctx.Done():
			t.Fatal("x was never evicted")
		default:
			if _, err := a.GetAttr(ctx, others[i%len(others)]); err != nil {
				t.Fatal(err)
			}
			continue
		}
		break
	}
	// The release is held back: the server still counts A a holder and
	// grants x again under the same number.
	if a1, err := a.GetAttr(ctx, x.Ino); err != nil || a1.Size != 2 {
		t.Fatalf("x before the release: %+v, %v", a1, err)
	}
	close(release)
	select {
	case <-released:
	case <-ctx.Done():
		t.Fatal("the release was never answered")
	}
	// B changes x; the server revokes nothing from A, which let x go.
	if _, err := b.Write(ctx, x.Ino, 0, []byte("version 2"), false, false); err != nil {
		t.Fatal(err)
	}
	if err := b.Flush(ctx, x.Ino); err != nil {
		t.Fatal(err)
	}
	if a2, err := a.GetAttr(ctx, x.Ino); err != nil || a2.Size != 9 {
		t.Fatalf("A's x after B wrote 9 bytes: size %d, %v", a2.Size, err)
	}
}
