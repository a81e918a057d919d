package main

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime"
	"strings"

	"github.com/spf13/pflag"
)

var errUsage = errors.New("usage")

func runtimeStack(buf []byte) int { return runtime.Stack(buf, true) }

// newFlags makes a flag set whose --help prints the command's usage line,
// its description and every flag.
func newFlags(name, args, desc string) *pflag.FlagSet {
	fs := pflag.NewFlagSet(name, pflag.ContinueOnError)
	fs.SortFlags = false
	fs.Usage = func() {
		fmt.Fprintf(os.Stderr, "Usage: leasefs %s %s\n\n%s\n\nFlags:\n%s", name, args, desc, fs.FlagUsages())
	}
	return fs
}

// parse parses args; --help exits 0, a bad flag prints usage and fails.
func parse(fs *pflag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintf(os.Stderr, "leasefs %s: %v\n", fs.Name(), err)
		fs.Usage()
		return errUsage
	}
	return nil
}

type logFlags struct {
	level, format, file string
}

func (l *logFlags) add(fs *pflag.FlagSet) {
	fs.StringVar(&l.level, "log-level", "info", "log level: debug, info, warn or error")
	fs.StringVar(&l.format, "log-format", "text", "log format: text or json")
	fs.StringVar(&l.file, "log-file", "", "append the log to this file (default: stderr)")
}

func (l *logFlags) logger() (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(l.level)); err != nil {
		return nil, fmt.Errorf("bad --log-level %q: want debug, info, warn or error", l.level)
	}
	opts := &slog.HandlerOptions{Level: lv}
	out := io.Writer(os.Stderr)
	if l.file != "" {
		f, err := openLog(l.file) // for the life of the process
		if err != nil {
			return nil, err
		}
		out = f
	}
	switch strings.ToLower(l.format) {
	case "text":
		return slog.New(slog.NewTextHandler(out, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(out, opts)), nil
	}
	return nil, fmt.Errorf("bad --log-format %q: want text or json", l.format)
}

// setCPUs applies a --cpus flag: GOMAXPROCS n; with 0, GOMAXPROCS from
// the environment if set, else def. It reports whether the default was
// taken (neither the flag nor the environment chose).
func setCPUs(n, def int) (byDefault bool) {
	if n == 0 {
		if os.Getenv("GOMAXPROCS") != "" {
			return false
		}
		n, byDefault = def, true
	}
	runtime.GOMAXPROCS(n)
	return byDefault
}
