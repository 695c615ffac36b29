package store

import "github.com/dgraph-io/badger/v4/skl"

// MemoryBytes estimates the memory a DB opened with o holds besides its
// page cache (CacheBytes) and its dirty pages (DirtyPageBytes) while it
// writes steadily: Badger's memtable arenas (numMemtables of them, and the
// one being flushed until its level-0 table is written; each
// MemTableSize plus the largest transaction and its skiplist nodes,
// Badger's arenaSize), its block cache, and the table builders'
// allocators: those Badger keeps in a pool of badgerAllocatorPool while it
// is busy and those building tables at that moment (builderInFlight), at
// the size they grow to: from 2 x BaseTableSize, doubling, until they hold
// a level-0 table, a whole memtable. The memtable follows from
// FlushBytes, so this is where a memory budget learns what a larger
// FlushBytes costs. It adds WriteBackBytes, the pending pages' patches.
// o's zero fields take their defaults.
func (o Options) MemoryBytes() int64 {
	o = o.withDefaults()
	size, _ := batchLimits(o.PageBytes, o.FlushBytes, o.valueThreshold())
	mt := memTableBytes(size)
	maxBatch := 15 * mt / 100 // Badger's MaxBatchSize
	arena := mt + maxBatch + maxBatch/int64(skl.MaxNodeSize)*int64(skl.MaxNodeSize)
	// A builder's allocator starts at 2 x BaseTableSize and adds buffers
	// of twice the last until it holds the table.
	builder, buf := int64(0), int64(2*baseTableBytes)
	for builder < arena {
		builder += buf
		buf *= 2
	}
	return (numMemtables+1)*arena + blockCacheBytes + (badgerAllocatorPool+builderInFlight)*builder + o.WriteBackBytes
}

// ImportMemoryBytes is the memory one PartitionState.Import holds besides
// MemoryBytes and the page cache: the transactions its Badger WriteBatch
// queues (importPendingTxns of up to Badger's MaxBatchSize each). Imports
// running at once hold it each.
func (o Options) ImportMemoryBytes() int64 {
	o = o.withDefaults()
	size, _ := batchLimits(o.PageBytes, o.FlushBytes, o.valueThreshold())
	return importPendingTxns * (15 * memTableBytes(size) / 100)
}

// importPendingTxns is how many transactions an Import's WriteBatch
// queues at most (Badger's default is 16).
const importPendingTxns = 2

// badgerAllocatorPool is how many table builders' allocators Badger keeps
// for reuse (z.NewAllocatorPool(8) in badger.Open), releasing one every 2 s
// only once it is idle; builderInFlight is how many more a memtable flush
// and the compactions were seen to hold at once besides them.
const (
	badgerAllocatorPool = 8
	builderInFlight     = 3
)

// DirtyPageBytes is the memory the dirty pages of every PartitionState of
// the DB hold, with the pages their callers stage for them
// (SetStagedPages): PageBytes each, whether a write batch will write them
// whole or log their changes. These pages are outside the page cache; a worker
// bounds them by cutting write batches (PartitionState.Commit). Safe for
// concurrent use.
func (db *DB) DirtyPageBytes() int64 {
	return db.dirtyPages.Load() * int64(db.opts.PageBytes)
}

// DirtyPageBytesPeak is the most DirtyPageBytes held at once since Open.
// Safe for concurrent use.
func (db *DB) DirtyPageBytesPeak() int64 {
	return db.dirtyPeak.Load() * int64(db.opts.PageBytes)
}

// CacheBytes is the memory the page cache holds at most: its pages
// (Options.CacheBytes rounded down to whole pages, at least one).
func (db *DB) CacheBytes() int64 {
	return int64(db.cachePages()) * int64(db.opts.PageBytes)
}

// addDirtyPages counts n pages becoming dirty (n < 0: clean or dropped)
// in DirtyPageBytes and its peak.
func (db *DB) addDirtyPages(n int64) {
	now := db.dirtyPages.Add(n)
	for {
		peak := db.dirtyPeak.Load()
		if now <= peak || db.dirtyPeak.CompareAndSwap(peak, now) {
			return
		}
	}
}

// OverDirtyShare reports whether p must cut its write batch (Commit) to
// keep the dirty and staged pages of its DB near bound bytes
// (DirtyPageBytes): true when they have reached bound and p holds (dirty
// or staged) at least half of its fair share, bound over the open
// partitions, and at least MinCutPages. Partitions under half their share
// hold less than bound/2 between them, and a partition over it that adds
// a page while the DB is at bound cuts its batch at its next check, so
// with a check after every record the DB's dirty pages stay under
// max(1.5 x bound, MinCutPages pages a partition) plus one record's pages
// per partition, whichever partitions are idle. bound <= 0 never asks
// for a cut. Safe for concurrent use with the other PartitionStates of
// the DB.
func (p *PartitionState) OverDirtyShare(bound int64) bool {
	held := len(p.dirty) + p.staged
	if bound <= 0 || held < MinCutPages {
		return false
	}
	own := int64(held) * int64(p.db.opts.PageBytes)
	return p.db.DirtyPageBytes() >= bound && own*2*max(p.db.openCount.Load(), 1) >= bound
}

// MinCutPages is the fewest changed pages for which OverDirtyShare asks a
// partition to cut its write batch: with more partitions than bound over
// 2 x MinCutPages pages, each may hold this many pages, and the DB's
// changed pages may pass 1.5 x bound to MinCutPages a partition. Below
// it, write batches of a few pages each (a thousand partitions sharing a
// bound of 94 MiB cut every 11 pages) cost four times the CPU and, at
// shutdown, thirty times the time they save in memory (docs/bench/HISTORY.md,
// "Memory budget").
const MinCutPages = 64

// SetStagedPages records that the caller holds n pages of p staged outside
// the store (the copies of an open exactly-once transaction,
// filter.Overlay.Staged), to be counted with p's dirty pages in
// DirtyPageBytes and OverDirtyShare. While n is above 0, each page that
// becomes dirty is taken to be one of them applied (filter.Overlay.Commit
// marks them) and moves from the staged count to the dirty one; set n
// again, to 0, once the rest are dropped. Close forgets them.
func (p *PartitionState) SetStagedPages(n int) {
	if p.closed || n == p.staged {
		return
	}
	p.db.addDirtyPages(int64(n - p.staged))
	p.staged = n
}
