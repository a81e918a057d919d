package transport

import (
	"errors"
	"testing"

	"github.com/leasefs/leasefs/internal/ids"
)

// oneCache returns a store with one open session's cache.
func oneCache(size, maxBytes, maxTotal int) (*replyStore, *replyCache) {
	st := newReplyStore(size, maxBytes, maxTotal)
	key := sessionKey{1, 1}
	st.open(key)
	return st, st.lookup(key, false)
}

func TestReplyCacheDedup(t *testing.T) {
	st, c := oneCache(4, 1<<20, 1<<20)
	e, run, err := st.begin(c, 1, 0)
	if !run || err != nil {
		t.Fatal("first begin must run")
	}
	dup, run, err := st.begin(c, 1, 0)
	if run || err != nil || dup != e {
		t.Fatal("in-flight duplicate must wait for the first execution")
	}
	done := st.wait(dup)
	select {
	case <-done:
		t.Fatal("done before finish")
	default:
	}
	st.finish(c, 1, e, []byte("r1"), false)
	<-done
	if r, ok, _ := st.result(dup); !ok || string(r) != "r1" {
		t.Fatalf("result %q %v", r, ok)
	}
	dup, run, _ = st.begin(c, 1, 0)
	if run || st.wait(dup) != nil {
		t.Fatal("finished duplicate must not run nor wait")
	}
	if r, _, _ := st.result(dup); string(r) != "r1" {
		t.Fatalf("cached %q", r)
	}
}

func TestReplyCacheEviction(t *testing.T) {
	st, c := oneCache(4, 1<<20, 1<<20)
	for seq := uint64(1); seq <= 10; seq++ {
		e, run, err := st.begin(c, seq, 0)
		if !run || err != nil {
			t.Fatalf("seq %d: run %v err %v", seq, run, err)
		}
		st.finish(c, seq, e, []byte{byte(seq)}, false)
	}
	if len(c.entries) != 4 || c.live() != 4 {
		t.Fatalf("%d entries, %d live, want 4", len(c.entries), c.live())
	}
	// evicted seqs are refused, never executed again
	for seq := uint64(1); seq <= 6; seq++ {
		if _, _, err := st.begin(c, seq, 0); !errors.Is(err, ErrReplyEvicted) {
			t.Fatalf("seq %d: %v, want ErrReplyEvicted", seq, err)
		}
	}
	for seq := uint64(7); seq <= 10; seq++ {
		e, run, err := st.begin(c, seq, 0)
		if run || err != nil {
			t.Fatalf("seq %d should be cached", seq)
		}
		if r, ok, _ := st.result(e); !ok || r[0] != byte(seq) {
			t.Fatalf("seq %d: %v %v", seq, r, ok)
		}
	}
	// in-flight entries are not evicted by finished ones
	inflight, _, _ := st.begin(c, 11, 0)
	for seq := uint64(12); seq <= 30; seq++ {
		e, _, _ := st.begin(c, seq, 0)
		st.finish(c, seq, e, nil, false)
	}
	if e, run, err := st.begin(c, 11, 0); run || err != nil || e != inflight {
		t.Fatal("in-flight entry lost")
	}
	if len(c.order) > 64+2*4+1 {
		t.Fatalf("order grew to %d", len(c.order))
	}
}

func TestReplyCacheBytes(t *testing.T) {
	st, c := oneCache(100, 10, 1<<20)
	for seq := uint64(1); seq <= 5; seq++ {
		e, _, _ := st.begin(c, seq, 0)
		st.finish(c, seq, e, []byte("1234"), false)
	}
	if c.bytes > 10 || st.total != c.bytes {
		t.Fatalf("%d bytes kept (%d in total), bound 10", c.bytes, st.total)
	}
	// old bodies dropped: known seq, but no reply, and no second execution
	e, run, err := st.begin(c, 1, 0)
	if run || err != nil {
		t.Fatal("seq 1 must stay known")
	}
	if _, ok, _ := st.result(e); ok {
		t.Fatal("seq 1 body should be dropped")
	}
	e, _, _ = st.begin(c, 5, 0)
	if r, ok, _ := st.result(e); !ok || string(r) != "1234" {
		t.Fatal("newest reply must be kept")
	}
	// one reply larger than the whole budget is still delivered
	e, _, _ = st.begin(c, 6, 0)
	st.finish(c, 6, e, make([]byte, 100), false)
	if r, ok, _ := st.result(e); !ok || len(r) != 100 {
		t.Fatal("newest large reply dropped")
	}
}

