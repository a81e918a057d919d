package store

import (
	"cmp"
	"encoding/binary"
	"syscall"

	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/wire"
)

// entry is a directory entry record.
type entry struct {
	ino    ids.Ino
	typ    uint32 // S_IFMT bits
	cookie uint64
}

const entrySize = 8 + 4 + 8

// entry looks name up in dir.
func (tx *Tx) entry(dir ids.Ino, name string) (entry, bool, error) {
	var e entry
	var bad bool
	ok, err := tx.get(tx.keyStr(RecEntry, dir, name), func(v []byte) error {
		if len(v) != entrySize {
			bad = true
			return nil
		}
		e.ino = ids.Ino(binary.BigEndian.Uint64(v))
		e.typ = binary.BigEndian.Uint32(v[8:])
		e.cookie = binary.BigEndian.Uint64(v[12:])
		return nil
	})
	if err == nil && bad {
		err = wire.Errf(wire.CodeIO, "corrupt entry %q in %v", name, dir)
	}
	return e, ok, err
}

// putEntry writes an entry and its cookie index record.
func (tx *Tx) putEntry(dir ids.Ino, name string, e entry) error {
	v := make([]byte, 0, entrySize+4+len(name))
	v = binary.BigEndian.AppendUint64(v, uint64(e.ino))
	v = binary.BigEndian.AppendUint32(v, e.typ)
	if err := tx.set(tx.keyStr(RecEntry, dir, name), binary.BigEndian.AppendUint64(v, e.cookie)); err != nil {
		return err
	}
	// the cookie record shares the first 12 bytes: ino, type, then the name
	c := append(v[:12:12], name...)
	return tx.set(tx.key64(RecCookie, dir, e.cookie), c)
}

// delEntry deletes an entry and its cookie index record.
func (tx *Tx) delEntry(dir ids.Ino, name string, e entry) error {
	if err := tx.del(tx.keyStr(RecEntry, dir, name)); err != nil {
		return err
	}
	return tx.del(tx.key64(RecCookie, dir, e.cookie))
}

// newEntry adds name → child to dir with the next cookie.
func (tx *Tx) newEntry(dir *inode, name string, child ids.Ino, typ uint32) error {
	if dir.nextCookie < firstCookie {
		dir.nextCookie = firstCookie
	}
	e := entry{ino: child, typ: typ, cookie: dir.nextCookie}
	dir.nextCookie++
	dir.touch()
	return tx.putEntry(dir.Ino, name, e)
}

// dirEmpty reports whether a directory has no entries.
func (tx *Tx) dirEmpty(dir ids.Ino) (bool, error) {
	empty := true
	err := tx.scan(tx.key(RecEntry, dir, nil), nil, false, false, func([]byte, []byte) (bool, error) {
		empty = false
		return false, nil
	})
	return empty, err
}

func modeType(mode uint32) uint32 { return mode & syscall.S_IFMT }

// Lookup returns the attributes of name in parent.
func (s *Store) Lookup(parent ids.Ino, name string) (Attr, error) {
	if err := CheckName(name); err != nil {
		return Attr{}, err
	}
	var a Attr
	err := s.view(func(tx *Tx) error {
		if _, err := tx.dir(parent); err != nil {
			return err
		}
		e, ok, err := tx.entry(parent, name)
		if err != nil {
			return err
		}
		if !ok {
			return errNotFound
		}
		in, err := tx.inode(e.ino)
		if err != nil {
			if err == errNotFound {
				return wire.Errf(wire.CodeIO, "entry %q in %v points to missing %v", name, parent, e.ino)
			}
			return err
		}
		a = in.Attr
		return nil
	})
	return a, err
}

// Child returns the inode name's entry in parent points to, 0 if there is
// none. Unlike Lookup it does not read the child, which in a cluster may
// not be recovered on this server yet.
func (s *Store) Child(parent ids.Ino, name string) ids.Ino {
	var ino ids.Ino
	_ = s.view(func(tx *Tx) error {
		e, ok, err := tx.entry(parent, name)
		if ok && err == nil {
			ino = e.ino
		}
		return nil
	})
	return ino
}

