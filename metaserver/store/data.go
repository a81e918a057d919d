package store

import (
	"bytes"
	"encoding/binary"
	"sync"
	"syscall"

	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/internal/posixacl"
	"github.com/leasefs/leasefs/wire"
)

// pagePool holds page-sized buffers for partial-page read-modify-write;
// a transaction returns them after its commit.
var pagePool = sync.Pool{New: func() any { b := make([]byte, PageSize); return &b }}

func (tx *Tx) pageBuf() []byte {
	p := pagePool.Get().(*[]byte)
	tx.bufs = append(tx.bufs, p)
	return (*p)[:PageSize]
}

// Read returns up to size bytes at off: short at end of file, holes read as
// zeros. The caller owns the returned slice.
func (s *Store) Read(ino ids.Ino, off uint64, size int) ([]byte, error) {
	out, _, err := s.ReadWithAttr(ino, off, size, nil)
	return out, err
}

// ReadWithAttr is Read that also returns the attributes the data belongs
// to (their Version orders reads of the same file). alloc, unless nil,
// gives the buffer for n bytes of data (its contents may be anything).
func (s *Store) ReadWithAttr(ino ids.Ino, off uint64, size int, alloc func(n int) []byte) ([]byte, Attr, error) {
	if size < 0 {
		return nil, Attr{}, wire.Errf(wire.CodeInvalid, "read of %d bytes", size)
	}
	var out []byte
	var attr Attr
	err := s.view(func(tx *Tx) error {
		n, err := tx.regularInode(ino)
		if err != nil {
			return err
		}
		if n.mapped {
			return ErrMapped
		}
		attr = n.Attr
		if off >= n.Size {
			out = []byte{}
			return nil
		}
		m := int(min(uint64(size), n.Size-off))
		if alloc != nil {
			out = alloc(m)[:m]
			clear(out) // holes read as zeros
		} else {
			out = make([]byte, m)
		}
		return tx.readPages(ino, off, out)
	})
	if err != nil {
		return nil, Attr{}, err
	}
	return out, attr, nil
}

// ReadAt reads into dst at off and returns the number of bytes read (short
// at end of file), for callers that reuse buffers.
func (s *Store) ReadAt(ino ids.Ino, off uint64, dst []byte) (int, error) {
	var got int
	err := s.view(func(tx *Tx) error {
		n, err := tx.regularInode(ino)
		if err != nil {
			return err
		}
		if n.mapped {
			return ErrMapped
		}
		if off >= n.Size {
			return nil
		}
		got = int(min(uint64(len(dst)), n.Size-off))
		clear(dst[:got])
		return tx.readPages(ino, off, dst[:got])
	})
	return got, err
}

// readPages fills out (zeroed) with the file's bytes at off. Missing pages
// and bytes past a page's stored length are holes and stay zero. A read of
// one page is one lookup; a longer one is one scan of its pages (a 1 MiB
// read is 256 pages, a seek each would cost more).
func (tx *Tx) readPages(ino ids.Ino, off uint64, out []byte) error {
	if len(out) == 0 {
		return nil
	}
	end := off + uint64(len(out))
	first, last := off/PageSize, (end-1)/PageSize
	fill := func(pi uint64, v []byte) {
		ps := pi * PageSize
		s0, e0 := max(off, ps)-ps, min(end-ps, PageSize)
		if uint64(len(v)) > s0 {
			copy(out[ps+s0-off:], v[s0:min(uint64(len(v)), e0)])
		}
	}
	if first == last {
		_, err := tx.get(tx.key64(RecPage, ino, first), func(v []byte) error {
			fill(first, v)
			return nil
		})
		return err
	}
	return tx.scan(tx.key(RecPage, ino, nil), tx.key64(RecPage, ino, first), false, true, func(k, v []byte) (bool, error) {
		pi := binary.BigEndian.Uint64(k[9:])
		if pi > last {
			return false, nil
		}
		fill(pi, v)
		return pi < last, nil
	})
}

// Write writes data at off and updates size, mtime, ctime and Version. A
// page the write covers completely (up to the file's end) is written as is,
// without reading it; a partial page is read, modified and written. The
// store keeps data until the commit, inside this call, and does not retain it.
func (s *Store) Write(ino ids.Ino, off uint64, data []byte, now int64) (Attr, error) {
	return s.WriteSetAttr(ino, SpanAt(off, data), data, SetAttrIn{}, now)
}

// SpanAt is the one span of a write of data at off (none for no data).
func SpanAt(off uint64, data []byte) []wire.Span {
	if len(data) == 0 {
		return nil
	}
	return []wire.Span{{Off: off, Len: uint32(len(data))}}
}

