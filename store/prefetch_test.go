package store

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"

	"github.com/dgraph-io/badger/v4"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/kdedup/kdedup/filter"
)

func counter(t testing.TB, c prometheus.Metric) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// TestPrefetchRandomizedAgainstModel is TestRandomizedAgainstModel with
// prefetches of random sets of pages among the steps (whole-page writes and
// deltas, commits, discards, reopens), over a cache of four pages: every
// page read, with or without a prefetch before it, equals the model. Pages
// evicted and prefetched again are read by point lookups of the entries
// the partition knows, never finding others.
func TestPrefetchRandomizedAgainstModel(t *testing.T) {
	const pb = 64
	db := openT(t, Options{InMemory: true, PageBytes: pb, FlushBytes: smallFlush, CacheBytes: 4 * pb})
	ids := universe(3, 12)
	rng := rand.New(rand.NewPCG(3, 4))
	m := newModel(pb)
	p, err := db.Partition("events", 7)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { p.Close() }()
	var stamp, prefetchPatched uint64
	for step := range 3000 {
		switch r := rng.IntN(100); {
		case r < 25:
			id := ids[rng.IntN(len(ids))]
			stamp++
			content := pageBytes(pb, id, stamp)
			write(t, p, id, content)
			m.dirty[id] = content
		case r < 45: // a delta: a few bytes changed
			id := ids[rng.IntN(len(ids))]
			page := mustPage(t, p, id)
			off, n := rng.IntN(pb-4), 1+rng.IntN(4)
			for i := off; i < off+n; i++ {
				page[i] = byte(rng.Uint32())
			}
			p.MarkChanged(id, page, off, n)
			m.dirty[id] = append([]byte{}, page...)
		case r < 65:
			var batch []filter.PageID
			for range rng.IntN(12) {
				batch = append(batch, ids[rng.IntN(len(ids))])
			}
			for _, id := range batch {
				if p.pending[id] != nil && p.Peek(id) == nil {
					prefetchPatched++ // read from Badger with its patch applied
				}
			}
			if err := p.Prefetch(batch); err != nil {
				t.Fatalf("step %d: Prefetch: %v", step, err)
			}
			for _, id := range batch {
				if got := mustPage(t, p, id); !bytes.Equal(got, m.page(id)) {
					t.Fatalf("step %d: page %v after Prefetch differs from the model", step, id)
				}
			}
		case r < 85:
			id := ids[rng.IntN(len(ids))]
			if got := mustPage(t, p, id); !bytes.Equal(got, m.page(id)) {
				t.Fatalf("step %d: page %v differs from the model", step, id)
			}
		case r < 95:
			cp := Checkpoint{Offset: int64(step), LeaderEpoch: -1}
			if err := p.Commit([]byte{byte(step)}, cp); err != nil {
				t.Fatalf("step %d: %v", step, err)
			}
			m.commit([]byte{byte(step)}, cp)
		case r < 98:
			p.Discard()
			clear(m.dirty)
		default:
			p.Close()
			clear(m.dirty)
			if p, err = db.Partition("events", 7); err != nil {
				t.Fatal(err)
			}
		}
		if db.cache.resident() > 4 {
			t.Fatalf("step %d: cache holds %d pages, budget is 4", step, db.cache.resident())
		}
	}
	if err := m.diff(p, ids); err != nil {
		t.Fatal(err)
	}
	if prefetchPatched == 0 {
		t.Fatal("Prefetch read no page whose changes were in the log")
	}
}