// GetAttr returns an inode's attributes.
func (s *Store) GetAttr(ino ids.Ino) (Attr, error) {
	var a Attr
	err := s.view(func(tx *Tx) error {
		in, err := tx.inode(ino)
		if err == nil {
			a = in.Attr
		}
		return err
	})
	return a, err
}

// SetAttr changes attributes. A size change truncates or extends the file:
// pages past the new size are dropped and the last partial page is cut (a
// block-mapped file's extents are cut and the blocks they leave become
// garbage), so a later extension reads zeros. Truncating away more than deleteBatch pages
// takes several transactions, each leaving a valid shorter file.
func (s *Store) SetAttr(ino ids.Ino, in SetAttrIn, now int64) (Attr, error) {
	if in.Valid&wire.SetSize != 0 {
		if in.Size > s.maxSize {
			return Attr{}, wire.Errf(wire.CodeTooBig, "size %d", in.Size)
		}
		if err := s.shrink(ino, in.Size, now); err != nil {
			return Attr{}, err
		}
	}
	var a Attr
	_, err := s.update(func(tx *Tx) error {
		n, err := tx.inode(ino)
		if err != nil {
			return err
		}
		v := in.Valid
		if v&wire.SetSize != 0 {
			if err := checkRegular(n); err != nil {
				return err
			}
			if in.Size != n.Size {
				if err := tx.truncate(n, in.Size, now); err != nil {
					return err
				}
				n.Size = in.Size
				n.Version++
				n.Mtime = now
			}
		}
		if err := tx.setAttrs(n, in, now); err != nil {
			return err
		}
		n.touch()
		a = n.Attr
		return nil
	})
	return a, err
}

// setAttrs makes the changes in.Valid names other than the size, and sets
// the change time.
func (n *inode) setAttrs(in SetAttrIn, now int64) {
	v := in.Valid
	if v&wire.SetMode != 0 {
		n.Mode = modeType(n.Mode) | in.Mode&^syscall.S_IFMT
	}
	if v&wire.SetKillSuidgid != 0 {
		// FUSE's rule, which the kernel applies itself to truncates
		// (fuse_setattr): setgid without group execute is no privilege.
		// (A local file system also drops it for a writer outside the
		// file's group, whose other groups the server cannot see.)
		n.Mode &^= syscall.S_ISUID
		if n.Mode&syscall.S_IXGRP != 0 {
			n.Mode &^= syscall.S_ISGID
		}
	}
	if v&wire.SetUid != 0 {
		n.Uid = in.Uid
	}
	if v&wire.SetGid != 0 {
		n.Gid = in.Gid
	}
	switch {
	case v&wire.SetAtimeNow != 0:
		n.Atime = now
	case v&wire.SetAtime != 0:
		n.Atime = in.Atime
	}
	switch {
	case v&wire.SetMtimeNow != 0:
		n.Mtime = now
	case v&wire.SetMtime != 0:
		n.Mtime = in.Mtime
	}
	if v&wire.SetCtime != 0 {
		n.Ctime = in.Ctime
	} else {
		n.Ctime = now
	}
}

// regularInode loads ino, which must be a regular file (checkRegular).
func (tx *Tx) regularInode(ino ids.Ino) (*inode, error) {
	n, err := tx.inode(ino)
	if err != nil {
		return nil, err
	}
	return n, checkRegular(n)
}

func checkRegular(n *inode) error {
	switch modeType(n.Mode) {
	case syscall.S_IFREG:
		return nil
	case syscall.S_IFDIR:
		return errIsDir
	}
	return wire.Errf(wire.CodeInvalid, "%v is not a regular file", n.Ino)
}

