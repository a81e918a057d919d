package wire

import "testing"

func TestOffsetRoundTrip(t *testing.T) {
	for _, off := range []uint64{0, 4096, 5 << 30, 1<<64 - 1} {
		got, err := ParseOffset(AppendOffset(nil, off))
		if err != nil || got != off {
			t.Fatalf("offset %d: %d, %v", off, got, err)
		}
	}
	if _, err := ParseOffset([]byte{1, 2, 3}); CodeOf(err) != CodeBadMessage {
		t.Fatalf("short offset: %v", err)
	}
	if OpSeek.String() != "seek" || !OpSeek.Owned() || OpSeek.Changes() || CodeNXIO.String() == "" {
		t.Fatal("OpSeek: an owned read, named seek")
	}
}
