package store

import (
	"testing"

	"github.com/kdedup/kdedup/filter"
)

// TestCacheKeepsHotPage: with a cache of 16 pages, a page read between
// every two reads of pages never read before stays cached (its CLOCK
// reference bit is set again before the hand comes back), while the
// others are evicted: reading the hot page never reads Badger again, and
// reading the first cold page again does. A cold page is read between any
// two reads of the hot one, so Page's shortcut for the page it returned
// last never serves it: the cache keeps it.
func TestCacheKeepsHotPage(t *testing.T) {
	const pb, capacity = 256, 16
	db := openT(t, Options{InMemory: true, PageBytes: pb, CacheBytes: capacity * pb, FlushBytes: smallFlush})
	p := partitionT(t, db, "orders", 1)
	defer p.Close()
	const cold = 100
	hot := filter.PageID{SubFilter: 0, Page: cold}
	for i := range cold + 1 {
		pg, err := p.Page(filter.PageID{Page: uint32(i)})
		if err != nil {
			t.Fatal(err)
		}
		pg[0] = byte(i + 1)
		p.MarkDirty(filter.PageID{Page: uint32(i)}, pg)
	}
	if err := p.Commit([]byte("m"), Checkpoint{Offset: 1}); err != nil {
		t.Fatal(err)
	}
	p.Discard() // nothing cached: every page is read from Badger once
	reads := func() int64 { return counterValue(t, db.metrics.pageReads) }
	page := func(id filter.PageID) {
		t.Helper()
		pg, err := p.Page(id)
		if err != nil {
			t.Fatal(err)
		}
		if want := byte(id.Page + 1); pg[0] != want {
			t.Fatalf("page %v reads %d, want %d", id, pg[0], want)
		}
	}
	page(hot)
	start := reads()
	for i := range cold {
		page(filter.PageID{Page: uint32(i)})
		if i%2 == 1 {
			before := reads()
			page(hot)
			if reads() != before {
				t.Fatalf("the hot page was read from Badger after %d cold pages", i+1)
			}
		}
	}
	if got := reads() - start; got != cold {
		t.Fatalf("%d reads from Badger for %d cold pages", got, cold)
	}
	before := reads()
	page(filter.PageID{Page: 0})
	if reads() != before+1 {
		t.Fatal("the first cold page is still cached after 100 others")
	}
}

// cached reports whether page id of p is in the DB's page cache.
func (p *PartitionState) cached(id filter.PageID) bool {
	ch, i := p.table.slot(id, false)
	return ch != nil && ch.clean[i].Load() != nil
}
