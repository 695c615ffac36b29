// Package dedup owns one topic-partition's deduplicator: it derives each
// record's dedup key, decides in offset order whether the record is new
// (forward), a duplicate (drop), a delete (remove the key, forward the
// tombstone) or cannot be keyed (forward unchanged, count), and commits the
// filter pages a write batch changed together with the checkpoint offset.
//
// Decisions are made one record at a time against the partition's chained
// cuckoo filter, so a duplicate inside one polled batch is caught exactly as
// one across batches. A duplicate is a record whose key the filter reports
// present: a key inserted earlier in this topic-partition and not deleted
// since, or, with probability about the filter's estimated false-positive
// rate, a key never seen (a false drop).
//
// With Options.MaxOccurrences N above 1 the partition throttles instead:
// the first N records of a key are forwarded, one fingerprint copy each,
// and later ones are over the limit (dropped) until a delete removes every
// copy of the key.
//
// Hostile input cannot stop a partition: a JSON value beyond MaxJSONBytes or
// MaxJSONDepth is unkeyed, and a key that a full chain cannot place is
// forwarded without being remembered and counted
// (kdedup_filter_full_records_total). Each partition's filter hashes with
// its own secret seed, so keys colliding with another's cannot be computed
// from outside.
//
// A process opens its partitions through one Opener, so that they share
// one set of Options, and the rules those Options decide are asked of dedup
// rather than copied: which decisions forward (Options.Forwards), whether
// changes are staged for exactly-once delivery (Options.Staged), the bytes
// one record can dirty (Options.MaxDirtyBytesPerRecord) and where a rebuild
// may start (Options.RebuildFrom, with package filter's generation
// arithmetic).
//
// Deduplicator.Prefetch, called with each poll before its records are
// decided, reads the filter pages they need from the store concurrently
// (store.PartitionState.Prefetch), so that a state larger than the page cache
// costs a batch of concurrent reads per poll instead of a synchronous read
// per record. It follows the decisions' key rules (deletes and refreshes
// read the same pages as lookups: one per sub-filter), cuts a poll into
// parts of store.PartitionState.PrefetchLimit pages, each read when the
// decisions reach it, so that prefetched pages are not evicted before use,
// and is skipped while the previous poll read nothing from Badger, which
// keeps a state that fits in the cache at one counter comparison per poll.
// It never changes a decision or a page.
//
// dedup does no network I/O; package consumer feeds it records and produces
// what it forwards.
package dedup
