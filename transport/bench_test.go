package transport

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"sync/atomic"
	"testing"

	"github.com/quic-go/quic-go"
)

// Run: go test -run '^$' -bench . -benchmem ./transport
//
// Small calls measure per-request latency (one call at a time, loopback);
// the parallel variant measures request rate with many calls in flight;
// the 1 MiB calls measure bulk throughput in each direction;
// BenchmarkQUICStream is quic-go's own ceiling, without our framing.

func benchPair(b *testing.B, h Handler) *Client {
	s := listen(b, ServerConfig{}, h)
	c := client(b, s.Addr().String(), ClientConfig{})
	if err := c.Dial(context.Background()); err != nil {
		b.Fatal(err)
	}
	return c
}

func BenchmarkCallSmall(b *testing.B) {
	reply := make([]byte, 64)
	c := benchPair(b, func(context.Context, *Request) []byte { return reply })
	body := make([]byte, 64)
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		if _, err := c.Call(ctx, Header{Client: cid, Session: 1, Seq: uint64(i + 1)}, body); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkCallSmallParallel(b *testing.B) {
	reply := make([]byte, 64)
	c := benchPair(b, func(context.Context, *Request) []byte { return reply })
	var seq atomic.Uint64
	ctx := context.Background()
	b.ReportAllocs()
	b.SetParallelism(8)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		body := make([]byte, 64)
		for pb.Next() {
			if _, err := c.Call(ctx, Header{Client: cid, Session: 1, Seq: seq.Add(1)}, body); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkCall1MiBWrite sends 1 MiB requests with small replies (writes).
func BenchmarkCall1MiBWrite(b *testing.B) {
	c := benchPair(b, func(context.Context, *Request) []byte { return []byte("ok") })
	body := make([]byte, 1<<20)
	ctx := context.Background()
	b.SetBytes(1 << 20)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		if _, err := c.Call(ctx, Header{Client: cid, Session: 1, Seq: uint64(i + 1)}, body); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCall1MiBRead sends small requests with 1 MiB replies (reads).
func BenchmarkCall1MiBRead(b *testing.B) {
	reply := make([]byte, 1<<20)
	c := benchPair(b, func(context.Context, *Request) []byte { return reply })
	ctx := context.Background()
	b.SetBytes(1 << 20)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		if _, err := c.Call(ctx, Header{Client: cid, Session: 1, Seq: uint64(i + 1)}, nil); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCall1MiBWriteParallel: 4 writers in flight, as a flushing client does.
func BenchmarkCall1MiBWriteParallel(b *testing.B) {
	c := benchPair(b, func(context.Context, *Request) []byte { return []byte("ok") })
	var seq atomic.Uint64
	ctx := context.Background()
	b.SetBytes(1 << 20)
	b.ReportAllocs()
	b.SetParallelism(2) // 2 × GOMAXPROCS(2) = 4 goroutines
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		body := make([]byte, 1<<20)
		for pb.Next() {
			if _, err := c.Call(ctx, Header{Client: cid, Session: 1, Seq: seq.Add(1)}, body); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkQUICStream streams b.N MiB over one bare quic-go stream on
// loopback, with the transport's QUIC settings and no framing, reply cache
// or handler: the most any request over quic-go can move here, to compare
// with BenchmarkCall1MiBRead and with a cold read through the mount.
func BenchmarkQUICStream(b *testing.B) {
	id := identity(b)
	ln, err := quic.ListenAddr("127.0.0.1:0", &tls.Config{
		Certificates: []tls.Certificate{id.Cert}, NextProtos: []string{alpn}, MinVersion: tls.VersionTLS13,
	}, quicConfig(maxStreams))
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	ctx := context.Background()
	chunk := make([]byte, 1<<20)
	sent := make(chan error, 1)
	go func() {
		qc, err := ln.Accept(ctx)
		if err != nil {
			sent <- err
			return
		}
		st, err := qc.AcceptStream(ctx)
		if err != nil {
			sent <- err
			return
		}
		var n [1]byte
		if _, err := io.ReadFull(st, n[:]); err != nil {
			sent <- err
			return
		}
		for range b.N {
			if _, err := st.Write(chunk); err != nil {
				sent <- err
				return
			}
		}
		sent <- st.Close()
	}()
	qc, err := quic.DialAddr(ctx, ln.Addr().(*net.UDPAddr).String(), &tls.Config{
		InsecureSkipVerify: true, NextProtos: []string{alpn}, MinVersion: tls.VersionTLS13,
	}, quicConfig(maxStreams))
	if err != nil {
		b.Fatal(err)
	}
	defer qc.CloseWithError(0, "")
	st, err := qc.OpenStreamSync(ctx)
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(1 << 20)
	b.ReportAllocs()
	b.ResetTimer()
	if _, err := st.Write([]byte{1}); err != nil { // the server accepts a stream once it has data
		b.Fatal(err)
	}
	got, err := io.CopyBuffer(io.Discard, st, make([]byte, 1<<20))
	if err != nil || got != int64(b.N)<<20 {
		b.Fatalf("read %d bytes, want %d: %v", got, int64(b.N)<<20, err)
	}
	b.StopTimer()
	if err := <-sent; err != nil {
		b.Fatal(err)
	}
}
