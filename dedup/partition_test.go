package dedup

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kdedup/kdedup/filter"
	"github.com/kdedup/kdedup/store"
)

// smallChain makes the chain expand several times within a few thousand
// keys; 32-bit fingerprints keep false positives near 1e-9 per lookup.
var smallChain = filter.Params{FingerprintBits: 32, Capacity: 1024}

// recordKind is what a generated record is meant to be, independent of the
// key mode that renders it.
type recordKind uint8

const (
	put recordKind = iota
	tombstone
	marker   // delete header with the delete value
	unkeyed  // no key in the mode's place
	nearMiss // delete header with another value: an ordinary put
)

// keyMode renders a record of a kind and key for one Key spec.
type keyMode struct {
	spec   string
	render func(kind recordKind, key string) *kgo.Record
}

const (
	deleteHeader = "op"
	deleteValue  = "delete"
)

func opHeader(kind recordKind) []kgo.RecordHeader {
	switch kind {
	case marker:
		return []kgo.RecordHeader{{Key: "trace", Value: []byte("t")}, {Key: deleteHeader, Value: []byte(deleteValue)}}
	case nearMiss:
		return []kgo.RecordHeader{{Key: deleteHeader, Value: []byte("Delete")}, {Key: deleteHeader + "x", Value: []byte(deleteValue)}}
	}
	return nil
}

var keyModes = map[string]keyMode{
	"key": {spec: "key", render: func(kind recordKind, key string) *kgo.Record {
		r := &kgo.Record{Key: []byte(key), Value: []byte("v:" + key), Headers: opHeader(kind)}
		switch kind {
		case tombstone:
			r.Value = nil
		case unkeyed:
			r.Key = nil
		}
		return r
	}},
	"header": {spec: "header:id", render: func(kind recordKind, key string) *kgo.Record {
		r := &kgo.Record{Key: []byte("ignored"), Value: []byte("v"), Headers: opHeader(kind)}
		switch kind {
		case tombstone:
			r.Value = nil
		case unkeyed:
			key = ""
		}
		if key != "" {
			r.Headers = append(r.Headers, kgo.RecordHeader{Key: "id", Value: []byte(key)})
		}
		return r
	}},
	// A tombstone has no JSON value, so it has no key in this mode: it is
	// Unkeyed, never a Delete. Only the delete header deletes.
	"json": {spec: "json:user.id", render: func(kind recordKind, key string) *kgo.Record {
		r := &kgo.Record{Key: []byte("ignored"), Value: []byte(`{"user":{"id":"` + key + `"}}`), Headers: opHeader(kind)}
		switch kind {
		case tombstone:
			r.Value = nil
		case unkeyed:
			r.Value = []byte(`{"user":{"name":"` + key + `"}}`)
		}
		return r
	}},
}

// model is the exact deduplicator: the set of keys forwarded and not
// deleted since.
type model struct {
	live    map[string]bool
	counts  map[Decision]int
	missing int // deletes of keys not in live
}

func newModel() *model { return &model{live: map[string]bool{}, counts: map[Decision]int{}} }

func (m *model) decide(mode string, kind recordKind, key string) Decision {
	d := m.apply(mode, kind, key)
	m.counts[d]++
	return d
}

func (m *model) apply(mode string, kind recordKind, key string) Decision {
	switch {
	case kind == unkeyed, key == "", kind == tombstone && mode == "json":
		return Unkeyed
	case kind == tombstone, kind == marker:
		if !m.live[key] {
			m.missing++
		}
		delete(m.live, key)
		return Delete
	case m.live[key]:
		return Duplicate
	}
	m.live[key] = true
	return Forward
}

// forwarded is what kdedup_forwarded_records_total counts for m.
func (m *model) forwarded(drop bool) int {
	n := m.counts[Forward] + m.counts[Unkeyed]
	if !drop {
		n += m.counts[Delete]
	}
	return n
}

