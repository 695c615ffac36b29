package filter

import (
	"bytes"
	"math/rand/v2"
	"testing"
)

// TestOverlayCommitDiscard runs rounds of random operations through an
// Overlay, committing some rounds and discarding others, next to a chain on
// a plain MemPager that sees only the committed rounds. After every round
// the base pages and metadata equal the reference's: a discarded round
// leaves no trace, a committed one is applied exactly, and only modified
// pages become dirty in the base.
func TestOverlayCommitDiscard(t *testing.T) {
	p := Params{FingerprintBits: 32, Capacity: 1024, PageBytes: 512, MaxKicks: 50}
	base := NewMemPager(512)
	ov := NewOverlay(base)
	staged, err := NewWithSeed(p, testSeed, ov)
	if err != nil {
		t.Fatal(err)
	}
	refPager := NewMemPager(512)
	ref, err := NewWithSeed(p, testSeed, refPager)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(3, 4))
	type op struct {
		del bool
		k   []byte
	}
	for round := range 300 {
		var ops []op
		for range rng.IntN(200) {
			ops = append(ops, op{del: rng.IntN(5) == 0, k: key("k", rng.IntN(5000))})
		}
		meta := staged.MarshalMeta()
		apply := func(c *Chain) {
			for _, o := range ops {
				var err error
				if o.del {
					_, err = c.Delete(o.k)
				} else {
					_, err = c.Insert(o.k)
				}
				if err != nil {
					t.Fatal(err)
				}
			}
		}
		apply(staged)
		modified := ov.Modified()
		if rng.IntN(3) == 0 {
			ov.Discard()
			if staged, err = Open(meta, p, ov); err != nil {
				t.Fatal(err)
			}
		} else {
			base.TakeDirty()
			if err := ov.Commit(); err != nil {
				t.Fatal(err)
			}
			if d := base.TakeDirty(); len(d) != modified {
				t.Fatalf("round %d: commit dirtied %d base pages, %d were modified", round, len(d), modified)
			}
			apply(ref)
		}
		if !bytes.Equal(staged.MarshalMeta(), ref.MarshalMeta()) {
			t.Fatalf("round %d: metadata differs from the reference", round)
		}
		for id, pg := range refPager.Pages() {
			got, _ := base.Page(id)
			if !bytes.Equal(got, pg) {
				t.Fatalf("round %d: base page %+v differs from the reference", round, id)
			}
		}
	}
	if !grown(staged) {
		t.Fatalf("the test must cross a split; %d sub-filters of %d pages", staged.Stats().SubFilters, staged.subs[0].Pages)
	}
}
