package metaserver

// The server as the admin endpoint sees it (package admin). It reads the
// server's state under the same mutexes the server uses (s.mu for
// sessions, s.lm.mu for the lock tables, never both at once).

import (
	"cmp"
	"context"
	"fmt"
	"path/filepath"
	"runtime"
	"slices"
	"time"

	"github.com/leasefs/leasefs/internal/version"

	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/locks"
	"github.com/leasefs/leasefs/metaserver/admin"
	"github.com/leasefs/leasefs/metaserver/ownership"
	"github.com/leasefs/leasefs/transport"
	"github.com/leasefs/leasefs/wire"
)

// ServeAdmin starts an admin endpoint for the server.
func (s *Server) ServeAdmin(cfg admin.Config) (*admin.Endpoint, error) {
	if cfg.TokenFile == "" {
		cfg.TokenFile = filepath.Join(s.cfg.Dir, "admin-token")
	}
	return admin.Serve(cfg, adminView{s}, s.id, s.log)
}

// AdminView is the server's state as the admin endpoint serves it.
func (s *Server) AdminView() admin.Source { return adminView{s} }

// adminView is the server's admin.Source.
type adminView struct{ s *Server }

var _ admin.Source = adminView{}

// CutPeers switches the fault injection's partition from the other
// servers on or off.
func (v adminView) CutPeers(on bool) error {
	f := v.s.cfg.PeerFaults
	if f == nil {
		return admin.ErrNoPeerFaults
	}
	f.Cut(on)
	return nil
}

// Observe feeds m while the endpoint runs.
func (v adminView) Observe(m *admin.Metrics) func() {
	v.s.metrics.Store(m)
	return func() { v.s.metrics.CompareAndSwap(m, nil) }
}

// Status returns the server's state.
func (v adminView) Status() admin.Status {
	s := v.s
	lsm, vlog := s.store.Size()
	st := admin.Status{ServerID: s.cfg.ServerID, Version: version.Get(), Listen: s.Addr().String(), Started: s.start,
		Uptime: time.Since(s.start).Round(time.Millisecond), CPUs: runtime.GOMAXPROCS(0), ClientLease: s.cfg.ClientLease,
		ClockDrift: s.cfg.ClockDrift, Peers: []ownership.PeerStatus{}, StoreLSM: lsm, StoreVlog: vlog}
	if s.blocks != nil {
		u := s.blocks.usage(s.log)
		st.BlockStoreErrors = s.blocks.errors.Load()
		st.BlockBytes, st.Blocks, st.BlockFree = u.Bytes, u.Blocks, u.Free
	}
	if s.owner != nil {
		st.Peers = s.owner.PeerStatus()
		cs := s.owner.Stats()
		st.Cluster = &cs
	}
	s.mu.Lock()
	st.Sessions = len(s.sessions)
	s.mu.Unlock()
	s.lm.mu.Lock()
	st.Failing = len(s.lm.core.FailingClients())
	st.LockedInodes = s.lm.core.LockedInodes()
	_, st.InGrace = s.lm.core.InGrace()
	s.lm.mu.Unlock()
	return st
}

// Clients returns every client with a session or a failing timer, in
// client id order.
func (v adminView) Clients() []admin.ClientInfo {
	s := v.s
	byID := map[ids.ClientID]*admin.ClientInfo{}
	s.mu.Lock()
	sessions := make([]*session, 0, len(s.sessions))
	for _, sess := range s.sessions {
		sessions = append(sessions, sess)
	}
	s.mu.Unlock()
	for _, sess := range sessions {
		sess.mu.Lock()
		open := 0
		for _, n := range sess.openHandle {
			open += n
		}
		sess.mu.Unlock()
		byID[sess.client] = &admin.ClientInfo{Client: sess.client.String(), Session: sess.id.String(), Host: sess.host,
			Mountpoint: sess.mount, Version: sess.release, Uptime: time.Since(sess.opened).Round(time.Second),
			Addr: sess.addr, Opened: sess.opened, LastSeen: time.Unix(0, sess.lastSeen.Load()),
			State: "normal", OpenFiles: open}
	}
	s.lm.mu.Lock()
	now := s.lm.clk.Now()
	for _, c := range s.lm.core.FailingClients() {
		ci := byID[c]
		if ci == nil {
			ci = &admin.ClientInfo{Client: c.String()}
			byID[c] = ci
		}
		ci.State = "failing"
		ci.FailingLeft, _ = s.lm.core.FailingLeft(c, now)
	}
	for c, ci := range byID {
		ci.DataLocks = len(s.lm.core.HeldBy(c))
	}
	s.lm.mu.Unlock()
	keys := make([]ids.ClientID, 0, len(byID))
	for c := range byID {
		keys = append(keys, c)
	}
	slices.Sort(keys)
	out := make([]admin.ClientInfo, 0, len(keys))
	for _, c := range keys {
		out = append(out, *byID[c])
	}
	return out
}

