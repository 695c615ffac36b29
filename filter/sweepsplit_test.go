package filter

import (
	"testing"
	"time"
)

// TestSweepFollowsSplits: a page split off after the sweep read its
// parent in a pass (here a chain of one root page, read in the pass's
// first block) takes entries that were live then, up to G generations
// old; the sweep must read it with its parent in the next pass, P
// generations later, or those entries live to see their tag come back
// and expired keys are reported present again. The sweep reads a root
// page and every page split from it together.
func TestSweepFollowsSplits(t *testing.T) {
	const span = 1000
	p := Params{FingerprintBits: 28, Capacity: 1, PageBytes: 256, Window: 8 * span * time.Millisecond} // G = 8, t = 4, P = 7
	c, _ := newMem(t, p)
	const g0 = 700 // a pass starts at generation g0 (g0 mod 7 = 0)
	start := int64(g0 * span)
	must(c.Advance(start))
	must(c.Advance(start + span/2)) // block 0 reads page 0: the cursor is past the last page
	old := start + span/2 - 8*span  // generation g0-8, the oldest live
	var keys [][]byte
	for i := 0; c.subs[0].Pages == 1; i++ {
		k := key("old", i)
		if !must(c.InsertAt(k, old)) {
			t.Fatalf("%s: duplicate", k)
		}
		keys = append(keys, k)
	}
	t.Logf("%d keys of generation %d; page 0 split at generation %d; sweep cursor %d/%d", len(keys), g0-8, g0, c.sweepSub, c.sweepRoot)
	// Generation g0-8 expires at g0+1; its tag is the newest's again at g0+8.
	for gen := int64(g0 + 1); gen <= g0+8; gen++ {
		must(c.Advance(gen * span))
		present := 0
		for _, k := range keys {
			if must(c.Contains(k)) {
				present++
			}
		}
		if present > 0 {
			t.Errorf("generation %d (keys of %d expired at %d): %d of %d expired keys present, %d live items counted", gen, g0-8, g0+1, present, len(keys), c.Stats().Items)
		}
	}
}
