package client

import (
	"context"
	"testing"
	"time"

	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/wire"
)

// TestBehindHold: a create queued behind is held until createHold ends it,
// or a wait, or a flush takes it along; a removal goes at once and takes
// what is held in its directory with it.
func TestBehindHold(t *testing.T) {
	var b behind
	sent := make(chan ids.Ino, 16)
	b.init(func(dir ids.Ino) {
		for {
			reqs, ok := b.next(dir)
			if !ok {
				return
			}
			for _, r := range reqs {
				b.done(dir, r.Ino, r.Name)
			}
			sent <- dir
		}
	})
	create := func(dir, ino ids.Ino, name string) {
		_ = b.reserve(context.Background())
		b.start(dir, ino, name)
		b.queue(dir, &wire.Request{Op: wire.OpCreate, Parent: dir, Name: name, Ino: ino, Flags: wire.CreateIno}, true)
	}
	expect := func(what string, dir ids.Ino, within time.Duration) {
		t.Helper()
		select {
		case got := <-sent:
			if got != dir {
				t.Fatalf("%s: directory %v sent, want %v", what, got, dir)
			}
		case <-time.After(within):
			t.Fatalf("%s: nothing sent within %v", what, within)
		}
	}

	start := time.Now()
	create(1, 10, "a")
	expect("a hold's end", 1, time.Second)
	if held := time.Since(start); held < createHold/2 {
		t.Errorf("a create held %v, want about %v", held, createHold)
	}

	create(2, 20, "b")
	go b.wait(context.Background(), 20)
	expect("a wait", 2, createHold/2)

	create(3, 30, "c")
	dir, q, ok := b.takeHeld(30)
	if !ok || dir != 3 || len(q) != 1 || q[0].Ino != 30 {
		t.Fatalf("takeHeld: %v %v %v", dir, q, ok)
	}
	if _, _, again := b.takeHeld(30); again {
		t.Fatal("a taken queue taken again")
	}
	b.done(3, 30, "c")
	b.sent(3)
	select {
	case d := <-sent:
		t.Fatalf("directory %v sent after a flush took its queue", d)
	case <-time.After(2 * createHold):
	}

	create(4, 40, "d")
	_ = b.reserve(context.Background())
	b.start(4, 41, "e")
	b.queue(4, &wire.Request{Op: wire.OpUnlink, Parent: 4, Name: "e", Ino: 41, Flags: wire.RemoveIfIno}, false)
	expect("a removal", 4, createHold/2)
}
