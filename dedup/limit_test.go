package dedup

import (
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kdedup/kdedup/filter"
	"github.com/kdedup/kdedup/store"
)

// limitModel is the exact occurrence limit: per key, the records forwarded
// since its last delete.
type limitModel struct {
	limit   int
	count   map[string]int
	counts  map[Decision]int
	missing int
}

func newLimitModel(limit int) *limitModel {
	return &limitModel{limit: limit, count: map[string]int{}, counts: map[Decision]int{}}
}

func (m *limitModel) decide(kind recordKind, key string) Decision {
	d := m.apply(kind, key)
	m.counts[d]++
	return d
}

func (m *limitModel) apply(kind recordKind, key string) Decision {
	switch {
	case kind == unkeyed:
		return Unkeyed
	case kind == tombstone, kind == marker:
		if m.count[key] == 0 {
			m.missing++
		}
		delete(m.count, key)
		return Delete
	case m.count[key] >= m.limit:
		return OverLimit
	}
	m.count[key]++
	return Forward
}

func (m *limitModel) copies() int {
	n := 0
	for _, c := range m.count {
		n += c
	}
	return n
}

func (m *limitModel) clone() *limitModel {
	c := *m
	c.count, c.counts = maps.Clone(m.count), maps.Clone(m.counts)
	return &c
}

// TestOccurrenceLimitAgainstExactModel decides a random stream (hot keys,
// tombstones, delete markers, unkeyed records) with MaxOccurrences 2, 3 and
// 8 (twice the bucket size) and compares every decision with the exact
// model, a map from key to records forwarded since its last delete. Staged,
// a third of the transactions abort and are decided again, as an aborted
// Kafka transaction rewinds the input; the model rolls back with them. At
// the end the chain holds exactly one fingerprint copy per forwarded record
// of a live key, and the counters equal the model's counts of the decisions
// that took effect. 32-bit fingerprints make a false positive improbable
// (about 1e-8 per lookup at the loads reached); for these seeds there is
// none.
func TestOccurrenceLimitAgainstExactModel(t *testing.T) {
	for _, limit := range []int{2, 3, 8} {
		for _, staged := range []bool{false, true} {
			t.Run(fmt.Sprintf("max=%d/staged=%t", limit, staged), func(t *testing.T) {
				const (
					records   = 60_000
					keySpace  = 6_000
					hotKeys   = 30
					batchSize = 1_000
					topic     = "orders"
					partition = 1
				)
				opts := Options{DeleteHeader: deleteHeader, DeleteValue: deleteValue, Filter: smallChain, MaxOccurrences: limit, Staged: staged}
				db := openDB(t, "", store.Options{CacheBytes: 8 * filter.DefaultPageBytes})
				reg := prometheus.NewRegistry()
				p := openPartition(t, db, topic, partition, opts, NewMetrics(reg))
				defer p.Close()

				rng := rand.New(rand.NewPCG(uint64(limit), 7))
				type input struct {
					kind recordKind
					key  string
				}
				stream := make([]input, records)
				for i := range stream {
					var kind recordKind
					switch x := rng.IntN(1000); {
					case x < 10:
						kind = unkeyed
					case x < 50:
						kind = tombstone
					case x < 60:
						kind = marker
					}
					k := fmt.Sprintf("user-%d", rng.IntN(keySpace))
					if rng.IntN(5) == 0 {
						k = fmt.Sprintf("hot-%d", rng.IntN(hotKeys))
					}
					stream[i] = input{kind, k}
				}

				m := newLimitModel(limit)
				aborts := 0
				for start := 0; start < records; {
					end := min(start+batchSize, records)
					before := m.clone()
					for off := start; off < end; off++ {
						in := stream[off]
						r := keyModes["key"].render(in.kind, in.key)
						r.Topic, r.Partition, r.Offset = topic, partition, int64(off)
						want := m.decide(in.kind, in.key)
						got, err := p.Decide(r)
						if err != nil {
							t.Fatalf("offset %d: Decide: %v", off, err)
						}
						if got != want {
							t.Fatalf("offset %d (kind %d, key %q): Decide = %v, model says %v (count %d, filter %+v)",
								off, in.kind, in.key, got, want, before.count[in.key], p.Stats())
						}
						if opts.Forwards(got) != (want != OverLimit) {
							t.Fatalf("offset %d: Forwards(%v) = %t", off, got, opts.Forwards(got))
						}
					}
					if staged && rng.IntN(3) == 0 {
						aborts++
						if err := p.DiscardStaged(); err != nil {
							t.Fatal(err)
						}
						m = before
						continue
					}
					if err := p.CommitStaged(); err != nil {
						t.Fatal(err)
					}
					if err := p.Commit(store.Checkpoint{Offset: int64(end)}); err != nil {
						t.Fatalf("Commit at offset %d: %v", end, err)
					}
					start = end
				}
				if staged && aborts == 0 {
					t.Fatal("no transaction aborted")
				}
				for _, d := range []Decision{Forward, OverLimit, Delete, Unkeyed} {
					if m.counts[d] == 0 {
						t.Errorf("the run decided no %v: it does not cover every decision", d)
					}
				}
				st := p.Stats()
				if st.Items != uint64(m.copies()) {
					t.Errorf("filter holds %d fingerprints, model %d copies of live keys", st.Items, m.copies())
				}
				if st.Splits == 0 {
					t.Errorf("chain has %d sub-filters and no split; the run should have grown it", st.SubFilters)
				}
				part := fmt.Sprint(partition)
				for name, want := range map[string]int{
					"kdedup_consumed_records_total":   records,
					"kdedup_forwarded_records_total":  m.counts[Forward] + m.counts[Unkeyed] + m.counts[Delete],
					"kdedup_over_limit_records_total": m.counts[OverLimit],
					"kdedup_duplicate_records_total":  0,
					"kdedup_delete_records_total":     m.counts[Delete],
					"kdedup_delete_missing_total":     m.missing,
					"kdedup_unkeyed_records_total":    m.counts[Unkeyed],
				} {
					if got := counterValue(t, reg, name, topic, part); got != float64(want) {
						t.Errorf("%s = %v, model %d", name, got, want)
					}
				}
				t.Logf("%d records, %d aborted transactions: %v, %d live keys, %d copies, %d sub-filters",
					records, aborts, m.counts, len(m.count), m.copies(), st.SubFilters)
			})
		}
	}
}

