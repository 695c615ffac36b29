package store

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/dgraph-io/badger/v4"

	"github.com/kdedup/kdedup/filter"
)

// PrefetchWorkers is the most Badger reads one PartitionState.Prefetch has in
// flight at once. Each read is a point lookup of a page's base that
// mostly waits on the OS (a page-cache miss in Badger's memory-mapped
// tables, or a block read and its checksum); a few more readers than cores
// keep the disk queue busy without a goroutine per page.
const PrefetchWorkers = 8

// Prefetch reads into the page cache the pages of ids that are neither
// dirty nor cached, with up to PrefetchWorkers Badger reads at once, so
// that a batch of records whose pages are not in memory waits for about
// the slowest read instead of the sum of them (see the package comment).
// It implements filter.Prefetcher.
//
// Pages already cached are marked used (their CLOCK reference bit). At most
// PrefetchLimit pages are read per call (the first ones of ids): the rest
// are left to Page. Each page read counts once as a cache miss
// (kdedup_store_page_cache_misses_total and CacheMisses); the Page call
// that follows finds it cached and counts a hit. Duplicate IDs are read
// once. Errors are those of Page for the same page: ErrCorrupt for a
// stored entry that cannot be right (logged and counted as corruption,
// like Page), ErrClosed after Close, or Badger's error; pages read before
// an error are cached, the failed ones are not.
//
// The concurrency is internal: like every method of PartitionState, Prefetch is
// called by the goroutine that owns the partition, and it returns after
// its reads have ended. The DB's cache is shared with the PartitionStates of
// other goroutines and is safe for concurrent use.
func (p *PartitionState) Prefetch(ids []filter.PageID) error {
	if p.closed || p.db.closed.Load() {
		return fmt.Errorf("store: prefetching %d pages of %s: %w", len(ids), p.tp, ErrClosed)
	}
	limit := p.PrefetchLimit()
	want := p.prefetchIDs[:0]
	clear(p.prefetchSeen)
	for _, id := range ids {
		if len(want) >= limit {
			break
		}
		ch, i := p.table.slot(id, false)
		if ch != nil && ch.dirty[i] != nil {
			continue // the dirty copy is newer than any stored one
		}
		if _, ok := p.prefetchSeen[id]; ok {
			continue
		}
		p.prefetchSeen[id] = struct{}{}
		if ch != nil {
			if c := ch.clean[i].Load(); c != nil {
				c.touch()
				continue
			}
		}
		want = append(want, id)
	}
	p.prefetchIDs = want
	if len(want) == 0 {
		return nil
	}
	p.misses += uint64(len(want))
	p.db.metrics.cacheMisses.Add(float64(len(want)))

	// In key order, each worker reads a contiguous run of the pages, a
	// point lookup each, in one read-only transaction.
	slices.SortFunc(want, func(a, b filter.PageID) int {
		return cmp.Or(cmp.Compare(a.SubFilter, b.SubFilter), cmp.Compare(a.Page, b.Page))
	})
	// The pending pages' patches, looked up by the owner: the workers
	// read the map of no one.
	patches := make([]*pendingPage, len(want))
	for i, id := range want {
		patches[i] = p.pendingOf(id)
	}
	pages := make([]*cachedPage, len(want))
	errs := make([]error, len(want))
	workers := min(PrefetchWorkers, len(want))
	var wg sync.WaitGroup
	for w := range workers {
		lo, hi := w*len(want)/workers, (w+1)*len(want)/workers
		wg.Go(func() {
			// readPage only reads the PartitionState's immutable fields and
			// the DB; each worker reads in its own Badger read-only
			// transaction, which Badger allows concurrently.
			var reads int
			err := p.db.bdb.View(func(txn *badger.Txn) error {
				for i := lo; i < hi; i++ {
					data, found, err := p.readPage(txn, want[i], patches[i])
					if err != nil {
						errs[i] = p.readFailed(want[i], err)
						continue
					}
					if found {
						reads++
					}
					pages[i] = &cachedPage{data: data}
				}
				return nil
			})
			p.db.metrics.pageReads.Add(float64(reads))
			if err != nil {
				for i := lo; i < hi; i++ {
					errs[i] = fmt.Errorf("store: reading %s of %s: %w", fmtPageID(want[i]), p.tp, err)
				}
			}
		})
	}
	wg.Wait()
	for i, c := range pages {
		if c != nil {
			p.cache(want[i], c)
		}
	}
	return errors.Join(errs...)
}

// PrefetchLimit is the most pages one Prefetch reads: half the page cache
// shared equally by the open PartitionStates of the DB, so that the pages every
// partition prefetched for its next records fit in the cache together
// with half of it to spare, and none is evicted before its Page call. At
// least 1.
func (p *PartitionState) PrefetchLimit() int {
	p.db.mu.Lock()
	open := len(p.db.open)
	p.db.mu.Unlock()
	return max(1, p.db.cachePages()/(2*max(open, 1)))
}

// CacheMisses returns the number of this PartitionState's page lookups that had
// to read Badger since it was opened: Page calls that found the page
// neither dirty nor cached, and pages Prefetch read. A caller that sees it
// unchanged over a batch of records can skip prefetching the next one.
func (p *PartitionState) CacheMisses() uint64 { return p.misses }

var _ filter.Prefetcher = (*PartitionState)(nil)
