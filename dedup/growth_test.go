package dedup

import (
	"fmt"
	"strconv"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kdedup/kdedup/filter"
	"github.com/kdedup/kdedup/store"
)

// TestGrowthMetrics grows a partition's chain 32 times in place with new
// keys, repeats and deletes, and checks the growth metrics against the
// chain and an exact count of operations: every record is one filter
// operation (kdedup_filter_operations_total); with one sub-filter each
// reads one page and each split two more, so kdedup_filter_page_reads_total
// is exactly operations + 2 x splits (one page per lookup, insert and
// delete at any size); kdedup_filter_splits is the chain's; and
// kdedup_filter_entries sums to the items, each at a fingerprint length
// between the slot width less one and MaxDepth more.
func TestGrowthMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	db := openDB(t, "", store.Options{})
	// 32-bit slots, so that no key is a false positive.
	p := openPartition(t, db, "orders", 0, Options{Filter: filter.Params{FingerprintBits: 32, Capacity: 1024}}, m)
	defer p.Close()
	d := &decider{t: t, p: p}
	records := 0
	for i := range 32 * 1024 {
		k := fmt.Sprintf("k%d", i)
		d.expect(Forward, put, k)
		records++
		if i%7 == 0 {
			d.expect(Duplicate, put, k)
			records++
		}
		if i%11 == 0 {
			d.expect(Delete, tombstone, k)
			records++
		}
		if i%1000 == 0 {
			if err := p.Commit(store.Checkpoint{Offset: d.off}); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := p.Commit(store.Checkpoint{Offset: d.off}); err != nil {
		t.Fatal(err)
	}
	st := p.Stats()
	if st.SubFilters != 1 || st.Splits < 16 {
		t.Fatalf("%d sub-filters, %d splits: the chain did not grow in place", st.SubFilters, st.Splits)
	}
	ops := counterValue(t, reg, "kdedup_filter_operations_total", "orders", "0")
	reads := counterValue(t, reg, "kdedup_filter_page_reads_total", "orders", "0")
	if ops != float64(records) {
		t.Errorf("kdedup_filter_operations_total = %v, %d records decided", ops, records)
	}
	if want := float64(records) + 2*float64(st.Splits); reads != want {
		t.Errorf("kdedup_filter_page_reads_total = %v, want %v (%d operations of one page, %d splits of two)", reads, want, records, st.Splits)
	}
	if g, ok := metric(t, reg, "kdedup_filter_splits", "orders", "0"); !ok || g.GetGauge().GetValue() != float64(st.Splits) {
		t.Errorf("kdedup_filter_splits = %v, want %d", g.GetGauge().GetValue(), st.Splits)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	w := p.chain.SubFilters()[0].FingerprintBits
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != "kdedup_filter_entries" {
			continue
		}
		for _, s := range mf.GetMetric() {
			for _, l := range s.GetLabel() {
				if l.GetName() != "length" {
					continue
				}
				n, _ := strconv.Atoi(l.GetValue())
				if n < w-1 || n > w-1+filter.MaxDepth {
					t.Errorf("kdedup_filter_entries{length=%d}: outside %d..%d", n, w-1, w-1+filter.MaxDepth)
				}
			}
			sum += s.GetGauge().GetValue()
		}
	}
	if sum != float64(st.Items) {
		t.Errorf("kdedup_filter_entries sum to %v, the chain holds %d items", sum, st.Items)
	}
}
