package dedup

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kdedup/kdedup/filter"
	"github.com/kdedup/kdedup/store"
)

func TestRebuildsFromWindow(t *testing.T) {
	window := filter.Params{Window: time.Minute}
	for _, tc := range []struct {
		opts Options
		want bool
	}{
		{Options{Filter: window, Refresh: true}, true},
		{Options{Filter: window, Refresh: true, MaxOccurrences: 1}, true},
		{Options{Filter: window, Refresh: true, MaxOccurrences: 2}, false},
		{Options{Filter: window}, false},
		{Options{Refresh: true}, false},
		{Options{}, false},
	} {
		got := tc.opts.RebuildsFromWindow()
		from, ok := tc.opts.RebuildFrom(90_000)
		if got != tc.want || ok != tc.want {
			t.Errorf("window %s, refresh %t, max %d: RebuildsFromWindow = %t, RebuildFrom ok = %t; want %t",
				tc.opts.Filter.Window, tc.opts.Refresh, tc.opts.MaxOccurrences, got, ok, tc.want)
		}
		// 8 generations of 7.5 s: the watermark 90 s is in generation 12,
		// 4 is the oldest live, and the rebuild starts at generation 3.
		if ok && from != 22_500 {
			t.Errorf("RebuildFrom(90000) = %d, want 22500", from)
		}
	}
}

// TestRebuildFromWindowDecidesAsTheWholeInput is the rule RebuildFrom
// states, checked on decisions: a partition that decided a stream from
// its start (the exact model here: it saw everything) and one rebuilt at
// an offset by replaying only from the first record timestamped at or
// after RebuildFrom(watermark) (as a consumer finds it with timestamp
// lookups) decide every record after that offset alike, with refresh and
// a limit of 1. Timestamps are out of order by up to a span. Without
// refresh, where RebuildsFromWindow is false, the same rebuild decides
// some record differently: the rule is what makes the shortcut safe.
// 29-bit fingerprints keep false positives out; the seeds are fixed.
func TestRebuildFromWindowDecidesAsTheWholeInput(t *testing.T) {
	const (
		window   = 4 * time.Second
		records  = 30_000
		keySpace = 2_000
		topic    = "events"
	)
	fp := filter.Params{FingerprintBits: 29, Capacity: 512, PageBytes: 512, Window: window, Generations: 4}
	span := fp.SpanMillis()
	rng := rand.New(rand.NewPCG(5, 8))
	recs := make([]*kgo.Record, records)
	ts := int64(1_750_000_000_000)
	for i := range recs {
		ts += rng.Int64N(2) // 0.5 ms a record: 15 s in all
		rts := ts
		if rng.IntN(10) == 0 {
			rts -= rng.Int64N(span)
		}
		r := keyModes["key"].render(streamKind(rng), fmt.Sprintf("user-%d", rng.IntN(keySpace)))
		r.Topic, r.Offset, r.Timestamp = topic, int64(i), time.UnixMilli(rts)
		recs[i] = r
	}
	for _, refresh := range []bool{true, false} {
		t.Run(fmt.Sprintf("refresh=%t", refresh), func(t *testing.T) {
			opts := Options{Filter: fp, Refresh: refresh, HashSeed: filter.Seed{K0: 1, K1: 2}}
			differ := 0
			for _, cut := range []int{18_000, 25_000} {
				db := openDB(t, "", store.Options{PageBytes: 512, CacheBytes: 64 * 512})
				whole := openPartition(t, db, topic, 0, opts, nil)
				rebuilt := openPartition(t, db, topic, 1, opts, nil)
				watermark := int64(-1 << 63)
				for _, r := range recs[:cut] {
					watermark = max(watermark, r.Timestamp.UnixMilli())
					if _, err := whole.Decide(r); err != nil {
						t.Fatal(err)
					}
				}
				start, ok := opts.RebuildFrom(watermark)
				if ok != refresh {
					t.Fatalf("RebuildFrom ok = %t with refresh %t", ok, refresh)
				}
				if !ok { // what a rebuild from the window start would do, were it allowed
					start = fp.GenerationStart(fp.OldestLive(watermark) - 1)
				}
				from := 0
				for from < cut && recs[from].Timestamp.UnixMilli() < start {
					from++
				}
				if from == 0 || from == cut {
					t.Fatalf("cut %d: the rebuild replays from offset %d: not a shortcut", cut, from)
				}
				for _, r := range recs[from:cut] {
					if err := rebuilt.Replay(r); err != nil {
						t.Fatal(err)
					}
				}
				for _, r := range recs[cut:] {
					want, err := whole.Decide(r)
					if err != nil {
						t.Fatal(err)
					}
					got, err := rebuilt.Decide(r)
					if err != nil {
						t.Fatal(err)
					}
					if got != want {
						if refresh {
							t.Fatalf("cut %d, rebuilt from offset %d: offset %d (ts %d) decided %v, the whole input %v", cut, from, r.Offset, r.Timestamp.UnixMilli(), got, want)
						}
						differ++
					}
				}
				whole.Close()
				rebuilt.Close()
			}
			if !refresh && differ == 0 {
				t.Fatal("without refresh a rebuild from the window start decided every record alike: the test does not tell the rules apart")
			}
			t.Logf("%d decisions differ", differ)
		})
	}
}
