// Package s3gw runs a real S3 server on the loopback for tests: the Versity
// S3 gateway (versitygw) with its posix backend on a test's directory.
package s3gw

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// Credentials of the gateway's root account.
const (
	AccessKey = "leasefs-test-access"
	SecretKey = "leasefs-test-secret-key"
)

// RequireEnv, set to anything, makes a missing versitygw fail a test
// instead of skipping it (CI sets it).
const RequireEnv = "LEASEFS_REQUIRE_S3"

// startWait bounds how long a gateway takes to answer after it starts.
const startWait = 20 * time.Second

// Binary returns versitygw's path: on PATH, else in GOBIN or GOPATH/bin,
// where `go install` puts it.
func Binary() (string, error) {
	if p, err := exec.LookPath("versitygw"); err == nil {
		return p, nil
	}
	var dirs []string
	if d := os.Getenv("GOBIN"); d != "" {
		dirs = append(dirs, d)
	}
	gopath := os.Getenv("GOPATH")
	if gopath == "" {
		if home, err := os.UserHomeDir(); err == nil {
			gopath = filepath.Join(home, "go")
		}
	}
	for _, p := range filepath.SplitList(gopath) {
		dirs = append(dirs, filepath.Join(p, "bin"))
	}
	for _, d := range dirs {
		p := filepath.Join(d, "versitygw")
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() {
			return p, nil
		}
	}
	return "", errors.New("versitygw not found on PATH, in GOBIN or GOPATH/bin: go install github.com/versity/versitygw/cmd/versitygw@v1.8.0")
}

// Gateway is a running versitygw serving Dir: each directory in it is a
// bucket.
type Gateway struct {
	Endpoint string // http://127.0.0.1:PORT
	Addr     string // 127.0.0.1:PORT
	Dir      string
	bin, log string

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan error // cmd's Wait result
}

// Start runs a gateway on a fresh directory and stops it when the test
// ends. Without the binary the test is skipped, or fails if RequireEnv is
// set.
func Start(t testing.TB) *Gateway {
	t.Helper()
	return StartDir(t, t.TempDir())
}

// StartDir is Start on the directory dir.
func StartDir(t testing.TB, dir string) *Gateway {
	t.Helper()
	bin, err := Binary()
	if err != nil {
		if os.Getenv(RequireEnv) == "" {
			t.Skipf("no S3 gateway to test against (%s unset): %v", RequireEnv, err)
		}
		t.Fatal(err)
	}
	g := &Gateway{Dir: dir, bin: bin, log: filepath.Join(t.TempDir(), "versitygw.log")}
	t.Cleanup(g.Stop)
	// a free port may be taken between our probe and the gateway's
	// listen: try a few
	for try := 0; ; try++ {
		g.Addr, err = freePort()
		if err == nil {
			err = g.start()
		}
		if err == nil {
			break
		}
		if try == 2 {
			t.Fatalf("s3gw: %v", err)
		}
	}
	g.Endpoint = "http://" + g.Addr
	return g
}

func freePort() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// start runs the gateway on g.Addr and waits until it answers HTTP.
func (g *Gateway) start() error {
	logf, err := os.OpenFile(g.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(g.bin, "--access", AccessKey, "--secret", SecretKey,
		"--port", g.Addr, "--quiet", "--keep-alive", "posix", g.Dir)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	deadline := time.After(startWait)
	for {
		if answers(g.Addr) {
			g.mu.Lock()
			g.cmd, g.exited = cmd, exited
			g.mu.Unlock()
			return nil
		}
		select {
		case err := <-exited:
			return fmt.Errorf("versitygw on %s exited: %v: %s", g.Addr, err, g.logTail())
		case <-deadline:
			cmd.Process.Kill()
			<-exited
			return fmt.Errorf("versitygw on %s: no answer within %v: %s", g.Addr, startWait, g.logTail())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// answers reports whether an HTTP server answers at addr (any status: an
// unsigned request gets 403).
func answers(addr string) bool {
	c := http.Client{Timeout: time.Second}
	resp, err := c.Get("http://" + addr + "/")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return true
}

func (g *Gateway) logTail() string {
	b, _ := os.ReadFile(g.log)
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return strings.TrimSpace(string(bytes.ToValidUTF8(b, nil)))
}

// Stop kills the gateway (by its PID) and waits for it to exit; stopping
// a stopped gateway does nothing.
func (g *Gateway) Stop() {
	g.mu.Lock()
	cmd, exited := g.cmd, g.exited
	g.cmd = nil
	g.mu.Unlock()
	if cmd == nil {
		return
	}
	cmd.Process.Kill()
	<-exited
}

// Restart starts the gateway again on the same address and directory,
// after Stop.
func (g *Gateway) Restart() error {
	g.Stop()
	return g.start()
}

// Objects lists the objects of bucket as the gateway stores them: the
// regular files under its directory, as slash-separated keys.
func (g *Gateway) Objects(bucket string) ([]string, error) {
	root := filepath.Join(g.Dir, bucket)
	var keys []string
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() {
			rel, _ := filepath.Rel(root, p)
			keys = append(keys, filepath.ToSlash(rel))
		}
		return nil
	})
	return keys, err
}
