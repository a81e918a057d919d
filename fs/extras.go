package fs

import (
	"context"
	"sync"

	"github.com/hanwen/go-fuse/v2/fuse"
)

// Request extras: what the kernel sends that go-fuse's node API does not
// pass on, such as a write's FUSE_WRITE_KILL_SUIDGID, which the kernel
// computes from the caller's credentials (the file system cannot see
// them). rawFS notes them for the duration of the request, keyed by the
// request's cancel channel (fuse.Context.Cancel: one per request in
// flight), and the node methods look them up.

// extra is what rawFS noted for one request.
type extra struct {
	writeFlags uint32 // Write: fuse.WRITE_KILL_SUIDGID
}

// extras maps requests in flight to what rawFS noted for them.
type extras struct {
	mu sync.Mutex
	m  map[<-chan struct{}]extra
}

func (x *extras) put(cancel <-chan struct{}, e extra) {
	x.mu.Lock()
	if x.m == nil {
		x.m = map[<-chan struct{}]extra{}
	}
	x.m[cancel] = e
	x.mu.Unlock()
}

func (x *extras) drop(cancel <-chan struct{}) {
	x.mu.Lock()
	delete(x.m, cancel)
	x.mu.Unlock()
}

// of returns what was noted for the request ctx belongs to (zero if
// nothing, or ctx is not a FUSE request's).
func (x *extras) of(ctx context.Context) extra {
	fc, ok := ctx.(*fuse.Context)
	if !ok || fc.Cancel == nil {
		return extra{}
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.m[fc.Cancel]
}

// rawFS is the node file system with the requests' extras noted.
type rawFS struct {
	fuse.RawFileSystem
	x *extras
}

// Write and Writev note only the kill flag: a write without it (the
// caller has CAP_FSETID) costs no map update.
func (r *rawFS) Write(cancel <-chan struct{}, in *fuse.WriteIn, data []byte) (uint32, fuse.Status) {
	if in.WriteFlags&fuse.WRITE_KILL_SUIDGID != 0 {
		r.x.put(cancel, extra{writeFlags: in.WriteFlags})
		defer r.x.drop(cancel)
	}
	return r.RawFileSystem.Write(cancel, in, data)
}

func (r *rawFS) Writev(cancel <-chan struct{}, in *fuse.WriteIn, data [][]byte) (uint32, fuse.Status) {
	if in.WriteFlags&fuse.WRITE_KILL_SUIDGID != 0 {
		r.x.put(cancel, extra{writeFlags: in.WriteFlags})
		defer r.x.drop(cancel)
	}
	return r.RawFileSystem.Writev(cancel, in, data)
}
