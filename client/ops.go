package client

import (
	"context"

	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/wire"
)

func (c *Client) attrCall(ctx context.Context, req *wire.Request) (*wire.Attr, error) {
	rep, err := c.Call(ctx, req)
	if err != nil {
		return nil, err
	}
	if rep.Attr == nil {
		return nil, wire.Errf(wire.CodeIO, "%v reply without attributes", req.Op)
	}
	return rep.Attr, nil
}

// Lookup finds name in parent.
func (c *Client) Lookup(ctx context.Context, parent ids.Ino, name string) (*wire.Attr, error) {
	return c.attrCall(ctx, &wire.Request{Op: wire.OpLookup, Parent: parent, Name: name})
}

// GetAttr returns an inode's attributes.
func (c *Client) GetAttr(ctx context.Context, ino ids.Ino) (*wire.Attr, error) {
	return c.attrCall(ctx, &wire.Request{Op: wire.OpGetAttr, Ino: ino})
}

// SetAttr changes attributes; req carries Valid and the values.
func (c *Client) SetAttr(ctx context.Context, req *wire.Request) (*wire.Attr, error) {
	req.Op = wire.OpSetAttr
	return c.attrCall(ctx, req)
}

// Create makes a regular file, device, fifo or socket.
func (c *Client) Create(ctx context.Context, parent ids.Ino, name string, mode, uid, gid, rdev uint32) (*wire.Attr, error) {
	return c.attrCall(ctx, &wire.Request{Op: wire.OpCreate, Parent: parent, Name: name, Mode: mode, Uid: uid, Gid: gid, Rdev: rdev})
}

// Mkdir makes a directory.
func (c *Client) Mkdir(ctx context.Context, parent ids.Ino, name string, mode, uid, gid uint32) (*wire.Attr, error) {
	return c.attrCall(ctx, &wire.Request{Op: wire.OpMkdir, Parent: parent, Name: name, Mode: mode, Uid: uid, Gid: gid})
}

// Symlink makes a symbolic link.
func (c *Client) Symlink(ctx context.Context, parent ids.Ino, name, target string, uid, gid uint32) (*wire.Attr, error) {
	return c.attrCall(ctx, &wire.Request{Op: wire.OpSymlink, Parent: parent, Name: name, Target: target, Uid: uid, Gid: gid})
}

// Readlink returns a symlink's target.
func (c *Client) Readlink(ctx context.Context, ino ids.Ino) (string, error) {
	rep, err := c.Call(ctx, &wire.Request{Op: wire.OpReadlink, Ino: ino})
	if err != nil {
		return "", err
	}
	return string(rep.Data), nil
}

// Link adds a hard link to ino.
func (c *Client) Link(ctx context.Context, ino, newParent ids.Ino, name string) (*wire.Attr, error) {
	return c.attrCall(ctx, &wire.Request{Op: wire.OpLink, Ino: ino, NewPar: newParent, Name: name})
}

// Unlink removes a non-directory entry.
func (c *Client) Unlink(ctx context.Context, parent ids.Ino, name string) error {
	_, err := c.Call(ctx, &wire.Request{Op: wire.OpUnlink, Parent: parent, Name: name})
	return err
}

// Rmdir removes an empty directory.
func (c *Client) Rmdir(ctx context.Context, parent ids.Ino, name string) error {
	_, err := c.Call(ctx, &wire.Request{Op: wire.OpRmdir, Parent: parent, Name: name})
	return err
}

// Rename moves an entry, replacing an existing target as POSIX says.
func (c *Client) Rename(ctx context.Context, parent ids.Ino, name string, newParent ids.Ino, newName string, flags uint32) error {
	_, err := c.Call(ctx, &wire.Request{Op: wire.OpRename, Parent: parent, Name: name, NewPar: newParent, NewName: newName, Flags: flags})
	return err
}

