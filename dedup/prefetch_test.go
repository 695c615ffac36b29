package dedup

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kdedup/kdedup/filter"
	"github.com/kdedup/kdedup/internal/scenario"
	"github.com/kdedup/kdedup/store"
)

// TestPrefetchChangesNothing decides one stream (puts, retries, hot keys,
// tombstones, unkeyed records) in random polls twice, once with Prefetch
// before each poll and once without, over a page cache of 8 pages while
// the state grows to over a hundred: decisions, chain metadata and every page are
// identical, under each option that changes which pages a record reads.
// The buckets are prefetched too (Decide's PrefetchBuckets a few records
// ahead), whatever the state's size.
func TestPrefetchChangesNothing(t *testing.T) {
	// With the buckets of every state prefetched too (filter.Chain.PrefetchBuckets).
	defer func(v uint64) { minBucketPrefetchBytes = v }(minBucketPrefetchBytes)
	minBucketPrefetchBytes = 0
	recs := scenario.Generate(scenario.Options{Keys: 8_000, Seed: 21})
	for i, r := range recs {
		r.Offset = int64(i)
	}
	fp := filter.Params{Capacity: 2048, PageBytes: 256}
	for _, tc := range []struct {
		name string
		opts Options
	}{
		{"default", Options{}},
		{"staged with aborts", Options{Staged: true}},
		{"window and refresh", Options{Filter: filter.Params{Window: 2 * time.Second, Generations: 4}, Refresh: true}},
		{"occurrence limit", Options{MaxOccurrences: 3}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			type result struct {
				decisions  []Decision
				meta       []byte
				pages      map[filter.PageID][]byte
				prefetched uint64
			}
			run := func(prefetch bool) result {
				db := openDB(t, "", store.Options{PageBytes: 256, CacheBytes: 8 * 256, FlushBytes: 4 << 20})
				opts := tc.opts
				opts.Filter.Capacity, opts.Filter.PageBytes = fp.Capacity, fp.PageBytes
				opts.HashSeed = filter.Seed{K0: 21, K1: 22}
				p := openPartition(t, db, "in", 0, opts, nil)
				defer p.Close()
				rng := rand.New(rand.NewPCG(7, 8))
				var res result
				for i := 0; i < len(recs); {
					poll := recs[i:min(i+1+rng.IntN(400), len(recs))]
					if prefetch {
						before := p.state.CacheMisses()
						if err := p.Prefetch(poll); err != nil {
							t.Fatal(err)
						}
						res.prefetched += p.state.CacheMisses() - before
					}
					var ds []Decision
					for _, r := range poll {
						d, err := p.Decide(r)
						if err != nil {
							t.Fatal(err)
						}
						ds = append(ds, d)
					}
					if opts.Staged && rng.IntN(4) == 0 {
						if err := p.DiscardStaged(); err != nil {
							t.Fatal(err)
						}
						continue // the same poll comes again
					}
					if err := p.CommitStaged(); err != nil {
						t.Fatal(err)
					}
					res.decisions = append(res.decisions, ds...)
					i += len(poll)
					if rng.IntN(3) == 0 {
						if err := p.Commit(store.Checkpoint{Offset: int64(i)}); err != nil {
							t.Fatal(err)
						}
					}
				}
				if err := p.Commit(store.Checkpoint{Offset: int64(len(recs))}); err != nil {
					t.Fatal(err)
				}
				res.meta, res.pages = snapshot(t, p)
				return res
			}
			want, got := run(false), run(true)
			if got.prefetched == 0 {
				t.Fatal("Prefetch read no page: the test exercises nothing")
			}
			if len(got.decisions) != len(want.decisions) {
				t.Fatalf("%d decisions with Prefetch, %d without", len(got.decisions), len(want.decisions))
			}
			for i := range want.decisions {
				if got.decisions[i] != want.decisions[i] {
					t.Fatalf("record %d: %v with Prefetch, %v without", i, got.decisions[i], want.decisions[i])
				}
			}
			if !bytes.Equal(got.meta, want.meta) {
				t.Fatal("chain metadata differs with Prefetch")
			}
			if len(got.pages) != len(want.pages) {
				t.Fatalf("%d pages with Prefetch, %d without", len(got.pages), len(want.pages))
			}
			for id, pg := range want.pages {
				if !bytes.Equal(got.pages[id], pg) {
					t.Fatalf("page %+v differs with Prefetch", id)
				}
			}
			t.Logf("%d pages, %d read by Prefetch", len(want.pages), got.prefetched)
		})
	}
}

