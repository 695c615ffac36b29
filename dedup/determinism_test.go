package dedup

import (
	"bytes"
	"math/rand/v2"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kdedup/kdedup/filter"
	"github.com/kdedup/kdedup/internal/scenario"
	"github.com/kdedup/kdedup/store"
)

// TestStateIsAFunctionOfInput processes one stream with different write
// batchings, with and without staging, and with staged transactions that
// abort and are redone (as an aborted Kafka transaction rewinds the input):
// every run ends with byte-identical chain metadata and pages. Recovery by
// replay depends on this: replaying the input rebuilds exactly the state a
// worker that never stopped would hold.
func TestStateIsAFunctionOfInput(t *testing.T) {
	recs := scenario.Generate(scenario.Options{Keys: 20_000, Seed: 11})
	for i, r := range recs {
		r.Offset = int64(i)
	}
	fp := filter.Params{Capacity: 2048, PageBytes: 1024} // 16-bit, expands several times
	type run struct {
		name   string
		staged bool
		// next returns the size of the next batch and whether it aborts.
		next func(rng *rand.Rand) (n int, abort bool)
	}
	runs := []run{
		{"write batch every 1000", false, func(*rand.Rand) (int, bool) { return 1000, false }},
		{"write batch every 37", false, func(*rand.Rand) (int, bool) { return 37, false }},
		{"random batches", false, func(rng *rand.Rand) (int, bool) { return 1 + rng.IntN(3000), false }},
		{"staged, a third of transactions abort", true, func(rng *rand.Rand) (int, bool) { return 1 + rng.IntN(2000), rng.IntN(3) == 0 }},
	}
	var wantMeta []byte
	var wantPages map[filter.PageID][]byte
	for _, rn := range runs {
		t.Run(rn.name, func(t *testing.T) {
			db := openDB(t, "", store.Options{PageBytes: 1024, CacheBytes: 64 << 10, FlushBytes: 4 << 20})
			// One seed for every run: state is a function of the seed and
			// the input (a new partition draws a secret one).
			p := openPartition(t, db, "in", 0, Options{Filter: fp, Staged: rn.staged, HashSeed: filter.Seed{K0: 11, K1: 12}}, nil)
			defer p.Close()
			rng := rand.New(rand.NewPCG(5, uint64(len(rn.name))))
			aborts := 0
			for i := 0; i < len(recs); {
				n, abort := rn.next(rng)
				batch := recs[i:min(i+n, len(recs))]
				decideAll(t, p, batch)
				if abort {
					aborts++
					if err := p.DiscardStaged(); err != nil {
						t.Fatal(err)
					}
					continue // the input rewinds: the same batch comes again
				}
				if err := p.CommitStaged(); err != nil {
					t.Fatal(err)
				}
				i += len(batch)
				if err := p.Commit(store.Checkpoint{Offset: int64(i)}); err != nil {
					t.Fatal(err)
				}
			}
			meta, pages := snapshot(t, p)
			t.Logf("%d sub-filters, %d pages, %d aborted transactions", len(p.chain.SubFilters()), len(pages), aborts)
			if rn.staged && aborts == 0 {
				t.Fatal("no transaction aborted")
			}
			if wantMeta == nil {
				wantMeta, wantPages = meta, pages
				return
			}
			if !bytes.Equal(meta, wantMeta) {
				t.Fatal("chain metadata differs from the first run's")
			}
			if len(pages) != len(wantPages) {
				t.Fatalf("%d pages, first run %d", len(pages), len(wantPages))
			}
			for id, pg := range pages {
				if !bytes.Equal(pg, wantPages[id]) {
					t.Fatalf("page %+v differs from the first run's", id)
				}
			}
		})
	}
}

func decideAll(t *testing.T, p *Deduplicator, recs []*kgo.Record) {
	t.Helper()
	for _, r := range recs {
		if _, err := p.Decide(r); err != nil {
			t.Fatal(err)
		}
	}
}

// snapshot returns the committed metadata and every page of the chain as
// read back through the store.
func snapshot(t *testing.T, p *Deduplicator) ([]byte, map[filter.PageID][]byte) {
	t.Helper()
	meta := bytes.Clone(p.state.Meta())
	pages := map[filter.PageID][]byte{}
	for s, sf := range p.chain.SubFilters() {
		for pg := range sf.Pages {
			id := filter.PageID{SubFilter: uint32(s), Page: uint32(pg)}
			b, err := p.state.Page(id)
			if err != nil {
				t.Fatal(err)
			}
			pages[id] = bytes.Clone(b)
		}
	}
	return meta, pages
}
