// Package fs is the FUSE side of a leasefs mount: go-fuse nodes and file
// handles that turn kernel requests into client calls. It is thin on
// purpose: caching and coherence live in the client.
package fs

import (
	"context"
	"encoding/json"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/leasefs/leasefs/client"
	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/wire"
)

// StatusXattr is the extended attribute, readable on any file of a mount
// by the mount's owner and root, that reports the mount's client state
// without asking the server.
const StatusXattr = "user.leasefs.status"

// Node is one leasefs inode as the kernel sees it.
type Node struct {
	gofs.Inode
	c     *client.Client
	mnt   *mountState
	opens atomic.Int32 // open file handles: the kernel reaches these without a lookup
}

// mountState is what the nodes of one mount share.
type mountState struct {
	known sync.Map // ino → *Node the kernel knows (paths for log messages; types)
	// names bumps the kernel's name epoch; nil: the kernel cannot, and
	// caches no names. Set once the kernel mount exists, while requests
	// and revocations may already run: hence atomic, as srv.
	names atomic.Pointer[nameEpoch]
	srv   atomic.Pointer[fuse.Server]
	owner uint32  // the uid the mount runs as: it and root may read StatusXattr
	x     *extras // what the kernel sent with requests in flight
	root  ids.Ino // the directory mounted as the root (MountOptions.Subdir)
}

// notify tells the kernel to drop what it caches of ino (InodeNotify's
// off and length): node ids are inode numbers but for the mount's root,
// which the kernel knows as node 1. A subdirectory mount's kernel knows
// nothing of the file system's own root.
func (m *mountState) notify(ino ids.Ino, off, length int64) {
	srv := m.srv.Load()
	if srv == nil {
		return // not mounted yet: the kernel has nothing cached
	}
	node := uint64(ino)
	switch {
	case ino == m.root:
		node = fuse.FUSE_ROOT_ID
	case ino == ids.RootIno:
		return
	}
	_ = srv.InodeNotify(node, off, length)
}

var _ = (gofs.NodeOnForgetter)((*Node)(nil))

// OnForget: the kernel dropped the inode, and its pages.
func (n *Node) OnForget() {
	n.mnt.known.Delete(n.ino())
	n.c.ForgetPages(n.ino())
}

var (
	_ = (gofs.NodeLookuper)((*Node)(nil))
	_ = (gofs.NodeGetattrer)((*Node)(nil))
	_ = (gofs.NodeSetattrer)((*Node)(nil))
	_ = (gofs.NodeCreater)((*Node)(nil))
	_ = (gofs.NodeMkdirer)((*Node)(nil))
	_ = (gofs.NodeMknoder)((*Node)(nil))
	_ = (gofs.NodeSymlinker)((*Node)(nil))
	_ = (gofs.NodeReadlinker)((*Node)(nil))
	_ = (gofs.NodeLinker)((*Node)(nil))
	_ = (gofs.NodeUnlinker)((*Node)(nil))
	_ = (gofs.NodeRmdirer)((*Node)(nil))
	_ = (gofs.NodeRenamer)((*Node)(nil))
	_ = (gofs.NodeOpendirHandler)((*Node)(nil))
	_ = (gofs.NodeOpener)((*Node)(nil))
	_ = (gofs.NodeStatfser)((*Node)(nil))
	_ = (gofs.NodeGetxattrer)((*Node)(nil))
	_ = (gofs.NodeSetxattrer)((*Node)(nil))
	_ = (gofs.NodeListxattrer)((*Node)(nil))
	_ = (gofs.NodeRemovexattrer)((*Node)(nil))
)

func (n *Node) ino() ids.Ino { return ids.Ino(n.StableAttr().Ino) }

func fillAttr(a *wire.Attr, out *fuse.Attr) {
	out.Ino = uint64(a.Ino)
	out.Mode = a.Mode
	out.Nlink = a.Nlink
	out.Owner = fuse.Owner{Uid: a.Uid, Gid: a.Gid}
	out.Rdev = a.Rdev
	out.Size = a.Size
	out.Blocks = a.Blocks
	out.Blksize = 64 << 10
	out.Atime, out.Atimensec = uint64(a.Atime/1e9), uint32(a.Atime%1e9)
	out.Mtime, out.Mtimensec = uint64(a.Mtime/1e9), uint32(a.Mtime%1e9)
	out.Ctime, out.Ctimensec = uint64(a.Ctime/1e9), uint32(a.Ctime%1e9)
}

