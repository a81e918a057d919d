// Package posixacl reads, checks and computes POSIX.1e access control
// lists in the form Linux passes them as extended attributes
// (system.posix_acl_access, system.posix_acl_default; linux
// posix_acl_xattr.h), with the kernel's rules for keeping an ACL and a
// file's mode in step (fs/posix_acl.c: posix_acl_valid,
// posix_acl_equiv_mode, posix_acl_create_masq, __posix_acl_chmod).
//
// It is pure: no I/O. The metadata server applies it to the ACLs it
// stores; the kernel enforces them.
package posixacl

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// The extended attribute names of the two ACLs of an inode.
const (
	AccessName  = "system.posix_acl_access"
	DefaultName = "system.posix_acl_default"
)

// IsACL reports whether name is one of the ACL attributes.
func IsACL(name string) bool { return name == AccessName || name == DefaultName }

// Tag is an entry's kind. Entries are ordered by tag, then by Id.
type Tag uint16

const (
	UserObj  Tag = 0x01 // the owner
	User     Tag = 0x02 // a named user
	GroupObj Tag = 0x04 // the owning group
	Group    Tag = 0x08 // a named group
	Mask     Tag = 0x10 // the most named users and groups and the owning group get
	Other    Tag = 0x20 // everyone else
)

func (t Tag) String() string {
	switch t {
	case UserObj:
		return "user_obj"
	case User:
		return "user"
	case GroupObj:
		return "group_obj"
	case Group:
		return "group"
	case Mask:
		return "mask"
	case Other:
		return "other"
	}
	return fmt.Sprintf("tag(%#x)", uint16(t))
}

// Entry is one entry: who (Tag, and Id for User and Group) may do what
// (Perm: read 4, write 2, execute 1).
type Entry struct {
	Tag  Tag
	Perm uint16
	Id   uint32
}

// ACL is a valid access control list: entries in order, one each of
// UserObj, GroupObj and Other, a Mask if there is any User or Group entry.
type ACL []Entry

// ErrInvalid is what Parse returns for anything but a valid ACL.
var ErrInvalid = errors.New("posixacl: invalid ACL")

const (
	version     = 2
	headerSize  = 4
	entrySize   = 8
	undefinedID = 0xffffffff
	// MaxEntries bounds an ACL: the kernel passes at most a page (4 KiB).
	MaxEntries = (4096 - headerSize) / entrySize
)

// Parse reads and checks an ACL attribute's value (version 2, whole
// entries, rwx permissions only, entries in order without duplicates, the
// required entries present).
func Parse(b []byte) (ACL, error) {
	if len(b) < headerSize || (len(b)-headerSize)%entrySize != 0 {
		return nil, fmt.Errorf("%w: %d bytes", ErrInvalid, len(b))
	}
	if v := binary.LittleEndian.Uint32(b); v != version {
		return nil, fmt.Errorf("%w: version %d", ErrInvalid, v)
	}
	n := (len(b) - headerSize) / entrySize
	if n > MaxEntries {
		return nil, fmt.Errorf("%w: %d entries", ErrInvalid, n)
	}
	a := make(ACL, n)
	for i := range a {
		e := b[headerSize+i*entrySize:]
		a[i] = Entry{Tag: Tag(binary.LittleEndian.Uint16(e)), Perm: binary.LittleEndian.Uint16(e[2:]),
			Id: binary.LittleEndian.Uint32(e[4:])}
		if a[i].Tag != User && a[i].Tag != Group {
			a[i].Id = undefinedID // meaningless for the others (the kernel sends -1)
		}
	}
	if err := a.check(); err != nil {
		return nil, err
	}
	return a, nil
}