// ReadDir lists entries after the cookie `after`.
func (c *Client) ReadDir(ctx context.Context, dir ids.Ino, after uint64, max int) ([]wire.DirEntry, error) {
	rep, err := c.Call(ctx, &wire.Request{Op: wire.OpReadDir, Ino: dir, Off: after, Size: uint64(max)})
	if err != nil {
		return nil, err
	}
	return rep.Entries, nil
}

// Open registers an open handle (so an unlinked open file keeps its data).
func (c *Client) Open(ctx context.Context, ino ids.Ino, flags uint32) (*wire.Attr, error) {
	return c.attrCall(ctx, &wire.Request{Op: wire.OpOpen, Ino: ino, Flags: flags})
}

// Release drops an open handle.
func (c *Client) Release(ctx context.Context, ino ids.Ino) error {
	_, err := c.Call(ctx, &wire.Request{Op: wire.OpRelease, Ino: ino})
	return err
}

// Read reads up to size bytes at off.
func (c *Client) Read(ctx context.Context, ino ids.Ino, off uint64, size int) ([]byte, error) {
	rep, err := c.Call(ctx, &wire.Request{Op: wire.OpRead, Ino: ino, Off: off, Size: uint64(size)})
	if err != nil {
		return nil, err
	}
	return rep.Data, nil
}

// Write writes data at off.
func (c *Client) Write(ctx context.Context, ino ids.Ino, off uint64, data []byte) (*wire.Attr, error) {
	return c.attrCall(ctx, &wire.Request{Op: wire.OpWrite, Ino: ino, Off: off, Data: data})
}

// Fsync returns once everything written so far is durable on the server.
func (c *Client) Fsync(ctx context.Context, ino ids.Ino) error {
	_, err := c.Call(ctx, &wire.Request{Op: wire.OpFsync, Ino: ino})
	return err
}

// StatFs returns file system usage.
func (c *Client) StatFs(ctx context.Context) (*wire.StatFs, error) {
	rep, err := c.Call(ctx, &wire.Request{Op: wire.OpStatFs})
	if err != nil {
		return nil, err
	}
	if rep.StatFs == nil {
		return nil, wire.Errf(wire.CodeIO, "statfs reply without data")
	}
	return rep.StatFs, nil
}

// GetXattr returns an extended attribute's value.
func (c *Client) GetXattr(ctx context.Context, ino ids.Ino, name string) ([]byte, error) {
	rep, err := c.Call(ctx, &wire.Request{Op: wire.OpGetXattr, Ino: ino, Name: name})
	if err != nil {
		return nil, err
	}
	return rep.Data, nil
}

// SetXattr sets an extended attribute.
func (c *Client) SetXattr(ctx context.Context, ino ids.Ino, name string, value []byte, flags uint32) error {
	_, err := c.Call(ctx, &wire.Request{Op: wire.OpSetXattr, Ino: ino, Name: name, Data: value, Flags: flags})
	return err
}

// ListXattr lists extended attribute names.
func (c *Client) ListXattr(ctx context.Context, ino ids.Ino) ([]string, error) {
	rep, err := c.Call(ctx, &wire.Request{Op: wire.OpListXattr, Ino: ino})
	if err != nil {
		return nil, err
	}
	return rep.Names, nil
}

// RemoveXattr removes an extended attribute.
func (c *Client) RemoveXattr(ctx context.Context, ino ids.Ino, name string) error {
	_, err := c.Call(ctx, &wire.Request{Op: wire.OpRemoveXattr, Ino: ino, Name: name})
	return err
}

// PosixLock sets, tests or waits for a POSIX advisory lock.
func (c *Client) PosixLock(ctx context.Context, ino ids.Ino, lk wire.PosixLk) (*wire.PosixLk, error) {
	rep, err := c.Call(ctx, &wire.Request{Op: wire.OpPosixLock, Ino: ino, Lk: lk})
	if err != nil {
		return nil, err
	}
	return rep.Lk, nil
}
