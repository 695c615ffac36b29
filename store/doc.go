// Package store owns the durable state of kdedup: for each topic-partition,
// the pages of its cuckoo-filter chain, the chain metadata and the
// checkpoint, in one Badger database per worker. It never interprets pages
// or metadata; the filter package does.
//
// # Write batches
//
// A write batch is one Badger transaction (Txn, not WriteBatch, whose
// internal flushes are not atomic) holding one log entry with what changed
// in the pages a PartitionState dirtied since its previous write batch,
// the pages it writes whole (see The log and the write-back), the chain
// metadata, the checkpoint and the write batch's sequence number.
// After a crash a partition's state is therefore exactly that of its last
// committed write batch, whose checkpoint says where to resume reading the
// input. Writes are not fsynced: a killed process loses nothing Badger
// acknowledged (TestCrashConsistencyAtEveryWrite kills it at every Badger
// write of a Commit), and after a power loss Badger's replay drops any
// transaction without its commit marker, so the last write batches may be
// lost (replaying the input from the checkpoint repairs that). Whole pages
// and log entries are in the value log and their pointers in the memtable
// log, neither fsynced: a power loss that keeps a pointer and loses its
// value leaves a page or log entry that reads as ErrCorrupt (a value of
// the wrong length: TestLostValueLogTail), never as other bytes, and the
// partition is rebuilt from its input or a snapshot.
//
// Badger refuses a transaction of 15% of its memtable or more, so Open sizes
// the memtable for Options.FlushBytes: whole pages and large log entries
// are in Badger's value log (ValueThreshold is PageBytes), so a
// transaction holds their keys and pointers, and the memtable stays at its
// least, 16 MiB, at the default FlushBytes.
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
// transaction (Badger runs any number concurrently), a point lookup of
// each page's base and its patch applied; they are bounded by PrefetchLimit pages per call: half the cache
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
//	'v'                                           layout version: uint32 (3)
//	't' | uint16 len(topic) | topic | int32 part  partition prefix P
//	P | 'm'                                       chain metadata (opaque)
//	P | 'c'                                       checkpoint: int64 offset | int32 leader epoch
//	P | 's'                                       sequence number of the last write batch: uint64
//	P | 'p' | uint32 sub-filter | uint32 page     page base: uint64 floor | page bytes (PageBytes)
//	P | 'l' | uint64 sequence                     log entry: int64 unix nanos | records
//	P | 'd' | uint32 sub-filter                   sub-filter dropped by write batch uint64 (value)
//	P | 'i'                                       Import not finished: the partition has no state (empty value)
//	P | 'o'                                       origin: uint16 len | topic ID | uint16 len | cluster ID (origin.go)
//
// A log record is uint32 sub-filter | uint32 page | uvarint length |
// delta, a delta the changed runs of a page, each uvarint gap from the
// end of the previous run | uvarint length | bytes.
//
// The origin key is optional: state written before origins were recorded
// has none, and the consumer adopts it with its topic's current IDs.
//
// Layout versions 1 (pages whole) and 2 (a delta entry per page and write
// batch) are refused by Open like any other version (ErrCorrupt and
// ErrLayoutVersion): the state is rebuilt by replaying the input, or
// restored from a snapshot, whose format does not depend on the layout.
//
// # The log and the write-back
//
// At a realistic record rate a write batch changes a few slots of each
// page it touches, and at 100 million keys a worker it touches a
// different page for nearly every record: 12,500 changes over 35,000
// pages of a partition a second. A Badger entry per changed page (the
// per-page deltas of layout version 2) then made every record an entry
// of its own, with its memtable insert, level-0 table and compactions:
// 30 to 40% of the CPU and 42% of a replay at 100M keys. So the filter
// reports the bytes each slot change touched (filter.Pager.MarkChanged:
// the bytes a slot shares with its neighbours included), and a write
// batch writes one log entry: for each page it changed, the changed runs
// of bytes, runs closer than a run header merged (a redo log of page
// runs, as ARIES and every write-ahead log has: the checkpoint, the
// metadata and the log commit together, so the durable state is always
// a whole write batch).
//
// A page is stored whole as a base whose header names its floor: the
// last write batch whose changes of the page it holds. A page with
// changes in the log after its floor is pending: its PartitionState keeps
// those changes in memory as the page's patch (about ten bytes a change),
// so that reading it on a cache miss is one point lookup of its base and
// the patch applied, whatever the log holds. The write-back writes
// pending pages whole, in the transaction of a later write batch (their
// floor is that write batch), oldest first: each page pending for
// Options.WriteBackInterval (default 1 minute), and older ones still
// while the patches of the partition pass its share of
// Options.WriteBackBytes (default 64 MiB for the DB), at most
// maxWriteBackPages a write batch. After the write batch commits, the log
// entries before the oldest write batch any page is still pending since
// are deleted (a WriteBatch outside the transaction: a torn delete leaves
// entries every page is past, which the next write batch deletes). A
// change thus costs its log bytes once and, amortized, a page written per
// interval however many changes the page took meanwhile: at 100M keys and
// 50,000 records a second, the state's 321 MiB of pages a minute, about
// 107 bytes a record (118 to 169 bytes to disk a record measured with the
// log, compactions and value-log GC, where per-page deltas wrote 270 to
// 1,130; docs/bench/HISTORY.md, "The store's log per write batch"). Pages written whole
// by the caller (MarkDirty: a split) and pages whose patch would pass
// half a page skip the log.
//
// Opening a partition reads its log and rebuilds the pending pages:
// for each record after its page's floor (one point lookup of the base
// per page the log names), the patch. The log holds about
// WriteBackInterval of write batches (more while WriteBackBytes is not
// reached by an idle partition: the worker writes an idle partition's
// pages back, ConsolidateStep), so recovery after a crash reads at most
// that much: at 50,000 records a second and about 12 bytes of log a
// record, about 36 MB. Measured at 100M keys over 4 partitions after a
// minute of new keys at that rate, the worker killed with SIGKILL: 2.7 s
// to open the 4 partitions, 3.2 s from the restart to ready
// (docs/bench/HISTORY.md, "The store's log per write batch"). DB.Partition
// reports each open in kdedup_store_partition_open_seconds, and logs it
// when the log was not empty.
// Export applies the log the same way at its read timestamp.
//
// PartitionState.DirtyBytes counts what the write batch will write: a page
// written whole as PageBytes, a logged page as an upper bound of its
// record, but at least a quarter of a page, so that the dirty pages a
// batch cut at Options.FlushBytes holds outside the cache stay within
// four times FlushBytes.
//
// PartitionState.ConsolidateStep writes pending pages back whatever their
// age, a bounded write batch at a time, and PartitionState.Consolidate all
// of them: the state at rest is then its page bytes and an empty log.
// The worker (consumer) takes a step per flush interval on a partition
// idle for ten of them.
//
// # Dropped sub-filters
//
// When a dedup window expires a generation, the chain hands its sub-filters
// to PartitionState.Drop. The write batch that commits metadata without them
// also writes a 'd' marker per sub-filter, naming the write batch; after it
// commits, the sub-filter's pages are deleted (Badger prefix iteration and
// deletes in a WriteBatch, whose partial flushes are harmless here:
// nothing refers to those pages any more), and the marker once no log
// entry from before the drop is stored: replaying the log at open skips
// the records of a sub-filter with a marker. A crash in between leaves the
// marker, and the next PartitionState open finishes the deletion.
// Sub-filter IDs are never reused, so deleting late never races a new
// sub-filter. The space is reclaimed by compaction and value-log GC.
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
// Open. Pages and log entries are in the value log, whose last file Badger
// reads through at Open (refusing what it cannot parse, truncating a torn
// tail) and whose other files it reads value by value, each checked
// against its checksum: a damaged page fails its read as ErrCorrupt
// (TestDamagedPageInValueLog), and the partition stops.
//
// Table files without a MANIFEST are refused rather than opened: Badger
// would delete them as orphans and open the memtable logs left, the last
// write batches without the pages of earlier ones, as if they were the
// whole state. An empty directory, or one without tables, is a new store.
//
// # Free space
//
// Badger writes its memtable log, its value log and its tables through
// memory maps of files it sizes without allocating them. When the filesystem runs out of
// space such a write is not an error but a SIGBUS that kills the process,
// and again at every restart. So Open and every Commit compare the free
// space of the filesystem (statfs: blocks available to the process) with
// what Badger may soon write, and return ErrDiskFull before it writes:
//
//   - the write batch itself: its whole pages (those it dirtied and those
//     the write-back takes) and its log entry in the value log, and its
//     keys, pointers and small values in the memtable log;
//   - the level-0 table of each of the numMemtables memtables, written when
//     it is flushed (a memtable fills to MemTableSize plus at most one write
//     batch) before its log is deleted; Close flushes too;
//   - a compaction of level 0 into the next level holding tables, whose new
//     tables are all written before the old ones are deleted.
//
// Deeper compactions merge one table with the part of the next level it
// overlaps and can need more, so the metrics kdedup_store_free_bytes and
// kdedup_store_required_free_bytes are there to alert well before. The
// value log grows by the pages the write-back rewrites, about the state's
// page bytes per WriteBackInterval at a steady record rate, and its
// older files turn to garbage as the same pages are written again:
// value-log GC (every minute, a file at least half garbage at a time)
// returns their space. Its files are 256 MiB (valueLogFileBytes).
package store
