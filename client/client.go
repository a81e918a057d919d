// Package client is a mount's session with the leasefs servers: blocking,
// context-taking calls that fs/ turns FUSE operations into. It numbers
// requests, keeps the session and the client lease, and recovers after a
// NACK.
package client

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/transport"
	"github.com/leasefs/leasefs/wire"
)

// Config configures a client.
type Config struct {
	Server      string // HOST:PORT
	Token       transport.Token
	Logger      *slog.Logger
	Faults      *transport.Faults
	DialTimeout time.Duration
	// SoftTimeout, when non-zero, fails operations that cannot reach the
	// server for this long with EIO (like NFS soft); zero blocks (hard).
	SoftTimeout time.Duration
}

// DefaultConfig returns a hard-mount configuration.
func DefaultConfig() Config {
	return Config{DialTimeout: 5 * time.Second, Logger: slog.Default()}
}

// Validate checks the configuration.
func (c *Config) Validate() error {
	if c.Server == "" {
		return errors.New("client: no server address")
	}
	if c.DialTimeout <= 0 {
		return errors.New("client: dial timeout must be positive")
	}
	if c.SoftTimeout < 0 {
		return errors.New("client: soft timeout must not be negative")
	}
	return nil
}

// ErrTimeout is returned by a soft mount's operation that could not reach the
// server within SoftTimeout.
var ErrTimeout = errors.New("client: server unreachable (soft timeout)")

// Counters are the client's lease and request counters.
type Counters struct {
	Requests, ExplicitRenewals, NacksReceived, Recoveries atomic.Int64
	ReclaimsOK, ReclaimsRefused, DataLost                 atomic.Int64
}

// Client is one mount's connection to leasefs.
type Client struct {
	cfg Config
	log *slog.Logger
	id  ids.ClientID
	tr  *transport.Client

	mu      sync.Mutex
	session wire.Session
	seq     uint64

	Counters Counters
}

// New connects to the server, authenticates and opens a session. It fails
// within the dial timeout with a clear error when the server is unreachable
// or refuses the token.
func New(ctx context.Context, cfg Config) (*Client, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	var b [8]byte
	_, _ = rand.Read(b[:])
	host, _ := os.Hostname()
	c := &Client{cfg: cfg, log: cfg.Logger, id: ids.ClientID(binary.LittleEndian.Uint64(b[:]))}
	c.tr = transport.NewClient(cfg.Server, transport.ClientConfig{
		Token: cfg.Token, ClientID: c.id, Hostname: host, Logger: cfg.Logger,
		Faults: cfg.Faults, Callback: c.onCallback, DialTimeout: cfg.DialTimeout,
	})
	dctx, cancel := context.WithTimeout(ctx, cfg.DialTimeout)
	defer cancel()
	if err := c.tr.Dial(dctx); err != nil {
		c.tr.Close()
		return nil, fmt.Errorf("client: connect to %s: %w", cfg.Server, err)
	}
	if err := c.openSession(dctx); err != nil {
		c.tr.Close()
		return nil, fmt.Errorf("client: open session with %s: %w", cfg.Server, err)
	}
	return c, nil
}

// ID returns the client id.
func (c *Client) ID() ids.ClientID { return c.id }

// Session returns the current session as the server announced it.
func (c *Client) Session() wire.Session {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.session
}

func (c *Client) openSession(ctx context.Context) error {
	host, _ := os.Hostname()
	body := (&wire.Request{Op: wire.OpOpenSession, Target: host}).Append(nil)
	raw, err := c.tr.Call(ctx, transport.Header{Client: c.id, Seq: 0}, body)
	if err != nil {
		return err
	}
	rep, err := wire.ParseReply(raw)
	if err != nil {
		return err
	}
	if err := rep.Err(); err != nil {
		return err
	}
	if rep.Session == nil {
		return errors.New("client: server sent no session")
	}
	c.mu.Lock()
	c.session = *rep.Session
	c.seq = 0
	c.mu.Unlock()
	c.log.Info("session opened", "server", c.cfg.Server, "session", rep.Session.ID,
		"client_lease", time.Duration(rep.Session.Tau), "clock_drift", rep.Session.Delta)
	return nil
}

// Call sends req and returns the server's reply. A reply with an error code
// is returned as an error carrying that code (wire.CodeOf).
func (c *Client) Call(ctx context.Context, req *wire.Request) (*wire.Reply, error) {
	body := req.Append(nil)
	for attempt := 0; ; attempt++ {
		c.mu.Lock()
		c.seq++
		h := transport.Header{Client: c.id, Session: c.session.ID, Seq: c.seq}
		c.mu.Unlock()
		c.Counters.Requests.Add(1)
		cctx, cancel := ctx, context.CancelFunc(func() {})
		if c.cfg.SoftTimeout > 0 {
			cctx, cancel = context.WithTimeout(ctx, c.cfg.SoftTimeout)
		}
		raw, err := c.tr.Call(cctx, h, body)
		cancel()
		if err != nil {
			if ctx.Err() == nil && c.cfg.SoftTimeout > 0 && errors.Is(err, context.DeadlineExceeded) {
				return nil, ErrTimeout
			}
			return nil, err
		}
		rep, err := wire.ParseReply(raw)
		if err != nil {
			return nil, err
		}
		if rep.Code == wire.CodeNack && attempt < 3 {
			c.Counters.NacksReceived.Add(1)
			c.log.Warn("NACK received: the server does not know this session; opening a new one", "session", h.Session)
			if err := c.openSession(ctx); err != nil {
				return nil, err
			}
			c.Counters.Recoveries.Add(1)
			continue
		}
		return rep, rep.Err()
	}
}

// onCallback answers server-initiated messages.
func (c *Client) onCallback(ctx context.Context, body []byte) []byte {
	cb, err := wire.ParseCallback(body)
	if err != nil {
		return wire.ErrorReply(wire.Errf(wire.CodeBadMessage, "%v", err)).Append(nil)
	}
	_ = cb
	return (&wire.Reply{}).Append(nil)
}

// Close ends the session cleanly and closes the connection.
func (c *Client) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_, _ = c.Call(ctx, &wire.Request{Op: wire.OpGoodbye})
	return c.tr.Close()
}
