package paxosnode

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/leasefs/leasefs/internal/clock"
	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/lease/paxos"
	"github.com/leasefs/leasefs/transport"
)

func TestPeerClientID(t *testing.T) {
	for id := 1; id <= 255; id++ {
		got, ok := PeerOf(PeerClientID(ids.ServerID(id)))
		if !ok || got != ids.ServerID(id) {
			t.Fatalf("PeerOf(PeerClientID(%d)) = %v, %v", id, got, ok)
		}
	}
	for _, c := range []ids.ClientID{0, 1, 1 << 63, 1<<63 | 2, PeerClientBase, 0xFFFF_FFFF_FFFF_FE01} {
		if id, ok := PeerOf(c); ok {
			t.Fatalf("PeerOf(%v) = %v, want not a peer", c, id)
		}
	}
	if !IsPeerBody([]byte{PeerMagic}) || IsPeerBody([]byte{1, PeerMagic}) || IsPeerBody(nil) {
		t.Fatal("IsPeerBody")
	}
}

func TestFrameRoundTrip(t *testing.T) {
	m := paxos.Message{From: 2, To: 1, Entries: []paxos.Entry{
		{Kind: paxos.KindPrepare, Ino: 5, Ballot: 77},
		{Kind: paxos.KindLearn, Ino: 6, Ballot: 78, Owner: 2, Aux: 1e6},
	}}
	f, err := parseFrame(appendPaxosFrame(nil, &m))
	if err != nil || f.typ != framePaxos || f.from != 2 || f.to != 1 || len(f.msg.Entries) != 2 || f.msg.Entries[1] != m.Entries[1] {
		t.Fatalf("paxos frame: %+v, %v", f, err)
	}
	f, err = parseFrame(appendCallFrame(nil, 3, 4, 9, []byte("body")))
	if err != nil || f.typ != frameCall || f.from != 3 || f.to != 4 || f.kind != 9 || string(f.body) != "body" {
		t.Fatalf("call frame: %+v, %v", f, err)
	}
	if b, err := parseReply(okReply([]byte("x"))); err != nil || string(b) != "x" {
		t.Fatalf("ok reply: %q, %v", b, err)
	}
	long := errors.New(strings.Repeat("é", maxErrText))
	if _, err := parseReply(errReply(long)); !errors.Is(err, ErrRemote) || strings.Contains(err.Error(), "unreadable") {
		t.Fatalf("long error reply: %v", err)
	}
	for _, r := range [][]byte{nil, {PeerMagic}, {1, 0}, {PeerMagic, 7}} {
		if _, err := parseReply(r); !errors.Is(err, ErrFrame) {
			t.Fatalf("parseReply(%x) = %v, want ErrFrame", r, err)
		}
	}
}

func FuzzParseFrame(f *testing.F) {
	m := paxos.Message{From: 2, To: 1, Entries: []paxos.Entry{{Kind: paxos.KindPropose, Ino: 9, Ballot: 3, Owner: 2}}}
	f.Add(appendPaxosFrame(nil, &m))
	f.Add(appendCallFrame(nil, 1, 2, 3, []byte("hello")))
	f.Add([]byte{PeerMagic, frameVersion, framePaxos, 1, 2})
	f.Fuzz(func(t *testing.T, b []byte) {
		fr, err := parseFrame(b)
		if err != nil {
			if !errors.Is(err, ErrFrame) {
				t.Fatalf("error %v does not wrap ErrFrame", err)
			}
			return
		}
		var re []byte
		switch fr.typ {
		case framePaxos:
			re = appendPaxosFrame(nil, &fr.msg)
		case frameCall:
			re = appendCallFrame(nil, fr.from, fr.to, fr.kind, fr.body)
		default:
			t.Fatalf("type %d accepted", fr.typ)
		}
		if !bytes.Equal(re, b) {
			t.Fatalf("re-encoding differs:\n%x\n%x", re, b)
		}
		parseReply(b) // must not panic either
	})
}

