package store

import (
	"math/rand/v2"
	"testing"

	"github.com/kdedup/kdedup/filter"
)

// TestDirtyPageBytesRandomized checks DirtyPageBytes and its peak against
// a model (the set of dirty pages of each partition, and the pages staged
// for it) over random writes, commits, discards, drops, staged counts,
// closes and reopens of three partitions of one DB.
func TestDirtyPageBytesRandomized(t *testing.T) {
	const pb = 64
	db := openT(t, Options{InMemory: true, PageBytes: pb, FlushBytes: smallFlush, CacheBytes: 4 * pb})
	ids := universe(3, 8)
	rng := rand.New(rand.NewPCG(3, 4))
	parts := make([]*PartitionState, 3)
	model := make([]map[filter.PageID]bool, 3)
	staged := make([]int, 3)
	for i := range parts {
		parts[i] = partitionT(t, db, "events", int32(i))
		model[i] = map[filter.PageID]bool{}
	}
	var peak int64
	for step := range 3000 {
		i := rng.IntN(len(parts))
		p := parts[i]
		switch r := rng.IntN(100); {
		case r < 60:
			id := ids[rng.IntN(len(ids))]
			write(t, p, id, pageBytes(pb, id, uint64(step)))
			if !model[i][id] && staged[i] > 0 {
				staged[i]-- // a staged page applied
			}
			model[i][id] = true
		case r < 75:
			if err := p.Commit([]byte("meta"), Checkpoint{Offset: int64(step)}); err != nil {
				t.Fatalf("step %d: %v", step, err)
			}
			clear(model[i])
		case r < 82:
			p.Discard()
			clear(model[i])
		case r < 86:
			staged[i] = rng.IntN(5)
			p.SetStagedPages(staged[i])
		case r < 90:
			sub := uint32(rng.IntN(3))
			p.Drop(sub)
			for id := range model[i] {
				if id.SubFilter == sub {
					delete(model[i], id)
				}
			}
		default:
			p.Close()
			clear(model[i])
			staged[i] = 0
			var err error
			if parts[i], err = db.Partition("events", int32(i)); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(parts[i].Close)
		}
		var want int64
		for j, m := range model {
			want += int64(len(m)+staged[j]) * pb
		}
		peak = max(peak, want)
		if got := db.DirtyPageBytes(); got != want {
			t.Fatalf("step %d: DirtyPageBytes = %d, model %d", step, got, want)
		}
		if got := db.DirtyPageBytesPeak(); got != peak {
			t.Fatalf("step %d: DirtyPageBytesPeak = %d, model %d", step, got, peak)
		}
	}
}

// TestMemoryBytesFollowsFlushBytes: the estimate holds three memtable
// arenas, the block cache and eleven table builders each large enough for a
// memtable, so it grows with FlushBytes and is the same for the zero
// Options as for the defaults.
func TestMemoryBytesFollowsFlushBytes(t *testing.T) {
	def := Options{}.MemoryBytes()
	if got := (Options{PageBytes: DefaultPageBytes, FlushBytes: DefaultFlushBytes}).MemoryBytes(); got != def {
		t.Errorf("defaults spelt out: %d, zero Options %d", got, def)
	}
	size, _ := batchLimits(DefaultPageBytes, DefaultFlushBytes, DefaultPageBytes)
	if mt := memTableBytes(size); def < (numMemtables+1+badgerAllocatorPool+builderInFlight)*mt+blockCacheBytes {
		t.Errorf("MemoryBytes = %d, less than three memtables and eleven builders of %d and the block cache", def, mt)
	}
	big := Options{FlushBytes: 64 << 20}.MemoryBytes()
	if big <= def {
		t.Errorf("FlushBytes 64MiB: %d, not more than at the default (%d)", big, def)
	}
}

// TestOverDirtyShareBoundsTheDB drives eight partitions as a worker does,
// a write then the check, each partition cutting its write batch when
// OverDirtyShare says so and every one of them at each "flush interval"
// (every 10,000 writes); two of them are busy, three take a write now and
// then, three only at the start. The DB's dirty pages must stay under
// 1.5 x bound plus a page per partition at every step, and cuts must not
// come before the bound is reached nor below MinCutPages. With a bound of
// 8 partitions x MinCutPages pages or less, a partition's share is under
// MinCutPages and the floor decides: partitions then hold up to
// MinCutPages each.
func TestOverDirtyShareBoundsTheDB(t *testing.T) {
	const (
		pb = 64
		n  = 8
	)
	for _, tc := range []struct {
		name         string
		bound, limit int64
	}{
		{"share above the floor", 8 * n * MinCutPages * pb, 12*n*MinCutPages*pb + n*pb},
		{"floor above the share", 2 * MinCutPages * pb, (n*MinCutPages + n) * pb},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db := openT(t, Options{InMemory: true, PageBytes: pb, FlushBytes: 1 << 20, CacheBytes: 16 * pb})
			parts := make([]*PartitionState, n)
			for i := range parts {
				parts[i] = partitionT(t, db, "events", int32(i))
			}
			rng := rand.New(rand.NewPCG(5, 6))
			next := make([]uint32, n)
			var cuts int
			for step := range 60000 {
				var i int
				switch r := rng.IntN(100); {
				case step < 8*MinCutPages:
					i = step % n // every partition holds some dirty pages early on
				case r < 90:
					i = rng.IntN(2)
				default:
					i = 2 + rng.IntN(3)
				}
				p := parts[i]
				id := filter.PageID{SubFilter: 0, Page: next[i] % 8192}
				next[i]++
				write(t, p, id, pageBytes(pb, id, uint64(step)))
				before := db.DirtyPageBytes()
				if p.OverDirtyShare(tc.bound) {
					if before < tc.bound {
						t.Fatalf("step %d: a cut asked for at %d dirty bytes, under the bound %d", step, before, tc.bound)
					}
					if p.DirtyPages() < MinCutPages {
						t.Fatalf("step %d: a cut asked for at %d dirty pages, under MinCutPages", step, p.DirtyPages())
					}
					if err := p.Commit(nil, Checkpoint{Offset: int64(step)}); err != nil {
						t.Fatal(err)
					}
					cuts++
				}
				if step%10000 == 9999 {
					for _, q := range parts {
						if err := q.Commit(nil, Checkpoint{Offset: int64(step)}); err != nil {
							t.Fatal(err)
						}
					}
				}
				if before > tc.limit {
					t.Fatalf("step %d: %d dirty bytes, over the limit %d (bound %d)", step, before, tc.limit, tc.bound)
				}
			}
			if cuts == 0 {
				t.Fatal("no partition was asked to cut: the bound was never reached, the test proves nothing")
			}
			t.Logf("%d cuts; peak %d dirty bytes, bound %d, limit %d", cuts, db.DirtyPageBytesPeak(), tc.bound, tc.limit)
		})
	}
}