// TestReplyCacheTotal: the bodies of all sessions together stay within
// the total, the oldest dropped first whichever session they are in, and
// the list of bodies does not grow with the bodies ever kept.
func TestReplyCacheTotal(t *testing.T) {
	st := newReplyStore(1024, 1<<20, 1000)
	var caches []*replyCache
	for i := range 10 {
		key := sessionKey{ids.ClientID(i + 1), 1}
		st.open(key)
		caches = append(caches, st.lookup(key, false))
	}
	for seq := uint64(1); seq <= 500; seq++ {
		for _, c := range caches {
			e, run, err := st.begin(c, seq, 0)
			if !run || err != nil {
				t.Fatal(seq, err)
			}
			st.finish(c, seq, e, make([]byte, 10), false)
			if st.total > 1000 {
				t.Fatalf("seq %d: %d bytes kept, total bound 1000", seq, st.total)
			}
		}
	}
	// the newest 100 replies (10 sessions x 10) are kept, older ones not
	for _, c := range caches {
		for seq := uint64(480); seq <= 500; seq++ {
			e, run, err := st.begin(c, seq, 0)
			if run || err != nil {
				t.Fatal("seq", seq, "unknown")
			}
			if _, ok, _ := st.result(e); ok != (seq > 490) {
				t.Fatalf("seq %d: body kept %v", seq, ok)
			}
		}
	}
	if n := len(st.bodies) - st.bhead; n > 2*st.live+1024 {
		t.Fatalf("%d bodies listed for %d kept", n, st.live)
	}
	// forgetting a session gives its bytes back
	before, own := st.total, caches[0].bytes
	st.forget(sessionKey{1, 1})
	if own == 0 || st.total != before-own || caches[0].bytes != 0 {
		t.Fatalf("total %d after forgetting a session's %d bytes (was %d)", st.total, own, before)
	}
}

// TestReplyCacheOldest: replies below the client's oldest seq in flight
// are forgotten, those at or above it kept, and a request below it
// refused (the client gave it up).
func TestReplyCacheOldest(t *testing.T) {
	st, c := oneCache(1024, 1<<20, 1<<20)
	for seq := uint64(1); seq <= 100; seq++ {
		e, _, _ := st.begin(c, seq, 0)
		st.finish(c, seq, e, []byte("r"), false)
	}
	if len(c.entries) != 100 {
		t.Fatalf("%d entries", len(c.entries))
	}
	e, run, err := st.begin(c, 101, 95) // 95..100 may still be sent again
	if !run || err != nil {
		t.Fatal(err)
	}
	st.finish(c, 101, e, nil, false)
	if len(c.entries) != 7 || st.total != 6 {
		t.Fatalf("%d entries, %d bytes after oldest 95, want 7 and 6", len(c.entries), st.total)
	}
	if e, run, err := st.begin(c, 95, 95); run || err != nil {
		t.Fatalf("seq 95: run %v %v", run, err)
	} else if r, ok, _ := st.result(e); !ok || string(r) != "r" {
		t.Fatal("seq 95's reply lost")
	}
	if _, _, err := st.begin(c, 94, 95); !errors.Is(err, ErrReplyEvicted) {
		t.Fatalf("seq 94 below the oldest: %v", err)
	}
	// an oldest beyond the request's own seq is taken as its seq
	if _, run, err := st.begin(c, 102, 1000); !run || err != nil {
		t.Fatal(err)
	}
	if c.floor != 102 {
		t.Fatalf("floor %d", c.floor)
	}
	// an idle session that only renews keeps one entry
	for seq := uint64(200); seq < 300; seq++ {
		e, _, _ := st.begin(c, seq, seq)
		st.finish(c, seq, e, []byte("ok"), false)
	}
	if len(c.entries) > 2 {
		t.Fatalf("an idle session keeps %d entries", len(c.entries))
	}
}

// TestReplyCacheSessions: only sessions opened get a cache; a peer
// server's connection gets one for the few sessions it uses.
func TestReplyCacheSessions(t *testing.T) {
	st := newReplyStore(16, 1<<20, 1<<20)
	for s := range 100 {
		if c := st.lookup(sessionKey{7, ids.SessionID(s)}, false); c != nil {
			t.Fatal("a made-up session got a cache")
		}
	}
	for s := range 100 {
		if c := st.lookup(sessionKey{9, ids.SessionID(s)}, true); c == nil {
			t.Fatal("no cache for a peer")
		}
	}
	if n, _, _ := st.stats(); n != maxPeerSessions {
		t.Fatalf("%d sessions kept for one peer, want %d", n, maxPeerSessions)
	}
	st.open(sessionKey{7, 1})
	if st.lookup(sessionKey{7, 1}, false) == nil {
		t.Fatal("an opened session has no cache")
	}
}

// TestReplyCacheRerun: an idempotent request keeps no entry once done.
func TestReplyCacheRerun(t *testing.T) {
	st, c := oneCache(16, 1<<20, 1<<20)
	e, _, _ := st.begin(c, 1, 0)
	dup, run, _ := st.begin(c, 1, 0)
	if run {
		t.Fatal("duplicate ran")
	}
	st.finish(c, 1, e, []byte("data"), true)
	if _, ok, rerun := st.result(dup); ok || !rerun {
		t.Fatal("a waiting duplicate of an idempotent request must run again")
	}
	if len(c.entries) != 0 || st.total != 0 {
		t.Fatalf("%d entries and %d bytes kept for an idempotent request", len(c.entries), st.total)
	}
	if _, run, _ := st.begin(c, 1, 0); !run {
		t.Fatal("a later duplicate must run again")
	}
}
