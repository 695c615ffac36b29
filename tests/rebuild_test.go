package tests

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kdedup/kdedup/internal/harness"
	"github.com/kdedup/kdedup/internal/scenario"
)

// rebuildParts is a stream whose second part is decided right only by a
// filter that holds the whole first part: part one creates n distinct
// keys; part two deletes the first tenth of them, repeats the rest and
// creates n/10 new ones.
func rebuildParts(n int) (part1, part2 []*kgo.Record) {
	for i := range n {
		part1 = append(part1, &kgo.Record{Key: fmt.Appendf(nil, "k%d", i), Value: fmt.Appendf(nil, "v1-%d", i)})
	}
	for i := range n + n/10 {
		k := fmt.Appendf(nil, "k%d", i)
		if i < n/10 {
			part2 = append(part2, &kgo.Record{Key: k})
		} else {
			part2 = append(part2, &kgo.Record{Key: k, Value: fmt.Appendf(nil, "v2-%d", i)})
		}
	}
	return part1, part2
}

// groupOffsets returns the group's committed offsets of the input topic.
func (p *pipeline) groupOffsets(t *testing.T) map[int32]int64 {
	t.Helper()
	return p.groupOffsetsWith(t, p.b.admin(t))
}

// groupOffsetsWith is groupOffsets through adm, for a test that asks many
// times.
func (p *pipeline) groupOffsetsWith(t *testing.T, adm *kadm.Client) map[int32]int64 {
	t.Helper()
	resp, err := adm.FetchOffsets(context.Background(), p.group)
	if err != nil {
		t.Fatal(err)
	}
	got := map[int32]int64{}
	resp.Each(func(o kadm.OffsetResponse) {
		if o.Topic == p.in {
			got[o.Partition] = o.At
		}
	})
	return got
}

// replayProbe reads what a worker reports about its replay: whether it is
// ready (read first), then how many partitions are restoring and how many
// write batches it has committed.
type replayProbe func(t *testing.T) (ready bool, restoring, batches float64)

