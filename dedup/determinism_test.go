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
// batchings, with and without staging, with staged transactions that
// abort and are redone (as an aborted Kafka transaction rewinds the input),
// and with the delivery mode switched (the state reopened staged, then not)
// twice: every run decides each record as the first run does (counting
// the transactions that committed) and ends with byte-identical chain
// metadata and pages.
// Recovery by replay depends on this: replaying the input rebuilds exactly
// the state a worker that never stopped would hold; and a state written
// at-least-once is the state exactly-once would have written, and the
// other way round, so KDEDUP_DELIVERY may change over a state.
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
		// switches, when set, reopens the state with staged flipped after
		// the write batch that passes each third of the stream.
		switches bool
	}
	runs := []run{
		{"write batch every 1000", false, func(*rand.Rand) (int, bool) { return 1000, false }, false},
		{"write batch every 37", false, func(*rand.Rand) (int, bool) { return 37, false }, false},
		{"random batches", false, func(rng *rand.Rand) (int, bool) { return 1 + rng.IntN(3000), false }, false},
		{"staged, a third of transactions abort", true, func(rng *rand.Rand) (int, bool) { return 1 + rng.IntN(2000), rng.IntN(3) == 0 }, false},
		{"at-least-once, exactly-once, at-least-once", false, func(rng *rand.Rand) (int, bool) { return 1 + rng.IntN(2000), rng.IntN(3) == 0 }, true},
	}
	var wantMeta []byte
	var wantPages map[filter.PageID][]byte
	var wantDecided []Decision
	for _, rn := range runs {
		t.Run(rn.name, func(t *testing.T) {
			db := openDB(t, "", store.Options{PageBytes: 1024, CacheBytes: 64 << 10, FlushBytes: 4 << 20})
			// One seed for every run: state is a function of the seed and
			// the input (a new partition draws a secret one).
			staged := rn.staged
			p := openPartition(t, db, "in", 0, Options{Filter: fp, Staged: staged, HashSeed: filter.Seed{K0: 11, K1: 12}}, nil)
			defer func() { p.Close() }()
			rng := rand.New(rand.NewPCG(5, uint64(len(rn.name))))
			aborts, switched := 0, 0
			var decided []Decision // of the transactions that committed
			for i := 0; i < len(recs); {
				if rn.switches && i >= (switched+1)*len(recs)/3 && switched < 2 {
					// A restart with the other KDEDUP_DELIVERY: at least
					// once nothing is staged, so aborts are for the staged.
					p.Close()
					staged = !staged
					switched++
					p = openPartition(t, db, "in", 0, Options{Filter: fp, Staged: staged}, nil)
				}
				n, abort := rn.next(rng)
				abort = abort && staged
				batch := recs[i:min(i+n, len(recs))]
				ds := decideAll(t, p, batch)
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
				decided = append(decided, ds...)
				if err := p.Commit(store.Checkpoint{Offset: int64(i)}); err != nil {
					t.Fatal(err)
				}
			}
			meta, pages := snapshot(t, p)
			t.Logf("%d sub-filters, %d pages, %d aborted transactions", len(p.chain.SubFilters()), len(pages), aborts)
			if (rn.staged || rn.switches) && aborts == 0 {
				t.Fatal("no transaction aborted")
			}
			if rn.switches && switched != 2 {
				t.Fatalf("delivery switched %d times, want 2", switched)
			}
			if wantMeta == nil {
				wantMeta, wantPages, wantDecided = meta, pages, decided
				return
			}
			if len(decided) != len(wantDecided) {
				t.Fatalf("%d decisions, first run %d", len(decided), len(wantDecided))
			}
			for off, d := range decided {
				if d != wantDecided[off] {
					t.Fatalf("offset %d decided %v, %v in the first run", off, d, wantDecided[off])
				}
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

func decideAll(t *testing.T, p *Deduplicator, recs []*kgo.Record) []Decision {
	t.Helper()
	ds := make([]Decision, len(recs))
	for i, r := range recs {
		d, err := p.Decide(r)
		if err != nil {
			t.Fatal(err)
		}
		ds[i] = d
	}
	return ds
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
