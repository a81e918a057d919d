package locks

import (
	"fmt"
	"slices"

	"github.com/leasefs/leasefs/internal/clock"
	"github.com/leasefs/leasefs/internal/ids"
)

// Mode is a data lock mode. The values equal wire.LockMode's so that shells
// convert with a plain cast.
type Mode uint8

const (
	None      Mode = iota // no lock
	Shared                // S: may cache reads, attributes, directory entries
	Exclusive             // X: may also buffer writes and change the size
)

func (m Mode) String() string {
	switch m {
	case None:
		return "none"
	case Shared:
		return "S"
	case Exclusive:
		return "X"
	}
	return fmt.Sprintf("mode(%d)", uint8(m))
}

// compatible reports whether a and b may be held by two clients at once.
func compatible(a, b Mode) bool { return a != Exclusive && b != Exclusive }

// Grant tells Client it now holds Mode on Ino.
type Grant struct {
	Client ids.ClientID
	Ino    ids.Ino
	Mode   Mode
	Seq    uint64
}

// Revoke asks Client to give its lock on Ino down to To (Shared: downgrade
// X to S; None: release). The client flushes, drops what To does not cover,
// then calls back with Release(To, Seq).
type Revoke struct {
	Client ids.ClientID
	Ino    ids.Ino
	To     Mode
	Seq    uint64
}

// Outcome is what the caller must send after a call: grants to waiting
// clients (the requester's own immediate grant included) and revocations.
type Outcome struct {
	Grants  []Grant
	Revokes []Revoke
	// Queued reports that Request's own request waits.
	Queued bool
}

func (o *Outcome) merge(p Outcome) {
	o.Grants = append(o.Grants, p.Grants...)
	o.Revokes = append(o.Revokes, p.Revokes...)
}

// Holder is one client's lock on an inode.
type Holder struct {
	Client ids.ClientID
	Mode   Mode
	Seq    uint64 // sequence number of the grant
	// Revoking is the mode this holder was last asked to go down to, or
	// the held mode if no revocation is outstanding.
	Revoking Mode
}

// Waiter is a queued request.
type Waiter struct {
	Client ids.ClientID
	Mode   Mode
}

// InodeLocks is one inode's state in a snapshot.
type InodeLocks struct {
	Ino     ids.Ino
	Holders []Holder
	Waiters []Waiter
}

// Held is one lock of a client, for HeldBy.
type Held struct {
	Ino  ids.Ino
	Mode Mode
	Seq  uint64
}

// DataConfig bounds a DataTable.
type DataConfig struct {
	// MaxWaiters is the most queued requests per inode; more are refused
	// with ErrTooManyWaiters (the client retries).
	MaxWaiters int
	// GraceExempt, if set, names the clients an inode's grace
	// (SetInodeGrace) does not hold back: the server's own pseudo clients,
	// which are not clients whose locks the grace protects.
	GraceExempt func(ids.ClientID) bool
}

// DefaultDataConfig returns a DataConfig with 1024 waiters per inode.
func DefaultDataConfig() DataConfig { return DataConfig{MaxWaiters: 1024} }

type holder struct {
	mode, revoking Mode
	seq            uint64
}

type inode struct {
	holders map[ids.ClientID]*holder
	queue   []Waiter
}

// DataTable is the server's table of data locks. Not safe for concurrent use.
//
// Requests are served first come, first served: a request is granted at once
// only if no one waits before it, so a stream of S requests cannot starve an
// X request. When the head of the queue conflicts with holders, they are
// asked to give their locks down far enough (X→S for an S waiter, to none for
// an X waiter); when they do, waiters are granted in order.
type DataTable struct {
	cfg        DataConfig
	inodes     map[ids.Ino]*inode
	byClient   map[ids.ClientID]map[ids.Ino]struct{} // holding or waiting
	grace      bool
	graceUntil clock.Time
	inoGrace   map[ids.Ino]clock.Time // SetInodeGrace
	seq        uint64
}

// NewDataTable returns an empty table. It panics if cfg.MaxWaiters < 1.
func NewDataTable(cfg DataConfig) *DataTable {
	if cfg.MaxWaiters < 1 {
		panic("locks: NewDataTable: MaxWaiters must be at least 1")
	}
	return &DataTable{cfg: cfg, inodes: map[ids.Ino]*inode{}, byClient: map[ids.ClientID]map[ids.Ino]struct{}{},
		inoGrace: map[ids.Ino]clock.Time{}}
}

func (t *DataTable) get(ino ids.Ino) *inode {
	in := t.inodes[ino]
	if in == nil {
		in = &inode{holders: map[ids.ClientID]*holder{}}
		t.inodes[ino] = in
	}
	return in
}

