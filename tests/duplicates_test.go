package tests

import (
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kdedup/kdedup/internal/scenario"
)

// requireDropped checks the duplicates topic against the model: the same
// records per key in order (value, timestamp, original headers, then
// kdedup-reason and kdedup-source), and, independently of the model, that
// each one's kdedup-source names an input record with its key and value
// and that its reason is reason.
func requireDropped(t *testing.T, recs []*kgo.Record, want, got scenario.Model, read []*kgo.Record, reason string) {
	t.Helper()
	if diffs := scenario.Diff(want, got, 10); len(diffs) > 0 {
		for _, d := range diffs {
			t.Error(d)
		}
		t.Fatalf("duplicates topic differs from the model's dropped records (%d expected, %d read)", want.Stats.Forwarded, got.Stats.Forwarded)
	}
	if want.Stats.Forwarded == 0 {
		t.Fatal("the model drops nothing: the test checks nothing")
	}
	in := map[string]*kgo.Record{}
	for _, r := range recs {
		in[fmt.Sprintf("%s/%d/%d", r.Topic, r.Partition, r.Offset)] = r
	}
	for _, r := range read {
		n := len(r.Headers)
		if n < 2 || r.Headers[n-2].Key != "kdedup-reason" || string(r.Headers[n-2].Value) != reason || r.Headers[n-1].Key != "kdedup-source" {
			t.Fatalf("dropped record %q at %s/%d/%d: headers %v, want kdedup-reason=%s and kdedup-source last", r.Key, r.Topic, r.Partition, r.Offset, r.Headers, reason)
		}
		src := in[string(r.Headers[n-1].Value)]
		if src == nil || string(src.Key) != string(r.Key) || string(src.Value) != string(r.Value) || !src.Timestamp.Equal(r.Timestamp) {
			t.Fatalf("dropped record %q: kdedup-source %s does not name an input record with its key, value and timestamp", r.Key, r.Headers[n-1].Value)
		}
	}
	t.Logf("duplicates topic equals the model: %d dropped records, reason %s", len(read), reason)
}

// TestDuplicatesTopic (also the second-worker suite) sends dropped records to KDEDUP_DUPLICATES_TOPIC
// while a second worker joins mid-stream and rebuilds the partitions it
// takes by replay: the output topic is exactly the model's, and the
// duplicates topic holds exactly the model's dropped records, each once
// (replayed records produce nothing), with kdedup-reason=duplicate and the
// input record's position in kdedup-source.
func TestDuplicatesTopic(t *testing.T) {
	deliveries(t, func(t *testing.T, delivery string) {
		p := newPipeline(t, 6)
		p.delivery = delivery
		p.withDuplicatesTopic(t, 3)
		recs := stream(8)
		f := p.feed(t, recs, 100, 5*time.Millisecond)
		a := p.startWorker(t, t.TempDir())
		f.until(len(recs) / 3)
		b := p.startWorker(t, t.TempDir())
		p.waitMembers(t, 2)
		f.wait(t)
		want, got := p.output(t, recs)
		wantDropped, gotDropped, read := p.dropped(t, recs)
		a.stop(t)
		b.stop(t)
		requireExact(t, want, got)
		requireDropped(t, recs, wantDropped, gotDropped, read, "duplicate")
		if n := b.metric(t, "kdedup_replayed_records_total"); n == 0 {
			t.Error("the second worker replayed nothing: the test does not show that replays produce no dropped records")
		}
	})
}
