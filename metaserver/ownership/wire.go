package ownership

// Server-to-server calls of cluster mode (paxosnode.Peers.Call kinds) and
// their encodings. Every body and reply is little-endian, length-prefixed
// and bounded by transport.MaxBody; a reply starts with a status byte.
// Also the peer side of whole-inode transfers (store_transfer.go): a
// peer's store as a replica.StateSource and replica.StateSink, a page per call.

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/metaserver/paxosnode"
	"github.com/leasefs/leasefs/metaserver/replica"
	"github.com/leasefs/leasefs/metaserver/store"
	"github.com/leasefs/leasefs/wire"
)

// Peer call kinds.
const (
	callApply     byte = 1 // []replica.Change → status (Apply)
	callReplState byte = 2 // ino → status, epoch, version
	callState     byte = 3 // ino, max bytes, after → status, replica.StatePage (ReadStatePage)
	callReplace   byte = 4 // replica.Transfer, seq, last, records → status, done (StagePage)
	callRestamp   byte = 5 // ino, epoch, version, new epoch → status, done
	callHandover  byte = 6 // ino → status (released, or not the owner)
	callDigest    byte = 7 // after, max → status, replica.DigestPage
)

// Reply statuses.
const (
	stOK       byte = 0
	stStale    byte = 1 // u64 ino, u64 seen epoch
	stGap      byte = 2 // u64 ino
	stErr      byte = 3 // message
	stNotOwner byte = 4
	stNoSpace  byte = 5 // message: the replica has no space for the change
)

var errPeerDecode = errors.New("ownership: bad peer message")

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

