package main

import (
	"context"
	"fmt"
	"os/signal"
	"syscall"

	"github.com/spf13/pflag"

	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/metaserver"
	"github.com/leasefs/leasefs/transport"
)

type serveFlags struct {
	cfg     metaserver.Config
	id      uint8
	faults  string
	logging logFlags
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
	fs.DurationVar(&f.cfg.DeliveryTimeout, "delivery-timeout", f.cfg.DeliveryTimeout, "how long a lock revocation may go unacknowledged before the client is failed")
	fs.StringVar(&f.faults, "faults", "", "inject transport faults, e.g. drop=0.2,dup=0.2,delay=5ms (testing only)")
	_ = fs.MarkHidden("faults")
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
	return fs.Args(), nil
}

func runServe(argv []string) error {
	var f serveFlags
	rest, err := f.parse("serve", "--data DIR [--listen HOST:PORT] [flags]",
		"Run a leasefs server. On first start it creates the cluster identity and writes the join\n"+
			"token to DIR/token (mode 0600); clients need that token to mount.", argv,
		func(fs *pflag.FlagSet) {
			fs.StringVar(&f.cfg.Dir, "data", "", "data directory: the badger store, the cluster identity and DIR/token (required)")
			fs.StringVar(&f.cfg.Listen, "listen", f.cfg.Listen, "HOST:PORT to serve clients on (QUIC over UDP)")
			fs.Uint8Var(&f.id, "id", f.id, "this server's id in the cluster, 1..255")
			addAdminFlag(fs) // --admin HOST:PORT, default off (admin.go)
		})
	if err != nil {
		return err
	}
	if len(rest) != 0 {
		return fmt.Errorf("unexpected arguments %q", rest)
	}
	if f.cfg.Dir == "" {
		return fmt.Errorf("--data DIR is required")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	srv, err := metaserver.Start(f.cfg)
	if err != nil {
		return err
	}
	if err := startAdmin(srv); err != nil {
		srv.Close()
		return err
	}
	<-ctx.Done()
	f.cfg.Logger.Info("shutting down")
	return srv.Close()
}
