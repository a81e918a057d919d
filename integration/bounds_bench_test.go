package integration

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	le "encoding/binary"
	"fmt"
	"math/big"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/transport"
	"github.com/leasefs/leasefs/wire"
)

// BenchmarkServerBounds prints what a server process holds (VmRSS, its
// peak, and RssAnon: heap and stacks) for what peers can make it keep:
// sessions of clients that then say nothing, and a
// flood of connections that never authenticate (silent, a wrong token, a
// hello announcing 4 MiB). The transport's and the metadata server's tests
// assert the bounds on what they count; this shows what the process pays.
// (Streams announcing big bodies: go test ./transport -bench Announced.)
//
//	go test ./integration -run '^$' -bench ServerBounds -benchtime 1x -v
func BenchmarkServerBounds(b *testing.B) {
	b.Run("idle-sessions", func(b *testing.B) {
		const sessions = 1000
		for range b.N {
			s := startServer(b)
			tok, err := transport.ReadTokenFile(s.tokenFile)
			must(b, err)
			before := rssOf("server", s.proc)
			clients := make([]*benchClient, sessions)
			each := func(fn func(*benchClient) error) {
				var wg sync.WaitGroup
				sem := make(chan struct{}, 16)
				var failed atomic.Int32
				for i := range clients {
					wg.Go(func() {
						sem <- struct{}{}
						defer func() { <-sem }()
						if err := fn(clients[i]); err != nil {
							failed.Add(1)
						}
					})
				}
				wg.Wait()
				if n := failed.Load(); n > 0 {
					b.Fatalf("%d clients failed", n)
				}
			}
			for i := range clients {
				clients[i] = newBenchClient(s.addr, tok)
				b.Cleanup(func() { clients[i].tc.Close() })
			}
			each(func(c *benchClient) error {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				return c.tc.Dial(ctx)
			})
			connected := rssOf("server", s.proc)
			each(func(c *benchClient) error { return c.session(20) })
			opened := rssOf("server", s.proc)
			// the clients vanish without a goodbye; the sweep drops their
			// sessions once silent (10 s with the defaults)
			each(func(c *benchClient) error { return c.tc.Close() })
			waitFor(b, 60*time.Second, "the sweep", func() bool { return countLines(s.output(), "session of a silent client dropped") == sessions })
			swept := rssOf("server", s.proc)
			b.Logf("%d clients: connected, then a session of 20 requests each, then gone without a goodbye:\n  before     %s\n  connected  %s\n  sessions   %s\n  swept      %s",
				sessions, before, connected, opened, swept)
		}
	})
	b.Run("unauthenticated", func(b *testing.B) {
		const attempts = 10_000
		for range b.N {
			s := startServer(b)
			tok, err := transport.ReadTokenFile(s.tokenFile)
			must(b, err)
			tok.Secret[0] ^= 1 // the attackers do not have the token
			before := rssOf("server", s.proc)
			var peak atomic.Int64
			stop := make(chan struct{})
			sampled := make(chan struct{})
			go func() { // the server's RSS while the attempts go on
				defer close(sampled)
				for {
					if r, _, _ := vmRSS(s.proc.cmd.Process.Pid); int64(r) > peak.Load() {
						peak.Store(int64(r))
					}
					select {
					case <-stop:
						return
					case <-time.After(50 * time.Millisecond):
					}
				}
			}()
			var wg sync.WaitGroup
			var next, done atomic.Int64
			start := time.Now()
			for range 32 {
				wg.Go(func() {
					for i := next.Add(1); i <= attempts; i = next.Add(1) {
						if unauthenticated(s.addr, tok, int(i%3)) == nil {
							done.Add(1)
						}
					}
				})
			}
			wg.Wait()
			took := time.Since(start)
			close(stop)
			<-sampled
			after := rssOf("server", s.proc)
			b.Logf("%d connection attempts without the secret (%d handshakes completed, in %v): a third silent, a third with a wrong token, a third announcing a 4 MiB hello:\n  before  %s\n  peak    %d KiB during\n  after   %s",
				attempts, done.Load(), took.Round(time.Millisecond), before, peak.Load(), after)
		}
	})
}

// benchClient is a client that sends one request at a time, and tells
// the server so (its oldest seq in flight), as a mount does.
type benchClient struct {
	tc  *transport.Client
	seq atomic.Uint64
}

func newBenchClient(addr string, tok transport.Token) *benchClient {
	c := &benchClient{}
	c.tc = transport.NewClient(addr, transport.ClientConfig{Token: tok, Oldest: c.seq.Load})
	return c
}

// session opens a session and sends n requests in it.
func (c *benchClient) session(n int) error {
	tc := c.tc
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	call := func(h transport.Header, r *wire.Request) (*wire.Reply, error) {
		c.seq.Store(h.Seq)
		raw, err := tc.Call(ctx, h, r.Append(nil))
		if err != nil {
			return nil, err
		}
		return wire.ParseReply(raw)
	}
	rep, err := call(transport.Header{Client: tc.ID(), Seq: 1}, &wire.Request{Op: wire.OpOpenSession, Target: "bench"})
	if err != nil {
		return err
	}
	if rep.Session == nil {
		return rep.Err()
	}
	for i := range n {
		h := transport.Header{Client: tc.ID(), Session: rep.Session.ID, Seq: uint64(i + 2)}
		if _, err := call(h, &wire.Request{Op: wire.OpGetAttr, Ino: ids.RootIno}); err != nil {
			return err
		}
	}
	return nil
}

// unauthenticated makes one connection that does not prove the secret:
// kind 0 says nothing, 1 sends a hello with a wrong proof (NewClient with
// a wrong token), 2 announces a hello of 4 MiB and sends 1 KiB of it.
func unauthenticated(addr string, tok transport.Token, kind int) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if kind == 1 {
		tc := transport.NewClient(addr, transport.ClientConfig{Token: tok})
		defer tc.Close()
		return nil2(tc.Dial(ctx))
	}
	cert, err := selfSigned()
	if err != nil {
		return err
	}
	qc, err := quic.DialAddr(ctx, addr, &tls.Config{InsecureSkipVerify: true, ServerName: "leasefs",
		NextProtos: []string{"leasefs/1"}, MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{cert}}, nil)
	if err != nil {
		return err
	}
	defer qc.CloseWithError(0, "")
	if kind == 0 {
		return nil
	}
	st, err := qc.OpenStreamSync(ctx)
	if err != nil {
		return err
	}
	head := make([]byte, 38, 38+1024)
	le.LittleEndian.PutUint32(head, uint32(34+transport.MaxBody))
	head[4], head[5] = 2, 1 // frame version 2, hello
	_, err = st.Write(append(head, make([]byte, 1024)...))
	return err
}

// selfSigned makes a client certificate, as anyone can.
func selfSigned() (tls.Certificate, error) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, pub, priv)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: priv}, err
}

// nil2 counts a refusal as a completed attempt.
func nil2(err error) error {
	if err == nil {
		return fmt.Errorf("a wrong token was accepted")
	}
	return nil
}

func countLines(s, sub string) int { return strings.Count(s, sub) }
