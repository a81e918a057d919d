package client

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/leasefs/leasefs/cache"
	"github.com/leasefs/leasefs/internal/clock"
	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/lease"
	"github.com/leasefs/leasefs/transport"
	"github.com/leasefs/leasefs/wire"
)

// Config configures a client.
type Config struct {
	// Servers are the cluster's servers (HOST:PORT), any subset; the
	// client uses one at a time and fails over to the next.
	Servers []string
	// Mountpoint is where this client is mounted, which it tells the
	// servers for their clients list (empty: not a mount).
	Mountpoint  string
	Token       transport.Token
	Logger      *slog.Logger
	Faults      *transport.Faults
	DialTimeout time.Duration
	// FailoverTimeout: with several servers, a request unanswered this long
	// makes the client check that its server is alive (a renewal answered
	// within the same time), and fail over if not.
	FailoverTimeout time.Duration
	// SoftTimeout, when non-zero, fails operations that cannot reach the
	// server for this long with EIO (like NFS soft); zero blocks (hard).
	SoftTimeout time.Duration
	// CacheInodes bounds the inodes whose locks and attributes are cached.
	CacheInodes int
	// CacheBytes bounds the file data cached under locks (0: none).
	CacheBytes int64
	// Clock is what the client reads the time on and sets its timers on
	// (the leases' times, the renewal loops); nil is clock.Real.
	Clock clock.Clock
	// BlocksRemote makes the client reach block stores through their
	// servers' endpoints even where it could open the directory itself.
	BlocksRemote bool
	// ObserveRequest, if set, is told of every answered request: its
	// operation, the reply's code and the round trip (mount metrics).
	ObserveRequest func(op wire.Op, code wire.Code, d time.Duration)
}

// DefaultConfig returns a hard-mount configuration.
func DefaultConfig() Config {
	return Config{DialTimeout: 5 * time.Second, FailoverTimeout: 500 * time.Millisecond, Logger: slog.Default(), CacheInodes: 100_000, CacheBytes: 512 << 20}
}

// Validate checks the configuration.
func (c *Config) Validate() error {
	switch {
	case len(c.Servers) == 0 || slices.Contains(c.Servers, ""):
		return errors.New("client: no server address")
	case c.FailoverTimeout <= 0:
		return errors.New("client: failover timeout must be positive")
	case c.DialTimeout <= 0:
		return errors.New("client: dial timeout must be positive")
	case c.SoftTimeout < 0:
		return errors.New("client: soft timeout must not be negative")
	case c.CacheInodes <= 0:
		return errors.New("client: cache size must be positive")
	case c.CacheBytes < 0:
		return errors.New("client: data cache size must not be negative")
	}
	return nil
}

// ErrTimeout is returned by a soft mount's operation that could not reach the
// server within SoftTimeout.
var ErrTimeout = errors.New("client: server unreachable (soft timeout)")

// Counters are the client's request and lease counters.
type Counters struct {
	Requests, NacksReceived, Recoveries, Revocations atomic.Int64
	ReclaimsOK, ReclaimsRefused, DataLost            atomic.Int64
	Prefetches                                       atomic.Int64 // readahead requests sent
	Redirects                                        atomic.Int64 // redirects to an inode's owner followed
	RemovedBehind                                    atomic.Int64 // removals sent behind the caller
	CreatedBehind                                    atomic.Int64 // creates sent behind the caller
	CreatedWithData                                  atomic.Int64 // of them, sent with the file's data (flushWithCreate)
	BehindBatches                                    atomic.Int64 // requests that carried several of them (wire.OpBatch)
	LocksEvicted                                     atomic.Int64 // locks the cache dropped for space, given back
	BlocksBad                                        atomic.Int64 // blocks read missing or corrupt (EIO)
	BlocksPut                                        atomic.Int64 // blocks this mount wrote to the block store
	ReadBytes                                        atomic.Int64 // file data fetched (servers, block store)
	WrittenBytes                                     atomic.Int64 // file data sent (writes, blocks put)
}

