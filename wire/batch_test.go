package wire

import (
	"errors"
	"testing"

	"github.com/leasefs/leasefs/internal/ids"
)

func removal(parent uint64, name string, reqID uint64) *Request {
	return &Request{Op: OpUnlink, Parent: ids.Ino(parent), Name: name, Ino: 7, Flags: RemoveIfIno, ReqID: reqID, Oldest: 1}
}

func TestBatchRoundTrip(t *testing.T) {
	reqs := []*Request{removal(3, "a", 1), removal(3, "b", 2), {Op: OpRmdir, Parent: 3, Name: "d", ReqID: 3}}
	got, err := ParseBatch(AppendBatch(nil, reqs))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(reqs) {
		t.Fatalf("%d requests, want %d", len(got), len(reqs))
	}
	for i := range reqs {
		if got[i].Op != reqs[i].Op || got[i].Name != reqs[i].Name || got[i].ReqID != reqs[i].ReqID || got[i].Parent != 3 {
			t.Errorf("request %d: %+v, want %+v", i, got[i], reqs[i])
		}
	}
	reps := []*Reply{{}, {Code: CodeNotFound, Msg: "gone"}, {Grants: []Grant{{Ino: 9, Mode: LockExclusive, Seq: 4}}}}
	back, err := ParseBatchReplies(AppendBatchReplies(nil, reps), len(reps))
	if err != nil {
		t.Fatal(err)
	}
	if back[1].Code != CodeNotFound || len(back[2].Grants) != 1 || back[2].Grants[0].Seq != 4 {
		t.Errorf("replies: %+v %+v", back[1], back[2])
	}
	if _, err := ParseBatchReplies(AppendBatchReplies(nil, reps), 2); !errors.Is(err, ErrBadBatch) {
		t.Errorf("3 replies read as the answer to 2 requests: %v", err)
	}
}

func createAs(parent, ino uint64, name string, reqID uint64) *Request {
	return &Request{Op: OpCreate, Parent: ids.Ino(parent), Name: name, Ino: ids.Ino(ino), Flags: CreateIno | CreateOpen, ReqID: reqID}
}

func write(ino uint64, reqID uint64) *Request {
	return &Request{Op: OpWrite, Ino: ids.Ino(ino), Data: []byte("data"), ReqID: reqID}
}

// TestBatchCreateWithData: a batch may carry a change of a file created
// earlier in it (its data, sent with its create), and of no other inode.
func TestBatchCreateWithData(t *testing.T) {
	reqs := []*Request{removal(3, "a", 1), createAs(3, 9, "b", 2), write(9, 3)}
	got, err := ParseBatch(AppendBatch(nil, reqs))
	if err != nil {
		t.Fatal(err)
	}
	if got[2].Op != OpWrite || got[2].Ino != 9 || string(got[2].Data) != "data" {
		t.Errorf("the write: %+v", got[2])
	}
}

func TestBatchBad(t *testing.T) {
	many := make([]*Request, MaxBatch+1)
	for i := range many {
		many[i] = removal(3, "f", uint64(i+1))
	}
	nested := &Request{Op: OpBatch, Parent: 3, Data: AppendBatch(nil, []*Request{removal(3, "a", 1)})}
	for name, b := range map[string][]byte{
		"empty":                   AppendBatch(nil, nil),
		"too many":                AppendBatch(nil, many),
		"not a change":            AppendBatch(nil, []*Request{{Op: OpLookup, Parent: 3, Name: "a", ReqID: 1}}),
		"no request id":           AppendBatch(nil, []*Request{removal(3, "a", 0)}),
		"two homes":               AppendBatch(nil, []*Request{removal(3, "a", 1), removal(4, "b", 2)}),
		"write before its create": AppendBatch(nil, []*Request{removal(3, "a", 1), write(9, 2), createAs(3, 9, "b", 3)}),
		"write of another file":   AppendBatch(nil, []*Request{createAs(3, 9, "b", 1), write(8, 2)}),
		"create without its ino":  AppendBatch(nil, []*Request{{Op: OpCreate, Parent: 3, Name: "b", Ino: 9, ReqID: 1}, write(9, 2)}),
		"nested":                  AppendBatch(nil, []*Request{nested}),
		"trailing bytes":          append(AppendBatch(nil, []*Request{removal(3, "a", 1)}), 0),
		"truncated":               AppendBatch(nil, []*Request{removal(3, "a", 1)})[:20],
		"bad request":             {1, 0, 0, 0, 3, 0, 0, 0, 1, 2, 3},
	} {
		if reqs, err := ParseBatch(b); err == nil {
			t.Errorf("%s: parsed %d requests", name, len(reqs))
		}
	}
}

func FuzzParseBatch(f *testing.F) {
	f.Add(AppendBatch(nil, []*Request{removal(3, "a", 1), removal(3, "b", 2)}))
	f.Add(AppendBatchReplies(nil, []*Reply{{}, {Code: CodeNotFound}}))
	f.Fuzz(func(t *testing.T, b []byte) {
		if reqs, err := ParseBatch(b); err == nil {
			if _, err := ParseBatch(AppendBatch(nil, reqs)); err != nil {
				t.Fatalf("re-encoded batch does not parse: %v", err)
			}
		}
		if reps, err := ParseBatchReplies(b, 2); err == nil {
			if _, err := ParseBatchReplies(AppendBatchReplies(nil, reps), 2); err != nil {
				t.Fatalf("re-encoded batch reply does not parse: %v", err)
			}
		}
	})
}