// mknod is Create, Mkdir and Symlink.
func (s *Store) mknod(parent ids.Ino, name string, mode, uid, gid, rdev uint32, target string, now int64, ino ids.Ino) (Attr, error) {
	if err := CheckName(name); err != nil {
		return Attr{}, err
	}
	chosen := ino != 0 // by a client, from numbers AllocInos handed it
	var err error
	switch {
	case chosen && s.onAlloc != nil:
		return Attr{}, wire.Errf(wire.CodeInvalid, "a cluster server makes its new inodes' numbers itself")
	case chosen && !s.handedOut(ino):
		return Attr{}, wire.Errf(wire.CodeInvalid, "%v was not handed out by this server", ino)
	case !chosen:
		ino, err = s.allocIno() // outside the transaction: a retry must not allocate again
		if err != nil {
			return Attr{}, err
		}
		if s.onAlloc != nil {
			if err := s.onAlloc(ino); err != nil {
				return Attr{}, err
			}
		}
	}
	var a Attr
	_, err = s.update(func(tx *Tx) error {
		dir, err := tx.dir(parent)
		if err != nil {
			return err
		}
		if dir.Nlink == 0 {
			return errNotFound // removed directory still referenced by an open handle
		}
		_, exists, err := tx.entry(parent, name)
		if err != nil {
			return err
		}
		if exists {
			return errExists
		}
		if chosen {
			// a number handed out once: never made twice
			if used, err := tx.get(tx.key(RecAttr, ino, nil), nil); err != nil || used {
				return cmp.Or(err, wire.Errf(wire.CodeInvalid, "%v exists already", ino))
			}
		}
		typ := modeType(mode)
		if dir.Mode&syscall.S_ISGID != 0 { // BSD group semantics of setgid directories
			gid = dir.Gid
			if typ == syscall.S_IFDIR {
				mode |= syscall.S_ISGID
			}
		}
		n := &inode{Attr: Attr{Ino: ino, Mode: mode, Nlink: 1, Uid: uid, Gid: gid, Rdev: rdev,
			Atime: now, Mtime: now, Ctime: now}}
		if err := tx.inherit(parent, n, s.umask); err != nil {
			return err
		}
		switch typ {
		case syscall.S_IFDIR:
			n.Nlink = 2
			n.parent = parent
			n.nextCookie = firstCookie
			dir.Nlink++
		case syscall.S_IFLNK:
			n.Size = uint64(len(target))
			if err := tx.set(tx.key(RecSymlink, ino, nil), []byte(target)); err != nil {
				return err
			}
		}
		tx.addInode(n)
		if err := tx.newEntry(dir, name, ino, typ); err != nil {
			return err
		}
		dir.Mtime, dir.Ctime = now, now
		a = n.Attr
		return nil
	})
	return a, err
}

// Create makes a regular file, fifo, socket or device node (mode carries the
// type; none means regular). CodeExists if name exists.
func (s *Store) Create(parent ids.Ino, name string, mode, uid, gid, rdev uint32, now int64) (Attr, error) {
	switch modeType(mode) {
	case 0:
		mode |= syscall.S_IFREG
	case syscall.S_IFREG, syscall.S_IFIFO, syscall.S_IFSOCK, syscall.S_IFCHR, syscall.S_IFBLK:
	default:
		return Attr{}, wire.Errf(wire.CodeInvalid, "create with mode %o", mode)
	}
	return s.mknod(parent, name, mode, uid, gid, rdev, "", now, 0)
}

// CreateAs makes a regular file with inode number ino, which AllocInos
// handed out, and times now: a client made it behind its caller.
func (s *Store) CreateAs(ino, parent ids.Ino, name string, mode, uid, gid uint32, now int64) (Attr, error) {
	if t := modeType(mode); t != 0 && t != syscall.S_IFREG {
		return Attr{}, wire.Errf(wire.CodeInvalid, "create behind with mode %o", mode)
	}
	if ino == 0 {
		return Attr{}, wire.Errf(wire.CodeInvalid, "create behind without an inode number")
	}
	return s.mknod(parent, name, syscall.S_IFREG|mode&^syscall.S_IFMT, uid, gid, 0, "", now, ino)
}

