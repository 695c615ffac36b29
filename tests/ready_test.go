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