// Locks returns every data lock, POSIX lock and queued request, in
// inode order.
func (v adminView) Locks() []admin.LockInfo {
	s := v.s
	// POSIX locks need an open file, so the open inodes cover them; the
	// POSIX table has no iterator of its own.
	s.mu.Lock()
	inos := make([]ids.Ino, 0, len(s.opens))
	for ino := range s.opens {
		inos = append(inos, ino)
	}
	s.mu.Unlock()
	out := []admin.LockInfo{}
	s.lm.mu.Lock()
	defer s.lm.mu.Unlock()
	for _, il := range s.lm.core.All() {
		inos = append(inos, il.Ino)
		for _, h := range il.Holders {
			li := admin.LockInfo{Ino: il.Ino, Kind: "data", Mode: h.Mode.String(), Client: h.Client.String()}
			if h.Revoking != h.Mode {
				li.Revoking = h.Revoking.String()
			}
			out = append(out, li)
		}
		for _, w := range il.Waiters {
			out = append(out, admin.LockInfo{Ino: il.Ino, Kind: "data", Mode: w.Mode.String(), Client: w.Client.String(), Waiting: true})
		}
	}
	slices.Sort(inos)
	for _, ino := range slices.Compact(inos) {
		for _, lk := range s.lm.core.PosixLocks(ino) {
			out = append(out, posixInfo(ino, lk, false))
		}
		for _, g := range s.lm.core.PosixWaiting(ino) {
			out = append(out, posixInfo(ino, g.Lock, true))
		}
	}
	slices.SortStableFunc(out, func(a, b admin.LockInfo) int {
		switch {
		case a.Ino < b.Ino:
			return -1
		case a.Ino > b.Ino:
			return 1
		}
		return 0
	})
	return out
}

func posixInfo(ino ids.Ino, lk locks.PosixLock, waiting bool) admin.LockInfo {
	li := admin.LockInfo{Ino: ino, Kind: "fcntl", Mode: lk.Type.String(), Client: lk.Owner.Client.String(), Waiting: waiting}
	if lk.Flock {
		li.Kind = "flock"
	} else if lk.End == locks.ToEOF {
		li.Range = fmt.Sprintf("%d-EOF", lk.Start)
	} else {
		li.Range = fmt.Sprintf("%d-%d", lk.Start, lk.End)
	}
	return li
}

// Owners returns the ownership of every inode with locks. A single
// server owns every inode itself, at epoch 0, without expiry; a cluster
// server lists the PaxosLeases it holds.
func (v adminView) Owners() []admin.OwnerInfo {
	s := v.s
	out := []admin.OwnerInfo{}
	if s.owner != nil {
		now := time.Now()
		for _, o := range s.owner.Owned() {
			out = append(out, admin.OwnerInfo{Ino: o.Ino, Owner: s.cfg.ServerID, Epoch: o.Epoch, Expiry: now.Add(o.Left),
				Held: o.Held.Round(time.Millisecond), Idle: o.Idle.Round(time.Millisecond)})
		}
		slices.SortFunc(out, func(a, b admin.OwnerInfo) int { return cmp.Compare(a.Ino, b.Ino) })
		return out
	}
	var last ids.Ino
	for _, l := range v.Locks() {
		if l.Ino != last {
			out = append(out, admin.OwnerInfo{Ino: l.Ino, Owner: s.cfg.ServerID})
			last = l.Ino
		}
	}
	return out
}

