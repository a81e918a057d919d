package paxos

import "github.com/leasefs/leasefs/internal/ids"

// Ballot layout, high to low: counter (40 bits) | boot (16 bits) | server id
// (8 bits). The id makes ballots unique among proposers, the boot counter
// (persisted by the caller) makes them unique across one proposer's restarts,
// and the counter, a Lamport clock over every ballot the node sees, started
// above Config.MinEpoch, makes them increase across restarts and overtake
// competitors.
const (
	ballotIDBits   = 8
	ballotBootBits = 16
	ballotLowBits  = ballotIDBits + ballotBootBits
	// MaxBoot is the largest boot counter a ballot can carry.
	MaxBoot = 1<<ballotBootBits - 1
	// maxCounter keeps counter<<24 inside 64 bits.
	maxCounter = 1<<(64-ballotLowBits) - 1
)

func makeBallot(counter uint64, boot uint16, id ids.ServerID) uint64 {
	if counter > maxCounter {
		// 2^40 attempts: unreachable in practice; wrapping would break
		// uniqueness, so refuse loudly.
		panic("paxos: ballot counter overflow")
	}
	return counter<<ballotLowBits | uint64(boot)<<ballotIDBits | uint64(id)
}

func ballotCounter(b uint64) uint64 { return b >> ballotLowBits }

// BallotServer returns the server that chose ballot b.
func BallotServer(b ids.Epoch) ids.ServerID { return ids.ServerID(b) }

// BallotBoot returns the boot counter of the proposer that chose ballot b.
func BallotBoot(b ids.Epoch) uint16 { return uint16(b >> ballotIDBits) }
