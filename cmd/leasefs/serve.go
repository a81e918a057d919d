package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/pflag"

	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/metaserver"
	"github.com/leasefs/leasefs/transport"
)

type serveFlags struct {
	cfg      metaserver.Config
	id       uint8
	faults   string
	peerFlt  string
	peers    string
	identity string
	cpus     int
	logging  logFlags
}

// parsePeers reads "1=HOST:PORT,2=HOST:PORT,...".
func parsePeers(s string) (map[ids.ServerID]string, error) {
	out := map[ids.ServerID]string{}
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		idStr, addr, ok := strings.Cut(part, "=")
		if !ok || addr == "" {
			return nil, fmt.Errorf("--peers: %q is not ID=HOST:PORT", part)
		}
		n, err := strconv.ParseUint(idStr, 10, 8)
		if err != nil || n == 0 {
			return nil, fmt.Errorf("--peers: server id %q must be 1..255", idStr)
		}
		if _, _, err := net.SplitHostPort(addr); err != nil {
			return nil, fmt.Errorf("--peers: %q: %w", addr, err)
		}
		if _, dup := out[ids.ServerID(n)]; dup {
			return nil, fmt.Errorf("--peers: server %d listed twice", n)
		}
		out[ids.ServerID(n)] = addr
	}
	return out, nil
}

// loadIdentityFile reads a cluster identity (another server's DATA/identity).
func loadIdentityFile(path string) (*transport.Identity, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--identity-file: %w", err)
	}
	id, err := transport.ParseIdentity(data)
	if err != nil {
		if _, terr := transport.ParseToken(string(data)); terr == nil {
			return nil, fmt.Errorf("%s holds only the join token (certificate hash and secret), which lets clients in; "+
				"a server also needs the cluster's private key: pass the first server's DATA/identity file (mode 0600)", path)
		}
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return id, nil
}

// parse adds the flags serve and up share after the command's own (added
// by own) and parses argv.
func (f *serveFlags) parse(name, args, desc string, argv []string, own func(*pflag.FlagSet)) ([]string, error) {
	f.cfg = metaserver.DefaultConfig()
	f.id = uint8(f.cfg.ServerID)
	fs := newFlags(name, args, desc)
	own(fs)
	fs.DurationVar(&f.cfg.ClientLease, "client-lease", f.cfg.ClientLease, "client lease period τ: how long a client may trust its cache after a reply")
	fs.Float64Var(&f.cfg.ClockDrift, "clock-drift", f.cfg.ClockDrift, "clock-rate error bound δ between any two machines")
	fs.DurationVar(&f.cfg.DeliveryTimeout, "delivery-timeout", f.cfg.DeliveryTimeout, "how long a lock revocation may go unacknowledged before the client is failed; a client flushing the file for it (its requests about the file keep coming) gets this long again after each, up to 30s")
	fs.StringVar(&f.faults, "faults", "", "inject transport faults, e.g. drop=0.2,dup=0.2,delay=5ms (testing only)")
	_ = fs.MarkHidden("faults")
	fs.StringVar(&f.cfg.Blocks, "blocks", "", "block store for file data: file:DIR, or s3://BUCKET[/PREFIX] with --s3-endpoint (default\nfile:DATA/blocks on a single server; a cluster's servers must all name one store they share)")
	fs.StringVar(&f.cfg.S3Endpoint, "s3-endpoint", "", "the S3-compatible object store of --blocks s3://...: HOST:PORT or http(s)://HOST:PORT\n(credentials: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or ~/.aws/credentials)")
	fs.StringVar(&f.cfg.S3Region, "s3-region", "", "the object store's region (default: us-east-1, or the bucket's on AWS)")
	fs.DurationVar(&f.cfg.OrphanDelay, "orphan-delay", metaserver.DefaultOrphanDelay, "delete a block no file's map names once it is this old\n(left by a mount or server that died between putting and committing it)")
	_ = fs.MarkHidden("orphan-delay") // tests; the default outlasts any flush
	fs.StringVar(&f.cfg.BlocksListen, "blocks-listen", "", "HOST:PORT to serve the block store to mounts on other hosts on (HTTPS over TCP;\ndefault: --listen's host and port)")
	f.logging.add(fs)
	if err := parse(fs, argv); err != nil {
		return nil, err
	}
	log, err := f.logging.logger()
	if err != nil {
		return nil, err
	}
	f.cfg.Logger = log
	if f.id == 0 {
		return nil, fmt.Errorf("--id must be 1..255")
	}
	f.cfg.ServerID = ids.ServerID(f.id)
	if f.faults != "" {
		faults, err := transport.ParseFaults(f.faults)
		if err != nil {
			return nil, fmt.Errorf("--faults: %w", err)
		}
		f.cfg.Faults = faults
	}
	if f.peerFlt != "" {
		faults, err := transport.ParseFaults(f.peerFlt)
		if err != nil {
			return nil, fmt.Errorf("--peer-faults: %w", err)
		}
		f.cfg.PeerFaults = faults
	}
	return fs.Args(), nil
}

