// Package blockmap is one file's map from ranges of the file to ranges of
// its immutable blocks (package blocks): what the metadata server keeps
// per file, under the inode's ownership, and what a mount caches under its
// data lock. It is pure: no I/O, no clock, no goroutines.
//
// # Model
//
// A file's data is a sorted list of extents. An Extent is a range of the
// file, [Off, Off+Len), backed by the range of one block that starts at
// BlockOff; the block's id is the file's inode and the extent's Block (the
// id's random part). A Block record holds the block's size and checksums,
// once per block however many extents point into it. A range no extent
// covers is a hole: it reads as zeros and has no block. There is no grid
// of fixed-size chunks: an extent is as long as the write that made it,
// up to one block.
//
// A write uploads new blocks first, then Apply overlays their extents:
// the extents already there lose what the write covers (split, trimmed
// or removed). Truncate, PunchHole and ZeroRange cut ranges out the same
// way. Lookup turns a read into pieces, holes and block ranges with the
// chunk-aligned range to fetch; SeekData and SeekHole answer lseek.
// Compact plans the rewrite of a fragmented run of extents into one block.
//
// # Invariants
//
//   - Extents are sorted by Off and do not overlap; none is empty; each
//     lies inside its block and ends at or before MaxSize.
//   - A block's reference count is the number of extents that point into
//     it, and every block the map holds has one at least: when the last
//     extent into a block goes, the block leaves the map, in Change.Freed.
//   - The map does not know the file's size: its extents lie inside it
//     because the caller truncates the map when it shrinks the file, and
//     everything past the last extent is a hole.
//
// # What the caller persists
//
// Every operation returns a Change, keyed as the store keys extents (by
// the file offset where each starts): it deletes Removed, writes Added and
// Changed, writes NewBlocks and deletes Freed, in the transaction that
// commits the operation (fenced as every change to the inode is). Freed
// blocks go to the collector, which deletes them from the block store once
// no reader can still fetch them. Reference counts are not persisted:
// Load counts them again from the records, and checks every invariant.
// Records are AppendExtent/ParseExtent (ExtentRecordLen bytes) and
// AppendBlock/ParseBlock (BlockRecordLen: 281 bytes for a 4 MiB block).
package blockmap
