package dedup

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

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
	before := parts[0].Stats().SubFilters
	d := &decider{t: t, p: parts[0]}
	d.expect(Forward, put, keyRange("k", 0, 4000)...) // 4x the first sub-filter's capacity
	if err := parts[0].Commit(store.Checkpoint{Offset: d.off}); err != nil {
		t.Fatal(err)
	}
	if parts[0].Stats().SubFilters == before {
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
