// Package lockclient is the client side of the lock protocol's sequence
// numbers as a pure state machine: which grants and revocations of an
// inode a client applies, whatever order the network delivered them in
// (locks' package doc states the rules). cache.Cache keeps one Inode per
// cached inode; internal/locksim's clients do the same.
//
// # The caller's duties
//
// Before acting on a grant, ask Granted; act on it only if it is the
// newest. Before lowering a lock for a revocation, ask Revoked; answer the
// revocation, applied or not, with Ack's number. A new session numbers
// afresh: start from a zero Inode.
//
// Rules.Unsafe switches the rules off. TEST ONLY: the simulator shows with
// it that it catches the violation; production leaves it zero.
package lockclient

// Unsafe lists deliberate protocol bugs. TEST ONLY.
type Unsafe struct {
	// IgnoreSeq applies every revocation and grant whatever its sequence
	// number and acknowledges with the highest number seen.
	IgnoreSeq bool
}

// Rules are the sequence-number rules; the zero value is production's.
type Rules struct {
	Unsafe Unsafe
}

// Inode is what a client knows of one inode's numbers. The zero value
// knows nothing.
type Inode struct {
	grant        uint64 // the grant last accepted
	revokedBelow uint64 // the highest revocation seen: older grants are void
}

// Granted reports whether a grant numbered seq may be accepted (a
// revocation it was overtaken by voids it), and whether it is the newest
// grant, which says what the server believes the client holds.
func (r Rules) Granted(in *Inode, seq uint64) (accept, newest bool) {
	if r.Unsafe.IgnoreSeq {
		in.grant = seq
		return true, true
	}
	if seq < in.revokedBelow {
		return false, false
	}
	if seq < in.grant {
		return true, false
	}
	in.grant = seq
	return true, true
}

// Revoked records a revocation numbered seq and reports whether it applies
// to the lock held: it does unless a newer grant overtook it (a duplicate,
// a late copy).
func (r Rules) Revoked(in *Inode, seq uint64) bool {
	in.revokedBelow = max(in.revokedBelow, seq)
	return seq > in.grant || r.Unsafe.IgnoreSeq
}

// Ack returns the number to acknowledge a revocation numbered seq with:
// its own, which the server finds stale if a newer grant exists.
func (r Rules) Ack(in *Inode, seq uint64) uint64 {
	if r.Unsafe.IgnoreSeq {
		return max(in.grant, in.revokedBelow)
	}
	return seq
}

// Grant returns the number of the grant last accepted: a voluntary
// release carries it.
func (in *Inode) Grant() uint64 { return in.grant }
