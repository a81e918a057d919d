package metaserver

import (
	"context"

	"github.com/leasefs/leasefs/internal/clock"
	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/locks"
	"github.com/leasefs/leasefs/metaserver/ownership"
)

// ownerLocks is the lock manager as package ownership sees it.
type ownerLocks struct{ m *lockMgr }

var _ ownership.Locks = ownerLocks{}

func (l ownerLocks) Holders(ino ids.Ino) []ids.ClientID {
	l.m.mu.Lock()
	hs := l.m.core.Holders(ino)
	l.m.mu.Unlock()
	out := make([]ids.ClientID, len(hs))
	for i, h := range hs {
		out[i] = h.Client
	}
	return out
}

func (l ownerLocks) Held() map[ids.Ino][]ids.ClientID {
	l.m.mu.Lock()
	all := l.m.core.All()
	l.m.mu.Unlock()
	out := make(map[ids.Ino][]ids.ClientID, len(all))
	for _, il := range all {
		for _, h := range il.Holders {
			out[il.Ino] = append(out[il.Ino], h.Client)
		}
	}
	return out
}

func (l ownerLocks) Fail(c ids.ClientID, why string) { l.m.fail(c, why) }

// Exclude takes X for c (a peer's pseudo client during a hand-over): the
// same revocation path as a conflicting client request.
func (l ownerLocks) Exclude(ctx context.Context, c ids.ClientID, ino ids.Ino) (func(), error) {
	h, err := l.m.acquire(ctx, c, ino, locks.Exclusive)
	if err != nil {
		return nil, err
	}
	return func() {
		l.m.done(h)
		l.m.release(c, ino, locks.None, h.grant.Seq)
	}, nil
}

func (l ownerLocks) Grace(ino ids.Ino, until clock.Time) {
	l.m.mu.Lock()
	l.m.core.InodeGrace(ino, until)
	l.m.unlock()
}

func (l ownerLocks) GraceUntil(ino ids.Ino) (clock.Time, bool) {
	l.m.mu.Lock()
	defer l.m.mu.Unlock()
	return l.m.core.InodeGraceUntil(ino)
}

func (l ownerLocks) EndGrace(ino ids.Ino) {
	l.m.mu.Lock()
	l.m.core.EndInodeGrace(l.m.clk.Now(), ino)
	l.m.unlock()
}
