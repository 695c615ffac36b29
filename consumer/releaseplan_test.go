package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kdedup/kdedup/dedup"
	"github.com/kdedup/kdedup/filter"
	"github.com/kdedup/kdedup/store"
)

// TestReleaseWaitsForPlan: a shutdown (or a session restart) stops the
// partitions itself, not through franz-go's revocation, which cancels and
// waits for the offset fetch that plans them. A plan still running when
// release stopped its partition went on after the partition's state was
// closed: it started a replay on it, whose first read failed with "store:
// closed" and stopped the worker (seen as TestSnapshotScaleOut failing on
// Apache Kafka when a member left while another planned a partition it
// had just been given). release must cancel the plan and wait for it
// before any partition stops; a plan that begins after it plans nothing.
func TestReleaseWaitsForPlan(t *testing.T) {
	for _, delivery := range []Delivery{AtLeastOnce, ExactlyOnce} {
		t.Run(delivery.String(), func(t *testing.T) { testReleaseWaitsForPlan(t, delivery) })
	}
}

// planFixture is a worker of one input partition holding keys (one record
// each), whose group has committed offset len(keys), with partition 0
// assigned and not planned: its state is empty, so its plan replays the
// input into the filter (fp its filter parameters).
type planFixture struct {
	c  *kfake.Cluster
	w  *Worker
	pw *partitionWorker
	d  *dedup.Deduplicator
	// records is the group's committed offset: every record decided.
	records int64
}

func newPlanFixture(t *testing.T, delivery Delivery, keys [][]byte, fp filter.Params) planFixture {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "in", "out"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.DefaultProduceTopic("in"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	recs := make([]*kgo.Record, len(keys))
	for i, k := range keys {
		recs[i] = &kgo.Record{Key: k, Value: []byte("v")} // a nil value is a tombstone
	}
	if err := cl.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	const group = "g"
	if _, err := kadm.NewClient(cl).CommitOffsets(context.Background(), group, kadm.OffsetsFromRecords(kgo.Record{Topic: "in", Partition: 0, Offset: int64(len(keys)) - 1})); err != nil {
		t.Fatal(err)
	}

	db, err := store.Open(store.Options{Dir: t.TempDir(), PageBytes: fp.WithDefaults().PageBytes, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	opener, err := dedup.NewOpener(db, dedup.Options{HashSeed: filter.Seed{K0: 1, K1: 2}, Filter: fp, Staged: delivery == ExactlyOnce}, nil)
	if err != nil {
		t.Fatal(err)
	}
	w, err := New(Options{Brokers: c.ListenAddrs(), Group: group, InputTopics: []string{"in"}, OutputTopic: "out", Dedup: opener, Delivery: delivery,
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
	if delivery == AtLeastOnce {
		w.mode.opened(pw)
	}
	// Stops the replay, and at least once the partition's goroutine,
	// unless the test released the partition itself.
	t.Cleanup(func() { pw.stopReplay(true); w.stopPartitions(map[string][]int32{"in": {0}}, true) })
	return planFixture{c: c, w: w, pw: pw, d: d, records: int64(len(keys))}
}

// offsets is what franz-go hands adjustOffsets for the fixture: the
// group's committed offset of partition 0.
func (f planFixture) offsets() map[string]map[int32]kgo.Offset {
	return map[string]map[int32]kgo.Offset{"in": {0: kgo.NewOffset().At(f.records)}}
}

func testReleaseWaitsForPlan(t *testing.T, delivery Delivery) {
	const records = 20
	keys := make([][]byte, records)
	for i := range keys {
		keys[i] = fmt.Appendf(nil, "k%d", i)
	}
	f := newPlanFixture(t, delivery, keys, filter.Params{})
	c, w, pw := f.c, f.w, f.pw

	// The plan's listing of the log start is held until the partition
	// has been stopped (or, fixed, until the plan is cancelled).
	held, gate := make(chan struct{}), make(chan struct{})
	first := true
	c.ControlKey(int16(kmsg.ListOffsets), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		if first {
			first = false
			close(held)
			c.SleepControl(func() { <-gate })
		}
		return nil, nil, false
	})
	planned := make(chan error, 1)
	go func() {
		_, err := w.adjustOffsets(context.Background(), f.offsets())
		planned <- err
	}()
	select {
	case <-held:
	case <-time.After(20 * time.Second):
		t.Fatal("the plan did not list the partition's log start within 20s")
	}

	released := make(chan struct{})
	go func() {
		defer close(released)
		w.release()
	}()
	select {
	case <-released:
	case <-time.After(20 * time.Second):
		close(gate)
		t.Fatal("release did not return within 20s")
	}
	var planErr error
	select {
	case planErr = <-planned:
	default:
		close(gate)
		<-planned
		t.Fatal("release returned while the plan of one of its partitions was still running")
	}
	close(gate)
	if planErr == nil {
		t.Errorf("a plan cancelled by release returned no error; its partition would start at %v", pw.plan.start)
	}
	pw.restoreCtl.mu.Lock()
	replaying := pw.restoreCtl.done != nil
	pw.restoreCtl.mu.Unlock()
	if replaying || pw.owner() == ownerRestore {
		t.Errorf("a replay started on the released partition")
	}
	if err := w.fatalErrOf(); err != nil {
		t.Errorf("the worker failed: %v", err)
	}

	// A plan after release plans nothing, until the next connect.
	if _, err := w.adjustOffsets(context.Background(), f.offsets()); !errors.Is(err, errPlansStopped) {
		t.Errorf("a plan after release: %v, want errPlansStopped", err)
	}
}

// fatalErrOf is the worker's first fatal error, read under mu.
func (w *Worker) fatalErrOf() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.mu.fatalErr
}