// maxWritePages bounds the pages one write may touch, which keeps its
// transaction within badger's size limit: twice the pages of a write of
// wire.MaxData bytes, for scattered writes.
const maxWritePages = 2 * wire.MaxData / PageSize

// WriteSetAttr writes data into the spans (ascending and disjoint, data
// holding their bytes one after another; see wire.Request.Spans), then
// makes the changes of mode, owner and times in (its Valid within
// wire.WriteAttrs), all in one transaction.
func (s *Store) WriteSetAttr(ino ids.Ino, spans []wire.Span, data []byte, in SetAttrIn, now int64) (Attr, error) {
	return s.writeSetAttr(ino, func(uint64) []wire.Span { return spans }, data, in, now)
}

// Append is WriteSetAttr of data at the file's end as its transaction
// finds it (O_APPEND): no read before it, and no writer between.
func (s *Store) Append(ino ids.Ino, data []byte, in SetAttrIn, now int64) (Attr, error) {
	return s.writeSetAttr(ino, func(size uint64) []wire.Span { return SpanAt(size, data) }, data, in, now)
}

// checkSpans checks that spans fit in a file of at most maxSize bytes and
// hold n bytes.
func checkSpans(spans []wire.Span, n int, maxSize uint64) error {
	total := 0
	for _, sp := range spans {
		total += int(sp.Len)
		if end := sp.Off + uint64(sp.Len); end < sp.Off || end > maxSize {
			return wire.Errf(wire.CodeTooBig, "write past %d", maxSize)
		}
	}
	if total != n {
		return wire.Errf(wire.CodeInvalid, "write spans hold %d bytes, data has %d", total, n)
	}
	return nil
}

// writeSetAttr is WriteSetAttr with the spans that spansAt gives for the
// file's size.
func (s *Store) writeSetAttr(ino ids.Ino, spansAt func(size uint64) []wire.Span, data []byte, in SetAttrIn, now int64) (Attr, error) {
	if in.Valid&^wire.WriteAttrs != 0 {
		return Attr{}, wire.Errf(wire.CodeInvalid, "a write cannot carry attribute changes %#x", in.Valid&^wire.WriteAttrs)
	}
	var a Attr
	write := func(tx *Tx) error {
		n, err := tx.regularInode(ino)
		if err != nil {
			return err
		}
		spans := spansAt(n.Size)
		if err := checkSpans(spans, len(data), s.maxSize); err != nil {
			return err
		}
		if len(data) == 0 && in.Valid == 0 {
			a = n.Attr
			return nil
		}
		if n.mapped && len(data) > 0 {
			return ErrMapped
		}
		if err := tx.writeSpans(n, spans, data); err != nil {
			return err
		}
		if len(data) > 0 {
			last := spans[len(spans)-1]
			n.Size = max(n.Size, last.Off+uint64(last.Len))
			n.Version++
			n.Mtime, n.Ctime = now, now
			if err := tx.killCapability(ino); err != nil {
				return err
			}
		}
		if in.Valid != 0 {
			if err := tx.setAttrs(n, in, now); err != nil {
				return err
			}
		}
		n.touch()
		a = n.Attr
		return nil
	}
	var err error
	if len(data) == 0 && in.Valid == 0 {
		err = s.view(write)
	} else {
		_, err = s.update(write)
	}
	return a, err
}

// capabilityXattr holds a file's capabilities (setcap): privileges, like
// setuid.
const capabilityXattr = "security.capability"

// killCapability removes the file capabilities of a file being written,
// as Linux does whoever writes (security_inode_killpriv): the kernel does
// it itself for writes through its page cache, truncates and fallocate,
// not for a FUSE file's direct writes. A write the client buffered drops
// them when it reaches the server.
func (tx *Tx) killCapability(ino ids.Ino) error {
	key := tx.keyStr(RecXattr, ino, capabilityXattr)
	ok, err := tx.get(key, nil)
	if err != nil || !ok {
		return err
	}
	return tx.del(key)
}