// Checksum computes the replica checksum (reads the whole store).
func (v adminView) Checksum() (admin.ChecksumInfo, error) {
	s := v.s
	start := time.Now()
	sum, err := s.repl.Checksum()
	if err != nil {
		return admin.ChecksumInfo{}, err
	}
	return admin.ChecksumInfo{Server: s.cfg.ServerID, Checksum: fmt.Sprintf("%x", sum),
		Took: time.Since(start).Round(time.Microsecond).String()}, nil
}

// Counters returns the counters.
func (v adminView) Counters() admin.Counters {
	s := v.s
	c := admin.Counters{Requests: s.counters.Requests.Load(), Errors: s.counters.Errors.Load(),
		NacksSent: s.counters.NacksSent.Load(), SessionsOpened: s.counters.SessionsOpened.Load(),
		Replayed: s.counters.Replayed.Load(), WireBytes: s.counters.Bytes.Load(),
		Compactions: s.counters.Compactions.Load(), CompactedBytes: s.counters.CompactedBytes.Load()}
	s.lm.mu.Lock()
	st, fs, de := s.lm.core.Stats(), s.lm.core.FailingStats(), s.lm.deliveryErrors
	s.lm.mu.Unlock()
	c.LocksGranted, c.LocksRevoked, c.LocksStolen = st.Granted, st.Revoked, st.Stolen
	c.ClientsFailed, c.DeliveryErrors, c.ClientsExpired = st.ClientsFailed, de, int64(fs.Expired)
	return c
}

// Evict fails client c at once, as a delivery error would: it gets NACKs
// from now on and its locks are stolen after τ(1+δ).
func (v adminView) Evict(c ids.ClientID) (admin.EvictResult, error) {
	s := v.s
	s.mu.Lock()
	_, known := s.sessions[c]
	s.mu.Unlock()
	if !known {
		return admin.EvictResult{}, fmt.Errorf("%w: %v", admin.ErrUnknownClient, c)
	}
	s.lm.fail(c, "evicted by admin")
	s.lm.mu.Lock()
	left, _ := s.lm.core.FailingLeft(c, s.lm.clk.Now())
	s.lm.mu.Unlock()
	return admin.EvictResult{Client: c.String(), StealIn: left}, nil
}

type observedKey struct{}

// observed returns a handler that times s.handle and records it, or nil when
// no admin endpoint runs or ctx is already inside it. handle() calls it first:
//
//	if h := s.observed(ctx); h != nil { return h(ctx, tr) }
func (s *Server) observed(ctx context.Context) transport.Handler {
	m := s.metrics.Load()
	if m == nil || ctx.Value(observedKey{}) != nil {
		return nil
	}
	return func(ctx context.Context, tr *transport.Request) []byte {
		// The op is read first: handle may give the body back for reuse.
		// A body that is no request counts as op 0, a reply that is none
		// as a bad message.
		op, code, in := wire.Op(0), wire.CodeBadMessage, len(tr.Body)
		if h, err := wire.ParseRequestHead(tr.Body); err == nil {
			op = h.Op
		}
		start := time.Now()
		out := s.handle(context.WithValue(ctx, observedKey{}, true), tr)
		if h, err := wire.ParseReplyHead(out); err == nil {
			code = h.Code
		}
		m.Request(op, code, time.Since(start), in, len(out))
		return out
	}
}

// observeRevocation records one revocation callback's round trip, if an
// admin endpoint is running.
func (s *Server) observeRevocation(d time.Duration, acked bool) {
	if m := s.metrics.Load(); m != nil {
		m.Revocation(d, acked)
	}
}

// Paths says where inos are, from this server's replica of the namespace.
func (v adminView) Paths(inos []ids.Ino, maxScan int) map[ids.Ino]admin.PathInfo {
	out := map[ids.Ino]admin.PathInfo{}
	for ino, p := range v.s.store.PathsOf(inos, maxScan) {
		out[ino] = admin.PathInfo{Ino: ino, Path: p.Path, Links: p.Links}
	}
	return out
}

// Inode returns the inode at path.
func (v adminView) Inode(path string) (admin.PathInfo, error) {
	a, err := v.s.store.InodeAt(path)
	if err != nil {
		return admin.PathInfo{}, err
	}
	return admin.PathInfo{Ino: a.Ino, Path: path, Links: a.Nlink}, nil
}
