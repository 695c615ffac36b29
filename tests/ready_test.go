package tests

import (
	"testing"
	"time"
)

// TestIdleWorkerIsReady: with more workers than input partitions, the one
// that owns nothing has joined the group and is ready (a standby), so that
// a StatefulSet with more replicas than partitions still rolls out.
func TestIdleWorkerIsReady(t *testing.T) {
	p := newPipeline(t, 1)
	a := p.startWorker(t, t.TempDir())
	b := p.startWorker(t, t.TempDir())
	p.waitMembers(t, 1)
	owners := 0
	for _, w := range []*worker{a, b} {
		deadline := time.Now().Add(30 * time.Second)
		for w.metric(t, "kdedup_worker_ready") != 1 {
			if time.Now().After(deadline) {
				t.Fatalf("a worker owning %.0f partitions is not ready after 30s", w.metric(t, "kdedup_partitions_assigned"))
			}
			time.Sleep(50 * time.Millisecond)
		}
		owners += int(w.metric(t, "kdedup_partitions_assigned"))
	}
	if owners != 1 {
		t.Fatalf("%d partitions owned by the two workers, want the one partition", owners)
	}
}

// TestReadyOnlyOnceAssigned polls a joining worker's readiness every 10 ms
// through its join, twice (a second and a third member of a group over 4
// partitions, with input to rebuild): it is never ready while it owns no
// partition, and becomes ready once it owns its share. With the
// cooperative-sticky balancer a joining member's first assignment is
// empty; a member that turned ready on it let a rolling update move on
// before the group had moved anything to it.
func TestReadyOnlyOnceAssigned(t *testing.T) {
	p := newPipeline(t, 4)
	recs := stream(17)
	p.feed(t, recs, len(recs), 0).wait(t)
	first := p.startWorker(t, t.TempDir())
	waitReadyOwning(t, first, 4)
	for members := 2; members <= 3; members++ {
		w := p.startWorker(t, t.TempDir())
		waitReadyOwning(t, w, 4/members)
	}
	want, got := p.output(t, recs)
	requireExact(t, want, got)
}

// waitReadyOwning polls w every 10 ms until it is ready owning at least
// min partitions, and fails the test the moment it is ready owning none.
func waitReadyOwning(t *testing.T, w *worker, min int) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	polls := 0
	for ; time.Now().Before(deadline); polls++ {
		ready, owned := gatheredPair(t, w, "kdedup_worker_ready", "kdedup_partitions_assigned")
		if ready == 1 && owned == 0 {
			t.Fatalf("poll %d: ready while owning no partition", polls)
		}
		if ready == 1 && owned >= float64(min) {
			t.Logf("ready owning %.0f partitions after %d polls", owned, polls)
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("not ready owning at least %d partitions within 60s", min)
}

// gatheredPair reads two metrics of w from one gather.
func gatheredPair(t *testing.T, w *worker, a, b string) (float64, float64) {
	t.Helper()
	mfs, err := w.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := func(name string) float64 {
		total := 0.0
		if mf := family(mfs, name); mf != nil {
			for _, m := range mf.GetMetric() {
				total += m.GetGauge().GetValue()
			}
		}
		return total
	}
	return sum(a), sum(b)
}