// TestBadFrames feeds a node malformed and misaddressed peer frames: each
// gets an error reply and none changes its state.
func TestBadFrames(t *testing.T) {
	c := newCluster(t, 3, nil)
	c.waitReady()
	n := c.node(1)
	called := false
	n.Peers().Handle(7, func(context.Context, ids.ServerID, []byte) []byte {
		called = true
		return nil
	})
	const ino = ids.Ino(900)
	propose := func(from, to ids.ServerID) []byte {
		m := paxos.Message{From: from, To: to, Entries: []paxos.Entry{{Kind: paxos.KindPropose, Ino: ino, Ballot: 1 << 40, Owner: from}}}
		return appendPaxosFrame(nil, &m)
	}
	good := propose(2, 1)
	inner := bytes.Clone(good)
	inner[frameHeader+1] = 3 // paxos message from server:3 in a frame from server:2
	badKind := bytes.Clone(good)
	badKind[frameHeader+7] = 99
	peer2, peer3, peer9 := PeerClientID(2), PeerClientID(3), PeerClientID(9)
	cases := []struct {
		name   string
		client ids.ClientID
		body   []byte
	}{
		{"magic only", peer2, []byte{PeerMagic}},
		{"short header", peer2, []byte{PeerMagic, frameVersion, framePaxos, 2}},
		{"version", peer2, append([]byte{PeerMagic, 2}, good[2:]...)},
		{"unknown type", peer2, append([]byte{PeerMagic, frameVersion, 9}, good[3:]...)},
		{"zero from", peer2, append([]byte{PeerMagic, frameVersion, framePaxos, 0}, good[4:]...)},
		{"to itself", peer2, append([]byte{PeerMagic, frameVersion, framePaxos, 2, 2}, good[5:]...)},
		{"truncated message", peer2, good[:len(good)-3]},
		{"trailing bytes", peer2, append(bytes.Clone(good), 0)},
		{"empty message", peer2, good[:frameHeader]},
		{"entry kind", peer2, badKind},
		{"inner from differs", peer2, inner},
		{"addressed to server:3", peer2, propose(2, 3)},
		{"not a peer client", ids.ClientID(12345), good},
		{"client of another peer", peer3, good},
		{"unknown server", peer9, propose(9, 1)},
		{"call without kind", peer2, appendCallFrame(nil, 2, 1, 7, nil)[:frameHeader]},
		{"call from another peer", peer3, appendCallFrame(nil, 2, 1, 7, nil)},
	}
	for i, tc := range cases {
		req := &transport.Request{Header: transport.Header{Client: tc.client, Session: 1, Seq: uint64(i + 1)}, Body: tc.body}
		_, err := parseReply(n.HandlePeer(context.Background(), req))
		if !errors.Is(err, ErrRemote) {
			t.Fatalf("%s: reply %v, want an error reply", tc.name, err)
		}
		t.Logf("%s: %v", tc.name, err)
	}
	// the same over the network, from a raw transport client
	raw := transport.NewClient(c.servers[1].addr, transport.ClientConfig{Token: testIdentity(t).TokenValue(), Key: testIdentity(t).PeerKey(peer2)})
	defer raw.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	reply, err := raw.Call(ctx, transport.Header{Client: peer2, Session: 1, Seq: 1}, inner)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := parseReply(reply); !errors.Is(err, ErrRemote) {
		t.Fatalf("over the network: %v, want an error reply", err)
	}
	// a token holder that is no server (it cannot claim a peer id: the
	// transport refuses it) sends a well-formed frame under its own id
	client := transport.NewClient(c.servers[1].addr, transport.ClientConfig{Token: testIdentity(t).TokenValue()})
	defer client.Close()
	if _, err := client.Call(ctx, transport.Header{Client: client.ID(), Session: 1, Seq: 1}, good); err != nil {
		t.Fatal(err)
	}
	impostor := transport.NewClient(c.servers[1].addr, transport.ClientConfig{Token: testIdentity(t).TokenValue(), ClientID: peer2})
	defer impostor.Close()
	if err := impostor.Dial(ctx); !errors.Is(err, transport.ErrAuth) {
		t.Fatalf("a client claiming a peer id: %v, want ErrAuth", err)
	}
	st := n.Stats()
	if want := uint64(len(cases) + 2); st.BadFrames != want || st.MsgsRecv != 0 || st.CallsRecv != 0 || called {
		t.Fatalf("stats %+v (want %d bad frames, nothing received), handler called %v", st, want, called)
	}
	accepted := func() bool {
		var ok bool
		n.query(func(now clock.Time) { _, _, ok = n.core.Accepted(now, ino) })
		return ok
	}
	if accepted() {
		t.Fatal("a rejected frame changed the acceptor")
	}
	// the well-formed frame does reach the acceptor
	req := &transport.Request{Header: transport.Header{Client: peer2, Session: 1, Seq: 100}, Body: good}
	if _, err := parseReply(n.HandlePeer(context.Background(), req)); err != nil {
		t.Fatal(err)
	}
	eventually(t, 2*time.Second, "good frame accepted", accepted)
}

func TestCall(t *testing.T) {
	c := newCluster(t, 3, nil)
	for id := ids.ServerID(1); id <= 3; id++ {
		c.node(id).Peers().Handle(7, func(_ context.Context, from ids.ServerID, body []byte) []byte {
			return fmt.Appendf(nil, "%v to %v: %s", from, id, body)
		})
	}
	p := c.node(1).Peers()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// calls need no quarantine: they are not PaxosLease
	got, err := p.Call(ctx, 3, 7, []byte("hi"))
	if err != nil || string(got) != "server:1 to server:3: hi" {
		t.Fatalf("Call = %q, %v", got, err)
	}
	if _, err := p.Call(ctx, 2, 8, nil); !errors.Is(err, ErrRemote) || !strings.Contains(err.Error(), ErrNoHandler.Error()) {
		t.Fatalf("unhandled kind: %v", err)
	}
	if _, err := p.Call(ctx, 9, 7, nil); !errors.Is(err, ErrUnknownPeer) {
		t.Fatalf("unknown peer: %v", err)
	}
	if _, err := p.Call(ctx, 1, 7, nil); !errors.Is(err, ErrUnknownPeer) {
		t.Fatalf("call to itself: %v", err)
	}
	if _, err := p.Call(ctx, 2, 7, make([]byte, transport.MaxBody)); !errors.Is(err, transport.ErrTooLarge) {
		t.Fatalf("too large: %v", err)
	}
	if st := c.node(3).Stats(); st.CallsRecv != 1 {
		t.Fatalf("server:3 stats %+v", st)
	}
	c.node(1).Close()
	if _, err := p.Call(ctx, 2, 7, nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("after Close: %v", err)
	}
}

