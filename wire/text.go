package wire

import "fmt"

// MarshalText names the mode in JSON: "none", "shared", "exclusive".
func (m LockMode) MarshalText() ([]byte, error) {
	if int(m) >= len(lockModeWords) {
		return nil, fmt.Errorf("wire: lock mode %d", m)
	}
	return []byte(lockModeWords[m]), nil
}

// UnmarshalText reads what MarshalText wrote.
func (m *LockMode) UnmarshalText(b []byte) error {
	for i, w := range lockModeWords {
		if string(b) == w {
			*m = LockMode(i)
			return nil
		}
	}
	return fmt.Errorf("wire: lock mode %q", b)
}

var lockModeWords = [...]string{LockNone: "none", LockShared: "shared", LockExclusive: "exclusive"}
