package paxosnode

import (
	"errors"
	"fmt"
	"time"

	"github.com/leasefs/leasefs/internal/ids"
)

var (
	// ErrQuarantined: the node started less than Config.Quarantine ago and
	// takes part in no PaxosLease round yet (DESIGN.md: a restarted server
	// sits out T(1+δ)). Acquire returns a *QuarantineError, which matches it.
	ErrQuarantined = errors.New("paxosnode: quarantined after start")
	// ErrReleased: Release(ino) was called while this Acquire(ino) waited.
	ErrReleased = errors.New("paxosnode: released while acquiring")
)

// NotOwnerError says that another server owns the inode as far as this
// server has learnt: redirect the client there.
type NotOwnerError struct {
	Ino   ids.Ino
	Owner ids.ServerID
}

func (e *NotOwnerError) Error() string {
	return fmt.Sprintf("paxosnode: %v is owned by %v", e.Ino, e.Owner)
}

// QuarantineError is Acquire's answer during the start-up quarantine; Left
// is how long it still lasts on this server's clock.
type QuarantineError struct {
	Left time.Duration
}

func (e *QuarantineError) Error() string {
	return fmt.Sprintf("%v: %v left", ErrQuarantined, e.Left)
}

// Is makes errors.Is(err, ErrQuarantined) true.
func (e *QuarantineError) Is(target error) bool { return target == ErrQuarantined }
