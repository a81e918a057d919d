package paxosnode

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/leasefs/leasefs/internal/codec"
	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/lease/paxos"
	"github.com/leasefs/leasefs/transport"
)

// Peer frames share the metaserver's transport with client requests. A client
// wire body starts with its version byte (1); a peer frame starts with
// PeerMagic, so one byte tells them apart (IsPeerBody).
//
// Request layout:
//
//	u8 PeerMagic, u8 frameVersion, u8 type, u8 from, u8 to, payload
//
//	type framePaxos: payload is one paxos.Message (Message.Append), whose own
//	                 from and to must equal the frame's
//	type frameCall:  payload is u8 kind, then the application body
//
// Reply layout:
//
//	u8 PeerMagic, u8 status, payload
//
//	status replyOK:  payload is the handler's reply (empty for paxos frames)
//	status replyErr: payload is a UTF-8 error message
const (
	PeerMagic    = 0xC1
	frameVersion = 1

	framePaxos = 1
	frameCall  = 2

	replyOK  = 0
	replyErr = 1

	frameHeader = 5
	replyHeader = 2
	maxErrText  = 512
)

var (
	// ErrFrame: a peer frame or reply could not be decoded or was not meant
	// for this server; nothing was changed.
	ErrFrame = errors.New("paxosnode: bad peer frame")
	// ErrRemote: the peer answered with an error (its text follows).
	ErrRemote = errors.New("paxosnode: peer error")
)

// Peer client ids: servers call each other with the reserved ClientID
// PeerClientBase|id. Clients pick their ids at random over 64 bits, so one
// lands in this range with probability 2^-56; logs and reply caches can tell
// peers from clients with PeerOf. The range is a convention, not
// authentication: servers and clients share the cluster token.
const PeerClientBase ids.ClientID = 0xFFFF_FFFF_FFFF_FF00

// PeerClientID is the ClientID server id uses when it calls other servers.
func PeerClientID(id ids.ServerID) ids.ClientID { return PeerClientBase | ids.ClientID(id) }

// PeerOf reports whether c is a peer client id, and whose.
func PeerOf(c ids.ClientID) (ids.ServerID, bool) {
	if c&^0xFF != PeerClientBase || c&0xFF == 0 {
		return 0, false
	}
	return ids.ServerID(c & 0xFF), true
}

// IsPeerBody reports whether a request body is a peer frame, to be passed to
// (*Node).HandlePeer, rather than a client wire message.
func IsPeerBody(body []byte) bool { return len(body) > 0 && body[0] == PeerMagic }

// frame is a peer request.
type frame struct {
	typ      byte
	from, to ids.ServerID
	msg      paxos.Message // framePaxos
	kind     byte          // frameCall
	body     []byte        // frameCall; aliases the input
}

// Append encodes f after b.
func (f *frame) Append(b []byte) []byte {
	e := codec.Enc{B: b}
	e.U8(PeerMagic)
	e.U8(frameVersion)
	e.U8(f.typ)
	e.U8(byte(f.from))
	e.U8(byte(f.to))
	switch f.typ {
	case framePaxos:
		return f.msg.Append(e.B)
	case frameCall:
		e.U8(f.kind)
	}
	return append(e.B, f.body...)
}

// Parse decodes a peer request into f. It checks the layout only; who may
// send it to whom is checked by the caller.
func (f *frame) Parse(b []byte) error {
	*f = frame{}
	if len(b) < frameHeader {
		return badFrame("%d bytes, header needs %d", len(b), frameHeader)
	}
	d := codec.NewDec(b)
	if m := d.U8(); m != PeerMagic {
		return badFrame("first byte %#x, want %#x", m, PeerMagic)
	}
	if v := d.U8(); v != frameVersion {
		return badFrame("version %d, want %d", v, frameVersion)
	}
	f.typ, f.from, f.to = d.U8(), ids.ServerID(d.U8()), ids.ServerID(d.U8())
	if f.from == 0 || f.to == 0 {
		return badFrame("zero server id (from %d, to %d)", f.from, f.to)
	}
	if f.from == f.to {
		return badFrame("from %v to itself", f.from)
	}
	switch f.typ {
	case framePaxos:
		m, err := paxos.Parse(d.Rest(transport.MaxBody))
		if err != nil {
			return badFrame("paxos message: %v", err)
		}
		if m.From != f.from || m.To != f.to {
			return badFrame("paxos message %v→%v in frame %v→%v", m.From, m.To, f.from, f.to)
		}
		f.msg = m
	case frameCall:
		if f.kind = d.U8(); d.Err() != nil {
			return badFrame("call without kind")
		}
		f.body = d.Rest(transport.MaxBody)
	default:
		return badFrame("unknown frame type %d", f.typ)
	}
	if err := d.End(); err != nil {
		return badFrame("%v", err)
	}
	return nil
}

func appendPaxosFrame(b []byte, m *paxos.Message) []byte {
	f := frame{typ: framePaxos, from: m.From, to: m.To, msg: *m}
	return f.Append(b)
}

func appendCallFrame(b []byte, from, to ids.ServerID, kind byte, body []byte) []byte {
	f := frame{typ: frameCall, from: from, to: to, kind: kind, body: body}
	return f.Append(b)
}

func badFrame(f string, a ...any) error {
	return fmt.Errorf("%w: "+f, append([]any{ErrFrame}, a...)...)
}

func parseFrame(b []byte) (frame, error) {
	var f frame
	err := f.Parse(b)
	return f, err
}

// peerReply is the answer to a peer request: the handler's reply (empty for
// a paxos frame), or the text of an error.
type peerReply struct {
	err  bool
	body []byte // the reply, or the error's UTF-8 text
}

func (r *peerReply) Append(b []byte) []byte {
	e := codec.Enc{B: b}
	e.U8(PeerMagic)
	if r.err {
		e.U8(replyErr)
	} else {
		e.U8(replyOK)
	}
	return append(e.B, r.body...)
}

func (r *peerReply) Parse(b []byte) error {
	d := codec.NewDec(b)
	if m := d.U8(); d.Err() != nil || m != PeerMagic {
		return badFrame("reply of %d bytes is not a peer reply", len(b))
	}
	switch st := d.U8(); {
	case d.Err() != nil:
		return badFrame("reply of %d bytes is not a peer reply", len(b))
	case st == replyOK || st == replyErr:
		r.err = st == replyErr
	default:
		return badFrame("reply status %d", st)
	}
	r.body = d.Rest(transport.MaxBody)
	if err := d.End(); err != nil {
		return badFrame("reply: %v", err)
	}
	return nil
}

func okReply(body []byte) []byte {
	r := peerReply{body: body}
	return r.Append(make([]byte, 0, replyHeader+len(body)))
}

func errReply(err error) []byte {
	s := err.Error()
	if len(s) > maxErrText {
		s = strings.ToValidUTF8(s[:maxErrText], "")
	}
	r := peerReply{err: true, body: []byte(s)}
	return r.Append(nil)
}

// parseReply returns the body of an OK reply, or the peer's error wrapped in
// ErrRemote, or ErrFrame for a reply that is neither.
func parseReply(b []byte) ([]byte, error) {
	var r peerReply
	if err := r.Parse(b); err != nil {
		return nil, err
	}
	if !r.err {
		return r.body, nil
	}
	if s := r.body; len(s) > maxErrText || !utf8.Valid(s) {
		return nil, fmt.Errorf("%w: (unreadable message of %d bytes)", ErrRemote, len(s))
	}
	return nil, fmt.Errorf("%w: %s", ErrRemote, r.body)
}
