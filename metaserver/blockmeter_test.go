package metaserver

import (
	"context"
	"errors"
	"io"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasefs/leasefs/blocks"
	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/metaserver/admin"
)

// downStore answers every call with err.
type downStore struct{ err error }

func (f downStore) Put(context.Context, blocks.ID, []byte) error { return f.err }
func (f downStore) ReadAt(context.Context, blocks.ID, []byte, int64) (int, error) {
	return 0, f.err
}
func (f downStore) Delete(context.Context, blocks.ID) error { return f.err }
func (f downStore) List(_ context.Context, _ ids.Ino, fn func(blocks.ID, int64, time.Time) error) error {
	if f.err != nil {
		return f.err
	}
	return fn(blocks.NewID(1), 1, time.Time{})
}
func (f downStore) Usage(context.Context) (blocks.Usage, error) { return blocks.Usage{}, f.err }

// TestMeteredStoreCountsFailures: calls that fail count as the store's
// errors; the ends every caller expects (io.EOF, a missing block, the
// caller's own error ending a listing) do not.
func TestMeteredStoreCountsFailures(t *testing.T) {
	var n atomic.Int64
	ctx := context.Background()
	down := meteredStore{Store: downStore{errors.New("connection refused")}, metrics: &atomic.Pointer[admin.Metrics]{}, errors: &n}
	_ = down.Put(ctx, blocks.NewID(1), nil)
	_, _ = down.ReadAt(ctx, blocks.NewID(1), nil, 0)
	_ = down.List(ctx, 1, func(blocks.ID, int64, time.Time) error { return nil })
	if n.Load() != 3 {
		t.Fatalf("%d errors counted for 3 failed calls", n.Load())
	}
	n.Store(0)
	for _, err := range []error{io.EOF, blocks.ErrNotFound} {
		_, _ = meteredStore{Store: downStore{err}, metrics: &atomic.Pointer[admin.Metrics]{}, errors: &n}.ReadAt(ctx, blocks.NewID(1), nil, 0)
	}
	stop := errors.New("enough")
	up := meteredStore{Store: downStore{}, metrics: &atomic.Pointer[admin.Metrics]{}, errors: &n}
	if err := up.List(ctx, 1, func(blocks.ID, int64, time.Time) error { return stop }); !errors.Is(err, stop) {
		t.Fatalf("List: %v", err)
	}
	if n.Load() != 0 {
		t.Fatalf("%d errors counted for ordinary ends", n.Load())
	}
}