// TestPrefetchThenPageReadsNothing prefetches pages that fit in the cache:
// the Page calls that follow read nothing from Badger and count as hits,
// and each page read counts as one miss.
func TestPrefetchThenPageReadsNothing(t *testing.T) {
	const pb = 64
	db := openT(t, Options{InMemory: true, PageBytes: pb, FlushBytes: smallFlush, CacheBytes: 64 * pb})
	p := partitionT(t, db, "orders", 1)
	ids := universe(2, 10)
	for i, id := range ids {
		write(t, p, id, pageBytes(pb, id, uint64(i+1)))
	}
	if err := p.Commit([]byte("m"), Checkpoint{Offset: 1}); err != nil {
		t.Fatal(err)
	}
	p.Discard() // empties the cache: the pages are in Badger only
	if got := p.PrefetchLimit(); got != 32 {
		t.Fatalf("PrefetchLimit = %d, want 32 (half of 64 cached pages, one partition)", got)
	}
	reads, misses, hits := counter(t, db.metrics.pageReads), counter(t, db.metrics.cacheMisses), counter(t, db.metrics.cacheHits)
	own := p.CacheMisses()
	// Twice each, the second copy and a page never written included.
	never := filter.PageID{SubFilter: 5, Page: 1}
	if err := p.Prefetch(append(append(append([]filter.PageID{}, ids...), ids...), never)); err != nil {
		t.Fatal(err)
	}
	want := float64(len(ids) + 1)
	if got := counter(t, db.metrics.cacheMisses) - misses; got != want {
		t.Errorf("Prefetch counted %v misses, want %v (one per page read)", got, want)
	}
	if got := p.CacheMisses() - own; got != uint64(want) {
		t.Errorf("CacheMisses moved by %d, want %v", got, want)
	}
	if got := counter(t, db.metrics.pageReads) - reads; got != float64(len(ids)) {
		t.Errorf("Prefetch read %v stored pages, want %d", got, len(ids))
	}
	reads, misses = counter(t, db.metrics.pageReads), counter(t, db.metrics.cacheMisses)
	for i, id := range append(ids, never) {
		want := make([]byte, pb)
		if id != never {
			want = pageBytes(pb, id, uint64(i+1))
		}
		if got := mustPage(t, p, id); !bytes.Equal(got, want) {
			t.Errorf("page %v differs from what was committed", id)
		}
	}
	if got := counter(t, db.metrics.pageReads) - reads; got != 0 {
		t.Errorf("Page read %v pages from Badger after Prefetch, want 0", got)
	}
	if got := counter(t, db.metrics.cacheMisses) - misses; got != 0 {
		t.Errorf("Page missed the cache %v times after Prefetch, want 0", got)
	}
	if got := counter(t, db.metrics.cacheHits) - hits; got != want {
		t.Errorf("Page hit the cache %v times, want %v", got, want)
	}
	// A second Prefetch of cached pages reads nothing.
	if err := p.Prefetch(ids); err != nil {
		t.Fatal(err)
	}
	if got := counter(t, db.metrics.cacheMisses) - misses; got != 0 {
		t.Errorf("Prefetch of cached pages counted %v misses, want 0", got)
	}
}

// TestPrefetchLimit: one Prefetch reads at most PrefetchLimit pages, half
// the cache shared by the open partitions, the first ones asked for.
func TestPrefetchLimit(t *testing.T) {
	const pb = 64
	db := openT(t, Options{InMemory: true, PageBytes: pb, FlushBytes: smallFlush, CacheBytes: 16 * pb})
	p := partitionT(t, db, "orders", 0)
	partitionT(t, db, "orders", 1)
	if got := p.PrefetchLimit(); got != 4 {
		t.Fatalf("PrefetchLimit = %d, want 4 (16 pages / 2 / 2 partitions)", got)
	}
	ids := universe(1, 10)
	if err := p.Prefetch(ids); err != nil {
		t.Fatal(err)
	}
	if got := p.CacheMisses(); got != 4 {
		t.Errorf("Prefetch of 10 pages read %d, want 4", got)
	}
	for _, id := range ids[:4] {
		if !p.cached(id) {
			t.Errorf("page %v, among the first 4 asked for, is not cached", id)
		}
	}
}

// TestPrefetchKeepsDirtyPages: a page changed since the last write batch is
// never replaced by its stored copy, whole or changed by a delta.
func TestPrefetchKeepsDirtyPages(t *testing.T) {
	const pb = 64
	db := openT(t, Options{InMemory: true, PageBytes: pb, FlushBytes: smallFlush, CacheBytes: 64 * pb})
	p := partitionT(t, db, "orders", 0)
	a, b := filter.PageID{Page: 1}, filter.PageID{Page: 2}
	write(t, p, a, pageBytes(pb, a, 1))
	write(t, p, b, pageBytes(pb, b, 1))
	if err := p.Commit([]byte("m"), Checkpoint{Offset: 1}); err != nil {
		t.Fatal(err)
	}
	p.Discard()
	write(t, p, a, pageBytes(pb, b, 2))
	pg := mustPage(t, p, b)
	pg[3] = 0xee
	p.MarkChanged(b, pg, 3, 1)
	wantB := append([]byte{}, pg...)
	if err := p.Prefetch([]filter.PageID{a, b}); err != nil {
		t.Fatal(err)
	}
	if got := mustPage(t, p, a); !bytes.Equal(got, pageBytes(pb, b, 2)) {
		t.Error("dirty page a was replaced by its stored copy")
	}
	if got := mustPage(t, p, b); !bytes.Equal(got, wantB) {
		t.Error("page b changed by a delta was replaced by its stored copy")
	}
	for _, id := range []filter.PageID{a, b} {
		if p.cached(id) {
			t.Errorf("dirty page %v was added to the cache of clean pages", id)
		}
	}
	if err := p.Commit([]byte("m"), Checkpoint{Offset: 2}); err != nil {
		t.Fatal(err)
	}
	p.Discard()
	if err := p.Prefetch([]filter.PageID{a, b}); err != nil {
		t.Fatal(err)
	}
	if got := mustPage(t, p, b); !bytes.Equal(got, wantB) {
		t.Error("page b read back by Prefetch differs from what was committed")
	}
}

