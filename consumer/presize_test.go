package consumer

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kdedup/kdedup/filter"
)

// TestRebuildPresizesTheFilter: a partition without state rebuilds by
// replaying its input, whose length bounds its keys: the filter is sized
// for it before the replay (Deduplicator.Presize) and takes the keys
// without a page split, where the same keys replayed into a filter of the
// configured capacity split its page. Every key is a duplicate after the
// rebuild.
func TestRebuildPresizesTheFilter(t *testing.T) {
	for _, delivery := range []Delivery{AtLeastOnce, ExactlyOnce} {
		t.Run(delivery.String(), func(t *testing.T) { testRebuildPresizes(t, delivery) })
	}
}

func testRebuildPresizes(t *testing.T, delivery Delivery) {
	// One 4 KiB root page (about 1,560 slots) from the capacity; 2,500
	// distinct keys, each twice: 5,000 records presize for 2,500 keys.
	const distinct = 2500
	fp := filter.Params{Capacity: 64}
	keys := make([][]byte, 0, 2*distinct)
	for i := range 2 * distinct {
		keys = append(keys, fmt.Appendf(nil, "k%d", i%distinct))
	}
	f := newPlanFixture(t, delivery, keys, fp)
	if _, err := f.w.adjustOffsets(context.Background(), f.offsets()); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for f.pw.owner() != ownerLoop && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if f.pw.owner() != ownerLoop {
		t.Fatalf("the rebuild did not end within 20s (owner %d)", f.pw.owner())
	}
	if cp, ok := f.d.Checkpoint(); !ok || cp.Offset != f.records {
		t.Fatalf("checkpoint %v (%t) after the rebuild, want %d", cp, ok, f.records)
	}
	st := f.d.Stats()
	if st.Splits != 0 || st.SubFilters != 1 || st.Items != distinct {
		t.Errorf("after the rebuild: %d splits, %d sub-filters, %d items; want no split, one sub-filter, %d items", st.Splits, st.SubFilters, st.Items, distinct)
	}

	// The same keys in a chain of the configured capacity split.
	plain, err := filter.NewWithSeed(fp, filter.Seed{K0: 1, K1: 2}, filter.NewMemPager(fp.WithDefaults().PageBytes))
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		if _, err := plain.Insert(k); err != nil {
			t.Fatal(err)
		}
	}
	if plain.Stats().Splits == 0 {
		t.Fatalf("%d keys fit in the configured capacity without a split: the test shows nothing", distinct)
	}

	for _, k := range keys[:distinct] {
		dec, err := f.d.Decide(&kgo.Record{Key: k, Value: []byte("v"), Offset: f.records})
		if err != nil {
			t.Fatal(err)
		}
		if f.d.Forwards(dec) {
			t.Fatalf("key %s forwarded after the rebuild", k)
		}
	}
}
