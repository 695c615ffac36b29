package filter

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// testSeed is the hash seed of the chains tests build, so that a test's
// thresholds are met or missed the same way on every run.
var testSeed = Seed{K0: 0x6b646564757074, K1: 0x7365656421}

func newMem(t testing.TB, p Params) (*Chain, *MemPager) {
	t.Helper()
	pager := NewMemPager(p.WithDefaults().PageBytes)
	c, err := NewWithSeed(p, testSeed, pager)
	if err != nil {
		t.Fatal(err)
	}
	return c, pager
}

func key(prefix string, i int) []byte { return strconv.AppendInt([]byte(prefix), int64(i), 10) }

// TestCrossCheckRandomized runs over a million random inserts, adds, deletes
// and lookups against an exact multiset (a Go map) on a chain that starts
// small and expands several times. With 32-bit fingerprints:
//   - no false negatives, ever: a key the model holds is always contained and
//     Count is at least the model's count;
//   - the chain's item count equals the model's total after every operation
//     (every Add stores a fingerprint, every Delete of a held key removes one);
//   - once every key is deleted, every page is zero again (nothing leaked).
func TestCrossCheckRandomized(t *testing.T) {
	const ops = 1_200_000
	const keySpace = 150_000
	c, pager := newMem(t, Params{FingerprintBits: 32, Capacity: 4096, PageBytes: 1024, MaxKicks: 100})
	model := map[int]int{}
	total := uint64(0)
	rng := rand.New(rand.NewPCG(1, 2))
	var falsePos, absentQueries int
	for op := range ops {
		k := rng.IntN(keySpace)
		kb := key("k", k)
		switch r := rng.IntN(100); {
		case r < 40: // Insert (check-and-insert)
			added, err := c.Insert(kb)
			if err != nil {
				t.Fatal(err)
			}
			if model[k] > 0 && added {
				t.Fatalf("op %d: Insert(%d) added a key the model holds", op, k)
			}
			if model[k] == 0 && !added {
				falsePos++ // false positive of the check
			}
			if added {
				model[k]++
				total++
			}
		case r < 50: // Add a copy, at most 3 per key
			if model[k] >= 3 {
				continue
			}
			if err := c.Add(kb); err != nil {
				t.Fatal(err)
			}
			model[k]++
			total++
		case r < 75: // Delete a held key
			if model[k] == 0 {
				continue
			}
			found, err := c.Delete(kb)
			if err != nil {
				t.Fatal(err)
			}
			if !found {
				t.Fatalf("op %d: Delete(%d) found nothing, model holds %d copies", op, k, model[k])
			}
			model[k]--
			total--
			if model[k] == 0 {
				delete(model, k)
			}
		default: // Contains and Count
			got, err := c.Contains(kb)
			if err != nil {
				t.Fatal(err)
			}
			if model[k] > 0 && !got {
				t.Fatalf("op %d: false negative for key %d (model holds %d)", op, k, model[k])
			}
			if model[k] == 0 {
				absentQueries++
				if got {
					falsePos++
				}
			}
			n, err := c.Count(kb)
			if err != nil {
				t.Fatal(err)
			}
			if n < model[k] {
				t.Fatalf("op %d: Count(%d) = %d, model holds %d", op, k, n, model[k])
			}
		}
		if s := c.Stats(); s.Items != total {
			t.Fatalf("op %d: chain holds %d items, model %d", op, s.Items, total)
		}
	}
	st := c.Stats()
	if st.SubFilters < 3 {
		t.Fatalf("chain has %d sub-filters; the test must exercise expansion", st.SubFilters)
	}
	// 32-bit fingerprints: each query compares at most 2*b*subfilters
	// fingerprints, each matching with probability 2^-32.
	if bound := float64(ops) * 2 * 4 * float64(st.SubFilters) / math.Exp2(32); float64(falsePos) > 10*bound+3 {
		t.Errorf("%d false positives, expected about %.3g", falsePos, bound)
	}
	t.Logf("%d ops, %d sub-filters, load %.3f, %d false positives in %d absent lookups", ops, st.SubFilters, st.LoadFactor, falsePos, absentQueries)

	for k, n := range model {
		for range n {
			if found, err := c.Delete(key("k", k)); err != nil || !found {
				t.Fatalf("final Delete(%d): found=%v err=%v", k, found, err)
			}
		}
	}
	if s := c.Stats(); s.Items != 0 {
		t.Fatalf("after deleting everything the chain holds %d items", s.Items)
	}
	zero := make([]byte, 1024)
	for id, pg := range pager.Pages() {
		if !bytes.Equal(pg, zero) {
			t.Fatalf("page %+v is not empty after deleting every key", id)
		}
	}
}

