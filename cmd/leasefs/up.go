package main

import (
	"fmt"
	"net"
	"os"
	"path/filepath"

	"github.com/spf13/pflag"

	"github.com/leasefs/leasefs/client"
	lfs "github.com/leasefs/leasefs/fs"
	"github.com/leasefs/leasefs/metaserver"
	"github.com/leasefs/leasefs/transport"
)

func defaultDataDir() string {
	if d := os.Getenv("XDG_DATA_HOME"); d != "" {
		return filepath.Join(d, "leasefs")
	}
	if h, err := os.UserHomeDir(); err == nil {
		return filepath.Join(h, ".local", "share", "leasefs")
	}
	return "leasefs-data"
}

func runUp(argv []string) error {
	var f serveFlags
	var life lifeFlags
	var tuning mountTuning
	ccfg := client.DefaultConfig()
	rest, err := f.parse("up", "[--data DIR] [--listen HOST:PORT] MOUNTPOINT",
		"Run one local leasefs server and mount it at MOUNTPOINT, in the foreground:\n"+
			"the embedded default. Stop it with Ctrl-C or 'umount MOUNTPOINT'.", argv,
		func(fs *pflag.FlagSet) {
			fs.StringVar(&f.cfg.Dir, "data", defaultDataDir(), "data directory")
			fs.StringVar(&f.cfg.Listen, "listen", "127.0.0.1:0", "HOST:PORT to serve on; the default serves this machine only\n(0.0.0.0:7420 lets other machines mount; port 0: a free one)")
			addAdminFlag(fs)
			tuning.add(fs, &ccfg)
			life.add(fs)
		})
	if err != nil {
		return err
	}
	if len(rest) != 1 {
		return fmt.Errorf("need exactly one MOUNTPOINT (see leasefs up --help)")
	}
	if err := life.validate(); err != nil {
		return err
	}
	if err := tuning.apply(&ccfg); err != nil {
		return err
	}
	// before the server starts: a mountpoint that cannot be used stops here
	if _, _, err := checkMountpoint(rest[0], life.allowStacked); err != nil {
		return err
	}
	dir := f.cfg.Dir
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	if err := f.defaultBlocks(); err != nil {
		return err
	}
	srv, err := metaserver.Start(f.cfg)
	if err != nil {
		return err
	}
	defer srv.Close()
	if err := startAdmin(srv); err != nil {
		return err
	}
	tok, err := transport.ParseToken(srv.Token())
	if err != nil {
		return err
	}
	addr := srv.Addr().String()
	ccfg.Servers = []string{addr}
	ccfg.Token = tok
	ccfg.Logger = f.cfg.Logger
	fmt.Fprintf(os.Stderr, "leasefs: data lives in %s; mounting at %s; stop with Ctrl-C or 'umount %s'.\n%s\n",
		dir, rest[0], rest[0], reach(srv.Addr(), filepath.Join(dir, "token")))
	return mountAndServe(ccfg, rest[0], lfs.MountOptions{}, f.cfg.Logger, life, mountExtras{})
}

// reach says who can mount a server listening on addr: this machine only
// on a loopback address, else other machines too, and how.
func reach(addr net.Addr, tokenFile string) string {
	host, port, _ := net.SplitHostPort(addr.String())
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return fmt.Sprintf("leasefs: serving on %s, this machine only (--listen 0.0.0.0:7420 lets other machines mount).", addr)
	}
	return fmt.Sprintf("leasefs: serving on %s; other machines mount with --server THIS_HOST:%s --token-file (a copy of) %s",
		addr, port, tokenFile)
}
