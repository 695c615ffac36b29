package dedup

import (
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kdedup/kdedup/filter"
	"github.com/kdedup/kdedup/store"
)

// TestWindowOnePageAnOperation decides records one millisecond of record
// time apart over 16 generations of a window (two passes of the sweep), each key forwarded once and
// repeated once, and checks that a window costs the page reads of no
// window: every record is one filter operation reading one page of the
// one sub-filter, two more per split (kdedup_filter_page_reads_total =
// operations + 2 x splits); that the sweep's page reads are counted apart
// (kdedup_filter_pages_swept_total, the chain's SweptPages, at least one
// pass over the pages); and that expiry kept the chain to the keys of
// G+1 generations at most.
func TestWindowOnePageAnOperation(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	db := openDB(t, "", store.Options{})
	fp := filter.Params{FingerprintBits: 28, Capacity: 1024, Window: 8 * time.Second, Generations: 8}
	p := openPartition(t, db, "orders", 0, Options{Filter: fp}, m)
	defer p.Close()
	span := fp.WithDefaults().SpanMillis()
	base := int64(1_750_000_000_000)
	records := 0
	for i := range 16 * span {
		for _, want := range []Decision{Forward, Duplicate} {
			r := keyModes["key"].render(put, fmt.Sprintf("k%d", i))
			r.Offset, r.Timestamp = int64(records), time.UnixMilli(base+i)
			records++
			if got, err := p.Decide(r); err != nil || got != want {
				t.Fatalf("record %d: Decide = %v, %v; want %v", records, got, err, want)
			}
		}
	}
	if err := p.Commit(store.Checkpoint{Offset: int64(records)}); err != nil {
		t.Fatal(err)
	}
	st := p.Stats()
	if st.SubFilters != 1 {
		t.Fatalf("%d sub-filters: the window grew a chain", st.SubFilters)
	}
	if st.Items > uint64(9*span) {
		t.Errorf("%d keys held, more than G+1 = 9 generations of %d", st.Items, span)
	}
	ops := counterValue(t, reg, "kdedup_filter_operations_total", "orders", "0")
	reads := counterValue(t, reg, "kdedup_filter_page_reads_total", "orders", "0")
	swept := counterValue(t, reg, "kdedup_filter_pages_swept_total", "orders", "0")
	if ops != float64(records) {
		t.Errorf("kdedup_filter_operations_total = %v, %d records decided", ops, records)
	}
	if want := float64(records) + 2*float64(st.Splits); reads != want {
		t.Errorf("kdedup_filter_page_reads_total = %v, want %v (%d operations of one page, %d splits of two)", reads, want, records, st.Splits)
	}
	if swept != float64(st.SweptPages) || st.SweptPages < st.Bytes/4096 {
		t.Errorf("kdedup_filter_pages_swept_total = %v, chain %d, %d pages", swept, st.SweptPages, st.Bytes/4096)
	}
}