// fillUntilExpansion adds distinct keys until the first sub-filter is full,
// then deletes the key that spilled into the second one, leaving sub-filter 0
// at its maximum load and sub-filter 1 empty. It returns that load.
func fillUntilExpansion(t testing.TB, c *Chain) float64 {
	t.Helper()
	for i := 0; ; i++ {
		if err := c.Add(key("k", i)); err != nil {
			t.Fatal(err)
		}
		if len(c.subs) == 2 {
			if found, err := c.Delete(key("k", i)); err != nil || !found {
				t.Fatalf("deleting the spilled key: found=%v err=%v", found, err)
			}
			s := c.subs[0]
			return float64(s.Items) / float64(s.Slots(c.p.BucketSize))
		}
	}
}

// TestLoadAtFirstExpansion measures the load factor of a sub-filter when its
// first insert fails, at b=4 with default 4 KiB pages; the page-local
// alternate bucket must still reach 88%. With 16-bit fingerprints a page
// holds 512 buckets and the sub-filters are exactly 2^20 and 2^24 slots;
// the default target false-positive rate gives 18-bit fingerprints,
// bit-packed, 455 buckets a page (the larger case is measured by
// BenchmarkLoadAtFirstExpansion: it takes long under -race).
func TestLoadAtFirstExpansion(t *testing.T) {
	for _, tc := range []struct {
		name  string
		p     Params
		slots uint64 // exact slot count expected, 0: report only
	}{
		{"f=16 slots=2^20", Params{FingerprintBits: 16, Capacity: 1 << 20}, 1 << 20},
		{"f=16 slots=2^24", Params{FingerprintBits: 16, Capacity: 1 << 24}, 1 << 24},
		{"default f=18 capacity=2^20", Params{Capacity: 1 << 20}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, _ := newMem(t, tc.p)
			slots := c.subs[0].Slots(4)
			if tc.slots != 0 && slots != tc.slots {
				t.Fatalf("sub-filter has %d slots, want %d", slots, tc.slots)
			}
			load := fillUntilExpansion(t, c)
			t.Logf("load at first expansion: %.4f (%d slots, b=4, f=%d, 4 KiB pages)", load, slots, c.subs[0].FingerprintBits)
			if load < 0.88 {
				t.Errorf("load at first expansion %.4f < 0.88", load)
			}
		})
	}
}

// TestChainGrowsOnlyWhenFull checks that the chain fills its older
// sub-filters before it grows: with 512-byte pages (224 slots of 18-bit
// fingerprints) a page overflows at a sub-filter load of about 0.81, and a
// chain that grew on the newest sub-filter's first failed insert added its
// 3rd, 4th and 5th sub-filters at a chain load of 0.80 to 0.81; placed in
// an older sub-filter that has room, the key waits for every sub-filter
// to be full in its pages, and the chain grows at 0.88 to 0.90. Every key
// inserted stays contained.
func TestChainGrowsOnlyWhenFull(t *testing.T) {
	c, _ := newMem(t, Params{Capacity: 1 << 15, PageBytes: 512})
	n := 0
	for len(c.subs) < 5 {
		before := c.Stats()
		if _, err := c.Insert(key("k", n)); err != nil {
			t.Fatal(err)
		}
		n++
		if len(c.subs) == before.SubFilters || before.SubFilters < 2 {
			continue
		}
		t.Logf("sub-filter %d added at chain load %.4f", len(c.subs), before.LoadFactor)
		if before.LoadFactor < 0.86 {
			t.Errorf("sub-filter %d added at chain load %.4f < 0.86: an older sub-filter had room", len(c.subs), before.LoadFactor)
		}
	}
	for i := range n {
		if ok, err := c.Contains(key("k", i)); err != nil || !ok {
			t.Fatalf("key %d of %d: contained %v, error %v", i, n, ok, err)
		}
	}
}