func TestDecideAgainstExactModel(t *testing.T) {
	for _, tc := range []struct {
		mode    string
		drop    bool
		records int
	}{
		{mode: "key", drop: false, records: 200_000},
		{mode: "header", drop: true, records: 60_000},
		{mode: "json", drop: false, records: 60_000},
	} {
		t.Run(fmt.Sprintf("%s/drop=%t", tc.mode, tc.drop), func(t *testing.T) {
			const (
				keySpace    = 20_000
				commitEvery = 5_000
				topic       = "orders"
				partition   = 7
			)
			mode := keyModes[tc.mode]
			key, err := ParseKey(mode.spec)
			if err != nil {
				t.Fatal(err)
			}
			opts := Options{Key: key, DeleteHeader: deleteHeader, DeleteValue: deleteValue, DropTombstones: tc.drop, Filter: smallChain}
			// A cache of a few pages makes most lookups read committed pages
			// back from Badger.
			db := openDB(t, "", store.Options{CacheBytes: 8 * filter.DefaultPageBytes})
			reg := prometheus.NewRegistry()
			p := openPartition(t, db, topic, partition, opts, NewMetrics(reg))
			defer p.Close()

			// A fixed seed keeps the run deterministic: with ~40k lookups of
			// absent keys at an estimated FPR below 1e-8, a false positive
			// is unlikely for any seed, and for this one there is none.
			rng := rand.New(rand.NewPCG(1, 2))
			m := newModel()
			for off := range int64(tc.records) {
				var kind recordKind
				switch x := rng.IntN(1000); {
				case x < 10:
					kind = unkeyed
				case x < 60:
					kind = tombstone
				case x < 80:
					kind = marker
				case x < 90:
					kind = nearMiss
				}
				k := fmt.Sprintf("user-%d", rng.IntN(keySpace))
				r := mode.render(kind, k)
				r.Topic, r.Partition, r.Offset = topic, partition, off

				want := m.decide(tc.mode, kind, k)
				got, err := p.Decide(r)
				if err != nil {
					t.Fatalf("offset %d: Decide: %v", off, err)
				}
				if got != want {
					t.Fatalf("offset %d (kind %d, key %q): Decide = %v, model says %v (%d live keys, filter %+v)",
						off, kind, k, got, want, len(m.live), p.Stats())
				}
				for _, drop := range []bool{false, true} {
					o := opts
					o.DropTombstones = drop
					wantFwd := want != Duplicate && !(want == Delete && drop)
					if o.Forwards(got) != wantFwd {
						t.Fatalf("offset %d: Forwards(%v) = %t with DropTombstones=%t", off, got, !wantFwd, drop)
					}
				}
				if got == Unkeyed && !errors.Is(p.LastKeyError(), ErrNoKey) {
					t.Fatalf("offset %d: LastKeyError after Unkeyed = %v, want ErrNoKey", off, p.LastKeyError())
				}
				if (off+1)%commitEvery == 0 {
					if err := p.Commit(store.Checkpoint{Offset: off + 1, LeaderEpoch: 2}); err != nil {
						t.Fatalf("Commit at offset %d: %v", off+1, err)
					}
				}
			}
			for _, d := range []Decision{Forward, Duplicate, Delete, Unkeyed} {
				if m.counts[d] == 0 {
					t.Errorf("the run decided no %v: it does not cover every decision", d)
				}
			}
			st := p.Stats()
			if st.Items != uint64(len(m.live)) {
				t.Errorf("filter holds %d items, model %d live keys", st.Items, len(m.live))
			}
			if st.Splits < 3 {
				t.Errorf("chain has %d splits; the run should have grown it", st.Splits)
			}
			if cp, ok := p.Checkpoint(); !ok || cp.Offset != int64(tc.records/commitEvery*commitEvery) {
				t.Errorf("Checkpoint = %+v, %t; want the last commit", cp, ok)
			}

			part := fmt.Sprint(partition)
			for name, want := range map[string]int{
				"kdedup_consumed_records_total":  tc.records,
				"kdedup_forwarded_records_total": m.forwarded(tc.drop),
				"kdedup_duplicate_records_total": m.counts[Duplicate],
				"kdedup_delete_records_total":    m.counts[Delete],
				"kdedup_delete_missing_total":    m.missing,
				"kdedup_unkeyed_records_total":   m.counts[Unkeyed],
			} {
				if got := counterValue(t, reg, name, topic, part); got != float64(want) {
					t.Errorf("%s = %v, model %d", name, got, want)
				}
			}
			t.Logf("%d records: %v, %d live keys, %d sub-filters, load %.2f",
				tc.records, m.counts, len(m.live), st.SubFilters, st.LoadFactor)
		})
	}
}

// decider feeds records to a Deduplicator at consecutive offsets and checks
// each decision.
type decider struct {
	t   *testing.T
	p   *Deduplicator
	off int64
}

func (d *decider) expect(want Decision, kind recordKind, keys ...string) {
	d.t.Helper()
	for _, k := range keys {
		r := keyModes["key"].render(kind, k)
		r.Offset = d.off
		d.off++
		got, err := d.p.Decide(r)
		if err != nil {
			d.t.Fatalf("offset %d: Decide(%q): %v", r.Offset, k, err)
		}
		if got != want {
			d.t.Fatalf("offset %d: Decide(%q, kind %d) = %v, want %v", r.Offset, k, kind, got, want)
		}
	}
}

func keyRange(prefix string, from, to int) []string {
	var ks []string
	for i := from; i < to; i++ {
		ks = append(ks, fmt.Sprintf("%s-%d", prefix, i))
	}
	return ks
}