// TestOccurrenceLimitHotKey: a key repeated 10,000 times with
// MaxOccurrences 8 is forwarded 8 times and then over the limit, and the
// chain holds 8 copies in one sub-filter: a hot key never grows it. A
// delete removes all 8; the next 8 records are forwarded again.
func TestOccurrenceLimitHotKey(t *testing.T) {
	const limit = 8
	db := openDB(t, "", store.Options{})
	p := openPartition(t, db, "orders", 0, Options{Filter: smallChain, MaxOccurrences: limit}, nil)
	defer p.Close()
	d := &decider{t: t, p: p}
	for range limit {
		d.expect(Forward, put, "hot")
	}
	for range 10_000 {
		d.expect(OverLimit, put, "hot")
	}
	if st := p.Stats(); st.Items != limit || st.SubFilters != 1 {
		t.Fatalf("after 10,008 records of one key: %d fingerprints in %d sub-filters, want %d in 1", st.Items, st.SubFilters, limit)
	}
	d.expect(Delete, tombstone, "hot")
	if st := p.Stats(); st.Items != 0 {
		t.Fatalf("after the delete: %d fingerprints, want 0", st.Items)
	}
	for range limit {
		d.expect(Forward, put, "hot")
	}
	d.expect(OverLimit, put, "hot")
}

// TestOccurrenceLimitChanged: state written with one limit is decided with
// another. Lowered to 1, a key with 3 copies is a Duplicate, and its
// tombstone removes all 3, so the next record is forwarded (a delete that
// removed one copy would drop it: a lost event). Raised to 5, the same key
// gets 2 more forwards.
func TestOccurrenceLimitChanged(t *testing.T) {
	const topic, partition = "orders", 2
	db := openDB(t, "", store.Options{})
	reopen := func(limit int, off int64) (*Deduplicator, *decider) {
		p := openPartition(t, db, topic, partition, Options{Filter: smallChain, MaxOccurrences: limit}, nil)
		return p, &decider{t: t, p: p, off: off}
	}
	p, d := reopen(3, 0)
	d.expect(Forward, put, "a", "a", "a", "b", "b", "b")
	d.expect(OverLimit, put, "a", "b")
	if err := p.Commit(store.Checkpoint{Offset: d.off}); err != nil {
		t.Fatal(err)
	}
	p.Close()

	p, d = reopen(5, d.off)
	d.expect(Forward, put, "b", "b")
	d.expect(OverLimit, put, "b")
	p.Close() // uncommitted: the next reopen sees 3 copies of b again

	p, d = reopen(1, d.off)
	defer p.Close()
	d.expect(Duplicate, put, "a")
	d.expect(Delete, tombstone, "a")
	d.expect(Forward, put, "a")
	d.expect(Duplicate, put, "a", "b")
}

