package metaserver

import (
	"context"
	"errors"
	"io"
	"sync/atomic"
	"time"

	"github.com/leasefs/leasefs/blocks"
	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/metaserver/admin"
)

// meteredStore is the block store as the server uses it (its own puts and
// reads, the endpoint it serves, the collector), counting what fails and
// timing each call for /metrics: an object store's errors and latency are
// what an operator looks at when writes slow down or fail.
type meteredStore struct {
	blocks.Store
	metrics *atomic.Pointer[admin.Metrics] // the admin endpoint's, while one runs
	errors  *atomic.Int64
}

// observe records one call of op that took since start and ended in err.
func (m meteredStore) observe(op string, start time.Time, err error) {
	failed := err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, blocks.ErrNotFound) && !errors.Is(err, context.Canceled)
	if failed {
		m.errors.Add(1)
	}
	if mt := m.metrics.Load(); mt != nil {
		mt.BlockStoreCall(op, failed, time.Since(start))
	}
}

func (m meteredStore) Put(ctx context.Context, id blocks.ID, data []byte) error {
	start := time.Now()
	err := m.Store.Put(ctx, id, data)
	m.observe("put", start, err)
	return err
}

func (m meteredStore) ReadAt(ctx context.Context, id blocks.ID, p []byte, off int64) (int, error) {
	start := time.Now()
	n, err := m.Store.ReadAt(ctx, id, p, off)
	m.observe("read", start, err)
	return n, err
}

func (m meteredStore) Delete(ctx context.Context, id blocks.ID) error {
	start := time.Now()
	err := m.Store.Delete(ctx, id)
	m.observe("delete", start, err)
	return err
}

func (m meteredStore) List(ctx context.Context, ino ids.Ino, fn func(blocks.ID, int64, time.Time) error) error {
	start := time.Now()
	var fnErr error // the caller's own, which ends the listing: no failure of the store
	err := m.Store.List(ctx, ino, func(id blocks.ID, size int64, mtime time.Time) error {
		fnErr = fn(id, size, mtime)
		return fnErr
	})
	if err != nil && fnErr != nil && errors.Is(err, fnErr) {
		m.observe("list", start, nil)
	} else {
		m.observe("list", start, err)
	}
	return err
}

// RemoveStaleTemps passes the collector's clean-up to a store that has
// one (tempRemover).
func (m meteredStore) RemoveStaleTemps(age time.Duration) (int, error) {
	if tr, ok := m.Store.(tempRemover); ok {
		return tr.RemoveStaleTemps(age)
	}
	return 0, nil
}
