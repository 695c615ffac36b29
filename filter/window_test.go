package filter

import (
	"errors"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// windowModel is the exact model of a windowed chain: the generation each
// remembered key lives in, and the watermark. A key is remembered while its
// generation is at least floor(watermark/span) - G.
type windowModel struct {
	span, g   int64
	watermark int64
	gen       map[string]int64
}

func newWindowModel(p Params) *windowModel {
	p = p.WithDefaults()
	return &windowModel{span: p.spanMillis(), g: int64(p.Generations), watermark: -1 << 63, gen: map[string]int64{}}
}

func (m *windowModel) advance(ts int64) { m.watermark = max(m.watermark, ts) }

func (m *windowModel) oldest() int64 { return floorDiv(m.watermark, m.span) - m.g }

func (m *windowModel) genOf(ts int64) int64 { return max(floorDiv(ts, m.span), m.oldest()) }

func (m *windowModel) contains(k string) bool {
	g, ok := m.gen[k]
	return ok && g >= m.oldest()
}

func (m *windowModel) insert(k string, ts int64) bool {
	m.advance(ts)
	if m.contains(k) {
		return false
	}
	m.gen[k] = m.genOf(ts)
	return true
}

func (m *windowModel) refresh(k string, ts int64) {
	m.advance(ts)
	if m.contains(k) && m.gen[k] < m.genOf(ts) {
		m.gen[k] = m.genOf(ts)
	}
}

// TestWindowExpiry drives a windowed chain with a controlled timestamp
// sequence (mostly increasing, some out of order, some older than the
// window, some refreshes and deletes) and checks every answer against the
// exact model, and the bounds the window promises: a key is remembered while
// the watermark is less than a window past its timestamp and forgotten once
// it is a window plus one span past it. 32-bit fingerprints keep false
// positives out of the comparison (about 2e-9 per sub-filter per lookup;
// the seed is fixed, so a collision would fail every run, not some).
func TestWindowExpiry(t *testing.T) {
	const window = 8 * time.Second
	for _, refresh := range []bool{false, true} {
		p := Params{FingerprintBits: 32, Capacity: 300, PageBytes: 256, Window: window, Generations: 4}
		span := p.WithDefaults().spanMillis()
		c, pager := newMem(t, p)
		m := newWindowModel(p)
		rng := rand.New(rand.NewPCG(1, 2))
		first := map[string]int64{} // key -> timestamp it was inserted at
		ts := int64(1_700_000_000_000)
		maxLive := 0
		for i := range 60_000 {
			ts += rng.Int64N(4) // 1.5 ms per record on average: 90 s in all
			rts := ts
			switch r := rng.IntN(100); {
			case r < 10:
				rts = ts - rng.Int64N(3*span) // out of order, usually inside the window
			case r < 12:
				rts = ts - window.Milliseconds() - rng.Int64N(3*span) // older than the window
			}
			k := string(key("k", rng.IntN(20_000)))
			if got, want := must(c.InsertAt([]byte(k), rts)), m.insert(k, rts); got != want {
				t.Fatalf("record %d: InsertAt(%q, %d) = %v, model %v (watermark %d)", i, k, rts, got, want, m.watermark)
			} else if got {
				first[k] = rts
			}
			if refresh && rng.IntN(4) == 0 {
				k := string(key("k", rng.IntN(20_000)))
				if _, err := c.Refresh([]byte(k), rts); err != nil {
					t.Fatal(err)
				}
				m.refresh(k, rts)
			}
			if rng.IntN(50) == 0 {
				k := string(key("k", rng.IntN(20_000)))
				found := must(c.Delete([]byte(k)))
				if found != m.contains(k) {
					t.Fatalf("record %d: Delete(%q) found %v, model %v", i, k, found, m.contains(k))
				}
				delete(m.gen, k)
			}
			maxLive = max(maxLive, c.Stats().Generations)
			if i%1000 != 999 {
				continue
			}
			for j := range 20_000 {
				k := string(key("k", j))
				if got, want := must(c.Contains([]byte(k))), m.contains(k); got != want {
					t.Fatalf("after record %d: Contains(%q) = %v, model %v", i, k, got, want)
				}
				// The promise, for keys inserted in the generation of their
				// own timestamp and never refreshed.
				at, ok := first[k]
				if !ok || refresh || m.gen[k] != floorDiv(at, span) {
					continue
				}
				if m.watermark < at+window.Milliseconds() && !m.contains(k) {
					t.Fatalf("key %q of timestamp %d forgotten at watermark %d, before the window ended", k, at, m.watermark)
				}
				if m.watermark >= at+window.Milliseconds()+span && m.contains(k) {
					t.Fatalf("key %q of timestamp %d remembered at watermark %d, past window + span", k, at, m.watermark)
				}
			}
		}
		if s := c.Stats(); s.Generations > p.WithDefaults().Generations+1 || maxLive > p.WithDefaults().Generations+1 {
			t.Fatalf("%d live generations now, %d at most, want at most G+1 = %d", s.Generations, maxLive, p.WithDefaults().Generations+1)
		}
		// Dropped generations left no page behind.
		live := map[uint32]bool{}
		for _, sf := range c.SubFilters() {
			live[sf.ID] = true
		}
		for id := range pager.Pages() {
			if !live[id.SubFilter] {
				t.Fatalf("page %d of dropped sub-filter %d still in the pager", id.Page, id.SubFilter)
			}
		}
	}
}

// TestWindowRefreshSlides checks sliding expiry on one key: re-seen just
// before its window ends, it lives another window; not re-seen, it goes.
func TestWindowRefreshSlides(t *testing.T) {
	p := Params{FingerprintBits: 32, Capacity: 1000, PageBytes: 512, Window: 10 * time.Second, Generations: 10}
	c, _ := newMem(t, p)
	k, other := []byte("k"), []byte("other")
	if !must(c.InsertAt(k, 0)) {
		t.Fatal("first insert reported a duplicate")
	}
	if must(c.InsertAt(k, 9_000)) {
		t.Fatal("insert inside the window was not a duplicate")
	}
	if !must(c.Refresh(k, 9_000)) {
		t.Fatal("Refresh did not move the key to a newer generation")
	}
	if must(c.Refresh(k, 9_500)) {
		t.Fatal("Refresh moved a key already in the generation of its timestamp")
	}
	must(c.InsertAt(other, 18_000)) // watermark 18 s: generation 0 is gone
	if !must(c.Contains(k)) {
		t.Fatal("refreshed key forgotten within a window of its refresh")
	}
	if n := must(c.Count(k)); n != 1 {
		t.Fatalf("refresh left %d copies, want 1", n)
	}
	must(c.InsertAt(other, 20_000)) // a window past the refresh, in the next span
	if must(c.Contains(k)) {
		t.Fatal("refreshed key remembered more than window + span past its refresh")
	}
}

// TestWindowReopenKeepsIDsUnique checks that the metadata keeps the
// watermark and the ID counter: after generations expire and the chain is
// reopened, new sub-filters never reuse an ID (pages of a dropped ID may
// still be waiting to be deleted).
func TestWindowReopenKeepsIDsUnique(t *testing.T) {
	p := Params{FingerprintBits: 16, Capacity: 100, PageBytes: 256, Window: time.Second, Generations: 2}
	c, pager := newMem(t, p)
	used := map[uint32]bool{}
	for i := range 5000 {
		if _, err := c.InsertAt(key("k", i), int64(i)); err != nil {
			t.Fatal(err)
		}
		if i%700 == 0 {
			meta := c.MarshalMeta()
			re, err := Open(meta, p, pager)
			if err != nil {
				t.Fatal(err)
			}
			if stateOf(re.Stats()) != stateOf(c.Stats()) {
				t.Fatalf("stats %+v after reopen, %+v before", re.Stats(), c.Stats())
			}
			c = re
		}
		for _, sf := range c.SubFilters() {
			used[sf.ID] = true
		}
	}
	if s := c.Stats(); s.Watermark != 4999 || s.Generations != 3 {
		t.Fatalf("watermark %d with %d generations, want 4999 and 3", s.Watermark, s.Generations)
	}
	ids := map[uint32]bool{}
	for _, sf := range c.SubFilters() {
		if ids[sf.ID] {
			t.Fatalf("ID %d used twice", sf.ID)
		}
		ids[sf.ID] = true
	}
	if len(used) <= len(ids) {
		t.Fatalf("%d IDs ever used, %d live: no generation expired", len(used), len(ids))
	}
	for id := range used {
		if id >= c.nextID {
			t.Fatalf("ID %d at or past the next ID %d", id, c.nextID)
		}
	}
}

// TestOverlayDropFollowsCommit checks that a generation dropped inside a
// staged round reaches the base Pager only when the round commits.
func TestOverlayDropFollowsCommit(t *testing.T) {
	p := Params{FingerprintBits: 16, Capacity: 100, PageBytes: 256, Window: time.Second, Generations: 1}
	base := NewMemPager(256)
	c, err := New(p, base)
	if err != nil {
		t.Fatal(err)
	}
	must(c.InsertAt([]byte("old"), 0))
	ov := NewOverlay(base)
	stable := c.MarshalMeta()
	staged, err := Open(stable, p, ov)
	if err != nil {
		t.Fatal(err)
	}
	must(staged.InsertAt([]byte("new"), 5_000)) // drops generation 0
	if must(staged.Contains([]byte("old"))) {
		t.Fatal("expired key still present in the staged chain")
	}
	ov.Discard()
	if len(base.Pages()) == 0 {
		t.Fatal("Discard let the drop reach the base")
	}
	restored, err := Open(stable, p, ov)
	if err != nil {
		t.Fatal(err)
	}
	if !must(restored.Contains([]byte("old"))) {
		t.Fatal("key lost after the aborted round")
	}
	must(restored.InsertAt([]byte("new"), 5_000))
	if err := ov.Commit(); err != nil {
		t.Fatal(err)
	}
	for id := range base.Pages() {
		if id.SubFilter == 0 {
			t.Fatalf("page %d of the dropped sub-filter survived the commit", id.Page)
		}
	}
}

func TestWindowParams(t *testing.T) {
	for _, tc := range []struct {
		p    Params
		want string
	}{
		{Params{Window: -time.Second}, "Window"},
		{Params{Window: time.Hour, Generations: 65}, "Generations"},
		{Params{Window: 3 * time.Millisecond, Generations: 4}, "Window"},
	} {
		if err := tc.p.WithDefaults().Validate(); !slices.Equal(problemFields(err), []string{tc.want}) {
			t.Errorf("Validate(%s) = %v, want one problem, naming %s", tc.p, err, tc.want)
		}
	}
	if g := (Params{Window: time.Hour}).WithDefaults().Generations; g != DefaultGenerations {
		t.Errorf("default generations %d, want %d", g, DefaultGenerations)
	}
	// Each of the G+1 live generations gets TargetFPR/(G+1).
	plain, windowed := Params{}.WithDefaults(), Params{Window: time.Hour}.WithDefaults()
	for i := range 3 {
		budget := windowed.TargetFPR / 9 / float64(int64(2)<<i)
		// 2b(MaxDepth+2)/2^f: the rate of a sub-filter grown in place to
		// its deepest (SubFilterBits).
		if f := windowed.SubFilterBits(i); ExpectedFPR(4, f, MaxDepth+2) > budget || ExpectedFPR(4, f-1, MaxDepth+2) <= budget {
			t.Errorf("sub-filter %d: %d bits is not the narrowest width under the budget %g", i, f, budget)
		}
		if windowed.SubFilterBits(i) <= plain.SubFilterBits(i) {
			t.Errorf("sub-filter %d: windowed width %d not above the plain %d", i, windowed.SubFilterBits(i), plain.SubFilterBits(i))
		}
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// TestRefreshIntoAFullGenerationKeepsTheCopy: when the generation a copy
// would move to is full (MaxSubFilters sub-filters, reachable with
// Expansion 1), Refresh returns ErrFull and the copy stays where it was:
// the key is still remembered, on its former schedule.
func TestRefreshIntoAFullGenerationKeepsTheCopy(t *testing.T) {
	p := Params{FingerprintBits: 16, Capacity: 1, PageBytes: 256, MaxKicks: 1, Expansion: 1, Window: time.Second, Generations: 1}
	c, _ := newMem(t, p)
	old := make([][]byte, 300)
	for i := range old {
		old[i] = key("old", i)
		if _, err := c.InsertAt(old[i], 0); err != nil {
			t.Fatal(err)
		}
	}
	for i, full := 0, 0; full < 200; i++ {
		_, err := c.InsertAt(key("new", i), 1000)
		if errors.Is(err, ErrFull) {
			full++
		} else if err != nil {
			t.Fatal(err)
		}
	}
	items := c.Stats().Items
	refused := 0
	for _, k := range old {
		moved, err := c.Refresh(k, 1000)
		switch {
		case errors.Is(err, ErrFull):
			refused++
			if moved {
				t.Fatalf("%s: Refresh reports a move with ErrFull", k)
			}
			locs, err := c.Locate(k)
			if err != nil || len(locs) != 1 || locs[0].SubFilter.Generation != 0 || locs[0].Copies != 1 {
				t.Fatalf("%s: after ErrFull its copies are %+v, %v; want one in generation 0", k, locs, err)
			}
		case err != nil:
			t.Fatal(err)
		}
		if ok, err := c.Contains(k); err != nil || !ok {
			t.Fatalf("%s: Contains = %v, %v after Refresh", k, ok, err)
		}
	}
	if refused == 0 {
		t.Fatal("no Refresh met the full generation")
	}
	if got := c.Stats().Items; got != items {
		t.Fatalf("%d items after the refreshes, %d before", got, items)
	}
}
