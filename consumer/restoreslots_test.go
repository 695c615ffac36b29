package consumer

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kdedup/kdedup/dedup"
	"github.com/kdedup/kdedup/filter"
)

// TestReplaysWaitForARestoreSlot: with Options.MaxRestores restores and
// replays running, a partition that must replay waits, paused and not
// ready, replaying nothing, until one ends; then it replays its gap. Each
// replay holds a restore client's buffers and a decompressed batch, which
// the memory budget counts MaxRestores times.
func TestReplaysWaitForARestoreSlot(t *testing.T) {
	const records = 50
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "in", "out"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ClientID("custom"), kgo.DefaultProduceTopic("in"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	for i := range records {
		if err := cl.ProduceSync(context.Background(), &kgo.Record{Key: fmt.Appendf(nil, "k%d", i), Value: []byte("v")}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	db := diskStore(t)
	opener, err := dedup.NewOpener(db, dedup.Options{HashSeed: filter.Seed{K0: 1, K1: 2}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	w, err := New(Options{Brokers: c.ListenAddrs(), InputTopics: []string{"in"}, OutputTopic: "out", Dedup: opener, MaxRestores: 2,
		Logger: slog.New(slog.DiscardHandler), FlushInterval: 50 * time.Millisecond, SessionTimeout: 5 * time.Second, Registerer: prometheus.NewRegistry()})
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

	for range 2 { // two restores of other partitions run
		w.restoreSlots <- struct{}{}
	}
	// No local state, the group's offset at the log end: a rebuild of
	// [0, 50).
	if _, err := w.adjustOffsets(context.Background(), map[string]map[int32]kgo.Offset{"in": {0: kgo.NewOffset().At(records)}}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	if _, ok := d.Checkpoint(); ok || pw.owner() != ownerRestore || w.Ready() || pw.gauges.replayLeft.Load() != records {
		cp, _ := d.Checkpoint()
		t.Fatalf("with every restore slot taken, the partition replayed (checkpoint %v %t, owner %d, ready %t, %d left)", cp, ok, pw.owner(), w.Ready(), pw.gauges.replayLeft.Load())
	}
	<-w.restoreSlots // one ends
	deadline := time.Now().Add(20 * time.Second)
	for pw.owner() != ownerLoop && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if cp, ok := d.Checkpoint(); !ok || cp.Offset != records {
		t.Fatalf("once a slot freed: checkpoint %v (%t), want the replay's end %d", cp, ok, records)
	}
}
