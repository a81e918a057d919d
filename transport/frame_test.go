package transport

import (
	"bytes"
	"encoding/binary"
	"errors"
	"slices"
	"testing"
)

func TestFrameRoundTrip(t *testing.T) {
	h := Header{Client: 1<<63 + 5, Session: 77, Seq: 1<<40 + 3}
	big := make([]byte, 3*smallFrame)
	for i := range big {
		big[i] = byte(i * 7)
	}
	// a body written whole, or as a head and a tail (writeFrame's body
	// and tail): small and large parts, one write or several
	for _, body := range [][]byte{nil, []byte("x"), big[:smallFrame+10], big} {
		for _, split := range []int{len(body), 0, 1, len(body) / 2, smallFrame + 1} {
			if split > len(body) {
				continue
			}
			var buf bytes.Buffer
			var scratch []byte
			if err := writeFrameOldest(&buf, &scratch, kindRequest, h, h.Seq-2, body[:split], body[split:]); err != nil {
				t.Fatal(err)
			}
			raw := append([]byte(nil), buf.Bytes()...)
			f, err := parseFrame(raw)
			if err != nil || f.kind != kindRequest || f.Header != h || f.oldest != h.Seq-2 || !bytes.Equal(f.body, body) {
				t.Fatalf("parse: %v %v %v %d len %d", err, f.kind, f.Header, f.oldest, len(f.body))
			}
			var head [frameHead]byte
			f, err = readFrame(&buf, &head)
			if err != nil || f.Header != h || f.oldest != h.Seq-2 || !bytes.Equal(f.body, body) {
				t.Fatalf("read: %v", err)
			}
		}
	}
}

func TestFrameRejects(t *testing.T) {
	good := appendFrame(nil, frame{kind: kindReply, Header: Header{Seq: 1}, body: []byte("abc")})
	mod := func(f func(b []byte) []byte) []byte { return f(append([]byte(nil), good...)) }
	cases := []struct {
		name string
		in   []byte
		want error
	}{
		{"empty", nil, errFrameShort},
		{"short head", good[:10], errFrameShort},
		{"short body", good[:len(good)-1], errFrameShort},
		{"trailing", append(append([]byte(nil), good...), 0), errFrameTrail},
		{"version 1", mod(func(b []byte) []byte { b[4] = 1; return b }), errFrameVersion},
		{"version 3", mod(func(b []byte) []byte { b[4] = 3; return b }), errFrameVersion},
		{"kind 0", mod(func(b []byte) []byte { b[5] = 0; return b }), errFrameKind},
		{"kind 200", mod(func(b []byte) []byte { b[5] = 200; return b }), errFrameKind},
		{"length below fixed", mod(func(b []byte) []byte { binary.LittleEndian.PutUint32(b, 3); return b }), errFrameShort},
		{"too large", mod(func(b []byte) []byte { binary.LittleEndian.PutUint32(b, frameFixed+MaxBody+1); return b }), ErrTooLarge},
		{"huge", mod(func(b []byte) []byte { binary.LittleEndian.PutUint32(b, 0xffffffff); return b }), ErrTooLarge},
	}
	for _, c := range cases {
		if _, err := parseFrame(c.in); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
	}
	// the stream reader rejects an oversized length before allocating
	var head [frameHead]byte
	big := mod(func(b []byte) []byte { binary.LittleEndian.PutUint32(b, 0xffffffff); return b })
	if _, err := readFrame(bytes.NewReader(big), &head); !errors.Is(err, ErrTooLarge) {
		t.Errorf("readFrame huge: %v", err)
	}
	// and one over a smaller limit (a hello's) before allocating
	hello := appendHead(nil, kindHello, Header{}, 0, maxHello+1)
	if _, err := readFrameMax(bytes.NewReader(hello), &head, maxHello); !errors.Is(err, ErrTooLarge) {
		t.Errorf("readFrameMax over the limit: %v", err)
	}
	if err := writeFrame(&bytes.Buffer{}, new([]byte), kindRequest, Header{}, make([]byte, MaxBody), []byte("x")); !errors.Is(err, ErrTooLarge) {
		t.Errorf("writeFrame oversized: %v", err)
	}
}

func TestHelloCodec(t *testing.T) {
	m := hello{host: "host.example"}
	m.proof[3] = 9
	got, err := parseHello(m.append(nil))
	if err != nil || got != m {
		t.Fatalf("%v %v", got, err)
	}
	if _, err := parseHello(m.append(nil)[:40]); err == nil {
		t.Fatal("truncated hello accepted")
	}
	if _, err := parseHello(append(m.append(nil), 'x')); err == nil {
		t.Fatal("hello with trailing byte accepted")
	}
	long := hello{host: string(bytes.Repeat([]byte("h"), maxHost))}
	if b := long.append(nil); len(b) != maxHello {
		t.Fatalf("longest hello is %d bytes, maxHello %d", len(b), maxHello)
	}
	other := m.append(nil)
	other[0] = helloVersion + 1
	if _, err := parseHello(other); !errors.Is(err, ErrProtocol) {
		t.Fatalf("hello of another version: %v", err)
	}
}