// child returns the kernel inode for a, creating it on first sight.
func (n *Node) child(ctx context.Context, a *wire.Attr, out *fuse.EntryOut) *gofs.Inode {
	fillAttr(a, &out.Attr)
	out.NodeId = uint64(a.Ino)
	out.SetAttrTimeout(n.c.AttrTTL(a.Ino))
	if n.mnt.names.Load() != nil {
		// the name is this directory's: as long as its lock covers it
		out.SetEntryTimeout(n.c.AttrTTL(n.ino()))
	}
	child := &Node{c: n.c, mnt: n.mnt}
	in := n.NewInode(ctx, child, gofs.StableAttr{Mode: a.Mode & syscall.S_IFMT, Ino: uint64(a.Ino)})
	n.mnt.known.LoadOrStore(a.Ino, in.Operations())
	return in
}

func caller(ctx context.Context) (uid, gid uint32) {
	if c, ok := fuse.FromContext(ctx); ok {
		return c.Uid, c.Gid
	}
	return 0, 0
}

// Lookup finds a child.
func (n *Node) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	a, err := n.c.Lookup(ctx, n.ino(), name)
	if err != nil {
		return nil, toErrno(err)
	}
	return n.child(ctx, a, out), 0
}

// Getattr reads attributes.
func (n *Node) Getattr(ctx context.Context, f gofs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	a, err := n.c.GetAttr(ctx, n.ino())
	if err != nil {
		return toErrno(err)
	}
	fillAttr(a, &out.Attr)
	out.SetTimeout(n.c.AttrTTL(a.Ino))
	return 0
}

// Setattr changes mode, owner, size or times.
func (n *Node) Setattr(ctx context.Context, f gofs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	req := &wire.Request{Ino: n.ino()}
	if m, ok := in.GetMode(); ok {
		req.Valid |= wire.SetMode
		req.Mode = m
	}
	if u, ok := in.GetUID(); ok {
		req.Valid |= wire.SetUid
		req.Uid = u
	}
	if g, ok := in.GetGID(); ok {
		req.Valid |= wire.SetGid
		req.Gid = g
	}
	if s, ok := in.GetSize(); ok {
		req.Valid |= wire.SetSize
		req.Size = s
	}
	if t, ok := in.GetATime(); ok {
		req.Valid |= wire.SetAtime
		req.Atime = t.UnixNano()
	}
	if t, ok := in.GetMTime(); ok {
		req.Valid |= wire.SetMtime
		req.Mtime = t.UnixNano()
	}
	if t, ok := in.GetCTime(); ok {
		req.Valid |= wire.SetCtime
		req.Ctime = t.UnixNano()
	}
	a, err := n.c.SetAttr(ctx, req)
	if err != nil {
		return toErrno(err)
	}
	fillAttr(a, &out.Attr)
	// as long as Getattr's: without it the kernel asked for the attributes
	// again at the next change (tar: utimes, then GETATTR, then chown)
	out.SetTimeout(n.c.AttrTTL(a.Ino))
	return 0
}

// Create makes and opens a regular file.
func (n *Node) Create(ctx context.Context, name string, flags uint32, mode uint32, out *fuse.EntryOut) (*gofs.Inode, gofs.FileHandle, uint32, syscall.Errno) {
	uid, gid := caller(ctx)
	a, err := n.c.CreateOpen(ctx, n.ino(), name, mode|syscall.S_IFREG, n.mnt.x.of(ctx).umask, uid, gid)
	if err == nil {
		in := n.child(ctx, a, out)
		return in, newFileHandle(in.Operations().(*Node), flags, 0), fuse.FOPEN_DIRECT_IO, 0
	}
	if wire.CodeOf(err) != wire.CodeExists || flags&syscall.O_EXCL != 0 {
		return nil, nil, 0, toErrno(err)
	}
	// Another client created it since the kernel's lookup: O_CREAT
	// without O_EXCL opens the existing file, as a local disk would.
	if a, err = n.c.Lookup(ctx, n.ino(), name); err != nil {
		return nil, nil, 0, toErrno(err)
	}
	if a.Mode&syscall.S_IFMT == syscall.S_IFDIR {
		return nil, nil, 0, syscall.EISDIR
	}
	in := n.child(ctx, a, out)
	fh, fuseFlags, errno := in.Operations().(*Node).Open(ctx, flags)
	if errno != 0 {
		return nil, nil, 0, errno
	}
	return in, fh, fuseFlags, 0
}

