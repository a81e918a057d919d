package metaserver

// Server-to-server calls of cluster mode (cluster.Peers.Call kinds) and
// their encodings. Every body and reply is little-endian, length-prefixed
// and bounded by transport.MaxBody; a reply starts with a status byte.

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/leasefs/leasefs/internal/ids"
)

// Peer call kinds.
const (
	callApply     byte = 1 // []ReplicaChange → status (ApplyReplica)
	callReplState byte = 2 // ino → status, epoch, version
	callState     byte = 3 // ino → status, InodeSnapshot
	callReplace   byte = 4 // epoch, InodeSnapshot → status (ReplaceInode)
	callRestamp   byte = 5 // ino, epoch, version, new epoch → status, done
	callHandover  byte = 6 // ino → status (released, or not the owner)
	callDigest    byte = 7 // after, max → status, DigestPage
)

// Reply statuses.
const (
	stOK       byte = 0
	stStale    byte = 1 // u64 ino, u64 seen epoch
	stGap      byte = 2 // u64 ino
	stErr      byte = 3 // message
	stNotOwner byte = 4
)

var errPeerDecode = errors.New("metaserver: bad peer message")

type enc struct{ b []byte }

func (e *enc) u8(v byte)    { e.b = append(e.b, v) }
func (e *enc) u32(v uint32) { e.b = binary.LittleEndian.AppendUint32(e.b, v) }
func (e *enc) u64(v uint64) { e.b = binary.LittleEndian.AppendUint64(e.b, v) }
func (e *enc) bytes(v []byte) {
	e.u32(uint32(len(v)))
	e.b = append(e.b, v...)
}

type dec struct {
	b   []byte
	err error
}

func (d *dec) fail() {
	if d.err == nil {
		d.err = errPeerDecode
	}
	d.b = nil
}

func (d *dec) u8() byte {
	if len(d.b) < 1 {
		d.fail()
		return 0
	}
	v := d.b[0]
	d.b = d.b[1:]
	return v
}

func (d *dec) u32() uint32 {
	if len(d.b) < 4 {
		d.fail()
		return 0
	}
	v := binary.LittleEndian.Uint32(d.b)
	d.b = d.b[4:]
	return v
}

func (d *dec) u64() uint64 {
	if len(d.b) < 8 {
		d.fail()
		return 0
	}
	v := binary.LittleEndian.Uint64(d.b)
	d.b = d.b[8:]
	return v
}

func (d *dec) bytes() []byte {
	n := d.u32()
	if uint64(n) > uint64(len(d.b)) {
		d.fail()
		return nil
	}
	v := d.b[:n:n]
	d.b = d.b[n:]
	return v
}

// count reads a list length, refusing one that cannot fit in what is left
// (each element takes at least min bytes).
func (d *dec) count(min int) int {
	n := d.u32()
	if uint64(n)*uint64(min) > uint64(len(d.b)) {
		d.fail()
		return 0
	}
	return int(n)
}

func (e *enc) writes(ws []Write) {
	e.u32(uint32(len(ws)))
	for _, w := range ws {
		if w.Delete {
			e.u8(1)
		} else {
			e.u8(0)
		}
		e.bytes(w.Key)
		e.bytes(w.Value)
	}
}

func (d *dec) writes() []Write {
	n := d.count(9)
	out := make([]Write, 0, n)
	for range n {
		del := d.u8() == 1
		k := d.bytes()
		v := d.bytes()
		out = append(out, Write{Key: k, Value: v, Delete: del})
	}
	return out
}

func encodeChanges(cs []ReplicaChange) []byte {
	e := &enc{}
	e.u32(uint32(len(cs)))
	for _, c := range cs {
		e.u64(uint64(c.Ino))
		e.u64(uint64(c.Epoch))
		e.u64(c.Version)
		e.writes(c.Writes)
	}
	return e.b
}

func decodeChanges(b []byte) ([]ReplicaChange, error) {
	d := &dec{b: b}
	n := d.count(28)
	out := make([]ReplicaChange, 0, n)
	for range n {
		c := ReplicaChange{Ino: ids.Ino(d.u64()), Epoch: ids.Epoch(d.u64()), Version: d.u64()}
		c.Writes = d.writes()
		out = append(out, c)
	}
	return out, d.err
}

func (e *enc) snapshot(s InodeSnapshot) {
	e.u64(uint64(s.Ino))
	e.u64(uint64(s.Epoch))
	e.u64(s.Version)
	e.writes(s.Records)
}

func (d *dec) snapshot() InodeSnapshot {
	s := InodeSnapshot{Ino: ids.Ino(d.u64()), Epoch: ids.Epoch(d.u64()), Version: d.u64()}
	s.Records = d.writes()
	return s
}

func encodePage(p DigestPage) []byte {
	e := &enc{}
	e.u8(stOK)
	e.u64(uint64(p.After))
	e.u64(uint64(p.Through))
	e.u32(uint32(len(p.Inodes)))
	for _, i := range p.Inodes {
		e.u64(uint64(i.Ino))
		e.u64(uint64(i.Epoch))
		e.u64(i.Version)
		e.u64(i.Hash)
	}
	return e.b
}

func decodePage(d *dec) DigestPage {
	p := DigestPage{After: ids.Ino(d.u64()), Through: ids.Ino(d.u64())}
	n := d.count(32)
	p.Inodes = make([]InodeDigest, 0, n)
	for range n {
		p.Inodes = append(p.Inodes, InodeDigest{Ino: ids.Ino(d.u64()), Epoch: ids.Epoch(d.u64()),
			Version: d.u64(), Hash: d.u64()})
	}
	return p
}

// statusReply encodes a store error as a reply status.
func statusReply(err error) []byte {
	e := &enc{}
	var stale *StaleEpochError
	var gap *VersionGapError
	switch {
	case err == nil:
		e.u8(stOK)
	case errors.As(err, &stale):
		e.u8(stStale)
		e.u64(uint64(stale.Ino))
		e.u64(uint64(stale.Seen))
	case errors.As(err, &gap):
		e.u8(stGap)
		e.u64(uint64(gap.Ino))
	default:
		e.u8(stErr)
		e.b = append(e.b, err.Error()...)
	}
	return e.b
}

// replyErr turns a reply's status back into an error (nil for stOK) and
// returns a decoder positioned after it.
func replyErr(b []byte) (*dec, error) {
	d := &dec{b: b}
	switch st := d.u8(); st {
	case stOK:
		return d, d.err
	case stStale:
		ino, seen := ids.Ino(d.u64()), ids.Epoch(d.u64())
		return d, &StaleEpochError{Ino: ino, Seen: seen}
	case stGap:
		return d, &VersionGapError{Ino: ids.Ino(d.u64())}
	case stNotOwner:
		return d, errPeerNotOwner
	case stErr:
		return d, fmt.Errorf("metaserver: peer: %s", d.b)
	default:
		if d.err != nil {
			return d, d.err
		}
		return d, fmt.Errorf("%w: status %d", errPeerDecode, st)
	}
}

var errPeerNotOwner = errors.New("metaserver: peer does not own the inode")