// flag reads a boolean byte: 0 or 1, nothing else.
func (d *dec) flag() bool {
	v := d.u8()
	if v > 1 {
		d.fail()
	}
	return v == 1
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

func (e *enc) writes(ws []store.Write) {
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

func (d *dec) writes() []store.Write {
	n := d.count(9)
	out := make([]store.Write, 0, n)
	for range n {
		del := d.flag()
		k := d.bytes()
		v := d.bytes()
		out = append(out, store.Write{Key: k, Value: v, Delete: del})
	}
	return out
}

func encodeChanges(cs []replica.Change) []byte {
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

func decodeChanges(b []byte) ([]replica.Change, error) {
	d := &dec{b: b}
	n := d.count(28)
	out := make([]replica.Change, 0, n)
	for range n {
		c := replica.Change{Ino: ids.Ino(d.u64()), Epoch: ids.Epoch(d.u64()), Version: d.u64()}
		c.Writes = d.writes()
		out = append(out, c)
	}
	return out, d.err
}

// transferPage bounds one page of an inode's state in a peer call: well
// under transport.MaxBody, and one modest badger transaction at the
// receiver.
const transferPage = 1 << 20

// fetchWorkers bounds anti-entropy's concurrent fetches (and so its memory,
// a page each).
const fetchWorkers = 8

func encodeStateReq(ino ids.Ino, after []byte, maxBytes int) []byte {
	e := &enc{}
	e.u64(uint64(ino))
	e.u32(uint32(maxBytes))
	e.bytes(after)
	return e.b
}

func decodeStateReq(b []byte) (ino ids.Ino, after []byte, maxBytes int, err error) {
	d := &dec{b: b}
	ino, maxBytes = ids.Ino(d.u64()), int(d.u32())
	if after = d.bytes(); len(after) == 0 {
		after = nil
	}
	return ino, after, min(maxBytes, transferPage), d.err
}

func encodeStatePage(p replica.StatePage) []byte {
	e := &enc{}
	e.u8(stOK)
	e.u64(uint64(p.Epoch))
	e.u64(p.Version)
	if p.Last {
		e.u8(1)
	} else {
		e.u8(0)
	}
	e.writes(p.Records)
	return e.b
}

func decodeStatePage(ino ids.Ino, d *dec) (replica.StatePage, error) {
	p := replica.StatePage{Ino: ino, Epoch: ids.Epoch(d.u64()), Version: d.u64(), Last: d.flag()}
	p.Records = d.writes()
	return p, d.err
}

func encodeStage(tr replica.Transfer, seq uint32, records []store.Write, last bool) []byte {
	e := &enc{}
	e.u64(uint64(tr.Ino))
	e.u64(tr.ID)
	e.u64(tr.Replaces)
	e.u64(uint64(tr.Epoch))
	e.u64(uint64(tr.SrcEpoch))
	e.u64(tr.Version)
	e.u32(seq)
	if last {
		e.u8(1)
	} else {
		e.u8(0)
	}
	e.writes(records)
	return e.b
}

func decodeStage(b []byte) (tr replica.Transfer, seq uint32, records []store.Write, last bool, err error) {
	d := &dec{b: b}
	tr = replica.Transfer{Ino: ids.Ino(d.u64()), ID: d.u64(), Replaces: d.u64(), Epoch: ids.Epoch(d.u64()),
		SrcEpoch: ids.Epoch(d.u64()), Version: d.u64()}
	seq, last = d.u32(), d.flag()
	records = d.writes()
	return tr, seq, records, last, d.err
}

// peerState is another server's store as a replica.StateSource and a replica.StateSink:
// one peer call per page, each with its own timeout, so that a transfer
// of any size is bounded per page rather than as a whole.
//
// A page call is bounded by pageWait, not callWait: a page is bulk data
// (on a loaded host or a slow link it takes far longer than the small
// calls callWait is sized for), and one timed-out page abandons the whole
// copy. A dead peer is still found out within pageWait.
type peerState struct {
	c *Owner
	n *paxosnode.Node
	p ids.ServerID
}

var (
	_ replica.StateSource = peerState{}
	_ replica.StateSink   = peerState{}
)

func (ps peerState) ReadStatePage(ctx context.Context, ino ids.Ino, after []byte, maxBytes int) (replica.StatePage, error) {
	cctx, cancel := context.WithTimeout(ctx, ps.c.pageWait())
	defer cancel()
	rep, err := ps.c.call(cctx, ps.n, ps.p, callState, encodeStateReq(ino, after, maxBytes))
	if err != nil {
		return replica.StatePage{}, err
	}
	d, err := replyErr(rep)
	if err != nil {
		return replica.StatePage{}, err
	}
	return decodeStatePage(ino, d)
}

func (ps peerState) StagePage(ctx context.Context, tr replica.Transfer, seq uint32, records []store.Write, last bool) (bool, error) {
	wait := ps.c.pageWait()
	if last {
		// the switch rewrites the whole inode at the receiver
		wait += switchWait(int64(seq+1) * transferPage)
	}
	cctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	rep, err := ps.c.call(cctx, ps.n, ps.p, callReplace, encodeStage(tr, seq, records, last))
	if err != nil {
		return false, err
	}
	d, err := replyErr(rep)
	if err != nil {
		return false, err
	}
	done := d.flag()
	return done, d.err
}

func (c *Owner) pageWait() time.Duration { return 4 * c.callWait }

// switchWait is how long a receiver may take to switch to a staged state
// of about size bytes: a generous 16 MiB/s of badger rewrites.
func switchWait(size int64) time.Duration {
	return time.Duration(size/(16<<20)+1) * time.Second
}

func encodePage(p replica.DigestPage) []byte {
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

func decodePage(d *dec) replica.DigestPage {
	p := replica.DigestPage{After: ids.Ino(d.u64()), Through: ids.Ino(d.u64())}
	n := d.count(32)
	p.Inodes = make([]replica.InodeDigest, 0, n)
	for range n {
		p.Inodes = append(p.Inodes, replica.InodeDigest{Ino: ids.Ino(d.u64()), Epoch: ids.Epoch(d.u64()),
			Version: d.u64(), Hash: d.u64()})
	}
	return p
}

// statusReply encodes a store error as a reply status.
func statusReply(err error) []byte {
	e := &enc{}
	var stale *replica.StaleEpochError
	var gap *replica.VersionGapError
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
	case wire.CodeOf(err) == wire.CodeNoSpace:
		e.u8(stNoSpace)
		e.b = append(e.b, err.Error()...)
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
		return d, &replica.StaleEpochError{Ino: ino, Seen: seen}
	case stGap:
		return d, &replica.VersionGapError{Ino: ids.Ino(d.u64())}
	case stNotOwner:
		return d, errPeerNotOwner
	case stErr:
		return d, fmt.Errorf("ownership: peer: %s", d.b)
	case stNoSpace:
		return d, wire.Errf(wire.CodeNoSpace, "peer: %s", d.b)
	default:
		if d.err != nil {
			return d, d.err
		}
		return d, fmt.Errorf("%w: status %d", errPeerDecode, st)
	}
}

var errPeerNotOwner = errors.New("ownership: peer does not own the inode")
