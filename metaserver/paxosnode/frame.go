package paxosnode

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/lease/paxos"
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

// frame is a decoded peer request.
type frame struct {
	typ      byte
	from, to ids.ServerID
	msg      paxos.Message // framePaxos
	kind     byte          // frameCall
	body     []byte        // frameCall; aliases the input
}

func appendFrameHeader(b []byte, typ byte, from, to ids.ServerID) []byte {
	return append(b, PeerMagic, frameVersion, typ, byte(from), byte(to))
}

func appendPaxosFrame(b []byte, m *paxos.Message) []byte {
	b = appendFrameHeader(b, framePaxos, m.From, m.To)
	return m.Append(b)
}

func appendCallFrame(b []byte, from, to ids.ServerID, kind byte, body []byte) []byte {
	b = appendFrameHeader(b, frameCall, from, to)
	b = append(b, kind)
	return append(b, body...)
}

func badFrame(f string, a ...any) error {
	return fmt.Errorf("%w: "+f, append([]any{ErrFrame}, a...)...)
}

// parseFrame decodes a peer request. It checks the layout only; who may send
// it to whom is checked by the caller.
func parseFrame(b []byte) (frame, error) {
	var f frame
	if len(b) < frameHeader {
		return f, badFrame("%d bytes, header needs %d", len(b), frameHeader)
	}
	if b[0] != PeerMagic {
		return f, badFrame("first byte %#x, want %#x", b[0], PeerMagic)
	}
	if b[1] != frameVersion {
		return f, badFrame("version %d, want %d", b[1], frameVersion)
	}
	f.typ, f.from, f.to = b[2], ids.ServerID(b[3]), ids.ServerID(b[4])
	if f.from == 0 || f.to == 0 {
		return f, badFrame("zero server id (from %d, to %d)", f.from, f.to)
	}
	if f.from == f.to {
		return f, badFrame("from %v to itself", f.from)
	}
	p := b[frameHeader:]
	switch f.typ {
	case framePaxos:
		m, err := paxos.Parse(p)
		if err != nil {
			return f, badFrame("paxos message: %v", err)
		}
		if m.From != f.from || m.To != f.to {
			return f, badFrame("paxos message %v→%v in frame %v→%v", m.From, m.To, f.from, f.to)
		}
		f.msg = m
	case frameCall:
		if len(p) < 1 {
			return f, badFrame("call without kind")
		}
		f.kind, f.body = p[0], p[1:]
	default:
		return f, badFrame("unknown frame type %d", f.typ)
	}
	return f, nil
}

func okReply(body []byte) []byte {
	return append([]byte{PeerMagic, replyOK}, body...)
}

func errReply(err error) []byte {
	s := err.Error()
	if len(s) > maxErrText {
		s = strings.ToValidUTF8(s[:maxErrText], "")
	}
	return append([]byte{PeerMagic, replyErr}, s...)
}

// parseReply returns the body of an OK reply, or the peer's error wrapped in
// ErrRemote, or ErrFrame for a reply that is neither.
func parseReply(b []byte) ([]byte, error) {
	if len(b) < replyHeader || b[0] != PeerMagic {
		return nil, badFrame("reply of %d bytes is not a peer reply", len(b))
	}
	switch b[1] {
	case replyOK:
		return b[replyHeader:], nil
	case replyErr:
		s := b[replyHeader:]
		if len(s) > maxErrText || !utf8.Valid(s) {
			return nil, fmt.Errorf("%w: (unreadable message of %d bytes)", ErrRemote, len(s))
		}
		return nil, fmt.Errorf("%w: %s", ErrRemote, s)
	}
	return nil, badFrame("reply status %d", b[1])
}