// TestFullChainInsertBounded fills a chain that cannot grow (Expansion 1,
// one 512-byte page per sub-filter, MaxSubFilters of them) until inserts
// fail, then counts the pages one more insert opens: one lookup and one
// empty-slot probe per sub-filter, and eviction walks in the newest and at
// most maxFallbackWalks older sub-filters, not one walk per sub-filter
// (63 more page opens and 63 x MaxKicks kicks per record once full).
func TestFullChainInsertBounded(t *testing.T) {
	c, pager := newMem(t, Params{FingerprintBits: 16, Capacity: 100, Expansion: 1, PageBytes: 512})
	i := 0
	for ; ; i++ {
		_, err := c.Insert(key("k", i))
		if errors.Is(err, ErrFull) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if i > 1_000_000 {
			t.Fatal("the chain never filled")
		}
	}
	if len(c.subs) != MaxSubFilters {
		t.Fatalf("%d sub-filters when full, want %d", len(c.subs), MaxSubFilters)
	}
	reads := 0
	c.pager = &countingPager{Pager: pager, reads: &reads}
	for j := 1; j <= 20; j++ {
		reads = 0
		if _, err := c.Insert(key("more", j)); err != nil && !errors.Is(err, ErrFull) {
			t.Fatal(err)
		}
		// lookups of every sub-filter but the newest, the newest's page
		// (read once for its probe and walk) and one page to spare, the
		// empty-slot probes of the older ones, and eviction
		// walks in at most 4 older sub-filters, as placeOrGrow documents.
		if most := (MaxSubFilters - 1) + 2 + (MaxSubFilters - 1) + 4; reads > most {
			t.Fatalf("insert %d into a full chain opened %d pages, want at most %d", j, reads, most)
		}
	}
}

// TestFalsePositiveRate fills one sub-filter to its first failed insert and
// queries keys never inserted: the measured rate must be at most 1.5 times
// the bound 2*b*load/2^f. The query counts give at least ~250 expected false
// positives, so 1.5x is more than 5 standard deviations.
func TestFalsePositiveRate(t *testing.T) {
	for _, tc := range []struct {
		bits    int
		queries int
	}{{8, 200_000}, {16, 2_500_000}} {
		t.Run(fmt.Sprintf("f=%d", tc.bits), func(t *testing.T) {
			c, _ := newMem(t, Params{FingerprintBits: tc.bits, Capacity: 1 << 18})
			load := fillUntilExpansion(t, c)
			rate := measuredFPR(t, c, tc.queries)
			bound := ExpectedFPR(4, tc.bits, load)
			t.Logf("f=%d load %.4f: measured FPR %.3g, 2*b*load/2^f = %.3g, ratio %.3f", tc.bits, load, rate, bound, rate/bound)
			if rate > 1.5*bound {
				t.Errorf("measured FPR %.3g > 1.5 x %.3g", rate, bound)
			}
		})
	}
}

// measuredFPR looks up n keys never inserted ("absent-0".."absent-n-1") and
// returns the share reported present.
func measuredFPR(t *testing.T, c *Chain, n int) float64 {
	t.Helper()
	fp := 0
	for i := range n {
		got, err := c.Contains(key("absent-", i))
		if err != nil {
			t.Fatal(err)
		}
		if got {
			fp++
		}
	}
	return float64(fp) / float64(n)
}

// TestRollbackKeepsEveryFingerprint forces failed eviction walks with a
// tiny MaxKicks and checks that the page of the failed sub-filter is
// byte-for-byte what it was before the insert that triggered expansion.
func TestRollbackKeepsEveryFingerprint(t *testing.T) {
	c, pager := newMem(t, Params{Capacity: 1024, MaxKicks: 3, PageBytes: 512})
	for i := 0; ; i++ {
		before := map[PageID][]byte{}
		for id, pg := range pager.Pages() {
			before[id] = bytes.Clone(pg)
		}
		if err := c.Add(key("k", i)); err != nil {
			t.Fatal(err)
		}
		if len(c.subs) == 2 {
			for id, pg := range before {
				if id.SubFilter == 0 && !bytes.Equal(pg, pager.Pages()[id]) {
					t.Fatalf("page %+v changed by a failed eviction walk", id)
				}
			}
			for j := 0; j <= i; j++ {
				if ok, _ := c.Contains(key("k", j)); !ok {
					t.Fatalf("key %d lost", j)
				}
			}
			return
		}
	}
}

