package ownership

// Server-to-server calls of cluster mode (paxosnode.Peers.Call kinds) and
// their messages, in the codec client requests use. Every body and reply
// starts with peerVersion, and its fields are bounded; a reply's status
// (replyStatus) comes next, then an OK reply's body.
// Also the peer side of whole-inode transfers (store_transfer.go): a
// peer's store as a replica.StateSource and replica.StateSink, a page per call.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/leasefs/leasefs/internal/codec"
	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/metaserver/paxosnode"
	"github.com/leasefs/leasefs/metaserver/replica"
	"github.com/leasefs/leasefs/metaserver/store"
	"github.com/leasefs/leasefs/transport"
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

// peerVersion is the first byte of every peer call's body and reply; a
// peer that sends another gets codec.ErrVersion.
const peerVersion = 1

// Bounds of peer messages' fields, besides the transport's MaxBody, which
// bounds the whole.
const (
	maxKey     = 64 << 10 // a store key: an inode, a kind and a name
	maxValue   = transport.MaxBody
	maxWrites  = 1 << 20 // writes of one change or one page
	maxChanges = 1 << 16 // changes of one apply call
	maxErrText = 4 << 10 // an error's text in a reply
)

var errPeerDecode = errors.New("ownership: bad peer message")

// peerMessage is the body of a peer call or of an OK reply.
type peerMessage interface {
	Append(b []byte) []byte
	Parse(b []byte) error
}

func newEnc(b []byte) *codec.Enc { return &codec.Enc{B: append(b, peerVersion)} }

func newDec(b []byte) *codec.Dec {
	d := codec.NewDec(b)
	d.Version(peerVersion)
	return &d
}

// parsed is what the end of a parse returns: nil, or the decoder's error
// marked as a bad peer message.
func parsed(d *codec.Dec) error {
	if err := d.End(); err != nil {
		return fmt.Errorf("%w: %w", errPeerDecode, err)
	}
	return nil
}

func appendWrites(e *codec.Enc, ws []store.Write) {
	e.U32(uint32(len(ws)))
	for _, w := range ws {
		e.Bool(w.Delete)
		e.Bytes(w.Key)
		e.Bytes(w.Value)
	}
}

func parseWrites(d *codec.Dec) []store.Write {
	n := d.Count(maxWrites, 9)
	out := make([]store.Write, 0, n)
	for range n {
		del := d.Bool()
		k := d.Bytes(maxKey)
		v := d.Bytes(maxValue)
		out = append(out, store.Write{Key: k, Value: v, Delete: del})
	}
	return out
}

// applyReq (callApply) carries changes for the replica to apply in order.
type applyReq struct{ Changes []replica.Change }

func (m *applyReq) Append(b []byte) []byte {
	e := newEnc(b)
	e.U32(uint32(len(m.Changes)))
	for _, c := range m.Changes {
		e.U64(uint64(c.Ino))
		e.U64(uint64(c.Epoch))
		e.U64(c.Version)
		appendWrites(e, c.Writes)
	}
	return e.B
}

func (m *applyReq) Parse(b []byte) error {
	d := newDec(b)
	n := d.Count(maxChanges, 28)
	m.Changes = make([]replica.Change, 0, n)
	for range n {
		c := replica.Change{Ino: ids.Ino(d.U64()), Epoch: ids.Epoch(d.U64()), Version: d.U64()}
		c.Writes = parseWrites(d)
		m.Changes = append(m.Changes, c)
	}
	return parsed(d)
}

// inoReq names an inode: the replica's state of it (callReplState), or its
// hand-over (callHandover).
type inoReq struct{ Ino ids.Ino }

func (m *inoReq) Append(b []byte) []byte {
	e := newEnc(b)
	e.U64(uint64(m.Ino))
	return e.B
}

func (m *inoReq) Parse(b []byte) error {
	d := newDec(b)
	m.Ino = ids.Ino(d.U64())
	return parsed(d)
}

// replStateRep answers callReplState: the epoch and version of the
// replica's state of the inode.
type replStateRep struct {
	Epoch   ids.Epoch
	Version uint64
}

