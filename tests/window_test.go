package tests

import (
	"fmt"
	"math/rand/v2"
	"os"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kdedup/kdedup/internal/scenario"
)

// windowStream is 6,000 records over 30 s of record time (5 ms apart, one
// in ten up to 1.5 s out of order) of 800 keys chosen at random, so that a
// key recurs on average every 4 s (inside a 6 s window) and sometimes after
// more than window + span (forwarded again), with 1% tombstones.
func windowStream(seed uint64) []*kgo.Record {
	rng := rand.New(rand.NewPCG(seed, 1))
	recs := make([]*kgo.Record, 6000)
	for i := range recs {
		ts := scenario.Base.Add(time.Duration(i) * 5 * time.Millisecond)
		if rng.IntN(10) == 0 {
			ts = ts.Add(-time.Duration(rng.IntN(1500)) * time.Millisecond)
		}
		r := &kgo.Record{Key: fmt.Appendf(nil, "k%d", rng.IntN(800)), Value: fmt.Appendf(nil, "v%d", i), Timestamp: ts}
		if rng.IntN(100) == 0 {
			r.Value = nil
		}
		recs[i] = r
	}
	return recs
}

// TestWindow runs the worker with KDEDUP_WINDOW=6s over 3 generations,
// with and without refresh, in both delivery modes, over two partitions
// (each has its own watermark). Between the two parts of the stream the data
// directory is wiped: the worker rebuilds each partition from the start of
// its window, not from the beginning, and the whole output equals the
// exact model (internal/scenario), which forgets a key when its generation
// leaves the window.
func TestWindow(t *testing.T) {
	deliveries(t, func(t *testing.T, delivery string) {
		for _, refresh := range []bool{false, true} {
			t.Run(map[bool]string{false: "fixed", true: "refresh"}[refresh], func(t *testing.T) {
				p := newPipeline(t, 2)
				p.delivery = delivery
				p.window = scenario.ExpectOptions{Window: 6 * time.Second, Generations: 3, Refresh: refresh}
				recs := windowStream(5)
				part1, part2 := recs[:4000], recs[4000:]
				dir := t.TempDir()
				p.runPart(t, dir, part1)
				if err := os.RemoveAll(dir); err != nil {
					t.Fatal(err)
				}
				w := p.runPart(t, dir, part2)
				want, got := p.output(t, recs)
				requireExact(t, want, got)

				forever := scenario.Expect(recs, true)
				if want.Stats.Forwarded <= forever.Stats.Forwarded || want.Stats.Duplicates == 0 {
					t.Fatalf("the stream does not exercise the window: %d forwarded, %d duplicates; %d forwarded without a window",
						want.Stats.Forwarded, want.Stats.Duplicates, forever.Stats.Forwarded)
				}
				// With refresh the rebuild replays each partition's part one
				// from the first record at or after the start of the
				// generation before the oldest live one (span 2 s, 3
				// generations); without, the state depends on records before
				// the window and the rebuild replays all of part one.
				wantReplayed := 0
				for part := range int32(2) {
					var watermark time.Time
					for _, r := range part1 {
						if r.Partition == part && r.Timestamp.After(watermark) {
							watermark = r.Timestamp
						}
					}
					span := int64(2000)
					start := time.UnixMilli((watermark.UnixMilli()/span - 3 - 1) * span)
					first := int64(-1)
					if !refresh {
						first = 0
					}
					for _, r := range part1 {
						if r.Partition == part && !r.Timestamp.Before(start) && (first < 0 || r.Offset < first) {
							first = r.Offset
						}
					}
					for _, r := range part1 {
						if r.Partition == part && r.Offset >= first {
							wantReplayed++
						}
					}
				}
				if n := w.metric(t, "kdedup_replayed_records_total"); n != float64(wantReplayed) || (refresh == (wantReplayed == len(part1))) {
					t.Errorf("replayed %.0f records, want %d of part one's %d", n, wantReplayed, len(part1))
				}
				if n := w.metric(t, "kdedup_filter_generations_expired_total"); n == 0 {
					t.Error("no generation expired")
				}
				t.Logf("%d forwarded (%d without a window), %d duplicates; rebuild replayed %d of %d", want.Stats.Forwarded,
					forever.Stats.Forwarded, want.Stats.Duplicates, wantReplayed, len(part1))
			})
		}
	})
}
