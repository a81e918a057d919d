package ownership

// Client locks and ownership: inodes with locks stay owned; a lost one
// fails its clients.

import (
	"fmt"
	"time"

	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/metaserver/paxosnode"
)

// onLost: ownership ended without a release. Clients holding locks on the
// inode are failed (DESIGN.md: never ACK them again), since another server
// may own it soon.
func (c *Owner) onLost(l paxosnode.Loss) {
	c.mu.Lock()
	delete(c.recovered, l.Ino)
	delete(c.unsure, l.Ino)
	c.mu.Unlock()
	c.locks.EndGrace(l.Ino)
	failed := 0
	for _, h := range c.locks.Holders(l.Ino) {
		if _, peer := paxosnode.PeerOf(h); peer {
			continue
		}
		c.locks.Fail(h, fmt.Sprintf("ownership of %v lost", l.Ino))
		failed++
	}
	if failed > 0 {
		c.stats.lostWithLocks.Add(1)
		c.log.Warn("ownership lost while clients held locks; failing them", "ino", l.Ino, "epoch", l.Epoch,
			"idle", l.Idle, "clients", failed)
	}
}

// pinLoop keeps every inode with client locks pinned, so that it is never
// released for idleness while clients trust their locks.
func (c *Owner) pinLoop() {
	defer c.wg.Done()
	t := time.NewTicker(max(c.lease/8, 10*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-c.stop:
			return
		case <-t.C:
		}
		n := c.node.Load()
		all := c.locks.Held()
		held := make(map[ids.Ino]bool, len(all))
		for ino, holders := range all {
			for _, h := range holders {
				if _, peer := paxosnode.PeerOf(h); !peer {
					held[ino] = true
				}
			}
		}
		c.mu.Lock()
		var pin, unpin []ids.Ino
		for ino := range held {
			if !c.pinned[ino] {
				c.pinned[ino] = true
				pin = append(pin, ino)
			}
		}
		for ino := range c.pinned {
			if !held[ino] {
				delete(c.pinned, ino)
				unpin = append(unpin, ino)
			}
		}
		c.mu.Unlock()
		for _, ino := range pin {
			n.Pin(ino)
		}
		for _, ino := range unpin {
			n.Unpin(ino)
		}
	}
}