// Mkdir makes a directory.
func (s *Store) Mkdir(parent ids.Ino, name string, mode, uid, gid uint32, now int64) (Attr, error) {
	return s.mknod(parent, name, syscall.S_IFDIR|mode&^syscall.S_IFMT, uid, gid, 0, "", now, 0)
}

// Symlink makes a symbolic link to target.
func (s *Store) Symlink(parent ids.Ino, name, target string, uid, gid uint32, now int64) (Attr, error) {
	if target == "" {
		return Attr{}, errNotFound // as symlink(2)
	}
	if len(target) > SymlinkMax {
		return Attr{}, wire.Errf(wire.CodeNameTooLong, "symlink target of %d bytes", len(target))
	}
	return s.mknod(parent, name, syscall.S_IFLNK|0o777, uid, gid, 0, target, now, 0)
}

// Readlink returns a symlink's target.
func (s *Store) Readlink(ino ids.Ino) (string, error) {
	var target string
	err := s.view(func(tx *Tx) error {
		n, err := tx.inode(ino)
		if err != nil {
			return err
		}
		if modeType(n.Mode) != syscall.S_IFLNK {
			return wire.Errf(wire.CodeInvalid, "%v is not a symlink", ino)
		}
		ok, err := tx.get(tx.key(RecSymlink, ino, nil), func(v []byte) error {
			target = string(v)
			return nil
		})
		if err == nil && !ok {
			err = wire.Errf(wire.CodeIO, "symlink %v has no target", ino)
		}
		return err
	})
	return target, err
}

// Link adds a hard link newParent/name to ino. CodePerm on directories.
func (s *Store) Link(ino, newParent ids.Ino, name string, now int64) (Attr, error) {
	if err := CheckName(name); err != nil {
		return Attr{}, err
	}
	var a Attr
	_, err := s.update(func(tx *Tx) error {
		n, err := tx.inode(ino)
		if err != nil {
			return err
		}
		if n.IsDir() {
			return wire.Errf(wire.CodePerm, "hard link to directory %v", ino)
		}
		if n.Nlink == 0 {
			return errNotFound // unlinked but open: linkat(2) says ENOENT
		}
		dir, err := tx.dir(newParent)
		if err != nil {
			return err
		}
		if dir.Nlink == 0 {
			return errNotFound
		}
		_, exists, err := tx.entry(newParent, name)
		if err != nil {
			return err
		}
		if exists {
			return errExists
		}
		if err := tx.newEntry(dir, name, ino, modeType(n.Mode)); err != nil {
			return err
		}
		dir.Mtime, dir.Ctime = now, now
		n.Nlink++
		n.Ctime = now
		n.touch()
		a = n.Attr
		return nil
	})
	return a, err
}

// Unlink removes name from parent and returns the inode's attributes after
// the removal. When its Nlink is 0 the inode stays (an orphan, for open
// handles) until the caller calls Purge, unless mayPurge says nobody has
// it open: then it goes in the same transaction (purged; a big file's
// first deleteBatch pages only, and the caller purges the rest). CodeIsDir
// on directories.
func (s *Store) Unlink(parent ids.Ino, name string, now int64, mayPurge func(ids.Ino) bool) (removed Attr, purged bool, err error) {
	if err := CheckName(name); err != nil {
		return Attr{}, false, err
	}
	_, err = s.update(func(tx *Tx) error {
		purged = false
		dir, err := tx.dir(parent)
		if err != nil {
			return err
		}
		e, ok, err := tx.entry(parent, name)
		if err != nil {
			return err
		}
		if !ok {
			return errNotFound
		}
		if e.typ == syscall.S_IFDIR {
			return errIsDir
		}
		n, err := tx.inode(e.ino)
		if err != nil {
			return err
		}
		if err := tx.delEntry(parent, name, e); err != nil {
			return err
		}
		dir.Mtime, dir.Ctime = now, now
		dir.touch()
		if n.Nlink > 0 {
			n.Nlink--
		}
		n.Ctime = now
		n.touch()
		removed = n.Attr
		if n.Nlink == 0 && mayPurge != nil && mayPurge(n.Ino) {
			_, purged, err = tx.purgeStep(n, nil, now)
		}
		return err
	})
	return removed, purged, err
}

