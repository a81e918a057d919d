package blocks

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strconv"

	"github.com/leasefs/leasefs/internal/ids"
)

// ID names a block: the inode whose data it holds, and a random part the
// writer chooses, so that writers never coordinate and a block written by
// a writer that then lost its lock can never collide with a later one.
type ID struct {
	Ino    ids.Ino
	Unique [16]byte
}

// NewID returns a fresh id for a block of ino.
func NewID(ino ids.Ino) ID {
	id := ID{Ino: ino}
	rand.Read(id.Unique[:]) // never fails (crypto/rand panics instead)
	return id
}

// idTextLen is the length of an ID's text: 16 hex, '/', 32 hex.
const idTextLen = 16 + 1 + 32

// String is "<ino, 16 hex>/<unique, 32 hex>", the block's key below a
// store's prefix; a listing by "<ino>/" finds one inode's blocks.
func (id ID) String() string {
	return string(id.appendText(make([]byte, 0, idTextLen)))
}

func (id ID) appendText(b []byte) []byte {
	b = fmt.Appendf(b, "%016x/", uint64(id.Ino))
	return hex.AppendEncode(b, id.Unique[:])
}

// ParseID parses an ID's String form, lower-case hex only, so that each id
// has one text (and one object key).
func ParseID(s string) (ID, error) {
	var id ID
	if len(s) != idTextLen || s[16] != '/' {
		return id, fmt.Errorf("blocks: block id %q: want <16 hex>/<32 hex>", s)
	}
	ino, err := parseInoHex(s[:16])
	if err != nil {
		return id, err
	}
	id.Ino = ino
	if !lowerHex(s[17:]) {
		return ID{}, fmt.Errorf("blocks: block id %q: not lower-case hex", s)
	}
	hex.Decode(id.Unique[:], []byte(s[17:])) // checked above
	return id, nil
}

// parseInoHex parses an inode number written as 16 lower-case hex digits.
func parseInoHex(s string) (ids.Ino, error) {
	if len(s) != 16 || !lowerHex(s) {
		return 0, fmt.Errorf("blocks: inode %q: want 16 lower-case hex digits", s)
	}
	v, err := strconv.ParseUint(s, 16, 64)
	if err != nil {
		return 0, fmt.Errorf("blocks: inode %q: %w", s, err)
	}
	return ids.Ino(v), nil
}

func lowerHex(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}
