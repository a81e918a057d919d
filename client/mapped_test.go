package client

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/leasefs/leasefs/internal/clock"
	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/wire"
)

func TestChangedWords(t *testing.T) {
	base := make([]byte, 40)
	for _, c := range []struct {
		off     uint64
		changed []int // bytes of data that differ from base
		want    [][2]int
	}{
		{0, nil, nil},
		{0, []int{0}, [][2]int{{0, 8}}},
		// a store that leaves a byte as it was still writes its word
		{0, []int{0, 5}, [][2]int{{0, 8}}},
		{0, []int{7, 8}, [][2]int{{0, 16}}},
		{0, []int{3, 20}, [][2]int{{0, 8}, {16, 24}}},
		{0, []int{39}, [][2]int{{32, 40}}},
		// data at an offset that is not a word's: words of the file
		{5, []int{0}, [][2]int{{0, 3}}},
		{5, []int{3}, [][2]int{{3, 11}}},
		{5, []int{2, 3}, [][2]int{{0, 11}}},
		{5, []int{36}, [][2]int{{35, 40}}},
	} {
		data := bytes.Clone(base)
		for _, i := range c.changed {
			data[i] = 1
		}
		if got := changedWords(c.off, data, base); !slices.Equal(got, c.want) {
			t.Errorf("off %d, changed %v: %v, want %v", c.off, c.changed, got, c.want)
		}
	}
}

func TestOverlayExtents(t *testing.T) {
	exts := []extent{{off: 10, data: []byte("abc")}, {off: 20, data: []byte("xyz")}}
	for _, c := range []struct {
		off  uint64
		buf  string
		n    int
		want string
	}{
		{0, "................", 16, "..........abc..."},
		// past what was read: the gap is a hole
		{0, "..........................", 5, ".....\x00\x00\x00\x00\x00abc\x00\x00\x00\x00\x00\x00\x00xyz"},
		{11, "....", 4, "bc.."},
		{21, "....", 0, "yz"},
		{30, "....", 2, ".."},
	} {
		buf := []byte(c.buf)
		n := overlayExtents(exts, c.off, buf, c.n)
		if got := string(buf[:n]); got != c.want {
			t.Errorf("off %d n %d: %q, want %q", c.off, c.n, got, c.want)
		}
	}
}

// TestFillAfterRevocationEnded: a revocation to None of a file the kernel
// has no pages of yet drops nothing and ends; before its acknowledgement
// reaches the server, a fill asks for the file, and the server, which
// still counts the client a holder, answers under the grant being given
// up. That fill must not count as covered: no invalidation follows it,
// and once the server has the acknowledgement another client may write.
func TestFillAfterRevocationEnded(t *testing.T) {
	var m mappedFiles
	const ino, server = ids.Ino(7), ids.ServerID(1)
	m.beginRevoke(ino, server, 12, false, true)
	before := m.servedSoFar(ino)
	if !m.quiet(ino, before) {
		t.Fatal("a revocation with no fill stayed open")
	}
	m.endRevoke(ino, false, true, false)
	f := m.enterFill(context.Background(), clock.Real{}, ino)
	if ok, covered := m.mayReturn(f, readInfo{grant: 9}, server); ok || covered {
		t.Fatalf("a fill read under grant 9, given up by revocation 12, may return (covered %v)", covered)
	}
	if ok, covered := m.mayReturn(f, readInfo{grant: 13}, server); !ok || !covered {
		t.Fatal("a fill read under a grant after the revocation may not return")
	}
	m.forgetReleased(0) // a fill in flight may still meet the old grant
	if ok, _ := m.mayReturn(f, readInfo{grant: 9}, server); ok {
		t.Fatal("the grants given up were forgotten while a fill was in flight")
	}
	m.leaveFill(f, 0)
	m.forget(ino) // the kernel forgot the file: only released keeps it
	m.forgetReleased(time.Hour)
	if m.file(ino, false) == nil {
		t.Fatal("the grants given up were forgotten before their time")
	}
	m.forgetReleased(0)
	if f := m.file(ino, false); f != nil {
		t.Fatalf("a file with nothing left to keep stays: %+v", f)
	}
}

