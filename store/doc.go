// Package store owns the durable state of kdedup: for each topic-partition,
// the pages of its cuckoo-filter chain, the chain metadata and the
// checkpoint, in one Badger database per worker. It never interprets pages
// or metadata; the filter package does.
//
// # Write batches
//
// A write batch is one Badger transaction (Txn, not WriteBatch, whose
// internal flushes are not atomic) holding every page a Partition dirtied
// since its previous write batch, the chain metadata and the checkpoint.
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
// Clean pages of every Partition of a DB share one LRU cache of
// Options.CacheBytes; dirty pages are held by their Partition until Commit
// and are never evicted. Badger is the durable copy, not the per-operation
// path: a point read costs microseconds (BenchmarkPageRead), a cached page
// about a hundred nanoseconds (BenchmarkPageCached).
//
// # Key layout
//
// Keys are binary, integers big-endian, and all keys of one topic-partition
// share one prefix, so that Badger's DropPrefix can remove a partition:
//
//	'v'                                           layout version: uint32 (1)
//	't' | uint16 len(topic) | topic | int32 part  partition prefix P
//	P | 'm'                                       chain metadata (opaque)
//	P | 'c'                                       checkpoint: int64 offset | int32 leader epoch
//	P | 'p' | uint32 sub-filter | uint32 page     page bytes (PageBytes long)
//	P | 'd' | uint32 sub-filter                   sub-filter dropped, pages not yet deleted (empty value)
//
// # Dropped sub-filters
//
// When a dedup window expires a generation, the chain hands its sub-filters
// to Partition.Drop. The write batch that commits metadata without them
// also writes a 'd' marker per sub-filter; after it commits, the
// sub-filter's pages are deleted (Badger prefix iteration and deletes in a
// WriteBatch, whose partial flushes are harmless here: nothing refers to
// those pages any more) and the marker last. A crash in between leaves the
// marker, and the next Partition open finishes the deletion. Sub-filter IDs
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
