package transport

import (
	"context"
	"sync/atomic"
	"testing"
)

// Run: go test -run '^$' -bench . -benchmem ./transport
//
// Small calls measure per-request latency (one call at a time, loopback);
// the parallel variant measures request rate with many calls in flight;
// the 1 MiB calls measure bulk throughput in each direction.

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
		if _, err := c.Call(ctx, Header{Client: 7, Session: 1, Seq: uint64(i + 1)}, body); err != nil {
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
			if _, err := c.Call(ctx, Header{Client: 7, Session: 1, Seq: seq.Add(1)}, body); err != nil {
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
		if _, err := c.Call(ctx, Header{Client: 7, Session: 1, Seq: uint64(i + 1)}, body); err != nil {
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
		if _, err := c.Call(ctx, Header{Client: 7, Session: 1, Seq: uint64(i + 1)}, nil); err != nil {
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
			if _, err := c.Call(ctx, Header{Client: 7, Session: 1, Seq: seq.Add(1)}, body); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
