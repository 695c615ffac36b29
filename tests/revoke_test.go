package tests

import (
	"testing"
	"time"
)

// TestIdleRevokedTwice: an exactly-once worker with no input loses a
// partition to a second worker twice, getting it back in between; it must
// keep running and own both partitions at the end. franz-go's
// GroupTransactSession runs the revocation callback once until the next
// End, so an idle worker that never ended a transaction kept the twice
// revoked partition open, and opening it again stopped the worker.
func TestIdleRevokedTwice(t *testing.T) {
	p := newPipeline(t, 2)
	p.delivery = "exactly-once"
	a := p.startWorker(t, t.TempDir())
	p.waitMembers(t, 1)
	for round := range 2 {
		b := p.startWorker(t, t.TempDir())
		p.waitMembers(t, 2)
		b.stop(t)
		p.waitMembers(t, 1)
		time.Sleep(500 * time.Millisecond)
		a.running(t)
		t.Logf("round %d: the first worker still runs", round)
	}
	if n := a.metric(t, "kdedup_partitions_assigned"); n != 2 {
		t.Fatalf("the first worker owns %.0f partitions, want 2", n)
	}
}
