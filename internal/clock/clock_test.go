package clock

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"
)

// TestRealInBubble: inside a synctest bubble Real's Now is positive and
// advances exactly as the bubble's clock does.
func TestRealInBubble(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var c Clock = Real{}
		t0 := c.Now()
		if t0 <= 0 {
			t.Fatalf("Now in a bubble = %d, want > 0", t0)
		}
		time.Sleep(1500 * time.Millisecond)
		if got := c.Now().Sub(t0); got != 1500*time.Millisecond {
			t.Fatalf("Now advanced %v over a 1.5 s sleep, want exactly 1.5 s", got)
		}
	})
}

// TestRealOutsideBubble: outside a bubble Now is the monotonic time since
// process start, positive and not going backwards.
func TestRealOutsideBubble(t *testing.T) {
	c := Real{}
	a := c.Now()
	time.Sleep(2 * time.Millisecond)
	b := c.Now()
	if a <= 0 || b.Sub(a) < 2*time.Millisecond {
		t.Fatalf("Now: %d then %d after 2 ms", a, b)
	}
}

// TestTimers: NewTimer and AfterFunc fire after their duration on the
// bubble's clock, not before; Stop and Reset behave as time.Timer's.
func TestTimers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var c Clock = Real{}
		start := c.Now()

		tm, ch := c.NewTimer(time.Second)
		time.Sleep(999 * time.Millisecond)
		select {
		case <-ch:
			t.Fatal("timer fired before its duration")
		default:
		}
		<-ch
		if got := c.Now().Sub(start); got != time.Second {
			t.Fatalf("timer fired after %v, want 1 s", got)
		}
		if tm.Stop() {
			t.Fatal("Stop of a fired timer reported it active")
		}
		if tm.Reset(time.Second) {
			t.Fatal("Reset of a fired timer reported it active")
		}
		if !tm.Stop() {
			t.Fatal("Stop of a reset timer reported it inactive")
		}
		time.Sleep(2 * time.Second)
		select {
		case <-ch:
			t.Fatal("a stopped timer fired")
		default:
		}

		fired := make(chan Time, 1)
		at := c.Now()
		f := c.AfterFunc(3*time.Second, func() { fired <- c.Now() })
		time.Sleep(time.Second)
		f.Reset(3 * time.Second) // now due 4 s after at
		if got := (<-fired).Sub(at); got != 4*time.Second {
			t.Fatalf("AfterFunc reset ran after %v, want 4 s", got)
		}
		g := c.AfterFunc(time.Second, func() { t.Error("a stopped AfterFunc ran") })
		if !g.Stop() {
			t.Fatal("Stop of a pending AfterFunc reported it inactive")
		}
		time.Sleep(2 * time.Second)
	})
}

// TestSleep: Sleep waits its duration on the clock, or returns the
// context's error as soon as it is done.
func TestSleep(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := Real{}
		start := c.Now()
		if err := Sleep(context.Background(), c, 2*time.Second); err != nil {
			t.Fatal(err)
		}
		if got := Until(c, start); got != -2*time.Second {
			t.Fatalf("Sleep(2 s) returned after %v", -got)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		defer cancel()
		start = c.Now()
		if err := Sleep(ctx, c, time.Hour); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Sleep with a done context: %v", err)
		}
		if got := c.Now().Sub(start); got != 500*time.Millisecond {
			t.Fatalf("Sleep returned %v after its context's deadline, want at it (500 ms)", got)
		}
		if err := Sleep(context.Background(), c, 0); err != nil {
			t.Fatal(err)
		}
	})
}