// FuzzParseFrame: the decoder returns errors, never panics, and whatever it
// accepts re-encodes to the same bytes.
func FuzzParseFrame(f *testing.F) {
	f.Add(appendFrame(nil, frame{kind: kindRequest, Header: Header{Client: 1, Session: 2, Seq: 3}, body: []byte("hi")}))
	f.Add(appendFrame(nil, frame{kind: kindError, body: errorBody(errCodeVersion, "v")}))
	f.Add(appendFrame(nil, frame{kind: kindHello, body: hello{host: "h"}.append(nil)}))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 1, 4})
	f.Fuzz(func(t *testing.T, b []byte) {
		fr, err := parseFrame(b)
		if err == nil {
			if out := appendFrame(nil, fr); !bytes.Equal(out, b) {
				t.Fatalf("re-encoding differs")
			}
			var head [frameHead]byte
			fr2, err := readFrame(bytes.NewReader(b), &head)
			if err != nil || fr2.Header != fr.Header || !bytes.Equal(fr2.body, fr.body) {
				t.Fatalf("readFrame disagrees with parseFrame: %v", err)
			}
			switch fr.kind {
			case kindHello:
				parseHello(fr.body)
			case kindError:
				_ = remoteError(fr.body)
			}
		}
	})
}

// TestReadBody: a big body is reported as it arrives, a chunk at a
// time, and arrives whole.
func TestReadBody(t *testing.T) {
	body := make([]byte, 3*progressChunk+5)
	for i := range body {
		body[i] = byte(i)
	}
	var seen []int
	chunks := 0
	got, err := readBody(bytes.NewReader(body), len(body), func(partial []byte) { seen = append(seen, len(partial)) }, func() { chunks++ })
	if err != nil || !bytes.Equal(got, body) {
		t.Fatalf("body: %v", err)
	}
	if want := []int{progressChunk, 2 * progressChunk, 3 * progressChunk}; !slices.Equal(seen, want) {
		t.Fatalf("reported %v, want %v", seen, want)
	}
	if chunks != 4 {
		t.Fatalf("%d chunks read, want 4", chunks)
	}
	for _, n := range []int{0, 1, progressChunk - 1, progressChunk, progressChunk + 1, 1 << 20, pooledBodyCap, MaxBody} {
		body := bytes.Repeat([]byte{7}, n)
		got, err := readBody(bytes.NewReader(body), n, nil, nil)
		if err != nil || !bytes.Equal(got, body) {
			t.Fatalf("%d bytes: %v", n, err)
		}
	}
}

// trickle gives avail bytes, then fails; it records the most room a
// read into the body's buffer had beyond the bytes given.
type trickle struct {
	avail, given, room int
}

func (r *trickle) Read(p []byte) (int, error) {
	r.room = max(r.room, cap(p))
	if r.given == r.avail {
		return 0, errors.New("peer stalled")
	}
	n := min(len(p), r.avail-r.given)
	r.given += n
	return n, nil
}

// TestReadBodyAsItComes: a peer that announces a big body and sends
// little makes the reader allocate in proportion to what it sent, not to
// what it announced.
func TestReadBodyAsItComes(t *testing.T) {
	for _, sent := range []int{0, 10, progressChunk, 300 << 10} {
		r := &trickle{avail: sent}
		if _, err := readBody(r, MaxBody, nil, nil); err == nil {
			t.Fatalf("sent %d: no error", sent)
		}
		// the buffer is at most four times what arrived, or the first
		// chunk's (pooled: 128 KiB)
		if limit := max(4*sent, 2*progressChunk); r.room > limit {
			t.Fatalf("sent %d of %d: a buffer with %d bytes of room (limit %d)", sent, MaxBody, r.room, limit)
		}
	}
}

// TestPooledBodies: a body of 64 KiB to a megabyte or so is read into a
// pooled buffer of the smallest size that holds it, which Recycle takes
// back, and what is read into a recycled buffer
// is the new body whole; smaller and larger bodies are the heap's, and
// Recycle leaves them (and any part of a body) alone.
func TestPooledBodies(t *testing.T) {
	read := func(body []byte) []byte {
		t.Helper()
		var buf bytes.Buffer
		var scratch []byte
		if err := writeFrame(&buf, &scratch, kindRequest, Header{Seq: 1}, body, nil); err != nil {
			t.Fatal(err)
		}
		var head [frameHead]byte
		f, err := readFrame(&buf, &head)
		if err != nil || !bytes.Equal(f.body, body) {
			t.Fatalf("read %d bytes: %v", len(body), err)
		}
		// and the server's reader, as it comes, ends in the same buffer
		b, err := readBody(bytes.NewReader(body), len(body), nil, nil)
		if err != nil || !bytes.Equal(b, body) || cap(b) != cap(f.body) {
			t.Fatalf("readBody of %d bytes: buffer of %d, readFrame's %d, %v", len(body), cap(b), cap(f.body), err)
		}
		return f.body
	}
	for _, n := range []int{pooledBodyMin - 1, 2 * pooledBodyCap} {
		if b := read(make([]byte, n)); cap(b) != n {
			t.Errorf("a body of %d bytes has a buffer of %d", n, cap(b))
		}
	}
	for i, tc := range []struct{ n, size int }{
		{pooledBodyMin, 128 << 10}, {1 << 20, pooledBodyCap}, {pooledBodyCap, pooledBodyCap},
		{100 << 10, 128 << 10}, {128<<10 + 1, 256 << 10}, {300 << 10, 512 << 10}, {512 << 10, 512 << 10},
	} {
		body := bytes.Repeat([]byte{byte(i + 1)}, tc.n)
		b := read(body)
		if cap(b) != tc.size {
			t.Fatalf("a body of %d bytes has a buffer of %d, want a pooled one of %d", tc.n, cap(b), tc.size)
		}
		Recycle(b[1:]) // a part: left alone
		Recycle(b)
	}
	Recycle(nil)
	Recycle(make([]byte, 10))
}
