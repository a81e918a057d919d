package fs

import (
	"context"
	"sync"

	"github.com/hanwen/go-fuse/v2/fuse"
)

// Request extras: what the kernel sends that go-fuse's node API does not
// pass on. The umask of a create (CAP_DONT_MASK: the mode comes unmasked,
// and the umask applies only where the directory has no default ACL), a
// write's FUSE_WRITE_KILL_SUIDGID and a setxattr's
// FUSE_SETXATTR_ACL_KILL_SGID are each computed by the kernel from the
// caller's credentials, which the file system cannot see. rawFS notes
// them for the duration of the request, keyed by the request's cancel
// channel (fuse.Context.Cancel: one per request in flight), and the node
// methods look them up.

// extra is what rawFS noted for one request.
type extra struct {
	umask      uint32 // Create, Mkdir, Mknod
	writeFlags uint32 // Write: fuse.WRITE_KILL_SUIDGID
	xattrFlags uint32 // SetXAttr: fuse.SETXATTR_ACL_KILL_SGID
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

func (r *rawFS) Create(cancel <-chan struct{}, in *fuse.CreateIn, name string, out *fuse.CreateOut) fuse.Status {
	r.x.put(cancel, extra{umask: in.Umask})
	defer r.x.drop(cancel)
	return r.RawFileSystem.Create(cancel, in, name, out)
}

func (r *rawFS) Mkdir(cancel <-chan struct{}, in *fuse.MkdirIn, name string, out *fuse.EntryOut) fuse.Status {
	r.x.put(cancel, extra{umask: in.Umask})
	defer r.x.drop(cancel)
	return r.RawFileSystem.Mkdir(cancel, in, name, out)
}

func (r *rawFS) Mknod(cancel <-chan struct{}, in *fuse.MknodIn, name string, out *fuse.EntryOut) fuse.Status {
	r.x.put(cancel, extra{umask: in.Umask})
	defer r.x.drop(cancel)
	return r.RawFileSystem.Mknod(cancel, in, name, out)
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

func (r *rawFS) SetXAttr(cancel <-chan struct{}, in *fuse.SetXAttrIn, attr string, data []byte) fuse.Status {
	if in.SetXAttrFlags != 0 {
		r.x.put(cancel, extra{xattrFlags: in.SetXAttrFlags})
		defer r.x.drop(cancel)
	}
	return r.RawFileSystem.SetXAttr(cancel, in, attr, data)
}
