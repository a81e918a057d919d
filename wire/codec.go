// Package wire defines the bodies of leasefs requests and replies and their
// encoding. The transport frames them; this package gives them meaning.
// Every body starts with a version byte; every variable-length field is
// bounded, and Parse returns an error, never panics, on any input.
package wire

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Version is the body encoding version. A peer with another version gets
// ErrVersion and a clear message instead of garbage.
const Version = 5

// Bounds on variable-length fields.
const (
	MaxName    = 1024 // longer than NAME_MAX so the server can answer ENAMETOOLONG itself
	MaxPath    = 4096
	MaxData    = 4 << 20
	MaxEntries = 4096
	MaxXattr   = 64 << 10
	MaxList    = 64 << 10
	MaxSpans   = 1024    // ranges of one vectored write
	MaxOpens   = 1 << 20 // handles of one file a client reports at once
	// MaxFileSize is the largest file size a server takes; a mount refuses
	// a write, truncation or allocation past it at once (EFBIG), as it
	// would fail only when buffered writes were flushed.
	MaxFileSize = 1 << 60
)

var (
	ErrShort    = errors.New("wire: message truncated")
	ErrVersion  = errors.New("wire: unsupported message version")
	ErrTooLarge = errors.New("wire: field exceeds its bound")
	ErrTrailing = errors.New("wire: trailing bytes after message")
	ErrUnknown  = errors.New("wire: unknown operation")
	ErrBadSpans = errors.New("wire: bad write spans")
)

// enc appends fixed-width little-endian fields.
type enc struct{ b []byte }

func (e *enc) u8(v uint8)   { e.b = append(e.b, v) }
func (e *enc) u16(v uint16) { e.b = binary.LittleEndian.AppendUint16(e.b, v) }
func (e *enc) u32(v uint32) { e.b = binary.LittleEndian.AppendUint32(e.b, v) }
func (e *enc) u64(v uint64) { e.b = binary.LittleEndian.AppendUint64(e.b, v) }
func (e *enc) i64(v int64)  { e.u64(uint64(v)) }
func (e *enc) bool(v bool) {
	if v {
		e.u8(1)
	} else {
		e.u8(0)
	}
}
func (e *enc) bytes(v []byte) {
	e.u32(uint32(len(v)))
	e.b = append(e.b, v...)
}
func (e *enc) str(v string) {
	e.u32(uint32(len(v)))
	e.b = append(e.b, v...)
}

// dec reads what enc wrote; the first error sticks and later reads return
// zero values, so parsers check err once at the end.
type dec struct {
	b   []byte
	err error
}

func (d *dec) fail(err error) {
	if d.err == nil {
		d.err = err
	}
}

func (d *dec) take(n int) []byte {
	if d.err != nil {
		return nil
	}
	if n < 0 || len(d.b) < n {
		d.fail(ErrShort)
		return nil
	}
	v := d.b[:n:n]
	d.b = d.b[n:]
	return v
}

func (d *dec) u8() uint8 {
	if v := d.take(1); v != nil {
		return v[0]
	}
	return 0
}
func (d *dec) u16() uint16 {
	if v := d.take(2); v != nil {
		return binary.LittleEndian.Uint16(v)
	}
	return 0
}
func (d *dec) u32() uint32 {
	if v := d.take(4); v != nil {
		return binary.LittleEndian.Uint32(v)
	}
	return 0
}
func (d *dec) u64() uint64 {
	if v := d.take(8); v != nil {
		return binary.LittleEndian.Uint64(v)
	}
	return 0
}
func (d *dec) i64() int64 { return int64(d.u64()) }

func (d *dec) bool() bool {
	switch v := d.u8(); v {
	case 0:
		return false
	case 1:
		return true
	default:
		d.fail(fmt.Errorf("wire: bad boolean %d", v))
		return false
	}
}

func (d *dec) bytes(max int) []byte {
	n := d.u32()
	if d.err == nil && n > uint32(max) {
		d.fail(fmt.Errorf("%w: %d > %d bytes", ErrTooLarge, n, max))
		return nil
	}
	return d.take(int(n))
}

func (d *dec) str(max int) string { return string(d.bytes(max)) }

// count reads a element count bounded by max and by the bytes left, given
// each element takes at least minSize bytes, so a lying count cannot make
// the parser allocate much.
func (d *dec) count(max, minSize int) int {
	n := d.u32()
	if d.err != nil {
		return 0
	}
	if n > uint32(max) || int(n)*minSize > len(d.b) {
		d.fail(fmt.Errorf("%w: %d elements", ErrTooLarge, n))
		return 0
	}
	return int(n)
}

func (d *dec) version() {
	if v := d.u8(); d.err == nil && v != Version {
		d.fail(fmt.Errorf("%w %d (want %d)", ErrVersion, v, Version))
	}
}

func (d *dec) end() error {
	if d.err == nil && len(d.b) != 0 {
		d.fail(ErrTrailing)
	}
	return d.err
}
