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
	"github.com/kdedup/kdedup/store"
)

// TestStopDuringImportKeepsLocalState: a partition with local state at
// offset 5, behind its group's offset (300,000) by more than a snapshot
// saves, restores a snapshot at 200,000 and is stopped (a revocation)
// twice over: once after the download, before the import begins, and once
// after the import has begun. Neither stop may leave it without state: the
// first keeps the local state (checkpoint 5), the second completes the
// import (checkpoint 200,000). Before, the import began regardless and a
// stop in the middle of it deleted the state, local state included.
func TestStopDuringImportKeepsLocalState(t *testing.T) {
	for _, when := range []string{"before the import", "during the import"} {
		t.Run(when, func(t *testing.T) {
			testStopDuringImport(t, when == "during the import")
		})
	}
}

func testStopDuringImport(t *testing.T, during bool) {
	const pb = 512
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "in", "out"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ClientID("custom"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	for i := range 10 { // the local checkpoint (5) within the log
		if err := cl.ProduceSync(context.Background(), &kgo.Record{Topic: "in", Key: fmt.Appendf(nil, "k%d", i), Value: []byte("v")}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	dopts := dedup.Options{HashSeed: filter.Seed{K0: 1, K1: 2}, Filter: filter.Params{PageBytes: pb, Capacity: 100_000, FingerprintBits: 32}}
	state := func(dir string, keys int, cp int64) (*store.DB, *dedup.Opener, *dedup.Deduplicator) {
		db, err := store.Open(store.Options{Dir: dir, PageBytes: pb, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = db.Close() })
		op, err := dedup.NewOpener(db, dopts, nil)
		if err != nil {
			t.Fatal(err)
		}
		d, err := op.Open("in", 0)
		if err != nil {
			t.Fatal(err)
		}
		for i := range keys {
			if err := d.Replay(&kgo.Record{Key: fmt.Appendf(nil, "k%d", i), Value: []byte("v"), Offset: int64(i)}); err != nil {
				t.Fatal(err)
			}
		}
		if err := d.Commit(store.Checkpoint{Offset: cp, LeaderEpoch: -1}); err != nil {
			t.Fatal(err)
		}
		return db, op, d
	}
	snaps := fileSnapshots(t)
	_, sop, sd := state(t.TempDir(), 50_000, 200_000)
	tp := store.TopicPartition{Topic: "in", Partition: 0}
	m, err := snaps.Put(context.Background(), tp, func(h func(store.Image) error, p func(filter.PageID, []byte) error) (bool, error) {
		return sop.Export(tp, h, p)
	})
	if err != nil {
		t.Fatal(err)
	}
	sd.Close()
	if m.Pages < 512 {
		t.Fatalf("the snapshot has %d pages; the test needs an import that checks for a stop (every 256 pages) several times", m.Pages)
	}

	_, opener, d := state(t.TempDir(), 10, 5)
	w, err := New(Options{Brokers: c.ListenAddrs(), InputTopics: []string{"in"}, OutputTopic: "out", Dedup: opener, Snapshots: snaps,
		Logger: slog.New(slog.DiscardHandler), FlushInterval: 50 * time.Millisecond, SessionTimeout: 5 * time.Second, Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	w.mu.connected = make(chan struct{})
	w.publish(nil, cl)
	stop := func(pw *partitionWorker) {
		pw.restoreCtl.mu.Lock()
		cancel := pw.restoreCtl.cancel
		pw.restoreCtl.mu.Unlock()
		cancel() // as stopReplay does, without waiting: this runs on the restore goroutine
	}
	if during {
		w.hooks.importing = stop
	} else {
		w.hooks.beforeImport = stop
	}
	pw := assignForPlan(w, cl, "in", 0, d)
	if _, err := w.adjustOffsets(context.Background(), map[string]map[int32]kgo.Offset{"in": {0: kgo.NewOffset().At(300_000)}}); err != nil {
		t.Fatal(err)
	}
	pw.restoreCtl.mu.Lock()
	done := pw.restoreCtl.done
	pw.restoreCtl.mu.Unlock()
	select { // the hook stops it
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the restore did not end within 30s of its stop")
	}
	cp, ok := d.Checkpoint()
	want := int64(5)
	if during {
		want = 200_000
	}
	if !ok || cp.Offset != want {
		t.Fatalf("after a stop %s: state %t at %d, want the state at %d", map[bool]string{false: "before the import", true: "during the import"}[during], ok, cp.Offset, want)
	}
	dec, err := d.Decide(&kgo.Record{Key: []byte("k3"), Value: []byte("v"), Offset: want})
	if err != nil {
		t.Fatal(err)
	}
	if d.Forwards(dec) {
		t.Fatal("a key the state held is forwarded after the stop: the state's keys are gone")
	}
}