func TestCommitAndReopen(t *testing.T) {
	const topic, partition = "orders", 3
	dir := t.TempDir()
	opts := Options{DeleteHeader: deleteHeader, DeleteValue: deleteValue, Filter: smallChain}
	m := NewMetrics(prometheus.NewRegistry())
	db := openDB(t, dir, store.Options{})

	p := openPartition(t, db, topic, partition, opts, m)
	d := &decider{t: t, p: p}
	d.expect(Forward, put, keyRange("k", 0, 3000)...)
	d.expect(Delete, tombstone, keyRange("k", 0, 300)...)
	d.expect(Delete, marker, keyRange("k", 300, 600)...)
	d.expect(Duplicate, put, keyRange("k", 600, 700)...)
	committed := store.Checkpoint{Offset: d.off, LeaderEpoch: 5}
	stats := p.Stats()
	if stats.Splits == 0 {
		t.Fatalf("chain has %d splits; the test wants a grown chain", stats.Splits)
	}
	if err := p.Commit(committed); err != nil {
		t.Fatal(err)
	}
	if p.DirtyBytes() != 0 {
		t.Errorf("DirtyBytes after Commit = %d", p.DirtyBytes())
	}
	// Decided after the commit and never committed: forgotten on Close.
	d.expect(Forward, put, keyRange("late", 0, 100)...)
	d.expect(Delete, tombstone, keyRange("k", 600, 700)...)
	d.expect(Forward, put, keyRange("k", 0, 50)...)
	if p.DirtyBytes() == 0 {
		t.Fatal("no dirty pages after uncommitted decisions")
	}
	p.Close()

	// check decides every key against the committed state. Its own
	// decisions are not committed, so every reopen sees the same state.
	check := func(t *testing.T, p *Deduplicator) {
		if cp, ok := p.Checkpoint(); !ok || cp != committed {
			t.Errorf("Checkpoint = %+v, %t; want %+v, true", cp, ok, committed)
		}
		// The counts of operations and page reads are the chain's since
		// it was opened.
		got, want := p.Stats(), stats
		got.Operations, got.PageReads, want.Operations, want.PageReads = 0, 0, 0, 0
		if got != want {
			t.Errorf("Stats = %+v, want %+v as committed", got, stats)
		}
		d := &decider{t: t, p: p, off: committed.Offset}
		d.expect(Forward, put, keyRange("k", 0, 600)...)
		d.expect(Duplicate, put, keyRange("k", 600, 3000)...)
		d.expect(Forward, put, keyRange("late", 0, 100)...)
	}
	t.Run("same DB", func(t *testing.T) {
		p := openPartition(t, db, topic, partition, opts, m)
		defer p.Close()
		check(t, p)
	})
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	t.Run("reopened DB", func(t *testing.T) {
		db := openDB(t, dir, store.Options{})
		p := openPartition(t, db, topic, partition, opts, m)
		defer p.Close()
		check(t, p)
	})
}

