package consumer

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kdedup/kdedup/dedup"
	"github.com/kdedup/kdedup/filter"
	"github.com/kdedup/kdedup/store"
)

// TestAdjustOffsetsTwicePlansOnce: franz-go calls AdjustFetchOffsetsFn
// again for partitions whose previous offset fetch was canceled
// (cooperative: a heartbeat's REBALANCE_IN_PROGRESS cancels the fetch; the
// next session fetches the same partitions again), without calling
// OnPartitionsAssigned again. A partition whose replay the first call
// started keeps that one replay: planned twice, it ran a second restore
// goroutine on the same deduplicator, and the replay accounting
// (Worker.restoring) never returned to zero, so the worker never became
// ready.
func TestAdjustOffsetsTwicePlansOnce(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "in"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	prod, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.DefaultProduceTopic("in"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(prod.Close)
	for i := range 10 {
		if err := prod.ProduceSync(context.Background(), &kgo.Record{Key: []byte{byte(i)}, Value: []byte("v")}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}

	db, err := store.Open(store.Options{InMemory: true, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	opener, err := dedup.NewOpener(db, dedup.Options{HashSeed: filter.Seed{K0: 1, K1: 2}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	w, err := New(Options{Brokers: c.ListenAddrs(), InputTopics: []string{"in"}, OutputTopic: "out", Dedup: opener,
		Logger: slog.New(slog.DiscardHandler), FlushInterval: 50 * time.Millisecond, SessionTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ClientID("custom")) // a custom id: the params check is skipped
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	w.mu.connected = make(chan struct{})
	w.publish(nil, cl)

	d, err := opener.Open("in", 0)
	if err != nil {
		t.Fatal(err)
	}
	pw := assignForPlan(w, cl, "in", 0, d)
	w.ready.Store(true) // the group's assignment is complete
	t.Cleanup(func() { pw.stopReplay(true) })

	// The group's offset is 1000, no local state: a rebuild of [0, 1000) (the log
	// ends at 10, so the replay waits restoreIdle before it ends: a replay
	// still running at the second call, as a long one would be).
	offsets := func() map[string]map[int32]kgo.Offset {
		return map[string]map[int32]kgo.Offset{"in": {0: kgo.NewOffset().At(1000)}}
	}
	if _, err := w.adjustOffsets(context.Background(), offsets()); err != nil {
		t.Fatal(err)
	}
	// The same partitions again, as after a canceled fetch.
	if _, err := w.adjustOffsets(context.Background(), offsets()); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for !w.Ready() && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if !w.Ready() {
		t.Errorf("not ready 20s after two plans of one replay of 10 records: restoring %d, partition owner %d, replay left %d",
			w.restoring.Load(), pw.owner(), pw.gauges.replayLeft.Load())
	}
}

// assignForPlan registers d as an assigned partition of w awaiting its
// plan, as Worker.assigned does, and returns it.
func assignForPlan(w *Worker, cl *kgo.Client, topic string, p int32, d *dedup.Deduplicator) *partitionWorker {
	pw := newPartition(w, cl, topic, p, d)
	pw.plan.awaiting.Store(true)
	w.unplanned.Add(1)
	w.mu.parts[store.TopicPartition{Topic: topic, Partition: p}] = pw
	return pw
}