// writeSpans stores the spans' bytes in n's pages, each page written
// once: a page a piece covers from its start past the stored bytes is the
// piece itself; otherwise the stored bytes are read and patched.
func (tx *Tx) writeSpans(n *inode, spans []wire.Span, data []byte) error {
	var (
		cur     = ^uint64(0) // the page being assembled
		val     []byte       // its new content
		patched bool         // val is a buffer of the transaction's, not a piece
		pages   int
	)
	store := func() error {
		if cur == ^uint64(0) {
			return nil
		}
		return tx.set(tx.key64(RecPage, n.Ino, cur), val)
	}
	for _, sp := range spans {
		d := data[:sp.Len]
		data = data[sp.Len:]
		end := sp.Off + uint64(sp.Len)
		for pos := sp.Off; pos < end; {
			ci := pos / PageSize
			cs := ci * PageSize
			s0, e0 := pos-cs, min(end-cs, PageSize)
			piece := d[pos-sp.Off : pos-sp.Off+(e0-s0)]
			pos = cs + e0
			if ci != cur {
				if err := store(); err != nil {
					return err
				}
				if pages++; pages > maxWritePages {
					return wire.Errf(wire.CodeTooBig, "a write may touch at most %d pages of %d bytes", maxWritePages, PageSize)
				}
				cur, patched = ci, false
				// pages never hold bytes past Size, so this bounds what exists
				var existing uint64
				if cs < n.Size {
					existing = min(n.Size-cs, PageSize)
				}
				if s0 == 0 && e0 >= existing {
					val = piece
					continue
				}
				val = tx.pageBuf()[:0]
				if existing > 0 {
					if _, err := tx.get(tx.key64(RecPage, n.Ino, ci), func(v []byte) error {
						val = append(val, v...)
						return nil
					}); err != nil {
						return err
					}
				}
				patched = true
			} else if !patched {
				val = append(tx.pageBuf()[:0], val...)
				patched = true
			}
			have := uint64(len(val))
			if have < e0 {
				val = val[:e0] // within the page buffer's capacity
			}
			if have < s0 {
				clear(val[have:s0])
			}
			copy(val[s0:e0], piece)
		}
	}
	return store()
}

// truncate drops n's data past size (at most about deleteBatch pages; shrink
// takes the rest first). It does not change n's size; a block-mapped
// file's freed blocks become garbage (now is the change's time).
func (tx *Tx) truncate(n *inode, size uint64, now int64) error {
	if size >= n.Size {
		return nil // pages and extents never hold bytes past Size: an extension reads zeros
	}
	if n.mapped {
		return tx.truncateBlocks(n, size, now)
	}
	first := (size + PageSize - 1) / PageSize
	var keys [][]byte
	err := tx.scan(tx.key(RecPage, n.Ino, nil), tx.key64(RecPage, n.Ino, first), false, false,
		func(k, _ []byte) (bool, error) {
			keys = append(keys, tx.key(RecPage, n.Ino, k[9:]))
			return true, nil
		})
	if err != nil {
		return err
	}
	for _, k := range keys {
		if err := tx.del(k); err != nil {
			return err
		}
	}
	if keep := size % PageSize; keep != 0 {
		key := tx.key64(RecPage, n.Ino, size/PageSize)
		var cut []byte
		if _, err := tx.get(key, func(v []byte) error {
			if uint64(len(v)) > keep {
				cut = append(tx.pageBuf()[:0], v[:keep]...)
			}
			return nil
		}); err != nil {
			return err
		}
		if cut != nil {
			return tx.set(key, cut)
		}
	}
	return nil
}

// shrink prepares a truncation to size of a file with more than deleteBatch
// pages past size: it removes the highest pages deleteBatch at a time, each
// step one transaction that leaves the file shorter but valid (its size is
// cut to the removed pages' start), so a crash in between leaves a prefix of
// the file, never a file with zeroed data inside its size.
func (s *Store) shrink(ino ids.Ino, size uint64, now int64) error {
	var from []byte // below the last step's pages (see Purge)
	for {
		done, mapped := false, false
		var lowestKey []byte
		_, err := s.update(func(tx *Tx) error {
			done = false
			n, err := tx.inode(ino)
			if err != nil {
				return err
			}
			mapped = n.mapped
			if modeType(n.Mode) != syscall.S_IFREG || n.Size <= size || n.mapped {
				done = true
				return nil
			}
			first := (size + PageSize - 1) / PageSize
			var keys [][]byte
			err = tx.scan(tx.key(RecPage, ino, nil), from, true, false, func(k, _ []byte) (bool, error) {
				if binary.BigEndian.Uint64(k[9:]) < first {
					return false, nil
				}
				keys = append(keys, tx.key(RecPage, ino, k[9:]))
				return len(keys) <= deleteBatch, nil
			})
			if err != nil {
				return err
			}
			if len(keys) <= deleteBatch {
				done = true // few enough for SetAttr's own transaction
				return nil
			}
			keys = keys[:deleteBatch]
			for _, k := range keys {
				if err := tx.del(k); err != nil {
					return err
				}
			}
			lowestKey = keys[len(keys)-1]
			lowest := binary.BigEndian.Uint64(lowestKey[9:])
			n.Size = max(size, lowest*PageSize)
			n.Version++
			n.Mtime, n.Ctime = now, now
			n.touch()
			return nil
		})
		if mapped && err == nil {
			return s.shrinkBlocks(ino, size, now)
		}
		if err != nil || done {
			return err
		}
		from = lowestKey
	}
}

