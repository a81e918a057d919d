package main

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	rtdebug "runtime/debug"
	"slices"

	"github.com/leasefs/leasefs/client"
	lfs "github.com/leasefs/leasefs/fs"
	"github.com/leasefs/leasefs/transport"
	"github.com/spf13/pflag"
)

func runMount(argv []string) error {
	cfg := client.DefaultConfig()
	fs := newFlags("mount", "--server HOST:PORT (--token-file FILE | --token TOKEN) [flags] MOUNTPOINT",
		"Mount leasefs at MOUNTPOINT and serve it in the foreground until it is unmounted\n"+
			"(umount MOUNTPOINT) or this process gets SIGINT or SIGTERM. Then it unmounts, sends what it\n"+
			"buffered and exits within --stop-timeout: 0 if everything reached the server, 1 if it logged\n"+
			"DATA LOST. A MOUNTPOINT that already has a mount on it is refused (--allow-stacked).")
	var tokenFile, token, faults string
	var debug, background, readOnly bool
	var ex mountExtras
	var logging logFlags
	var life lifeFlags
	fs.StringSliceVar(&cfg.Servers, "server", nil, "server address HOST:PORT, or several of one cluster (A,B,C or repeated): requests go to the first that answers,\nor to the server that owns their inode if one redirects there; on failure to the next (required)")
	fs.DurationVar(&cfg.FailoverTimeout, "failover-timeout", cfg.FailoverTimeout, "with several servers: how long a request may go unanswered before the mount checks that its server is alive and fails over if not")
	fs.StringVar(&tokenFile, "token-file", "", "file holding the cluster's join token (the server's DATA/token)")
	fs.StringVar(&token, "token", "", "the join token itself (prefer --token-file: command lines are visible to other users)")
	var tuning mountTuning
	tuning.add(fs, &cfg)
	fs.DurationVar(&cfg.DialTimeout, "dial-timeout", cfg.DialTimeout, "how long to try to reach the server at mount time")
	cpus := fs.Int("cpus", 0, "CPUs the mount's own work may use at once (Go's GOMAXPROCS); 0: half of this machine's, at least 1,\nleaving the rest to the applications it serves (or GOMAXPROCS from the environment)")
	fs.BoolVar(&background, "background", false, "return once mounted, serving the mount from a process of its own; it logs to --log-file, else to\nthis command's stderr unless a terminal, else to /var/log/leasefs/mount-DIR.log (~/.local/state/leasefs as a user)")
	fs.BoolVar(&readOnly, "read-only", false, "mount read-only: writes fail with EROFS")
	fs.StringVar(&ex.subdir, "subdir", "", "mount this directory of the file system (a path from its root) as MOUNTPOINT's root")
	fs.StringVar(&ex.metrics, "metrics", "", "HOST:PORT to serve this mount's Prometheus metrics on, at /metrics (plain HTTP: prefer a loopback address)")
	fs.BoolVar(&debug, "fuse-debug", false, "log every FUSE request")
	fs.StringVar(&faults, "faults", "", "inject transport faults (testing only)")
	_ = fs.MarkHidden("faults")
	fs.BoolVar(&cfg.BlocksRemote, "blocks-remote", false, "reach the block store through the server's endpoint even where its directory is on this host, or where\nit is an object store this mount could reach with presigned URLs (to test the path mounts on other hosts take)")
	life.add(fs)
	logging.add(fs)
	if err := parse(fs, argv); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return errUsage
	}
	if background {
		child := slices.DeleteFunc(slices.Clone(argv), func(a string) bool { return a == "--background" || a == "--background=true" })
		return startBackground(append([]string{"mount"}, child...), fs.Arg(0), logging.file)
	}
	log, err := logging.logger()
	if err != nil {
		return err
	}
	cfg.Logger = log
	if err := tuning.apply(&cfg); err != nil {
		return err
	}
	if *cpus < 0 {
		return errors.New("--cpus must not be negative")
	}
	setCPUs(*cpus, mountCPUs())
	if os.Getenv("GOMEMLIMIT") == "" {
		// Collect before the heap doubles past the caches: full caches are
		// live data, and the default GOGC would let the process grow to
		// twice their size. The limit leaves room above them (cached
		// inodes cost up to ~2 KiB each with their names and owners,
		// buffered writes up to client.DirtyBudget): a limit just above
		// the live heap makes the collector run without pause, hence
		// 256 MiB more. Whole cached pages live outside the Go heap
		// (package pagemem), files' short last pages inside: the data
		// cache counts here too, as it may be all short pages.
		rtdebug.SetMemoryLimit(cfg.CacheBytes + int64(cfg.CacheInodes)<<11 + client.DirtyBudget + 256<<20)
	}
	if len(cfg.Servers) == 0 {
		return errors.New("--server is required")
	}
	switch {
	case token != "" && tokenFile != "":
		return errors.New("give --token or --token-file, not both")
	case token != "":
		cfg.Token, err = transport.ParseToken(token)
	case tokenFile != "":
		cfg.Token, err = transport.ReadTokenFile(tokenFile)
	default:
		return errors.New("--token-file or --token is required")
	}
	if err != nil {
		return err
	}
	if faults != "" {
		if cfg.Faults, err = transport.ParseFaults(faults); err != nil {
			return fmt.Errorf("--faults: %w", err)
		}
	}
	return mountAndServe(cfg, fs.Arg(0), lfs.MountOptions{Debug: debug, ReadOnly: readOnly}, log, life, ex)
}

// mountCPUs is the mount's default GOMAXPROCS: half the CPUs Go would
// use, at least 1. A mount serves applications on the same machine; its
// work per request is short and handed between goroutines (FUSE reader,
// QUIC connection, sender), and with a P per CPU each hand-off may wake an
// idle thread that then spins for work, on the CPUs the applications
// need. Bulk reads and writes are no slower with half.
func mountCPUs() int { return max(1, runtime.GOMAXPROCS(0)/2) }

// mountTuning is the flags of a mount's behaviour that up offers too.
type mountTuning struct{ cacheMiB int64 }

func (t *mountTuning) add(fs *pflag.FlagSet, cfg *client.Config) {
	fs.DurationVar(&cfg.SoftTimeout, "soft-timeout", 0, "fail operations with EIO after the server was unreachable this long (0: block until it returns, like NFS hard)")
	fs.Int64Var(&t.cacheMiB, "cache-mib", cfg.CacheBytes>>20, "file data this mount keeps in memory while it holds the files' data locks, in MiB (0: none)")
}

// apply puts the parsed flags into cfg.
func (t *mountTuning) apply(cfg *client.Config) error {
	if t.cacheMiB < 0 {
		return errors.New("--cache-mib must not be negative")
	}
	cfg.CacheBytes = t.cacheMiB << 20
	return nil
}
