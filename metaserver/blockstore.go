package metaserver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/leasefs/leasefs/blocks"
	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/locks"
	"github.com/leasefs/leasefs/metaserver/admin"
	"github.com/leasefs/leasefs/metaserver/store"
	"github.com/leasefs/leasefs/transport"
	"github.com/leasefs/leasefs/wire"
)

// blockServer is the server's block store and the HTTPS endpoint that
// serves it to mounts on other hosts (blocks.Handler): file data larger
// than wire.InlineMax. The server itself puts and reads blocks for the
// writes and reads that come through the QUIC path (ops_blockdata.go).
type blockServer struct {
	store blocks.Store
	// put is store for the server's own Puts: guarded when store is a
	// directory on the data directory's file system (guardedStore).
	put blocks.Store
	// dir is a file store's directory ("" for an object store), which
	// mounts on this host may open themselves.
	dir string
	// s3 is the store when it is an object store, which mounts reach
	// directly with URLs it presigns (nil for a directory).
	s3     *blocks.S3Store
	name   string // the store as Config.Blocks named it, for logs
	signer *blocks.Signer
	http   *http.Server
	ln     net.Listener
	// wire is what session opens announce: Addr's host is empty when
	// the endpoint listens on every address (the mount then uses the host
	// it reached the server at).
	wire wire.BlockStore
	done chan struct{}
	// gc collects the blocks no file needs any more; stopGC ends it.
	gc     *BlockGC
	stopGC func()
	used   blockUsage
	// served counts the requests the endpoint answered: whether mounts
	// go through it, or straight to an object store.
	served atomic.Int64
	// errors counts the calls to the store that failed (meteredStore)
	errors atomic.Int64
}

// blocksSpec is Config.Blocks read: "file:DIR" or "s3://BUCKET[/PREFIX]".
type blocksSpec struct {
	kind           string // "file" or "s3"
	dir            string
	bucket, prefix string
}

// parseBlocksSpec reads Config.Blocks.
func parseBlocksSpec(spec string) (blocksSpec, error) {
	if strings.HasPrefix(spec, "s3:") {
		bucket, prefix, err := blocks.ParseS3Spec(spec)
		if err != nil {
			return blocksSpec{}, fmt.Errorf("metaserver: block store: %w", err)
		}
		return blocksSpec{kind: "s3", bucket: bucket, prefix: prefix}, nil
	}
	kind, dir, ok := strings.Cut(spec, ":")
	if !ok || kind != "file" || dir == "" {
		return blocksSpec{}, fmt.Errorf("metaserver: block store %q: want file:DIR or s3://BUCKET[/PREFIX]", spec)
	}
	return blocksSpec{kind: "file", dir: dir}, nil
}

// blocksListen is where the endpoint listens: cfg.BlocksListen, else the
// host and port of cfg.Listen over TCP. explicit says it was asked for, so
// that a busy default port may fall back to a free one instead.
func blocksListen(cfg *Config) (addr string, explicit bool) {
	if cfg.BlocksListen != "" {
		return cfg.BlocksListen, true
	}
	return cfg.Listen, false
}

