package ownership

// The grace after an unclean takeover (DESIGN.md): a new owner grants no
// client lock on an inode for τ(1+δ) after acquiring it, because the
// previous owner's clients may still trust their locks. Often they cannot:
// the previous owner released the inode for idleness, or it restarted
// long ago, or it is alive and its lock table holds nothing for the inode.
// Asking it costs one round trip instead of τ(1+δ) per inode, which after
// a failover is the difference between `ls -l` of a big directory taking
// a moment or minutes.

import (
	"context"
	"time"

	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/lease/paxos"
	"github.com/leasefs/leasefs/metaserver/paxosnode"
)

// callLockFree asks a previous owner: ino, its epoch → status, 1 if none
// of its clients can trust a lock on ino from that epoch.
const callLockFree byte = 16

// lockFreeWait bounds the question: a previous owner that does not answer
// at once is treated as unknown (full grace).
const lockFreeWait = 200 * time.Millisecond

// previousOwnerReleased asks the server that owned ino at epoch prev
// whether its clients may still trust locks on it.
func (c *Owner) previousOwnerReleased(ctx context.Context, n *paxosnode.Node, ino ids.Ino, prev ids.Epoch) bool {
	owner := paxos.BallotServer(prev)
	if prev == 0 {
		return false
	}
	if owner == c.self {
		// this server in an earlier run (the same run's ownership needs
		// no grace at all, see recover): its clients' leases ran out
		// τ(1+δ) after it died
		return c.restartedSince(n, prev)
	}
	ctx, cancel := context.WithTimeout(ctx, lockFreeWait)
	defer cancel()
	req := lockFreeReq{Ino: ino, Epoch: prev}
	rep, err := c.call(ctx, n, owner, callLockFree, req.Append(nil))
	if err != nil {
		return false
	}
	var free doneRep
	return parseReply(rep, &free) == nil && free.Done
}

// handleLockFree answers previousOwnerReleased: yes if this server
// restarted since epoch and more than τ(1+δ) ago (every lease it gave
// clients before has run out), or if it is the same run, does not own
// ino and holds no client lock on it (released, revoked or stolen).
func (c *Owner) handleLockFree(_ context.Context, _ ids.ServerID, body []byte) []byte {
	var req lockFreeReq
	if err := req.Parse(body); err != nil {
		return statusReply(err)
	}
	ino, epoch := req.Ino, req.Epoch
	n := c.node.Load()
	free := false
	if paxos.BallotBoot(epoch) != n.Boot() {
		free = c.restartedSince(n, epoch)
	} else if _, owns := n.Owns(ino); !owns {
		free = len(c.locks.Holders(ino)) == 0
	}
	return okReply(&doneRep{Done: free})
}

// restartedSince reports whether this server restarted after it owned an
// inode at epoch, more than τ(1+δ) ago: every lease its clients had from
// the earlier run has run out.
func (c *Owner) restartedSince(n *paxosnode.Node, epoch ids.Epoch) bool {
	return paxos.BallotBoot(epoch) != n.Boot() && c.clk.Now().Sub(c.started) > c.graceTime
}