// Mknod makes a device, fifo, socket or regular file.
func (n *Node) Mknod(ctx context.Context, name string, mode, dev uint32, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	uid, gid := caller(ctx)
	a, err := n.c.Create(ctx, n.ino(), name, mode, n.mnt.x.of(ctx).umask, uid, gid, dev)
	if err != nil {
		return nil, toErrno(err)
	}
	return n.child(ctx, a, out), 0
}

// Mkdir makes a directory.
func (n *Node) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	uid, gid := caller(ctx)
	a, err := n.c.Mkdir(ctx, n.ino(), name, mode|syscall.S_IFDIR, n.mnt.x.of(ctx).umask, uid, gid)
	if err != nil {
		return nil, toErrno(err)
	}
	return n.child(ctx, a, out), 0
}

// Symlink makes a symbolic link.
func (n *Node) Symlink(ctx context.Context, target, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	uid, gid := caller(ctx)
	a, err := n.c.Symlink(ctx, n.ino(), name, target, uid, gid)
	if err != nil {
		return nil, toErrno(err)
	}
	return n.child(ctx, a, out), 0
}

// Readlink reads a symlink's target.
func (n *Node) Readlink(ctx context.Context) ([]byte, syscall.Errno) {
	t, err := n.c.Readlink(ctx, n.ino())
	if err != nil {
		return nil, toErrno(err)
	}
	return []byte(t), 0
}

// Link adds a hard link.
func (n *Node) Link(ctx context.Context, target gofs.InodeEmbedder, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	t := target.EmbeddedInode().StableAttr().Ino
	a, err := n.c.Link(ctx, ids.Ino(t), n.ino(), name)
	if err != nil {
		return nil, toErrno(err)
	}
	return n.child(ctx, a, out), 0
}

// Unlink removes a file.
func (n *Node) Unlink(ctx context.Context, name string) syscall.Errno {
	return toErrno(n.c.Unlink(ctx, n.ino(), name))
}

// Rmdir removes an empty directory.
func (n *Node) Rmdir(ctx context.Context, name string) syscall.Errno {
	return toErrno(n.c.Rmdir(ctx, n.ino(), name))
}

// Rename moves an entry.
func (n *Node) Rename(ctx context.Context, name string, newParent gofs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	np := ids.Ino(newParent.EmbeddedInode().StableAttr().Ino)
	return toErrno(n.c.Rename(ctx, n.ino(), name, np, newName, flags))
}

// Statfs reports usage.
func (n *Node) Statfs(ctx context.Context, out *fuse.StatfsOut) syscall.Errno {
	s, err := n.c.StatFs(ctx)
	if err != nil {
		return toErrno(err)
	}
	out.Blocks, out.Bfree, out.Bavail = s.Blocks, s.Bfree, s.Bavail
	out.Files, out.Ffree = s.Files, s.Ffree
	out.Bsize, out.Frsize, out.NameLen = s.Bsize, s.Bsize, s.NameLen
	return 0
}

// Getxattr reads an extended attribute; a too-small dest gets ERANGE and
// the size, as getxattr(2) wants.
func (n *Node) Getxattr(ctx context.Context, attr string, dest []byte) (uint32, syscall.Errno) {
	var v []byte
	var err error
	if attr == StatusXattr {
		// Answered by this mount, not the server: its session, lease
		// and cache, as JSON (getfattr -n leasefs.status MOUNTPOINT).
		// Other users of a shared mount may not see it: it names the
		// files the mount holds locks on and what it is doing.
		if uid, _ := caller(ctx); uid != 0 && uid != n.mnt.owner {
			return 0, syscall.EACCES
		}
		v, err = json.Marshal(n.c.Stats())
	} else {
		v, err = n.c.GetXattr(ctx, n.ino(), attr)
	}
	if err != nil {
		return 0, toErrno(err)
	}
	if len(dest) < len(v) {
		return uint32(len(v)), syscall.ERANGE
	}
	return uint32(copy(dest, v)), 0
}

