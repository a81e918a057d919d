package main

import (
	"fmt"
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
	rest, err := f.parse("up", "[--data DIR] [--listen HOST:PORT] MOUNTPOINT",
		"Run one local leasefs server and mount it at MOUNTPOINT, in the foreground:\n"+
			"the embedded default. Stop it with Ctrl-C or 'umount MOUNTPOINT'.", argv,
		func(fs *pflag.FlagSet) {
			fs.StringVar(&f.cfg.Dir, "data", defaultDataDir(), "data directory")
			fs.StringVar(&f.cfg.Listen, "listen", "127.0.0.1:0", "HOST:PORT for other machines' mounts (port 0: a free one)")
			addAdminFlag(fs)
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
	ccfg := client.DefaultConfig()
	addr := srv.Addr().String()
	ccfg.Servers = []string{addr}
	ccfg.Token = tok
	ccfg.Logger = f.cfg.Logger
	fmt.Fprintf(os.Stderr, "leasefs: data lives in %s; serving on %s; mounting at %s.\n"+
		"leasefs: stop with Ctrl-C or 'umount %s'. Other machines can mount with --server %s --token-file %s\n",
		dir, addr, rest[0], rest[0], addr, filepath.Join(dir, "token"))
	return mountAndServe(ccfg, rest[0], lfs.MountOptions{}, f.cfg.Logger, life)
}