// mustKey parses a key spec.
func mustKey(t *testing.T, spec string) Key {
	t.Helper()
	k, err := ParseKey(spec)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// testParamNames names every filter parameter as internal/app names it by
// its variable, spelled differently so that the test sees the names come
// from Options.ParamNames.
var testParamNames = func() map[filter.Param]string {
	names := map[filter.Param]string{}
	for _, p := range filter.AllParams() {
		names[p] = "VAR_" + strings.ToUpper(string(p))
	}
	return names
}()

// TestOpenRefusesOtherParams: a state written with other filter parameters
// or another key spec is refused, for each parameter, naming it by
// Options.ParamNames (its variable) with the stored and the configured
// value, and the two ways out; the refused Open leaves the state as it
// was. Parameters the state does not depend on, and defaults spelled out,
// open it. Without ParamNames the parameters are named as package filter
// names them.
func TestOpenRefusesOtherParams(t *testing.T) {
	type refusalCase struct {
		name               string
		stored, configured filter.Params
		storedKey, key     string                  // "" is the record key
		names              map[filter.Param]string // default testParamNames
		want               string                  // "" means Open succeeds
	}
	windowed := filter.Params{Capacity: 1024, Window: time.Hour}
	cases := []refusalCase{
		{name: "target rate", stored: filter.Params{Capacity: 1024}, configured: filter.Params{Capacity: 1024, TargetFPR: 1e-3},
			want: "VAR_TARGET_FPR stored 0.0001, configured 0.001"},
		{name: "fingerprint bits", stored: filter.Params{FingerprintBits: 16, Capacity: 1024}, configured: filter.Params{FingerprintBits: 32, Capacity: 1024},
			want: "VAR_FINGERPRINT_BITS stored 16, configured 32"},
		{name: "bucket size", stored: filter.Params{BucketSize: 4, Capacity: 1024}, configured: filter.Params{BucketSize: 2, Capacity: 1024},
			want: "VAR_BUCKET_SIZE stored 4, configured 2"},
		{name: "capacity", stored: filter.Params{Capacity: 1024}, configured: filter.Params{Capacity: 2048},
			want: "VAR_CAPACITY stored 1024, configured 2048"},
		{name: "max kicks", stored: filter.Params{Capacity: 1024}, configured: filter.Params{Capacity: 1024, MaxKicks: 100},
			want: "VAR_MAX_KICKS stored 500, configured 100"},
		{name: "expansion", stored: filter.Params{Capacity: 1024}, configured: filter.Params{Capacity: 1024, Expansion: 1},
			want: "VAR_EXPANSION stored 2, configured 1"},
		{name: "page bytes", stored: filter.Params{Capacity: 1024}, configured: filter.Params{Capacity: 1024, PageBytes: 8192},
			want: "VAR_PAGE_BYTES stored 4096, configured 8192"},
		{name: "window", stored: windowed, configured: filter.Params{Capacity: 1024, Window: 2 * time.Hour},
			want: "VAR_WINDOW stored 1h0m0s, configured 2h0m0s"},
		{name: "generations", stored: windowed, configured: filter.Params{Capacity: 1024, Window: time.Hour, Generations: 4},
			want: "VAR_GENERATIONS stored 8, configured 4"},
		{name: "key", stored: filter.Params{Capacity: 1024}, configured: filter.Params{Capacity: 1024}, key: "header:x-id",
			want: `VAR_KEY stored "key", configured "header:x-id"`},
		{name: "two at once", stored: filter.Params{Capacity: 1024}, configured: filter.Params{Capacity: 2048, PageBytes: 8192},
			want: "VAR_CAPACITY stored 1024, configured 2048; VAR_PAGE_BYTES stored 4096, configured 8192 (restore the stored values, or move the data directory aside to rebuild the state by replay under the configured values)"},
		{name: "unnamed", stored: filter.Params{Capacity: 1024}, configured: filter.Params{Capacity: 2048}, names: map[filter.Param]string{},
			want: "capacity stored 1024, configured 2048 (restore the stored value, or move the data directory aside to rebuild the state by replay under the configured value)"},
		{
			name:       "defaults spelled out",
			stored:     filter.Params{Capacity: 1024},
			configured: filter.Params{TargetFPR: 1e-4, BucketSize: 4, Capacity: 1024, MaxKicks: 500, Expansion: 2, PageBytes: 4096},
		},
		{name: "rate beside fixed widths", stored: filter.Params{FingerprintBits: 16, Capacity: 1024}, configured: filter.Params{FingerprintBits: 16, Capacity: 1024, TargetFPR: 0.01}},
		{name: "generations without a window", stored: filter.Params{Capacity: 1024}, configured: filter.Params{Capacity: 1024, Generations: 4}},
	}
	for _, p := range filter.AllParams() {
		if !slices.ContainsFunc(cases, func(c refusalCase) bool { return strings.HasPrefix(c.want, testParamNames[p]+" stored") }) {
			t.Errorf("no case changes %s", p)
		}
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			const topic, partition = "orders", 3
			names := tc.names
			if names == nil {
				names = testParamNames
			}
			storedOpts := Options{Filter: tc.stored, ParamNames: names}
			// The store owns the page size: each Open runs over a store
			// opened with the page size of its filter parameters.
			dir := t.TempDir()
			reopen := func(db *store.DB, pageBytes int) *store.DB {
				t.Helper()
				if err := db.Close(); err != nil {
					t.Fatal(err)
				}
				return openDB(t, dir, store.Options{PageBytes: pageBytes})
			}
			storedPages, configuredPages := tc.stored.WithDefaults().PageBytes, tc.configured.WithDefaults().PageBytes
			db := openDB(t, dir, store.Options{PageBytes: storedPages})
			m := NewMetrics(prometheus.NewRegistry())
			p := openPartition(t, db, topic, partition, storedOpts, m)
			d := &decider{t: t, p: p}
			d.expect(Forward, put, "a", "b")
			if err := p.Commit(store.Checkpoint{Offset: d.off}); err != nil {
				t.Fatal(err)
			}
			p.Close()

			db = reopen(db, configuredPages)
			p, err := Open(db, topic, partition, Options{Filter: tc.configured, Key: mustKey(t, tc.key), ParamNames: names}, m)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("Open with %s over state of %s: %v", tc.configured, tc.stored, err)
				}
				d := &decider{t: t, p: p, off: 2}
				d.expect(Duplicate, put, "a", "b")
				p.Close()
				return
			}
			if err == nil {
				p.Close()
				t.Fatalf("Open with %s over state of %s succeeded", tc.configured, tc.stored)
			}
			if !errors.Is(err, filter.ErrParams) || !IsStateError(err) {
				t.Errorf("Open: %v; want filter.ErrParams, a state error", err)
			}
			want := "opening filter of orders/3: " + filter.ErrParams.Error() + ": " + tc.want
			if !strings.Contains(tc.want, "(restore") {
				want += " (restore the stored value, or move the data directory aside to rebuild the state by replay under the configured value)"
			}
			if err.Error() != want {
				t.Errorf("Open: %q\nwant    %q", err, want)
			}
			// The refused Open released the state: it opens again with the
			// stored parameters, unchanged.
			db = reopen(db, storedPages)
			p = openPartition(t, db, topic, partition, storedOpts, m)
			defer p.Close()
			d = &decider{t: t, p: p, off: 2}
			d.expect(Duplicate, put, "a", "b")
		})
	}
}

