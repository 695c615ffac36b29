// Package budget splits one worker's memory budget (KDEDUP_MEMORY_BYTES,
// or the container's memory limit) between the parts of the worker that
// hold memory, so that one number sizes a worker and its resident memory
// stays under it: the Go runtime's soft memory limit, the page cache, the
// dirty pages of every partition, the store's own memory (Badger's
// memtables, block cache and table builders), the Kafka client's fetch
// buffers and the largest decompressed record batch.
//
// The split, from the total T:
//
//	non-Go   = max(T/16, 32 MiB)   thread stacks, the kernel's share of the
//	                               mapped table files, C allocations
//	GoLimit  = T - non-Go          runtime/debug.SetMemoryLimit
//	headroom = GoLimit/8           garbage the collector has not returned yet
//	live     = GoLimit - headroom  what the parts below hold at once
//	runtime  = 96 MiB              goroutines, client metadata, metric series
//	store    = store.Options.MemoryBytes (from FLUSH_BYTES)
//	fetch    = live/32 in [4 MiB, 50 MiB]
//	dirty    = live/16, at least 4 MiB (the dirty-page bound is 2/3 of it:
//	           the worker holds at most 1.5 times its bound, or 64 pages a
//	           partition when it owns more than bound/128 pages' worth)
//	restore  = live/32, at least one restore's memory R (Inputs.RestoreBytes:
//	           a snapshot's import and decoder, or a replay's fetch buffers,
//	           decompressed batch and records); MaxRestores = restore/R
//	           restores and replays run at once, 1 to 8
//	cache    = live - runtime - store - fetch - decompress - dirty - restore
//
// At the default FLUSH_BYTES the store takes about 440 MiB (Badger's
// 16 MiB memtables, block cache and table builders, and the pending
// pages' patches: store.Options.MemoryBytes); with the worker's
// defaults (internal/app: one restore's memory is a replay's, 70 MiB) a
// 3 GiB container (T = 2.7 GiB) gets a cache of about 1,403 MiB, a 2 GiB
// container (T = 1.8 GiB) about 698 MiB (internal/app's
// TestContainerFigures). The figures behind the shares are in
// docs/bench/HISTORY.md ("Memory budget").
package budget

import (
	"errors"
	"fmt"
)

const (
	mib = 1 << 20

	// minNonGoBytes and nonGoDivisor: the memory outside the Go heap is
	// T/nonGoDivisor, at least minNonGoBytes.
	minNonGoBytes = 32 * mib
	nonGoDivisor  = 16
	// headroomDivisor: the collector gets GoLimit/headroomDivisor of garbage
	// before it has to run all the time.
	headroomDivisor = 8
	// RuntimeBytes is the worker's fixed share: goroutines, the Kafka
	// clients' metadata, metric series, HTTP.
	RuntimeBytes = 96 * mib
	// Fetch buffer bounds: franz-go's default FetchMaxBytes is the most.
	minFetchBytes = 4 * mib
	maxFetchBytes = 50 * mib
	minDirtyBytes = 4 * mib
	// restoreDivisor and maxRestores: restores and replays get live/32,
	// at least one's memory, and run at most 8 at once.
	restoreDivisor = 32
	maxRestores    = 8
	// minCachePages is the smallest page cache the worker runs with
	// (config's KDEDUP_CACHE_BYTES rule).
	minCachePages = 16
)

// ErrTooSmall is returned (wrapped, with the figures) by Plan when the
// budget leaves the page cache less than 16 pages.
var ErrTooSmall = errors.New("budget: too small")

// Inputs are what Plan splits and what it must leave room for.
type Inputs struct {
	// TotalBytes is the budget: the most resident memory the worker may use.
	TotalBytes int64
	// StoreBytes is what the store holds besides its page cache and dirty
	// pages (store.Options.MemoryBytes).
	StoreBytes int64
	// DecompressBytes is the largest record batch a fetch decompresses to
	// (KDEDUP_MAX_DECOMPRESS_BYTES).
	DecompressBytes int64
	// PageBytes is the size of a page (KDEDUP_PAGE_BYTES).
	PageBytes int64
	// CacheBytes, when not 0, is the page cache asked for
	// (KDEDUP_CACHE_BYTES), taken as given in place of the cache's share.
	CacheBytes int64
	// RestoreBytes is the memory one partition's restore or replay holds
	// besides the shares above: the larger of a snapshot's import
	// (store.Options.ImportMemoryBytes plus snapshot.LoadMemoryBytes) and
	// a replay's restore client (its fetch buffers, a decompressed batch,
	// a poll of records). 0: restores are not budgeted (Restore is 0).
	RestoreBytes int64
}

