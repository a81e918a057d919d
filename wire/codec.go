// Package wire defines the bodies of leasefs requests and replies and their
// encoding. The transport frames them; this package gives them meaning.
// Every body starts with a version byte; every variable-length field is
// bounded, and Parse returns an error, never panics, on any input.
package wire

import (
	"errors"

	"github.com/leasefs/leasefs/internal/codec"
)

// Version is the body encoding version. A peer with another version gets
// ErrVersion and a clear message instead of garbage.
const Version = 7

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
	ErrShort    = codec.ErrShort
	ErrVersion  = codec.ErrVersion
	ErrTooLarge = codec.ErrTooLarge
	ErrTrailing = codec.ErrTrailing
	ErrUnknown  = errors.New("wire: unknown operation")
	ErrBadSpans = errors.New("wire: bad write spans")
)

// enc and dec are the shared codec, with this package's fields added
// (attributes, POSIX locks) as methods.
type enc struct{ codec.Enc }
type dec struct{ codec.Dec }

func newEnc(b []byte) enc { return enc{codec.Enc{B: b}} }
func newDec(b []byte) dec { return dec{codec.NewDec(b)} }

func (d *dec) version() { d.Version(Version) }
