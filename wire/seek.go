package wire

import "encoding/binary"

// OpSeek's Flags: lseek's whence values, so that they pass through as
// they come.
const (
	SeekData uint32 = 3
	SeekHole uint32 = 4
)

// AppendOffset encodes an OpSeek reply's Data: the offset found.
func AppendOffset(b []byte, off uint64) []byte { return binary.BigEndian.AppendUint64(b, off) }

// ParseOffset decodes an OpSeek reply's Data.
func ParseOffset(b []byte) (uint64, error) {
	if len(b) != 8 {
		return 0, Errf(CodeBadMessage, "seek reply of %d bytes", len(b))
	}
	return binary.BigEndian.Uint64(b), nil
}
