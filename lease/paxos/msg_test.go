package paxos

import (
	"bytes"
	"errors"
	"reflect"
	"testing"

	"github.com/leasefs/leasefs/internal/ids"
)

func sampleMessage() Message {
	return Message{From: 1, To: 3, Entries: []Entry{
		{Kind: KindPrepare, Ino: 7, Ballot: 1<<24 | 1<<8 | 1},
		{Kind: KindPromise, Ino: 1 << 60, Ballot: 5, Owner: 2, Aux: 4},
		{Kind: KindLearn, Ino: ids.RootIno, Ballot: 9, Owner: 1, Aux: 123456789},
		{Kind: KindRelease, Ino: 8, Ballot: 9, Owner: 255},
	}}
}

func TestMessageRoundTrip(t *testing.T) {
	m := sampleMessage()
	b := m.Append([]byte("prefix"))
	got, err := Parse(b[len("prefix"):])
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, m) {
		t.Fatalf("got %+v\nwant %+v", got, m)
	}
	if len(b)-len("prefix") != headerSize+len(m.Entries)*entrySize {
		t.Fatalf("size %d", len(b))
	}
}

func TestParseErrors(t *testing.T) {
	m := sampleMessage()
	good := m.Append(nil)
	bad := func(mut func([]byte) []byte) []byte { return mut(bytes.Clone(good)) }
	for name, c := range map[string]struct {
		b   []byte
		err error
	}{
		"empty":     {nil, ErrShort},
		"version":   {bad(func(b []byte) []byte { b[0] = 2; return b }), ErrVersion},
		"zero from": {bad(func(b []byte) []byte { b[1] = 0; return b }), ErrZeroID},
		"truncated": {good[:len(good)-1], ErrShort},
		"trailing":  {append(bytes.Clone(good), 0), ErrTrailing},
		"kind":      {bad(func(b []byte) []byte { b[headerSize] = byte(kindEnd); return b }), ErrKind},
		"count":     {bad(func(b []byte) []byte { b[3], b[4], b[5], b[6] = 0xff, 0xff, 0xff, 0xff; return b }), ErrTooLarge},
	} {
		if _, err := Parse(c.b); !errors.Is(err, c.err) {
			t.Errorf("%s: got %v, want %v", name, err, c.err)
		}
	}
}

func FuzzParse(f *testing.F) {
	m := sampleMessage()
	f.Add(m.Append(nil))
	f.Add([]byte{Version, 1, 2, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := Parse(b)
		if err != nil {
			return
		}
		// whatever parses re-encodes to the same bytes
		if again := m.Append(nil); !bytes.Equal(again, b) {
			t.Fatalf("re-encoding differs:\n%x\n%x", again, b)
		}
	})
}
