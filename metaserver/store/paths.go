package store

import (
	"encoding/binary"
	"errors"
	"slices"
	"strings"
	"syscall"

	"github.com/leasefs/leasefs/internal/ids"
)

// ErrPathUnknown is PathOf's answer for an inode whose name it did not
// find within its scan (or that no directory names: removed while open).
var ErrPathUnknown = errors.New("store: no path found")

// maxPathDepth bounds the walk up a directory's parents (a loop in a
// damaged store ends there).
const maxPathDepth = 4096

// PathInfo is where an inode is in the namespace: one path from the root
// (one of a hard-linked file's names) and its link count.
type PathInfo struct {
	Path  string
	Links uint32
}

// link is one name of an inode: its directory and the name in it.
type link struct {
	dir  ids.Ino
	name string
}

// PathOf returns where ino is in the namespace. Directories record their
// parent; files keep no pointer to their directories, so a file's is found
// by scanning directory entries, at most maxScan of them: for operators'
// views, not for requests.
func (s *Store) PathOf(ino ids.Ino, maxScan int) (PathInfo, error) {
	if _, err := s.GetAttr(ino); err != nil {
		return PathInfo{}, err
	}
	p, ok := s.PathsOf([]ids.Ino{ino}, maxScan)[ino]
	if !ok {
		return PathInfo{}, ErrPathUnknown
	}
	return p, nil
}

// PathsOf is PathOf for several inodes with one scan of at most maxScan
// entries in all; an inode it could not place is left out.
func (s *Store) PathsOf(inos []ids.Ino, maxScan int) map[ids.Ino]PathInfo {
	out := map[ids.Ino]PathInfo{}
	_ = s.view(func(tx *Tx) error {
		names := tx.scanLinks(inos, maxScan)
		for _, ino := range inos {
			n, err := tx.inode(ino)
			if err != nil {
				continue
			}
			if p, ok := tx.pathOf(n, names, maxScan); ok {
				out[ino] = PathInfo{Path: p, Links: n.Nlink}
			}
		}
		return nil
	})
	return out
}

// scanLinks scans up to maxScan directory entries for a name of each of
// inos, and of every directory on the way: the inodes' and the
// directories' names.
func (tx *Tx) scanLinks(inos []ids.Ino, maxScan int) map[ids.Ino]link {
	want := map[ids.Ino]bool{}
	for _, ino := range inos {
		want[ino] = true
	}
	names := map[ids.Ino]link{}
	seen := 0
	_ = tx.scan([]byte{RecEntry}, nil, false, true, func(key, val []byte) (bool, error) {
		if seen++; seen > maxScan {
			return false, nil
		}
		if len(key) < 9 || len(val) < 12 {
			return true, nil
		}
		child := ids.Ino(binary.BigEndian.Uint64(val))
		isDir := binary.BigEndian.Uint32(val[8:])&syscall.S_IFMT == syscall.S_IFDIR
		if _, have := names[child]; !have && (want[child] || isDir) {
			names[child] = link{ids.Ino(binary.BigEndian.Uint64(key[1:9])), string(key[9:])}
		}
		return true, nil
	})
	return names
}

// pathOf walks up from n through the names found, looking a directory's
// name up in its parent where the scan did not reach it.
func (tx *Tx) pathOf(n *inode, names map[ids.Ino]link, maxScan int) (string, bool) {
	var parts []string
	for cur := n; cur.Ino != ids.RootIno; {
		if len(parts) == maxPathDepth {
			return "", false
		}
		l, ok := names[cur.Ino]
		if !ok && cur.Mode&syscall.S_IFMT == syscall.S_IFDIR {
			l, ok = tx.nameIn(cur.parent, cur.Ino, maxScan)
		}
		if !ok {
			return "", false
		}
		parts = append(parts, l.name)
		next, err := tx.inode(l.dir)
		if err != nil {
			return "", false
		}
		cur = next
	}
	slices.Reverse(parts)
	return "/" + strings.Join(parts, "/"), true
}

// nameIn finds child's name among the first maxScan entries of dir.
func (tx *Tx) nameIn(dir, child ids.Ino, maxScan int) (link, bool) {
	var l link
	seen := 0
	_ = tx.scan(tx.key(RecEntry, dir, nil), nil, false, true, func(key, val []byte) (bool, error) {
		if seen++; seen > maxScan {
			return false, nil
		}
		if len(key) >= 9 && len(val) >= 8 && ids.Ino(binary.BigEndian.Uint64(val)) == child {
			l = link{dir, string(key[9:])}
			return false, nil
		}
		return true, nil
	})
	return l, l.name != ""
}

// InodeAt returns the attributes of the inode at path, from the root.
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
