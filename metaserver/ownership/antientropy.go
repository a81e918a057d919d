package ownership

// Anti-entropy: a replica that was down or cut off catches up.

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/metaserver/paxosnode"
	"github.com/leasefs/leasefs/metaserver/replica"
)

// antiEntropyLoop compares this replica with every peer at start and then
// periodically, fetching the inodes a peer holds newer.
func (c *Owner) antiEntropyLoop() {
	defer c.wg.Done()
	every := c.cfg.AntiEntropy
	first := time.NewTimer(0)
	defer first.Stop()
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-c.stop:
			return
		case <-first.C:
		case <-t.C:
		}
		for _, p := range c.others {
			if err := c.catchUp(p); err != nil {
				c.log.Debug("anti-entropy", "peer", p, "err", err)
			}
		}
		c.stats.antiEntropy.Add(1)
	}
}

// catchUp walks p's digest pages and fetches every inode p holds at a newer
// (epoch, version) than this replica, except inodes this server owns (an
// owner is never behind: it recovered from a majority). Once a round
// (before the first peer) it finishes switches a crash interrupted and
// drops abandoned transfers' staging.
func (c *Owner) catchUp(p ids.ServerID) error {
	n := c.node.Load()
	if p == c.others[0] {
		if err := c.repl.SweepTransfers(replica.StageIdle); err != nil {
			c.log.Warn("sweeping transfers' staging", "err", err)
		}
	}
	var after ids.Ino
	for {
		select {
		case <-c.stop:
			return nil
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), c.callWait)
		req := digestReq{After: after, Max: 1024}
		rep, err := c.call(ctx, n, p, callDigest, req.Append(nil))
		cancel()
		if err != nil {
			return err
		}
		var dr digestRep
		if err := parseReply(rep, &dr); err != nil {
			return err
		}
		page := dr.Page
		local, err := c.repl.DigestRange(page.After, page.Through, false)
		if err != nil {
			return err
		}
		fetch, _, err := replica.DiffDigests(local, page)
		if err != nil {
			return err
		}
		// A few fetches at once: catching up many small inodes is bound
		// by a round trip and a sync each, not by bandwidth. Each holds
		// at most a page; all end before the next digest page.
		var wg sync.WaitGroup
		sem := make(chan struct{}, fetchWorkers)
	fetching:
		for _, ino := range fetch {
			if _, owns := n.Owns(ino); owns {
				continue
			}
			select {
			case <-c.stop:
				break fetching
			case sem <- struct{}{}:
			}
			wg.Add(1)
			go func() {
				defer func() { <-sem; wg.Done() }()
				if err := c.fetchInode(n, p, ino); err != nil {
					c.log.Debug("anti-entropy fetch", "peer", p, "ino", ino, "err", err)
					return
				}
				c.stats.caughtUp.Add(1)
			}()
		}
		wg.Wait()
		if page.Last() || page.Through <= after {
			return nil
		}
		after = page.Through
	}
}

// fetchInode copies ino's state from p, a page per call, keeping p's epoch.
func (c *Owner) fetchInode(n *paxosnode.Node, p ids.ServerID, ino ids.Ino) error {
	if f := c.cfg.BeforeFetch; f != nil {
		f(p, ino)
	}
	start := time.Now()
	got, err := replica.CopyInode(context.Background(), peerState{c, n, p}, c.repl, ino, replica.CopyOptions{PageBytes: transferPage})
	if errors.Is(err, replica.ErrStaleEpoch) {
		return nil // we moved on meanwhile
	}
	if err != nil {
		return err
	}
	c.log.Debug("fetched inode state", "ino", ino, "from", p, "state", replVersion{got.Epoch, got.Version},
		"records", got.Records, "bytes", got.Bytes, "pages", got.Pages, "took", time.Since(start))
	return nil
}