// defaultBlocks makes the block store DATA/blocks unless --blocks named
// one. A cluster has no default: a map the owner replicates names blocks
// every server must be able to check and a failover's new owner to
// collect, so its servers share one store.
func (f *serveFlags) defaultBlocks() error {
	if f.cfg.Blocks != "" {
		return nil
	}
	if len(f.cfg.Peers) > 1 {
		return fmt.Errorf("a cluster's servers keep file data in one block store they share: " +
			"give each --blocks file:DIR, the same directory (on a shared file system) for all, or the same --blocks s3://BUCKET")
	}
	f.cfg.Blocks = "file:" + filepath.Join(f.cfg.Dir, "blocks")
	return nil
}

func runServe(argv []string) error {
	var f serveFlags
	rest, err := f.parse("serve", "--data DIR [--listen HOST:PORT] [flags]",
		"Run a leasefs server. On first start it creates the cluster identity (DIR/identity) and\n"+
			"writes the join token to DIR/token (mode 0600); clients need that token to mount.\n\n"+
			"A cluster: start the first server with --id 1 --peers 1=A:P,2=B:P,3=C:P; copy its\n"+
			"DIR/identity to the others and start each with its --id, the same --peers and\n"+
			"--identity-file COPY on a fresh data directory. Mount with --server A:P,B:P,C:P.", argv,
		func(fs *pflag.FlagSet) {
			fs.StringVar(&f.cfg.Dir, "data", "", "data directory: the badger store, the cluster identity and DIR/token (required)")
			fs.StringVar(&f.cfg.Listen, "listen", f.cfg.Listen, "HOST:PORT to serve clients on (QUIC over UDP)")
			fs.Uint8Var(&f.id, "id", f.id, "this server's id in the cluster, 1..255")
			fs.StringVar(&f.peers, "peers", "", "every server of the cluster, this one included: 1=HOST:PORT,2=HOST:PORT,3=HOST:PORT\n(none: a single server)")
			fs.DurationVar(&f.cfg.OwnershipLease, "ownership-lease", f.cfg.OwnershipLease, "PaxosLease period T of inode ownership among the servers")
			fs.StringVar(&f.identity, "identity-file", "", "start a fresh data directory with this cluster's identity: the first server's\nDATA/identity (certificate, key and secret; mode 0600). A data directory that\nholds another cluster's identity refuses to start")
			fs.StringVar(&f.identity, "token-file", "", "same as --identity-file (a plain client token is not enough for a server)")
			fs.DurationVar(&f.cfg.IdleRelease, "idle-release", f.cfg.IdleRelease, "release ownership of an inode unused (and unlocked) this long")
			fs.DurationVar(&f.cfg.AntiEntropy, "anti-entropy", f.cfg.AntiEntropy, "how often a server compares its replica with its peers and catches up")
			fs.StringVar(&f.peerFlt, "peer-faults", "", "inject faults on the links to the other servers only, e.g. none or drop=0.1;\nPOST /api/peer-cut?on=1 on the admin endpoint then cuts them (testing only)")
			_ = fs.MarkHidden("peer-faults")
			fs.Uint64Var(&f.cfg.MaxFileSize, "max-file-size", 0, "largest file the server takes, in bytes, below the protocol's (testing only: mounts do not know it)")
			_ = fs.MarkHidden("max-file-size")
			_ = fs.MarkHidden("idle-release")
			_ = fs.MarkHidden("anti-entropy")
			fs.IntVar(&f.cpus, "cpus", 0, "CPUs the server's work may use at once (Go's GOMAXPROCS); 0: follow the load, one CPU\n"+
				"while that is enough, all of this machine's while data moves in bulk or one CPU is busy\n"+
				"(GOMAXPROCS from the environment fixes it too)")
			addAdminFlag(fs) // --admin HOST:PORT, default off (admin.go)
		})
	if err != nil {
		return err
	}
	if len(rest) != 0 {
		return fmt.Errorf("unexpected arguments %q", rest)
	}
	if f.cpus < 0 {
		return errors.New("--cpus must not be negative")
	}
	// by default all CPUs, then following the load (cpus.go)
	adapt := setCPUs(f.cpus, runtime.GOMAXPROCS(0))
	if f.cfg.Dir == "" {
		return fmt.Errorf("--data DIR is required")
	}
	if f.peers != "" {
		if f.cfg.Peers, err = parsePeers(f.peers); err != nil {
			return err
		}
		if _, ok := f.cfg.Peers[f.cfg.ServerID]; !ok {
			return fmt.Errorf("--peers does not list this server's --id %d", f.id)
		}
	}
	if f.identity != "" {
		if f.cfg.Identity, err = loadIdentityFile(f.identity); err != nil {
			return err
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := f.defaultBlocks(); err != nil {
		return err
	}
	srv, err := metaserver.Start(f.cfg)
	if err != nil {
		return err
	}
	if err := startAdmin(srv); err != nil {
		srv.Close()
		return err
	}
	if adapt {
		go adaptCPUs(ctx, srv.BytesMoved, f.cfg.Logger)
	}
	<-ctx.Done()
	f.cfg.Logger.Info("shutting down")
	sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	return srv.Shutdown(sctx) // hands owned inodes over to the other servers
}
