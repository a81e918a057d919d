package wire

import (
	"bytes"
	"errors"
	"reflect"
	"testing"
)

func sampleRequest() *Request {
	return &Request{Op: OpRename, Ino: 7, Parent: 1, NewPar: 2, Name: "a", NewName: "b",
		Mode: 0o644, Uid: 1000, Umask: 0o22, Flags: 3, Off: 1 << 40, Size: 4096, Atime: -5,
		LockMode: LockExclusive, Version: 9, Opens: 2, NoRedirect: true, Lk: PosixLk{Flock: true, Type: 1, Start: 1, End: 9, Pid: 4, Owner: 77},
		Spans: []Span{{Off: 3, Len: 2}, {Off: 8, Len: 3}}, Data: []byte("hello")}
}

func TestRequestRoundTrip(t *testing.T) {
	in := sampleRequest()
	out, err := ParseRequest(in.Append(nil))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(in, out) {
		t.Fatalf("round trip:\n in %+v\nout %+v", in, out)
	}
}

func TestReplyRoundTrip(t *testing.T) {
	in := &Reply{Code: CodeNotFound, Msg: "x", Attr: &Attr{Ino: 3, Size: 10, Version: 4, Change: 7}, Attr2: &Attr{Ino: 1, Change: 2},
		Entries: []DirEntry{{Name: "f", Ino: 3, Mode: 0o100644, Off: 2}}, Data: []byte{1, 2},
		Names: []string{"user.a"}, Session: &Session{ID: 5, Server: 1, Tau: 2e9, Delta: 0.05, GraceEnd: 3,
			Blocks: BlockStore{Kind: "file", Dir: "/d/blocks", StoreID: "ab", Addr: ":7420", KeepFree: 9, Endpoint: "http://h:9000"}},
		StatFs: &StatFs{Blocks: 1, NameLen: 255}, Grants: []Grant{{Ino: 3, Mode: LockShared, Seq: 4}},
		Lk: &PosixLk{Type: 1, End: 5}, Opens: 3, Owner: 2, Flags: DirNoDefaultACL}
	b := in.Append(nil)
	out, err := ParseReply(b)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(out.Encoded(), b) {
		t.Fatal("Encoded is not the parsed bytes")
	}
	out.encoded = nil
	if !reflect.DeepEqual(in, out) {
		t.Fatalf("round trip:\n in %+v\nout %+v", in, out)
	}
	if !errors.Is(out.Err(), Err(CodeNotFound)) {
		t.Fatalf("Err() = %v", out.Err())
	}
}

func TestRejects(t *testing.T) {
	good := sampleRequest().Append(nil)
	cases := map[string][]byte{
		"empty":     nil,
		"version":   append([]byte{99}, good[1:]...),
		"truncated": good[:len(good)-1],
		"trailing":  append(bytes.Clone(good), 0),
		"unknown op": func() []byte {
			b := bytes.Clone(good)
			b[1] = 200
			return b
		}(),
	}
	huge := (&Request{Op: OpWrite}).Append(nil)
	huge = huge[:len(huge)-4]
	huge = append(huge, 0xff, 0xff, 0xff, 0x7f)
	cases["oversized data"] = huge
	for name, spans := range map[string][]Span{
		"spans overlap":  {{Off: 0, Len: 3}, {Off: 2, Len: 2}},
		"spans descend":  {{Off: 8, Len: 3}, {Off: 0, Len: 2}},
		"span empty":     {{Off: 0, Len: 0}, {Off: 8, Len: 5}},
		"spans short":    {{Off: 0, Len: 4}},
		"spans long":     {{Off: 0, Len: 4}, {Off: 4, Len: 2}},
		"span wraps":     {{Off: 1<<64 - 2, Len: 5}},
		"too many spans": make([]Span, MaxSpans+1),
	} {
		r := sampleRequest()
		r.Spans = spans
		cases[name] = r.Append(nil)
	}
	tooMany := sampleRequest()
	tooMany.Opens = MaxOpens + 1
	cases["too many opens"] = tooMany.Append(nil)
	// NoRedirect comes before the POSIX lock (30 bytes), the span count and
	// the data length (4 each)
	badBool := sampleRequest()
	badBool.Lk, badBool.Spans, badBool.Data = PosixLk{}, nil, nil
	b := badBool.Append(nil)
	if i := len(b) - (30 + 4 + 4 + 1); b[i] != 1 {
		t.Fatalf("NoRedirect byte not where expected: %v", b[i-4:])
	} else {
		b[i] = 2
		cases["bad boolean"] = b
	}
	for name, b := range cases {
		if _, err := ParseRequest(b); err == nil {
			t.Errorf("%s: parsed without error", name)
		}
	}
	if _, err := ParseRequest(good); err != nil {
		t.Fatal(err)
	}
	if _, err := ParseReply([]byte{Version, 0, 0, 0, 0, 0, 0, 0xff, 0xff}); err == nil {
		t.Error("reply with unknown sections parsed")
	}
	if _, err := ParseReply((&Reply{Opens: MaxOpens + 1}).Append(nil)); err == nil {
		t.Error("reply with too many opens parsed")
	}
	zeroOwner := (&Reply{Code: CodeRedirect, Owner: 1}).Append(nil)
	zeroOwner[len(zeroOwner)-1] = 0
	if _, err := ParseReply(zeroOwner); err == nil {
		t.Error("redirect to server 0 parsed")
	}
}

