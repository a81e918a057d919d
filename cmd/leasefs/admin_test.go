package main

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"encoding/hex"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/leasefs/leasefs/transport"
)

// fakeAdmin is an endpoint that records every byte a client sends it, as
// the application would read it: decrypted when it speaks TLS. It answers
// each request with 200 and "{}".
type fakeAdmin struct {
	ln   net.Listener
	tls  *tls.Config // nil: plain TCP
	mu   sync.Mutex
	got  bytes.Buffer
	reqs int
	wg   sync.WaitGroup
}

func startFakeAdmin(t *testing.T, cert *tls.Certificate) *fakeAdmin {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeAdmin{ln: ln}
	if cert != nil {
		f.tls = &tls.Config{Certificates: []tls.Certificate{*cert}}
	}
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			f.wg.Add(1)
			go func() { defer f.wg.Done(); f.serve(c) }()
		}
	}()
	t.Cleanup(func() { ln.Close(); f.wg.Wait() })
	return f
}

func (f *fakeAdmin) serve(c net.Conn) {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if f.tls != nil {
		c = tls.Server(c, f.tls)
	}
	r := bufio.NewReader(io.TeeReader(c, f))
	for {
		req, err := http.ReadRequest(r)
		if err != nil {
			// as an HTTP server answers a TLS client hello
			_, _ = io.WriteString(c, "HTTP/1.1 400 Bad Request\r\nConnection: close\r\n\r\n")
			return
		}
		_, _ = io.Copy(io.Discard, req.Body)
		f.mu.Lock()
		f.reqs++
		f.mu.Unlock()
		_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
	}
}

func (f *fakeAdmin) Write(p []byte) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.got.Write(p)
}

func (f *fakeAdmin) received() (string, int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.got.String(), f.reqs
}

// TestAdminClientSendsNoSecret: `leasefs admin --server` given the join
// token sends the derived admin token, never the secret, and only to an
// endpoint that presents the cluster's certificate: one that speaks plain
// HTTP, or presents another certificate, gets nothing.
func TestAdminClientSendsNoSecret(t *testing.T) {
	id, err := transport.NewIdentity()
	if err != nil {
		t.Fatal(err)
	}
	tokFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokFile, []byte(id.Token()+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	secretHex := hex.EncodeToString(id.Secret[:])
	admin := id.TokenValue().Admin().String()
	leaks := func(got string) bool {
		return strings.Contains(got, secretHex) || strings.Contains(strings.ToLower(got), secretHex) ||
			strings.Contains(got, string(id.Secret[:]))
	}

	// plain HTTP and another certificate: refused before anything is sent
	other, err := transport.NewIdentity()
	if err != nil {
		t.Fatal(err)
	}
	for name, f := range map[string]*fakeAdmin{"plain": startFakeAdmin(t, nil), "other cert": startFakeAdmin(t, &other.Cert)} {
		err := runAdmin([]string{"--server", f.ln.Addr().String(), "--token-file", tokFile, "status"})
		if err == nil || !strings.Contains(err.Error(), "nothing sent") {
			t.Errorf("%s: %v, want a refusal", name, err)
		}
		got, reqs := f.received()
		if reqs != 0 || leaks(got) || strings.Contains(got, admin) || strings.Contains(got, "Authorization") {
			t.Errorf("%s: received %d requests:\n%q", name, reqs, got)
		}
	}

	// the cluster's certificate: served, with the admin token only
	good := startFakeAdmin(t, &id.Cert)
	for _, cmd := range [][]string{{"status"}, {"clients"}, {"evict", "client:0000000000000001"}, {"page"}} {
		args := append([]string{"--server", good.ln.Addr().String(), "--token-file", tokFile, "--json"}, cmd...)
		if err := runAdmin(args); err != nil {
			t.Fatalf("admin %v: %v", cmd, err)
		}
	}
	got, reqs := good.received()
	if reqs != 4 || !strings.Contains(got, "Authorization: Bearer "+admin+"\r\n") {
		t.Fatalf("%d requests, want 4 with the admin token:\n%s", reqs, got)
	}
	if leaks(got) {
		t.Fatalf("the admin client sent the cluster secret:\n%s", got)
	}

	// an admin token file works alike; a missing token file is an error
	adminFile := filepath.Join(t.TempDir(), "admin-token")
	if err := os.WriteFile(adminFile, []byte(admin+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := runAdmin([]string{"--server", good.ln.Addr().String(), "--token-file", adminFile, "--json", "status"}); err != nil {
		t.Fatalf("with the admin token file: %v", err)
	}
	if err := runAdmin([]string{"--server", good.ln.Addr().String(), "status"}); err == nil || !strings.Contains(err.Error(), "--token-file") {
		t.Errorf("without a token file: %v", err)
	}
}

// up says a loopback server serves this machine only, and how others
// mount one that listens elsewhere.
func TestUpReach(t *testing.T) {
	local := reach(&net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 4000}, "/d/token")
	if !strings.Contains(local, "this machine only") || strings.Contains(local, "--server") {
		t.Errorf("loopback: %q", local)
	}
	all := reach(&net.UDPAddr{IP: net.IPv4zero, Port: 7420}, "/d/token")
	if !strings.Contains(all, "--server THIS_HOST:7420 --token-file (a copy of) /d/token") {
		t.Errorf("all addresses: %q", all)
	}
}

func TestMountHelperArgs(t *testing.T) {
	got, fake, err := mountHelperArgs([]string{"a:1,b:1", "/mnt/x", "-o", "ro,token_file=/etc/t,_netdev,x-systemd.automount,cache_mib=64", "-n"})
	want := []string{"--background", "--server", "a:1,b:1", "--read-only", "--token-file", "/etc/t", "--cache-mib", "64", "/mnt/x"}
	if err != nil || fake || !slices.Equal(got, want) {
		t.Errorf("got %q %v %v, want %q", got, fake, err, want)
	}
	if _, fake, err := mountHelperArgs([]string{"a:1", "/m", "-f", "-otoken_file=/t"}); err != nil || !fake {
		t.Errorf("-f: fake %v, %v", fake, err)
	}
	for _, bad := range [][]string{{"a:1"}, {"a:1", "/m", "-o", "bogus=1"}, {"a:1", "/m", "-o"}, {"a:1", "/m", "-N", "ns"}} {
		if _, _, err := mountHelperArgs(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
	for argv, want := range map[string]bool{
		"/sbin/mount.fuse.leasefs a:1 /m": true, "leasefs a:1 /m -o x": true,
		"leasefs mount --server a:1 /m": false, "leasefs --version": false, "leasefs up /m": false,
	} {
		if got := isMountHelper(strings.Fields(argv)); got != want {
			t.Errorf("isMountHelper(%s) = %v", argv, got)
		}
	}
}
