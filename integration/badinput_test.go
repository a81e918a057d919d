package integration

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/leasefs/leasefs/internal/testnet"
)

func TestWrongToken(t *testing.T) {
	requireFUSE(t)
	s := startServer(t)
	other := startServer(t) // another cluster: another identity and secret
	mnt := t.TempDir()
	start := time.Now()
	out, err := exec.Command(binary, "mount", "--server", s.addr, "--token-file", other.tokenFile, mnt).CombinedOutput()
	if err == nil {
		t.Fatalf("mount with another cluster's token succeeded:\n%s", out)
	}
	if !strings.Contains(string(out), "certificate") && !strings.Contains(string(out), "token") {
		t.Fatalf("unclear error for a wrong token:\n%s", out)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("wrong token took %v to fail", d)
	}
	if isMounted(mnt) {
		t.Fatal("mounted despite the wrong token")
	}

	// Right certificate, wrong secret: the server refuses and logs it.
	tok, err := os.ReadFile(s.tokenFile)
	must(t, err)
	bad := []byte(strings.TrimSpace(string(tok)))
	if bad[len(bad)-1] == '0' {
		bad[len(bad)-1] = '1'
	} else {
		bad[len(bad)-1] = '0'
	}
	out, err = exec.Command(binary, "mount", "--server", s.addr, "--token", string(bad), mnt).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "refused") {
		t.Fatalf("mount with a wrong secret: err=%v\n%s", err, out)
	}
	waitFor(t, 5*time.Second, "server to log the refusal", func() bool {
		return strings.Contains(s.output(), "refused")
	})
}

func TestServerNotRunning(t *testing.T) {
	requireFUSE(t)
	s := startServer(t)
	s.kill()
	mnt := t.TempDir()
	start := time.Now()
	out, err := exec.Command(binary, "mount", "--server", s.addr, "--token-file", s.tokenFile, "--dial-timeout", "3s", mnt).CombinedOutput()
	if err == nil {
		t.Fatalf("mount of a dead server succeeded:\n%s", out)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("took %v to fail", d)
	}
	if !strings.Contains(string(out), s.addr) {
		t.Fatalf("error does not name the server:\n%s", out)
	}
}

func TestDataDirInUse(t *testing.T) {
	s := startServer(t)
	out, err := exec.Command(binary, "serve", "--data", s.dir, "--listen", testnet.UDPAddr(t)).CombinedOutput()
	if err == nil {
		t.Fatalf("second server on the same data directory started:\n%s", out)
	}
	if !strings.Contains(string(out), "in use") {
		t.Fatalf("unclear error:\n%s", out)
	}
	// The first server still serves.
	m := startMount(t, s)
	must(t, os.WriteFile(filepath.Join(m.dir, "f"), []byte("x"), 0o644))
}

func TestBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"serve"}, // no --data
		{"serve", "--data", t.TempDir(), "--client-lease", "-1s"},
		{"serve", "--data", t.TempDir(), "--bogus"},
		{"mount", "--server", "x:1"}, // no token, no mountpoint
		{"mount", "--server", "x:1", "--token", "x", "--cpus", "-1", t.TempDir()},
		{"serve", "--data", t.TempDir(), "--cpus", "-1"},
		{"nosuchcommand"},
	} {
		out, err := exec.Command(binary, args...).CombinedOutput()
		if err == nil {
			t.Errorf("leasefs %v succeeded:\n%s", args, out)
		}
		if len(out) == 0 {
			t.Errorf("leasefs %v failed without a message", args)
		}
	}
	for _, cmd := range []string{"serve", "mount", "up"} {
		out, err := exec.Command(binary, cmd, "--help").CombinedOutput()
		if err != nil || !strings.Contains(string(out), "Usage: leasefs "+cmd) {
			t.Errorf("leasefs %s --help: %v\n%s", cmd, err, out)
		}
		if cmd != "serve" && (!strings.Contains(string(out), "--cache-mib") || !strings.Contains(string(out), "--soft-timeout")) {
			t.Errorf("leasefs %s --help lacks the mount's --cache-mib or --soft-timeout:\n%s", cmd, out)
		}
	}
}

func TestNames(t *testing.T) {
	s := startServer(t)
	m := startMount(t, s)
	long := strings.Repeat("n", 256)
	if err := os.WriteFile(filepath.Join(m.dir, long), nil, 0o644); !errors.Is(err, syscall.ENAMETOOLONG) {
		t.Fatalf("256-byte name: %v, want ENAMETOOLONG", err)
	}
	ok := strings.Repeat("n", 255)
	must(t, os.WriteFile(filepath.Join(m.dir, ok), []byte("x"), 0o644))
	// A deep path longer than 4096 bytes in total works through relative steps.
	dir := m.dir
	seg := strings.Repeat("d", 200)
	for i := 0; i < 25; i++ {
		must(t, os.Mkdir(filepath.Join(dir, seg), 0o755))
		dir = filepath.Join(dir, seg)
		if len(dir) > 3500 {
			break
		}
	}
	if err := os.Mkdir(filepath.Join(m.dir, "x"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(m.dir, "x"), 0o755); !errors.Is(err, syscall.EEXIST) {
		t.Fatalf("mkdir twice: %v", err)
	}
	must(t, os.WriteFile(filepath.Join(m.dir, "x", "f"), nil, 0o644))
	if err := os.Remove(filepath.Join(m.dir, "x")); !errors.Is(err, syscall.ENOTEMPTY) && !errors.Is(err, syscall.EEXIST) {
		t.Fatalf("rmdir non-empty: %v", err)
	}
	if _, err := os.ReadFile(filepath.Join(m.dir, "x")); !errors.Is(err, syscall.EISDIR) {
		t.Fatalf("read of a directory: %v", err)
	}
	if err := os.Mkdir(filepath.Join(m.dir, "x", "f", "g"), 0o755); !errors.Is(err, syscall.ENOTDIR) {
		t.Fatalf("mkdir under a file: %v", err)
	}
}
