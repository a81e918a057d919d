package metaserver

import (
	"bytes"
	"testing"

	"github.com/leasefs/leasefs/wire"
)

// TestPunchResentOnce: OpPunch zeros the range, and the same punch sent
// again (its reply lost) after a write into the range is answered from
// the current state, not applied again.
func TestPunchResentOnce(t *testing.T) {
	s := startTestServer(t)
	ctx := testContext(t)
	a := connect(t, s)
	f := mustCreate(ctx, t, a, "f")
	write := func(off uint64, data []byte) {
		t.Helper()
		if _, err := a.Call(ctx, &wire.Request{Op: wire.OpWrite, Ino: f.Ino, Off: off, Data: data}); err != nil {
			t.Fatalf("write: %v", err)
		}
	}
	read := func() []byte {
		t.Helper()
		rep, err := a.Call(ctx, &wire.Request{Op: wire.OpRead, Ino: f.Ino, Off: 0, Size: 3 * 4096})
		if err != nil {
			t.Fatalf("read: %v", err)
		}
		return rep.Data
	}
	write(0, bytes.Repeat([]byte("x"), 3*4096))
	req := &wire.Request{Op: wire.OpPunch, Ino: f.Ino, Off: 100, Size: 2 * 4096, Flags: wire.PunchHole | wire.PunchKeepSize}
	first, err := a.Call(ctx, req)
	if err != nil || first.Attr == nil || first.Attr.Size != 3*4096 {
		t.Fatalf("punch: %+v, %v", first, err)
	}
	want := bytes.Repeat([]byte("x"), 3*4096)
	clear(want[100 : 100+2*4096])
	if got := read(); !bytes.Equal(got, want) {
		t.Fatalf("read after the punch differs")
	}
	// as another client's write would (one of this client's would tell
	// the server that the punch is finished with)
	if _, err := s.store.Write(f.Ino, 200, []byte("again"), 1); err != nil {
		t.Fatal(err)
	}
	copy(want[200:], "again")
	replayed := s.counters.Replayed.Load()
	if _, err := a.Call(ctx, req); err != nil { // the same ReqID
		t.Fatalf("resent punch: %v", err)
	}
	if s.counters.Replayed.Load() != replayed+1 {
		t.Fatalf("replayed %d -> %d", replayed, s.counters.Replayed.Load())
	}
	if got := read(); !bytes.Equal(got, want) {
		t.Fatalf("the resent punch was applied again")
	}
}