func (t *DataTable) index(c ids.ClientID, ino ids.Ino) {
	m := t.byClient[c]
	if m == nil {
		m = map[ids.Ino]struct{}{}
		t.byClient[c] = m
	}
	m[ino] = struct{}{}
}

// tidy drops empty records so the table's size follows what is held.
func (t *DataTable) tidy(c ids.ClientID, ino ids.Ino) {
	in := t.inodes[ino]
	if in == nil {
		return
	}
	if _, ok := in.holders[c]; !ok && !slices.ContainsFunc(in.queue, func(w Waiter) bool { return w.Client == c }) {
		if m := t.byClient[c]; m != nil {
			delete(m, ino)
			if len(m) == 0 {
				delete(t.byClient, c)
			}
		}
	}
	if len(in.holders) == 0 && len(in.queue) == 0 {
		delete(t.inodes, ino)
	}
}

// next returns a new sequence number. One counter serves the whole table, so
// an inode's numbers keep increasing even after its idle record is dropped
// (a late revoke must never match a newer grant).
func (t *DataTable) next() uint64 {
	t.seq++
	return t.seq
}

// Request asks for mode on ino for client c. Re-requesting a mode already held
// (or a weaker one) is granted again at once with the existing sequence number.
// Holding S and asking X is an upgrade. During grace every request waits.
func (t *DataTable) Request(c ids.ClientID, ino ids.Ino, mode Mode) (Outcome, error) {
	if mode != Shared && mode != Exclusive {
		return Outcome{}, fmt.Errorf("%w: request %v", ErrBadMode, mode)
	}
	in := t.get(ino)
	if h := in.holders[c]; h != nil && h.mode >= mode {
		return Outcome{Grants: []Grant{{Client: c, Ino: ino, Mode: h.mode, Seq: h.seq}}}, nil
	}
	if i := slices.IndexFunc(in.queue, func(w Waiter) bool { return w.Client == c }); i >= 0 {
		// Already waiting: a retransmission, or a stronger mode wanted.
		if mode > in.queue[i].Mode {
			in.queue[i].Mode = mode
		}
		out := Outcome{Queued: true}
		if i == 0 && !t.grace {
			out.merge(t.advance(ino, in))
		}
		return out, nil
	}
	if len(in.queue) >= t.cfg.MaxWaiters {
		t.tidy(c, ino)
		return Outcome{}, fmt.Errorf("%w: %v has %d", ErrTooManyWaiters, ino, len(in.queue))
	}
	in.queue = append(in.queue, Waiter{Client: c, Mode: mode})
	t.index(c, ino)
	if t.grace {
		return Outcome{Queued: true}, nil
	}
	out := t.advance(ino, in)
	out.Queued = !slices.ContainsFunc(out.Grants, func(g Grant) bool { return g.Client == c })
	return out, nil
}

// held reports whether an inode's grace holds c's request on ino back.
func (t *DataTable) held(ino ids.Ino, c ids.ClientID) bool {
	if _, ok := t.inoGrace[ino]; !ok {
		return false
	}
	return t.cfg.GraceExempt == nil || !t.cfg.GraceExempt(c)
}

// advance grants waiters from the head of the queue while they fit, then asks
// the holders that block the new head to give their locks down. A head that
// the inode's grace holds back waits, and asks nobody.
func (t *DataTable) advance(ino ids.Ino, in *inode) Outcome {
	var out Outcome
	for len(in.queue) > 0 {
		w := in.queue[0]
		if t.held(ino, w.Client) || !t.fits(in, w) {
			break
		}
		in.queue = in.queue[1:]
		seq := t.next()
		h := in.holders[w.Client]
		if h == nil {
			h = &holder{}
			in.holders[w.Client] = h
		}
		if w.Mode > h.mode {
			h.mode = w.Mode
		}
		h.revoking, h.seq = h.mode, seq
		out.Grants = append(out.Grants, Grant{Client: w.Client, Ino: ino, Mode: h.mode, Seq: seq})
	}
	if len(in.queue) == 0 {
		in.queue = nil
		return out
	}
	w := in.queue[0]
	if t.held(ino, w.Client) {
		return out
	}
	to := None
	if w.Mode == Shared {
		to = Shared
	}
	for _, c := range sortedClients(in.holders) {
		h := in.holders[c]
		if c == w.Client || compatible(h.mode, w.Mode) || h.revoking <= to {
			continue
		}
		h.revoking = to
		out.Revokes = append(out.Revokes, Revoke{Client: c, Ino: ino, To: to, Seq: t.next()})
	}
	return out
}

func (t *DataTable) fits(in *inode, w Waiter) bool {
	for c, h := range in.holders {
		if c != w.Client && !compatible(h.mode, w.Mode) {
			return false
		}
	}
	return true
}