// Purge deletes an unlinked inode (Nlink 0): its attributes, pages or
// block map (whose blocks become garbage, due Options.GarbageDelay from
// Options.Clock's now), xattrs and symlink target. It does nothing to a
// linked inode. Call it when the last
// handle of an unlinked file closes, or at once if none is open. A big file
// takes several transactions; a crash in between leaves an orphan that
// Open purges.
func (s *Store) Purge(ino ids.Ino) error {
	var linked bool
	if err := s.view(func(tx *Tx) error {
		n, err := tx.inode(ino)
		if err == nil {
			linked = n.Nlink > 0
		}
		return err
	}); err != nil || linked {
		return err
	}
	// Each transaction scans on from the last page the one before deleted:
	// from the first page, it would step over every deletion so far.
	var from []byte
	for {
		var (
			done bool
			last []byte
		)
		_, err := s.update(func(tx *Tx) error {
			n, err := tx.inode(ino)
			if err != nil {
				return err
			}
			if n.Nlink > 0 {
				done = true
				return nil
			}
			last, done, err = tx.purgeStep(n, from, s.clock())
			return err
		})
		if err != nil || done {
			return err
		}
		from = append(bytes.Clone(last), 0) // the next key after it
	}
}

// blindDeletePages: a purge deletes the pages of a file this small by key,
// without looking for them.
const blindDeletePages = 64

// purgeStep deletes up to deleteBatch of unlinked n's pages or block map
// records from the key from (nil: the first), and once none are left, all
// else of n. It reports the last key it deleted and whether n is gone. The
// blocks it frees are due for deletion from now on, after the store's
// delay.
func (tx *Tx) purgeStep(n *inode, from []byte, now int64) (last []byte, done bool, err error) {
	if n.mapped {
		last, done, err = tx.purgeBlocks(n, from, now+tx.st.garbageWait)
	} else {
		last, done, err = tx.purgePages(n, from)
	}
	if err != nil || !done {
		return last, false, err
	}
	if err := tx.delXattrs(n.Ino); err != nil {
		return nil, false, err
	}
	if err := tx.delDone(n.Ino); err != nil {
		return nil, false, err
	}
	if modeType(n.Mode) == syscall.S_IFLNK {
		if err := tx.del(tx.key(RecSymlink, n.Ino, nil)); err != nil {
			return nil, false, err
		}
	}
	n.deleted = true
	return nil, true, nil
}

// purgePages deletes up to deleteBatch of unlinked n's pages from the page
// key from (nil: the first). It reports the last key it deleted and
// whether none are left.
func (tx *Tx) purgePages(n *inode, from []byte) (last []byte, done bool, err error) {
	var keys [][]byte
	if pages := (n.Size + PageSize - 1) / PageSize; from == nil && pages <= blindDeletePages {
		// pages never lie past Size: delete each one that may exist,
		// cheaper than an iterator for a small file
		for pi := range pages {
			keys = append(keys, tx.key64(RecPage, n.Ino, pi))
		}
	} else {
		err = tx.scan(tx.key(RecPage, n.Ino, nil), from, false, false, func(k, _ []byte) (bool, error) {
			keys = append(keys, tx.key(RecPage, n.Ino, k[9:]))
			return len(keys) < deleteBatch, nil
		})
		if err != nil {
			return nil, false, err
		}
	}
	for _, k := range keys {
		if err := tx.del(k); err != nil {
			return nil, false, err
		}
	}
	if len(keys) == deleteBatch {
		return keys[len(keys)-1], false, nil // more pages: another transaction
	}
	return nil, true, nil
}

// checkXattrName: Linux answers ERANGE for an empty or too long name.
func checkXattrName(name string) error {
	if name == "" || len(name) > XattrNameMax {
		return wire.Errf(wire.CodeRange, "xattr name of %d bytes", len(name))
	}
	return nil
}

// GetXattr returns an extended attribute's value (CodeNoData if absent).
func (s *Store) GetXattr(ino ids.Ino, name string) ([]byte, error) {
	if err := checkXattrName(name); err != nil {
		return nil, err
	}
	var val []byte
	err := s.view(func(tx *Tx) error {
		if _, err := tx.inode(ino); err != nil {
			return err
		}
		ok, err := tx.get(tx.keyStr(RecXattr, ino, name), func(v []byte) error {
			val = append([]byte{}, v...)
			return nil
		})
		if err == nil && !ok {
			err = errNoData
		}
		return err
	})
	return val, err
}

