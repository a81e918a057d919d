package integration

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/leasefs/leasefs/internal/mountsock"
	"github.com/leasefs/leasefs/internal/testnet"
	"github.com/leasefs/leasefs/transport"
)

var binary string // the leasefs binary built once for all tests

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) != "" {
		os.Exit(m.Run()) // a helper process (startHelper) needs no leasefs binary
	}
	if b := os.Getenv("LEASEFS_BINARY"); b != "" {
		// another build to compare with (the perf suite against an
		// older release); the tests may not all pass on it
		binary = b
		os.Exit(m.Run())
	}
	dir, err := os.MkdirTemp("", "leasefs-bin")
	if err != nil {
		panic(err)
	}
	binary = filepath.Join(dir, "leasefs")
	cmd := exec.Command("go", "build", "-o", binary, "../cmd/leasefs")
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if err := cmd.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build leasefs:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// helperEnv holds a helper process's argument (startHelper).
const helperEnv = "LEASEFS_TEST_HELPER"

// startHelper runs the test function named test in a process of its own
// (this test binary again), with arg in $LEASEFS_TEST_HELPER, and returns
// once the helper printed its first line, ready. Cleanup closes the
// helper's stdin, which tells it to finish, and waits for it (killing it
// after 10 s).
func startHelper(t testing.TB, test, arg, ready string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^"+test+"$", "-test.timeout=0")
	cmd.Env = append(os.Environ(), helperEnv+"="+arg)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	must(t, err)
	stdout, err := cmd.StdoutPipe()
	must(t, err)
	must(t, cmd.Start())
	t.Cleanup(func() {
		stdin.Close()
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	if line, err := bufio.NewReader(stdout).ReadString('\n'); err != nil || line != ready+"\n" {
		t.Fatalf("helper %s: %q %v", test, line, err)
	}
}

// helperArg is the argument of a helper process startHelper started, or
// "" in an ordinary test run (the helper's test function then skips).
func helperArg() string { return os.Getenv(helperEnv) }

// helperWait is a helper's last step: it says ready and waits until the
// test that started it is done with it.
func helperWait(ready string) {
	fmt.Println(ready)
	_, _ = io.Copy(io.Discard, os.Stdin)
}

func requireFUSE(t testing.TB) {
	t.Helper()
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skip("no /dev/fuse")
	}
	if os.Geteuid() != 0 {
		if _, err := exec.LookPath("fusermount3"); err != nil {
			t.Skip("not root and no fusermount3")
		}
	}
}

// proc is a leasefs process whose output goes to a log file in the test's
// temp directory and, on failure, to the test log.
type proc struct {
	t    testing.TB
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
	err  error
}

func startProc(t testing.TB, name string, args ...string) *proc {
	t.Helper()
	logf := filepath.Join(t.TempDir(), name+".log")
	f, err := os.Create(logf)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(binary, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{t: t, name: name, cmd: cmd, log: logf, done: make(chan struct{})}
	go func() { p.err = cmd.Wait(); f.Close(); close(p.done) }()
	t.Cleanup(func() {
		p.kill()
		if t.Failed() {
			b, _ := os.ReadFile(logf)
			if keep := os.Getenv("LEASEFS_KEEP_LOGS"); keep != "" {
				// whole logs of a failed test, for the tail is rarely enough
				dst := filepath.Join(keep, strings.ReplaceAll(t.Name(), "/", "_")+"-"+filepath.Base(filepath.Dir(logf))+"-"+name+".log")
				if err := os.MkdirAll(keep, 0o755); err == nil {
					_ = os.WriteFile(dst, b, 0o644)
				}
			}
			if len(b) > 8000 {
				b = b[len(b)-8000:]
			}
			t.Logf("---- %s log (tail) ----\n%s", name, b)
		}
	})
	return p
}

func (p *proc) signal(sig syscall.Signal) { _ = p.cmd.Process.Signal(sig) }

func (p *proc) kill() {
	select {
	case <-p.done:
	default:
		_ = p.cmd.Process.Signal(syscall.SIGCONT)
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

func (p *proc) output() string {
	b, _ := os.ReadFile(p.log)
	return string(b)
}

// server is a running `leasefs serve`.
type server struct {
	*proc
	dir, addr, tokenFile string
	extra                []string
}

// startServer runs a server on a fresh data directory and waits for its token.
func startServer(t testing.TB, extra ...string) *server {
	t.Helper()
	s := &server{dir: t.TempDir(), addr: testnet.UDPAddr(t), extra: extra}
	s.tokenFile = filepath.Join(s.dir, "token")
	s.start(t)
	return s
}

func (s *server) start(t testing.TB) {
	t.Helper()
	args := append([]string{"serve", "--data", s.dir, "--listen", s.addr, "--log-level", "debug"}, s.extra...)
	s.proc = startProc(t, "server", args...)
	// the admin endpoint listens just after the server logs "serving"
	admin := slices.Contains(args, "--admin")
	waitFor(t, 10*time.Second, "server to listen", func() bool {
		out := s.output()
		return strings.Contains(out, "serving") && (!admin || strings.Contains(out, "admin endpoint"))
	})
}

// adminAddr is the server's --admin address ("" without one).
func (s *server) adminAddr() string {
	if i := slices.Index(s.extra, "--admin"); i >= 0 && i+1 < len(s.extra) {
		return s.extra[i+1]
	}
	return ""
}

// adminArgs are the flags with which `leasefs admin` reaches the server's
// admin endpoint: its address and the admin token of its data directory.
func (s *server) adminArgs() []string {
	return []string{"--server", s.adminAddr(), "--token-file", filepath.Join(s.dir, "admin-token")}
}

// adminCall sends a request to the server's admin endpoint as `leasefs
// admin` does (TLS pinned to the cluster's certificate, the admin token)
// and returns the body of its 200 answer; anything else fails the test.
func (s *server) adminCall(t testing.TB, method, path string) []byte {
	t.Helper()
	tok, err := transport.ReadAdminTokenFile(filepath.Join(s.dir, "admin-token"))
	must(t, err)
	tr := &http.Transport{Proxy: nil, TLSClientConfig: transport.PinnedTLS(tok.CertHash)}
	defer tr.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, "https://"+s.adminAddr()+path, nil)
	must(t, err)
	req.Header.Set("Authorization", "Bearer "+tok.String())
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		t.Fatalf("admin %s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("admin %s %s: %s: %s", method, path, resp.Status, body)
	}
	return bytes.TrimSpace(body)
}

// restart kills the server with SIGKILL and starts it again on the same
// data directory and address.
func (s *server) restart(t testing.TB) {
	t.Helper()
	s.proc.kill()
	s.start(t)
}

// mount is a running `leasefs mount`.
type mount struct {
	*proc
	dir string
}

func isMounted(dir string) bool {
	b, err := os.ReadFile("/proc/mounts")
	if err != nil {
		return false
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) > 2 && f[1] == dir && strings.HasPrefix(f[2], "fuse") {
			return true
		}
	}
	return false
}

// startMount mounts s in a fresh directory and waits until the mount is live.
func startMount(t testing.TB, s *server, extra ...string) *mount {
	t.Helper()
	requireFUSE(t)
	m := &mount{dir: filepath.Join(t.TempDir(), "mnt")}
	if err := os.Mkdir(m.dir, 0o755); err != nil {
		t.Fatal(err)
	}
	args := append([]string{"mount", "--server", s.addr, "--token-file", s.tokenFile, "--log-level", "debug"}, extra...)
	m.proc = startProc(t, "mount-"+filepath.Base(filepath.Dir(m.dir)), append(args, m.dir)...)
	t.Cleanup(func() { m.unmount(t) })
	// The kernel lists the mount before the mount process has checked it
	// (its first request to the server); it logs "mounted" after.
	waitFor(t, 15*time.Second, "mount to appear", func() bool {
		if m.exited() {
			t.Fatalf("mount exited: %v\n%s", m.err, m.output())
		}
		return isMounted(m.dir) && strings.Contains(m.output(), "msg=mounted")
	})
	return m
}

// sync asks the mount to send everything it buffered to the server and
// returns once that is there: leasefs admin --mount M sync, without
// starting a process (the perf suite times it).
func (m *mount) sync() error {
	rep, err := mountsock.Client(m.dir).Post("http://mount/sync", "", nil)
	if err != nil {
		return err
	}
	defer rep.Body.Close()
	body, _ := io.ReadAll(rep.Body)
	if rep.StatusCode != http.StatusOK {
		return fmt.Errorf("mount sync: %s: %s", rep.Status, bytes.TrimSpace(body))
	}
	return nil
}

var abortOnce sync.Once

// unmount ends the mount: SIGTERM first (the clean path), then a lazy
// unmount and, if FUSE requests hang, an abort through fusectl.
func (m *mount) unmount(t testing.TB) {
	if !m.exited() {
		m.signal(syscall.SIGCONT)
		m.signal(syscall.SIGTERM)
		select {
		case <-m.done:
		case <-time.After(5 * time.Second):
			abortFUSE(m.dir)
			m.kill()
		}
	}
	if isMounted(m.dir) {
		abortFUSE(m.dir)
		_ = syscall.Unmount(m.dir, syscall.MNT_DETACH)
	}
}

// abortFUSE aborts the FUSE connection behind dir so nothing stays hung.
// It reads the device number from mountinfo: a stat could hang itself.
func abortFUSE(dir string) {
	abortOnce.Do(func() {
		_ = syscall.Mount("fusectl", "/sys/fs/fuse/connections", "fusectl", 0, "")
	})
	b, _ := os.ReadFile("/proc/self/mountinfo")
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && f[4] == dir {
			if _, minor, ok := strings.Cut(f[2], ":"); ok {
				_ = os.WriteFile("/sys/fs/fuse/connections/"+minor+"/abort", []byte("1"), 0)
			}
		}
	}
	_ = syscall.Unmount(dir, syscall.MNT_DETACH)
}

func waitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// run runs a command with a timeout and fails the test on error.
func run(t testing.TB, dir string, name string, args ...string) string {
	t.Helper()
	out, err := runErr(dir, name, args...)
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return out
}

func runErr(dir string, name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	return string(out), err
}
