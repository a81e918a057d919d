package store

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
)

// A warning badger repeats is logged once; another warning still is.
func TestBadgerWarningsOnce(t *testing.T) {
	var buf bytes.Buffer
	l := newBadgerLogger(slog.New(slog.NewTextHandler(&buf, nil)))
	for i := range 5 {
		l.Warningf("Block cache might be too small. Metrics: hit: %d miss: %d\n", i, 100+i)
	}
	l.Warningf("something else %d", 1)
	if n := strings.Count(buf.String(), "Block cache might be too small"); n != 1 {
		t.Errorf("the repeated warning logged %d times:\n%s", n, buf.String())
	}
	if !strings.Contains(buf.String(), "something else 1") {
		t.Errorf("another warning dropped:\n%s", buf.String())
	}
}