func (m *replStateRep) Append(b []byte) []byte {
	e := newEnc(b)
	e.U64(uint64(m.Epoch))
	e.U64(m.Version)
	return e.B
}

func (m *replStateRep) Parse(b []byte) error {
	d := newDec(b)
	m.Epoch, m.Version = ids.Epoch(d.U64()), d.U64()
	return parsed(d)
}

// stateReq (callState) asks a page of an inode's state: the records after
// the key After (none: from the first), about MaxBytes of them (the
// server takes at most transferPage).
type stateReq struct {
	Ino      ids.Ino
	MaxBytes uint32
	After    []byte
}

func (m *stateReq) Append(b []byte) []byte {
	e := newEnc(b)
	e.U64(uint64(m.Ino))
	e.U32(m.MaxBytes)
	e.Bytes(m.After)
	return e.B
}

func (m *stateReq) Parse(b []byte) error {
	d := newDec(b)
	m.Ino, m.MaxBytes = ids.Ino(d.U64()), d.U32()
	if m.After = d.Bytes(maxKey); len(m.After) == 0 {
		m.After = nil
	}
	return parsed(d)
}

// statePageRep answers callState with a page of the inode's state (its
// Ino is the request's).
type statePageRep struct{ Page replica.StatePage }

func (m *statePageRep) Append(b []byte) []byte {
	e := newEnc(b)
	p := &m.Page
	e.U64(uint64(p.Epoch))
	e.U64(p.Version)
	e.Bool(p.Last)
	appendWrites(e, p.Records)
	return e.B
}

func (m *statePageRep) Parse(b []byte) error {
	d := newDec(b)
	p := &m.Page
	p.Epoch, p.Version, p.Last = ids.Epoch(d.U64()), d.U64(), d.Bool()
	p.Records = parseWrites(d)
	return parsed(d)
}

// stageReq (callReplace) is one page of a transfer to stage; the last one
// switches the replica to the staged state.
type stageReq struct {
	Tr      replica.Transfer
	Seq     uint32
	Last    bool
	Records []store.Write
}

func (m *stageReq) Append(b []byte) []byte {
	e := newEnc(b)
	tr := &m.Tr
	e.U64(uint64(tr.Ino))
	e.U64(tr.ID)
	e.U64(tr.Replaces)
	e.U64(uint64(tr.Epoch))
	e.U64(uint64(tr.SrcEpoch))
	e.U64(tr.Version)
	e.U32(m.Seq)
	e.Bool(m.Last)
	appendWrites(e, m.Records)
	return e.B
}

func (m *stageReq) Parse(b []byte) error {
	d := newDec(b)
	m.Tr = replica.Transfer{Ino: ids.Ino(d.U64()), ID: d.U64(), Replaces: d.U64(), Epoch: ids.Epoch(d.U64()),
		SrcEpoch: ids.Epoch(d.U64()), Version: d.U64()}
	m.Seq, m.Last = d.U32(), d.Bool()
	m.Records = parseWrites(d)
	return parsed(d)
}

// restampReq (callRestamp) asks the replica to stamp its state of Ino,
// if it is Epoch/Version, with NewEpoch.
type restampReq struct {
	Ino      ids.Ino
	Epoch    ids.Epoch
	Version  uint64
	NewEpoch ids.Epoch
}

func (m *restampReq) Append(b []byte) []byte {
	e := newEnc(b)
	e.U64(uint64(m.Ino))
	e.U64(uint64(m.Epoch))
	e.U64(m.Version)
	e.U64(uint64(m.NewEpoch))
	return e.B
}

func (m *restampReq) Parse(b []byte) error {
	d := newDec(b)
	m.Ino, m.Epoch, m.Version, m.NewEpoch = ids.Ino(d.U64()), ids.Epoch(d.U64()), d.U64(), ids.Epoch(d.U64())
	return parsed(d)
}

// doneRep answers callReplace (the state is there), callRestamp (it was
// restamped) and callLockFree (no client of the previous owner holds a
// lock).
type doneRep struct{ Done bool }

