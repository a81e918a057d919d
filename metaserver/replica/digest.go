package replica

// Digests and checksums: how replicas find where they differ.

import (
	"cmp"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"hash"
	"slices"

	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/metaserver/store"
)

// Checksum is a SHA-256 over every replicated record, 'E' states included,
// in key order; 'S' and transfers' staging are excluded. Two replicas have equal checksums if and
// only if they hold the same replicated records (up to SHA-256 collisions).
// It reads the whole store in one transaction: an operator's check, not a
// hot path.
func (r *Replica) Checksum() ([32]byte, error) {
	h := sha256.New()
	var lb [2 * binary.MaxVarintLen64]byte
	err := r.st.View(func(tx *store.Tx) error {
		return tx.Scan(nil, nil, false, true, func(k, v []byte) (bool, error) {
			if k[0] == store.RecServer || k[0] == store.RecStage {
				return true, nil
			}
			b := binary.AppendUvarint(lb[:0], uint64(len(k)))
			h.Write(b)
			h.Write(k)
			b = binary.AppendUvarint(lb[:0], uint64(len(v)))
			h.Write(b)
			h.Write(v)
			return true, nil
		})
	})
	var sum [32]byte
	if err != nil {
		return sum, err
	}
	h.Sum(sum[:0])
	return sum, nil
}

// InodeDigest summarises one inode of a replica: its epoch, version and,
// if asked for, a hash of its records (the first 8 bytes of a SHA-256 over
// them in key order, 'E' excluded; 0 if not asked for).
type InodeDigest struct {
	Ino     ids.Ino
	Epoch   ids.Epoch
	Version uint64
	Hash    uint64
}

// DigestPage is the digests of every inode with a record in (After,
// Through], in inode order. Pages are read one transaction each: a replica
// walks its peer's store page by page while both keep changing, and the
// differences it misses are caught by the next round.
type DigestPage struct {
	After, Through ids.Ino
	Inodes         []InodeDigest
}

// Last reports whether the page reaches the end of the inode space.
func (p DigestPage) Last() bool { return p.Through == MaxIno }

// digestPrefixes are every kind an inode can have, 'E' included, in key order.
var digestPrefixes = [...]byte{store.RecAttr, store.RecExtent, store.RecCookie, store.RecEntry, store.RecRepl,
	store.RecGarbage, store.RecSymlink, store.RecPage, store.RecDone, store.RecBlock, store.RecXattr}

// Digest returns the page of at most max inodes (0: 1024) after after,
// ending at the last inode it holds, or at MaxIno if no inode follows. Walk
// a store with after = the previous page's Through until Last.
//
// Without hashes it reads only the inodes' 'E' states: anti-entropy fetches
// by (epoch, version) alone, and hashing every stored byte of a replica each
// round cost a CPU's worth of time on a store of a few GiB. An inode with
// records but no state is then left out; it is at (0, 0), which no
// comparison fetches.
func (r *Replica) Digest(after ids.Ino, max int, hashes bool) (DigestPage, error) {
	if max <= 0 {
		max = 1024
	}
	if after == MaxIno {
		return DigestPage{After: after, Through: MaxIno}, nil
	}
	var page DigestPage
	err := r.st.View(func(tx *store.Tx) error {
		through := MaxIno
		var seen []ids.Ino
		for _, p := range digestKinds(hashes) {
			var inos []ids.Ino
			capped := false
			err := tx.Scan([]byte{p}, tx.Key(p, after+1, nil), false, false, func(k, _ []byte) (bool, error) {
				ino := store.KeyIno(k)
				if ino > through {
					return false, nil
				}
				if n := len(inos); n == 0 || inos[n-1] != ino {
					if n == max {
						capped = true
						return false, nil
					}
					inos = append(inos, ino)
				}
				return true, nil
			})
			if err != nil {
				return err
			}
			if capped {
				// unknown beyond this kind's last inode
				through = min(through, inos[len(inos)-1])
			}
			seen = append(seen, inos...)
		}
		seen = slices.DeleteFunc(seen, func(i ids.Ino) bool { return i > through })
		slices.Sort(seen)
		seen = slices.Compact(seen)
		if len(seen) > max {
			through = seen[max-1]
		}
		var err error
		page, err = digest(tx, after, through, hashes)
		return err
	})
	return page, err
}

