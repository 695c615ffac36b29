package filter

import (
	"bytes"
	"encoding/binary"
	"errors"
	"maps"
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
// it is a window plus one span past it. 29-bit fingerprints keep false
// positives out of the comparison (about 2e-9 per sub-filter per lookup;
// the seed is fixed, so a collision would fail every run, not some).
//
// With jumps, the watermark also leaps ahead by 2 to 10 spans now and then
// (past 2^GenerationBits = 8 generations at times), as a producer's clock
// skipping ahead would: the sweep must then clear at once what the jump
// expired, or an expired key's tag comes back as live.
func TestWindowExpiry(t *testing.T) {
	const window = 8 * time.Second
	for _, tc := range []struct{ refresh, jumps bool }{{false, false}, {true, false}, {false, true}, {true, true}} {
		refresh := tc.refresh
		p := Params{FingerprintBits: 29, Capacity: 300, PageBytes: 256, Window: window, Generations: 4}
		span := p.WithDefaults().spanMillis()
		c, pager := newMem(t, p)
		m := newWindowModel(p)
		rng := rand.New(rand.NewPCG(1, 2))
		first := map[string]int64{} // key -> timestamp it was inserted at
		ts := int64(1_700_000_000_000)
		maxLive := 0
		for i := range 60_000 {
			ts += rng.Int64N(4) // 1.5 ms per record on average: 90 s in all
			if tc.jumps && rng.IntN(700) == 0 {
				ts += (2 + rng.Int64N(9)) * span
			}
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
	p := Params{FingerprintBits: 28, Capacity: 1000, PageBytes: 512, Window: 10 * time.Second, Generations: 10}
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

// TestWindowReopenIsDeterministic: a windowed chain reopened from its
// metadata every 97 keys (the sweep's cursor, the used generations and
// the entries by generation go with it) ends in exactly the state of one
// never reopened, with the same seed and input: metadata and pages.
func TestWindowReopenIsDeterministic(t *testing.T) {
	p := Params{FingerprintBits: 16, Capacity: 100, PageBytes: 256, Window: time.Second, Generations: 2}
	twin, twinPager := newMem(t, p)
	c, pager := newMem(t, p)
	for i := range 5000 {
		ts := int64(i)
		if i%10 == 3 {
			ts -= 600 // out of order, some older than the window
		}
		for _, x := range []*Chain{c, twin} {
			if _, err := x.InsertAt(key("k", i%1800), ts); err != nil {
				t.Fatal(err)
			}
			if _, err := x.Refresh(key("k", i%900), ts); err != nil {
				t.Fatal(err)
			}
		}
		if i%97 == 0 {
			re, err := Open(c.MarshalMeta(), p, pager)
			if err != nil {
				t.Fatal(err)
			}
			if stateOf(re.Stats()) != stateOf(c.Stats()) {
				t.Fatalf("stats %+v after reopen, %+v before", re.Stats(), c.Stats())
			}
			c = re
		}
	}
	if s := c.Stats(); s.Watermark != 4999 || s.Generations != 3 {
		t.Fatalf("watermark %d with %d generations, want 4999 and 3", s.Watermark, s.Generations)
	}
	if !bytes.Equal(c.MarshalMeta(), twin.MarshalMeta()) {
		t.Fatal("metadata of the reopened chain differs from its twin's")
	}
	if !maps.EqualFunc(pager.Pages(), twinPager.Pages(), bytes.Equal) {
		t.Fatal("pages of the reopened chain differ from its twin's")
	}
}

// TestOverlayDropFollowsCommit checks that a sub-filter dropped inside a
// staged round (it held only keys of a generation that expired) reaches
// the base Pager only when the round commits.
func TestOverlayDropFollowsCommit(t *testing.T) {
	p := Params{FingerprintBits: 16, Capacity: 100, PageBytes: 256, Window: time.Second, Generations: 1}
	base := NewMemPager(256)
	c, err := New(p, base)
	if err != nil {
		t.Fatal(err)
	}
	// A burst fills the first sub-filter and appends a second.
	for i := 0; c.Len() < 2; i++ {
		must(c.InsertAt(key("old", i), 0))
	}
	// The second, the newest, holds a key of a later generation.
	must(c.InsertAt([]byte("later"), 1_500))
	ov := NewOverlay(base)
	stable := c.MarshalMeta()
	staged, err := Open(stable, p, ov)
	if err != nil {
		t.Fatal(err)
	}
	must(staged.InsertAt([]byte("new"), 2_000)) // generation 0 expires: the first sub-filter is empty
	if staged.Len() != 1 || staged.SubFilters()[0].ID != 1 {
		t.Fatalf("sub-filters %+v after generation 0 expired, want the second alone", staged.SubFilters())
	}
	if must(staged.Contains(key("old", 0))) {
		t.Fatal("expired key still present in the staged chain")
	}
	ov.Discard()
	if !slices.ContainsFunc(slices.Collect(maps.Keys(base.Pages())), func(id PageID) bool { return id.SubFilter == 0 }) {
		t.Fatal("Discard let the drop reach the base")
	}
	restored, err := Open(stable, p, ov)
	if err != nil {
		t.Fatal(err)
	}
	if !must(restored.Contains(key("old", 0))) {
		t.Fatal("key lost after the aborted round")
	}
	must(restored.InsertAt([]byte("new"), 2_000))
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
		{Params{Window: time.Hour, FingerprintBits: 29}, "FingerprintBits"},
	} {
		if err := tc.p.WithDefaults().Validate(); !slices.Equal(problemFields(err), []string{tc.want}) {
			t.Errorf("Validate(%s) = %v, want one problem, naming %s", tc.p, err, tc.want)
		}
	}
	if err := (Params{Window: time.Hour, FingerprintBits: 28}).WithDefaults().Validate(); err != nil {
		t.Errorf("28-bit fingerprints and a 4-bit tag: %v", err)
	}
	if g := (Params{Window: time.Hour}).WithDefaults().Generations; g != DefaultGenerations {
		t.Errorf("default generations %d, want %d", g, DefaultGenerations)
	}
	// The tag holds the G+1 live generations and one more: the least t
	// with 2^t >= G+2.
	for g := 1; g <= MaxGenerations; g++ {
		want := 0
		for 1<<want < g+2 {
			want++
		}
		if got := (Params{Window: time.Hour, Generations: g}).GenerationBits(); got != want {
			t.Errorf("%d generations: %d-bit tags, want %d", g, got, want)
		}
	}
	if got := (Params{}).GenerationBits(); got != 0 {
		t.Errorf("no window: %d-bit tags, want none", got)
	}
	// A window keeps the fingerprint widths of the same chain without
	// one; its slots are wider by the tag.
	plain, windowed := Params{}.WithDefaults(), Params{Window: time.Hour}.WithDefaults()
	for i := range 3 {
		if windowed.SubFilterBits(i) != plain.SubFilterBits(i) {
			t.Errorf("sub-filter %d: windowed width %d, plain %d", i, windowed.SubFilterBits(i), plain.SubFilterBits(i))
		}
		if windowed.SlotBits(i) != plain.SlotBits(i)+4 || plain.SlotBits(i) != plain.SubFilterBits(i) {
			t.Errorf("sub-filter %d: slots of %d bits windowed, %d plain", i, windowed.SlotBits(i), plain.SlotBits(i))
		}
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// TestRefreshInAFullChain: Refresh rewrites a copy's generation tag in
// place, so it moves the key even when no key can be placed any more
// (MaxSubFilters sub-filters, reachable with Expansion 1): the key is
// remembered on its new schedule and the number of copies is unchanged.
func TestRefreshInAFullChain(t *testing.T) {
	p := Params{FingerprintBits: 28, Capacity: 1, PageBytes: 256, MaxKicks: 1, Expansion: 1, Window: time.Second, Generations: 1}
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
	for _, k := range old {
		locs := must(c.Locate(k))
		if len(locs) != 1 || locs[0].Copies != 1 {
			t.Fatalf("%s: copies %+v before Refresh, want one", k, locs)
		}
		moved, err := c.Refresh(k, 1000)
		if err != nil || moved != slices.Contains(locs[0].Generations, 0) {
			t.Fatalf("%s: Refresh = %v, %v with its copy in generations %v", k, moved, err, locs[0].Generations)
		}
		if locs := must(c.Locate(k)); len(locs) != 1 || !slices.Equal(locs[0].Generations, []int64{1}) {
			t.Fatalf("%s: after Refresh its copies are %+v; want one in generation 1", k, locs)
		}
	}
	if got := c.Stats().Items; got != items {
		t.Fatalf("%d items after the refreshes, %d before", got, items)
	}
	// Generation 0 expires at 2000; the refreshed keys live on.
	if _, err := c.Advance(2000); err != nil {
		t.Fatal(err)
	}
	for _, k := range old {
		if !must(c.Contains(k)) {
			t.Fatalf("%s: forgotten when generation 0 expired, refreshed into 1", k)
		}
	}
}

// TestSweepPace: the sweep reads each page of the chain once every
// P = 2^GenerationBits - 1 - Generations generations, a block of
// ⌈(b+1)·N/P⌉ - ⌈b·N/P⌉ of the N pages in block b's generation, and no
// other page: at one key a millisecond of record time, the pages read at
// the end of every generation are exactly the model's.
func TestSweepPace(t *testing.T) {
	p := Params{Capacity: 50_000, PageBytes: 512, Window: 8 * time.Second, Generations: 4}
	span := p.WithDefaults().spanMillis()
	c, _ := newMem(t, p)
	pass := int64(1<<p.GenerationBits() - 1 - 4) // 3
	n := c.SubFilters()[0].RootPages
	start := 10 * pass * span // the first generation of a pass
	want := uint64(0)
	for gen := int64(0); gen < 4*pass; gen++ {
		for ms := range span {
			if _, err := c.InsertAt(key("k", int(gen*span+ms)), start+gen*span+ms); err != nil {
				t.Fatal(err)
			}
		}
		// The block of this generation is read by the time the next
		// begins.
		if _, err := c.Advance(start + (gen+1)*span); err != nil {
			t.Fatal(err)
		}
		b, P := uint64(gen%pass), uint64(pass)
		ceil := func(a uint64) uint64 { return (a + P - 1) / P }
		want += ceil((b+1)*n) - ceil(b*n)
		if got := c.Stats().SweptPages; got != want {
			t.Fatalf("generation %d (block %d of %d, %d pages): %d pages swept, want %d", gen, b, pass, n, got, want)
		}
	}
	if s := c.SubFilters(); len(s) != 1 || s[0].Pages != n {
		t.Fatalf("sub-filters %+v: the test needs the root pages alone", s)
	}
	if got := c.Stats().SweptPages; got != 4*n {
		t.Fatalf("%d pages swept over 4 passes of %d pages", got, n)
	}
}

// TestWindowMemoryStable: new keys at a constant rate of record time (one
// a millisecond) through a window of 50,000 for 20 windows: the live keys
// stay between a window's and a window and a span's (G and G+1
// generations: expired keys are no longer counted), the chain stays one
// sub-filter, and its pages stop growing after the first windows: expired
// keys give their slots back.
func TestWindowMemoryStable(t *testing.T) {
	const keys = 50_000
	p := Params{Window: keys * time.Millisecond, Capacity: 1000}
	span := p.WithDefaults().spanMillis()
	c, _ := newMem(t, p)
	var k [8]byte
	var pages uint64
	for i := range 20 * keys {
		binary.LittleEndian.PutUint64(k[:], uint64(i))
		if _, err := c.InsertAt(k[:], int64(i)); err != nil {
			t.Fatal(err)
		}
		if i%keys != keys-1 {
			continue
		}
		s := c.Stats()
		w := i / keys
		if w >= 1 && (s.Items < keys-keys/1000 || s.Items > keys+uint64(span)) {
			t.Fatalf("window %d: %d live keys, want %d to %d", w, s.Items, keys, keys+span)
		}
		if s.SubFilters != 1 {
			t.Fatalf("window %d: %d sub-filters", w, s.SubFilters)
		}
		switch {
		case w == 3:
			pages = s.Bytes
		case w > 3 && s.Bytes != pages:
			t.Fatalf("window %d: %d bytes of pages, %d at window 3", w, s.Bytes, pages)
		}
	}
}

// TestWindowFPRThroughTheCycle: at the default target (1e-4) and a steady
// window of 100,000 keys, at 16 points through two generations' spans
// (the live keys rising from G to G+1 generations' worth and falling
// back as one expires), the chain's estimated false-positive rate and the
// rate observed over 100,000 keys never inserted are both under the
// target.
func TestWindowFPRThroughTheCycle(t *testing.T) {
	const keys = 100_000
	p := Params{Window: keys * time.Millisecond, Capacity: 1000}
	span := p.WithDefaults().spanMillis()
	c, _ := newMem(t, p)
	var k [8]byte
	next := 0
	advanceTo := func(n int) {
		for ; next < n; next++ {
			binary.LittleEndian.PutUint64(k[:], uint64(next))
			if _, err := c.InsertAt(k[:], int64(next)); err != nil {
				t.Fatal(err)
			}
		}
	}
	advanceTo(2 * keys)
	probe := 0
	var maxRate, maxEst float64
	defer func() { t.Logf("highest observed rate %g, highest estimate %g", maxRate, maxEst) }()
	for point := range 16 {
		advanceTo(2*keys + point*int(span)/8)
		st := c.Stats()
		positives := 0
		for range keys {
			binary.LittleEndian.PutUint64(k[:], uint64(1<<40+probe))
			probe++
			if must(c.Contains(k[:])) {
				positives++
			}
		}
		rate := float64(positives) / keys
		maxRate, maxEst = max(maxRate, rate), max(maxEst, st.EstimatedFPR)
		if rate > p.WithDefaults().TargetFPR || st.EstimatedFPR > p.WithDefaults().TargetFPR {
			t.Fatalf("point %d of the cycle (%d live keys): observed rate %g, estimated %g, target %g", point, st.Items, rate, st.EstimatedFPR, p.WithDefaults().TargetFPR)
		}
	}
}

// TestWindowBurstsReuseShares: a trickle of keys with, every 4 windows, a
// burst that overflows the first sub-filter (Expansion 1): the chain
// appends sub-filters for the burst and drops the oldest once their keys
// expired. A new sub-filter takes the least share of the false-positive
// budget no live one has, so that after any number of bursts the shares
// stay below the most sub-filters ever live at once (their widths do not
// creep towards the widest, nor their budgets towards none), and a chain
// of one sub-filter never reports itself near full.
func TestWindowBurstsReuseShares(t *testing.T) {
	const window = 10_000 // ms
	p := Params{Window: window * time.Millisecond, Capacity: 200, PageBytes: 256, Expansion: 1}
	c, _ := newMem(t, p)
	var k [8]byte
	n, ts, most := uint64(0), int64(0), 0
	insert := func() {
		n++
		binary.LittleEndian.PutUint64(k[:], n)
		if _, err := c.InsertAt(k[:], ts); err != nil {
			t.Fatal(err)
		}
		most = max(most, c.Len())
	}
	for round := range 10 {
		for range 120_000 {
			insert()
		}
		for range 4 * window / 10 {
			ts += 10
			insert()
		}
		s := c.Stats()
		for _, sf := range c.subs {
			if sf.share >= most {
				t.Fatalf("burst %d: a sub-filter with share %d of the budget, at most %d sub-filters live at once", round, sf.share, most)
			}
		}
		if s.NearFull && c.Len() == 1 {
			t.Fatalf("burst %d: a chain of one sub-filter holding %d keys reports itself near full", round, s.Items)
		}
	}
	if most < 2 {
		t.Fatal("no burst appended a sub-filter")
	}
}

// TestSubFilterBitsOfAVanishingShare: a share of the budget so small it
// underflows (sub-filter 1100's: ε·2^-1101) gets the widest fingerprints,
// not the narrowest (+Inf converted to an int is the least int).
func TestSubFilterBitsOfAVanishingShare(t *testing.T) {
	for _, p := range []Params{{}, {Window: time.Hour}} {
		p = p.WithDefaults()
		if got, want := p.SubFilterBits(1100), p.maxFingerprintBits(); got != want {
			t.Errorf("%s: SubFilterBits(1100) = %d, want %d", p, got, want)
		}
	}
}