func TestMetrics(t *testing.T) {
	const topic = "orders"
	// The exact decisions of one partition's sequence, in record-key mode.
	seq := []struct {
		kind recordKind
		key  string
		want Decision
	}{
		{put, "a", Forward},
		{put, "b", Forward},
		{put, "a", Duplicate},
		{unkeyed, "", Unkeyed},
		{tombstone, "a", Delete},
		{tombstone, "c", Delete}, // not present: counted as missing
		{put, "a", Forward},
		{marker, "b", Delete},
		{nearMiss, "b", Forward},
		{put, "", Unkeyed}, // empty record key
		{put, "b", Duplicate},
		{nearMiss, "b", Duplicate},
		{marker, "b", Delete},
	}
	for _, drop := range []bool{false, true} {
		t.Run(fmt.Sprintf("drop=%t", drop), func(t *testing.T) {
			reg := prometheus.NewRegistry()
			m := NewMetrics(reg)
			db := openDB(t, "", store.Options{})
			opts := Options{DeleteHeader: deleteHeader, DeleteValue: deleteValue, DropTombstones: drop, Filter: smallChain}
			p3 := openPartition(t, db, topic, 3, opts, m)
			p4 := openPartition(t, db, topic, 4, opts, m)

			want := newModel()
			d := &decider{t: t, p: p3}
			for _, s := range seq {
				if got := want.decide("key", s.kind, s.key); got != s.want {
					t.Fatalf("the model decides %v for %+v", got, s)
				}
				d.expect(s.want, s.kind, s.key)
			}
			(&decider{t: t, p: p4}).expect(Forward, put, "a")
			// Counters are published every 256 decisions and at each
			// write batch.
			for _, p := range []*Deduplicator{p3, p4} {
				if err := p.Commit(store.Checkpoint{Offset: int64(len(seq))}); err != nil {
					t.Fatal(err)
				}
			}

			for _, tc := range []struct {
				name   string
				p3, p4 int
			}{
				{name: "kdedup_consumed_records_total", p3: len(seq), p4: 1},
				{name: "kdedup_forwarded_records_total", p3: want.forwarded(drop), p4: 1},
				{name: "kdedup_duplicate_records_total", p3: want.counts[Duplicate]},
				{name: "kdedup_delete_records_total", p3: want.counts[Delete]},
				{name: "kdedup_delete_missing_total", p3: want.missing},
				{name: "kdedup_unkeyed_records_total", p3: want.counts[Unkeyed]},
			} {
				if got := counterValue(t, reg, tc.name, topic, "3"); got != float64(tc.p3) {
					t.Errorf("%s{partition=3} = %v, want %d", tc.name, got, tc.p3)
				}
				if got := counterValue(t, reg, tc.name, topic, "4"); got != float64(tc.p4) {
					t.Errorf("%s{partition=4} = %v, want %d", tc.name, got, tc.p4)
				}
				if n := seriesCount(t, reg, tc.name); n != 2 {
					t.Errorf("%s has %d series, want one per partition", tc.name, n)
				}
			}
			if n := want.forwarded(drop); drop && n != 6 || !drop && n != 10 {
				t.Errorf("the model forwards %d records with DropTombstones=%t", n, drop)
			}

			// Gauges follow the filter as of the last Commit (or Open).
			if err := p3.Commit(store.Checkpoint{Offset: int64(len(seq))}); err != nil {
				t.Fatal(err)
			}
			if g, ok := metric(t, reg, "kdedup_filter_items", topic, "3"); !ok || g.GetGauge().GetValue() != float64(len(want.live)) {
				t.Errorf("kdedup_filter_items{partition=3} = %v, %t; want %d", g.GetGauge().GetValue(), ok, len(want.live))
			}
			if g, ok := metric(t, reg, "kdedup_filter_sub_filters", topic, "3"); !ok || g.GetGauge().GetValue() != 1 {
				t.Errorf("kdedup_filter_sub_filters{partition=3} = %v, %t; want 1", g.GetGauge().GetValue(), ok)
			}
			if n := seriesCount(t, reg, "kdedup_batch_commit_seconds"); n != 1 {
				t.Errorf("kdedup_batch_commit_seconds has %d series, want 1", n)
			}

			// Close forgets the gauges of the partition, keeps its counters.
			p3.Close()
			if _, ok := metric(t, reg, "kdedup_filter_items", topic, "3"); ok {
				t.Error("kdedup_filter_items{partition=3} still exported after Close")
			}
			if _, ok := metric(t, reg, "kdedup_filter_items", topic, "4"); !ok {
				t.Error("kdedup_filter_items{partition=4} gone after closing partition 3")
			}
			if got := counterValue(t, reg, "kdedup_consumed_records_total", topic, "3"); got != float64(len(seq)) {
				t.Errorf("kdedup_consumed_records_total{partition=3} after Close = %v, want %d", got, len(seq))
			}
			p4.Close()

			mfs, err := reg.Gather()
			if err != nil {
				t.Fatal(err)
			}
			problems, err := promlint.NewWithMetricFamilies(mfs).Lint()
			if err != nil {
				t.Fatal(err)
			}
			for _, pr := range problems {
				t.Errorf("metric %s: %s", pr.Metric, pr.Text)
			}
		})
	}
}

