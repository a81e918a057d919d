package transport

import (
	"encoding/binary"
	"fmt"
	"io"
	"sync"

	"github.com/leasefs/leasefs/internal/ids"
)

// Frame layout, little-endian like package wire:
//
//	u32 length   bytes after this field: frameFixed + len(body)
//	u8  version  frameVersion
//	u8  kind
//	u64 client, u64 session, u64 seq
//	u64 oldest   requests: the oldest seq the client still waits for
//	             (any session); 0 on other frames
//	body
//
// Version 2 added oldest (and the hello's own version byte).
const (
	frameVersion = 2
	frameFixed   = 2 + 4*8
	frameHead    = 4 + frameFixed
	// MaxBody bounds a request, reply or callback body: a 4 MiB data chunk
	// plus room for the wire message around it.
	MaxBody = 4<<20 + 64<<10
)

type kind uint8

const (
	kindHello         kind = 1 // client → server, first stream: proof of the secret
	kindHelloOK       kind = 2
	kindRefused       kind = 3 // body: reason
	kindRequest       kind = 4
	kindReply         kind = 5
	kindCallback      kind = 6 // server → client
	kindCallbackReply kind = 7
	kindError         kind = 8 // body: u8 errCode, then a message; the transport, not the application, answered
)

func (k kind) String() string {
	switch k {
	case kindHello:
		return "hello"
	case kindHelloOK:
		return "hello-ok"
	case kindRefused:
		return "refused"
	case kindRequest:
		return "request"
	case kindReply:
		return "reply"
	case kindCallback:
		return "callback"
	case kindCallbackReply:
		return "callback-reply"
	case kindError:
		return "error"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// errCode says why the transport answered a request with kindError.
type errCode uint8

const (
	errCodeMalformed errCode = 1
	errCodeVersion   errCode = 2
	errCodeTooLarge  errCode = 3
	errCodeEvicted   errCode = 4 // the reply to this seq is no longer cached
	errCodeShutdown  errCode = 5
	errCodeBusy      errCode = 6 // no room for the body or the connection now: send again later
)

// Frame errors are protocol errors: retrying cannot fix them.
var (
	errFrameShort   = fmt.Errorf("%w: frame truncated", ErrProtocol)
	errFrameVersion = fmt.Errorf("%w: unsupported frame version", ErrProtocol)
	errFrameKind    = fmt.Errorf("%w: unknown frame kind", ErrProtocol)
	errFrameTrail   = fmt.Errorf("%w: trailing bytes after frame", ErrProtocol)
)

type frame struct {
	kind kind
	Header
	oldest uint64
	body   []byte
}

// appendHead appends a frame's length, version, kind and header for a body of
// bodyLen bytes; the body follows.
func appendHead(dst []byte, k kind, h Header, oldest uint64, bodyLen int) []byte {
	dst = binary.LittleEndian.AppendUint32(dst, uint32(frameFixed+bodyLen))
	dst = append(dst, frameVersion, byte(k))
	dst = binary.LittleEndian.AppendUint64(dst, uint64(h.Client))
	dst = binary.LittleEndian.AppendUint64(dst, uint64(h.Session))
	dst = binary.LittleEndian.AppendUint64(dst, h.Seq)
	dst = binary.LittleEndian.AppendUint64(dst, oldest)
	return dst
}

func appendFrame(dst []byte, f frame) []byte {
	return append(appendHead(dst, f.kind, f.Header, f.oldest, len(f.body)), f.body...)
}

// parseHead checks the fixed part of a frame and returns it with the body
// length (body left nil). It rejects an unknown version before looking at
// anything else so that a future peer gets a clear error rather than
// misparsed fields, and a body over max (at most MaxBody) before anything
// is allocated for it.
func parseHead(b *[frameHead]byte, max int) (frame, int, error) {
	n := binary.LittleEndian.Uint32(b[0:4])
	if v := b[4]; v != frameVersion {
		return frame{}, 0, fmt.Errorf("%w %d (want %d)", errFrameVersion, v, frameVersion)
	}
	if n < frameFixed {
		return frame{}, 0, fmt.Errorf("%w: length %d", errFrameShort, n)
	}
	if int64(n-frameFixed) > int64(max) {
		return frame{}, 0, fmt.Errorf("%w: body of %d bytes (max %d)", ErrTooLarge, n-frameFixed, max)
	}
	k := kind(b[5])
	if k < kindHello || k > kindError {
		return frame{}, 0, fmt.Errorf("%w %d", errFrameKind, b[5])
	}
	f := frame{kind: k, Header: Header{
		Client:  ids.ClientID(binary.LittleEndian.Uint64(b[6:14])),
		Session: ids.SessionID(binary.LittleEndian.Uint64(b[14:22])),
		Seq:     binary.LittleEndian.Uint64(b[22:30]),
	}, oldest: binary.LittleEndian.Uint64(b[30:38])}
	return f, int(n - frameFixed), nil
}

// parseFrame parses exactly one frame from b.
func parseFrame(b []byte) (frame, error) {
	if len(b) < frameHead {
		return frame{}, errFrameShort
	}
	f, n, err := parseHead((*[frameHead]byte)(b[:frameHead]), MaxBody)
	if err != nil {
		return frame{}, err
	}
	rest := b[frameHead:]
	if len(rest) < n {
		return frame{}, errFrameShort
	}
	if len(rest) > n {
		return frame{}, errFrameTrail
	}
	f.body = rest[:n:n]
	return f, nil
}

// readFrame reads one frame of any body size up to MaxBody (a reply or a
// callback from the server, which the client trusts). head is scratch
// space owned by the caller's stream so the fixed part costs no
// allocation; the body is freshly allocated (or pooled: Buffer) and owned
// by the caller.
func readFrame(r io.Reader, head *[frameHead]byte) (frame, error) {
	return readFrameMax(r, head, MaxBody)
}

// readFrameMax is readFrame of a body of at most max bytes: the frame is
// refused before anything is allocated for a bigger one.
func readFrameMax(r io.Reader, head *[frameHead]byte, max int) (frame, error) {
	f, n, err := readHead(r, head, max)
	if err != nil {
		return frame{}, err
	}
	if n > 0 {
		f.body = Buffer(n)
		if _, err := io.ReadFull(r, f.body); err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return frame{}, err
		}
	}
	return f, nil
}

// readHead reads and checks a frame's fixed part; the body, n bytes,
// follows in r.
func readHead(r io.Reader, head *[frameHead]byte, max int) (frame, int, error) {
	if _, err := io.ReadFull(r, head[:]); err != nil {
		return frame{}, 0, err
	}
	return parseHead(head, max)
}

// progressChunk is how much of a big body arrives between two calls of
// readBody's progress.
const progressChunk = 64 << 10

// readBody reads a body of n bytes as it arrives: into a buffer of at
// most progressChunk first, grown (fourfold, then to n) only once the
// bytes before have come, so that a peer announcing a big body and
// sending little holds little memory. Growing costs a copy of a third of
// a megabyte body. progress (unless nil) gets the body read so far each
// time another progressChunk arrived: a megabyte request can take longer
// than a revocation's delivery timeout on a slow link, and the server
// counts its arrival as the client's progress. chunk, if set, is called
// before each read (the server sets a stall deadline there).
func readBody(r io.Reader, n int, progress func(body []byte), chunk func()) ([]byte, error) {
	if n == 0 {
		return nil, nil
	}
	buf := Buffer(min(n, progressChunk))
	for got := 0; got < n; {
		if got == len(buf) {
			next := 4 * len(buf)
			if 2*next >= n {
				next = n
			}
			nb := Buffer(next)
			copy(nb, buf)
			Recycle(buf)
			buf = nb
		}
		end := min(len(buf), got+progressChunk)
		if chunk != nil {
			chunk()
		}
		if _, err := io.ReadFull(r, buf[got:end]); err != nil {
			Recycle(buf)
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return nil, err
		}
		if got = end; got < n && progress != nil {
			progress(buf[:got])
		}
	}
	return buf, nil
}

// Bodies from pooledBodyMin up to pooledBodyCap bytes (a megabyte of file
// data and the message around it) are read into pooled buffers, as fresh
// memory costs a page fault per 4 KiB on first touch. Whoever owns such a
// body and is done with it gives it back with Recycle. The buffers come
// in a few sizes, each at most twice its bodies, so that a small body not
// given back does not cost a megabyte buffer to clear.
const (
	pooledBodyMin = 64 << 10
	pooledBodyCap = 1<<20 + 64<<10
)

var bodySizes = [...]int{128 << 10, 256 << 10, 512 << 10, pooledBodyCap}

var bodyPools [len(bodySizes)]sync.Pool

// bodySize returns the index of the smallest buffer size that holds n
// bytes, or -1 past the largest.
func bodySize(n int) int {
	for i, c := range bodySizes {
		if n <= c {
			return i
		}
	}
	return -1
}

// Buffer returns n bytes to read a body into or to build one in (contents
// undefined), pooled for the sizes the pool keeps; Recycle gives it back.
func Buffer(n int) []byte {
	i := bodySize(n)
	if n < pooledBodyMin || i < 0 {
		return make([]byte, n)
	}
	if b, ok := bodyPools[i].Get().(*[]byte); ok {
		return (*b)[:n]
	}
	return make([]byte, n, bodySizes[i])
}

// Recycle gives back a body the transport returned (a request's, a
// reply's or a callback's, whole as it came), once nothing refers to any
// part of it any more. Other slices are left to the garbage collector.
func Recycle(body []byte) {
	i := bodySize(cap(body))
	if i < 0 || cap(body) != bodySizes[i] || len(body) < pooledBodyMin {
		return
	}
	b := body[:cap(body)]
	bodyPools[i].Put(&b)
}

// smallFrame is the body size up to which a frame is copied into one buffer
// and written at once; bigger bodies are written in place after the head.
const smallFrame = 16 << 10

// writeFrame writes one frame whose body is body followed by tail (none:
// nil); scratch is reusable space owned by the caller.
func writeFrame(w io.Writer, scratch *[]byte, k kind, h Header, body, tail []byte) error {
	return writeFrameOldest(w, scratch, k, h, 0, body, tail)
}

// writeFrameOldest is writeFrame with the frame's oldest field (requests).
func writeFrameOldest(w io.Writer, scratch *[]byte, k kind, h Header, oldest uint64, body, tail []byte) error {
	n := len(body) + len(tail)
	if n > MaxBody {
		return ErrTooLarge
	}
	buf := appendHead((*scratch)[:0], k, h, oldest, n)
	if n <= smallFrame {
		buf = append(append(buf, body...), tail...)
		*scratch = buf
		_, err := w.Write(buf)
		return err
	}
	if len(body) <= smallFrame {
		buf = append(buf, body...)
		body = nil
	}
	*scratch = buf
	for _, b := range [][]byte{buf, body, tail} {
		if len(b) == 0 {
			continue
		}
		if _, err := w.Write(b); err != nil {
			return err
		}
	}
	return nil
}

func errorBody(c errCode, msg string) []byte {
	return append([]byte{byte(c)}, msg...)
}

// remoteError turns a kindError body into an error for the caller.
func remoteError(body []byte) error {
	if len(body) == 0 {
		return fmt.Errorf("%w: empty error frame", ErrProtocol)
	}
	msg := string(body[1:])
	switch errCode(body[0]) {
	case errCodeTooLarge:
		return fmt.Errorf("%w (server: %s)", ErrTooLarge, msg)
	case errCodeEvicted:
		return fmt.Errorf("%w (server: %s)", ErrReplyEvicted, msg)
	case errCodeShutdown:
		return fmt.Errorf("%w (server: %s)", errServerShutdown, msg)
	case errCodeBusy:
		return fmt.Errorf("%w (server: %s)", ErrBusy, msg)
	}
	return fmt.Errorf("%w (server: %s)", ErrProtocol, msg)
}

// hello is the body of kindHello: the proof of the secret and the name the
// client announces. Layout: u8 helloVersion, [32]proof, u8 len, host.
type hello struct {
	proof [32]byte
	host  string
}

const (
	helloVersion = 1
	maxHost      = 255
	// maxHello is the largest hello body: the server reads no more from
	// a peer that has not proven the secret yet.
	maxHello = 1 + 32 + 1 + maxHost
)

func (m hello) append(dst []byte) []byte {
	dst = append(dst, helloVersion)
	dst = append(dst, m.proof[:]...)
	dst = append(dst, byte(len(m.host)))
	return append(dst, m.host...)
}

func parseHello(b []byte) (hello, error) {
	var m hello
	if len(b) < 1+33 {
		return m, errFrameShort
	}
	if b[0] != helloVersion {
		return m, fmt.Errorf("%w: hello version %d (want %d)", ErrProtocol, b[0], helloVersion)
	}
	b = b[1:]
	copy(m.proof[:], b)
	n := int(b[32])
	if len(b) != 33+n {
		return m, fmt.Errorf("%w: hello host length", ErrProtocol)
	}
	m.host = string(b[33:])
	return m, nil
}
