package integration

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/leasefs/leasefs/client"
	"github.com/leasefs/leasefs/transport"
)

// BenchmarkMemory measures what a mount keeps per cached file, and a server
// per file created and locked (its lock, and the store's memtable share)
// and per client session: the growth of each process's anonymous resident
// memory (RssAnon: heap and stacks, not badger's maps of its files) over
// many of them, divided by how many. Go hands freed heap back lazily and
// grows it ahead of need, so these are upper bounds. The lock table alone:
// go test ./locks -bench DataHeld.
//
//	go test ./integration -run '^$' -bench Memory -benchtime 1x
func BenchmarkMemory(b *testing.B) {
	const files, sessions = 20_000, 200
	for range b.N {
		s := startServer(b)
		m := startMount(b, s)
		dir := filepath.Join(m.dir, "files")
		must(b, os.Mkdir(dir, 0o755))
		_, _, mount0 := vmRSS(m.proc.cmd.Process.Pid)
		_, _, server0 := vmRSS(s.proc.cmd.Process.Pid)
		for i := range files {
			must(b, os.WriteFile(filepath.Join(dir, fmt.Sprint("f", i)), nil, 0o644))
		}
		for i := range files {
			_, err := os.Lstat(filepath.Join(dir, fmt.Sprint("f", i)))
			must(b, err)
		}
		syncDir(b, dir) // every create at the server
		_, st := mountStats(b, m)
		_, _, mount1 := vmRSS(m.proc.cmd.Process.Pid)
		_, _, server1 := vmRSS(s.proc.cmd.Process.Pid)

		tok, err := os.ReadFile(s.tokenFile)
		must(b, err)
		t, err := transport.ParseToken(strings.TrimSpace(string(tok)))
		must(b, err)
		quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
		for range sessions {
			cfg := client.DefaultConfig()
			cfg.Servers, cfg.Token, cfg.Logger = []string{s.addr}, t, quiet
			c, err := client.New(context.Background(), cfg)
			must(b, err)
			b.Cleanup(func() { c.Close() })
		}
		_, _, server2 := vmRSS(s.proc.cmd.Process.Pid)

		perFile := float64(mount1-mount0) * 1024 / files
		perLock := float64(server1-server0) * 1024 / files
		perSession := float64(server2-server1) * 1024 / sessions
		b.ReportMetric(perFile, "mount-B/cached-file")
		b.ReportMetric(perLock, "server-B/created-file")
		b.ReportMetric(perSession, "server-B/session")
		b.Logf("%d files created behind, cached and locked by one mount; then %d more sessions: "+
			"mount +%d KiB (%.0f B per cached file), server +%d KiB (%.0f B per file created and locked), "+
			"then +%d KiB (%.0f B per session)", st.CreatedBehind, sessions,
			mount1-mount0, perFile, server1-server0, perLock, server2-server1, perSession)
	}
}
