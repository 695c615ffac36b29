package consumer

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kdedup/kdedup/dedup"
	"github.com/kdedup/kdedup/filter"
	"github.com/kdedup/kdedup/store"
)

// TestIntervalUploadSkipsRevokedPartition: the snapshot loop takes its list
// of partitions at a tick and may reach one after it was revoked. Such a
// partition is not uploaded by the interval (its last state is the
// revocation's upload), so that it cannot prune the new owner's newer
// snapshots; the revocation's own upload ("released") still goes ahead,
// and an owned partition's interval upload too.
func TestIntervalUploadSkipsRevokedPartition(t *testing.T) {
	snaps := fileSnapshots(t)
	db := diskStore(t)
	opener, err := dedup.NewOpener(db, dedup.Options{HashSeed: filter.Seed{K0: 1, K1: 2}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	w, err := New(Options{Brokers: []string{"127.0.0.1:1"}, InputTopics: []string{"in"}, OutputTopic: "out", Dedup: opener, Snapshots: snaps,
		Logger: slog.New(slog.DiscardHandler), FlushInterval: 50 * time.Millisecond, SessionTimeout: 5 * time.Second, Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	d, err := opener.Open("in", 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	if err := d.Replay(&kgo.Record{Key: []byte("k"), Value: []byte("v")}); err != nil {
		t.Fatal(err)
	}
	if err := d.Commit(store.Checkpoint{Offset: 1, LeaderEpoch: -1}); err != nil {
		t.Fatal(err)
	}
	pw := newPartition(w, nil, "in", 0, d)
	pw.owned.Or(ownedPlanned)
	tp := store.TopicPartition{Topic: "in", Partition: 0}
	listed := func() int {
		ms, _, err := snaps.List(context.Background(), tp)
		if err != nil {
			t.Fatal(err)
		}
		return len(ms)
	}

	w.snaps.upload(context.Background(), pw, "interval") // not among w.mu.parts: revoked
	if n := listed(); n != 0 {
		t.Fatalf("an interval upload of a revoked partition stored %d snapshots, want none", n)
	}
	w.snaps.upload(context.Background(), pw, "released")
	if n := listed(); n != 1 {
		t.Fatalf("the revocation's upload stored %d snapshots, want 1", n)
	}
	if err := d.Replay(&kgo.Record{Key: []byte("k2"), Value: []byte("v"), Offset: 1}); err != nil {
		t.Fatal(err)
	}
	if err := d.Commit(store.Checkpoint{Offset: 2, LeaderEpoch: -1}); err != nil {
		t.Fatal(err)
	}
	pw.snap.committed.Store(2)
	w.mu.parts[tp] = pw
	w.snaps.upload(context.Background(), pw, "interval")
	if n := listed(); n != 2 {
		t.Fatalf("an owned partition's interval upload: %d snapshots stored, want 2", n)
	}
}
