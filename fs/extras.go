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
// caller's credentials, which the file system cannot see; whether a read
// or write is the page cache's own (a mapping's) tells how to serve it. rawFS notes
// them for the duration of the request, keyed by the request's cancel
// channel (fuse.Context.Cancel: one per request in flight), and the node
// methods look them up.

// extra is what rawFS noted for one request.
type extra struct {
	umask      uint32 // Create, Mkdir, Mknod
	writeFlags uint32 // Write: fuse.WRITE_KILL_SUIDGID, fuse.WRITE_CACHE
	xattrFlags uint32 // SetXAttr: fuse.SETXATTR_ACL_KILL_SGID
	// pageRead: a Read that fills the page cache (a mapping's fault or
	// readahead); read() on a direct_io handle always names a lock
	// owner (fuse.READ_LOCKOWNER), the kernel's own reads never do.
	pageRead bool
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

// Write and Writev note only the kill flag and the page cache's
// write-back (FUSE_WRITE_CACHE: a mapping's dirty pages, which must not
// wait for a lock; client.WritePage): a plain write() without the kill
// flag (the caller has CAP_FSETID) costs no map update.
const notedWriteFlags = fuse.WRITE_KILL_SUIDGID | fuse.WRITE_CACHE

func (r *rawFS) Write(cancel <-chan struct{}, in *fuse.WriteIn, data []byte) (uint32, fuse.Status) {
	if in.WriteFlags&notedWriteFlags != 0 {
		r.x.put(cancel, extra{writeFlags: in.WriteFlags})
		defer r.x.drop(cancel)
	}
	return r.RawFileSystem.Write(cancel, in, data)
}

func (r *rawFS) Writev(cancel <-chan struct{}, in *fuse.WriteIn, data [][]byte) (uint32, fuse.Status) {
	if in.WriteFlags&notedWriteFlags != 0 {
		r.x.put(cancel, extra{writeFlags: in.WriteFlags})
		defer r.x.drop(cancel)
	}
	return r.RawFileSystem.Writev(cancel, in, data)
}

// Read notes a fill of the page cache (only mappings use it: every
// handle is direct_io), which must not wait for a lock (client.ReadPage).
func (r *rawFS) Read(cancel <-chan struct{}, in *fuse.ReadIn, buf []byte) (fuse.ReadResult, fuse.Status) {
	if in.ReadFlags&fuse.READ_LOCKOWNER == 0 {
		r.x.put(cancel, extra{pageRead: true})
		defer r.x.drop(cancel)
	}
	return r.RawFileSystem.Read(cancel, in, buf)
}

func (r *rawFS) SetXAttr(cancel <-chan struct{}, in *fuse.SetXAttrIn, attr string, data []byte) fuse.Status {
	if in.SetXAttrFlags != 0 {
		r.x.put(cancel, extra{xattrFlags: in.SetXAttrFlags})
		defer r.x.drop(cancel)
	}
	return r.RawFileSystem.SetXAttr(cancel, in, attr, data)
}
