package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/internal/mountsock"
	"github.com/leasefs/leasefs/transport"
	"github.com/leasefs/leasefs/wire"
)

// mountIDs reads a mount's client and session ids from its status socket.
func mountIDs(t *testing.T, m *mount) (ids.ClientID, ids.SessionID) {
	t.Helper()
	rep, err := mountsock.Client(m.dir).Get("http://mount/status")
	must(t, err)
	defer rep.Body.Close()
	var st struct{ Client, Session string }
	must(t, json.NewDecoder(rep.Body).Decode(&st))
	c, err := strconv.ParseUint(strings.TrimPrefix(st.Client, "client:"), 16, 64)
	must(t, err)
	sess, err := strconv.ParseUint(strings.TrimPrefix(st.Session, "session:"), 10, 64)
	must(t, err)
	return ids.ClientID(c), ids.SessionID(sess)
}

// TestImpostorCannotAckRevocations: a token holder
// that learnt a mount's client id (the admin endpoint lists them) connects
// under it and acknowledges every revocation without flushing anything.
// The real mount must still get its revocations: it reads what another
// mount wrote at once. Nor can the impostor use the mount's session.
func TestImpostorCannotAckRevocations(t *testing.T) {
	s := startServer(t)
	a, b := startMount(t, s), startMount(t, s)
	pa, pb := filepath.Join(a.dir, "f"), filepath.Join(b.dir, "f")
	must(t, os.WriteFile(pa, []byte("v0"), 0o644))
	if got, err := os.ReadFile(pa); err != nil || string(got) != "v0" {
		t.Fatalf("A reads %q %v", got, err)
	}
	victim, session := mountIDs(t, a)
	tok, err := transport.ReadTokenFile(s.tokenFile)
	must(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	var acked atomic.Int32
	impostor := transport.NewClient(s.addr, transport.ClientConfig{Token: tok, ClientID: victim,
		Callback: func(context.Context, []byte) []byte {
			acked.Add(1)
			return (&wire.Reply{}).Append(nil) // "flushed", without flushing
		}})
	defer impostor.Close()
	if err := impostor.Dial(ctx); err == nil {
		t.Errorf("a token holder connected under mount A's id %v", victim)
	} else if !errors.Is(err, transport.ErrAuth) {
		t.Errorf("impostor's dial: %v, want ErrAuth", err)
	}

	// A token holder under its own id cannot use A's session, nor claim
	// A's id in a request's header.
	other := transport.NewClient(s.addr, transport.ClientConfig{Token: tok})
	defer other.Close()
	getattr := (&wire.Request{Op: wire.OpGetAttr, Ino: ids.RootIno}).Append(nil)
	raw, err := other.Call(ctx, transport.Header{Client: other.ID(), Session: session, Seq: 1}, getattr)
	must(t, err)
	if rep, err := wire.ParseReply(raw); err != nil || rep.Code != wire.CodeNack {
		t.Errorf("a request in mount A's session from another client: %v %v, want a NACK", rep, err)
	}
	if _, err := other.Call(ctx, transport.Header{Client: victim, Session: session, Seq: 2}, getattr); !errors.Is(err, transport.ErrProtocol) {
		t.Errorf("a request claiming mount A's id: %v, want ErrProtocol", err)
	}

	// Read-after-write from B to A, each time at once.
	for i := 1; i <= 10; i++ {
		want := []byte(fmt.Sprintf("v%d from B", i))
		must(t, os.WriteFile(pb, want, 0o644))
		got, err := os.ReadFile(pa)
		must(t, err)
		if !bytes.Equal(got, want) {
			t.Fatalf("write %d: A reads %q after B wrote %q (revocations acknowledged by %d impostor callbacks)",
				i, got, want, acked.Load())
		}
	}
	if n := acked.Load(); n != 0 {
		t.Fatalf("the impostor received %d of mount A's revocations", n)
	}
}

// TestSilentMountSwept: a mount silent for longer
// than τ(1+δ) and the sweep's margin (stopped here) loses its session to
// the server's sweep: its locks go without a revocation, so another mount
// writes its file at once; when it resumes it gets a NACK, recovers, and
// reads the other mount's data, not what it had cached.
func TestSilentMountSwept(t *testing.T) {
	const tau = 500 * time.Millisecond // silent after 2.5 s
	s := startServer(t, "--client-lease", tau.String(), "--delivery-timeout", (tau / 4).String())
	a, b := startMount(t, s), startMount(t, s)
	fa, fb := filepath.Join(a.dir, "f"), filepath.Join(b.dir, "f")
	writeSync(t, fa, []byte("from A\n"))
	wantFile(t, fa, []byte("from A\n")) // cached on A

	a.signal(syscall.SIGSTOP)
	waitStopped(t, a.proc)
	waitFor(t, 20*time.Second, "the server to drop A's session", func() bool {
		return strings.Contains(s.output(), "session of a silent client dropped")
	})
	// A's locks are gone: B's write needs no revocation of A (stopped, it
	// could not answer one), so it is not held up until A is failed.
	writeSync(t, fb, []byte("from B\n"))
	if strings.Contains(s.output(), "client failing") {
		t.Errorf("the server had to fail A for B's write:\n%s", tail(s.output(), 3000))
	}
	a.signal(syscall.SIGCONT)
	wantFile(t, fa, []byte("from B\n"))
	writeSync(t, filepath.Join(a.dir, "g"), []byte("A after recovery\n"))
	wantFile(t, filepath.Join(b.dir, "g"), []byte("A after recovery\n"))
	if out := a.output(); !strings.Contains(out, "NACK received") || !strings.Contains(out, "recovery done") {
		t.Errorf("A's log shows no NACK and recovery:\n%s", tail(out, 3000))
	}
}
