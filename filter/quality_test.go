package filter

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

// TestTightenedFPRUnderTarget grows a chain 512 times past its initial
// capacity with never-repeated keys at several target rates, through the
// in-place doublings of its first sub-filter to a second, one bit wider,
// and measures the false-positive rate on keys never inserted. The
// measured rate must be at most the target plus a statistical margin of
// three standard deviations of a binomial count at the target rate
// (3*sqrt(target/queries)), and the estimate at most the target.
func TestTightenedFPRUnderTarget(t *testing.T) {
	const capacity = 512
	for _, tc := range []struct {
		target  float64
		queries int
	}{{1e-2, 100_000}, {1e-3, 300_000}, {1e-4, 1_000_000}} {
		t.Run(fmt.Sprintf("target=%g", tc.target), func(t *testing.T) {
			p := Params{TargetFPR: tc.target, Capacity: capacity}
			c, _ := newMem(t, p)
			// On to a tenth more keys than the first sub-filter took.
			for i, end := 0, math.MaxInt; i < end; i++ {
				if _, err := c.Insert(key("k", i)); err != nil {
					t.Fatal(err)
				}
				if len(c.subs) == 2 && end == math.MaxInt {
					end = i + i/10
				}
			}
			rate := measuredFPR(t, c, tc.queries)
			margin := 3 * math.Sqrt(tc.target/float64(tc.queries))
			st := c.Stats()
			widths := []int{}
			for _, sf := range c.SubFilters() {
				widths = append(widths, sf.FingerprintBits)
			}
			t.Logf("target %g: %d sub-filters, widths %v, measured FPR %.3g (estimate %.3g, margin %.2g)",
				tc.target, st.SubFilters, widths, rate, st.EstimatedFPR, margin)
			if st.SubFilters < 2 || widths[1] != widths[0]+1 {
				t.Fatalf("%d sub-filters of widths %v: the chain did not grow past its first sub-filter", st.SubFilters, widths)
			}
			if rate > tc.target+margin {
				t.Errorf("measured FPR %.3g > target %g + margin %.2g", rate, tc.target, margin)
			}
			if st.EstimatedFPR > tc.target {
				t.Errorf("estimated FPR %.3g > target %g", st.EstimatedFPR, tc.target)
			}
		})
	}
}

// TestDecisionsIndependentOfPageSizeAndBatching is metamorphic: one stream
// of inserts and deletes, run with 32-bit fingerprints over pages of 512,
// 1024 and 4096 bytes and with the changes staged in an Overlay committed
// every 1, 97 or 5000 operations, gives the same decisions in every run,
// and they are the exact model's (a 32-bit false positive in 200k lookups
// has a probability of about 1e-3 per run; the seed is fixed).
func TestDecisionsIndependentOfPageSizeAndBatching(t *testing.T) {
	rng := rand.New(rand.NewPCG(21, 22))
	type op struct {
		del bool
		k   []byte
	}
	ops := make([]op, 200_000)
	for i := range ops {
		ops[i] = op{del: rng.IntN(6) == 0, k: key("k", rng.IntN(60_000))}
	}
	model := map[string]bool{}
	want := make([]bool, len(ops))
	for i, o := range ops {
		if o.del {
			want[i] = model[string(o.k)]
			delete(model, string(o.k))
		} else {
			want[i] = !model[string(o.k)]
			model[string(o.k)] = true
		}
	}
	for _, pageBytes := range []int{512, 1024, 4096} {
		for _, batch := range []int{1, 97, 5000} {
			t.Run(fmt.Sprintf("page=%d batch=%d", pageBytes, batch), func(t *testing.T) {
				ov := NewOverlay(NewMemPager(pageBytes))
				c, err := New(Params{FingerprintBits: 32, Capacity: 8192, PageBytes: pageBytes}, ov)
				if err != nil {
					t.Fatal(err)
				}
				for i, o := range ops {
					var got bool
					if o.del {
						got, err = c.Delete(o.k)
					} else {
						got, err = c.Insert(o.k)
					}
					if err != nil {
						t.Fatal(err)
					}
					if got != want[i] {
						t.Fatalf("op %d (delete=%v %s): got %v, the model says %v", i, o.del, o.k, got, want[i])
					}
					if (i+1)%batch == 0 {
						if err := ov.Commit(); err != nil {
							t.Fatal(err)
						}
					}
				}
			})
		}
	}
}

// TestNearFull: a chain whose next sub-filters would need fingerprints
// wider than 32 bits to keep its target reports NearFull; a young chain
// does not.
func TestNearFull(t *testing.T) {
	young, _ := newMem(t, Params{TargetFPR: 1e-4, Capacity: 64, PageBytes: 512})
	if young.Stats().NearFull {
		t.Fatal("a new chain reports near full")
	}
	// A target of 1e-6 with b=8 starts at 29 bits: 30, 31, 32, then the
	// width cannot grow.
	c, _ := newMem(t, Params{TargetFPR: 1e-6, BucketSize: 8, Capacity: 64, PageBytes: 512, Expansion: 1})
	for i := 0; !c.Stats().NearFull; i++ {
		if i > 2_000_000 {
			t.Fatalf("never near full; %d sub-filters", c.Stats().SubFilters)
		}
		if _, err := c.Insert(key("k", i)); err != nil {
			t.Fatal(err)
		}
	}
	st := c.Stats()
	if st.NewestFingerprintBits < MaxFingerprintBits-1 {
		t.Fatalf("near full at %d-bit fingerprints, %d sub-filters", st.NewestFingerprintBits, st.SubFilters)
	}
	t.Logf("near full after %d sub-filters, newest %d bits, estimated FPR %.3g", st.SubFilters, st.NewestFingerprintBits, st.EstimatedFPR)
}

// TestClampedWidthsStillGrow: a target so low that the widths clamp at 28
// bits (1e-9 with a window of 8 generations, whose tag takes 4 of a slot's
// 32, as TestChangedParamsRefused configures a worker) cannot keep the
// sub-filters' shares; the chain must grow as one of fixed widths, not
// append a sub-filter for every few keys until it is full.
func TestClampedWidthsStillGrow(t *testing.T) {
	c, _ := newMem(t, Params{TargetFPR: 1e-9, Capacity: 2000, Window: 1000 * time.Hour})
	for i := range 20_000 {
		if _, err := c.InsertAt(key("k", i), 0); err != nil {
			t.Fatalf("key %d: %v", i, err)
		}
	}
	if st := c.Stats(); st.SubFilters != 1 || st.NewestFingerprintBits != MaxFingerprintBits-4 {
		t.Fatalf("%d sub-filters of %d bits after 10x the capacity, want one of %d", st.SubFilters, st.NewestFingerprintBits, MaxFingerprintBits-4)
	}
}
