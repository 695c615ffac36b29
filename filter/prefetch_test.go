package filter

import (
	"errors"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// recordingPager records the pages read through it and the batches handed
// to Prefetch.
type recordingPager struct {
	Pager
	reads      []PageID
	prefetched [][]PageID
	err        error
}

func (p *recordingPager) Page(id PageID) ([]byte, error) {
	p.reads = append(p.reads, id)
	return p.Pager.Page(id)
}

func (p *recordingPager) Prefetch(ids []PageID) error {
	p.prefetched = append(p.prefetched, slices.Clone(ids))
	return p.err
}

// TestPagesOf runs random inserts, refreshes, counts, lookups and deletes
// over a windowed chain that grows and expires sub-filters, and checks
// every page each operation reads against PagesOf taken just before it:
// every page read that was a page of the chain then is among them (a
// split reads the page it makes), and Count, which reads every
// sub-filter, reads exactly them.
func TestPagesOf(t *testing.T) {
	p := Params{FingerprintBits: 12, Capacity: 200, PageBytes: 256, Window: 10 * time.Second, Generations: 4, MaxKicks: 20}
	rec := &recordingPager{Pager: NewMemPager(256)}
	c, err := NewWithSeed(p, testSeed, rec)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(5, 6))
	maxSubs := 0
	var ts int64
	for i := range 20000 {
		k := key("k", rng.IntN(40000))
		ts += int64(rng.IntN(2))
		// The watermark moves first: the sweep it runs reads pages of its
		// own, in order, not a key's.
		if _, err := c.Advance(ts); err != nil {
			t.Fatal(err)
		}
		before := must(DecodeMeta(c.MarshalMeta()))
		pages := c.PagesOf(k, nil)
		if len(pages) != len(c.subs) {
			t.Fatalf("op %d: PagesOf lists %d pages over %d sub-filters", i, len(pages), len(c.subs))
		}
		rec.reads = rec.reads[:0]
		op := rng.IntN(5)
		switch op {
		case 0, 1:
			_, err = c.InsertAt(k, ts)
		case 2:
			_, err = c.Refresh(k, ts)
		case 3:
			_, err = c.Delete(k)
		case 4:
			_, err = c.Count(k)
			if !slices.Equal(sortedIDs(rec.reads), sortedIDs(pages)) {
				t.Fatalf("op %d: Count read %v, PagesOf %v", i, rec.reads, pages)
			}
		}
		if err != nil && !errors.Is(err, ErrFull) {
			t.Fatal(err)
		}
		for _, id := range rec.reads {
			if before.HasPage(id) && !slices.Contains(pages, id) {
				t.Fatalf("op %d (%d): read %v of an existing sub-filter, not in PagesOf %v", i, op, id, pages)
			}
		}
		maxSubs = max(maxSubs, len(c.subs))
	}
	if maxSubs < 3 {
		t.Fatalf("the chain held at most %d sub-filters; the test needs several", maxSubs)
	}
}

func sortedIDs(ids []PageID) []PageID {
	s := slices.Clone(ids)
	slices.SortFunc(s, func(a, b PageID) int {
		if a.SubFilter != b.SubFilter {
			return int(a.SubFilter) - int(b.SubFilter)
		}
		return int(a.Page) - int(b.Page)
	})
	return slices.Compact(s)
}

// TestPrefetchPassesThrough: Chain.Prefetch reaches a Prefetcher through an
// Overlay, without the pages the Overlay staged, wraps its error, and does
// nothing over a Pager that is not one.
func TestPrefetchPassesThrough(t *testing.T) {
	rec := &recordingPager{Pager: NewMemPager(512)}
	ov := NewOverlay(rec)
	c, err := NewWithSeed(Params{Capacity: 1000, PageBytes: 512}, testSeed, ov)
	if err != nil {
		t.Fatal(err)
	}
	staged, other := PageID{Page: 1}, PageID{Page: 2}
	if _, err := ov.Page(staged); err != nil {
		t.Fatal(err)
	}
	if err := c.Prefetch([]PageID{staged, other}); err != nil {
		t.Fatal(err)
	}
	if len(rec.prefetched) != 1 || !slices.Equal(rec.prefetched[0], []PageID{other}) {
		t.Errorf("the base was asked to prefetch %v, want [[%v]]", rec.prefetched, other)
	}
	if err := c.Prefetch([]PageID{staged}); err != nil || len(rec.prefetched) != 1 {
		t.Errorf("Prefetch of staged pages only: err %v, base asked %d times, want nil, 1", err, len(rec.prefetched))
	}
	rec.err = errors.New("disk gone")
	if err := c.Prefetch([]PageID{other}); !errors.Is(err, rec.err) {
		t.Errorf("Prefetch error %v does not wrap the Pager's", err)
	}
	plain, err := NewWithSeed(Params{Capacity: 1000, PageBytes: 512}, testSeed, NewMemPager(512))
	if err != nil {
		t.Fatal(err)
	}
	if err := plain.Prefetch([]PageID{other}); err != nil {
		t.Errorf("Prefetch over a MemPager: %v, want nil", err)
	}
}
