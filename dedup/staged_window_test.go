package dedup

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kdedup/kdedup/filter"
	"github.com/kdedup/kdedup/store"
)

// TestWindowStagedStateIsTheCommitted decides a windowed stream with
// occurrence limits and refresh in staged rounds of 500 records, a third
// of them aborted and decided again, beside a twin that decides only the
// committed rounds, unstaged: after every commit both chains' metadata
// (watermark, the sweep's cursor, entries by generation, page depths) is
// byte for byte the same. A chain opened again from its metadata after an
// abort must carry on exactly as one that never was.
func TestWindowStagedStateIsTheCommitted(t *testing.T) {
	const window = 4 * time.Second
	const records, keySpace, batchSize, topic = 40_000, 3_000, 500, "orders"
	fp := filter.Params{FingerprintBits: 29, Capacity: 512, PageBytes: 512, Window: window, Generations: 4}
	mk := func(staged bool) *Deduplicator {
		opts := Options{DeleteHeader: deleteHeader, DeleteValue: deleteValue, Filter: fp, MaxOccurrences: 3, Refresh: true, Staged: staged, HashSeed: filter.Seed{K0: 1, K1: 2}}
		db := openDB(t, "", store.Options{PageBytes: 512, CacheBytes: 64 * 512})
		return openPartition(t, db, topic, 0, opts, NewMetrics(prometheus.NewRegistry()))
	}
	p, ref := mk(true), mk(false)
	span := window.Milliseconds() / 4
	rng := rand.New(rand.NewPCG(3, 11))
	ts := int64(1_750_000_000_000)
	round, aborts := 0, 0
	for start := 0; start < records; round++ {
		end := min(start+batchSize, records)
		brng := rand.New(rand.NewPCG(uint64(start), 3))
		bts := ts
		var recs []*kgo.Record
		for off := start; off < end; off++ {
			bts += brng.Int64N(2)
			rts := bts
			switch x := brng.IntN(100); {
			case x < 10:
				rts -= brng.Int64N(2 * span)
			case x < 12:
				rts -= window.Milliseconds() + brng.Int64N(span)
			}
			kind := streamKind(brng)
			k := fmt.Sprintf("user-%d", brng.IntN(keySpace))
			r := keyModes["key"].render(kind, k)
			r.Topic, r.Offset, r.Timestamp = topic, int64(off), time.UnixMilli(rts)
			if _, err := p.Decide(r); err != nil {
				t.Fatal(err)
			}
			recs = append(recs, r)
		}
		if rng.IntN(3) == 0 {
			if err := p.DiscardStaged(); err != nil {
				t.Fatal(err)
			}
			aborts++
			continue
		}
		for _, r := range recs {
			if _, err := ref.Decide(r); err != nil {
				t.Fatal(err)
			}
		}
		if err := p.CommitStaged(); err != nil {
			t.Fatal(err)
		}
		if err := p.Commit(store.Checkpoint{Offset: int64(end)}); err != nil {
			t.Fatal(err)
		}
		if err := ref.Commit(store.Checkpoint{Offset: int64(end)}); err != nil {
			t.Fatal(err)
		}
		a, b := p.chain.MarshalMeta(), ref.chain.MarshalMeta()
		if !bytes.Equal(a, b) {
			i := 0
			for i < len(a) && i < len(b) && a[i] == b[i] {
				i++
			}
			t.Fatalf("round %d: the staged chain's metadata differs from the committed twin's at byte %d of %d/%d: % x, twin % x", round, i, len(a), len(b), a[max(i-8, 0):min(i+16, len(a))], b[max(i-8, 0):min(i+16, len(b))])
		}
		ts, start = bts, end
	}
	if aborts == 0 {
		t.Fatal("no round aborted")
	}
}
