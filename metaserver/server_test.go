package metaserver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/leasefs/leasefs/client"
	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/internal/version"
	"github.com/leasefs/leasefs/transport"
	"github.com/leasefs/leasefs/wire"
)

func startTestServer(t *testing.T) *Server {
	t.Helper()
	return startTestServerWith(t, func(*Config) {})
}

// startTestServerWith is startTestServer with the configuration changed by set.
func startTestServerWith(t *testing.T, set func(*Config)) *Server {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Dir = t.TempDir()
	cfg.Listen = "127.0.0.1:0"
	cfg.Logger = slog.New(slog.DiscardHandler)
	set(&cfg)
	s, err := Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func connect(t *testing.T, s *Server) *client.Client {
	t.Helper()
	return connectWith(t, s, func(*client.Config) {})
}

// connectWith is connect with the client's configuration changed by set.
func connectWith(t *testing.T, s *Server, set func(*client.Config)) *client.Client {
	t.Helper()
	tok, err := transport.ParseToken(s.Token())
	if err != nil {
		t.Fatal(err)
	}
	cfg := client.DefaultConfig()
	cfg.Servers = []string{s.Addr().String()}
	cfg.Token = tok
	cfg.Logger = slog.New(slog.DiscardHandler)
	set(&cfg)
	c, err := client.New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// TestBadNames: names the kernel would never send still get clear errors
// and change nothing.
func TestBadNames(t *testing.T) {
	s := startTestServer(t)
	c := connect(t, s)
	ctx := context.Background()
	for name, want := range map[string]wire.Code{
		"a/b": wire.CodeInvalid, "a\x00b": wire.CodeInvalid, "": wire.CodeInvalid,
		".": wire.CodeInvalid, "..": wire.CodeInvalid, strings.Repeat("x", 256): wire.CodeNameTooLong,
	} {
		if _, err := c.Create(ctx, ids.RootIno, name, 0o100644, 0, 0, 0, 0); wire.CodeOf(err) != want {
			t.Errorf("create %q: %v, want %v", name, err, want)
		}
		if _, err := c.Mkdir(ctx, ids.RootIno, name, 0o40755, 0, 0, 0); wire.CodeOf(err) != want {
			t.Errorf("mkdir %q: %v, want %v", name, err, want)
		}
	}
	ents, err := c.ReadDir(ctx, ids.RootIno, 0, 100)
	if err != nil || len(ents) != 0 {
		t.Fatalf("root after bad names: %v %v", ents, err)
	}
}

// TestMalformedAndUnknownSession sends raw bodies through the transport.
func TestMalformedAndUnknownSession(t *testing.T) {
	s := startTestServer(t)
	tok, _ := transport.ParseToken(s.Token())
	tc := transport.NewClient(s.Addr().String(), transport.ClientConfig{Token: tok})
	defer tc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	call := func(h transport.Header, body []byte) *wire.Reply {
		raw, err := tc.Call(ctx, h, body)
		if err != nil {
			t.Fatal(err)
		}
		rep, err := wire.ParseReply(raw)
		if err != nil {
			t.Fatal(err)
		}
		return rep
	}
	if rep := call(transport.Header{Client: tc.ID(), Seq: 1}, []byte{wire.Version, 2, 3}); rep.Code != wire.CodeBadMessage {
		t.Fatalf("garbage: %v", rep.Code)
	}
	// A body of another release's encoding gets a refusal any release
	// reads, naming the server's build and both versions.
	other := (&wire.Request{Op: wire.OpOpenSession}).Append(nil)
	other[0] = wire.Version + 1
	raw, err := tc.Call(ctx, transport.Header{Client: tc.ID(), Seq: 3}, other)
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("runs leasefs %s, which speaks wire version %d, not %d", version.Get(), wire.Version, wire.Version+1)
	if _, err := wire.ParseReply(raw); !errors.Is(err, wire.ErrRefused) || !strings.Contains(err.Error(), want) {
		t.Fatalf("another version: %v, want a refusal saying %q", err, want)
	}
	getattr := (&wire.Request{Op: wire.OpGetAttr, Ino: ids.RootIno}).Append(nil)
	if rep := call(transport.Header{Client: tc.ID(), Session: 12345, Seq: 2}, getattr); rep.Code != wire.CodeNack {
		t.Fatalf("unknown session: %v, want NACK", rep.Code)
	}
	// The server still serves a proper client.
	c := connect(t, s)
	if _, err := c.GetAttr(ctx, ids.RootIno); err != nil {
		t.Fatal(err)
	}
}

// TestRetryExecutesOnce: the same request number sent twice runs once, so
// a retried mkdir after a lost reply does not fail with EEXIST.
func TestRetryExecutesOnce(t *testing.T) {
	s := startTestServer(t)
	c := connect(t, s)
	ctx := context.Background()
	_ = c
	tok, _ := transport.ParseToken(s.Token())
	tc := transport.NewClient(s.Addr().String(), transport.ClientConfig{Token: tok})
	defer tc.Close()
	raw, err := tc.Call(ctx, transport.Header{Client: tc.ID()}, (&wire.Request{Op: wire.OpOpenSession}).Append(nil))
	if err != nil {
		t.Fatal(err)
	}
	rep, _ := wire.ParseReply(raw)
	h := transport.Header{Client: tc.ID(), Session: rep.Session.ID, Seq: 1}
	mkdir := (&wire.Request{Op: wire.OpMkdir, Parent: ids.RootIno, Name: "d", Mode: 0o40755}).Append(nil)
	for i := 0; i < 2; i++ {
		raw, err := tc.Call(ctx, h, mkdir)
		if err != nil {
			t.Fatal(err)
		}
		if rep, _ := wire.ParseReply(raw); rep.Code != wire.CodeOK {
			t.Fatalf("attempt %d: %v", i, rep.Code)
		}
	}
	// A new request number does execute again, and fails as it should.
	h.Seq = 2
	raw, _ = tc.Call(ctx, h, mkdir)
	if rep, _ := wire.ParseReply(raw); !errors.Is(rep.Err(), wire.Err(wire.CodeExists)) {
		t.Fatalf("second mkdir: %v", rep.Code)
	}
}

// TestRemoveIfIno: a removal that names the inode it means removes nothing
// when the name names another one now (a file created under the name since
// the removal was first sent), and removes it when it is the one.
func TestRemoveIfIno(t *testing.T) {
	s := startTestServer(t)
	c, other := connect(t, s), connect(t, s) // other looks the name up: c's raw calls leave its cache be
	ctx := context.Background()
	old, err := c.Create(ctx, ids.RootIno, "f", 0o100644, 0, 0, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Call(ctx, &wire.Request{Op: wire.OpUnlink, Parent: ids.RootIno, Name: "f"}); err != nil {
		t.Fatal(err)
	}
	cur, err := c.Create(ctx, ids.RootIno, "f", 0o100644, 0, 0, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, op := range []wire.Op{wire.OpUnlink, wire.OpRmdir} {
		_, err = c.Call(ctx, &wire.Request{Op: op, Parent: ids.RootIno, Name: "f", Ino: old.Ino, Flags: wire.RemoveIfIno})
		if wire.CodeOf(err) != wire.CodeNotFound {
			t.Fatalf("%v of f meaning the removed %v: %v, want not found", op, old.Ino, err)
		}
	}
	if a, err := other.Lookup(ctx, ids.RootIno, "f"); err != nil || a.Ino != cur.Ino {
		t.Fatalf("f after the refused removals: %v, %v; want %v", a, err, cur.Ino)
	}
	if _, err := c.Call(ctx, &wire.Request{Op: wire.OpUnlink, Parent: ids.RootIno, Name: "f", Ino: cur.Ino, Flags: wire.RemoveIfIno}); err != nil {
		t.Fatalf("unlink of f meaning %v: %v", cur.Ino, err)
	}
	if _, err := other.Lookup(ctx, ids.RootIno, "f"); wire.CodeOf(err) != wire.CodeNotFound {
		t.Fatalf("f after its removal: %v", err)
	}
}

// TestDirtyBudget: a client writing several files under X buffers no more
// than client.DirtyBudget for all of them together (plus the write that
// crosses it), and every byte reaches the server.
func TestDirtyBudget(t *testing.T) {
	s := startTestServer(t)
	c := connect(t, s)
	ctx := context.Background()
	const files, perFile, write = 3, 60 << 20, 1 << 20
	data := make([]byte, write)
	var inos []ids.Ino
	for f := range files {
		a, err := c.Create(ctx, ids.RootIno, fmt.Sprint("f", f), 0o100644, 0, 0, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		inos = append(inos, a.Ino)
	}
	most := int64(0)
	for off := 0; off < perFile; off += write {
		for f, ino := range inos {
			data[0], data[1] = byte(f), byte(off>>20)
			if _, err := c.Write(ctx, ino, uint64(off), data, false, false); err != nil {
				t.Fatal(err)
			}
			most = max(most, c.Stats().DirtyBytes)
		}
	}
	if most > client.DirtyBudget+write {
		t.Fatalf("%d bytes buffered at most, budget %d", most, client.DirtyBudget)
	}
	if most < client.DirtyBudget/2 {
		t.Fatalf("only %d bytes ever buffered: writes were not buffered under X", most)
	}
	other := connect(t, s) // its reads revoke the writer's locks: the rest is flushed
	buf := make([]byte, 2)
	for f, ino := range inos {
		for off := 0; off < perFile; off += write {
			if n, err := other.Read(ctx, ino, uint64(off), buf); err != nil || n != 2 || buf[0] != byte(f) || buf[1] != byte(off>>20) {
				t.Fatalf("file %d at %d MiB: %v %v", f, off>>20, buf[:n], err)
			}
		}
	}
	if d := c.Stats().DirtyBytes; d != 0 {
		t.Fatalf("%d bytes still counted as buffered after every file was flushed", d)
	}
}

// TestRevocationWaitsForFlush: a revocation asks the holder to flush what
// it buffered before it acknowledges, and a large flush over a slow network
// takes longer than the delivery timeout. The server must not fail a
// client that is flushing (its writes for the inode keep coming): the
// reader waits for the flush and reads every byte; the writer gets no NACK.
func TestRevocationWaitsForFlush(t *testing.T) {
	s := startTestServer(t) // delivery timeout 500 ms
	slow, err := transport.ParseFaults("delay=10ms")
	if err != nil {
		t.Fatal(err)
	}
	w := connectWith(t, s, func(c *client.Config) { c.Faults = slow })
	ctx := context.Background()
	a, err := w.Create(ctx, ids.RootIno, "big", 0o100644, 0, 0, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	const size, write = 48 << 20, 1 << 20
	data := make([]byte, write)
	for off := 0; off < size; off += write {
		data[0] = byte(off >> 20)
		if _, err := w.Write(ctx, a.Ino, uint64(off), data, false, false); err != nil {
			t.Fatal(err)
		}
	}
	if d := w.Stats().DirtyBytes; d < size/2 {
		t.Fatalf("only %d bytes buffered: nothing for the revocation to flush", d)
	}
	r := connect(t, s)
	start := time.Now()
	buf := make([]byte, 1)
	for off := 0; off < size; off += write {
		if n, err := r.Read(ctx, a.Ino, uint64(off), buf); err != nil || n != 1 || buf[0] != byte(off>>20) {
			t.Fatalf("read at %d MiB: %v %v", off>>20, buf[:n], err)
		}
	}
	took := time.Since(start)
	t.Logf("the reader waited %v for the writer's flush (delivery timeout %v)", took, s.cfg.DeliveryTimeout)
	if n := w.Stats().NacksReceived; n != 0 {
		t.Errorf("the flushing writer was NACKed %d times", n)
	}
	if took < s.cfg.DeliveryTimeout {
		t.Logf("the flush took less than the delivery timeout: this run did not test waiting for it")
	}
}

// TestOpenWhilePurging: a purge runs without the server's mutex (a big
// file takes many transactions); an open of the inode meanwhile fails and
// counts no handle, so no handle sees the inode vanish.
func TestOpenWhilePurging(t *testing.T) {
	s := startTestServer(t)
	c := connect(t, s)
	ctx := context.Background()
	f, err := c.Create(ctx, ids.RootIno, "f", 0o100644, 0, 0, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	s.purging[f.Ino] = struct{}{}
	s.mu.Unlock()
	if _, err := c.Call(ctx, &wire.Request{Op: wire.OpOpen, Ino: f.Ino}); wire.CodeOf(err) != wire.CodeNotFound {
		t.Fatalf("open while purging: %v, want not found", err)
	}
	s.mu.Lock()
	opens := s.opens[f.Ino]
	delete(s.purging, f.Ino)
	s.mu.Unlock()
	if opens != 0 {
		t.Fatalf("%d handles counted on an inode being purged", opens)
	}
	if _, err := c.Call(ctx, &wire.Request{Op: wire.OpOpen, Ino: f.Ino}); err != nil {
		t.Fatalf("open once the purge is over (the file is linked): %v", err)
	}
}

// TestCreateIno: a server hands a client inode numbers, and makes a file
// with one of them, granting the creator its X lock and answering without
// attributes (the client made its own); a number it did not hand out, or
// one in use, is refused and nothing is made.
func TestCreateIno(t *testing.T) {
	s := startTestServer(t)
	c, other := connect(t, s), connect(t, s)
	ctx := context.Background()
	rep, err := c.Call(ctx, &wire.Request{Op: wire.OpAllocInos, Size: 3})
	if err != nil {
		t.Fatal(err)
	}
	first, n, err := wire.ParseInoRange(rep.Data)
	if err != nil || n != 3 {
		t.Fatalf("range %v+%d: %v", first, n, err)
	}
	create := func(name string, ino ids.Ino) (*wire.Reply, error) {
		return c.Call(ctx, &wire.Request{Op: wire.OpCreate, Parent: ids.RootIno, Name: name, Ino: ino, Mode: 0o100644,
			Mtime: 42e9, Flags: wire.CreateOpen | wire.CreateIno})
	}
	rep, err = create("f", first+1)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Attr != nil || !grants(rep, first+1) {
		t.Fatalf("reply: attr %v, grants %v", rep.Attr, rep.Grants)
	}
	if a, err := other.Lookup(ctx, ids.RootIno, "f"); err != nil || a.Ino != first+1 || a.Mtime != 42e9 {
		t.Fatalf("f: %+v, %v", a, err)
	}
	for name, ino := range map[string]ids.Ino{"in-use": first + 1, "not-handed-out": first + 1<<30, "zero": 0} {
		if _, err := create(name, ino); wire.CodeOf(err) != wire.CodeInvalid {
			t.Fatalf("create with %s number %v: %v, want invalid", name, ino, err)
		}
		if _, err := other.Lookup(ctx, ids.RootIno, name); wire.CodeOf(err) != wire.CodeNotFound {
			t.Fatalf("%s after the refused create: %v", name, err)
		}
	}
}

func grants(rep *wire.Reply, ino ids.Ino) bool {
	for _, g := range rep.Grants {
		if g.Ino == ino && g.Mode == wire.LockExclusive {
			return true
		}
	}
	return false
}

// TestBatchResentWhole: a batch of changes in one directory sent again
// whole, as a client resends it after its server failed it, is answered
// from what its first copy made: every change of it. The server kept only
// the last 16 request ids per client and directory, so the rest of a batch
// of creates sent behind failed as EEXIST, and the client counted their
// files lost.
func TestBatchResentWhole(t *testing.T) {
	s := startTestServer(t)
	c := connect(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	d, err := c.Mkdir(ctx, ids.RootIno, "d", 0o40755, 0, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	const first = 1 << 40 // past the ids the client gives its own requests
	var subs []*wire.Request
	for i := range wire.MaxBatch {
		subs = append(subs, &wire.Request{Op: wire.OpMkdir, Parent: d.Ino, Name: fmt.Sprint("d", i), Mode: 0o40755,
			ReqID: first + uint64(i), Oldest: first})
	}
	for pass := range 2 {
		rep, err := c.Call(ctx, &wire.Request{Op: wire.OpBatch, Parent: d.Ino, Data: wire.AppendBatch(nil, subs)})
		if err != nil {
			t.Fatal(err)
		}
		reps, err := wire.ParseBatchReplies(rep.Data, len(subs))
		if err != nil {
			t.Fatal(err)
		}
		for i, r := range reps {
			if err := r.Err(); err != nil {
				t.Fatalf("pass %d: mkdir d%d: %v", pass+1, i, err)
			}
		}
	}
	if n := s.counters.Replayed.Load(); n != wire.MaxBatch {
		t.Fatalf("%d changes answered as resent, want %d", n, wire.MaxBatch)
	}
}