// TestPrefetchCorrupt: a damaged page read during Prefetch returns
// ErrCorrupt naming it, counts as corruption, and leaves the cache without
// it; the other pages of the batch are cached.
func TestPrefetchCorrupt(t *testing.T) {
	const pb = 64
	db := openT(t, Options{InMemory: true, PageBytes: pb, FlushBytes: smallFlush, CacheBytes: 64 * pb})
	bad, good := filter.PageID{SubFilter: 2, Page: 9}, filter.PageID{SubFilter: 2, Page: 8}
	err := db.bdb.Update(func(txn *badger.Txn) error {
		return txn.Set(pageKey(partitionPrefix("orders", 4), bad), make([]byte, pageBaseHeader+pb-1))
	})
	if err != nil {
		t.Fatal(err)
	}
	p := partitionT(t, db, "orders", 4)
	before := counter(t, db.metrics.corruptions)
	err = p.Prefetch([]filter.PageID{good, bad})
	if !errors.Is(err, ErrCorrupt) {
		t.Fatalf("Prefetch of a damaged page: %v, want ErrCorrupt", err)
	}
	for _, s := range []string{"orders/4", "page 9 of sub-filter 2"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not name %q", err, s)
		}
	}
	if got := counter(t, db.metrics.corruptions) - before; got != 1 {
		t.Errorf("corruptions counted %v, want 1", got)
	}
	if p.cached(bad) {
		t.Error("the damaged page was cached")
	}
	if !p.cached(good) {
		t.Error("the intact page of the batch was not cached")
	}
	if _, err := p.Page(bad); !errors.Is(err, ErrCorrupt) {
		t.Errorf("Page of the damaged page after Prefetch: %v, want ErrCorrupt", err)
	}
}

func TestPrefetchClosed(t *testing.T) {
	db := openT(t, Options{InMemory: true})
	p := partitionT(t, db, "orders", 0)
	p.Close()
	if err := p.Prefetch([]filter.PageID{{}}); !errors.Is(err, ErrClosed) {
		t.Errorf("Prefetch after Close: %v, want ErrClosed", err)
	}
}

// TestConcurrentPrefetch prefetches and reads from several PartitionStates of
// one DB at once over a small shared cache; run with -race.
func TestConcurrentPrefetch(t *testing.T) {
	const pb = 64
	db := openT(t, Options{InMemory: true, PageBytes: pb, FlushBytes: smallFlush, CacheBytes: 8 * pb})
	ids := universe(2, 16)
	var wg sync.WaitGroup
	for w := range int32(4) {
		p := partitionT(t, db, "orders", w)
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 11))
			m := newModel(pb)
			for step := range 400 {
				batch := make([]filter.PageID, 1+rng.IntN(6))
				for i := range batch {
					batch[i] = ids[rng.IntN(len(ids))]
				}
				if err := p.Prefetch(batch); err != nil {
					t.Error(err)
					return
				}
				for _, id := range batch {
					page, err := p.Page(id)
					if err != nil {
						t.Error(err)
						return
					}
					if !bytes.Equal(page, m.page(id)) {
						t.Errorf("partition %d step %d: page %v differs", w, step, id)
						return
					}
					if rng.IntN(3) == 0 {
						c := pageBytes(pb, id, uint64(step+1)<<8|uint64(w))
						copy(page, c)
						p.MarkDirty(id, page)
						m.dirty[id] = c
					}
				}
				if rng.IntN(8) == 0 {
					if err := p.Commit([]byte{byte(step)}, Checkpoint{Offset: int64(step)}); err != nil {
						t.Error(err)
						return
					}
					m.commit([]byte{byte(step)}, Checkpoint{Offset: int64(step)})
				}
			}
			if err := m.diff(p, ids); err != nil {
				t.Error(fmt.Errorf("partition %d: %w", w, err))
			}
		})
	}
	wg.Wait()
	if n := db.cache.resident(); n > 8 {
		t.Errorf("the cache holds %d pages, budget is 8", n)
	}
}
