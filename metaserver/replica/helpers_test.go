package replica

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"syscall"
	"testing"

	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/metaserver/store"
	"github.com/leasefs/leasefs/wire"
)

// testStore is a store with its replication layer.
type testStore struct {
	*store.Store
	*Replica
}

// Apply is the replica's (the store's takes raw writes: s.Store.Apply).
func (s *testStore) Apply(changes []Change) error { return s.Replica.Apply(changes) }

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func openTestStore(t testing.TB, dir string, opts store.Options) *testStore {
	t.Helper()
	if opts.ServerID == 0 {
		opts.ServerID = 1
	}
	if opts.Logger == nil {
		opts.Logger = quiet
	}
	s, err := store.Open(dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	return &testStore{s, New(s)}
}

// newStore opens a real badger store in a temporary directory.
func newStore(t testing.TB) *testStore {
	s := openTestStore(t, t.TempDir(), store.Options{})
	t.Cleanup(func() { s.Close() })
	return s
}

func wantCode(t testing.TB, err error, code wire.Code) {
	t.Helper()
	if code == wire.CodeOK {
		if err != nil {
			t.Fatalf("unexpected error %v", err)
		}
		return
	}
	if !errors.Is(err, wire.Err(code)) {
		t.Fatalf("got error %v, want %v", err, code)
	}
}

func must[T any](t testing.TB) func(T, error) T {
	return func(v T, err error) T {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
}

const reg = syscall.S_IFREG

func unlinked(a store.Attr, _ bool, err error) (store.Attr, error) { return a, err }

// dump lists every record except the server counter, for comparing stores.
func dump(t testing.TB, s *testStore) []string {
	t.Helper()
	var out []string
	err := s.View(func(tx *store.Tx) error {
		return tx.Iterate(nil, func(k, v []byte) (bool, error) {
			if k[0] != store.RecServer {
				out = append(out, fmt.Sprintf("%x=%x", k, v))
			}
			return true, nil
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// countRecords counts the records of one kind of one inode.
func countRecords(t testing.TB, s *testStore, kind byte, ino ids.Ino) int {
	t.Helper()
	n := 0
	err := s.View(func(tx *store.Tx) error {
		return tx.Iterate(tx.Key(kind, ino, nil), func(k, v []byte) (bool, error) { n++; return true, nil })
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}