// Rmdir removes an empty directory.
func (s *Store) Rmdir(parent ids.Ino, name string, now int64) error {
	if err := CheckName(name); err != nil {
		return err
	}
	_, err := s.update(func(tx *Tx) error {
		dir, err := tx.dir(parent)
		if err != nil {
			return err
		}
		e, ok, err := tx.entry(parent, name)
		if err != nil {
			return err
		}
		if !ok {
			return errNotFound
		}
		if e.typ != syscall.S_IFDIR {
			return errNotDir
		}
		child, err := tx.inode(e.ino)
		if err != nil {
			return err
		}
		if err := tx.removeDir(child); err != nil {
			return err
		}
		if err := tx.delEntry(parent, name, e); err != nil {
			return err
		}
		dir.Nlink--
		dir.Mtime, dir.Ctime = now, now
		dir.touch()
		return nil
	})
	return err
}

// removeDir deletes an empty directory's records (CodeNotEmpty otherwise).
func (tx *Tx) removeDir(d *inode) error {
	empty, err := tx.dirEmpty(d.Ino)
	if err != nil {
		return err
	}
	if !empty {
		return wire.Err(wire.CodeNotEmpty)
	}
	if err := tx.delXattrs(d.Ino); err != nil {
		return err
	}
	if err := tx.delDone(d.Ino); err != nil {
		return err
	}
	d.Nlink = 0
	d.deleted = true
	return nil
}

// Rename moves oldParent/oldName to newParent/newName. Over an existing
// target it replaces a file by a file or an empty directory by a directory
// (CodeNotEmpty, CodeIsDir, CodeNotDir as rename(2)); RenameNoReplace fails
// with CodeExists instead; RenameExchange swaps the two. It returns the
// replaced inode's attributes after the removal (Nlink 0: purge it unless
// open), nil if nothing was replaced.
func (s *Store) Rename(oldParent ids.Ino, oldName string, newParent ids.Ino, newName string, flags uint32, now int64) (replaced *Attr, err error) {
	if err := CheckName(oldName); err != nil {
		return nil, err
	}
	if err := CheckName(newName); err != nil {
		return nil, err
	}
	if flags&^(RenameNoReplace|RenameExchange) != 0 || flags == RenameNoReplace|RenameExchange {
		return nil, wire.Errf(wire.CodeInvalid, "rename flags %#x", flags)
	}
	_, err = s.update(func(tx *Tx) error {
		replaced = nil
		r, err := tx.rename(oldParent, oldName, newParent, newName, flags, now)
		replaced = r
		return err
	})
	return replaced, err
}

// renaming is a rename's two names, what they name and the directories
// they are in, as it found them.
type renaming struct {
	oldParent, newParent ids.Ino
	oldName, newName     string
	odir, ndir           *inode
	src, dst             entry
	dstOK                bool   // the new name exists
	sn                   *inode // the inode moved
	srcDir               bool
}

func (tx *Tx) rename(oldParent ids.Ino, oldName string, newParent ids.Ino, newName string, flags uint32, now int64) (*Attr, error) {
	rn, noop, err := tx.renameResolve(oldParent, oldName, newParent, newName, flags)
	if err != nil || noop {
		return nil, err
	}
	rn.odir.Mtime, rn.odir.Ctime = now, now
	rn.ndir.Mtime, rn.ndir.Ctime = now, now
	rn.odir.touch()
	rn.ndir.touch()
	rn.sn.Ctime = now
	rn.sn.touch()
	if flags&RenameExchange != 0 {
		return nil, tx.renameExchange(rn, now)
	}
	var replaced *Attr
	cookie := uint64(0)
	if rn.dstOK {
		if replaced, err = tx.renameReplace(rn, now); err != nil {
			return nil, err
		}
		// the new name takes the replaced entry's cookie: a listing in
		// progress sees the name once, not twice
		cookie = rn.dst.cookie
	}
	return replaced, tx.renameMove(rn, cookie)
}