func TestDecideStorageError(t *testing.T) {
	db := openDB(t, "", store.Options{})
	p := openPartition(t, db, "orders", 3, Options{Filter: smallChain}, NewMetrics(prometheus.NewRegistry()))
	defer p.Close()
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		kind recordKind
	}{
		{"insert", put},
		{"delete", tombstone},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := keyModes["key"].render(tc.kind, "a")
			r.Offset = 41
			_, err := p.Decide(r)
			if !errors.Is(err, store.ErrClosed) {
				t.Fatalf("Decide over a closed store: %v, want store.ErrClosed", err)
			}
			if !strings.Contains(err.Error(), "orders/3 offset 41") {
				t.Errorf("Decide: %q does not name topic-partition and offset", err)
			}
			if IsStateError(err) {
				t.Errorf("IsStateError(%v) = true for a closed store", err)
			}
		})
	}
	// Records without a key touch no state.
	r := keyModes["key"].render(unkeyed, "")
	if got, err := p.Decide(r); err != nil || got != Unkeyed {
		t.Errorf("Decide(unkeyed) over a closed store = %v, %v; want Unkeyed, nil", got, err)
	}
	if err := p.Commit(store.Checkpoint{Offset: 42}); !errors.Is(err, store.ErrClosed) {
		t.Errorf("Commit over a closed store: %v, want store.ErrClosed", err)
	}
}

func TestIsStateError(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{nil, false},
		{fmt.Errorf("opening: %w", filter.ErrParams), true},
		{fmt.Errorf("opening: %w", filter.ErrCorrupt), true},
		{fmt.Errorf("reading: %w", store.ErrCorrupt), true},
		{fmt.Errorf("reading: %w", store.ErrClosed), false},
		{filter.ErrFull, false},
		{errors.New("badger: timeout"), false},
	} {
		t.Run(fmt.Sprint(tc.err), func(t *testing.T) {
			if got := IsStateError(tc.err); got != tc.want {
				t.Errorf("IsStateError(%v) = %t, want %t", tc.err, got, tc.want)
			}
		})
	}
}

func TestDecisionString(t *testing.T) {
	for _, tc := range []struct {
		d    Decision
		want string
	}{
		{Forward, "forward"},
		{Duplicate, "duplicate"},
		{Delete, "delete"},
		{Unkeyed, "unkeyed"},
		{OverLimit, "over-limit"},
		{Decision(9), "decision(9)"},
	} {
		t.Run(tc.want, func(t *testing.T) {
			if got := tc.d.String(); got != tc.want {
				t.Errorf("Decision(%d).String() = %q, want %q", uint8(tc.d), got, tc.want)
			}
		})
	}
}

// TestDecideHostileJSON decides records whose values are beyond the JSON
// key limits, among them the twenty megabytes of nested arrays that
// overflowed the stack: each is Unkeyed (forwarded, counted) with the reason
// in LastKeyError, and the records around them are decided as usual.
func TestDecideHostileJSON(t *testing.T) {
	key, err := ParseKey("json:id")
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	db := openDB(t, "", store.Options{})
	p := openPartition(t, db, "in", 0, Options{Key: key, Filter: smallChain}, NewMetrics(reg))
	defer p.Close()
	deep := slices.Concat(bytes.Repeat([]byte("["), 10_000_000), bytes.Repeat([]byte("]"), 10_000_000))
	for i, tc := range []struct {
		value  []byte
		want   Decision
		reason string
	}{
		{[]byte(`{"id":"a"}`), Forward, ""},
		{deep, Unkeyed, "more than the"},
		{deep[9_999_000:10_001_000], Unkeyed, "deeper than"},
		{slices.Concat([]byte(`{"id":"a","d":`), deep[9_000_000:11_000_000], []byte(`}`)), Unkeyed, "deeper than"},
		{[]byte(`{"id":"a"}`), Duplicate, ""},
	} {
		got, err := p.Decide(&kgo.Record{Value: tc.value, Offset: int64(i)})
		if err != nil || got != tc.want {
			t.Fatalf("offset %d: Decide = %v, %v; want %v", i, got, err, tc.want)
		}
		if tc.want == Unkeyed && (!errors.Is(p.LastKeyError(), ErrNoKey) || !strings.Contains(p.LastKeyError().Error(), tc.reason)) {
			t.Errorf("offset %d: LastKeyError = %v, want ErrNoKey saying %q", i, p.LastKeyError(), tc.reason)
		}
	}
	if err := p.Commit(store.Checkpoint{Offset: 5}); err != nil {
		t.Fatal(err)
	}
	if got := counterValue(t, reg, "kdedup_unkeyed_records_total", "in", "0"); got != 3 {
		t.Errorf("kdedup_unkeyed_records_total = %g, want 3", got)
	}
}