func (m *doneRep) Append(b []byte) []byte {
	e := newEnc(b)
	e.Bool(m.Done)
	return e.B
}

func (m *doneRep) Parse(b []byte) error {
	d := newDec(b)
	m.Done = d.Bool()
	return parsed(d)
}

// digestReq (callDigest) asks the digests of at most Max inodes after
// After (the server gives at most 4096).
type digestReq struct {
	After ids.Ino
	Max   uint32
}

func (m *digestReq) Append(b []byte) []byte {
	e := newEnc(b)
	e.U64(uint64(m.After))
	e.U32(m.Max)
	return e.B
}

func (m *digestReq) Parse(b []byte) error {
	d := newDec(b)
	m.After, m.Max = ids.Ino(d.U64()), d.U32()
	return parsed(d)
}

// digestRep answers callDigest.
type digestRep struct{ Page replica.DigestPage }

func (m *digestRep) Append(b []byte) []byte {
	e := newEnc(b)
	p := &m.Page
	e.U64(uint64(p.After))
	e.U64(uint64(p.Through))
	e.U32(uint32(len(p.Inodes)))
	for _, i := range p.Inodes {
		e.U64(uint64(i.Ino))
		e.U64(uint64(i.Epoch))
		e.U64(i.Version)
		e.U64(i.Hash)
	}
	return e.B
}

func (m *digestRep) Parse(b []byte) error {
	d := newDec(b)
	p := &m.Page
	p.After, p.Through = ids.Ino(d.U64()), ids.Ino(d.U64())
	n := d.Count(maxWrites, 32)
	p.Inodes = make([]replica.InodeDigest, 0, n)
	for range n {
		p.Inodes = append(p.Inodes, replica.InodeDigest{Ino: ids.Ino(d.U64()), Epoch: ids.Epoch(d.U64()),
			Version: d.U64(), Hash: d.U64()})
	}
	return parsed(d)
}

// lockFreeReq (callLockFree) asks a previous owner of Ino, at Epoch,
// whether none of its clients can still hold a lock on it.
type lockFreeReq struct {
	Ino   ids.Ino
	Epoch ids.Epoch
}

func (m *lockFreeReq) Append(b []byte) []byte {
	e := newEnc(b)
	e.U64(uint64(m.Ino))
	e.U64(uint64(m.Epoch))
	return e.B
}

func (m *lockFreeReq) Parse(b []byte) error {
	d := newDec(b)
	m.Ino, m.Epoch = ids.Ino(d.U64()), ids.Epoch(d.U64())
	return parsed(d)
}

// replyStatus heads every reply: how the call went, and for a failure
// what the caller needs to rebuild its error. An OK reply's body follows
// it (a peerMessage, or nothing).
type replyStatus struct {
	Code byte
	Ino  ids.Ino   // stStale, stGap
	Seen ids.Epoch // stStale
	Msg  string    // stErr, stNoSpace
}

func (m *replyStatus) Append(b []byte) []byte {
	e := newEnc(b)
	e.U8(m.Code)
	switch m.Code {
	case stStale:
		e.U64(uint64(m.Ino))
		e.U64(uint64(m.Seen))
	case stGap:
		e.U64(uint64(m.Ino))
	case stErr, stNoSpace:
		msg := m.Msg
		if len(msg) > maxErrText {
			msg = strings.ToValidUTF8(msg[:maxErrText], "")
		}
		e.Str(msg)
	}
	return e.B
}

// parse reads the status from d and leaves d at the body.
func (m *replyStatus) parse(d *codec.Dec) {
	switch m.Code = d.U8(); m.Code {
	case stOK, stNotOwner:
	case stStale:
		m.Ino, m.Seen = ids.Ino(d.U64()), ids.Epoch(d.U64())
	case stGap:
		m.Ino = ids.Ino(d.U64())
	case stErr, stNoSpace:
		m.Msg = d.Str(maxErrText)
	default:
		d.Fail(fmt.Errorf("status %d", m.Code))
	}
}

