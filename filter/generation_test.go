package filter

import (
	"fmt"
	"slices"
	"testing"
	"time"
)

// TestGenerationArithmetic checks SpanMillis, Generation, GenerationStart
// and OldestLive against a brute-force model that walks the timeline one
// millisecond at a time from a generation boundary known by construction,
// counting generations as it crosses every span-th millisecond: no
// division, so a rounding mistake (towards zero instead of down, before
// the epoch) cannot hide in the model too. Spans that do not divide the
// window, negative timestamps (-1 is a record without one) and the default
// generation count are covered.
func TestGenerationArithmetic(t *testing.T) {
	for _, tc := range []struct {
		p    Params
		span int64 // what the documentation promises
	}{
		{Params{Window: 8 * time.Second}, 1000}, // default 8 generations
		{Params{Window: time.Second, Generations: 7}, 142},
		{Params{Window: 10 * time.Millisecond, Generations: 10}, 1},
		{Params{Window: 3*time.Millisecond + 999*time.Microsecond, Generations: 3}, 1},
		{Params{Window: time.Minute, Generations: 64}, 937},
	} {
		t.Run(fmt.Sprintf("%s/%d", tc.p.Window, tc.p.Generations), func(t *testing.T) {
			p := tc.p
			g := int64(p.WithDefaults().Generations)
			if got := p.SpanMillis(); got != tc.span {
				t.Fatalf("SpanMillis = %d, want %d", got, tc.span)
			}
			// The walk starts at the start of generation -k, which lies k
			// spans before the epoch.
			k := 3*g + 2
			from, to := -k*tc.span, (k+1)*tc.span+3
			gen, left := -k, tc.span // left: milliseconds until the next generation
			for ts := from; ts < to; ts++ {
				if got := p.Generation(ts); got != gen {
					t.Fatalf("Generation(%d) = %d, want %d", ts, got, gen)
				}
				if left == tc.span { // the first millisecond of gen
					if got := p.GenerationStart(gen); got != ts {
						t.Fatalf("GenerationStart(%d) = %d, want %d", gen, got, ts)
					}
				}
				if got := p.OldestLive(ts); got != gen-g {
					t.Fatalf("OldestLive(%d) = %d, want %d (%d generations live)", ts, got, gen-g, g+1)
				}
				if left--; left == 0 {
					gen, left = gen+1, tc.span
				}
			}
		})
	}
	t.Run("no window", func(t *testing.T) {
		var p Params
		for _, ts := range []int64{-1 << 40, -1, 0, 1, 1 << 40} {
			if p.SpanMillis() != 0 || p.Generation(ts) != 0 || p.OldestLive(ts) != 0 || p.GenerationStart(ts) != 0 {
				t.Fatalf("at %d: span %d, generation %d, oldest live %d, start %d; want all 0 without a window",
					ts, p.SpanMillis(), p.Generation(ts), p.OldestLive(ts), p.GenerationStart(ts))
			}
		}
	})
}

// TestGenerationArithmeticIsTheChains ties the exported arithmetic to what
// a chain does: a key inserted at ts lands in Generation(ts), or in
// OldestLive(watermark) when that is later, and after the watermark moves
// no sub-filter older than OldestLive(watermark) is left.
func TestGenerationArithmeticIsTheChains(t *testing.T) {
	p := Params{Window: time.Second, Generations: 4, Capacity: 64, PageBytes: 256, FingerprintBits: 29}
	c, err := NewWithSeed(p, Seed{K0: 3, K1: 4}, NewMemPager(256))
	if err != nil {
		t.Fatal(err)
	}
	watermark := int64(-1 << 62)
	for i, ts := range []int64{-1, 0, 249, 250, 1200, 300, 999, 1999, 2000, 10, 5000, 4751, 4749, 4000, 9999, -1} {
		added, err := c.InsertAt([]byte(fmt.Sprint("k", i)), ts)
		if err != nil || !added {
			t.Fatalf("InsertAt(k%d, %d) = %v, %v; want a new key", i, ts, added, err)
		}
		watermark = max(watermark, ts)
		want := max(p.Generation(ts), p.OldestLive(watermark))
		locs, err := c.Locate([]byte(fmt.Sprint("k", i)))
		if err != nil || len(locs) != 1 || !slices.Equal(locs[0].Generations, []int64{want}) || locs[0].Copies != 1 {
			t.Fatalf("record at %d (watermark %d): key located in %+v (%v), want one copy in generation %d", ts, watermark, locs, err, want)
		}
	}
}
