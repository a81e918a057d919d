// Package codec is the byte encoding that every leasefs message body uses,
// client requests (package wire) and messages between servers alike:
// fixed-width little-endian integers, length-prefixed byte strings, and a
// decoder whose every variable-length field is bounded and which returns an
// error, never panics, on any input.
package codec

import (
	"encoding/binary"
	"errors"
	"fmt"
)

var (
	ErrShort    = errors.New("wire: message truncated")
	ErrVersion  = errors.New("wire: unsupported message version")
	ErrTooLarge = errors.New("wire: field exceeds its bound")
	ErrTrailing = errors.New("wire: trailing bytes after message")
)

// Enc appends fixed-width little-endian fields to B.
type Enc struct{ B []byte }

func (e *Enc) U8(v uint8)   { e.B = append(e.B, v) }
func (e *Enc) U16(v uint16) { e.B = binary.LittleEndian.AppendUint16(e.B, v) }
func (e *Enc) U32(v uint32) { e.B = binary.LittleEndian.AppendUint32(e.B, v) }
func (e *Enc) U64(v uint64) { e.B = binary.LittleEndian.AppendUint64(e.B, v) }
func (e *Enc) I64(v int64)  { e.U64(uint64(v)) }
func (e *Enc) Bool(v bool) {
	if v {
		e.U8(1)
	} else {
		e.U8(0)
	}
}

// Bytes appends v with a u32 length before it.
func (e *Enc) Bytes(v []byte) {
	e.U32(uint32(len(v)))
	e.B = append(e.B, v...)
}

// Str appends v as Bytes does.
func (e *Enc) Str(v string) {
	e.U32(uint32(len(v)))
	e.B = append(e.B, v...)
}

// Dec reads what Enc wrote; the first error sticks and later reads return
// zero values, so parsers check Err once at the end.
type Dec struct {
	b   []byte
	err error
}

// NewDec decodes b; what it returns aliases b.
func NewDec(b []byte) Dec { return Dec{b: b} }

// Err is the first error met, if any.
func (d *Dec) Err() error { return d.err }

// Len is the number of bytes not read yet.
func (d *Dec) Len() int { return len(d.b) }

// Fail records err unless an error was recorded already.
func (d *Dec) Fail(err error) {
	if d.err == nil {
		d.err = err
	}
}

func (d *Dec) take(n int) []byte {
	if d.err != nil {
		return nil
	}
	if n < 0 || len(d.b) < n {
		d.Fail(ErrShort)
		return nil
	}
	v := d.b[:n:n]
	d.b = d.b[n:]
	return v
}

func (d *Dec) U8() uint8 {
	if v := d.take(1); v != nil {
		return v[0]
	}
	return 0
}
func (d *Dec) U16() uint16 {
	if v := d.take(2); v != nil {
		return binary.LittleEndian.Uint16(v)
	}
	return 0
}
func (d *Dec) U32() uint32 {
	if v := d.take(4); v != nil {
		return binary.LittleEndian.Uint32(v)
	}
	return 0
}
func (d *Dec) U64() uint64 {
	if v := d.take(8); v != nil {
		return binary.LittleEndian.Uint64(v)
	}
	return 0
}
func (d *Dec) I64() int64 { return int64(d.U64()) }

// Bool reads a byte that must be 0 or 1.
func (d *Dec) Bool() bool {
	switch v := d.U8(); v {
	case 0:
		return false
	case 1:
		return true
	default:
		d.Fail(fmt.Errorf("wire: bad boolean %d", v))
		return false
	}
}

// Bytes reads what Enc.Bytes wrote, at most max bytes; the result aliases
// the input.
func (d *Dec) Bytes(max int) []byte {
	n := d.U32()
	if d.err == nil && n > uint32(max) {
		d.Fail(fmt.Errorf("%w: %d > %d bytes", ErrTooLarge, n, max))
		return nil
	}
	return d.take(int(n))
}

func (d *Dec) Str(max int) string { return string(d.Bytes(max)) }

// Rest reads every byte left, at most max; the result aliases the input.
func (d *Dec) Rest(max int) []byte {
	if d.err == nil && len(d.b) > max {
		d.Fail(fmt.Errorf("%w: %d > %d bytes", ErrTooLarge, len(d.b), max))
		return nil
	}
	return d.take(len(d.b))
}

// Count reads an element count bounded by max and by the bytes left, given
// each element takes at least minSize bytes, so a lying count cannot make
// the parser allocate much.
func (d *Dec) Count(max, minSize int) int {
	n := d.U32()
	if d.err != nil {
		return 0
	}
	if n > uint32(max) || int(n)*minSize > len(d.b) {
		d.Fail(fmt.Errorf("%w: %d elements", ErrTooLarge, n))
		return 0
	}
	return int(n)
}

// Version reads a version byte, which must be want.
func (d *Dec) Version(want uint8) {
	if v := d.U8(); d.err == nil && v != want {
		d.Fail(fmt.Errorf("%w %d (want %d)", ErrVersion, v, want))
	}
}

// End is Err, or ErrTrailing if bytes are left.
func (d *Dec) End() error {
	if d.err == nil && len(d.b) != 0 {
		d.Fail(ErrTrailing)
	}
	return d.err
}
