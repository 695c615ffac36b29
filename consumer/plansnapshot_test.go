package consumer

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kdedup/kdedup/dedup"
	"github.com/kdedup/kdedup/filter"
	"github.com/kdedup/kdedup/store"
)

// TestPlanCancelledByRebalance: franz-go cancels the context of
// AdjustFetchOffsetsFn when a rebalance starts during planning. A plan
// so cancelled must be a cancellation: no start recorded, no store marked
// down, nothing decided about the partition; the plan of the next session
// (a live context) then restores the partition from its snapshot and
// replays nothing. Before, the cancelled listing counted as a store
// outage: the partition (and every other for 30 s) replayed the whole
// input, or with KDEDUP_REBUILD=empty started with an empty filter, a
// decision franz-go's second call then kept.
func TestPlanCancelledByRebalance(t *testing.T) {
	for _, delivery := range []Delivery{AtLeastOnce, ExactlyOnce} {
		for _, rebuildEmpty := range []bool{false, true} {
			t.Run(fmt.Sprintf("%v/rebuild-empty=%t", delivery, rebuildEmpty), func(t *testing.T) {
				testPlanCancelled(t, delivery, rebuildEmpty)
			})
		}
	}
}

func testPlanCancelled(t *testing.T, delivery Delivery, rebuildEmpty bool) {
	const records = 20
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "in", "out"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.DefaultProduceTopic("in"), kgo.ClientID("custom"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	var recs []*kgo.Record
	for i := range records {
		r := &kgo.Record{Key: fmt.Appendf(nil, "k%d", i), Value: []byte("v")}
		if err := cl.ProduceSync(context.Background(), r).FirstErr(); err != nil {
			t.Fatal(err)
		}
		recs = append(recs, r)
	}
	dopts := dedup.Options{HashSeed: filter.Seed{K0: 1, K1: 2}, Staged: delivery == ExactlyOnce}

	// A snapshot at offset 20 of a state that decided every record.
	snaps := fileSnapshots(t)
	{
		db, err := store.Open(store.Options{Dir: t.TempDir(), Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		op, err := dedup.NewOpener(db, dedup.Options{HashSeed: dopts.HashSeed}, nil)
		if err != nil {
			t.Fatal(err)
		}
		d, err := op.Open("in", 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range recs {
			if err := d.Replay(r); err != nil {
				t.Fatal(err)
			}
		}
		if err := d.Commit(store.Checkpoint{Offset: records, LeaderEpoch: -1}); err != nil {
			t.Fatal(err)
		}
		tp := store.TopicPartition{Topic: "in", Partition: 0}
		if _, err := snaps.Put(context.Background(), tp, func(h func(store.Image) error, p func(filter.PageID, []byte) error) (bool, error) {
			return op.Export(tp, h, p)
		}); err != nil {
			t.Fatal(err)
		}
		d.Close()
		if err := db.Close(); err != nil {
			t.Fatal(err)
		}
	}

	db := diskStore(t)
	opener, err := dedup.NewOpener(db, dopts, nil)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	w, err := New(Options{Brokers: c.ListenAddrs(), InputTopics: []string{"in"}, OutputTopic: "out", Dedup: opener, Delivery: delivery,
		RebuildEmpty: rebuildEmpty, Snapshots: snaps, Logger: slog.New(slog.DiscardHandler), FlushInterval: 50 * time.Millisecond,
		SessionTimeout: 5 * time.Second, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	w.mu.connected = make(chan struct{})
	w.publish(nil, cl)
	d, err := opener.Open("in", 0)
	if err != nil {
		t.Fatal(err)
	}
	pw := assignForPlan(w, cl, "in", 0, d)
	w.ready.Store(true)
	t.Cleanup(func() { pw.stopReplay(true) })
	offsets := func() map[string]map[int32]kgo.Offset {
		return map[string]map[int32]kgo.Offset{"in": {0: kgo.NewOffset().At(records)}}
	}

	// A rebalance begins while the plan lists the partition's offsets:
	// franz-go cancels the plan's context.
	cancelled, cancel := context.WithCancel(context.Background())
	c.ControlKey(int16(kmsg.ListOffsets), func(kmsg.Request) (kmsg.Response, error, bool) {
		cancel()
		return nil, nil, false
	})
	if _, err := w.adjustOffsets(cancelled, offsets()); err == nil {
		t.Fatalf("a plan whose context was cancelled returned no error; its partition starts at %v", pw.plan.start)
	}
	if pw.plan.hasStart || pw.owner() == ownerRestore {
		t.Fatalf("a cancelled plan recorded a start (%t) or began a restore (owner %d)", pw.plan.hasStart, pw.owner())
	}

	if _, err := w.adjustOffsets(context.Background(), offsets()); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for (pw.owner() != ownerLoop || !w.Ready()) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if pw.owner() != ownerLoop {
		t.Fatalf("the partition's restore did not end within 20s (owner %d)", pw.owner())
	}
	if n := testutil.ToFloat64(w.snaps.m.restores.WithLabelValues("snapshot")); n != 1 {
		t.Errorf("restored from a snapshot %v times, want 1 (replay %v)", n, testutil.ToFloat64(w.snaps.m.restores.WithLabelValues("replay")))
	}
	if cp, ok := d.Checkpoint(); !ok || cp.Offset != records {
		t.Errorf("checkpoint %v (%t) after the restore, want %d", cp, ok, records)
	}
	for _, r := range recs {
		dec, err := d.Decide(&kgo.Record{Key: r.Key, Value: r.Value, Offset: records})
		if err != nil {
			t.Fatal(err)
		}
		if d.Forwards(dec) {
			t.Fatalf("key %s forwarded after the restore: the snapshot's keys are not in the filter", r.Key)
		}
	}
}