// coldPartition returns a partition holding keys "old-0".."old-(n-1)"
// committed, reopened so that none of its pages is cached, over a cache of
// cachePages pages of 1 KiB, with room for many more keys in its one
// sub-filter.
func coldPartition(t *testing.T, n, cachePages int) (*store.DB, *Deduplicator) {
	t.Helper()
	db := openDB(t, "", store.Options{PageBytes: 1024, CacheBytes: int64(cachePages) << 10, FlushBytes: 4 << 20})
	opts := Options{Filter: filter.Params{Capacity: 200_000, PageBytes: 1024}, HashSeed: filter.Seed{K0: 3, K1: 4}}
	p := openPartition(t, db, "in", 0, opts, nil)
	for i := range n {
		if _, err := p.Decide(&kgo.Record{Key: fmt.Appendf(nil, "old-%d", i), Value: []byte("v"), Offset: int64(i)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Commit(store.Checkpoint{Offset: int64(n)}); err != nil {
		t.Fatal(err)
	}
	p.Close()
	p = openPartition(t, db, "in", 0, opts, nil)
	t.Cleanup(p.Close)
	return db, p
}

// poll is n records from offset: new keys, repeats of held keys and
// tombstones of held keys, in turn.
func poll(offset int64, n int) []*kgo.Record {
	var recs []*kgo.Record
	for i := range n {
		r := &kgo.Record{Value: []byte("v"), Offset: offset + int64(i)}
		switch i % 3 {
		case 0:
			r.Key = fmt.Appendf(nil, "new-%d", i)
		case 1:
			r.Key = fmt.Appendf(nil, "old-%d", i)
		case 2:
			r.Key, r.Value = fmt.Appendf(nil, "old-%d", i+1000), nil
		}
		recs = append(recs, r)
	}
	return recs
}

// TestPrefetchedPollReadsNothing: after Prefetch of a poll whose pages fit
// in the cache, deciding it reads no page from Badger; without Prefetch the
// same poll over the same state does.
func TestPrefetchedPollReadsNothing(t *testing.T) {
	for _, prefetch := range []bool{true, false} {
		t.Run(fmt.Sprintf("prefetch=%t", prefetch), func(t *testing.T) {
			_, p := coldPartition(t, 20_000, 1024)
			recs := poll(20_000, 150) // at most 150 pages of the 196: fit in one part
			if limit := p.state.PrefetchLimit(); limit < 150 {
				t.Fatalf("PrefetchLimit %d: the poll does not fit in one part", limit)
			}
			if prefetch {
				if err := p.Prefetch(recs); err != nil {
					t.Fatal(err)
				}
				if p.state.CacheMisses() == 0 {
					t.Fatal("Prefetch read nothing")
				}
			}
			before := p.state.CacheMisses()
			for _, r := range recs {
				if _, err := p.Decide(r); err != nil {
					t.Fatal(err)
				}
			}
			misses := p.state.CacheMisses() - before
			switch {
			case prefetch && misses != 0:
				t.Errorf("deciding the prefetched poll read %d pages from Badger, want 0", misses)
			case !prefetch && misses == 0:
				t.Error("deciding the poll without Prefetch read nothing from Badger: the state is not cold")
			}
		})
	}
}

// TestPrefetchInParts: a poll needing more pages than one Prefetch reads is
// prefetched in parts, each when Decide reaches its first record; every
// other Decide reads nothing from Badger.
func TestPrefetchInParts(t *testing.T) {
	_, p := coldPartition(t, 20_000, 128) // PrefetchLimit 64 pages
	recs := poll(20_000, 300)
	if err := p.Prefetch(recs); err != nil {
		t.Fatal(err)
	}
	if p.ahead.end == 0 || p.ahead.end >= len(recs) {
		t.Fatalf("the first part ends at record %d of %d", p.ahead.end, len(recs))
	}
	parts := 1
	for i, r := range recs {
		boundary := p.ahead.recs != nil && i == p.ahead.end
		before := p.state.CacheMisses()
		if _, err := p.Decide(r); err != nil {
			t.Fatal(err)
		}
		if boundary {
			parts++
			continue
		}
		if m := p.state.CacheMisses() - before; m != 0 {
			t.Fatalf("record %d, inside a part, read %d pages from Badger", i, m)
		}
	}
	if parts < 3 {
		t.Errorf("%d parts, want at least 3 for 300 records over 64-page parts", parts)
	}
	if p.ahead.recs != nil {
		t.Error("the poll's records are held after its last part")
	}
}

// TestPrefetchSkippedWhileCached: Prefetch reads nothing and holds nothing
// after a poll that read no page from Badger, and prefetches again after
// one that did.
func TestPrefetchSkippedWhileCached(t *testing.T) {
	_, p := coldPartition(t, 2_000, 1024) // 196 pages: all fit in the cache
	decide := func(recs []*kgo.Record) {
		t.Helper()
		for _, r := range recs {
			if _, err := p.Decide(r); err != nil {
				t.Fatal(err)
			}
		}
	}
	keys := func(prefix string, from, n int) []*kgo.Record {
		var recs []*kgo.Record
		for i := range n {
			recs = append(recs, &kgo.Record{Key: fmt.Appendf(nil, "%s-%d", prefix, from+i), Value: []byte("v"), Offset: int64(from + i)})
		}
		return recs
	}
	// The first poll prefetches: nothing is cached.
	first := keys("old", 0, 2000)
	if err := p.Prefetch(first); err != nil {
		t.Fatal(err)
	}
	decide(first)
	// The second runs, since the first read pages; it finds all cached.
	before := p.state.CacheMisses()
	if err := p.Prefetch(keys("old", 0, 10)); err != nil {
		t.Fatal(err)
	}
	decide(keys("old", 0, 10))
	if p.state.CacheMisses() != before {
		t.Fatal("the second poll read pages: the state does not fit in the cache")
	}
	// The third is skipped: nothing was read since the second began.
	third := keys("old", 0, 10)
	if err := p.Prefetch(third); err != nil {
		t.Fatal(err)
	}
	if p.ahead.recs != nil {
		t.Error("Prefetch after a poll without cache misses holds the poll")
	}
	// A poll that misses (its partition's cache dropped) re-enables it.
	p.state.Discard()
	decide(third)
	if err := p.Prefetch(keys("old", 10, 10)); err != nil {
		t.Fatal(err)
	}
	if p.state.CacheMisses() == before {
		t.Fatal("the state was not re-read after Discard")
	}
	after := p.state.CacheMisses()
	if err := p.Prefetch(keys("old", 500, 500)); err != nil {
		t.Fatal(err)
	}
	if p.state.CacheMisses() == after {
		t.Error("Prefetch after a poll with cache misses read nothing")
	}
}