// Client is one mount's connection to leasefs.
type Client struct {
	cfg Config
	log *slog.Logger
	id  ids.ClientID
	key *transport.ClientKey // proves id to every server (servers.go)
	srv servers
	clk clock.Clock
	// caps are the block capabilities the owners signed (blocks.go)
	caps capCache
	// noSpaceUntil (a clock.Time): the server refused a change for want
	// of space, lately; until then changes go to the server as they are
	// made (spaceShort).
	noSpaceUntil atomic.Int64
	// inFlight numbers the client's changes (wire.Request.ReqID: a
	// resend after a failover must not apply a change twice) and knows
	// which are unanswered.
	inFlight changesInFlight

	// hooks are the kernel side's (SetHooks): set while revocations may
	// already come in, hence atomic.
	hooks atomic.Pointer[Hooks]

	mu  sync.Mutex
	seq uint64
	// seqs: the seqs chosen and not done with (servers.go)
	seqs  seqsInFlight
	cache *cache.Cache
	// cacheGen counts cache drops (from 1): changes buffered in an earlier
	// generation were made under locks since lost (dirtyFile.gen).
	cacheGen uint64
	// renewMargin is how long before a lease lapses the client renews it
	// (τ/2 of the first session; every server of a cluster has the same τ).
	renewMargin time.Duration
	// kernelCaches: the kernel may hold names or attributes given with a
	// TTL (AttrTTL) since renewLoop last dropped them.
	kernelCaches bool

	// the parts with state of their own (parts.go)
	wb        writeBacker
	behind    behindSender
	ra        readAheader
	maps      mappedFiles // the kernel's pages of mapped files (mapped.go)
	rel       releases    // evicted locks to give back (evict.go)
	recoverMu ctxMutex    // one recovery at a time
	stop      chan struct{}
	wg        sync.WaitGroup
	// life ends when Shutdown gives up on the servers (abort): every
	// request still waiting for one fails then (send).
	life  context.Context
	abort context.CancelFunc
	// statfs is the last usage a server reported (StatFs).
	statfs atomic.Pointer[wire.StatFs]

	Counters Counters
}

// New connects to the server, authenticates and opens a session. It fails
// within the dial timeout with a clear error when the server is unreachable
// or refuses the token.
func New(ctx context.Context, cfg Config) (*Client, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	key, err := transport.NewClientKey()
	if err != nil {
		return nil, err
	}
	c := &Client{cfg: cfg, log: cfg.Logger, id: key.ID(), key: key, cacheGen: 1, clk: cfg.Clock,
		cache: cache.New(cfg.CacheInodes), stop: make(chan struct{}), recoverMu: newCtxMutex()}
	if c.clk == nil {
		c.clk = clock.Real{}
	}
	c.life, c.abort = context.WithCancel(context.Background())
	c.cache.SetDataBudget(cfg.CacheBytes)
	c.maps.gen = c.cacheGen
	c.wb = newWriteBack(c)
	c.ra = newReadAhead(c)
	c.behind = newBehind(c)
	c.rel.init()
	if err := c.connect(ctx); err != nil {
		return nil, fmt.Errorf("client: connect: %w", err)
	}
	dctx, cancel := context.WithTimeout(ctx, cfg.DialTimeout*time.Duration(len(cfg.Servers)))
	defer cancel()
	if _, err := c.pick(dctx, &wire.Request{Op: wire.OpRenew}); err != nil {
		addr := c.Server()
		for _, cn := range c.live() {
			cn.tr.Close()
		}
		return nil, fmt.Errorf("client: open session with %s: %w", addr, err)
	}
	// the usage a soft mount's statfs falls back on while the server
	// cannot be reached (StatFs)
	_, _ = c.StatFs(dctx)
	c.wg.Add(3)
	go c.renewLoop()
	go c.kernelLoop()
	go c.background()
	// inode numbers for the first creates behind the caller
	c.behind.askInos()
	return c, nil
}

// Hooks connect the client to the kernel side of a mount (fs).
type Hooks struct {
	// Invalidate drops the kernel's caches of an inode (page cache and
	// attributes). Called without locks held.
	Invalidate func(ino ids.Ino)
	// DropKernel drops every name and attribute the kernel caches, before
	// a lease lapses. Called without locks held.
	DropKernel func()
	// PathOf names an inode for log messages ("" if unknown).
	PathOf func(ino ids.Ino) string
}

// SetHooks installs the kernel side's hooks.
func (c *Client) SetHooks(h Hooks) { c.hooks.Store(&h) }

// Invalidate drops the kernel's caches of ino, if a kernel side is set.
func (c *Client) Invalidate(ino ids.Ino) {
	if h := c.hooks.Load(); h != nil && h.Invalidate != nil {
		h.Invalidate(ino)
	}
}

// PathOf names ino for log messages ("" if unknown).
func (c *Client) PathOf(ino ids.Ino) string {
	if h := c.hooks.Load(); h != nil && h.PathOf != nil {
		return h.PathOf(ino)
	}
	return ""
}