// SetXattr sets an extended attribute and the change time. XattrCreate
// fails with CodeExists if it exists, XattrReplace with CodeNoData if it
// does not. An ACL (posixacl.AccessName, DefaultName) must be valid
// (CodeInvalid), sets the mode with it and is kept as the mode alone if
// that says as much (acl.go); wire.XattrKillSgid, with an access
// ACL, clears the setgid bit as well.
func (s *Store) SetXattr(ino ids.Ino, name string, value []byte, flags uint32, now int64) error {
	if err := checkXattrName(name); err != nil {
		return err
	}
	isACL := posixacl.IsACL(name)
	allowed := uint32(XattrCreate | XattrReplace)
	if name == posixacl.AccessName {
		allowed |= wire.XattrKillSgid
	}
	if f := flags &^ wire.XattrKillSgid; flags&^allowed != 0 || f == XattrCreate|XattrReplace {
		return wire.Errf(wire.CodeInvalid, "xattr flags %#x", flags)
	}
	if len(value) > XattrSizeMax {
		return wire.Errf(wire.CodeTooBig, "xattr value of %d bytes", len(value))
	}
	if value == nil {
		value = []byte{}
	}
	_, err := s.update(func(tx *Tx) error {
		n, err := tx.inode(ino)
		if err != nil {
			return err
		}
		key := tx.keyStr(RecXattr, ino, name)
		ok, err := tx.get(key, nil)
		if err != nil {
			return err
		}
		switch create := flags &^ wire.XattrKillSgid; {
		case ok && create == XattrCreate:
			return errExists
		case !ok && create == XattrReplace:
			return errNoData
		}
		if !ok {
			// A new name must leave the list listxattr can return: past
			// it every listxattr of the file would fail. ENOSPC, as ext4
			// answers when a file's xattrs fill their space.
			size, err := tx.xattrListSize(ino)
			if err != nil {
				return err
			}
			if size+len(name)+1 > XattrListMax {
				return wire.Errf(wire.CodeNoSpace, "xattr names of %d bytes and %q pass the %d bytes listxattr returns", size, name, XattrListMax)
			}
		}
		if isACL {
			return tx.setACL(n, name, key, ok, value, flags, now)
		}
		n.Ctime = now
		n.touch()
		return tx.set(key, value)
	})
	return err
}

// xattrListSize is the size of ino's xattr names list as listxattr
// returns it: each name and its NUL.
func (tx *Tx) xattrListSize(ino ids.Ino) (int, error) {
	n := 0
	err := tx.scan(tx.key(RecXattr, ino, nil), nil, false, false, func(k, _ []byte) (bool, error) {
		n += len(k) - 9 + 1
		return true, nil
	})
	return n, err
}

// ListXattr lists an inode's extended attribute names in byte order.
func (s *Store) ListXattr(ino ids.Ino) ([]string, error) {
	var names []string
	err := s.view(func(tx *Tx) error {
		if _, err := tx.inode(ino); err != nil {
			return err
		}
		return tx.scan(tx.key(RecXattr, ino, nil), nil, false, false, func(k, _ []byte) (bool, error) {
			names = append(names, string(k[9:]))
			return true, nil
		})
	})
	return names, err
}

// RemoveXattr removes an extended attribute (CodeNoData if absent; an
// absent ACL is no error, as on a local file system) and sets the change
// time. The mode stays as it is when the access ACL goes.
func (s *Store) RemoveXattr(ino ids.Ino, name string, now int64) error {
	if err := checkXattrName(name); err != nil {
		return err
	}
	_, err := s.update(func(tx *Tx) error {
		n, err := tx.inode(ino)
		if err != nil {
			return err
		}
		key := tx.keyStr(RecXattr, ino, name)
		ok, err := tx.get(key, nil)
		if err != nil {
			return err
		}
		if !ok {
			if posixacl.IsACL(name) {
				return nil
			}
			return errNoData
		}
		n.Ctime = now
		n.touch()
		return tx.del(key)
	})
	return err
}

// delXattrs deletes all of an inode's extended attributes.
func (tx *Tx) delXattrs(ino ids.Ino) error {
	var keys [][]byte
	err := tx.scan(tx.key(RecXattr, ino, nil), nil, false, false, func(k, _ []byte) (bool, error) {
		keys = append(keys, tx.key(RecXattr, ino, k[9:]))
		return true, nil
	})
	if err != nil {
		return err
	}
	for _, k := range keys {
		if err := tx.del(k); err != nil {
			return err
		}
	}
	return nil
}
