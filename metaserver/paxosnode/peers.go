package paxosnode

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/leasefs/leasefs/internal/clock"
	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/lease/paxos"
	"github.com/leasefs/leasefs/transport"
)

// Bounds of the PaxosLease send path.
const (
	// maxFrameEntries splits a batch into frames well under
	// transport.MaxBody (26 bytes an entry).
	maxFrameEntries = 100_000
	// maxPendingEntries bounds what waits for one peer while a send to it
	// is in flight; beyond it entries are dropped (a lost PaxosLease
	// message is harmless).
	maxPendingEntries = 4 * maxFrameEntries
)

var (
	// ErrUnknownPeer: the server id is not one of the cluster's other
	// servers.
	ErrUnknownPeer = errors.New("paxosnode: unknown peer")
	// ErrNoHandler: the peer has no handler for the call's kind.
	ErrNoHandler = errors.New("paxosnode: no handler for call kind")
	// ErrClosed: the node is closed.
	ErrClosed = errors.New("paxosnode: closed")
)

// HandlerFunc serves one Call from another server. It is called
// concurrently; it owns body and the slice it returns.
type HandlerFunc func(ctx context.Context, from ids.ServerID, body []byte) []byte

// Peers is one server's links to the other servers of its cluster: a
// transport.Client per peer, dialled lazily with the cluster token under
// the peer ClientID (PeerClientID). It carries two kinds of traffic:
//
//   - PaxosLease messages, fire and forget: queued per peer and sent by that
//     peer's sender goroutine, one send at a time, each bounded by
//     Config.SendTimeout. What is queued while a send is in flight is
//     coalesced into the next frame (bounded; beyond the bound it is
//     dropped), so a slow or dead peer never blocks the node's goroutine.
//   - Call, a request/reply to a Handle'd kind, at most once per call (the
//     transport's reply cache), retried by the transport until ctx ends.
//
// Peers is safe for concurrent use. Get it from Node.Peers.
type Peers struct {
	self        ids.ServerID
	links       map[ids.ServerID]*link // fixed at construction
	log         *slog.Logger
	clk         clock.Clock
	sendTimeout time.Duration
	maxDelay    time.Duration
	st          *counters

	paxosSession, callSession ids.SessionID

	hmu      sync.RWMutex
	handlers [256]HandlerFunc

	ctx    context.Context // ends on close
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// peerConn is a connection to a peer: a *transport.Client, or in tests a
// link of an in-memory network (Config.dial).
type peerConn interface {
	Call(ctx context.Context, h transport.Header, body []byte) ([]byte, error)
	Close() error
}

type link struct {
	id   ids.ServerID
	addr string
	c    peerConn // calls: replication, recovery, hand-overs
	// paxos carries PaxosLease messages on a connection of their own, so
	// that bulk replication filling the calls' flow-control window never
	// holds back a renewal (its lease would lapse).
	paxos    peerConn
	wake     chan struct{} // capacity 1
	paxosSeq atomic.Uint64
	callSeq  atomic.Uint64

	mu      sync.Mutex
	pending []paxos.Entry
	since   clock.Time // when the oldest pending entry was queued
	sending bool       // the sender holds a batch
}

func newPeers(cfg *Config, boot uint16, st *counters) *Peers {
	ctx, cancel := context.WithCancel(context.Background())
	p := &Peers{
		self:        cfg.ID,
		links:       map[ids.ServerID]*link{},
		log:         cfg.Logger,
		clk:         cfg.Clock,
		sendTimeout: cfg.SendTimeout,
		maxDelay:    cfg.MaxDelay,
		st:          st,
		// one pair of reply-cache sessions per boot: a restarted server
		// starts its seqs afresh, which the peers' reply caches must not
		// mistake for retries of the last boot's requests
		paxosSession: ids.SessionID(boot) << 1,
		callSession:  ids.SessionID(boot)<<1 | 1,
		ctx:          ctx,
		cancel:       cancel,
	}
	for _, id := range cfg.serverIDs() {
		if id == cfg.ID {
			continue
		}
		addr := cfg.Peers[id]
		l := &link{id: id, addr: addr, wake: make(chan struct{}, 1)}
		ccfg := transport.ClientConfig{
			Token:       cfg.Identity.TokenValue(),
			Key:         cfg.Identity.PeerKey(PeerClientID(cfg.ID)),
			Hostname:    fmt.Sprintf("leasefs-server-%d", cfg.ID),
			Logger:      cfg.Logger,
			Faults:      cfg.Faults,
			DialTimeout: max(cfg.SendTimeout, time.Second),
		}
		dial := cfg.dial
		if dial == nil {
			dial = func(_ ids.ServerID, addr string, ccfg transport.ClientConfig) peerConn {
				return transport.NewClient(addr, ccfg)
			}
		}
		l.c, l.paxos = dial(cfg.ID, addr, ccfg), dial(cfg.ID, addr, ccfg)
		p.links[id] = l
		p.wg.Add(1)
		go p.sendLoop(l)
	}
	return p
}

// close stops the senders and closes the clients; calls in progress fail.
func (p *Peers) close() {
	p.cancel()
	p.wg.Wait()
	for _, l := range p.links {
		l.c.Close()
		l.paxos.Close()
	}
}

// Handle registers fn for calls of kind (replacing any earlier one). Calls
// of a kind without a handler get ErrNoHandler.
func (p *Peers) Handle(kind byte, fn HandlerFunc) {
	p.hmu.Lock()
	p.handlers[kind] = fn
	p.hmu.Unlock()
}

func (p *Peers) handler(kind byte) HandlerFunc {
	p.hmu.RLock()
	defer p.hmu.RUnlock()
	return p.handlers[kind]
}

// Call sends body to server to's handler for kind and returns its reply.
// The transport retries until ctx ends and the peer runs the handler at
// most once. Errors: ErrUnknownPeer, transport errors (wrapped), ErrRemote
// with the peer's message (no handler, bad frame), ErrClosed.
func (p *Peers) Call(ctx context.Context, to ids.ServerID, kind byte, body []byte) ([]byte, error) {
	l := p.links[to]
	if l == nil {
		return nil, fmt.Errorf("%w: %v", ErrUnknownPeer, to)
	}
	if p.ctx.Err() != nil {
		return nil, ErrClosed
	}
	f := appendCallFrame(make([]byte, 0, frameHeader+1+len(body)), p.self, to, kind, body)
	if len(f) > transport.MaxBody {
		return nil, fmt.Errorf("paxosnode: call %v kind %d: %w: %d bytes", to, kind, transport.ErrTooLarge, len(f))
	}
	h := transport.Header{Client: PeerClientID(p.self), Session: p.callSession, Seq: l.callSeq.Add(1)}
	p.st.callsSent.Add(1)
	reply, err := l.c.Call(ctx, h, f)
	if err != nil {
		if errors.Is(err, transport.ErrClosed) {
			err = fmt.Errorf("%w: %w", ErrClosed, err)
		}
		return nil, fmt.Errorf("paxosnode: call %v kind %d: %w", to, kind, err)
	}
	body, err = parseReply(reply)
	if err != nil {
		return nil, fmt.Errorf("paxosnode: call %v kind %d: %w", to, kind, err)
	}
	return body, nil
}

// sendPaxos queues m for its peer without blocking.
func (p *Peers) sendPaxos(m paxos.Message) {
	l := p.links[m.To]
	if l == nil {
		// the core only addresses configured peers
		panic(fmt.Sprintf("paxosnode: paxos message to unknown peer %v", m.To))
	}
	l.mu.Lock()
	if len(l.pending)+len(m.Entries) > maxPendingEntries {
		l.mu.Unlock()
		p.st.sendDropped.Add(uint64(len(m.Entries)))
		return
	}
	if len(l.pending) == 0 {
		l.since = p.clk.Now()
	}
	l.pending = append(l.pending, m.Entries...)
	l.mu.Unlock()
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

func (p *Peers) sendLoop(l *link) {
	defer p.wg.Done()
	var buf []byte
	for {
		select {
		case <-p.ctx.Done():
			return
		case <-l.wake:
		}
		l.mu.Lock()
		es, since := l.pending, l.since
		l.pending, l.sending = nil, true
		l.mu.Unlock()
		es = p.dropStaleLearns(es, since)
		for len(es) > 0 && p.ctx.Err() == nil {
			n := min(len(es), maxFrameEntries)
			m := paxos.Message{From: p.self, To: l.id, Entries: es[:n]}
			es = es[n:]
			buf = appendPaxosFrame(buf[:0], &m)
			p.sendFrame(l, buf, n)
		}
		l.mu.Lock()
		l.sending = false
		l.mu.Unlock()
	}
}

// flush waits until every queued PaxosLease message has been sent (or
// given up on), or ctx ends.
func (p *Peers) flush(ctx context.Context) error {
	for _, l := range p.links {
		for {
			l.mu.Lock()
			idle := len(l.pending) == 0 && !l.sending
			l.mu.Unlock()
			if idle {
				break
			}
			if err := clock.Sleep(ctx, p.clk, time.Millisecond); err != nil {
				return fmt.Errorf("paxosnode: flush to %v: %w", l.id, err)
			}
		}
	}
	return nil
}

// dropStaleLearns removes Learn entries that waited in the queue for more
// than half of MaxDelay (the rest is left for the transit): a learner
// re-anchors the owner's remaining time on arrival assuming delivery within
// MaxDelay (redirects only; safety never depends on it).
func (p *Peers) dropStaleLearns(es []paxos.Entry, since clock.Time) []paxos.Entry {
	if p.clk.Now().Sub(since) <= p.maxDelay/2 {
		return es
	}
	out := es[:0]
	for _, e := range es {
		if e.Kind != paxos.KindLearn {
			out = append(out, e)
		}
	}
	p.st.sendDropped.Add(uint64(len(es) - len(out)))
	return out
}

func (p *Peers) sendFrame(l *link, f []byte, entries int) {
	ctx, cancel := context.WithTimeout(p.ctx, p.sendTimeout)
	defer cancel()
	h := transport.Header{Client: PeerClientID(p.self), Session: p.paxosSession, Seq: l.paxosSeq.Add(1)}
	reply, err := l.paxos.Call(ctx, h, f)
	if err == nil {
		_, err = parseReply(reply)
	}
	if err != nil {
		p.st.sendErrors.Add(1)
		if p.ctx.Err() == nil {
			p.log.Debug("paxosnode: paxos send failed", "peer", l.id, "addr", l.addr, "entries", entries, "err", err)
		}
		return
	}
	p.st.msgsSent.Add(1)
	p.st.entriesSent.Add(uint64(entries))
	p.st.bytesSent.Add(uint64(len(f)))
}