// ID returns the client id.
func (c *Client) ID() ids.ClientID { return c.id }

// Session returns the session with the home server as it announced it.
func (c *Client) Session() wire.Session {
	cn := c.homeConn()
	c.mu.Lock()
	defer c.mu.Unlock()
	return cn.session
}

// Stats describes the client for `leasefs admin --mount` (JSON as the
// server's admin API names things: snake_case, durations in ns).
type Stats struct {
	Session         ids.SessionID     `json:"session"` // with the home server
	Servers         int               `json:"servers"` // servers the client has sessions with
	LeaseLeft       time.Duration     `json:"lease_left_ns"`
	LeaseStats      lease.ClientStats `json:"lease"`
	CachedInodes    int               `json:"cached_inodes"`
	CachedDataBytes int64             `json:"cached_data_bytes"`
	DirtyBytes      int64             `json:"dirty_bytes"` // buffered writes not yet at the server
	Hits            int64             `json:"cache_hits"`
	Misses          int64             `json:"cache_misses"`
	Locks           []wire.Grant      `json:"locks"`
	Requests        int64             `json:"requests"`
	NacksReceived   int64             `json:"nacks_received"`
	Recoveries      int64             `json:"recoveries"`
	Revocations     int64             `json:"revocations"`
	Redirects       int64             `json:"redirects"`
	RemovedBehind   int64             `json:"removed_behind"`
	CreatedBehind   int64             `json:"created_behind"`
	CreatedWithData int64             `json:"created_with_data"`
	BehindBatches   int64             `json:"behind_batches"`
	ReclaimsOK      int64             `json:"reclaims_ok"`
	ReclaimsRefused int64             `json:"reclaims_refused"`
	DataLost        int64             `json:"data_lost"`
	Prefetches      int64             `json:"prefetches"`
	ReadBytes       int64             `json:"read_bytes"`    // file data fetched
	WrittenBytes    int64             `json:"written_bytes"` // file data sent
	// Blocks is the path to the home server's block store: "local DIR",
	// "remote URL" or "none".
	Blocks string `json:"blocks"`
}

// Stats returns the client's state and counters.
func (c *Client) Stats() Stats {
	home := c.homeConn()
	c.mu.Lock()
	defer c.mu.Unlock()
	hits, misses, n := c.cache.Stats()
	st := Stats{Session: home.session.ID, Servers: len(c.live()), LeaseLeft: c.leaseRemaining(c.clk.Now()),
		CachedInodes: n, CachedDataBytes: c.cache.DataBytes(), DirtyBytes: c.wb.dirtyBytes(), Hits: hits, Misses: misses, Locks: c.cache.Locks(),
		Requests: c.Counters.Requests.Load(), NacksReceived: c.Counters.NacksReceived.Load(),
		Recoveries: c.Counters.Recoveries.Load(), Revocations: c.Counters.Revocations.Load(),
		Redirects: c.Counters.Redirects.Load(), RemovedBehind: c.Counters.RemovedBehind.Load(), CreatedBehind: c.Counters.CreatedBehind.Load(), CreatedWithData: c.Counters.CreatedWithData.Load(), BehindBatches: c.Counters.BehindBatches.Load(), ReclaimsOK: c.Counters.ReclaimsOK.Load(), ReclaimsRefused: c.Counters.ReclaimsRefused.Load(),
		DataLost: c.Counters.DataLost.Load(), Prefetches: c.Counters.Prefetches.Load(),
		ReadBytes: c.Counters.ReadBytes.Load(), WrittenBytes: c.Counters.WrittenBytes.Load()}
	if home.lease != nil {
		st.LeaseStats = home.lease.Stats()
	}
	st.Blocks = "none"
	if home.blocks != nil {
		st.Blocks = home.blocks.path
	}
	return st
}

// Close is Shutdown within 30 s.
func (c *Client) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return c.Shutdown(ctx)
}

// ctxMutex is a mutex whose lock gives up when a context ends: for locks
// held across requests to a server, which a FUSE request may wait for.
type ctxMutex chan struct{}

func newCtxMutex() ctxMutex { return make(ctxMutex, 1) }

// lock locks m, or returns ctx's error if ctx ends first.
func (m ctxMutex) lock(ctx context.Context) error {
	select {
	case m <- struct{}{}:
		return nil
	default:
	}
	select {
	case m <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// tryLock locks m if nobody holds it.
func (m ctxMutex) tryLock() bool {
	select {
	case m <- struct{}{}:
		return true
	default:
		return false
	}
}

func (m ctxMutex) unlock() { <-m }
