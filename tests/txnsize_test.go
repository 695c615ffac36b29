package tests

import (
	"testing"

	dto "github.com/prometheus/client_model/go"
)

// TestTransactionsSizedByStagedBytes (exactly once): with FLUSH_BYTES of
// 16 pages (64 KiB) a transaction bounded by the worst case of one page per
// record would hold 16 records at most. Transactions are sized by time and
// by the staged bytes measured before each poll instead: on a backlog over
// a 2,000-key filter, whose few pages take many records each, some hold
// far more than 16 records; over a 1M-key filter, where most records stage
// a page of their own, the budget cuts them early. Either way every write
// batch stays within FLUSH_BYTES, one Badger transaction, and the output
// is exactly the model's.
func TestTransactionsSizedByStagedBytes(t *testing.T) {
	for _, tc := range []struct {
		name     string
		capacity string
		large    bool // some transaction holds more than the worst case allows
	}{
		{"few pages", "2000", true},
		// 1M keys a partition: hundreds of pages, most records stage a
		// page of their own, and the budget ends transactions early.
		{"many pages", "1000000", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPipeline(t, 2)
			p.delivery = "exactly-once"
			p.extraEnv = map[string]string{"KDEDUP_FLUSH_BYTES": "64KiB", "KDEDUP_TRANSACTION_INTERVAL": "100ms", "KDEDUP_CAPACITY": tc.capacity}
			recs := stream(19)
			p.feed(t, recs, len(recs), 0).wait(t)
			w := p.startWorker(t, t.TempDir())
			want, got := p.output(t, recs)
			mfs, err := w.reg.Gather()
			if err != nil {
				t.Fatal(err)
			}
			w.stop(t)
			requireExact(t, want, got)

			const worstCase = 16 // FLUSH_BYTES / PAGE_BYTES
			txns := histogram(t, mfs, "kdedup_transaction_records")
			above := txns.GetSampleCount() - bucketCount(txns, worstCase)
			t.Logf("%d of %d transactions held more than %d records (%.0f records in all)", above, txns.GetSampleCount(), worstCase, txns.GetSampleSum())
			if tc.large && above == 0 {
				t.Errorf("no transaction held more than %d records: sized by the worst case, not by the bytes staged", worstCase)
			}
			batches := histogram(t, mfs, "kdedup_write_batch_bytes")
			if over := batches.GetSampleCount() - bucketCount(batches, 64<<10); over != 0 {
				t.Errorf("%d of %d write batches wrote more than FLUSH_BYTES (64 KiB) of pages", over, batches.GetSampleCount())
			}
		})
	}
}

// histogram returns the one histogram named name in mfs.
func histogram(t *testing.T, mfs []*dto.MetricFamily, name string) *dto.Histogram {
	t.Helper()
	mf := family(mfs, name)
	if mf == nil || len(mf.GetMetric()) != 1 {
		t.Fatalf("%s: want one histogram, got %v", name, mf)
	}
	return mf.GetMetric()[0].GetHistogram()
}

// bucketCount returns the observations of h at or below le, which must be
// one of its bucket bounds.
func bucketCount(h *dto.Histogram, le float64) uint64 {
	for _, b := range h.GetBucket() {
		if b.GetUpperBound() == le {
			return b.GetCumulativeCount()
		}
	}
	panic("no bucket with that bound")
}
