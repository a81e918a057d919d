// Package testnet gives tests loopback addresses they can listen on again
// after stopping the server that had them.
package testnet

import (
	"io"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
)

// UDPAddr returns a free loopback UDP address (a QUIC server's) whose port
// lies below the kernel's ephemeral range. Tests stop servers and start
// them again on the same address; a port from the ephemeral range is soon
// handed to some other socket that dials out (a client of the same test,
// or of another test binary running beside it), and the restart then
// fails with "bind: address already in use".
func UDPAddr(t testing.TB) string {
	t.Helper()
	return freeAddr(t, func(addr string) (io.Closer, error) { return net.ListenPacket("udp", addr) })
}

// TCPAddr is UDPAddr for a TCP listener (an admin endpoint's).
func TCPAddr(t testing.TB) string {
	t.Helper()
	return freeAddr(t, func(addr string) (io.Closer, error) { return net.Listen("tcp", addr) })
}

func freeAddr(t testing.TB, listen func(string) (io.Closer, error)) string {
	t.Helper()
	lo := ephemeralLow()
	base := 10000
	if lo < base+1000 {
		base = 1024
	}
	for range 1000 {
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(base+rand.IntN(lo-base)))
		l, err := listen(addr)
		if err != nil {
			continue
		}
		l.Close()
		return addr
	}
	t.Fatalf("no free port in [%d, %d)", base, lo)
	return ""
}

// ephemeralLow is the first port of the kernel's ephemeral range.
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if lo, err := strconv.Atoi(f[0]); err == nil && lo > 1024 {
				return lo
			}
		}
	}
	return 32768 // Linux's default
}
