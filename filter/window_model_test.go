package filter

import (
	"bytes"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

// rvModel is an exact model of a windowed chain: single keys (Insert,
// Delete) with one generation each, multi keys (Add, Count, DeleteAll)
// with the generation of each copy. preTS marks entries stored before any
// timestamp (they expire at the first Advance).
type rvModel struct {
	span, g int64
	wm      int64
	single  map[string]int64
	multi   map[string][]int64
}

const preTS = math.MinInt64

func (m *rvModel) oldest() int64 {
	if m.wm == math.MinInt64 {
		return preTS
	}
	return floorDiv(m.wm, m.span) - m.g
}
func (m *rvModel) live(gen int64) bool {
	if gen == preTS {
		return m.wm == math.MinInt64
	}
	return gen >= m.oldest()
}
func (m *rvModel) advance(ts int64) { m.wm = max(m.wm, ts) }
func (m *rvModel) genOf(ts int64) int64 {
	if m.wm == math.MinInt64 {
		return preTS
	}
	return max(floorDiv(ts, m.span), m.oldest())
}
func (m *rvModel) has(k string) bool { g, ok := m.single[k]; return ok && m.live(g) }
func (m *rvModel) count(k string) int {
	n := 0
	for _, g := range m.multi[k] {
		if m.live(g) {
			n++
		}
	}
	return n
}
func (m *rvModel) liveEntries() uint64 {
	n := uint64(0)
	for k := range m.single {
		if m.has(k) {
			n++
		}
	}
	for k := range m.multi {
		n += uint64(m.count(k))
	}
	return n
}
func (m *rvModel) refresh(k string, ts int64, multi bool) {
	m.advance(ts)
	to := m.genOf(ts)
	if !multi {
		if m.has(k) && m.single[k] < to {
			m.single[k] = to
		}
		return
	}
	best := -1
	for i, g := range m.multi[k] {
		if m.live(g) && g < to && (best < 0 || g < m.multi[k][best]) {
			best = i
		}
	}
	if best >= 0 {
		m.multi[k][best] = to
	}
}

// rvCheckCounts scans every page of every sub-filter and compares the live
// entries by generation tag and insertion depth with byTag, Lengths, Items,
// and the model's live entries.
func rvCheckCounts(c *Chain, pager *MemPager, want uint64) error {
	total := uint64(0)
	for si := range c.subs {
		sf := &c.subs[si]
		got := make([][MaxDepth + 1]uint64, len(sf.byTag))
		for p := range uint64(len(sf.depths)) {
			d, ok := sf.Depth(uint32(p))
			if !ok {
				continue
			}
			pg := pager.Peek(PageID{SubFilter: sf.ID, Page: uint32(p)})
			if pg == nil {
				continue
			}
			slots := int(sf.bucketsPerPage) * c.p.BucketSize
			for i := range slots {
				v := get(pg, i*sf.slotBits, sf.slotBits)
				if v == 0 || !sf.gens.live(v>>sf.FingerprintBits) {
					continue
				}
				ins := d - (sf.maxDepth - prefixLen(sf.fingerprint(v), sf.tagBits))
				got[v>>sf.FingerprintBits][max(ins, 0)]++
			}
		}
		var lengths [MaxDepth + 1]uint64
		items := uint64(0)
		for tg := range got {
			if got[tg] != sf.byTag[tg] {
				return fmt.Errorf("sub-filter %d (ID %d): tag %d (age %d): pages hold %v, byTag %v", si, sf.ID, tg, c.gens.age(uint32(tg)), got[tg], sf.byTag[tg])
			}
			for d, n := range got[tg] {
				lengths[d] += n
				items += n
			}
		}
		if lengths != sf.Lengths || items != sf.Items {
			return fmt.Errorf("sub-filter %d: pages hold %d live (%v), Items %d Lengths %v", si, items, lengths, sf.Items, sf.Lengths)
		}
		total += items
	}
	if total != want {
		return fmt.Errorf("chain holds %d live entries, model %d", total, want)
	}
	return nil
}

type rvConfig struct {
	g        int
	spanMS   int64
	base     int64 // first timestamp
	pageB    int
	exp      int
	reopen   int // reopen every n ops (0: never)
	jumps    []int64
	ops      int
	keys     int
	noTS     int // inserts without timestamp before the first record
	minusOn  bool
	capacity uint64
}

func rvRun(t *testing.T, cfg rvConfig, seed uint64) {
	p := Params{Capacity: max(cfg.capacity, 50), PageBytes: cfg.pageB, Expansion: cfg.exp, MaxKicks: 64,
		Window: time.Duration(cfg.spanMS*int64(cfg.g)) * time.Millisecond, Generations: cfg.g}
	p.FingerprintBits = MaxFingerprintBits - p.GenerationBits()
	pager := NewMemPager(cfg.pageB)
	c := must(NewWithSeed(p, testSeed, pager))
	twinPager := NewMemPager(cfg.pageB)
	twin := must(NewWithSeed(p, testSeed, twinPager))
	span := p.WithDefaults().spanMillis()
	if span != cfg.spanMS {
		t.Fatalf("span %d", span)
	}
	m := &rvModel{span: span, g: int64(cfg.g), wm: math.MinInt64, single: map[string]int64{}, multi: map[string][]int64{}}
	rng := rand.New(rand.NewPCG(seed, 7))
	both := func(f func(c *Chain) any) any {
		a, b := f(c), f(twin)
		if fmt.Sprint(a) != fmt.Sprint(b) {
			t.Fatalf("reopened chain answered %v, twin %v", a, b)
		}
		return a
	}
	for i := range cfg.noTS {
		k := fmt.Sprint("s", i)
		added := both(func(c *Chain) any { return must(c.Insert([]byte(k))) }).(bool)
		if !added {
			t.Fatalf("no-ts insert %s dup", k)
		}
		m.single[k] = preTS
	}
	ts := cfg.base
	period := int64(1) << p.GenerationBits()
	lastGen := int64(math.MinInt64)
	for op := range cfg.ops {
		// Timestamp of this record.
		switch r := rng.IntN(1000); {
		case r < 3 && len(cfg.jumps) > 0:
			j := cfg.jumps[rng.IntN(len(cfg.jumps))]
			ts += j * span
		case r < 600:
			ts += rng.Int64N(max(span/16, 1) + 1)
		}
		rts := ts
		switch r := rng.IntN(100); {
		case r < 10:
			rts = ts - rng.Int64N(int64(cfg.g+3)*span) // out of order, some older than the window
		case r < 12 && cfg.minusOn:
			rts = -1
		}
		single := fmt.Sprint("s", rng.IntN(cfg.keys))
		multi := fmt.Sprint("m", rng.IntN(cfg.keys/4))
		switch r := rng.IntN(100); {
		case r < 45:
			got := both(func(c *Chain) any { return must(c.InsertAt([]byte(single), rts)) }).(bool)
			m.advance(rts)
			want := !m.has(single)
			if want {
				m.single[single] = m.genOf(rts)
			}
			if got != want {
				t.Fatalf("op %d: InsertAt(%s, %d) = %v, model %v (wm %d, gen %d, oldest %d)", op, single, rts, got, want, m.wm, m.single[single], m.oldest())
			}
		case r < 55:
			both(func(c *Chain) any { return must(c.Refresh([]byte(single), rts)) })
			m.refresh(single, rts, false)
		case r < 60:
			both(func(c *Chain) any { return must(c.Refresh([]byte(multi), rts)) })
			m.refresh(multi, rts, true)
		case r < 68:
			got := both(func(c *Chain) any { return must(c.Delete([]byte(single))) }).(bool)
			if got != m.has(single) {
				t.Fatalf("op %d: Delete(%s) = %v, model %v", op, single, got, m.has(single))
			}
			delete(m.single, single)
		case r < 80:
			if m.count(multi) < 6 {
				both(func(c *Chain) any { return c.AddAt([]byte(multi), rts) })
				m.advance(rts)
				m.multi[multi] = append(m.multi[multi], m.genOf(rts))
			}
		case r < 85:
			got := both(func(c *Chain) any { return must(c.DeleteAll([]byte(multi))) }).(int)
			if got != m.count(multi) {
				t.Fatalf("op %d: DeleteAll(%s) = %d, model %d", op, multi, got, m.count(multi))
			}
			delete(m.multi, multi)
		case r < 92:
			got := both(func(c *Chain) any { return must(c.Count([]byte(multi))) }).(int)
			if got != m.count(multi) {
				t.Fatalf("op %d: Count(%s) = %d, model %d (gens %v, wm %d oldest %d)", op, multi, got, m.count(multi), m.multi[multi], m.wm, m.oldest())
			}
		case r < 96:
			got := both(func(c *Chain) any { return must(c.Contains([]byte(single))) }).(bool)
			if got != m.has(single) {
				t.Fatalf("op %d: Contains(%s) = %v, model %v", op, single, got, m.has(single))
			}
		default:
			both(func(c *Chain) any { return must(c.Advance(rts)) })
			m.advance(rts)
		}
		if cfg.reopen > 0 && op%cfg.reopen == cfg.reopen-1 {
			re, err := Open(c.MarshalMeta(), p, pager)
			if err != nil {
				t.Fatalf("op %d: reopen: %v", op, err)
			}
			c = re
		}
		gen := int64(math.MinInt64)
		if m.wm != math.MinInt64 {
			gen = floorDiv(m.wm, span)
		}
		if gen != lastGen || op%97 == 0 {
			lastGen = gen
			if err := rvCheckCounts(c, pager, m.liveEntries()); err != nil {
				t.Fatalf("op %d (wm %d, gen %d, gen mod %d = %d): %v", op, m.wm, gen, period, floorMod(gen, period), err)
			}
			if !bytes.Equal(c.MarshalMeta(), twin.MarshalMeta()) {
				t.Fatalf("op %d: metadata of the reopened chain differs from its twin's", op)
			}
		}
	}
	if !maps.EqualFunc(pager.Pages(), twinPager.Pages(), bytes.Equal) {
		t.Fatal("pages of the reopened chain differ from its twin's")
	}
	for k := range m.single {
		if got := must(c.Contains([]byte(k))); got != m.has(k) {
			t.Fatalf("end: Contains(%s) = %v, model %v", k, got, m.has(k))
		}
	}
	t.Logf("end: wm %d, %d subs, %d live, swept %d", m.wm, c.Len(), m.liveEntries(), c.Stats().SweptPages)
}

// TestWindowModel runs a windowed chain against an exact model (rvRun:
// inserts, adds, counts, refreshes, deletes; out-of-order, older than the
// window and untimed records; watermark jumps of 1, 2, P, P+1, 2^t and
// more generations; reopened from its metadata every 13 operations) for
// every tag width, spans of 1 to 100 ms and timestamps around 0 and now.
func TestWindowModel(t *testing.T) {
	for _, g := range []int{1, 2, 6, 7, 8, 14, 30, 64} {
		t2 := int64(1) << (Params{Window: time.Hour, Generations: g}).GenerationBits()
		P := t2 - 1 - int64(g)
		jumps := []int64{1, 2, P, P + 1, t2 - int64(g) - 1, t2, t2 + 1, int64(g), int64(g) + 1, int64(g) + 2, 2 * t2}
		for _, sp := range []int64{1, 3, 64, 100} {
			for _, base := range []int64{0, 1_700_000_000_000, -5000} {
				cfg := rvConfig{g: g, spanMS: sp, base: base, pageB: 256, exp: 1 + int(sp%2), reopen: 13, jumps: jumps, ops: 12000, keys: 1500, noTS: 20, minusOn: true}
				t.Run(fmt.Sprintf("G%d/span%d/base%d", g, sp, base), func(t *testing.T) { rvRun(t, cfg, uint64(g*1000)+uint64(sp)) })
			}
		}
	}
}

// TestWindowModelReopened is TestWindowModel reopened every operation or
// every 7, over small and large key sets.
func TestWindowModelReopened(t *testing.T) {
	for _, g := range []int{1, 6, 7, 8, 14, 20, 64} {
		t2 := int64(1) << (Params{Window: time.Hour, Generations: g}).GenerationBits()
		P := t2 - 1 - int64(g)
		jumps := []int64{1, 2, P, P + 1, t2, t2 + 1, int64(g) + 1, int64(g) + 2}
		for si, sp := range []int64{1, 5} {
			for _, reopen := range []int{1, 7} {
				for _, keys := range []int{300, 6000} {
					cfg := rvConfig{g: g, spanMS: sp, base: 1_700_000_000_000 + int64(si)*12345, pageB: 256, exp: 1 + si%2, reopen: reopen, jumps: jumps, ops: 8000, keys: keys, noTS: 5, minusOn: true}
					t.Run(fmt.Sprintf("G%d/span%d/reopen%d/keys%d", g, sp, reopen, keys), func(t *testing.T) { rvRun(t, cfg, uint64(g*7919)+uint64(sp)*31+uint64(keys)) })
				}
			}
		}
	}
}

// TestWindowModelWorkerSized: rvRun in a configuration kdedup accepts (spans of
// a second, 4 KiB pages) with G = 64 and a small capacity (fewer root pages
// than P = 63).
func TestWindowModelWorkerSized(t *testing.T) {
	for _, c := range []struct {
		g   int
		cap uint64
	}{{64, 5000}, {8, 3000}, {20, 5000}} {
		t2 := int64(1) << (Params{Window: time.Hour, Generations: c.g}).GenerationBits()
		cfg := rvConfig{g: c.g, spanMS: 1000, base: 1_700_000_000_000, pageB: 4096, exp: 2, reopen: 0, jumps: []int64{1, 2, t2}, ops: 50_000, keys: 15_000, capacity: c.cap}
		t.Run(fmt.Sprintf("G%d/cap%d", c.g, c.cap), func(t *testing.T) { rvRun(t, cfg, 99) })
	}
}
