package tests

import (
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kdedup/kdedup/internal/scenario"

	"github.com/kdedup/kdedup/store"
)

// TestIdleConsolidation: a stream fed in small chunks over many flush
// intervals leaves pages whose changes are in the log; once the
// partitions are idle the worker writes every one of them back whole
// (store.PendingPages and LogEntries are 0 after a graceful stop, with
// pages consolidated counted), and the state is the same: the whole
// stream fed again is all duplicates, as the exact model says.
func TestIdleConsolidation(t *testing.T) {
	deliveries(t, func(t *testing.T, delivery string) {
		p := newPipeline(t, 2)
		p.delivery = delivery
		dir := t.TempDir()
		w := p.startWorker(t, dir)
		// Distinct keys and repeats, no deletes: fed again, every record is
		// a duplicate.
		var recs []*kgo.Record
		for i := range 3000 {
			k := fmt.Sprintf("key-%05d", i*7%2500)
			recs = append(recs, &kgo.Record{Key: []byte(k), Value: []byte(fmt.Sprint(i)), Timestamp: scenario.Base.Add(time.Duration(i) * time.Millisecond)})
		}
		p.feed(t, recs, 100, 50*time.Millisecond).wait(t)
		want, got := p.output(t, recs)
		requireExact(t, want, got)
		// A last chunk of new keys once the worker has caught up: its
		// write batches are logged however the stream before was batched
		// (a Kafka session restarted under load decides the whole backlog
		// in one batch that rewrites every page whole, leaving nothing to
		// write back).
		var late []*kgo.Record
		for i := range 40 {
			late = append(late, &kgo.Record{Key: fmt.Appendf(nil, "late-%02d", i), Value: []byte("late"), Timestamp: scenario.Base.Add(time.Hour)})
		}
		p.feed(t, late, len(late), 0).wait(t)
		recs = append(recs, late...)
		want, got = p.output(t, recs)
		requireExact(t, want, got)

		// Idle: consolidation starts 10 flush intervals (1 s) after the
		// last record and writes a partition's pending pages back in steps
		// of up to half of FlushBytes, one a flush interval; these pages
		// take one.
		const metric = "kdedup_store_pages_consolidated_total"
		deadline := time.Now().Add(30 * time.Second)
		last, lastChange := 0.0, time.Now()
		for {
			w.running(t)
			if v := w.metric(t, metric); v != last {
				last, lastChange = v, time.Now()
			}
			if last > 0 && time.Since(lastChange) > 3*time.Second {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s = %v after 30 s idle", metric, last)
			}
			time.Sleep(100 * time.Millisecond)
		}

		// The state survived: the same records again are all duplicates.
		p.feed(t, recs, len(recs), 0).wait(t)
		var twice []*kgo.Record
		for _, r := range append(append(recs[:0:0], recs...), recs...) {
			twice = append(twice, &kgo.Record{Key: r.Key, Value: r.Value, Timestamp: r.Timestamp})
		}
		want, got = p.output(t, twice)
		requireExact(t, want, got)
		w.stop(t)

		db, err := store.Open(store.Options{Dir: dir, ReadOnly: true})
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		for part := range p.partitions {
			sp, err := db.Partition(p.in, part)
			if err != nil {
				t.Fatal(err)
			}
			n, logs := sp.PendingPages(), sp.LogEntries()
			sp.Close()
			if n != 0 || logs != 0 {
				t.Errorf("partition %d keeps %d pages pending and %d log entries after idling", part, n, logs)
			}
		}
		t.Logf("%v pages consolidated", last)
	})
}