// startBlocks opens the block store of cfg.Blocks and serves it over TLS
// with the cluster certificate; capabilities are checked under a key
// derived from the cluster secret (transport.Token.BlockKey).
func startBlocks(cfg *Config, id *transport.Identity, metrics *atomic.Pointer[admin.Metrics]) (*blockServer, error) {
	spec, err := parseBlocksSpec(cfg.Blocks)
	if err != nil {
		return nil, err
	}
	b := &blockServer{name: cfg.Blocks, done: make(chan struct{})}
	if err := b.open(cfg, spec); err != nil {
		return nil, err
	}
	b.store = meteredStore{Store: b.store, metrics: metrics, errors: &b.errors}
	key := id.TokenValue().BlockKey()
	if b.signer, err = blocks.NewSigner(key[:], nil); err != nil {
		return nil, err
	}
	addr, explicit := blocksListen(cfg)
	ln, err := net.Listen("tcp", addr)
	if err != nil && !explicit {
		// the UDP port of --listen was free, its TCP twin need not be
		host, _, _ := net.SplitHostPort(addr)
		cfg.Logger.Warn("block endpoint: the TCP port of the listen address is busy, using a free one", "addr", addr, "err", err)
		ln, err = net.Listen("tcp", net.JoinHostPort(host, "0"))
	}
	if err != nil {
		return nil, fmt.Errorf("metaserver: block endpoint: listen on %s: %w", addr, err)
	}
	b.ln = ln
	h := blocks.Handler(b.store, b.signer)
	b.http = blocks.NewHTTPServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b.served.Add(1)
		h.ServeHTTP(w, r)
	}), id.Cert)
	b.wire.Addr = advertised(ln.Addr())
	go func() {
		defer close(b.done)
		if err := b.http.ServeTLS(ln, "", ""); err != nil && !errors.Is(err, http.ErrServerClosed) {
			cfg.Logger.Error("block endpoint stopped", "err", err)
		}
	}()
	return b, nil
}

// open opens the store spec names and sets what session opens announce
// of it but its address. Mounts reach an object store's blocks directly,
// with URLs the inodes' owners presign (opBlockAccess), or through the
// server's endpoint if they ask to (--blocks-remote), as they reach a
// directory on another host.
func (b *blockServer) open(cfg *Config, spec blocksSpec) error {
	if spec.kind == "s3" {
		st, err := blocks.OpenS3Store(context.Background(), blocks.S3Config{Endpoint: cfg.S3Endpoint,
			Bucket: spec.bucket, Prefix: spec.prefix, Region: cfg.S3Region})
		if err != nil {
			return fmt.Errorf("metaserver: block store %s: %w", cfg.Blocks, err)
		}
		b.store, b.put, b.s3 = st, st, st
		b.wire = wire.BlockStore{Kind: "s3", Dir: st.String(), Endpoint: st.Endpoint()}
		return nil
	}
	// absolute: mounts on this host open the directory by this name
	dir, err := filepath.Abs(spec.dir)
	if err != nil {
		return fmt.Errorf("metaserver: block store %s: %w", cfg.Blocks, err)
	}
	st, err := blocks.OpenFileStore(dir)
	if err != nil {
		return fmt.Errorf("metaserver: block store %s: %w", cfg.Blocks, err)
	}
	b.store, b.put, b.dir = st, st, dir
	b.wire = wire.BlockStore{Kind: "file", Dir: dir, StoreID: st.StoreID()}
	return nil
}

// guardedStore is a block store on the data directory's file system: its
// Puts are admitted by the metadata store's space guard first, so that
// blocks never take the space badger must keep (store.AdmitOutside).
type guardedStore struct {
	blocks.Store
	st *store.Store
}

func (g guardedStore) Put(ctx context.Context, id blocks.ID, data []byte) error {
	// a file system block more: the file's last one, partly filled
	release, err := g.st.AdmitOutside(int64(len(data)) + 4096)
	if err != nil {
		return err
	}
	defer release()
	return g.Store.Put(ctx, id, data)
}

// guardPuts sets b.put: guarded by st if b's directory is on the file
// system of the data directory dataDir (an object store is not).
func (b *blockServer) guardPuts(st *store.Store, dataDir string) error {
	if b.dir == "" {
		return nil
	}
	var bst, dst syscall.Stat_t
	if err := syscall.Stat(b.dir, &bst); err != nil {
		return fmt.Errorf("metaserver: block store %s: %w", b.dir, err)
	}
	if err := syscall.Stat(dataDir, &dst); err != nil {
		return fmt.Errorf("metaserver: data directory %s: %w", dataDir, err)
	}
	if bst.Dev == dst.Dev {
		b.put = guardedStore{b.store, st}
	}
	return nil
}

// announce is what a session open says of the block store: with the
// room mounts must leave free when it shares the data directory's file
// system (their Puts do not pass the server's guard).
func (b *blockServer) announce(st *store.Store) wire.BlockStore {
	w := b.wire
	if _, guarded := b.put.(guardedStore); guarded {
		w.KeepFree = uint64(st.KeepFree())
	}
	return w
}