// TestOnePagePerOperation checks the page-local alternate bucket: an insert
// dirties exactly one page, a lookup reads one page per sub-filter.
func TestOnePagePerOperation(t *testing.T) {
	c, pager := newMem(t, Params{Capacity: 1 << 16})
	for i := range 50_000 {
		if _, err := c.Insert(key("k", i)); err != nil {
			t.Fatal(err)
		}
		if d := pager.TakeDirty(); len(d) > 1 {
			t.Fatalf("insert %d dirtied %d pages", i, len(d))
		}
	}
	reads := 0
	counting := &countingPager{Pager: pager, reads: &reads}
	c.pager = counting
	if _, err := c.Contains([]byte("x")); err != nil {
		t.Fatal(err)
	}
	if reads != len(c.subs) {
		t.Fatalf("lookup read %d pages over %d sub-filters", reads, len(c.subs))
	}
}

type countingPager struct {
	Pager
	reads *int
}

func (p *countingPager) Page(id PageID) ([]byte, error) { *p.reads++; return p.Pager.Page(id) }

// TestDeterministic replays one operation sequence on two chains and
// compares every page and the metadata: state is a pure function of the
// operations and Params (recovery depends on it).
func TestDeterministic(t *testing.T) {
	run := func() (*Chain, *MemPager) {
		c, pager := newMem(t, Params{Capacity: 2048, PageBytes: 512, MaxKicks: 50})
		rng := rand.New(rand.NewPCG(7, 7))
		for range 60_000 {
			k := key("k", rng.IntN(20_000))
			var err error
			if rng.IntN(4) == 0 {
				_, err = c.Delete(k)
			} else {
				_, err = c.Insert(k)
			}
			if err != nil {
				t.Fatal(err)
			}
		}
		return c, pager
	}
	c1, p1 := run()
	c2, p2 := run()
	if !bytes.Equal(c1.MarshalMeta(), c2.MarshalMeta()) {
		t.Fatal("metadata differs between identical runs")
	}
	if len(p1.Pages()) != len(p2.Pages()) {
		t.Fatalf("%d pages vs %d", len(p1.Pages()), len(p2.Pages()))
	}
	for id, pg := range p1.Pages() {
		if !bytes.Equal(pg, p2.Pages()[id]) {
			t.Fatalf("page %+v differs between identical runs", id)
		}
	}
}

