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
//	body
const (
	frameVersion = 1
	frameFixed   = 2 + 3*8
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
	body []byte
}

// appendHead appends a frame's length, version, kind and header for a body of
// bodyLen bytes; the body follows.
func appendHead(dst []byte, k kind, h Header, bodyLen int) []byte {
	dst = binary.LittleEndian.AppendUint32(dst, uint32(frameFixed+bodyLen))
	dst = append(dst, frameVersion, byte(k))
	dst = binary.LittleEndian.AppendUint64(dst, uint64(h.Client))
	dst = binary.LittleEndian.AppendUint64(dst, uint64(h.Session))
	dst = binary.LittleEndian.AppendUint64(dst, h.Seq)
	return dst
}

func appendFrame(dst []byte, f frame) []byte {
	return append(appendHead(dst, f.kind, f.Header, len(f.body)), f.body...)
}

// parseHead checks the fixed part of a frame and returns the body length. It
// rejects an unknown version before looking at anything else so that a future
// peer gets a clear error rather than misparsed fields.
func parseHead(b *[frameHead]byte) (kind, Header, int, error) {
	n := binary.LittleEndian.Uint32(b[0:4])
	if v := b[4]; v != frameVersion {
		return 0, Header{}, 0, fmt.Errorf("%w %d (want %d)", errFrameVersion, v, frameVersion)
	}
	if n < frameFixed {
		return 0, Header{}, 0, fmt.Errorf("%w: length %d", errFrameShort, n)
	}
	if n-frameFixed > MaxBody {
		return 0, Header{}, 0, fmt.Errorf("%w: body of %d bytes (max %d)", ErrTooLarge, n-frameFixed, MaxBody)
	}
	k := kind(b[5])
	if k < kindHello || k > kindError {
		return 0, Header{}, 0, fmt.Errorf("%w %d", errFrameKind, b[5])
	}
	h := Header{
		Client:  ids.ClientID(binary.LittleEndian.Uint64(b[6:14])),
		Session: ids.SessionID(binary.LittleEndian.Uint64(b[14:22])),
		Seq:     binary.LittleEndian.Uint64(b[22:30]),
	}
	return k, h, int(n - frameFixed), nil
}

// parseFrame parses exactly one frame from b.
func parseFrame(b []byte) (frame, error) {
	if len(b) < frameHead {
		return frame{}, errFrameShort
	}
	k, h, n, err := parseHead((*[frameHead]byte)(b[:frameHead]))
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
	return frame{kind: k, Header: h, body: rest[:n:n]}, nil
}

// readFrame reads one frame. head is scratch space owned by the caller's
// stream so the fixed part costs no allocation; the body is freshly allocated
// and owned by the caller.
func readFrame(r io.Reader, head *[frameHead]byte) (frame, error) {
	return readFrameReporting(r, head, nil)
}

// progressChunk is how much of a big body arrives between two calls of
// readFrameReporting's progress.
const progressChunk = 64 << 10

// readFrameReporting is readFrame that calls progress (unless nil) with
// the body read so far, each time another progressChunk bytes of a big
// body arrived: a megabyte request can take longer than a revocation's
// delivery timeout on a slow link, and the server counts its arrival as
// the client's progress.
func readFrameReporting(r io.Reader, head *[frameHead]byte, progress func(body []byte)) (frame, error) {
	if _, err := io.ReadFull(r, head[:]); err != nil {
		return frame{}, err
	}
	k, h, n, err := parseHead(head)
	if err != nil {
		return frame{}, err
	}
	var body []byte
	if n > 0 {
		body = Buffer(n)
		for got := 0; got < n; {
			end := n
			if progress != nil {
				end = min(n, got+progressChunk)
			}
			if _, err := io.ReadFull(r, body[got:end]); err != nil {
				if err == io.EOF {
					err = io.ErrUnexpectedEOF
				}
				return frame{}, err
			}
			if got = end; got < n && progress != nil {
				progress(body[:got])
			}
		}
	}
	return frame{kind: k, Header: h, body: body}, nil
}

// Bodies from pooledBodyMin up to pooledBodyCap bytes (a megabyte of file
// data and the message around it) are read into pooled buffers: fresh
// memory costs a page fault per 4 KiB on first touch: the copy of a
// write's data out of QUIC was a quarter of the server's profile in a
// sequential write. Whoever owns such a body and is done with it gives it
// back with Recycle. The buffers come in a few sizes, each at most twice
// its bodies: a batch of small files' writes (tens of KiB) in a megabyte
// buffer cost the server a megabyte to clear each time it was not given
// back.
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
	n := len(body) + len(tail)
	if n > MaxBody {
		return ErrTooLarge
	}
	buf := appendHead((*scratch)[:0], k, h, n)
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
	}
	return fmt.Errorf("%w (server: %s)", ErrProtocol, msg)
}

// hello is the body of kindHello: the proof of the secret and the name the
// client announces.
type hello struct {
	proof [32]byte
	host  string
}

const maxHost = 255

func (m hello) append(dst []byte) []byte {
	dst = append(dst, m.proof[:]...)
	dst = append(dst, byte(len(m.host)))
	return append(dst, m.host...)
}

func parseHello(b []byte) (hello, error) {
	var m hello
	if len(b) < 33 {
		return m, errFrameShort
	}
	copy(m.proof[:], b)
	n := int(b[32])
	if len(b) != 33+n {
		return m, fmt.Errorf("%w: hello host length", ErrProtocol)
	}
	m.host = string(b[33:])
	return m, nil
}
