package consumer

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kdedup/kdedup/dedup"
	"github.com/kdedup/kdedup/filter"
	"github.com/kdedup/kdedup/snapshot"
	"github.com/kdedup/kdedup/store"
)

// snapshotRig is a worker with a file:// snapshot store and no Kafka
// client, whose partitions of topic "in" are made by partition.
type snapshotRig struct {
	w      *Worker
	s      *snapshotter
	snaps  *snapshot.Store
	opener *dedup.Opener
	reg    *prometheus.Registry
}

func newSnapshotRig(t *testing.T, interval time.Duration) snapshotRig {
	t.Helper()
	snaps := fileSnapshots(t)
	db := diskStore(t)
	opener, err := dedup.NewOpener(db, dedup.Options{HashSeed: filter.Seed{K0: 1, K1: 2}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	w, err := New(Options{Brokers: []string{"127.0.0.1:1"}, InputTopics: []string{"in"}, OutputTopic: "out", Dedup: opener, Snapshots: snaps,
		SnapshotInterval: interval, Logger: slog.New(slog.DiscardHandler), Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	return snapshotRig{w: w, s: w.snaps, snaps: snaps, opener: opener, reg: reg}
}

// partition returns partition p of "in", planned and owned by the loop,
// whose state has committed a write batch at offset committed (none when
// negative); assigned makes it one of the worker's partitions.
func (r snapshotRig) partition(t *testing.T, p int32, committed int64, assigned bool) *partitionWorker {
	t.Helper()
	d, err := r.opener.Open("in", p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	if committed >= 0 {
		if err := d.Replay(&kgo.Record{Key: fmt.Appendf(nil, "k%d", p), Value: []byte("v"), Offset: committed - 1}); err != nil {
			t.Fatal(err)
		}
		if err := d.Commit(store.Checkpoint{Offset: committed, LeaderEpoch: -1}); err != nil {
			t.Fatal(err)
		}
	}
	pw := newPartition(r.w, nil, "in", p, d)
	pw.owned.Or(ownedPlanned)
	if assigned {
		r.w.mu.Lock()
		r.w.mu.parts[store.TopicPartition{Topic: "in", Partition: p}] = pw
		r.w.mu.Unlock()
	}
	return pw
}

// snapshots returns the offsets of the snapshots stored of partition p,
// in ascending order.
func (r snapshotRig) snapshots(t *testing.T, p int32) []int64 {
	t.Helper()
	ms, _, err := r.snaps.List(context.Background(), store.TopicPartition{Topic: "in", Partition: p})
	if err != nil {
		t.Fatal(err)
	}
	var offs []int64
	for _, m := range ms {
		offs = append(offs, m.Offset)
	}
	slices.Sort(offs)
	return offs
}

// commitAt makes pw's state commit a write batch at offset off, as its
// loop would.
func commitAt(t *testing.T, pw *partitionWorker, off int64) {
	t.Helper()
	if err := pw.dedup.Replay(&kgo.Record{Key: fmt.Appendf(nil, "k%d", off), Value: []byte("v"), Offset: off - 1}); err != nil {
		t.Fatal(err)
	}
	cp := store.Checkpoint{Offset: off, LeaderEpoch: -1}
	if err := pw.dedup.Commit(cp); err != nil {
		t.Fatal(err)
	}
	pw.setCheckpoint(cp)
}

// TestSnapshotDue checks snapshotter.due on every combination of what
// it depends on against its rule: a partition is due when the loop owns
// it (planned, not replaying), it has not failed, the store has not
// failed an upload in the last snapshotDownFor, it has committed a write
// batch, at another offset than its last snapshot's, and that snapshot
// (or its assignment) is at least an interval old.
func TestSnapshotDue(t *testing.T) {
	const interval = time.Minute
	r := newSnapshotRig(t, interval)
	pw := r.partition(t, 0, 10, true)
	owned := map[dedupOwner]uint32{ownerPlan: 0, ownerRestore: ownedPlanned | ownedReplaying, ownerLoop: ownedPlanned}
	n := 0
	for _, failed := range []bool{false, true} {
		for _, owner := range []dedupOwner{ownerPlan, ownerRestore, ownerLoop} {
			for _, down := range []bool{false, true} {
				for _, committed := range []int64{-1, 10} {
					for _, snapOffset := range []int64{-1, 10, 7} {
						for _, age := range []time.Duration{0, interval / 2, interval + time.Second, 10 * interval} {
							pw.failed.Store(failed)
							pw.owned.Store(owned[owner])
							pw.snap.committed.Store(committed)
							pw.snap.offset.Store(snapOffset)
							pw.snap.at.Store(time.Now().Add(-age).UnixNano())
							r.s.uploadDownUntil.Store(0)
							if down {
								r.s.uploadDownUntil.Store(time.Now().Add(snapshotDownFor).UnixNano())
							}
							want := !failed && owner == ownerLoop && !down && committed >= 0 && committed != snapOffset && age >= interval
							if got := r.s.due(pw, interval); got != want {
								t.Errorf("failed %t, owner %d, store down %t, committed %d, last snapshot at %d %s ago: due %t, want %t",
									failed, owner, down, committed, snapOffset, age, got, want)
							}
							n++
						}
					}
				}
			}
		}
	}
	if n != 288 {
		t.Fatalf("%d combinations checked", n)
	}
}

// TestSnapshotLoopUploadsDuePartitions: the snapshot loop uploads each
// assigned partition that is due, once per checkpoint, and none that is
// not (unchanged since its snapshot, replaying, failed); a partition
// whose state moves on is uploaded again an interval later.
func TestSnapshotLoopUploadsDuePartitions(t *testing.T) {
	const interval = 40 * time.Millisecond
	r := newSnapshotRig(t, interval)
	changed := r.partition(t, 0, 10, true)
	unchanged := r.partition(t, 1, 10, true)
	unchanged.snap.offset.Store(10)
	replaying := r.partition(t, 2, 10, true)
	replaying.owned.Or(ownedReplaying)
	failed := r.partition(t, 3, 10, true)
	failed.failed.Store(true)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.s.loop(ctx)
	}()
	defer func() {
		cancel()
		<-done
	}()
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within 10s", what)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	waitFor("the changed partition's snapshot", func() bool { return changed.snap.offset.Load() == 10 })
	time.Sleep(5 * interval) // ticks enough for a second upload at the same checkpoint
	if got := r.snapshots(t, 0); len(got) != 1 || got[0] != 10 {
		t.Errorf("snapshots of the changed partition at %v, want one at 10", got)
	}
	for p, name := range map[int32]string{1: "unchanged", 2: "replaying", 3: "failed"} {
		if got := r.snapshots(t, p); len(got) != 0 {
			t.Errorf("the %s partition was uploaded at %v", name, got)
		}
	}

	commitAt(t, changed, 20)
	waitFor("the second snapshot", func() bool { return changed.snap.offset.Load() == 20 })
	if got := r.snapshots(t, 0); len(got) != 2 {
		t.Errorf("snapshots at %v after the state moved on, want 10 and 20", got)
	}
	if n := gathered(t, r.reg, "kdedup_snapshot_uploads_total", "result", "ok"); n != 2 {
		t.Errorf("kdedup_snapshot_uploads_total{result=ok} = %v, want 2", n)
	}
}

// TestFinalSnapshots: the partitions a revocation or a shutdown released
// are uploaded once more, whether or not still assigned, unless they
// failed, were never planned (nothing changed), or their last snapshot
// holds their last write batch; none is uploaded once the budget is
// spent, while an interval's upload holds the store past it, or while
// the store is known to fail. A worker without snapshots uploads nothing.
func TestFinalSnapshots(t *testing.T) {
	r := newSnapshotRig(t, time.Hour)
	released := r.partition(t, 0, 10, false)
	failed := r.partition(t, 1, 10, false)
	failed.failed.Store(true)
	unplanned := r.partition(t, 2, 10, false)
	unplanned.owned.Store(0)
	snapshotted := r.partition(t, 3, 10, false)
	snapshotted.snap.offset.Store(10)
	stopped := []*partitionWorker{released, failed, unplanned, snapshotted}

	uploaded := func() map[int32][]int64 {
		got := map[int32][]int64{}
		for _, pw := range stopped {
			if offs := r.snapshots(t, pw.partition); len(offs) > 0 {
				got[pw.partition] = offs
			}
		}
		return got
	}
	check := func(step string, want map[int32][]int64) {
		t.Helper()
		if got := uploaded(); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s: snapshots %v, want %v", step, got, want)
		}
	}

	r.w.finalSnapshotsWithin(stopped, 30*time.Second)
	check("released", map[int32][]int64{0: {10}})

	// Each changes again; nothing more is uploaded while they may not be.
	for _, pw := range stopped {
		commitAt(t, pw, 20)
	}
	r.w.finalSnapshotsWithin(stopped, 0)
	check("no budget", map[int32][]int64{0: {10}})

	r.s.uploading <- struct{}{} // an interval's upload in flight
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		r.w.finalSnapshotsWithin(stopped, 100*time.Millisecond)
	}()
	select {
	case <-finished:
		<-r.s.uploading
		check("an upload in flight past the budget", map[int32][]int64{0: {10}})
	case <-time.After(5 * time.Second):
		<-r.s.uploading // the upload in flight ends: the last snapshots go on
		<-finished
		t.Fatal("the last snapshots, with a budget of 100ms, waited for an upload in flight for 5s")
	}

	r.s.uploadDownUntil.Store(time.Now().Add(snapshotDownFor).UnixNano())
	r.w.finalSnapshotsWithin(stopped, 30*time.Second)
	check("store down", map[int32][]int64{0: {10}})

	r.s.uploadDownUntil.Store(0)
	r.w.finalSnapshotsWithin(stopped, 30*time.Second)
	check("store back", map[int32][]int64{0: {10, 20}, 3: {20}})

	plain := newPartitionRig(t, AtLeastOnce, Options{OutputTopic: "out"})
	t.Cleanup(plain.pw.close)
	plain.w.finalSnapshotsWithin([]*partitionWorker{plain.pw}, 30*time.Second) // no snapshotter: nothing to do
}

// TestUploadFailureHoldsOffUploads: an upload the store fails is
// counted, and no partition is due, nor uploaded at a release, for
// snapshotDownFor; the failed partition's next try is an interval after
// the failure.
func TestUploadFailureHoldsOffUploads(t *testing.T) {
	const interval = time.Minute
	r := newSnapshotRig(t, interval)
	pw := r.partition(t, 0, 10, true)
	other := r.partition(t, 1, 10, true)
	old := time.Now().Add(-2 * interval).UnixNano()
	pw.snap.at.Store(old)
	other.snap.at.Store(old)
	if !r.s.due(pw, interval) || !r.s.due(other, interval) {
		t.Fatal("the partitions are not due before the failure")
	}
	if err := r.snaps.Close(); err != nil { // every request fails from now on
		t.Fatal(err)
	}
	before := time.Now()
	r.s.upload(context.Background(), pw, "interval")
	if n := gathered(t, r.reg, "kdedup_snapshot_uploads_total", "result", "error"); n != 1 {
		t.Errorf("kdedup_snapshot_uploads_total{result=error} = %v, want 1", n)
	}
	if down := time.Unix(0, r.s.uploadDownUntil.Load()); down.Before(before.Add(snapshotDownFor)) || down.After(time.Now().Add(snapshotDownFor)) {
		t.Errorf("uploads held off until %s, want %s after the failure", down.Format(time.RFC3339Nano), snapshotDownFor)
	}
	if r.s.due(other, interval) {
		t.Errorf("another partition is due while the store is held off")
	}
	if at := pw.snap.at.Load(); at < before.UnixNano() {
		t.Errorf("the failed partition's last try is still %s ago", time.Since(time.Unix(0, at)))
	}
	if got := pw.snap.offset.Load(); got != -1 {
		t.Errorf("the failed upload recorded a snapshot at %d", got)
	}
	r.s.uploadDownUntil.Store(0)
	if r.s.due(pw, interval) {
		t.Errorf("the failed partition is due again at once, want an interval after the failure")
	}
}