// DigestRange returns the digests of every inode in (after, through]: the
// local side of a comparison with a peer's page (asked for with the same
// hashes).
func (r *Replica) DigestRange(after, through ids.Ino, hashes bool) (DigestPage, error) {
	var page DigestPage
	err := r.st.View(func(tx *store.Tx) error {
		var err error
		page, err = digest(tx, after, through, hashes)
		return err
	})
	return page, err
}

// digestKinds are the record kinds a digest reads.
func digestKinds(hashes bool) []byte {
	if hashes {
		return digestPrefixes[:]
	}
	return []byte{store.RecRepl}
}

func digest(tx *store.Tx, after, through ids.Ino, hashes bool) (DigestPage, error) {
	page := DigestPage{After: after, Through: through}
	if after >= through {
		return page, nil
	}
	type acc struct {
		d InodeDigest
		h hash.Hash
	}
	accs := map[ids.Ino]*acc{}
	var lb [2 * binary.MaxVarintLen64]byte
	for _, p := range digestKinds(hashes) {
		err := tx.Scan([]byte{p}, tx.Key(p, after+1, nil), false, true, func(k, v []byte) (bool, error) {
			ino := store.KeyIno(k)
			if ino > through {
				return false, nil
			}
			a := accs[ino]
			if a == nil {
				a = &acc{d: InodeDigest{Ino: ino}}
				if hashes {
					a.h = sha256.New()
				}
				accs[ino] = a
			}
			if p == store.RecRepl {
				r, err := decodeRepl(ino, v)
				a.d.Epoch, a.d.Version = r.epoch, r.version
				return err == nil, err
			}
			a.h.Write([]byte{p})
			b := binary.AppendUvarint(lb[:0], uint64(len(k)-9))
			a.h.Write(b)
			a.h.Write(k[9:])
			b = binary.AppendUvarint(lb[:0], uint64(len(v)))
			a.h.Write(b)
			a.h.Write(v)
			return true, nil
		})
		if err != nil {
			return page, err
		}
	}
	page.Inodes = make([]InodeDigest, 0, len(accs))
	var sum [sha256.Size]byte
	for _, a := range accs {
		if hashes {
			a.d.Hash = binary.BigEndian.Uint64(a.h.Sum(sum[:0]))
		}
		page.Inodes = append(page.Inodes, a.d)
	}
	slices.SortFunc(page.Inodes, func(a, b InodeDigest) int { return cmp.Compare(a.Ino, b.Ino) })
	return page, nil
}

// DiffDigests compares a replica's page with a peer's page of the same range
// (DigestRange(peer.After, peer.Through)). Fetch lists the inodes the peer
// holds at a newer (epoch, version), including those the replica lacks:
// copy their state from the peer (CopyInode, keeping the peer's epoch).
// Diverged lists inodes at the same (epoch, version) with different records,
// which replication never produces (records written outside it, such as each
// server's own root before its first replicated change): an operator's
// matter, or a new owner's recovery.
func DiffDigests(local, peer DigestPage) (fetch, diverged []ids.Ino, err error) {
	if local.After != peer.After || local.Through != peer.Through {
		return nil, nil, fmt.Errorf("replica: digest pages (%v, %v] and (%v, %v] differ in range",
			local.After, local.Through, peer.After, peer.Through)
	}
	l, p := local.Inodes, peer.Inodes
	for len(l) > 0 || len(p) > 0 {
		var ld, pd InodeDigest // zero: the side lacks the inode
		switch {
		case len(p) == 0 || len(l) > 0 && l[0].Ino < p[0].Ino:
			ld, l = l[0], l[1:]
			pd.Ino = ld.Ino
		case len(l) == 0 || p[0].Ino < l[0].Ino:
			pd, p = p[0], p[1:]
			ld.Ino = pd.Ino
		default:
			ld, pd, l, p = l[0], p[0], l[1:], p[1:]
		}
		ls, ps := replState{ld.Epoch, ld.Version}, replState{pd.Epoch, pd.Version}
		switch {
		case ls.less(ps):
			fetch = append(fetch, pd.Ino)
		case ls == ps && ld.Hash != pd.Hash:
			diverged = append(diverged, pd.Ino)
		}
	}
	return fetch, diverged, nil
}
