package store

import (
	"syscall"

	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/internal/posixacl"
	"github.com/leasefs/leasefs/wire"
)

// POSIX ACLs. An inode's access and default ACLs are extended attributes
// (posixacl.AccessName, posixacl.DefaultName) in the kernel's format,
// records of the inode like any other, so they replicate and move with it.
// The store keeps them in step with the mode, as a local file system does:
//
//   - setting an access ACL sets the mode's permission bits from it (the
//     group class from the mask), and one the mode alone says is stored as
//     the mode only;
//   - a chmod rewrites the access ACL's owner, group class and other
//     entries;
//   - an inode made in a directory with a default ACL inherits it
//     (posixacl.Inherit) instead of having the umask applied, and a
//     directory takes it as its own default ACL too;
//   - only directories have a default ACL.
//
// The kernel (FUSE_POSIX_ACL) checks permissions against them and caches
// them; it checks who may set them too.

// WithUmask returns a view of the store whose creates apply umask to the
// mode where the directory has no default ACL (a default ACL takes the
// umask's place); the store's own creates apply none.
func (s *Store) WithUmask(umask uint32) *Store {
	v := *s
	v.umask = umask & 0o777
	return &v
}

// acl reads and parses one of ino's ACLs; ok is false if it has none.
func (tx *Tx) acl(ino ids.Ino, name string) (a posixacl.ACL, ok bool, err error) {
	var perr error
	ok, err = tx.get(tx.keyStr(RecXattr, ino, name), func(v []byte) error {
		a, perr = posixacl.Parse(v)
		return nil
	})
	if err == nil && ok && perr != nil {
		err = wire.Errf(wire.CodeIO, "corrupt %s of %v: %v", name, ino, perr)
	}
	return a, ok, err
}

// HasDefaultACL reports whether directory dir has a default ACL.
func (s *Store) HasDefaultACL(dir ids.Ino) (bool, error) {
	var ok bool
	err := s.view(func(tx *Tx) error {
		var err error
		ok, err = tx.get(tx.keyStr(RecXattr, dir, posixacl.DefaultName), nil)
		return err
	})
	return ok, err
}

// inherit gives n, which mknod is making in dir with its creation mode,
// its mode and ACLs: from dir's default ACL if it has one, else the mode
// with the umask applied. Symbolic links have neither (mode 0777).
func (tx *Tx) inherit(dir ids.Ino, n *inode, umask uint32) error {
	if modeType(n.Mode) == syscall.S_IFLNK {
		return nil
	}
	def, ok, err := tx.acl(dir, posixacl.DefaultName)
	if err != nil {
		return err
	}
	if !ok {
		n.Mode &^= umask & 0o777
		return nil
	}
	var access, dflt posixacl.ACL
	n.Mode, access, dflt = posixacl.Inherit(def, n.Mode, n.IsDir())
	if access != nil {
		if err := tx.set(tx.keyStr(RecXattr, n.Ino, posixacl.AccessName), access.Encode()); err != nil {
			return err
		}
	}
	if dflt != nil {
		return tx.set(tx.keyStr(RecXattr, n.Ino, posixacl.DefaultName), dflt.Encode())
	}
	return nil
}

// chmodACL rewrites n's access ACL, if it has one, for its mode.
func (tx *Tx) chmodACL(n *inode) error {
	a, ok, err := tx.acl(n.Ino, posixacl.AccessName)
	if err != nil || !ok {
		return err
	}
	return tx.set(tx.keyStr(RecXattr, n.Ino, posixacl.AccessName), a.Chmod(n.Mode).Encode())
}

// setAttrs makes the changes in (setAttrs) and keeps n's access ACL in
// step with a new mode.
func (tx *Tx) setAttrs(n *inode, in SetAttrIn, now int64) error {
	n.setAttrs(in, now)
	if in.Valid&wire.SetMode == 0 {
		return nil
	}
	return tx.chmodACL(n)
}

// setACL sets one of n's ACLs to value (SetXattr of an ACL's name); key
// is its record, which exists or not as the caller found (exists).
func (tx *Tx) setACL(n *inode, name string, key []byte, exists bool, value []byte, flags uint32, now int64) error {
	if modeType(n.Mode) == syscall.S_IFLNK {
		return wire.Errf(wire.CodeNotSupported, "ACL on symlink %v", n.Ino)
	}
	a, err := posixacl.Parse(value)
	if err != nil {
		return wire.Errf(wire.CodeInvalid, "%s: %v", name, err)
	}
	n.Ctime = now
	n.touch()
	if name == posixacl.DefaultName {
		if !n.IsDir() {
			return wire.Errf(wire.CodeAccess, "default ACL on non-directory %v", n.Ino)
		}
		return tx.set(key, a.Encode())
	}
	perm, equiv := a.Mode()
	n.Mode = n.Mode&^0o777 | perm
	if flags&wire.XattrKillSgid != 0 {
		n.Mode &^= syscall.S_ISGID
	}
	if !equiv {
		return tx.set(key, a.Encode())
	}
	// the mode says it all: no record, as a local file system keeps it
	if exists {
		return tx.del(key)
	}
	return nil
}
