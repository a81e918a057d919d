// Command leasefs runs leasefs servers and mounts.
//
//	leasefs serve --data DIR --listen HOST:PORT     run a server
//	leasefs mount --server HOST:PORT --token-file F MOUNTPOINT
//	leasefs up [--data DIR] MOUNTPOINT              one local server plus a mount
//	leasefs admin --server ADMIN_HOST:PORT status|clients|locks|owners|counters|evict CLIENT
package main

import (
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/leasefs/leasefs/internal/version"
)

type command struct {
	name, summary string
	run           func(args []string) error
}

var commands = []command{
	{"serve", "run a leasefs server", runServe},
	{"mount", "mount leasefs from a server (foreground)", runMount},
	{"up", "run one local server and mount it (the embedded default)", runUp},
	{"admin", "show what a server or mount is doing; evict a client", runAdmin},
	{"version", "print which build this is", runVersion},
}

func usage() {
	fmt.Fprintf(os.Stderr, "leasefs: a distributed file system with leases\n\nUsage: leasefs COMMAND [flags]\n\nCommands:\n")
	for _, c := range commands {
		fmt.Fprintf(os.Stderr, "  %-7s %s\n", c.name, c.summary)
	}
	fmt.Fprintf(os.Stderr, "\nRun 'leasefs COMMAND --help' for the flags of a command.\n")
}

func main() {
	if isMountHelper(os.Args) {
		if err := runMountHelper(os.Args[1:]); err != nil {
			fmt.Fprintf(os.Stderr, "leasefs: mount: %v\n", err)
			os.Exit(32) // mount(8)'s "mount failure"
		}
		return
	}
	if len(os.Args) < 2 {
		usage()
		os.Exit(2)
	}
	name := os.Args[1]
	if name == "-h" || name == "--help" || name == "help" {
		usage()
		return
	}
	if name == "--version" {
		name = "version"
	}
	dumpGoroutinesOnSIGUSR1()
	for _, c := range commands {
		if c.name == name {
			if err := c.run(os.Args[2:]); err != nil {
				if err == errUsage {
					reportReady(errors.New("bad arguments; see leasefs mount --help"))
					os.Exit(2)
				}
				if !reportReady(err) { // else the parent says it
					fmt.Fprintf(os.Stderr, "leasefs %s: %v\n", name, err)
				}
				os.Exit(1)
			}
			return
		}
	}
	fmt.Fprintf(os.Stderr, "leasefs: unknown command %q\n\n", name)
	usage()
	os.Exit(2)
}

// dumpGoroutinesOnSIGUSR1 helps diagnose a hung mount or server in the field.
func dumpGoroutinesOnSIGUSR1() {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGUSR1)
	go func() {
		for range ch {
			buf := make([]byte, 1<<20)
			n := runtimeStack(buf)
			os.Stderr.Write(buf[:n])
		}
	}()
}

func runVersion(args []string) error {
	if len(args) > 0 {
		fmt.Fprintln(os.Stderr, "usage: leasefs version (or leasefs --version)")
		return errUsage
	}
	fmt.Println("leasefs", version.Get())
	return nil
}