func TestConfigValidate(t *testing.T) {
	ident := testIdentity(t)
	peers := map[ids.ServerID]string{1: "a:1", 2: "b:1", 3: "c:1"}
	ok := DefaultConfig(1, peers, t.TempDir(), ident)
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	for name, mod := range map[string]func(*Config){
		"zero id":        func(c *Config) { c.ID = 0 },
		"self missing":   func(c *Config) { c.ID = 4 },
		"no peers":       func(c *Config) { c.Peers = nil },
		"zero peer":      func(c *Config) { c.Peers = map[ids.ServerID]string{0: "z:1", 1: "a:1"} },
		"no address":     func(c *Config) { c.Peers = map[ids.ServerID]string{1: "a:1", 2: ""} },
		"shared address": func(c *Config) { c.Peers = map[ids.ServerID]string{1: "a:1", 2: "b:1", 3: "b:1"} },
		"no dir":         func(c *Config) { c.Dir = "" },
		"no identity":    func(c *Config) { c.Identity = nil },
		"no lease":       func(c *Config) { c.LeaseTime = 0 },
		"drift":          func(c *Config) { c.Drift = 1 },
		"quarantine":     func(c *Config) { c.Quarantine = c.LeaseTime },
		"max delay":      func(c *Config) { c.MaxDelay = c.LeaseTime },
		"idle":           func(c *Config) { c.IdleRelease = c.LeaseTime / 2 },
		"send timeout":   func(c *Config) { c.SendTimeout = 2 * c.LeaseTime },
		"backoff":        func(c *Config) { c.RetryBackoff = 2 * c.LeaseTime },
	} {
		c := ok
		mod(&c)
		if err := c.Validate(); !errors.Is(err, ErrConfig) {
			t.Errorf("%s: Validate = %v, want ErrConfig", name, err)
		}
	}
	single := DefaultConfig(5, map[ids.ServerID]string{5: ""}, t.TempDir(), ident)
	if err := single.Validate(); err != nil {
		t.Fatalf("one-server cluster: %v", err)
	}
}

func TestBootCounter(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	for want := uint16(1); want <= 3; want++ {
		b, err := nextBoot(dir)
		if err != nil || b != want {
			t.Fatalf("nextBoot = %d, %v; want %d", b, err, want)
		}
	}
	if b, err := readBoot(dir); err != nil || b != 3 {
		t.Fatalf("readBoot = %d, %v", b, err)
	}
	os.WriteFile(filepath.Join(dir, BootFile), []byte("garbage\n"), 0o644)
	if _, err := nextBoot(dir); err == nil || !strings.Contains(err.Error(), "corrupt") {
		t.Fatalf("corrupt counter: %v", err)
	}
	os.WriteFile(filepath.Join(dir, BootFile), fmt.Appendf(nil, "%d\n", paxos.MaxBoot), 0o644)
	if _, err := nextBoot(dir); !errors.Is(err, ErrBootExhausted) {
		t.Fatalf("exhausted counter: %v", err)
	}
}

// TestSingleServer: a one-server cluster acquires at once after its
// quarantine, without the network.
func TestSingleServer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := DefaultConfig(1, map[ids.ServerID]string{1: ""}, t.TempDir(), testIdentity(t))
		cfg.LeaseTime = testLease
		n, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { n.Close() })
		for n.Quarantined() {
			time.Sleep(5 * time.Millisecond)
		}
		ep, err := n.Acquire(context.Background(), 42)
		if err != nil {
			t.Fatal(err)
		}
		if got, ok := n.Owns(42); !ok || got != ep {
			t.Fatalf("Owns = %v, %v", got, ok)
		}
		time.Sleep(2 * testLease)
		if _, ok := n.Owns(42); !ok {
			t.Fatal("lease not renewed")
		}
	})
}

// FuzzParseReply: a reply parses back to what encodes it, and one that does
// not parse is ErrFrame.
func FuzzParseReply(f *testing.F) {
	f.Add(okReply(nil))
	f.Add(okReply([]byte{1, 0, 7, 0, 0, 0, 0, 0, 0, 0, 9}))
	f.Add(errReply(ErrClosed))
	f.Add([]byte{PeerMagic, 9})
	f.Fuzz(func(t *testing.T, b []byte) {
		var r peerReply
		if err := r.Parse(b); err != nil {
			if !errors.Is(err, ErrFrame) {
				t.Fatalf("error %v does not wrap ErrFrame", err)
			}
			return
		}
		if re := r.Append(nil); !bytes.Equal(re, b) {
			t.Fatalf("re-encoding differs:\n%x\n%x", re, b)
		}
	})
}