// TestOpenRefusesOtherKey: the key spec is stored with the filter
// parameters, and state written under one KDEDUP_KEY is refused under
// another, naming the variable and both values, as changed filter
// parameters are; the same spec, however spelled, opens it.
func TestOpenRefusesOtherKey(t *testing.T) {
	for _, tc := range []struct {
		stored, configured string
		refused            bool
	}{
		{"json:id", "key", true},
		{"key", "header:x-id", true},
		{"header:x-id", "header:x-Id", true},
		{"json:user.id", "json:user.id", false},
		{"", "key", false}, // the default spelled out
	} {
		t.Run(tc.stored+" then "+tc.configured, func(t *testing.T) {
			const topic, partition = "orders", 3
			db := openDB(t, "", store.Options{})
			p := openPartition(t, db, topic, partition, Options{Key: mustKey(t, tc.stored), Filter: smallChain}, nil)
			if _, err := p.Decide(&kgo.Record{Key: []byte("k"), Value: []byte(`{"id":"k","user":{"id":"k"}}`), Headers: []kgo.RecordHeader{{Key: "x-id", Value: []byte("k")}}}); err != nil {
				t.Fatal(err)
			}
			if err := p.Commit(store.Checkpoint{Offset: 1}); err != nil {
				t.Fatal(err)
			}
			p.Close()
			m, err := filter.DecodeMeta(p.state.Meta())
			if err != nil || m.Params.KeySpec != mustKey(t, tc.stored).String() {
				t.Fatalf("stored key spec %q, %v; want %q", m.Params.KeySpec, err, mustKey(t, tc.stored).String())
			}

			p, err = Open(db, topic, partition, Options{Key: mustKey(t, tc.configured), Filter: smallChain, ParamNames: testParamNames}, nil)
			if !tc.refused {
				if err != nil {
					t.Fatalf("Open with the same key: %v", err)
				}
				p.Close()
				return
			}
			if err == nil {
				p.Close()
				t.Fatal("Open with another key succeeded")
			}
			want := fmt.Sprintf("VAR_KEY stored %q, configured %q", mustKey(t, tc.stored).String(), mustKey(t, tc.configured).String())
			if !errors.Is(err, filter.ErrParams) || !IsStateError(err) || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "orders/3") {
				t.Fatalf("Open: %v; want filter.ErrParams naming orders/3 and saying %q", err, want)
			}
		})
	}
}

