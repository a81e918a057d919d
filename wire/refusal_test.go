package wire

import (
	"errors"
	"strings"
	"testing"
)

func TestRefusal(t *testing.T) {
	b := Refusal("server runs leasefs v9")
	if BodyVersion(b) != refusalVersion {
		t.Fatalf("version byte %d", BodyVersion(b))
	}
	for _, parse := range []func([]byte) error{
		func(b []byte) error { _, err := ParseReply(b); return err },
		func(b []byte) error { _, err := ParseReplyHead(b); return err },
	} {
		if err := parse(b); !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "server runs leasefs v9") {
			t.Errorf("parsed refusal: %v", err)
		}
	}
	if len(Refusal(strings.Repeat("x", 5000))) != 1+maxRefusal {
		t.Error("a refusal is not bounded")
	}
	if BodyVersion(ErrorReply(Errf(CodeIO, "x")).Append(nil)) != Version {
		t.Error("a reply's first byte is not its version")
	}
}