// interruptMidReplay waits until the worker has committed at least 10
// write batches of a replay that is still running on every partition, and
// for at least three flush intervals of the suite (as many group commit
// intervals at least once), checking that it is not ready meanwhile and
// that the group's committed offsets stay the ones before the rebuild
// (group, read at every probe and once more after the last one, after the
// write batches counted: a replay that committed to the group would be
// seen here whatever the interruption does to the offsets later); then it
// calls interrupt.
func interruptMidReplay(t *testing.T, partitions int32, probe replayProbe, group func() map[int32]int64, before map[int32]int64, interrupt func()) {
	t.Helper()
	unchanged := func(batches float64) {
		t.Helper()
		if got := group(); !maps.Equal(got, before) {
			t.Fatalf("group offsets moved during the replay (after %v write batches): %v before, %v now", batches, before, got)
		}
	}
	deadline := time.Now().Add(60 * time.Second)
	var started time.Time
	for time.Now().Before(deadline) {
		ready, restoring, batches := probe(t)
		if restoring > 0 && ready {
			t.Fatalf("worker ready while %v partitions replay", restoring)
		}
		unchanged(batches)
		if restoring > 0 && started.IsZero() {
			started = time.Now()
		}
		if restoring == float64(partitions) && batches >= 10 && time.Since(started) >= 300*time.Millisecond {
			unchanged(batches)
			t.Logf("interrupting the replay after %v write batches", batches)
			interrupt()
			return
		}
		if restoring == 0 && batches > 0 {
			t.Fatalf("the replay ended (%v write batches) before it could be interrupted: make it longer", batches)
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatal("no replay of at least 10 write batches within 60s")
}

// slowReplay makes every write batch small: one is cut as soon as half of
// FLUSH_BYTES (one page) is dirty, so that a replay is many write batches
// (and transactions are one record each: only the interrupted workers run
// with it).
var slowReplay = map[string]string{"KDEDUP_FLUSH_BYTES": "4KiB"}

// TestInterruptedRebuild: a worker rebuilding wiped state by replay is
// stopped gracefully, SIGKILLed, or loses the replaying partition to a
// rebalance, each after at least 10 write batches of the replay. The
// group's committed offsets must not move (a replay is local progress
// only), neither while the replay runs (read at every probe: a graceful
// stop or a revocation commits the group offsets again, which would hide
// a replay's commit from a comparison after the interruption alone) nor
// by the interruption; /readyz must answer 503 while the replay runs, and after a
// restart the output of a second part of the stream is exactly the
// model's, in both delivery modes.
func TestInterruptedRebuild(t *testing.T) {
	deliveries(t, func(t *testing.T, delivery string) {
		for _, how := range []string{"stop", "kill", "rebalance"} {
			t.Run(how, func(t *testing.T) {
				p := newPipeline(t, 2)
				p.delivery = delivery
				part1, part2 := rebuildParts(80_000)
				dir := t.TempDir()
				p.runPart(t, dir, part1)
				before := p.groupOffsets(t)
				adm := p.b.admin(t)
				group := func() map[int32]int64 { return p.groupOffsetsWith(t, adm) }
				if err := os.RemoveAll(dir); err != nil {
					t.Fatal(err)
				}

				p.extraEnv = slowReplay
				switch how {
				case "stop":
					w := p.startWorker(t, dir)
					interruptMidReplay(t, p.partitions, w.replayProbe, group, before, func() { w.stop(t) })
				case "kill":
					var env []string
					for k, v := range maps.All(slowReplay) {
						env = append(env, k+"="+v)
					}
					pr := p.startProcess(t, dir, append(env, "KDEDUP_LOG_LEVEL=info")...)
					interruptMidReplay(t, p.partitions, pr.replayProbe, group, before, pr.kill)
				case "rebalance":
					w := p.startWorker(t, dir)
					interruptMidReplay(t, p.partitions, w.replayProbe, group, before, func() {
						p.extraEnv = nil
						p.startWorker(t, t.TempDir())
						p.waitMembers(t, 2)
					})
					w.stop(t)
				}
				if after := p.groupOffsets(t); !maps.Equal(after, before) {
					t.Fatalf("group offsets moved during the replay: %v before, %v after", before, after)
				}

				p.extraEnv = nil
				p.runPart(t, dir, part2)
				want, got := p.output(t, append(append([]*kgo.Record{}, part1...), part2...))
				requireExact(t, want, got)
			})
		}
	})
}

func (w *worker) replayProbe(t *testing.T) (bool, float64, float64) {
	ready := w.metric(t, "kdedup_worker_ready") == 1
	return ready, w.metric(t, "kdedup_partitions_restoring"), w.metric(t, "kdedup_write_batches_total")
}

func (p *process) replayProbe(t *testing.T) (bool, float64, float64) {
	addr := p.httpAddr(t)
	code, _ := get(t, addr, "/readyz")
	metrics, err := harness.Scrape(context.Background(), addr)
	if err != nil {
		return false, 0, 0 // not serving yet
	}
	return code == http.StatusOK, metrics["kdedup_partitions_restoring"], metrics["kdedup_write_batches_total"]
}

// TestCheckpointAheadOfGroup: at least once, a crash between the Badger
// commit and the group commit leaves the local checkpoint ahead of the
// group's offset (as does a lost partition, which keeps what it forwarded
// locally). The worker resumes from the checkpoint, forwarding nothing
// again, and the group's offset catches up with it even when no record
// follows (it stayed behind until the next record before).
func TestCheckpointAheadOfGroup(t *testing.T) {
	p := newPipeline(t, 2)
	part1, _ := rebuildParts(1000)
	dir := t.TempDir()
	p.runPart(t, dir, part1)
	end := p.groupOffsets(t)

	// The crash: the group's offsets 10 records behind the checkpoints.
	behind := kadm.Offsets{}
	for part, o := range end {
		behind.AddOffset(p.in, part, max(0, o-10), -1)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if resp, err := p.b.admin(t).CommitOffsets(ctx, p.group, behind); err != nil || resp.Error() != nil {
		t.Fatalf("moving the group's offsets back: %v %v", err, resp.Error())
	}

	w := p.startWorker(t, dir)
	if err := scenario.WaitCaughtUp(ctx, p.b.admin(t), p.group, p.in); err != nil {
		t.Fatalf("the group's offset did not catch up with the checkpoints: %v", err)
	}
	w.stop(t)
	if got := p.groupOffsets(t); !maps.Equal(got, end) {
		t.Fatalf("group offsets %v, want the checkpoints %v", got, end)
	}
	want, got := p.output(t, part1)
	requireExact(t, want, got) // the 20 records between were not forwarded again
}
