package filter

import (
	"errors"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// TestParamsDiff: each difference a stored state can have from the
// configuration is listed once, by its Param, with both values; fields the
// state does not depend on are left out, so that restoring each listed
// value opens the state.
func TestParamsDiff(t *testing.T) {
	base := Params{Capacity: 1000, PageBytes: 512}
	for _, tc := range []struct {
		name               string
		stored, configured Params
		want               []ParamDiff
	}{
		{"same", base, base, nil},
		{"defaults spelled out", Params{}, Params{TargetFPR: 1e-4, BucketSize: 4, Capacity: 1_000_000, MaxKicks: 500, Expansion: 2, PageBytes: 4096}, nil},
		{"capacity", base, Params{Capacity: 2000, PageBytes: 512}, []ParamDiff{{ParamCapacity, "1000", "2000"}}},
		{"page bytes and key", base, Params{Capacity: 1000, PageBytes: 1024, KeySpec: "json:id"},
			[]ParamDiff{{ParamPageBytes, "512", "1024"}, {ParamKeySpec, `""`, `"json:id"`}}},
		{"every field", Params{TargetFPR: 0.01, BucketSize: 2, Capacity: 10, MaxKicks: 5, Expansion: 3, PageBytes: 1024, Window: time.Hour, Generations: 4, KeySpec: "key"},
			Params{TargetFPR: 0.02, BucketSize: 8, Capacity: 20, MaxKicks: 6, Expansion: 4, PageBytes: 2048, Window: 2 * time.Hour, Generations: 5, KeySpec: "header:id"},
			[]ParamDiff{{ParamTargetFPR, "0.01", "0.02"}, {ParamBucketSize, "2", "8"}, {ParamCapacity, "10", "20"}, {ParamMaxKicks, "5", "6"},
				{ParamExpansion, "3", "4"}, {ParamPageBytes, "1024", "2048"}, {ParamWindow, "1h0m0s", "2h0m0s"}, {ParamGenerations, "4", "5"},
				{ParamKeySpec, `"key"`, `"header:id"`}}},
		// A fixed width replaces the rate: only the width is to restore.
		{"fingerprint bits set", base, Params{Capacity: 1000, PageBytes: 512, FingerprintBits: 16}, []ParamDiff{{ParamFingerprintBits, "0", "16"}}},
		{"fingerprint bits unset", Params{Capacity: 1000, PageBytes: 512, FingerprintBits: 16}, Params{Capacity: 1000, PageBytes: 512, TargetFPR: 0.5},
			[]ParamDiff{{ParamFingerprintBits, "16", "0"}}},
		// The rate the state was written with is still to restore once the
		// fixed width goes.
		{"fingerprint bits set, rate changed", base, Params{Capacity: 1000, PageBytes: 512, FingerprintBits: 16, TargetFPR: 0.001},
			[]ParamDiff{{ParamTargetFPR, "0.0001", "0.001"}, {ParamFingerprintBits, "0", "16"}}},
		{"rate ignored with fixed widths", Params{Capacity: 1000, PageBytes: 512, FingerprintBits: 16, TargetFPR: 0.1}, Params{Capacity: 1000, PageBytes: 512, FingerprintBits: 16, TargetFPR: 0.2}, nil},
		// Generations mean nothing without a window.
		{"window set", base, Params{Capacity: 1000, PageBytes: 512, Window: time.Hour, Generations: 4}, []ParamDiff{{ParamWindow, "0s", "1h0m0s"}}},
		{"window unset", Params{Capacity: 1000, PageBytes: 512, Window: time.Hour, Generations: 4}, base, []ParamDiff{{ParamWindow, "1h0m0s", "0s"}}},
		{"generations without a window", base, Params{Capacity: 1000, PageBytes: 512, Generations: 4}, nil},
		{"generations", Params{Capacity: 1000, PageBytes: 512, Window: time.Hour}, Params{Capacity: 1000, PageBytes: 512, Window: time.Hour, Generations: 4},
			[]ParamDiff{{ParamGenerations, "8", "4"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.stored.Diff(tc.configured); !slices.Equal(got, tc.want) {
				t.Errorf("Diff = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestParamsDiffRandomized cross-checks Diff with the equality Open
// refuses on, over random pairs of Params that differ in a few fields:
// Diff is empty exactly when the two are equal after defaults, lists each
// Param at most once, in AllParams order, with distinct values.
func TestParamsDiffRandomized(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 9))
	random := func() Params {
		return Params{
			TargetFPR:       []float64{0, 1e-4, 1e-3}[rng.IntN(3)],
			FingerprintBits: []int{0, 0, 16}[rng.IntN(3)],
			BucketSize:      []int{0, 4, 8}[rng.IntN(3)],
			Capacity:        []uint64{0, 1000}[rng.IntN(2)],
			MaxKicks:        []int{0, 500, 100}[rng.IntN(3)],
			Expansion:       []int{0, 2, 1}[rng.IntN(3)],
			PageBytes:       []int{0, 4096, 512}[rng.IntN(3)],
			Window:          []time.Duration{0, time.Hour, time.Minute}[rng.IntN(3)],
			Generations:     []int{0, 8, 4}[rng.IntN(3)],
			KeySpec:         []string{"", "json:id"}[rng.IntN(2)],
		}
	}
	differing := 0
	for range 20_000 {
		stored, configured := random(), random()
		diffs := stored.Diff(configured)
		equal := stored.WithDefaults() == configured.WithDefaults()
		if equal != (len(diffs) == 0) {
			t.Fatalf("stored %s, configured %s: equal %v, Diff %v", stored.WithDefaults(), configured.WithDefaults(), equal, diffs)
		}
		if !equal {
			differing++
		}
		order := AllParams()
		for i, d := range diffs {
			if d.Stored == d.Configured {
				t.Fatalf("Diff %v lists an equal value", diffs)
			}
			j := slices.Index(order, d.Param)
			if j < 0 || (i > 0 && j <= slices.Index(order, diffs[i-1].Param)) {
				t.Fatalf("Diff %v is not in AllParams order", diffs)
			}
		}
	}
	if differing < 10_000 {
		t.Fatalf("only %d of 20,000 pairs differ: the generator does not exercise Diff", differing)
	}
}

// TestOpenNamesTheDifferences: Open lists the differences of the Params as
// given, not after defaults: a rate that a fixed width overrides is still
// compared with the rate the state was written with, so that restoring
// every value listed opens the state.
func TestOpenNamesTheDifferences(t *testing.T) {
	stored := Params{Capacity: 1000, PageBytes: 512, TargetFPR: 1e-9}
	c, pager := newMem(t, stored)
	for _, tc := range []struct {
		configured Params
		want       []ParamDiff
	}{
		{Params{Capacity: 1000, PageBytes: 512, TargetFPR: 1e-9, FingerprintBits: 16}, []ParamDiff{{ParamFingerprintBits, "0", "16"}}},
		{Params{Capacity: 1000, PageBytes: 512, TargetFPR: 1e-8, FingerprintBits: 16}, []ParamDiff{{ParamTargetFPR, "1e-09", "1e-08"}, {ParamFingerprintBits, "0", "16"}}},
		{Params{Capacity: 1000, PageBytes: 512, TargetFPR: 1e-9}, nil},
	} {
		_, err := Open(c.MarshalMeta(), tc.configured, pager)
		var perr *ParamsError
		switch {
		case tc.want == nil && err != nil:
			t.Errorf("Open with %+v: %v", tc.configured, err)
		case tc.want != nil && (!errors.As(err, &perr) || !errors.Is(err, ErrParams) || !slices.Equal(perr.Diffs, tc.want)):
			t.Errorf("Open with %+v: %v; want a ParamsError listing %v", tc.configured, err, tc.want)
		}
	}
}
