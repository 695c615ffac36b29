// Package store owns the durable state of kdedup: for each topic-partition,
// the pages of its cuckoo-filter chain, the chain metadata and the
// checkpoint, in one Badger database per worker. It never interprets pages
// or metadata; the filter package does.
//
// # Write batches
//
// A write batch is one Badger transaction (Txn, not WriteBatch, whose
// internal flushes are not atomic) holding what changed in every page a
// PartitionState dirtied since its previous write batch (a delta or the whole
// page; see Page deltas), the chain metadata and the checkpoint.
// After a crash a partition's state is therefore exactly that of its last
// committed write batch, whose checkpoint says where to resume reading the
// input. Writes are not fsynced: a killed process loses nothing Badger
// acknowledged, and after a power loss Badger's replay drops any transaction
// without its commit marker, so the last write batches may be lost (replaying
// the input from the checkpoint repairs that) but none is torn.
//
// Badger refuses a transaction of 15% of its memtable or more, so Open sizes
// the memtable for Options.FlushBytes.
//
// # Page cache
//
// Clean pages of every PartitionState of a DB share one cache of
// Options.CacheBytes, evicted by CLOCK (second chance: a read sets the
// page's reference bit, the hand evicts the first page whose bit is
// clear); dirty pages are held by their PartitionState until Commit and are
// never evicted. Each PartitionState finds its pages in a page table
// indexed by sub-filter and page number (pagecache.go), without a lock or
// a hash map on the path of a record. Badger is the durable copy, not the per-operation
// path: a point read costs microseconds (BenchmarkPageRead), a cached page
// about a hundred nanoseconds (BenchmarkPageCached).
//
// # Prefetch
//
// Once a partition's state exceeds the page cache, nearly every record
// reads a page from Badger, and the filter asks for pages one at a time:
// each read waits for the previous one, so a cache miss costs its latency
// (an OS page fault in a memory-mapped table, a block read and its
// checksum) on every record, and a partition's throughput is the inverse
// of that latency. PartitionState.Prefetch takes the pages a batch of records
// will read (filter.Chain.PagesOf: one per sub-filter per key) and reads
// those neither dirty nor cached concurrently into the cache, so that the
// batch waits about as long as its slowest read (RocksDB's MultiGet, which
// Kvrocks uses for commands over many keys, makes the same point for point
// lookups). The pages are read in key order, each of PrefetchWorkers
// goroutines (a few more than cores, enough to keep a disk's queue full)
// taking a contiguous run of them through one Badger read-only
// transaction and one iterator that seeks from page to page (Badger runs
// any number concurrently), so that the iterator over the memtables and
// every level's tables is built once per run rather than once per page;
// they are bounded by PrefetchLimit pages per call: half the cache
// shared by the open Partitions, so that the pages prefetched by every
// partition fit together and none is evicted before the record that needs
// it. A dirty page is never read (its stored copy is older), and the cache
// is the DB's, safe for concurrent use. A prefetched page counts one
// cache miss; the Page call that follows counts a hit. Package dedup
// decides when to prefetch and how to cut a poll into parts of
// PrefetchLimit pages.
//
// # Key layout
//
// Keys are binary, integers big-endian, and all keys of one topic-partition
// share one prefix, so that Badger's DropPrefix can remove a partition:
//
//	'v'                                           layout version: uint32 (2)
//	't' | uint16 len(topic) | topic | int32 part  partition prefix P
//	P | 'm'                                       chain metadata (opaque)
//	P | 'c'                                       checkpoint: int64 offset | int32 leader epoch
//	P | 'p' | uint32 sub-filter | uint32 page     page base K: uint32 sequence | page bytes (PageBytes)
//	K | uint32 sequence                           page delta: runs of uvarint gap | uvarint length | bytes
//	P | 'd' | uint32 sub-filter                   sub-filter dropped, pages not yet deleted (empty value)
//	P | 'i'                                       Import not finished: the partition has no state (empty value)
//	P | 'o'                                       origin: uint16 len | topic ID | uint16 len | cluster ID (origin.go)
//
// The origin key is optional: state written before origins were recorded
// has none, and the consumer adopts it with its topic's current IDs.
//
// Layout version 1 stored every page whole under K without a sequence
// number; Open refuses it like any other version (ErrCorrupt), and the
// state is rebuilt by replaying the input.
//
// # Page deltas
//
// At a realistic record rate a write batch changes a few slots of each
// page it touches: with 20 million keys, 50,000 records a second over four
// partitions and a one-second write batch, about three records per 4 KiB
// page. Writing the page whole handed Badger 1.5 KB per record and wrote 3.9
// KB to disk, sixty times an exact key set. So the filter reports the bytes
// each slot change touched (filter.Pager.MarkChanged: the bytes a slot
// shares with its neighbours included), and a write batch persists, per
// dirty page, one delta entry: the changed runs of bytes, runs closer than
// a run header merged. A page is stored as a base entry (absent while the
// page has never been written whole: zeros) and the deltas written since,
// under the base's key followed by a sequence number, so that one prefix
// iteration reads the base and then the deltas in the order they apply.
// A PartitionState keeps what it last learnt of each page's stored entries
// (the base's sequence number and the live deltas', from a read or its own
// write batch) after the page leaves the cache, and reads a page known to
// have at most maxPointDeltas live deltas by a point lookup of each entry
// instead: Badger's Get skips every table whose bloom filter rules the key
// out and stops at the entry, where an iterator seeks in a table of every
// level and reads past the page's last entry. With the state 4x the page
// cache most pages read are those of older sub-filters, whose deltas were
// folded in long ago (BENCHMARKS.md, "Page reads by point lookups"). What
// it knows is lost when the PartitionState closes, so the first read of
// each page after Open lists its entries.
//
// Consolidation bounds the deltas: when a page's live deltas would pass
// half a page (maxDeltaBytes, keys included), the write batch writes the
// page whole instead, its header naming the last sequence number it folds
// in. A page is therefore rewritten only after at least half a page of
// deltas, so a change costs at most three times its delta bytes amortized,
// and a read on a cache miss reads at most one and a half pages. The
// folded deltas are obsolete as soon as that write batch commits (reads
// skip sequence numbers at or below the base's); a WriteBatch deletes them
// after the commit, outside the transaction and its size limit, and one
// left by a crash is deleted when its page is next rewritten whole. Pages
// written whole by the caller (MarkDirty), and pages whose changes pass
// half a page within one write batch, skip the delta.
//
// The alternative, a per-partition redo log of slot changes committed with
// the checkpoint and pages written back lazily (fuzzy checkpoints), writes
// slightly fewer bytes per change but needs page sequence numbers in every
// page, a bounded redo pass at every PartitionState open and a write-back
// scheduler: three new mechanisms where deltas need none, since a page and
// its deltas are read together and the existing write batch, drop (prefix
// deletion of a sub-filter removes its deltas too) and crash guarantees
// carry over unchanged.
//
// Memory for uncommitted changes is proportional to the changes: a dirty
// page keeps the runs changed since its last write batch, a run widened
// when a change touches the last one, beside the page bytes it held before;
// a page bound to be rewritten whole at the next write batch (its runs, or
// its runs and live deltas, pass half a page) drops its runs, and the
// chain reports a page changed by a long eviction walk whole. Each clean
// page in the cache carries its base and delta sequence numbers and delta
// bytes, so a write batch chooses between delta and whole page without
// reading Badger.
//
// PartitionState.DirtyBytes counts what the write batch will write: a page
// written whole as PageBytes, a delta as an upper bound of its entry (key,
// runs with their headers, Badger's per-entry bytes), but at least a
// quarter of a page, so that the dirty pages a batch cut at
// Options.FlushBytes holds outside the cache stay within four times
// FlushBytes and its entries within four per page of it (Badger limits
// both bytes and entries). Batches of deltas thus hold up to four times as
// many pages before FlushBytes cuts them: with 20 million keys at 50,000
// records a second, the flush interval cuts them, where whole pages filled
// 8 MiB three times a second; and a replay flat out into 5 million keys a
// partition writes a delta entry per several records, not one per record.
//
// At rest, live deltas add up to half a page per page (about a quarter on
// average in steady state). PartitionState.ConsolidateStep folds them into their
// pages, a bounded write batch at a time, and PartitionState.Consolidate all of
// them; with Badger's compaction the state at rest is then its page bytes.
// The worker (consumer) takes a step per flush interval on a partition idle
// for ten of them: an idle partition has the time, and a busy one would
// write its pages whole again soon after.
//
// # Dropped sub-filters
//
// When a dedup window expires a generation, the chain hands its sub-filters
// to PartitionState.Drop. The write batch that commits metadata without them
// also writes a 'd' marker per sub-filter; after it commits, the
// sub-filter's pages are deleted (Badger prefix iteration and deletes in a
// WriteBatch, whose partial flushes are harmless here: nothing refers to
// those pages any more) and the marker last. A crash in between leaves the
// marker, and the next PartitionState open finishes the deletion. Sub-filter IDs
// are never reused, so deleting late never races a new sub-filter. The
// space is reclaimed by compaction and value-log GC.
//
// Open writes the layout version into an empty database and refuses any
// other version.
//
// # Damage
//
// State that may be wrong is never used: Open returns ErrCorrupt, logs it
// at ERROR and changes nothing in the directory; the error says what is
// wrong and how to recover (move the directory aside; the state is rebuilt
// by replaying the input). Before Badger opens the directory, Open reads
// the MANIFEST and every table it lists in full, verifying each block's
// checksum, so that a flipped byte, a table cut short (on which Badger
// panics in a goroutine of its own) or a missing table is refused instead
// of read. Badger then verifies each block it reads and each value-log
// entry. Corruption found while running (a page of the wrong length, a
// failed value checksum) is an ERROR, counts in
// kdedup_store_corruptions_total, and fails the read. Badger's point
// lookups skip a table block that fails its checksum while running as if
// it held no key; such damage, appearing after Open, is caught at the next
// Open.
//
// Table files without a MANIFEST are refused rather than opened: Badger
// would delete them as orphans and open the memtable logs left, the last
// write batches without the pages of earlier ones, as if they were the
// whole state. An empty directory, or one without tables, is a new store.
//
// # Free space
//
// Badger writes its memtable log and its tables through memory maps of
// files it sizes without allocating them. When the filesystem runs out of
// space such a write is not an error but a SIGBUS that kills the process,
// and again at every restart. So Open and every Commit compare the free
// space of the filesystem (statfs: blocks available to the process) with
// what Badger may soon write, and return ErrDiskFull before it writes:
//
//   - the write batch itself, in the memtable log;
//   - the level-0 table of each of the numMemtables memtables, written when
//     it is flushed (a memtable fills to MemTableSize plus at most one write
//     batch) before its log is deleted; Close flushes too;
//   - a compaction of level 0 into the next level holding tables, whose new
//     tables are all written before the old ones are deleted.
//
// Deeper compactions merge one table with the part of the next level it
// overlaps and can need more, so the metrics kdedup_store_free_bytes and
// kdedup_store_required_free_bytes are there to alert well before. The
// value log holds only values of ValueThreshold (1 MiB) or more, and pages
// are at most MaxPageBytes, so it holds its 20-byte header only: its
// ValueLogFileSize (1 GiB, mapped at twice that) reserves address space,
// not disk, and is left at Badger's default.
package store
