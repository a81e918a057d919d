package client

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/transport"
	"github.com/leasefs/leasefs/wire"
)

// servers is the cluster's servers as this client uses them: one at a time,
// the next one when the current one stops answering or says it cannot
// serve (wire.CodeUnavailable). Every server of a cluster shares one token.
type servers struct {
	mu      sync.Mutex
	addrs   []string
	cur     int
	tr      *transport.Client
	sinceOK int // failovers since a server last answered
}

// errSendAgain: send the request again with a new header, because its
// server was given up (a new server NACKs the old session, and the client
// recovers there first) or could not serve it yet.
var errSendAgain = errors.New("client: send again")

// newTransport makes the transport client for addr.
func (c *Client) newTransport(addr string) *transport.Client {
	host, _ := os.Hostname()
	return transport.NewClient(addr, transport.ClientConfig{
		Token: c.cfg.Token, ClientID: c.id, Hostname: host, Logger: c.cfg.Logger,
		Faults: c.cfg.Faults, Callback: c.onCallback, DialTimeout: c.cfg.DialTimeout,
	})
}

// connect dials the servers in order until one answers.
func (c *Client) connect(ctx context.Context) error {
	var errs []error
	for i, addr := range c.cfg.Servers {
		tr := c.newTransport(addr)
		dctx, cancel := context.WithTimeout(ctx, c.cfg.DialTimeout)
		err := tr.Dial(dctx)
		cancel()
		if err == nil {
			c.srv.mu.Lock()
			c.srv.addrs, c.srv.cur, c.srv.tr = c.cfg.Servers, i, tr
			c.srv.mu.Unlock()
			return nil
		}
		tr.Close()
		errs = append(errs, fmt.Errorf("%s: %w", addr, err))
	}
	return errors.Join(errs...)
}

// transport returns the current server's transport client and address.
func (c *Client) transport() (*transport.Client, string) {
	c.srv.mu.Lock()
	defer c.srv.mu.Unlock()
	return c.srv.tr, c.srv.addrs[c.srv.cur]
}

// Server returns the address of the server the client uses now.
func (c *Client) Server() string {
	_, addr := c.transport()
	return addr
}

func (c *Client) clustered() bool { return len(c.cfg.Servers) > 1 }

// failover moves to the next server, unless another request already moved
// away from `from`. After a whole round without an answer it pauses, so a
// cluster with no server able to serve is not hammered.
func (c *Client) failover(from *transport.Client, why string) {
	c.srv.mu.Lock()
	if c.srv.tr != from {
		c.srv.mu.Unlock()
		return
	}
	old := c.srv.addrs[c.srv.cur]
	c.srv.cur = (c.srv.cur + 1) % len(c.srv.addrs)
	c.srv.tr = c.newTransport(c.srv.addrs[c.srv.cur])
	c.srv.sinceOK++
	pause := c.srv.sinceOK%len(c.srv.addrs) == 0
	next := c.srv.addrs[c.srv.cur]
	c.srv.mu.Unlock()
	from.Close()
	c.log.Warn("failing over to another server", "from", old, "to", next, "why", why)
	if pause {
		time.Sleep(200 * time.Millisecond)
	}
}

// answered notes that the current server answered.
func (c *Client) answered() {
	c.srv.mu.Lock()
	c.srv.sinceOK = 0
	c.srv.mu.Unlock()
}

// alive asks the server tr whether it still answers at all (a renewal, which
// waits for nothing): a request may rightly wait long for a lock.
func (c *Client) alive(tr *transport.Client, session ids.SessionID) bool {
	c.mu.Lock()
	c.seq++
	h := transport.Header{Client: c.id, Session: session, Seq: c.seq}
	c.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), c.cfg.FailoverTimeout)
	defer cancel()
	_, err := tr.Call(ctx, h, (&wire.Request{Op: wire.OpRenew}).Append(nil))
	return err == nil
}