func sortedClients(m map[ids.ClientID]*holder) []ids.ClientID {
	out := make([]ids.ClientID, 0, len(m))
	for c := range m {
		out = append(out, c)
	}
	slices.Sort(out)
	return out
}

// Release gives c's lock on ino down to `to` (None releases, Shared
// downgrades X). seq is the highest grant or revoke sequence number the client
// has seen for ino: a release older than the holder's current grant (a
// duplicated or reordered message from before a re-grant) is refused with
// ErrStale and changes nothing. Returns the waiters now granted and any new
// revocations.
func (t *DataTable) Release(c ids.ClientID, ino ids.Ino, to Mode, seq uint64) (Outcome, error) {
	if to > Exclusive {
		return Outcome{}, fmt.Errorf("%w: release to %v", ErrBadMode, to)
	}
	in := t.inodes[ino]
	if in == nil || in.holders[c] == nil {
		return Outcome{}, fmt.Errorf("%w: %v on %v", ErrNotHeld, c, ino)
	}
	h := in.holders[c]
	if seq < h.seq {
		return Outcome{}, fmt.Errorf("%w: release seq %d < grant seq %d", ErrStale, seq, h.seq)
	}
	if to >= h.mode {
		return Outcome{}, nil // nothing to give up
	}
	if to == None {
		delete(in.holders, c)
	} else {
		h.mode = to
		h.revoking = min(h.revoking, to)
	}
	var out Outcome
	if !t.grace {
		out = t.advance(ino, in)
	}
	t.tidy(c, ino)
	return out, nil
}

// Cancel withdraws c's queued request on ino (the client gave up or was
// interrupted). A lock c already holds is kept.
func (t *DataTable) Cancel(c ids.ClientID, ino ids.Ino) (Outcome, error) {
	in := t.inodes[ino]
	if in == nil {
		return Outcome{}, fmt.Errorf("%w: %v on %v", ErrNotWaiting, c, ino)
	}
	i := slices.IndexFunc(in.queue, func(w Waiter) bool { return w.Client == c })
	if i < 0 {
		return Outcome{}, fmt.Errorf("%w: %v on %v", ErrNotWaiting, c, ino)
	}
	in.queue = slices.Delete(in.queue, i, i+1)
	var out Outcome
	if i == 0 && !t.grace {
		out = t.advance(ino, in)
	}
	t.tidy(c, ino)
	return out, nil
}

// Steal removes every lock and queued request of client c at once (the client
// timed out, lease.FailingSet.Expired). Returns the grants that became
// possible and new revocations, in inode order.
func (t *DataTable) Steal(c ids.ClientID) Outcome {
	m := t.byClient[c]
	inos := make([]ids.Ino, 0, len(m))
	for ino := range m {
		inos = append(inos, ino)
	}
	slices.Sort(inos)
	var out Outcome
	for _, ino := range inos {
		in := t.inodes[ino]
		if in == nil {
			continue
		}
		delete(in.holders, c)
		in.queue = slices.DeleteFunc(in.queue, func(w Waiter) bool { return w.Client == c })
		if !t.grace {
			out.merge(t.advance(ino, in))
		}
		t.tidy(c, ino)
	}
	delete(t.byClient, c)
	return out
}

// SetGrace starts a grace period until the given time (a restarted server, or
// a new owner that took an inode over without a clean release): only Reclaim
// grants; Request queues until Tick reaches until.
func (t *DataTable) SetGrace(until clock.Time) {
	t.grace, t.graceUntil = true, until
}

// InGrace reports whether the grace period runs, and until when.
func (t *DataTable) InGrace() (clock.Time, bool) { return t.graceUntil, t.grace }

// SetInodeGrace grants no lock on ino before until but to GraceExempt
// clients (a new owner that took the inode over without a clean hand-over:
// the previous owner's clients may still trust their locks); requests queue
// until Tick reaches until. A later end than one set already wins.
func (t *DataTable) SetInodeGrace(ino ids.Ino, until clock.Time) {
	if old, ok := t.inoGrace[ino]; !ok || until.After(old) {
		t.inoGrace[ino] = until
	}
}

// InodeGrace reports whether ino's grace runs, and until when.
func (t *DataTable) InodeGrace(ino ids.Ino) (clock.Time, bool) {
	until, ok := t.inoGrace[ino]
	return until, ok
}

// EndInodeGrace ends ino's grace at once (the inode left this server) and
// serves the requests that queued during it.
func (t *DataTable) EndInodeGrace(ino ids.Ino) Outcome {
	if _, ok := t.inoGrace[ino]; !ok {
		return Outcome{}
	}
	delete(t.inoGrace, ino)
	if in := t.inodes[ino]; in != nil && !t.grace {
		return t.advance(ino, in)
	}
	return Outcome{}
}