// TestHashSeedPerPartition: each new partition state gets its own secret
// hash seed, kept in its committed metadata and used again when the state
// is reopened; Options.HashSeed fixes it for a new state only.
func TestHashSeedPerPartition(t *testing.T) {
	dir := t.TempDir()
	db := openDB(t, dir, store.Options{})
	seeds := map[filter.Seed]bool{}
	for part := range int32(3) {
		p := openPartition(t, db, "in", part, Options{Filter: smallChain}, nil)
		(&decider{t: t, p: p}).expect(Forward, put, "a", "b")
		if err := p.Commit(store.Checkpoint{Offset: 2}); err != nil {
			t.Fatal(err)
		}
		m, err := filter.DecodeMeta(p.state.Meta())
		p.Close()
		if err != nil {
			t.Fatal(err)
		}
		if seeds[m.Seed] || m.Seed == (filter.Seed{}) {
			t.Fatalf("partition %d: seed %v is zero or another partition's", part, m.Seed)
		}
		seeds[m.Seed] = true
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	db = openDB(t, dir, store.Options{})
	fixed := filter.Seed{K0: 1, K1: 2}
	for part := range int32(3) {
		// HashSeed does not replace a stored seed.
		p := openPartition(t, db, "in", part, Options{Filter: smallChain, HashSeed: fixed}, nil)
		(&decider{t: t, p: p, off: 2}).expect(Duplicate, put, "a", "b")
		(&decider{t: t, p: p, off: 4}).expect(Forward, put, "c")
		if err := p.Commit(store.Checkpoint{Offset: 5}); err != nil {
			t.Fatal(err)
		}
		m, err := filter.DecodeMeta(p.state.Meta())
		p.Close()
		if err != nil || !seeds[m.Seed] {
			t.Fatalf("partition %d: seed %v after reopening, %v; want its first", part, m.Seed, err)
		}
	}
	p := openPartition(t, db, "in", 9, Options{Filter: smallChain, HashSeed: fixed}, nil)
	defer p.Close()
	if err := p.Commit(store.Checkpoint{Offset: 0}); err != nil {
		t.Fatal(err)
	}
	if m, err := filter.DecodeMeta(p.state.Meta()); err != nil || m.Seed != fixed {
		t.Fatalf("new state with HashSeed: seed %v, %v; want %v", m.Seed, err, fixed)
	}
}

// TestFullChainForwardsAndCounts fills a chain of one-page sub-filters of
// 32 bytes (b=2, 16-bit slots: 16 slots a page, 128 pages once a
// sub-filter doubled 7 times in place) with Expansion 1 and one eviction a
// walk until its 64 sub-filters refuse keys (filter.ErrFull, which used to fail the record on every restart):
// from then on such keys are forwarded without an error, counted in
// kdedup_filter_full_records_total, and forwarded again when repeated;
// keys remembered before stay duplicates, and the state commits.
func TestFullChainForwardsAndCounts(t *testing.T) {
	for _, maxOcc := range []int{1, 3} {
		t.Run(fmt.Sprintf("max occurrences %d", maxOcc), func(t *testing.T) {
			reg := prometheus.NewRegistry()
			db := openDB(t, "", store.Options{PageBytes: 32})
			fp := filter.Params{FingerprintBits: 16, BucketSize: 2, Capacity: 1, PageBytes: 32, MaxKicks: 1, Expansion: 1}
			p := openPartition(t, db, "in", 0, Options{Filter: fp, MaxOccurrences: maxOcc}, NewMetrics(reg))
			defer p.Close()
			off := int64(0)
			decide := func(k string) Decision {
				t.Helper()
				d, err := p.Decide(&kgo.Record{Key: []byte(k), Value: []byte("v"), Offset: off})
				if err != nil {
					t.Fatalf("offset %d: Decide(%s): %v", off, k, err)
				}
				off++
				return d
			}
			// Each new key is decided maxOcc+1 times: a key the chain
			// remembered is forwarded maxOcc times, then dropped; one it
			// could not remember at all is forwarded every time.
			var remembered []string
			refused, wantFull := 0, 0
			for i := 0; refused < 50; i++ {
				k := fmt.Sprintf("k%d", i)
				before := p.Stats().Items
				if got := decide(k); got != Forward {
					continue // a false positive of a crowded filter
				}
				if p.Stats().Items > before {
					for range maxOcc {
						decide(k) // later copies may or may not fit
					}
					remembered = append(remembered, k)
					continue
				}
				refused++
				wantFull++
				for n := range maxOcc {
					if got := decide(k); got != Forward {
						t.Fatalf("%s: record %d of a key the full chain refused decided %v, want Forward", k, n+2, got)
					}
					wantFull++
				}
			}
			if st := p.Stats(); st.SubFilters != filter.MaxSubFilters || !st.NearFull {
				t.Fatalf("%d sub-filters (near full %v), want %d", st.SubFilters, st.NearFull, filter.MaxSubFilters)
			}
			if maxOcc == 1 {
				for _, k := range remembered {
					if got := decide(k); got != Duplicate {
						t.Fatalf("%s, remembered before the chain filled, decided %v", k, got)
					}
				}
			}
			if err := p.Commit(store.Checkpoint{Offset: off}); err != nil {
				t.Fatal(err)
			}
			got := counterValue(t, reg, "kdedup_filter_full_records_total", "in", "0")
			if maxOcc == 1 && got != float64(wantFull) || got < float64(wantFull) {
				t.Errorf("kdedup_filter_full_records_total = %g, want %d", got, wantFull)
			}
		})
	}
}

// TestPageBytesOfTheStore: the store owns the page size. A filter without
// PageBytes takes the store's and decides (before, it asked for pages of
// the default 4 KiB from a store of 1 KiB pages and failed at its first
// record); another page size is refused by Open and NewOpener, naming both,
// before any record.
func TestPageBytesOfTheStore(t *testing.T) {
	db := openDB(t, "", store.Options{PageBytes: 1024})
	p := openPartition(t, db, "orders", 0, Options{}, nil)
	if got := p.chain.Params().PageBytes; got != 1024 {
		t.Errorf("filter PageBytes %d, want the store's 1024", got)
	}
	d := &decider{t: t, p: p}
	d.expect(Forward, put, keyRange("k", 0, 100)...)
	d.expect(Duplicate, put, keyRange("k", 0, 100)...)
	p.Close()

	wrong := Options{Filter: filter.Params{PageBytes: 4096}}
	if _, err := Open(db, "orders", 1, wrong, nil); !errors.Is(err, ErrOptions) || !strings.Contains(err.Error(), "4096") || !strings.Contains(err.Error(), "1024") {
		t.Errorf("Open with 4096-byte pages over a 1024-byte store: %v; want ErrOptions naming both", err)
	}
	if _, err := NewOpener(db, wrong, nil); !errors.Is(err, ErrOptions) {
		t.Errorf("NewOpener with 4096-byte pages over a 1024-byte store: %v; want ErrOptions", err)
	}
	o, err := NewOpener(db, Options{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := o.Options().Filter.PageBytes; got != 1024 {
		t.Errorf("the opener's filter PageBytes %d, want the store's 1024", got)
	}
}
