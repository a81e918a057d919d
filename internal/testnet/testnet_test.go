package testnet

import (
	"net"
	"strconv"
	"testing"
)

func TestAddrsBelowEphemeralRange(t *testing.T) {
	lo := ephemeralLow()
	for _, addr := range []string{UDPAddr(t), TCPAddr(t)} {
		_, p, err := net.SplitHostPort(addr)
		if err != nil {
			t.Fatal(err)
		}
		if port, _ := strconv.Atoi(p); port <= 0 || port >= lo {
			t.Fatalf("%s: port not below the ephemeral range [%d, ...)", addr, lo)
		}
	}
	pc, err := net.ListenPacket("udp", UDPAddr(t))
	if err != nil {
		t.Fatalf("the address given is not free: %v", err)
	}
	pc.Close()
}