// Split is a budget's share for each part, in bytes. Shares are disjoint
// and add up: NonGo + GoLimit = Total and Headroom + Live = GoLimit, where
// Live = Runtime + Store + Fetch + Decompress + Dirty + Restore + Cache, except that
// a CacheBytes override may make Live larger than GoLimit - Headroom
// (Over reports by how much).
type Split struct {
	Total, NonGo, GoLimit, Headroom, Live int64
	Runtime, Store, Fetch, Decompress     int64
	// Restore is the share of the restores and replays running at once
	// (MaxRestores of Inputs.RestoreBytes each).
	Restore int64
	// MaxRestores is how many partitions may restore or replay at once
	// (consumer.Options.MaxRestores): Restore / Inputs.RestoreBytes, 1 to 8;
	// 0 when restores are not budgeted.
	MaxRestores int
	// Dirty is the dirty pages' share; MaxDirtyPageBytes, the bound the
	// worker cuts write batches at, is two thirds of it.
	Dirty int64
	// Cache is the page cache: its share, or Inputs.CacheBytes.
	Cache int64
	// CacheOverride tells that Cache is Inputs.CacheBytes.
	CacheOverride bool
	// Over is how much a CacheBytes override exceeds the cache's share
	// (0 when it does not).
	Over int64
}

// MaxDirtyPageBytes is the bound on the dirty pages of all partitions
// (consumer.Options.MaxDirtyPageBytes): the worker holds up to 1.5 times
// it, which is Dirty, unless its partitions are so many that 64 pages
// each (store.MinCutPages) are more.
func (s Split) MaxDirtyPageBytes() int64 { return s.Dirty * 2 / 3 }

// Plan splits in.TotalBytes (see the package comment). It returns an
// error wrapping ErrTooSmall, naming the least budget that works, when
// the cache's share would be under 16 pages and no CacheBytes is given.
func Plan(in Inputs) (Split, error) {
	s, share := shares(in)
	if in.CacheBytes > 0 {
		s.Cache, s.CacheOverride = in.CacheBytes, true
		s.Over = max(in.CacheBytes-share, 0)
	} else {
		if share < minCachePages*in.PageBytes {
			l := least(in)
			return Split{}, fmt.Errorf("%w: %d bytes leave %d for the page cache, under %d pages of %d bytes; the store needs %d, the fetch buffers %d, a decompressed batch %d, the dirty pages %d, a restore %d and the runtime %d; at least %d bytes (%d MiB) are needed",
				ErrTooSmall, in.TotalBytes, max(share, 0), minCachePages, in.PageBytes, s.Store, s.Fetch, s.Decompress, s.Dirty, s.Restore, s.Runtime, l, l/mib)
		}
		s.Cache = share
	}
	s.Live = s.Runtime + s.Store + s.Fetch + s.Decompress + s.Dirty + s.Restore + s.Cache
	return s, nil
}

// shares is the Split of in without its cache, and the cache's share.
func shares(in Inputs) (Split, int64) {
	s := Split{Total: in.TotalBytes, Runtime: RuntimeBytes, Store: in.StoreBytes, Decompress: in.DecompressBytes}
	s.NonGo = max(in.TotalBytes/nonGoDivisor, minNonGoBytes)
	s.GoLimit = in.TotalBytes - s.NonGo
	s.Headroom = s.GoLimit / headroomDivisor
	live := s.GoLimit - s.Headroom
	s.Fetch = min(max(live/32, minFetchBytes), maxFetchBytes)
	s.Dirty = max(live/16, minDirtyBytes)
	if in.RestoreBytes > 0 {
		s.Restore = max(live/restoreDivisor, in.RestoreBytes)
		s.MaxRestores = int(min(s.Restore/in.RestoreBytes, maxRestores))
		s.Restore = int64(s.MaxRestores) * in.RestoreBytes
	}
	return s, live - s.Runtime - s.Store - s.Fetch - s.Decompress - s.Dirty - s.Restore
}

// least is the smallest TotalBytes, in whole MiB, with which Plan leaves
// the cache 16 pages (the cache's share grows with the total).
func least(in Inputs) int64 {
	fits := func(mibs int64) bool {
		in := in
		in.TotalBytes = mibs * mib
		_, share := shares(in)
		return share >= minCachePages*in.PageBytes
	}
	lo, hi := int64(0), max(in.TotalBytes/mib, 64) // !fits(lo) at 0: the runtime share alone is larger
	for !fits(hi) {
		lo, hi = hi, 2*hi
	}
	for hi-lo > 1 {
		mid := lo + (hi-lo)/2
		if fits(mid) {
			hi = mid
		} else {
			lo = mid
		}
	}
	return hi * mib
}
