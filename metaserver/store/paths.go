package store

import (
	"encoding/binary"
	"errors"
	"slices"
	"strings"
	"syscall"

	"github.com/leasefs/leasefs/internal/ids"
)

// ErrPathUnknown is PathOf's answer for a file whose directory it did not
// find within its scan (or an inode no directory names: removed, open).
var ErrPathUnknown = errors.New("store: no path found")

// maxPathDepth bounds the walk up a directory's parents (a loop in a
// damaged store ends there).
const maxPathDepth = 4096

// PathOf returns a path from the root to ino (one of its names, for a
// file with several links) and its link count. A directory's path follows
// the parent each directory records; files keep no pointer to their
// directories, so a file's is found by scanning directory entries, at most
// maxScan of them: for operators' views, not for requests.
func (s *Store) PathOf(ino ids.Ino, maxScan int) (path string, nlink uint32, err error) {
	err = s.view(func(tx *Tx) error {
		n, err := tx.inode(ino)
		if err != nil {
			return err
		}
		nlink = n.Nlink
		var names []string
		cur := n
		for depth := 0; cur.Ino != ids.RootIno; depth++ {
			if depth == maxPathDepth {
				return ErrPathUnknown
			}
			dir, name, err := tx.linkOf(cur, maxScan)
			if err != nil {
				return err
			}
			names = append(names, name)
			if cur, err = tx.inode(dir); err != nil {
				return err
			}
		}
		slices.Reverse(names)
		path = "/" + strings.Join(names, "/")
		return nil
	})
	return path, nlink, err
}

// linkOf finds a directory and name under which n is linked: for a
// directory, in its parent; for anything else, in the first maxScan
// entries of all directories.
func (tx *Tx) linkOf(n *inode, maxScan int) (dir ids.Ino, name string, err error) {
	prefix := []byte{RecEntry}
	if n.Mode&syscall.S_IFMT == syscall.S_IFDIR {
		prefix = tx.key(RecEntry, n.parent, nil)
	}
	seen := 0
	err = tx.scan(prefix, nil, false, true, func(key, val []byte) (bool, error) {
		if seen++; seen > maxScan {
			return false, nil
		}
		if len(key) < 9 || len(val) < 8 || ids.Ino(binary.BigEndian.Uint64(val)) != n.Ino {
			return true, nil
		}
		dir, name = ids.Ino(binary.BigEndian.Uint64(key[1:9])), string(key[9:])
		return false, nil
	})
	if err == nil && name == "" {
		err = ErrPathUnknown
	}
	return dir, name, err
}

// InodeAt returns the inode at path, from the root.
func (s *Store) InodeAt(path string) (Attr, error) {
	a, err := s.GetAttr(ids.RootIno)
	for _, name := range strings.Split(path, "/") {
		if err != nil {
			return Attr{}, err
		}
		if name == "" || name == "." {
			continue
		}
		a, err = s.Lookup(a.Ino, name)
	}
	return a, err
}