// renameResolve looks up both directories and both names and checks that
// the rename may be made; noop is a rename of a name onto itself (or onto
// another hard link of the same file), which rename(2) leaves undone.
func (tx *Tx) renameResolve(oldParent ids.Ino, oldName string, newParent ids.Ino, newName string, flags uint32) (rn *renaming, noop bool, err error) {
	rn = &renaming{oldParent: oldParent, newParent: newParent, oldName: oldName, newName: newName}
	if rn.odir, err = tx.dir(oldParent); err != nil {
		return nil, false, err
	}
	if rn.ndir, err = tx.dir(newParent); err != nil {
		return nil, false, err
	}
	var ok bool
	if rn.src, ok, err = tx.entry(oldParent, oldName); err != nil {
		return nil, false, err
	}
	if !ok || rn.ndir.Nlink == 0 {
		return nil, false, errNotFound
	}
	if rn.dst, rn.dstOK, err = tx.entry(newParent, newName); err != nil {
		return nil, false, err
	}
	if flags&RenameExchange != 0 && !rn.dstOK {
		return nil, false, errNotFound
	}
	if flags&RenameNoReplace != 0 && rn.dstOK {
		return nil, false, errExists
	}
	if rn.dstOK && rn.dst.ino == rn.src.ino {
		return nil, true, nil
	}
	if rn.sn, err = tx.inode(rn.src.ino); err != nil {
		return nil, false, err
	}
	rn.srcDir = rn.src.typ == syscall.S_IFDIR
	// a directory must not move into its own subtree
	if rn.srcDir && oldParent != newParent {
		if err := tx.checkNotAncestor(rn.src.ino, newParent); err != nil {
			return nil, false, err
		}
	}
	return rn, false, nil
}

// renameExchange swaps what the two names point to (RENAME_EXCHANGE).
func (tx *Tx) renameExchange(rn *renaming, now int64) error {
	src, dst := rn.src, rn.dst
	dn, err := tx.inode(dst.ino)
	if err != nil {
		return err
	}
	dstDir := dst.typ == syscall.S_IFDIR
	if dstDir && rn.oldParent != rn.newParent {
		if err := tx.checkNotAncestor(dst.ino, rn.oldParent); err != nil {
			return err
		}
	}
	// each name keeps its cookie; only what it points to changes
	if err := tx.putEntry(rn.oldParent, rn.oldName, entry{ino: dst.ino, typ: dst.typ, cookie: src.cookie}); err != nil {
		return err
	}
	if err := tx.putEntry(rn.newParent, rn.newName, entry{ino: src.ino, typ: src.typ, cookie: dst.cookie}); err != nil {
		return err
	}
	if rn.srcDir {
		rn.sn.parent = rn.newParent
		rn.odir.Nlink--
		rn.ndir.Nlink++
	}
	if dstDir {
		dn.parent = rn.oldParent
		rn.ndir.Nlink--
		rn.odir.Nlink++
	}
	dn.Ctime = now
	dn.touch()
	return nil
}

// renameReplace unlinks the inode the new name pointed to (an empty
// directory is removed) and returns its attributes.
func (tx *Tx) renameReplace(rn *renaming, now int64) (*Attr, error) {
	dn, err := tx.inode(rn.dst.ino)
	if err != nil {
		return nil, err
	}
	dstDir := rn.dst.typ == syscall.S_IFDIR
	switch {
	case rn.srcDir && !dstDir:
		return nil, errNotDir
	case !rn.srcDir && dstDir:
		return nil, errIsDir
	case dstDir:
		if err := tx.removeDir(dn); err != nil {
			return nil, err
		}
		rn.ndir.Nlink-- // the replaced directory's ".."
	default:
		if dn.Nlink > 0 {
			dn.Nlink--
		}
		dn.Ctime = now
		dn.touch()
	}
	a := dn.Attr
	return &a, nil
}

