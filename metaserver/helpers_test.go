package metaserver

import (
	"math/rand/v2"
	"testing"

	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/metaserver/store"
)

func must[T any](t testing.TB) func(T, error) T {
	return func(v T, err error) T {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
}

// randBytes is n pseudo-random bytes of seed.
func randBytes(seed uint64, n int) []byte {
	rng := rand.New(rand.NewPCG(seed, 7))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	return b
}

// staged counts the records of transfers' staging in s's store.
func staged(t testing.TB, s *Server) int {
	t.Helper()
	n := 0
	err := s.store.View(func(tx *store.Tx) error {
		return tx.Iterate([]byte{store.RecStage}, func(k, v []byte) (bool, error) { n++; return true, nil })
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// replState is a replica's state of an inode.
type replState struct {
	epoch   ids.Epoch
	version uint64
}

func stateOf(t testing.TB, s *Server, ino ids.Ino) replState {
	t.Helper()
	e, v, err := s.repl.State(ino)
	if err != nil {
		t.Fatal(err)
	}
	return replState{e, v}
}
