// Package ids defines the typed identifiers shared by client and server.
package ids

import (
	"fmt"
	"strconv"
	"strings"
)

// Ino is an inode number. The top byte is the id of the server that allocated
// it, the rest a counter persisted by that server, so servers allocate inode
// numbers without coordination.
type Ino uint64

// RootIno is the root directory's inode number.
const RootIno Ino = 1

func (i Ino) String() string { return fmt.Sprintf("ino:%d", uint64(i)) }

// MakeIno builds an inode number from a server id and that server's counter.
func MakeIno(server ServerID, counter uint64) Ino {
	return Ino(uint64(server)<<56 | counter&(1<<56-1))
}

// ServerID identifies a server of the cluster (1..255).
type ServerID uint8

func (s ServerID) String() string { return fmt.Sprintf("server:%d", uint8(s)) }

// ClientID identifies a client (one mount process): the hash of the key it
// proves on every connection (transport.ClientKey), so no other can claim it.
type ClientID uint64

func (c ClientID) String() string { return fmt.Sprintf("client:%016x", uint64(c)) }

// SessionID identifies one session of a client with a server. A client opens a
// new session after a NACK.
type SessionID uint64

func (s SessionID) String() string { return fmt.Sprintf("session:%d", uint64(s)) }

// MarshalText makes a session id a string in JSON ("session:N"): 64-bit
// numbers lose precision in JavaScript and jq.
func (s SessionID) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// UnmarshalText reads what MarshalText wrote.
func (s *SessionID) UnmarshalText(b []byte) error {
	n, err := strconv.ParseUint(strings.TrimPrefix(string(b), "session:"), 10, 64)
	if err != nil {
		return fmt.Errorf("ids: session id %q", b)
	}
	*s = SessionID(n)
	return nil
}

// Epoch is an inode's ownership epoch: the PaxosLease ballot that made the
// current owner. Replicas reject records from older epochs.
type Epoch uint64

func (e Epoch) String() string { return fmt.Sprintf("epoch:%d", uint64(e)) }
