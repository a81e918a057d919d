package ownership

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/metaserver/replica"
	"github.com/leasefs/leasefs/metaserver/store"
	"github.com/leasefs/leasefs/wire"
)

// Records as a replica holds them: an inode's attributes, a page of its
// data, a directory entry, an extended attribute.
func seedRecords() []store.Write {
	tx := &store.Tx{}
	return []store.Write{
		{Key: tx.Key(store.RecAttr, 5, nil), Value: bytes.Repeat([]byte{7}, 96)},
		{Key: tx.Key64(store.RecPage, 5, 3), Value: bytes.Repeat([]byte("chunk"), 800)},
		{Key: tx.Key(store.RecEntry, 5, []byte("a name")), Value: []byte{0, 0, 0, 0, 0, 0, 0, 9}},
		{Key: tx.Key(store.RecXattr, 5, []byte("user.x")), Delete: true},
	}
}

// fuzzMessage checks that the parser of M never panics, fails only with
// errPeerDecode, and accepts nothing but what M's Append writes: a
// message it parses encodes back to the same bytes.
func fuzzMessage[M any, P interface {
	*M
	peerMessage
}](f *testing.F, seeds ...P) {
	for _, m := range seeds {
		f.Add(m.Append(nil))
	}
	f.Add([]byte{})
	f.Add([]byte{peerVersion})
	f.Add([]byte{peerVersion + 1, 0, 0, 0, 0, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		var m P = new(M)
		if err := m.Parse(b); err != nil {
			if !errors.Is(err, errPeerDecode) {
				t.Fatalf("%T: error %v is not errPeerDecode", m, err)
			}
			return
		}
		if got := m.Append(nil); !bytes.Equal(got, b) {
			t.Fatalf("%T: %x parses, and encodes back as %x", m, b, got)
		}
	})
}

func FuzzApplyReq(f *testing.F) {
	recs := seedRecords()
	fuzzMessage(f, &applyReq{Changes: []replica.Change{
		{Ino: 5, Epoch: 1<<40 | 3, Version: 12, Writes: recs},
		{Ino: 6, Epoch: 1<<40 | 3, Version: 2, Writes: recs[:1]},
	}}, &applyReq{})
}

func FuzzInoReq(f *testing.F) { fuzzMessage(f, &inoReq{Ino: ids.RootIno}, &inoReq{Ino: 1 << 50}) }

func FuzzReplStateRep(f *testing.F) {
	fuzzMessage(f, &replStateRep{Epoch: 1<<40 | 2, Version: 99}, &replStateRep{})
}

func FuzzStateReq(f *testing.F) {
	fuzzMessage(f, &stateReq{Ino: 5, MaxBytes: transferPage, After: seedRecords()[1].Key}, &stateReq{Ino: 5, MaxBytes: 1})
}

func FuzzStatePageRep(f *testing.F) {
	fuzzMessage(f, &statePageRep{Page: replica.StatePage{Epoch: 9, Version: 11, Last: true, Records: seedRecords()[:3]}},
		&statePageRep{})
}

func FuzzStageReq(f *testing.F) {
	tr := replica.Transfer{Ino: 5, ID: 7, Replaces: 3, Epoch: 9, SrcEpoch: 8, Version: 11}
	fuzzMessage(f, &stageReq{Tr: tr, Seq: 2, Last: true, Records: seedRecords()[:3]}, &stageReq{Tr: tr})
}

func FuzzRestampReq(f *testing.F) {
	fuzzMessage(f, &restampReq{Ino: 5, Epoch: 1<<40 | 2, Version: 4, NewEpoch: 2<<40 | 1})
}

func FuzzDoneRep(f *testing.F) { fuzzMessage(f, &doneRep{Done: true}, &doneRep{}) }

func FuzzDigestReq(f *testing.F) { fuzzMessage(f, &digestReq{After: 4096, Max: 1024}) }

func FuzzDigestRep(f *testing.F) {
	fuzzMessage(f, &digestRep{Page: replica.DigestPage{After: 1, Through: 9, Inodes: []replica.InodeDigest{
		{Ino: 2, Epoch: 1<<40 | 1, Version: 5, Hash: 0xdeadbeef}, {Ino: 9, Epoch: 3, Version: 1, Hash: 1}}}})
}

func FuzzLockFreeReq(f *testing.F) { fuzzMessage(f, &lockFreeReq{Ino: 5, Epoch: 1<<40 | 7}) }

func FuzzReplyStatus(f *testing.F) {
	var seeds []*replyStatus
	for _, err := range []error{nil, &replica.StaleEpochError{Ino: 5, Seen: 9}, &replica.VersionGapError{Ino: 5},
		wire.Errf(wire.CodeNoSpace, "no space"), errors.New("badger: closed"), errPeerNotOwner} {
		st := statusOf(err)
		seeds = append(seeds, &st)
	}
	seeds = append(seeds, &replyStatus{Code: stNotOwner})
	fuzzMessage(f, seeds...)
}

// TestPeerReplies: a reply gives back the error it reports, or the body
// it carries, and a reply the caller cannot read is errPeerDecode.
func TestPeerReplies(t *testing.T) {
	var stale *replica.StaleEpochError
	if err := parseReply(statusReply(&replica.StaleEpochError{Ino: 5, Seen: 9}), nil); !errors.As(err, &stale) ||
		stale.Ino != 5 || stale.Seen != 9 {
		t.Fatalf("stale epoch: %v", err)
	}
	var gap *replica.VersionGapError
	if err := parseReply(statusReply(&replica.VersionGapError{Ino: 6}), nil); !errors.As(err, &gap) || gap.Ino != 6 {
		t.Fatalf("version gap: %v", err)
	}
	if err := parseReply(statusReply(wire.Errf(wire.CodeNoSpace, "full")), nil); wire.CodeOf(err) != wire.CodeNoSpace {
		t.Fatalf("no space: %v", err)
	}
	st := replyStatus{Code: stNotOwner}
	if err := parseReply(st.Append(nil), nil); !errors.Is(err, errPeerNotOwner) {
		t.Fatalf("not owner: %v", err)
	}
	long := strings.Repeat("é", maxErrText)
	if err := parseReply(statusReply(errors.New(long)), nil); err == nil || errors.Is(err, errPeerDecode) ||
		len(err.Error()) > maxErrText+64 {
		t.Fatalf("long error: %.80v", err)
	}
	var rs replStateRep
	if err := parseReply(okReply(&replStateRep{Epoch: 3, Version: 4}), &rs); err != nil || rs != (replStateRep{3, 4}) {
		t.Fatalf("state reply: %+v, %v", rs, err)
	}
	if err := parseReply(okReply(&doneRep{Done: true}), nil); !errors.Is(err, errPeerDecode) {
		t.Fatalf("a body where none belongs: %v", err)
	}
	if err := parseReply(statusReply(nil), &rs); !errors.Is(err, errPeerDecode) {
		t.Fatalf("no body where one belongs: %v", err)
	}
	for _, b := range [][]byte{nil, {peerVersion}, {peerVersion + 1, stOK}, {peerVersion, 99}} {
		if err := parseReply(b, nil); !errors.Is(err, errPeerDecode) {
			t.Fatalf("reply %x: %v", b, err)
		}
	}
}