// TestFillBeforeGiveBackAnswered: as TestFillAfterRevocationEnded, for a
// lock the cache evicted: its pages are dropped before the release is
// sent, and a fill that comes before the server has the release is read
// under the lock being released. It must not return until the server
// grants the lock anew; then it does.
func TestFillBeforeGiveBackAnswered(t *testing.T) {
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
	var once sync.Once
	letGo := func() { once.Do(func() { close(release) }) }
	defer letGo() // a failure must not leave the release held
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
	// The release is held back: a fill now is read under the lock being
	// released, and nothing will drop the page it fills.
	buf := make([]byte, 8)
	fctx, fcancel := context.WithTimeout(ctx, 300*time.Millisecond)
	n, err := a.ReadPage(fctx, x.Ino, 0, buf)
	fcancel()
	if err == nil {
		t.Fatalf("a fill returned %q read under the lock being given back", buf[:n])
	}
	letGo()
	select {
	case <-released:
	case <-ctx.Done():
		t.Fatal("the release was never answered")
	}
	if n, err := a.ReadPage(ctx, x.Ino, 0, buf); err != nil || string(buf[:n]) != "v1" {
		t.Fatalf("a fill after the release: %q, %v", buf[:n], err)
	}
}

// TestRevocationWaitsForXRevocation: the server revokes X to S, then, for
// a writer, to None, and the client takes the second first. That one
// sends the pages written back from the mapping under the X lock, which
// the server counts as the client's until it is acknowledged. The first,
// acknowledged meanwhile, would downgrade the lock at the server, and the
// sends would queue behind the writer's request, which waits for the
// second acknowledgement: a deadlock (TestLinearizableMapped hung on it).
// The first waits for the second to finish.
func TestRevocationWaitsForXRevocation(t *testing.T) {
	s := startServer(t)
	a := connectTo(t, s, func(*Config) {})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	x, err := a.Create(ctx, ids.RootIno, "x", 0o100644, 0, 0, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Write(ctx, x.Ino, 0, []byte("12345678"), false, false); err != nil {
		t.Fatal(err)
	}
	if mode, _ := a.cache.Mode(x.Ino); mode != wire.LockExclusive {
		t.Fatalf("A holds %v after its write", mode)
	}
	a.maps.queueWrite(x.Ino, 0, []byte("abcdefgh"), a.gen(), false) // written back from a mapping
	f := a.maps.file(x.Ino, false)
	if err := f.sendMu.lock(ctx); err != nil { // a send of it under way
		t.Fatal(err)
	}
	var once sync.Once
	sent := func() { once.Do(f.sendMu.unlock) }
	defer sent() // a failure must not leave the revocations waiting
	cn := a.homeConn()
	toNone, toS := make(chan *wire.Reply, 1), make(chan *wire.Reply, 1)
	go func() { toNone <- a.revoke(ctx, cn, &wire.Callback{Ino: x.Ino, Mode: wire.LockNone, Seq: 1 << 40}) }()
	waitUntil(t, "the revocation to None to begin", func() bool {
		a.maps.mu.Lock()
		defer a.maps.mu.Unlock()
		return f.xRevoking == 1
	})
	go func() { toS <- a.revoke(ctx, cn, &wire.Callback{Ino: x.Ino, Mode: wire.LockShared, Seq: 1<<40 - 1}) }()
	select {
	case rep := <-toS:
		t.Fatalf("the revocation to S was acknowledged (%v) while the one of X was sending under it", rep.Err())
	case <-time.After(200 * time.Millisecond):
	}
	sent()
	for _, ch := range []chan *wire.Reply{toNone, toS} {
		select {
		case rep := <-ch:
			if err := rep.Err(); err != nil {
				t.Fatal(err)
			}
		case <-ctx.Done():
			t.Fatal("a revocation never ended")
		}
	}
	if a.maps.hasQueued(x.Ino) {
		t.Fatal("the written-back pages were not sent before the acknowledgement")
	}
}

// waitUntil polls cond until it holds, failing the test after 10 s.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}