// Setxattr writes an extended attribute. An access ACL set by a caller
// neither in the file's group nor privileged clears setgid (the kernel
// says so with the request).
func (n *Node) Setxattr(ctx context.Context, attr string, data []byte, flags uint32) syscall.Errno {
	if n.mnt.x.of(ctx).xattrFlags&fuse.SETXATTR_ACL_KILL_SGID != 0 {
		flags |= wire.XattrKillSgid
	}
	return toErrno(n.c.SetXattr(ctx, n.ino(), attr, data, flags))
}

// Listxattr lists extended attribute names, NUL-separated.
func (n *Node) Listxattr(ctx context.Context, dest []byte) (uint32, syscall.Errno) {
	names, err := n.c.ListXattr(ctx, n.ino())
	if err != nil {
		return 0, toErrno(err)
	}
	var buf []byte
	for _, nm := range names {
		buf = append(append(buf, nm...), 0)
	}
	if len(dest) < len(buf) {
		return uint32(len(buf)), syscall.ERANGE
	}
	return uint32(copy(dest, buf)), 0
}

// Removexattr removes an extended attribute.
func (n *Node) Removexattr(ctx context.Context, attr string) syscall.Errno {
	return toErrno(n.c.RemoveXattr(ctx, n.ino(), attr))
}

// OpendirHandle opens a directory stream with stable offsets.
func (n *Node) OpendirHandle(ctx context.Context, flags uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	return &dirHandle{n: n}, 0, 0
}

// Open opens a file.
func (n *Node) Open(ctx context.Context, flags uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	if _, err := n.c.Open(ctx, n.ino(), flags); err != nil {
		return nil, 0, toErrno(err)
	}
	h := newFileHandle(n, flags, n.c.LostGen(n.ino()))
	// direct_io for every handle: a write through this mount does not drop
	// the kernel's pages of the file kept for another handle here, so a
	// page cache kept under a data lock could serve stale data
	// (TestLinearizable found it). Reads go to the client each time. Only
	// a mapping uses the page cache (FUSE_DIRECT_IO_ALLOW_MMAP; see
	// client/mapped.go).
	return h, fuse.FOPEN_DIRECT_IO, 0
}

// nowNano is the wall-clock time for file times set by the client.
func nowNano() int64 { return time.Now().UnixNano() }

var _ = (gofs.NodeAllocater)((*Node)(nil))

// Allocate implements fallocate's default mode (grow the file),
// FALLOC_FL_KEEP_SIZE, PUNCH_HOLE (with KEEP_SIZE, as Linux requires) and
// ZERO_RANGE; leasefs stores files sparsely, so reserving space has
// nothing else to do, and zeros are holes.
func (n *Node) Allocate(ctx context.Context, f gofs.FileHandle, off uint64, size uint64, mode uint32) syscall.Errno {
	const keepSize = 1 // FALLOC_FL_KEEP_SIZE
	if end := off + size; end < off || end > wire.MaxFileSize {
		return syscall.EFBIG // as the kernel's own check against a limit it knew
	}
	switch mode {
	case keepSize:
		return 0
	case 0:
		a, err := n.c.GetAttr(ctx, n.ino())
		if err != nil {
			return toErrno(err)
		}
		if end := off + size; end > a.Size {
			_, err = n.c.SetAttr(ctx, &wire.Request{Ino: n.ino(), Valid: wire.SetSize, Size: end})
		}
		return toErrno(err)
	case wire.PunchHole | wire.PunchKeepSize, wire.PunchZeroRange, wire.PunchZeroRange | wire.PunchKeepSize:
		_, err := n.c.Punch(ctx, n.ino(), off, size, mode)
		return toErrno(err)
	}
	return syscall.EOPNOTSUPP
}
