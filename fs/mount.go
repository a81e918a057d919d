package fs

import (
	"fmt"
	"log/slog"
	"os"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/leasefs/leasefs/client"
	"github.com/leasefs/leasefs/internal/ids"
)

// MountOptions configures a mount.
type MountOptions struct {
	Debug    bool // log every FUSE request
	ReadOnly bool // the kernel refuses every change with EROFS
	// Root is the directory mounted as the mount's root (0: the file
	// system's own).
	Root   ids.Ino
	Logger *slog.Logger
}

// Mount mounts the leasefs client c at dir and returns the running FUSE
// server; the caller waits on it and unmounts it.
func Mount(dir string, c *client.Client, o MountOptions) (*fuse.Server, error) {
	if o.Root == 0 {
		o.Root = ids.RootIno
	}
	mnt := &mountState{owner: uint32(os.Geteuid()), x: &extras{}, root: o.Root}
	root := &Node{c: c, mnt: mnt}
	// Zero timeouts until a data lock covers what the kernel caches: another
	// client may change any entry or attribute at any moment. A reply sets
	// its own under a lock (Node.child).
	var zero time.Duration
	opts := &gofs.Options{
		EntryTimeout:    &zero,
		AttrTimeout:     &zero,
		NegativeTimeout: &zero,
		// Node ids are inode numbers, so a revocation can name the inode
		// whose kernel caches it must drop.
		ExternalNodeID: true,
		RootStableAttr: &gofs.StableAttr{Ino: uint64(o.Root)},
		// Modes as stored: without this go-fuse serves a mode with no
		// permission bits (chmod 000) as 0644 or 0755.
		NullPermissions: true,
		MountOptions: fuse.MountOptions{
			FsName:             "leasefs",
			Name:               "leasefs",
			MaxWrite:           1 << 20,
			MaxReadAhead:       1 << 20,
			Debug:              o.Debug,
			DisableReadDirPlus: true,
			EnableLocks:        true,
			// Reads return bytes, never a file descriptor to splice
			// from: go-fuse would set up a pipe for every read reply
			// and give up on it (four wasted system calls each).
			DisableSplice: true,
			// The mode of a create comes without the umask applied,
			// and the umask with it (extras.go): it applies only where
			// the directory has no default ACL. SETXATTR_EXT carries
			// FUSE_SETXATTR_ACL_KILL_SGID. DIRECT_IO_ALLOW_MMAP: shared
			// mappings of direct_io files (Linux 6.6 and later);
			// read() and write() stay direct, a mapping's pages are
			// cached (client/mapped.go). An older kernel refuses
			// MAP_SHARED with ENODEV, as before.
			ExtraCapabilities: fuse.CAP_DONT_MASK | fuse.CAP_SETXATTR_EXT | fuse.CAP_DIRECT_IO_ALLOW_MMAP,
		},
	}
	if os.Geteuid() == 0 {
		// Every user of the machine may use the mount; the kernel checks
		// permissions against the stored mode, uid and gid, and POSIX
		// ACLs, which it caches (the server keeps them and the mode in
		// step, metaserver/store_acl.go). A mount of one user checks
		// nothing: there ACLs are stored, inherited and kept in step
		// with modes, and not enforced.
		opts.AllowOther = true
		opts.Options = append(opts.Options, "default_permissions")
		opts.EnableAcl = true
		opts.DirectMountStrict = true
	}
	if o.ReadOnly {
		opts.Options = append(opts.Options, "ro")
	}
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	// The hooks go in before the mount: a revocation can come any time.
	pathOf := func(ino ids.Ino) string {
		if v, ok := mnt.known.Load(ino); ok {
			return "/" + v.(*Node).Path(nil)
		}
		return ""
	}
	// forgetNames makes the kernel forget every name it caches, if it can.
	forgetNames := func() {
		names := mnt.names.Load()
		if names == nil {
			return
		}
		if err := names.bump(); err != nil {
			// the kernel could take it at mount: a broken connection
			log.Warn("dropping the kernel's cached names failed", "err", err)
		}
	}
	invalidate := func(ino ids.Ino) {
		// Pages and attributes; ENOENT only means the kernel has
		// nothing cached for it.
		mnt.notify(ino, 0, 0)
		// a directory's names, or one the kernel may know under another
		// node (the root is not in known)
		if v, ok := mnt.known.Load(ino); !ok || v.(*Node).IsDir() {
			forgetNames()
		}
	}
	// dropKernel forgets every name (the epoch) and the attributes of what
	// the kernel reaches without a path lookup (which the epoch makes ask
	// again): open files, and directories and the root, which may be a
	// working directory or open. Offset -1: attributes only, which takes
	// no page lock.
	dropKernel := func() {
		if mnt.srv.Load() == nil {
			return
		}
		forgetNames()
		mnt.notify(mnt.root, -1, 0)
		mnt.known.Range(func(k, v any) bool {
			if n := v.(*Node); n.IsDir() || n.opens.Load() > 0 {
				mnt.notify(k.(ids.Ino), -1, 0)
			}
			return true
		})
	}
	c.SetHooks(client.Hooks{Invalidate: invalidate, DropKernel: dropKernel, PathOf: pathOf})
	before := fuseFDs()
	raw := &rawFS{RawFileSystem: gofs.NewNodeFS(root, opts), x: mnt.x}
	srv, err := fuse.NewServer(raw, dir, &opts.MountOptions)
	if err != nil {
		return nil, fmt.Errorf("fs: mount %s: %w", dir, err)
	}
	go srv.Serve()
	if err := srv.WaitMount(); err != nil {
		return nil, fmt.Errorf("fs: mount %s: %w", dir, err)
	}
	mnt.srv.Store(srv)
	if names, err := newNameEpoch(before, fuseFDs()); err != nil {
		log.Info("the kernel caches no names of this mount: every path lookup asks the mount", "why", err)
	} else {
		mnt.names.Store(names)
	}
	return srv, nil
}