// check is the kernel's posix_acl_valid: entries in tag order, named users
// and groups by ascending id, one of each required entry.
func (a ACL) check() error {
	var seen Tag // the tags met so far, as bits
	named := false
	for i, e := range a {
		if e.Perm&^7 != 0 {
			return fmt.Errorf("%w: permissions %#o in entry %d", ErrInvalid, e.Perm, i)
		}
		if i > 0 && (e.Tag < a[i-1].Tag || e.Tag == a[i-1].Tag && (e.Tag != User && e.Tag != Group || e.Id <= a[i-1].Id)) {
			return fmt.Errorf("%w: entry %d (%v) out of order or repeated", ErrInvalid, i, e.Tag)
		}
		switch e.Tag {
		case UserObj, GroupObj, Mask, Other:
		case User, Group:
			named = true
		default:
			return fmt.Errorf("%w: %v in entry %d", ErrInvalid, e.Tag, i)
		}
		seen |= e.Tag
	}
	if seen&UserObj == 0 || seen&GroupObj == 0 || seen&Other == 0 {
		return fmt.Errorf("%w: no user_obj, group_obj or other entry", ErrInvalid)
	}
	if named && seen&Mask == 0 {
		return fmt.Errorf("%w: named users or groups without a mask", ErrInvalid)
	}
	return nil
}

// Encode returns the attribute value of a.
func (a ACL) Encode() []byte {
	b := make([]byte, headerSize, headerSize+len(a)*entrySize)
	binary.LittleEndian.PutUint32(b, version)
	for _, e := range a {
		b = binary.LittleEndian.AppendUint16(b, uint16(e.Tag))
		b = binary.LittleEndian.AppendUint16(b, e.Perm)
		b = binary.LittleEndian.AppendUint32(b, e.Id)
	}
	return b
}

// Mode returns the permission bits (0777) a gives the mode: the owner's
// from UserObj, the group's from Mask if there is one (else GroupObj),
// the others' from Other; and whether a says no more than that mode does
// (no Mask, no named entries), so that the mode alone can stand for it.
func (a ACL) Mode() (perm uint32, equiv bool) {
	equiv = true
	for _, e := range a {
		p := uint32(e.Perm)
		switch e.Tag {
		case UserObj:
			perm |= p << 6
		case GroupObj:
			perm |= p << 3
		case Mask:
			perm = perm&^0o70 | p<<3 // after GroupObj: the order is checked
			equiv = false
		case Other:
			perm |= p
		case User, Group:
			equiv = false
		}
	}
	return perm, equiv
}

// Chmod returns a copy of a with the permission bits of mode: UserObj
// takes the owner's, Mask (if any, else GroupObj) the group's, Other the
// others'; named entries stay (chmod(2) on a file with an ACL).
func (a ACL) Chmod(mode uint32) ACL {
	out := append(ACL(nil), a...)
	group := out.groupClass()
	for i := range out {
		switch out[i].Tag {
		case UserObj:
			out[i].Perm = uint16(mode >> 6 & 7)
		case Other:
			out[i].Perm = uint16(mode & 7)
		}
	}
	out[group].Perm = uint16(mode >> 3 & 7)
	return out
}

// groupClass is the index of the entry that holds the group class's
// permissions: the Mask, or GroupObj without one.
func (a ACL) groupClass() int {
	g := -1
	for i, e := range a {
		switch e.Tag {
		case Mask:
			return i
		case GroupObj:
			g = i
		}
	}
	return g
}

// Inherit computes what an inode made with mode (type and permission
// bits, no umask: a default ACL takes its place) in a directory with
// default ACL def gets: its mode, whose permission bits are the creation
// mode's masked by the ACL's; its access ACL, def with each class's
// permissions masked by the creation mode (nil if the mode alone says as
// much); and, for a directory, def again as its own default ACL (nil for
// anything else).
func Inherit(def ACL, mode uint32, dir bool) (newMode uint32, access, dflt ACL) {
	acc := append(ACL(nil), def...)
	perm := mode & 0o777
	for i := range acc {
		switch acc[i].Tag {
		case UserObj:
			acc[i].Perm &= uint16(perm >> 6 & 7)
			perm &= uint32(acc[i].Perm)<<6 | ^uint32(0o700)
		case Other:
			acc[i].Perm &= uint16(perm & 7)
			perm &= uint32(acc[i].Perm) | ^uint32(0o7)
		}
	}
	g := acc.groupClass()
	acc[g].Perm &= uint16(perm >> 3 & 7)
	perm &= uint32(acc[g].Perm)<<3 | ^uint32(0o70)
	newMode = mode&^0o777 | perm
	if _, equiv := acc.Mode(); !equiv {
		access = acc
	}
	if dir {
		dflt = append(ACL(nil), def...)
	}
	return newMode, access, dflt
}