// TestOccurrenceLimitChangedAgainstModel: KDEDUP_MAX_OCCURRENCES changes
// between runs over one state, and every decision is the exact model's
// under the limit of the run: the model counts, per key, the records
// forwarded since its last delete whatever limit forwarded them, which is
// what the state holds (one copy per forwarded record), and a run forwards
// a key's record while that count is under its limit (with limit 1 a
// record over it is a Duplicate). Each run reopens the committed state
// with the next limit, raised and lowered, staged or not.
func TestOccurrenceLimitChangedAgainstModel(t *testing.T) {
	const (
		perRun    = 6_000
		keySpace  = 600
		topic     = "orders"
		partition = 4
	)
	limits := []int{3, 1, 8, 2, 5, 1, 4}
	db := openDB(t, "", store.Options{})
	rng := rand.New(rand.NewPCG(3, 4))
	m := newLimitModel(0)
	seen := map[Decision]int{}
	for run, limit := range limits {
		opts := Options{Filter: smallChain, MaxOccurrences: limit, Staged: run%2 == 1}
		p := openPartition(t, db, topic, partition, opts, nil)
		m.limit = limit
		for i := range perRun {
			off := run*perRun + i
			kind := put
			if rng.IntN(100) < 3 {
				kind = tombstone
			}
			key := fmt.Sprintf("user-%d", rng.IntN(keySpace))
			r := keyModes["key"].render(kind, key)
			r.Topic, r.Partition, r.Offset = topic, partition, int64(off)
			before := m.count[key]
			want := m.decide(kind, key)
			if want == OverLimit && limit == 1 {
				want = Duplicate
			}
			got, err := p.Decide(r)
			if err != nil {
				t.Fatal(err)
			}
			if got != want {
				t.Fatalf("run %d (limit %d) offset %d: key %q forwarded %d times since its delete: Decide = %v, model says %v", run, limit, off, key, before, got, want)
			}
			seen[got]++
		}
		if err := p.CommitStaged(); err != nil {
			t.Fatal(err)
		}
		if err := p.Commit(store.Checkpoint{Offset: int64((run + 1) * perRun)}); err != nil {
			t.Fatal(err)
		}
		if st := p.Stats(); st.Items != uint64(m.copies()) {
			t.Fatalf("after run %d: filter holds %d fingerprints, model %d copies", run, st.Items, m.copies())
		}
		p.Close()
	}
	for _, d := range []Decision{Forward, Duplicate, OverLimit, Delete} {
		if seen[d] == 0 {
			t.Errorf("no record decided %v: the runs do not cover every decision", d)
		}
	}
	t.Logf("decisions over %d runs: %v", len(limits), seen)
}

func TestOpenRefusesMaxOccurrences(t *testing.T) {
	for _, tc := range []struct {
		limit, bucket int
		ok            bool
	}{
		{0, 0, true},
		{1, 0, true},
		{8, 0, true}, // 2*b with the default b=4
		{9, 0, false},
		{-1, 0, false},
		{4, 2, true},
		{5, 2, false},
		{16, 8, true},
		{17, 8, false},
	} {
		t.Run(fmt.Sprintf("max=%d/b=%d", tc.limit, tc.bucket), func(t *testing.T) {
			db := openDB(t, "", store.Options{})
			fp := smallChain
			fp.BucketSize = tc.bucket
			p, err := Open(db, "orders", 0, Options{Filter: fp, MaxOccurrences: tc.limit}, nil)
			if tc.ok {
				if err != nil {
					t.Fatalf("Open: %v", err)
				}
				p.Close()
				return
			}
			if err == nil {
				p.Close()
				t.Fatal("Open accepted the limit")
			}
			if !errors.Is(err, ErrOptions) || IsStateError(err) {
				t.Errorf("Open: %v; want ErrOptions, not a state error", err)
			}
		})
	}
}

// TestMaxDirtyPagesPerRecord: MaxDirtyPagesPerRecord bounds, from the
// start (a static bound: a transaction sized before the chain grows must
// still fit), the pages every record dirties while a chain grows 64 times
// in place: an insert that splits its page dirties two pages, a delete of
// a key with MaxOccurrences copies at most that many, and no record more
// than the bound.
func TestMaxDirtyPagesPerRecord(t *testing.T) {
	db := openDB(t, "", store.Options{})
	for _, tc := range []struct {
		opts Options
		want int
	}{
		{Options{Filter: smallChain}, filter.MaxPagesChangedByInsert},
		{Options{Filter: smallChain, Refresh: true, MaxOccurrences: 2}, filter.MaxPagesChangedByInsert + 1},
		{Options{Filter: smallChain, MaxOccurrences: 8}, 8},
	} {
		p := openPartition(t, db, "orders", int32(tc.want), tc.opts, nil)
		if n := p.MaxDirtyPagesPerRecord(); n != tc.want {
			t.Fatalf("MaxDirtyPagesPerRecord with %+v = %d, want %d", tc.opts, n, tc.want)
		}
		d := &decider{t: t, p: p}
		most := 0
		for i := range 64 * 1024 {
			k := fmt.Sprintf("k-%d", i)
			d.expect(Forward, put, k)
			if i%5 == 0 && tc.opts.MaxOccurrences > 1 {
				for range tc.opts.MaxOccurrences - 1 {
					d.expect(Forward, put, k)
				}
				if err := p.Commit(store.Checkpoint{Offset: d.off}); err != nil {
					t.Fatal(err)
				}
				d.expect(Delete, tombstone, k)
			}
			most = max(most, p.state.DirtyPages())
			if err := p.Commit(store.Checkpoint{Offset: d.off}); err != nil {
				t.Fatal(err)
			}
		}
		if st := p.Stats(); st.Splits == 0 || most < 2 {
			t.Fatalf("%d splits, at most %d pages dirtied by a record: the test proves nothing", st.Splits, most)
		}
		if most > tc.want {
			t.Fatalf("a record dirtied %d pages, MaxDirtyPagesPerRecord %d", most, tc.want)
		}
		p.Close()
	}
}
