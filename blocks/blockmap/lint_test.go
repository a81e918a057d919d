package blockmap

import (
	"testing"

	"github.com/leasefs/leasefs/internal/purity"
)

// TestPure keeps the map pure (STYLE.md): no wall clock, sleeping,
// goroutines, channels, locks, global randomness or I/O.
func TestPure(t *testing.T) { purity.Check(t, purity.Options{}) }