func TestParamsValidate(t *testing.T) {
	for _, tc := range []struct {
		p    Params
		want string // substring of the error, "" for valid
	}{
		{Params{}, ""},
		{Params{FingerprintBits: 8, BucketSize: 2, PageBytes: 512}, ""},
		{Params{FingerprintBits: 12}, ""},
		{Params{FingerprintBits: 3}, "fingerprint bits 3"},
		{Params{FingerprintBits: 33}, "fingerprint bits 33"},
		{Params{TargetFPR: 1.5}, "target false-positive rate"},
		{Params{BucketSize: 3}, "bucket size 3"},
		{Params{MaxKicks: -1}, "max kicks -1"},
		{Params{Expansion: 65}, "expansion 65"},
		{Params{PageBytes: 3000}, "page bytes 3000"},
		{Params{FingerprintBits: 32, BucketSize: 8, PageBytes: 16}, "smaller than two buckets"},
		// One bucket of 32-bit fingerprints: a key would have one bucket.
		{Params{TargetFPR: 1e-6, BucketSize: 8, PageBytes: 32}, "smaller than two buckets"},
		{Params{KeySpec: strings.Repeat("k", 1<<16)}, "key spec of 65536 bytes"},
		{Params{KeySpec: strings.Repeat("k", 1<<16-1)}, ""},
		{Params{Capacity: 1 << 40}, "capacity"},
		{Params{TargetFPR: 1e-6, BucketSize: 8, PageBytes: 64}, ""},
	} {
		t.Run(fmt.Sprintf("%.200s", tc.p.String()), func(t *testing.T) {
			err := tc.p.Validate()
			if tc.want == "" && err != nil {
				t.Fatalf("unexpected error %v", err)
			}
			if tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}

func TestMetaRoundTripAndOpen(t *testing.T) {
	p := Params{FingerprintBits: 16, Capacity: 2048, PageBytes: 512}
	c, pager := newMem(t, p)
	for i := range 5000 {
		if _, err := c.Insert(key("k", i)); err != nil {
			t.Fatal(err)
		}
	}
	meta := c.MarshalMeta()
	m, err := DecodeMeta(meta)
	if err != nil {
		t.Fatal(err)
	}
	if m.Params != c.Params() || len(m.SubFilters) != len(c.subs) || m.FormatVersion != FormatVersion {
		t.Fatalf("decoded %+v", m)
	}
	re, err := Open(meta, p, pager)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 5000 {
		if ok, _ := re.Contains(key("k", i)); !ok {
			t.Fatalf("reopened chain lost key %d", i)
		}
	}
	if re.Stats() != c.Stats() {
		t.Fatalf("stats %+v after reopen, %+v before", re.Stats(), c.Stats())
	}

	_, err = Open(meta, Params{Capacity: 2048, PageBytes: 512, FingerprintBits: 32}, pager)
	var perr *ParamsError
	if !errors.Is(err, ErrParams) || !errors.As(err, &perr) || err.Error() != ErrParams.Error()+": fingerprint_bits stored 16, configured 32" {
		t.Fatalf("Open with other params: %v", err)
	}
	if want := []ParamDiff{{ParamFingerprintBits, "16", "32"}}; !slices.Equal(perr.Diffs, want) {
		t.Fatalf("Open with other params: differences %v, want %v", perr.Diffs, want)
	}
	// The key spec is stored with the other parameters.
	keyed := Params{FingerprintBits: 16, Capacity: 2048, PageBytes: 512, KeySpec: "json:user.id"}
	kc, kpager := newMem(t, keyed)
	if m, err := DecodeMeta(kc.MarshalMeta()); err != nil || m.Params.KeySpec != "json:user.id" {
		t.Fatalf("decoded key spec %q, %v", m.Params.KeySpec, err)
	}
	if _, err := Open(kc.MarshalMeta(), keyed, kpager); err != nil {
		t.Fatal(err)
	}
	_, err = Open(kc.MarshalMeta(), p, kpager)
	if !errors.Is(err, ErrParams) || !strings.HasSuffix(err.Error(), `: key stored "json:user.id", configured ""`) {
		t.Fatalf("Open with another key spec: %v", err)
	}
	// Format 4 (unkeyed hash 1, a key could have one bucket) and any other
	// version are refused before their layout is read.
	for _, vh := range [][2]byte{{4, HashXXH64}, {FormatVersion + 1, HashSipHash24}, {FormatVersion, HashXXH64}} {
		other := bytes.Clone(meta)
		other[4], other[5] = vh[0], vh[1]
		other = append(other[:len(other)-4], Meta{}.crc(other[:len(other)-4])...)
		want := fmt.Sprintf("stored format version %d hash %d, this build reads format version %d hash %d", vh[0], vh[1], FormatVersion, HashSipHash24)
		if _, err := Open(other, p, pager); !errors.Is(err, ErrParams) || !strings.Contains(err.Error(), want) {
			t.Fatalf("Open of format version %d hash %d: %v", vh[0], vh[1], err)
		}
		if _, err := DecodeMeta(other); !errors.Is(err, ErrParams) {
			t.Fatalf("DecodeMeta of format version %d hash %d: %v", vh[0], vh[1], err)
		}
	}
	bad := bytes.Clone(meta)
	bad[len(bad)/2] ^= 0xff
	if _, err := Open(bad, p, pager); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("Open of a corrupted meta: %v", err)
	}
}

func TestWrongPageLengthIsCorrupt(t *testing.T) {
	c, err := New(Params{PageBytes: 512}, NewMemPager(256))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Insert([]byte("a")); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("Insert over a short page: %v", err)
	}
}
