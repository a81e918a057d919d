// Package replica is the replication layer over a server's store
// (package store): records replicated per inode and fenced by the inode's
// ownership epoch, whole-inode state transfers, digests for anti-entropy
// and a checksum of everything replicated (DESIGN.md, "Servers, ownership
// and replication"). The cluster owner logic (package ownership) drives it
// and carries what it produces to the other servers.
//
// Every inode's replication state is its 'E' record: the epoch (PaxosLease
// ballot) of the owner that last changed it and its version, the number of
// changes made to it, monotonic across owners. A change to one inode made by
// the owner of epoch e is stamped (e, v); a replica applies it only on top of
// the state it was made from, (e, v-1), or on an inode it has never seen
// changed (version 0, which is empty). So within one epoch (epoch, version)
// names one state of the inode, and a replica never holds a state that no
// owner made.
//
// # Caller's duties
//
// The owner's store is opened with store.Options.Stamp set to Stamp(epochOf):
// each operation is then fenced and stamped in its own transaction, and
// OnCommit's writes, split with SplitByInode, are the Changes to send.
// Sync the owner's store before counting it in the majority. Replicas call
// Apply (synced). A replica that answers ErrVersionGap needs the inode's
// state: copy it over with CopyInode, a page at a time, whatever its size.
//
// A new owner of epoch e first reads State from a majority, takes the
// newest, and makes a majority (itself included) hold it stamped e
// (Restamp where a replica holds it already, CopyInode with Epoch e
// elsewhere) before it serves a change to the inode.
//
// # Safety
//
// Every path that writes replicated records goes through admit: a stored
// epoch newer than the offered one rejects the whole batch with a
// *StaleEpochError, so a deposed owner cannot overwrite anything whatever the
// clocks do. 'S' (the server's inode counter) is never replicated.
//
// # Transfers
//
// Whole-inode states move in pages, for inodes of any size: a new owner
// recovers an inode's state from a majority, lagging replicas are brought
// up to date. An inode's state can be far bigger than one peer call
// (transport.MaxBody) or one badger transaction (15% of the memtable), so
// it moves a page at a time: the source reads pages (ReadStatePage), the
// receiver stages them (StagePage), and CopyInode drives the two, over the
// network or not.
//
// # One state per transfer
//
// Each page is read in its own read transaction, together with the inode's
// (epoch, version) read in that same transaction; CopyInode starts over if a
// page comes at another state than the first. Every change to an inode's
// records stamps its 'E' record in the same transaction (owner, replica,
// transfer, restamp), and within an epoch a version names one state, so pages
// read at one (epoch, version) are pages of one state. We do not hold one
// badger read transaction across the pages instead: a transfer spans many
// peer calls, the source would have to keep per-transfer state, and badger's
// value log GC may delete the files an old read snapshot still points into.
// The cost: an inode that changes faster than it can be copied is not copied
// until it calms down (CopyInode gives up after a few attempts; the callers
// try again later, and replication meanwhile counts on the other replicas).
//
// # The old state stays claimable until the switch
//
// Incoming records go to a staging key space, apart from the inode's
// records, which keep the state the replica claims in its 'E' record. The
// replica must not stop claiming that state during a transfer: it may be
// the one of a majority that holds the newest acknowledged change, and if
// the source died meanwhile, wiping it first would lose that change. Once
// every page is staged (and synced), one transaction (the switch) stamps
// 'E' with the new state, flagged as switching; from then on the replica
// holds the new state, in its records and staging together, and the switch
// is rolled forward (records not in the new state deleted, staged records
// copied over) in bounded transactions that can be redone after a crash at
// any point; a last transaction clears the flag and the staging header.
// While the flag is set the replica refuses changes (a version gap) and
// restamps; every path that reads or stamps the inode's records for
// replication (page reads, transfers, restamps) finishes the
// switch first (settle), and SweepTransfers, which a cluster server runs
// at start, finishes every switch a crash interrupted. (A server reads an
// inode's records for clients only once it recovered it, which settles
// it.) Abandoned staging (a sender that died, a crash before the
// switch) is garbage: the next transfer of the inode, or SweepTransfers,
// removes it, and meanwhile it is invisible.
//
// A state that fits in one page (most inodes) skips all this: it replaces
// the replica's records and stamps 'E' in one transaction, as a change
// does.
//
// # Safety of transfers
//
// Fencing holds at both ends: a transfer is refused with a *StaleEpochError
// when it begins and when it switches if the replica has seen a newer epoch
// than the one it installs. A replica never claims a state it does not hold:
// 'E' changes only in a transaction that holds the whole state, the
// one-page install's, or the switch's once the staged state is complete
// and durable.
//
// # Staging key layout
//
//	'T' ino                     staging header: the transfer under way (stageHeader)
//	'T' ino id(8) kind suffix   a staged record of transfer id: the record kind|ino|suffix
package replica
