package paxos

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/leasefs/leasefs/internal/ids"
)

// Kind is the type of one Entry.
type Kind uint8

const (
	KindPrepare       Kind = iota + 1 // proposer → acceptor: Ballot
	KindPromise                       // acceptor → proposer: Ballot; Owner, Aux = live accepted (owner, ballot) or zero
	KindPrepareReject                 // acceptor → proposer: Ballot; Aux = the higher promise
	KindPropose                       // proposer → acceptor: Ballot, Owner (= proposer)
	KindAccepted                      // acceptor → proposer: Ballot
	KindProposeReject                 // acceptor → proposer: Ballot; Aux = the higher promise
	KindLearn                         // owner → learners: Ballot (lease), Owner, Aux = remaining ns on the owner's clock
	KindRelease                       // owner → learners and acceptors: Ballot (lease), Owner
	kindEnd
)

var kindNames = [...]string{"?", "prepare", "promise", "prepare-reject", "propose", "accepted", "propose-reject", "learn", "release"}

func (k Kind) String() string {
	if k < kindEnd {
		return kindNames[k]
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Entry moves one instance (resource) one step.
type Entry struct {
	Kind   Kind
	Ino    ids.Ino
	Ballot ids.Epoch
	Owner  ids.ServerID
	Aux    uint64
}

func (e Entry) String() string {
	b := FormatBallot(e.Ballot)
	switch e.Kind {
	case KindPromise:
		if e.Owner != 0 {
			return fmt.Sprintf("%v %v b=%s open=(%d,%s)", e.Kind, uint64(e.Ino), b, e.Owner, FormatBallot(ids.Epoch(e.Aux)))
		}
	case KindPrepareReject, KindProposeReject:
		return fmt.Sprintf("%v %v b=%s promised=%s", e.Kind, uint64(e.Ino), b, FormatBallot(ids.Epoch(e.Aux)))
	case KindPropose, KindRelease:
		return fmt.Sprintf("%v %v b=%s owner=%d", e.Kind, uint64(e.Ino), b, e.Owner)
	case KindLearn:
		return fmt.Sprintf("%v %v b=%s owner=%d left=%v", e.Kind, uint64(e.Ino), b, e.Owner, time.Duration(e.Aux))
	}
	return fmt.Sprintf("%v %v b=%s", e.Kind, uint64(e.Ino), b)
}

// FormatBallot shows a ballot as counter.boot.server.
func FormatBallot(b ids.Epoch) string {
	return fmt.Sprintf("%d.%d.%d", ballotCounter(uint64(b)), BallotBoot(b), BallotServer(b))
}

// Message is the batch one node sends one peer in one step: every instance it
// needs to move, so holding N leases costs messages independent of N.
type Message struct {
	From, To ids.ServerID
	Entries  []Entry
}

// Encoding bounds and errors.
const (
	Version    = 1
	MaxEntries = 1 << 22 // 4 Mi instances, ~100 MiB: above any batch a node builds
	headerSize = 1 + 1 + 1 + 4
	entrySize  = 1 + 8 + 8 + 1 + 8
)

var (
	ErrShort    = errors.New("paxos: message truncated")
	ErrVersion  = errors.New("paxos: unsupported message version")
	ErrTooLarge = errors.New("paxos: too many entries")
	ErrTrailing = errors.New("paxos: trailing bytes after message")
	ErrKind     = errors.New("paxos: unknown entry kind")
	ErrZeroID   = errors.New("paxos: zero server id")
)

// Append appends m's encoding to b: version, from, to, count, then fixed-size
// little-endian entries.
func (m *Message) Append(b []byte) []byte {
	b = append(b, Version, byte(m.From), byte(m.To))
	b = binary.LittleEndian.AppendUint32(b, uint32(len(m.Entries)))
	for _, e := range m.Entries {
		b = append(b, byte(e.Kind))
		b = binary.LittleEndian.AppendUint64(b, uint64(e.Ino))
		b = binary.LittleEndian.AppendUint64(b, uint64(e.Ballot))
		b = append(b, byte(e.Owner))
		b = binary.LittleEndian.AppendUint64(b, e.Aux)
	}
	return b
}

// Parse decodes one message. It never panics and allocates no more than the
// input justifies.
func Parse(b []byte) (Message, error) {
	var m Message
	if len(b) < headerSize {
		return m, ErrShort
	}
	if b[0] != Version {
		return m, fmt.Errorf("%w %d (want %d)", ErrVersion, b[0], Version)
	}
	m.From, m.To = ids.ServerID(b[1]), ids.ServerID(b[2])
	if m.From == 0 || m.To == 0 {
		return m, ErrZeroID
	}
	n := binary.LittleEndian.Uint32(b[3:])
	b = b[headerSize:]
	if n > MaxEntries {
		return m, fmt.Errorf("%w: %d", ErrTooLarge, n)
	}
	if uint64(n)*entrySize > uint64(len(b)) {
		return m, ErrShort
	}
	if uint64(n)*entrySize < uint64(len(b)) {
		return m, ErrTrailing
	}
	m.Entries = make([]Entry, n)
	for i := range m.Entries {
		e := &m.Entries[i]
		e.Kind = Kind(b[0])
		if e.Kind == 0 || e.Kind >= kindEnd {
			return Message{}, fmt.Errorf("%w %d", ErrKind, b[0])
		}
		e.Ino = ids.Ino(binary.LittleEndian.Uint64(b[1:]))
		e.Ballot = ids.Epoch(binary.LittleEndian.Uint64(b[9:]))
		e.Owner = ids.ServerID(b[17])
		e.Aux = binary.LittleEndian.Uint64(b[18:])
		b = b[entrySize:]
	}
	return m, nil
}
