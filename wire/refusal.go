package wire

import (
	"errors"
	"fmt"
)

// A server refuses a request body of another encoding version with a
// refusal: a body whose version byte is refusalVersion (never a real
// version) followed by a message, which a peer of any version can read.
// The message names the server's build and both versions, so that a mount
// and a server of different releases say what each runs instead of
// failing on garbage.

const refusalVersion = 0

// maxRefusal bounds a refusal's message.
const maxRefusal = 1024

// ErrRefused is a refusal's error; its text carries the server's message.
var ErrRefused = errors.New("refused by the server")

// Refusal encodes a refusal with msg.
func Refusal(msg string) []byte {
	return append([]byte{refusalVersion}, msg[:min(len(msg), maxRefusal)]...)
}

// BodyVersion is the encoding version a body says it is in (0: a
// refusal, or an empty body).
func BodyVersion(b []byte) uint8 {
	if len(b) == 0 {
		return refusalVersion
	}
	return b[0]
}

// refused returns the error of a refusal body, or nil for any other.
func refused(b []byte) error {
	if len(b) == 0 || b[0] != refusalVersion {
		return nil
	}
	return fmt.Errorf("%w: %s", ErrRefused, b[1:min(len(b), 1+maxRefusal)])
}
