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
package store