// advertised is addr as session opens announce it: without its host when
// that is unspecified (0.0.0.0, ::), which no mount can dial.
func advertised(addr net.Addr) string {
	host, port, err := net.SplitHostPort(addr.String())
	if err != nil {
		return addr.String()
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		host = ""
	}
	return net.JoinHostPort(host, port)
}

// close stops the endpoint: connections are cut, blocks being put are
// left as temp files the next open removes.
func (b *blockServer) close() {
	if b.stopGC != nil {
		b.stopGC()
	}
	_ = b.http.Close()
	<-b.done
}

// startBlockGC runs the collector of the block store's garbage and
// orphans; in a cluster each server collects the inodes it owns, as only
// the owner may change their records, and the cluster's collector (the
// owner of ownership.CollectorIno) takes over and collects the inodes
// that no server owns.
func (s *Server) startBlockGC() {
	owns := func(ids.Ino) bool { return true }
	var adopter Adopter
	if s.owner != nil {
		owns = func(ino ids.Ino) bool { _, err := s.owner.OwnerEpoch(ino); return err == nil }
		adopter = s.owner
	}
	gcCfg := BlockGCConfig{Owns: owns, Adopter: adopter, Every: s.cfg.gcEvery, Clock: s.cfg.Clock, Logger: s.log,
		OrphanDelay: s.cfg.OrphanDelay}
	if d := s.cfg.OrphanDelay; d > 0 {
		gcCfg.OrphanEvery = min(DefaultOrphanEvery, d/2) // found within about 1.5 times the delay
	}
	gc := NewBlockGC(s.store, s.blocks.store, gcCfg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		gc.Run(ctx)
	}()
	s.blocks.gc = gc
	s.blocks.stopGC = sync.OnceFunc(func() { cancel(); <-done })
}

// convertAtStart moves the data of the files larger than wire.InlineMax
// from pages to blocks before the server serves (store format 4), as the
// store's format upgrades are made.
func (s *Server) convertAtStart() error {
	if s.cfg.clustered() {
		// Only an inode's owner may change its records, and ownership
		// comes after start: each file is converted by its owner when it
		// is written (writeBlock, opCommitBlocks), and read through the
		// server until then (opLookupBlocks answers its bytes).
		s.log.Info("cluster: files over the inline size whose data is still in pages are not converted at start: they are read through the server and converted when written",
			"inline_max", wire.InlineMax)
		return nil
	}
	_, _, err := s.store.ConvertPagesToBlocks(context.Background(), s.blocks.put, s.log)
	if err != nil {
		return fmt.Errorf("metaserver: %w", err)
	}
	return nil
}

// garbageDelay is how long a block no map references stays in the store:
// a client that read the map under a lock revoked before the change may
// still be fetching it, for at most its lease, τ(1+δ); the margin covers a
// fetch the client started just before its lease ran out.
func garbageDelay(cfg *Config) time.Duration {
	return time.Duration(float64(cfg.ClientLease)*(1+cfg.ClockDrift)) + 10*time.Second
}

// BlocksAddr is the address of the block endpoint (nil without one).
func (s *Server) BlocksAddr() net.Addr {
	if s.blocks == nil {
		return nil
	}
	return s.blocks.ln.Addr()
}

// blockOps are the requests about the block store.
var blockOps = map[wire.Op]opHandler{
	wire.OpBlockAccess:  (*Server).opBlockAccess,
	wire.OpCommitBlocks: (*Server).opCommitBlocks,
	wire.OpLookupBlocks: (*Server).opLookupBlocks,
}

