package dedup

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kdedup/kdedup/filter"
	"github.com/kdedup/kdedup/store"
)

// TestStateBytes: Metrics.StateBytes and kdedup_state_bytes are the sum of
// the open partitions' chain bytes (filter.Stats.Bytes) after each write
// batch, as a chain grows a sub-filter, and as partitions close.
func TestStateBytes(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	db := openDB(t, "", store.Options{})
	opts := Options{Filter: smallChain}
	parts := []*Deduplicator{
		openPartition(t, db, "orders", 0, opts, m),
		openPartition(t, db, "orders", 1, opts, m),
		openPartition(t, db, "orders", 2, opts, m),
	}
	check := func(when string, open []*Deduplicator) {
		t.Helper()
		var want int64
		for _, p := range open {
			want += int64(p.Stats().Bytes)
		}
		if got := m.StateBytes(); got != want {
			t.Errorf("%s: StateBytes = %d, the open chains hold %d", when, got, want)
		}
		if got := gaugeValue(t, reg, "kdedup_state_bytes"); got != float64(want) {
			t.Errorf("%s: kdedup_state_bytes = %v, want %d", when, got, want)
		}
	}
	check("opened", parts)
	if m.StateBytes() == 0 {
		t.Fatal("three empty chains hold no bytes: the test proves nothing")
	}
	before := parts[0].Stats().Bytes
	d := &decider{t: t, p: parts[0]}
	d.expect(Forward, put, keyRange("k", 0, 4000)...) // 4x the first sub-filter's capacity
	if err := parts[0].Commit(store.Checkpoint{Offset: d.off}); err != nil {
		t.Fatal(err)
	}
	if parts[0].Stats().Bytes == before {
		t.Fatal("the chain did not grow: the test proves nothing")
	}
	check("after growth", parts)
	parts[1].Close()
	check("one closed", []*Deduplicator{parts[0], parts[2]})
	parts[1].Close() // twice: nothing more
	check("closed twice", []*Deduplicator{parts[0], parts[2]})
	parts[0].Close()
	parts[2].Close()
	check("all closed", nil)
}

// gaugeValue returns the value of the gauge name, a family of one series.
func gaugeValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no single series %s", name)
	return 0
}

// TestMaxPagesPerRecordBoundsStaging: with staged changes (exactly once),
// no record stages more pages than MaxPagesPerRecord said before it was
// decided, as the chain grows to several sub-filters, with deletes,
// repeats, a limit of two copies and staged rounds committed or
// discarded; and the store counts the overlay's pages
// (store.DB.DirtyPageBytes) as they are staged, dirty once committed.
func TestMaxPagesPerRecordBoundsStaging(t *testing.T) {
	db := openDB(t, "", store.Options{PageBytes: 512})
	// Small pages, so that sub-filters have many and a record's lookup
	// reads pages no earlier record of its round read.
	chain := smallChain
	chain.PageBytes, chain.Capacity = 512, 256
	opts := Options{Filter: chain, Staged: true, MaxOccurrences: 2, DeleteHeader: deleteHeader, DeleteValue: deleteValue,
		HashSeed: filter.Seed{K0: 3, K1: 4}} // the same pages every run

	p := openPartition(t, db, "orders", 0, opts, nil)
	defer p.Close()
	rng := rand.New(rand.NewPCG(7, 8))
	pageBytes := int64(p.chain.Params().PageBytes)
	var off, committed int64
	most := 0
	for i := range 20000 {
		kinds := []recordKind{put, put, put, tombstone, marker}
		kind := kinds[rng.IntN(len(kinds))]
		r := keyModes["key"].render(kind, fmt.Sprintf("k%d", rng.IntN(8000)))
		r.Offset = off
		off++
		bound := p.MaxPagesPerRecord()
		before := p.overlay.Staged()
		if _, err := p.Decide(r); err != nil {
			t.Fatal(err)
		}
		got := p.overlay.Staged() - before
		if got > bound {
			t.Fatalf("record %d (%v) staged %d pages, MaxPagesPerRecord said %d", i, kind, got, bound)
		}
		most = max(most, got)
		if got, want := db.DirtyPageBytes(), int64(p.overlay.Staged()+p.state.DirtyPages())*pageBytes; got != want {
			t.Fatalf("record %d: the store counts %d bytes of pages, the overlay and dirty pages hold %d", i, got, want)
		}
		switch rng.IntN(40) {
		case 0:
			if err := p.CommitStaged(); err != nil {
				t.Fatal(err)
			}
			if err := p.Commit(store.Checkpoint{Offset: off}); err != nil {
				t.Fatal(err)
			}
			committed = off
		case 1:
			if err := p.DiscardStaged(); err != nil {
				t.Fatal(err)
			}
			off = committed // the input is read again
		}
	}
	if p.Stats().Splits < 3 {
		t.Fatalf("%d splits: the chain did not grow, the test proves little", p.Stats().Splits)
	}
	t.Logf("%d sub-filters; a record staged at most %d pages", p.Stats().SubFilters, most)
	if most < 2 {
		t.Fatalf("no record staged more than %d pages (a split stages two): the test proves little", most)
	}
}
