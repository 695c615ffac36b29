package tests

import (
	"testing"

	"github.com/kdedup/kdedup/internal/scenario"
)

// TestOccurrenceLimit runs the worker with KDEDUP_MAX_OCCURRENCES=3 over a
// stream with producer retries, replays, hot keys and tombstones: each key
// is forwarded up to 3 times between tombstones, exactly as the model says;
// the records over the limit are counted in kdedup_over_limit_records_total,
// none as duplicates, and reach the duplicates topic with
// kdedup-reason=occurrence-limit.
func TestOccurrenceLimit(t *testing.T) {
	deliveries(t, func(t *testing.T, delivery string) {
		p := newPipeline(t, 4)
		p.delivery = delivery
		p.maxOcc = 3
		p.withDuplicatesTopic(t, 2)
		recs := stream(7)
		p.feed(t, recs, len(recs), 0).wait(t)
		w := p.startWorker(t, t.TempDir())
		want, got := p.output(t, recs)
		wantDropped, gotDropped, read := p.dropped(t, recs)
		w.stop(t)
		requireExact(t, want, got)
		requireDropped(t, recs, wantDropped, gotDropped, read, "occurrence-limit")

		dedupOnly := scenario.Expect(recs, true)
		if want.Stats.OverLimit == 0 || want.Stats.Forwarded <= dedupOnly.Stats.Forwarded {
			t.Fatalf("the stream does not exercise the limit: %+v, %d forwarded with a limit of 1", want.Stats, dedupOnly.Stats.Forwarded)
		}
		if n := w.metric(t, "kdedup_over_limit_records_total"); n != float64(want.Stats.OverLimit) {
			t.Errorf("kdedup_over_limit_records_total = %.0f, model %d", n, want.Stats.OverLimit)
		}
		if n := w.metric(t, "kdedup_duplicate_records_total"); n != 0 {
			t.Errorf("kdedup_duplicate_records_total = %.0f with a limit of 3, want 0", n)
		}
		t.Logf("limit 3: %d forwarded, %d over the limit; a limit of 1 forwards %d", want.Stats.Forwarded, want.Stats.OverLimit, dedupOnly.Stats.Forwarded)
	})
}