// renameMove moves the old name's entry to the new name, with the given
// cookie (0: a new one).
func (tx *Tx) renameMove(rn *renaming, cookie uint64) error {
	src := rn.src
	if err := tx.delEntry(rn.oldParent, rn.oldName, src); err != nil {
		return err
	}
	var err error
	if cookie != 0 {
		err = tx.putEntry(rn.newParent, rn.newName, entry{ino: src.ino, typ: src.typ, cookie: cookie})
	} else {
		err = tx.newEntry(rn.ndir, rn.newName, src.ino, src.typ)
	}
	if err != nil {
		return err
	}
	if rn.srcDir {
		rn.sn.parent = rn.newParent
		rn.odir.Nlink--
		rn.ndir.Nlink++
	}
	return nil
}

// checkNotAncestor fails with CodeInvalid if dir is ino or inside it.
func (tx *Tx) checkNotAncestor(ino, dir ids.Ino) error {
	for range 1 << 16 { // bounded: a cycle would be a corrupt store
		if dir == ino {
			return wire.Errf(wire.CodeInvalid, "cannot move %v into its own subtree", ino)
		}
		if dir == ids.RootIno {
			return nil
		}
		d, err := tx.inode(dir)
		if err != nil {
			return err
		}
		dir = d.parent
	}
	return wire.Errf(wire.CodeIO, "directory tree deeper than 65536 or cyclic at %v", dir)
}

// ReadDir lists dir's entries with cookies greater than after, at most max
// (0: 1024), in cookie order. Every entry gets its cookie when it is added,
// from a per-directory counter, so entries added or removed during a listing
// never make it skip or repeat a surviving entry. "." and ".." are not
// included.
func (s *Store) ReadDir(dir ids.Ino, after uint64, max int) ([]DirEntry, error) {
	if max <= 0 {
		max = 1024
	}
	var out []DirEntry
	err := s.view(func(tx *Tx) error {
		if _, err := tx.dir(dir); err != nil {
			return err
		}
		prefix := tx.key(RecCookie, dir, nil)
		start := tx.key64(RecCookie, dir, after+1)
		if after == ^uint64(0) {
			return nil
		}
		return tx.scan(prefix, start, false, true, func(k, v []byte) (bool, error) {
			if len(k) != 17 || len(v) < 12 {
				return false, wire.Errf(wire.CodeIO, "corrupt cookie record in %v", dir)
			}
			out = append(out, DirEntry{
				Name: string(v[12:]),
				Ino:  ids.Ino(binary.BigEndian.Uint64(v)),
				Mode: binary.BigEndian.Uint32(v[8:]),
				Off:  binary.BigEndian.Uint64(k[9:]),
			})
			return len(out) < max, nil
		})
	})
	return out, err
}

// StatFs reports the data directory's file system's size, and as free
// what clients can still write there: its free space less the reserve the
// store keeps for badger and for removals (space.go). It also reports a
// nominal inode count.
func (s *Store) StatFs() (StatFs, error) {
	const files = 1 << 32
	s.inoMu.Lock()
	used := s.nextIno
	s.inoMu.Unlock()
	out := StatFs{Bsize: 4096, NameLen: NameMax, Files: files, Ffree: files - min(used, files)}
	if s.space == nil {
		out.Blocks, out.Bfree, out.Bavail = 1<<28, 1<<28, 1<<28 // in memory: 1 TiB nominal
		return out, nil
	}
	free, total, err := s.space.free()
	if err != nil {
		return StatFs{}, wire.Errf(wire.CodeIO, "%v", err)
	}
	out.Blocks = uint64(total) / 4096
	out.Bfree = uint64(free) / 4096
	out.Bavail = out.Bfree
	return out, nil
}