// NextDeadline returns the time Tick must be called at, if any.
func (t *DataTable) NextDeadline() (clock.Time, bool) {
	next, ok := t.graceUntil, t.grace
	for _, until := range t.inoGrace {
		if !ok || until.Before(next) {
			next, ok = until, true
		}
	}
	return next, ok
}

// Tick ends the grace period and the inodes' graces once now reaches their
// ends and serves the requests that queued during them, in inode order.
func (t *DataTable) Tick(now clock.Time) Outcome {
	var out Outcome
	var ended []ids.Ino
	for ino, until := range t.inoGrace {
		if !now.Before(until) {
			ended = append(ended, ino)
		}
	}
	slices.Sort(ended)
	for _, ino := range ended {
		out.merge(t.EndInodeGrace(ino))
	}
	if !t.grace || now.Before(t.graceUntil) {
		return out
	}
	t.grace = false
	inos := make([]ids.Ino, 0, len(t.inodes))
	for ino := range t.inodes {
		inos = append(inos, ino)
	}
	slices.Sort(inos)
	for _, ino := range inos {
		out.merge(t.advance(ino, t.inodes[ino]))
	}
	return out
}

// Reclaim grants c the lock it held before the server restarted, during the
// grace period only (ErrNoGrace otherwise) and only if it conflicts with no
// lock already reclaimed by another client (ErrConflict). The client must
// only reclaim what it trusted under a still-valid lease.
func (t *DataTable) Reclaim(c ids.ClientID, ino ids.Ino, mode Mode) (Grant, error) {
	if mode != Shared && mode != Exclusive {
		return Grant{}, fmt.Errorf("%w: reclaim %v", ErrBadMode, mode)
	}
	if !t.grace {
		return Grant{}, ErrNoGrace
	}
	in := t.get(ino)
	if h := in.holders[c]; h != nil && h.mode >= mode {
		return Grant{Client: c, Ino: ino, Mode: h.mode, Seq: h.seq}, nil
	}
	if !t.fits(in, Waiter{Client: c, Mode: mode}) {
		if len(in.holders) == 0 && len(in.queue) == 0 {
			delete(t.inodes, ino)
		}
		return Grant{}, fmt.Errorf("%w: reclaim %v on %v", ErrConflict, mode, ino)
	}
	seq := t.next()
	h := in.holders[c]
	if h == nil {
		h = &holder{}
		in.holders[c] = h
	}
	h.mode, h.revoking, h.seq = mode, mode, seq
	t.index(c, ino)
	return Grant{Client: c, Ino: ino, Mode: mode, Seq: seq}, nil
}

// Mode returns the mode c holds on ino (None if it holds none).
func (t *DataTable) Mode(c ids.ClientID, ino ids.Ino) Mode {
	if in := t.inodes[ino]; in != nil {
		if h := in.holders[c]; h != nil {
			return h.mode
		}
	}
	return None
}

// Holders returns ino's holders in client order.
func (t *DataTable) Holders(ino ids.Ino) []Holder {
	in := t.inodes[ino]
	if in == nil {
		return nil
	}
	out := make([]Holder, 0, len(in.holders))
	for _, c := range sortedClients(in.holders) {
		h := in.holders[c]
		out = append(out, Holder{Client: c, Mode: h.mode, Seq: h.seq, Revoking: h.revoking})
	}
	return out
}

// Waiters returns ino's queue, head first.
func (t *DataTable) Waiters(ino ids.Ino) []Waiter {
	in := t.inodes[ino]
	if in == nil {
		return nil
	}
	return slices.Clone(in.queue)
}

// All returns a snapshot of every inode with holders or waiters, in inode
// order.
func (t *DataTable) All() []InodeLocks {
	inos := make([]ids.Ino, 0, len(t.inodes))
	for ino := range t.inodes {
		inos = append(inos, ino)
	}
	slices.Sort(inos)
	out := make([]InodeLocks, 0, len(inos))
	for _, ino := range inos {
		out = append(out, InodeLocks{Ino: ino, Holders: t.Holders(ino), Waiters: t.Waiters(ino)})
	}
	return out
}

// Inodes returns how many inodes All would return, without the snapshot.
func (t *DataTable) Inodes() int { return len(t.inodes) }

// HeldBy returns the locks client c holds, in inode order.
func (t *DataTable) HeldBy(c ids.ClientID) []Held {
	var out []Held
	for ino := range t.byClient[c] {
		if in := t.inodes[ino]; in != nil && in.holders[c] != nil {
			h := in.holders[c]
			out = append(out, Held{Ino: ino, Mode: h.mode, Seq: h.seq})
		}
	}
	slices.SortFunc(out, func(a, b Held) int {
		if a.Ino < b.Ino {
			return -1
		}
		if a.Ino > b.Ino {
			return 1
		}
		return 0
	})
	return out
}