func (m *replyStatus) Parse(b []byte) error {
	d := newDec(b)
	m.parse(d)
	return parsed(d)
}

// statusOf is the status that reports err (nil: stOK).
func statusOf(err error) replyStatus {
	var stale *replica.StaleEpochError
	var gap *replica.VersionGapError
	switch {
	case err == nil:
		return replyStatus{Code: stOK}
	case errors.As(err, &stale):
		return replyStatus{Code: stStale, Ino: stale.Ino, Seen: stale.Seen}
	case errors.As(err, &gap):
		return replyStatus{Code: stGap, Ino: gap.Ino}
	case wire.CodeOf(err) == wire.CodeNoSpace:
		return replyStatus{Code: stNoSpace, Msg: err.Error()}
	default:
		return replyStatus{Code: stErr, Msg: err.Error()}
	}
}

// err turns the status back into an error (nil for stOK).
func (m *replyStatus) err() error {
	switch m.Code {
	case stOK:
		return nil
	case stStale:
		return &replica.StaleEpochError{Ino: m.Ino, Seen: m.Seen}
	case stGap:
		return &replica.VersionGapError{Ino: m.Ino}
	case stNotOwner:
		return errPeerNotOwner
	case stNoSpace:
		return wire.Errf(wire.CodeNoSpace, "peer: %s", m.Msg)
	}
	return fmt.Errorf("ownership: peer: %s", m.Msg)
}

// statusReply encodes a reply that reports err, with no body.
func statusReply(err error) []byte {
	st := statusOf(err)
	return st.Append(nil)
}

// okReply encodes an OK reply with the body m.
func okReply(m peerMessage) []byte {
	st := replyStatus{Code: stOK}
	return m.Append(st.Append(nil))
}

// parseReply reads a reply: the error its status reports, or else its
// body into m (nil: the reply must have none).
func parseReply(b []byte, m peerMessage) error {
	d := newDec(b)
	var st replyStatus
	st.parse(d)
	if d.Err() != nil {
		return fmt.Errorf("%w: %w", errPeerDecode, d.Err())
	}
	if err := st.err(); err != nil {
		return err
	}
	if m == nil {
		return parsed(d)
	}
	return m.Parse(b[len(b)-d.Len():])
}

// transferPage bounds one page of an inode's state in a peer call: well
// under transport.MaxBody, and one modest badger transaction at the
// receiver.
const transferPage = 1 << 20

// fetchWorkers bounds anti-entropy's concurrent fetches (and so its memory,
// a page each).
const fetchWorkers = 8

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
	req := stateReq{Ino: ino, MaxBytes: uint32(maxBytes), After: after}
	rep, err := ps.c.call(cctx, ps.n, ps.p, callState, req.Append(nil))
	if err != nil {
		return replica.StatePage{}, err
	}
	var page statePageRep
	if err := parseReply(rep, &page); err != nil {
		return replica.StatePage{}, err
	}
	page.Page.Ino = ino
	return page.Page, nil
}

func (ps peerState) StagePage(ctx context.Context, tr replica.Transfer, seq uint32, records []store.Write, last bool) (bool, error) {
	wait := ps.c.pageWait()
	if last {
		// the switch rewrites the whole inode at the receiver
		wait += switchWait(int64(seq+1) * transferPage)
	}
	cctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	req := stageReq{Tr: tr, Seq: seq, Last: last, Records: records}
	rep, err := ps.c.call(cctx, ps.n, ps.p, callReplace, req.Append(nil))
	if err != nil {
		return false, err
	}
	var done doneRep
	err = parseReply(rep, &done)
	return done.Done, err
}

func (c *Owner) pageWait() time.Duration { return 4 * c.callWait }

// switchWait is how long a receiver may take to switch to a staged state
// of about size bytes: a generous 16 MiB/s of badger rewrites.
func switchWait(size int64) time.Duration {
	return time.Duration(size/(16<<20)+1) * time.Second
}

var errPeerNotOwner = errors.New("ownership: peer does not own the inode")
