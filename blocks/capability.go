package blocks

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/leasefs/leasefs/internal/ids"
)

// Op is what a capability allows.
type Op uint8

const (
	OpRead  Op = 1
	OpWrite Op = 2
)

func (o Op) String() string {
	switch o {
	case OpRead:
		return "read"
	case OpWrite:
		return "write"
	}
	return fmt.Sprintf("op(%d)", uint8(o))
}

// Capability allows one operation on one block until Expiry, as an S3
// presigned URL does. The owner of the inode issues it to a mount under a
// lock, expiring no later than that lock's lease allows; the block server
// checks it on each request and knows nothing of locks.
//
// Expiry is wall-clock time because the issuer and the checker are
// different servers; the issuer must leave a margin for the clocks' skew
// (a capability is a bound on the damage, the fenced map commit is what
// keeps a late writer's blocks unreferenced).
type Capability struct {
	Op     Op
	ID     ID
	Expiry time.Time
}

const (
	// capVersion 2: expiry in milliseconds; in whole seconds a lease
	// shorter than one (τ is 500 ms in the cluster tests) could give
	// capabilities expired when issued.
	capVersion = 2
	// capBody is version, op, ino, unique, expiry (unix milliseconds).
	capBody = 1 + 1 + 8 + 16 + 8
	capLen  = capBody + sha256.Size
)

// CapabilityHeader is the request header that carries a capability.
const CapabilityHeader = "Leasefs-Capability"

// Signer signs and checks capabilities with an HMAC-SHA256 key that every
// server of the cluster derives from the cluster secret; how is the
// caller's business. Safe for concurrent use.
type Signer struct {
	key []byte
	now func() time.Time
}

// NewSigner returns a signer under key (at least 16 bytes). now is the
// clock expiries are checked against; nil means time.Now.
func NewSigner(key []byte, now func() time.Time) (*Signer, error) {
	if len(key) < 16 {
		return nil, errors.New("blocks: capability key shorter than 16 bytes")
	}
	if now == nil {
		now = time.Now
	}
	return &Signer{key: append([]byte(nil), key...), now: now}, nil
}

// Sign returns c as a string to carry in CapabilityHeader.
func (s *Signer) Sign(c Capability) string {
	b := make([]byte, capBody, capLen)
	b[0] = capVersion
	b[1] = byte(c.Op)
	binary.BigEndian.PutUint64(b[2:], uint64(c.ID.Ino))
	copy(b[10:26], c.ID.Unique[:])
	binary.BigEndian.PutUint64(b[26:], uint64(c.Expiry.UnixMilli()))
	b = s.mac(b)
	return base64.RawURLEncoding.EncodeToString(b)
}

func (s *Signer) mac(b []byte) []byte {
	m := hmac.New(sha256.New, s.key)
	m.Write(b)
	return m.Sum(b)
}

// ParseCapability decodes a signed capability without checking its
// signature: what Check does first, and what a log may print.
func ParseCapability(text string) (Capability, error) {
	b, err := decodeCapability(text)
	if err != nil {
		return Capability{}, err
	}
	return capabilityOf(b), nil
}

func decodeCapability(text string) ([]byte, error) {
	if base64.RawURLEncoding.DecodedLen(len(text)) != capLen {
		return nil, fmt.Errorf("blocks: capability: %d characters: %w", len(text), ErrDenied)
	}
	b, err := base64.RawURLEncoding.Strict().DecodeString(text)
	if err != nil || len(b) != capLen || b[0] != capVersion {
		return nil, fmt.Errorf("blocks: capability: malformed: %w", ErrDenied)
	}
	return b, nil
}

func capabilityOf(b []byte) Capability {
	c := Capability{Op: Op(b[1])}
	c.ID.Ino = ids.Ino(binary.BigEndian.Uint64(b[2:]))
	copy(c.ID.Unique[:], b[10:26])
	c.Expiry = time.UnixMilli(int64(binary.BigEndian.Uint64(b[26:])))
	return c
}

// Check returns nil if text is a capability this signer made for op on id
// that has not expired, and an error wrapping ErrDenied otherwise.
func (s *Signer) Check(text string, op Op, id ID) error {
	b, err := decodeCapability(text)
	if err != nil {
		return err
	}
	if !hmac.Equal(s.mac(b[:capBody:capBody]), b) {
		return fmt.Errorf("blocks: capability: bad signature: %w", ErrDenied)
	}
	c := capabilityOf(b)
	switch {
	case c.Op != op:
		return fmt.Errorf("blocks: capability for %s, not %s: %w", c.Op, op, ErrDenied)
	case c.ID != id:
		return fmt.Errorf("blocks: capability for block %s, not %s: %w", c.ID, id, ErrDenied)
	case !s.now().Before(c.Expiry):
		return fmt.Errorf("blocks: capability expired at %s: %w", c.Expiry.UTC().Format(time.RFC3339), ErrDenied)
	}
	return nil
}