// opBlockAccess signs capabilities for blocks of r.Ino, or presigns URLs
// of an object store's blocks (wire.BlockURL), only while the client
// holds the file's lock in the mode the operation needs (S or X to read,
// X to write): unlike other requests it does not acquire the lock, since
// a mount reads and writes blocks only under a lock it already holds for
// the data. Each expires τ after now (a capability to the millisecond, a
// URL at the whole second before), no later than the client's lease,
// which this reply renews, allows.
func (s *Server) opBlockAccess(q *request) *wire.Reply {
	r := q.r
	if s.blocks == nil {
		return wire.ErrorReply(wire.Errf(wire.CodeNotSupported, "this server has no block store"))
	}
	if r.Flags&^(wire.BlockWrite|wire.BlockURL) != 0 {
		return wire.ErrorReply(wire.Errf(wire.CodeInvalid, "block access flags %#x", r.Flags))
	}
	urls := r.Flags&wire.BlockURL != 0
	if urls && s.blocks.s3 == nil {
		return wire.ErrorReply(wire.Errf(wire.CodeNotSupported, "presigned URLs: this server's blocks are not in an object store"))
	}
	uniques, err := wire.ParseUniques(r.Data)
	if err != nil {
		return wire.ErrorReply(err)
	}
	op, mode := blocks.OpRead, locks.Shared
	if r.Flags&wire.BlockWrite != 0 {
		op, mode = blocks.OpWrite, locks.Exclusive
	}
	if !s.lm.holds(q.sess.client, r.Ino, mode) {
		return wire.ErrorReply(wire.Errf(wire.CodeAccess, "block %s of %v needs the file's %v lock, which the client does not hold", op, r.Ino, mode))
	}
	if s.owner != nil && !s.owner.StillOwned([]ids.Ino{r.Ino}) {
		return wire.ErrorReply(errUnavailable("inode %v changed owner", r.Ino))
	}
	expiry := time.Now().Add(s.cfg.ClientLease)
	caps := make([]string, len(uniques))
	for i, u := range uniques {
		id := blocks.ID{Ino: r.Ino, Unique: u}
		if !urls {
			caps[i] = s.blocks.signer.Sign(blocks.Capability{Op: op, ID: id, Expiry: expiry})
			continue
		}
		if caps[i], err = s.blocks.s3.Presign(q.ctx, op, id, expiry); err != nil {
			return wire.ErrorReply(wire.Errf(wire.CodeIO, "%v", err))
		}
	}
	return &wire.Reply{Names: caps}
}

// holds reports whether client c holds at least mode on ino and is not
// being failed.
func (m *lockMgr) holds(c ids.ClientID, ino ids.Ino, mode locks.Mode) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return !m.core.Failing(c) && m.core.Mode(c, ino) >= mode
}

// usageEvery is how old the block store's usage may be when statfs and
// the admin status report it: counting it lists every block.
const usageEvery = 10 * time.Second

// blockUsage is the block store's usage as last counted, recounted in
// the background once it is older than usageEvery.
type blockUsage struct {
	mu       sync.Mutex
	u        blocks.Usage
	at       time.Time
	counting bool
}

// usage returns the store's usage: counted now the first time, then the
// last count, with a recount started when it is stale.
func (b *blockServer) usage(log interface{ Warn(string, ...any) }) blocks.Usage {
	bu := &b.used
	bu.mu.Lock()
	defer bu.mu.Unlock()
	if bu.at.IsZero() {
		bu.u, bu.at = b.countUsage(log), time.Now()
		return bu.u
	}
	if time.Since(bu.at) > usageEvery && !bu.counting {
		bu.counting = true
		go func() {
			u := b.countUsage(log)
			bu.mu.Lock()
			bu.u, bu.at, bu.counting = u, time.Now(), false
			bu.mu.Unlock()
		}()
	}
	return bu.u
}

// add counts a block committed since the last count, so that statfs
// shows written data at once; the next count corrects what it missed
// (blocks put and never committed, deletions).
func (bu *blockUsage) add(bytes int64) {
	bu.mu.Lock()
	defer bu.mu.Unlock()
	if !bu.at.IsZero() {
		bu.u.Bytes += bytes
		bu.u.Blocks++
	}
}

func (b *blockServer) countUsage(log interface{ Warn(string, ...any) }) blocks.Usage {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	u, err := b.store.Usage(ctx)
	if err != nil {
		log.Warn("block store: counting its usage failed", "blocks", b.name, "err", err)
		return blocks.Usage{Free: -1}
	}
	return u
}
