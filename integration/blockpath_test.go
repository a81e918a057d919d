package integration

import (
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
)

// blocksListen is the block endpoint a server logged ("" before it did).
func blocksListen(s *server) string {
	m := regexp.MustCompile(`blocks_listen=(\S+)`).FindStringSubmatch(s.output())
	if m == nil {
		return ""
	}
	return m[1]
}

// mountBlockPath is the path to the block store a mount reports, through
// its status socket, and checks its status xattr says the same.
func mountBlockPath(t *testing.T, m *mount) string {
	t.Helper()
	var st struct {
		Stats struct {
			Blocks string `json:"blocks"`
		} `json:"stats"`
	}
	out := admin(t, "--mount", m.dir, "status", "--json")
	must(t, json.Unmarshal([]byte(out), &st))
	buf := make([]byte, 64<<10)
	n, err := syscall.Getxattr(m.dir, "user.leasefs.status", buf)
	must(t, err)
	var x struct {
		Blocks string `json:"blocks"`
	}
	must(t, json.Unmarshal(buf[:n], &x))
	if x.Blocks != st.Stats.Blocks {
		t.Errorf("status xattr says %q, status socket %q", x.Blocks, st.Stats.Blocks)
	}
	if table := admin(t, "--mount", m.dir, "status"); !regexp.MustCompile(`block store\s+` + regexp.QuoteMeta(st.Stats.Blocks) + `\n`).MatchString(table) {
		t.Errorf("status table does not show the block store %q:\n%s", st.Stats.Blocks, table)
	}
	return st.Stats.Blocks
}

// TestBlockPaths: a server opens DATA/blocks and serves it on its
// --listen host and port over TCP; a mount on its host uses the
// directory, one told to treat the server as remote its endpoint. A block
// store that cannot be opened stops the server with a one-line error.
func TestBlockPaths(t *testing.T) {
	s := startServer(t)
	if _, err := os.Stat(filepath.Join(s.dir, "blocks", ".leasefs-blocks")); err != nil {
		t.Errorf("no block store in DATA/blocks: %v", err)
	}
	ep := blocksListen(s)
	host, _, _ := net.SplitHostPort(s.addr)
	if h, _, err := net.SplitHostPort(ep); err != nil || h != host {
		t.Fatalf("block endpoint %q, want on %s (server log:\n%s)", ep, host, s.output())
	}
	if ep != s.addr {
		t.Logf("block endpoint %s, not the --listen port %s (busy over TCP)", ep, s.addr)
	}
	if got, want := mountBlockPath(t, startMount(t, s)), "local "+filepath.Join(s.dir, "blocks"); got != want {
		t.Errorf("mount on the server's host: %q, want %q", got, want)
	}
	if got, want := mountBlockPath(t, startMount(t, s, "--blocks-remote")), "remote https://"+ep; got != want {
		t.Errorf("mount with --blocks-remote: %q, want %q", got, want)
	}

	bad := filepath.Join(t.TempDir(), "file")
	must(t, os.WriteFile(bad, nil, 0o600))
	out, err := runErr("", binary, "serve", "--data", t.TempDir(), "--listen", "127.0.0.1:0", "--blocks", "file:"+filepath.Join(bad, "blocks"))
	if lines := strings.Split(strings.TrimSpace(out), "\n"); err == nil || !strings.Contains(lines[len(lines)-1], "block store") {
		t.Errorf("serve with an unusable block store: %v\n%s", err, out)
	}
}

// TestClusterBlockPaths: each server of a cluster serves the block store
// they share on an endpoint of its own, and a mount told to treat its
// server as remote reaches that server's endpoint.
func TestClusterBlockPaths(t *testing.T) {
	c := startCluster(t, 3, clusterTimings()...)
	seen := map[string]bool{}
	for i, s := range c.servers {
		ep := blocksListen(s.server)
		if ep == "" || seen[ep] {
			t.Fatalf("server %d: block endpoint %q (others %v)", s.id, ep, seen)
		}
		seen[ep] = true
		if got, want := mountBlockPath(t, c.mount(t, []int{i}, "--blocks-remote")), "remote https://"+ep; got != want {
			t.Errorf("mount of server %d: %q, want %q", s.id, got, want)
		}
	}
}