func TestUniques(t *testing.T) {
	in := [][16]byte{{1, 2}, {3}}
	out, err := ParseUniques(AppendUniques(nil, in))
	if err != nil || !reflect.DeepEqual(in, out) {
		t.Fatalf("round trip: %v %v", out, err)
	}
	for _, n := range []int{0, 15, 17, 16 * (MaxBlockAccess + 1)} {
		if _, err := ParseUniques(make([]byte, n)); err == nil {
			t.Errorf("%d bytes parsed", n)
		}
	}
}

func FuzzParse(f *testing.F) {
	f.Add(sampleRequest().Append(nil))
	f.Add((&Reply{Code: CodeOK, Entries: []DirEntry{{Name: "a"}}}).Append(nil))
	f.Add((&Callback{Kind: CallbackRevoke, Ino: 1}).Append(nil))
	f.Add((&Request{Op: OpBlockAccess, Ino: 3, Flags: BlockWrite, Data: AppendUniques(nil, [][16]byte{{1}, {2}})}).Append(nil))
	blks, exts := sampleCommit()
	f.Add((&Request{Op: OpCommitBlocks, Ino: 3, Size: 9, ReqID: 1, Data: AppendCommit(nil, blks, exts)}).Append(nil))
	f.Add((&Reply{Attr: &Attr{Ino: 3}, Data: AppendPieces(nil, samplePieces())}).Append(nil))
	f.Add((&Reply{Session: &Session{ID: 1, Tau: 1, Blocks: BlockStore{Kind: "file", Dir: "/b", StoreID: "x", Addr: "h:1"}},
		Names: []string{"cap"}}).Append(nil))
	f.Fuzz(func(t *testing.T, b []byte) {
		if r, err := ParseRequest(b); err == nil {
			if _, err := ParseRequest(r.Append(nil)); err != nil {
				t.Fatalf("re-encoded request does not parse: %v", err)
			}
			// the head the admin metrics read is the request's
			if h, err := ParseRequestHead(b); err != nil || h.Op != r.Op || h.Ino != r.Ino {
				t.Fatalf("head %+v, %v of request %v %v", h, err, r.Op, r.Ino)
			}
		}
		if r, err := ParseReply(b); err == nil {
			if _, err := ParseReply(r.Append(nil)); err != nil {
				t.Fatalf("re-encoded reply does not parse: %v", err)
			}
			if h, err := ParseReplyHead(b); err != nil || h.Code != r.Code {
				t.Fatalf("head %+v, %v of reply %v", h, err, r.Code)
			}
		}
		_, _ = ParseCallback(b)
	})
}

// TestPeekIno: the inode of a request from its first bytes only.
func TestPeekIno(t *testing.T) {
	b := (&Request{Op: OpWrite, Ino: 77, Data: make([]byte, 1000)}).Append(nil)
	if ino, ok := PeekIno(b[:10]); !ok || ino != 77 {
		t.Fatalf("PeekIno: %v %v", ino, ok)
	}
	if _, ok := PeekIno(b[:9]); ok {
		t.Fatal("PeekIno of 9 bytes")
	}
}
