package tests

import (
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kdedup/kdedup/internal/app"
	"github.com/kdedup/kdedup/internal/scenario"
	"github.com/kdedup/kdedup/store"
)

// TestDirtyPagesBoundedAcrossPartitions: the dirty pages of all
// partitions together stay under 1.5 times the worker's dirty-page bound
// (consumer.Options.MaxDirtyPageBytes, a share of KDEDUP_MEMORY_BYTES)
// plus one record's pages per partition, while deciding a backlog (both
// delivery modes) and while rebuilding it by replay, with write batches
// otherwise cut only every 10 s and 8 MiB: 8 partitions of about 1,200
// pages (4.7 MiB) each, nearly all changed within one flush interval,
// against a bound of 4 MiB, which one partition's replay alone passes
// without it. The peak (kdedup_store_dirty_page_peak_bytes) must reach the
// bound, so that the bound is what held it, and the output is exactly the
// model's.
func TestDirtyPagesBoundedAcrossPartitions(t *testing.T) {
	const (
		partitions = 8
		bound      = 4 << 20 // a partition's half share, 256 KiB: store.MinCutPages pages
		pageBytes  = 4 << 10
		limit      = bound*3/2 + partitions*pageBytes // one page a record (MAX_OCCURRENCES 1)
	)
	deliveries(t, func(t *testing.T, delivery string) {
		p, recs := boundedBacklog(t, partitions, delivery, bound, 40000)

		check := func(what string, w *worker) {
			t.Helper()
			peak := w.metric(t, "kdedup_store_dirty_page_peak_bytes")
			t.Logf("%s: dirty pages peaked at %.0f bytes (bound %d, limit %d)", what, peak, bound, limit)
			if peak > limit {
				t.Errorf("%s: dirty pages peaked at %.0f bytes, over 1.5 x the bound %d plus a page per partition (%d)", what, peak, bound, limit)
			}
			if peak < bound {
				t.Errorf("%s: dirty pages peaked at %.0f bytes, under the bound %d: the test proves nothing", what, peak, bound)
			}
		}
		w := p.startWorker(t, t.TempDir())
		want, got := p.output(t, recs)
		requireExact(t, want, got)
		check("deciding", w)
		w.stop(t)

		// A worker with an empty disk rebuilds every partition by replay,
		// all of them at once.
		w = p.startWorker(t, t.TempDir())
		waitReadyOwning(t, w, partitions)
		if n := w.metric(t, "kdedup_replayed_records_total"); n != float64(len(recs)) {
			t.Fatalf("replayed %v records, want %d", n, len(recs))
		}
		check("replaying", w)
		w.stop(t)
	})
}

// TestManyPartitionsUnderTheFloor (exactly once): with a dirty-page bound
// whose share per partition (16 KiB, 4 pages) is under store.MinCutPages,
// no partition is asked to cut for it, and transactions must still hold
// many records: the poll budget's ceiling is the floor's, MinCutPages a
// partition, not 1.5 x the bound (which left every transaction one record
// long until the flush interval). The changed pages stay under that
// ceiling plus a page per partition, and the output is exactly the
// model's.
func TestManyPartitionsUnderTheFloor(t *testing.T) {
	const (
		partitions = 8
		bound      = 256 << 10
		pageBytes  = 4 << 10
		limit      = partitions*store.MinCutPages*pageBytes + partitions*pageBytes
	)
	p, recs := boundedBacklog(t, partitions, "exactly-once", bound, 20000)
	w := p.startWorker(t, t.TempDir())
	want, got := p.output(t, recs)
	mfs, err := w.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	peak := w.metric(t, "kdedup_store_dirty_page_peak_bytes")
	w.stop(t)
	requireExact(t, want, got)
	txns := histogram(t, mfs, "kdedup_transaction_records")
	mean := txns.GetSampleSum() / float64(txns.GetSampleCount())
	t.Logf("%d transactions, %.0f records each on average; dirty pages peaked at %.0f bytes (limit %d)", txns.GetSampleCount(), mean, peak, limit)
	if mean < 100 {
		t.Errorf("transactions held %.0f records on average: the poll budget starved under the floor", mean)
	}
	if peak > limit {
		t.Errorf("dirty pages peaked at %.0f bytes, over %d pages a partition (store.MinCutPages) plus a page each (%d)", peak, store.MinCutPages, limit)
	}
}

// boundedBacklog is a pipeline of partitions whose filters hold about
// 1,200 pages each (KDEDUP_CAPACITY 1,200,000), write batches otherwise cut
// only every 10 s, in-process workers with a dirty-page bound of bound
// bytes, and an input of n records with distinct keys, all produced.
func boundedBacklog(t *testing.T, partitions int32, delivery string, bound int64, n int) (*pipeline, []*kgo.Record) {
	t.Helper()
	p := newPipeline(t, partitions)
	p.delivery = delivery
	p.extraEnv = map[string]string{"KDEDUP_CAPACITY": "1200000", "KDEDUP_FLUSH_INTERVAL": "10s", "KDEDUP_SESSION_TIMEOUT": "10s"}
	p.appOpts = []app.Option{app.WithMaxDirtyPageBytes(bound)}
	recs := make([]*kgo.Record, n)
	for i := range recs {
		recs[i] = &kgo.Record{Key: fmt.Appendf(nil, "key-%06d", i), Value: []byte("v"), Timestamp: scenario.Base.Add(time.Duration(i) * time.Millisecond)}
	}
	p.feed(t, recs, len(recs), 0).wait(t)
	return p, recs
}
