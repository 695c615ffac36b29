package tests

import (
	"context"
	"testing"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// TestSnapshotBelowDeletedGroupOffset: a partition's newest snapshot is at
// offset 100, the group's offset at 200, and retention deleted everything
// below 300 before a worker with an empty disk takes the partition. It
// restores the snapshot, finds [100, 200) gone (a partial rebuild, counted
// once) and [200, 300) deleted before anyone decided it (300 - 200 = 100
// offsets counted once in kdedup_retention_skipped_offsets_total, not
// again by the replay), and decides from 300 against the snapshot's keys:
// repeats of part one's keys are dropped, new keys forwarded. The plan and
// the restore goroutine both moved the partition's start here before, a
// data race the -race suites report, and counted the skipped offsets twice.
func TestSnapshotBelowDeletedGroupOffset(t *testing.T) {
	p := newPipeline(t, 1)
	p.withSnapshots(t)
	dir := t.TempDir()
	p.runPart(t, dir, keyRange("a", 0, 100, "v1")) // its last snapshot at 100
	url := p.extraEnv["KDEDUP_SNAPSHOT_URL"]
	delete(p.extraEnv, "KDEDUP_SNAPSHOT_URL")
	p.runPart(t, dir, keyRange("b", 0, 100, "v2")) // the group's offset at 200, no snapshot
	p.extraEnv["KDEDUP_SNAPSHOT_URL"] = url
	p.feed(t, keyRange("c", 0, 100, "v3"), 100, 0).wait(t)
	ctx := context.Background()
	if _, err := p.b.admin(t).DeleteRecords(ctx, kadm.Offsets{p.in: {0: {Topic: p.in, Partition: 0, At: 300}}}); err != nil {
		t.Fatal(err)
	}
	repeats, fresh := keyRange("a", 0, 25, "v4"), keyRange("d", 0, 25, "v4")
	p.feed(t, append(append([]*kgo.Record{}, repeats...), fresh...), 50, 0).wait(t)
	p.out = p.b.name("out-after")
	p.b.createTopics(t, 1, p.out)

	w := p.startWorker(t, t.TempDir())
	w.waitReplayed(t)
	want, got := p.output(t, fresh) // the snapshot's keys repeated: dropped
	requireExact(t, want, got)
	for _, c := range []struct {
		name string
		want float64
	}{
		{"kdedup_retention_skipped_offsets_total", 100},
		{"kdedup_partial_rebuilds_total", 1},
		{"kdedup_replay_remaining_records", 0},
	} {
		if n := w.metric(t, c.name); n != c.want {
			t.Errorf("%s = %.0f, want %.0f", c.name, n, c.want)
		}
	}
	if n := w.metricWith(t, "kdedup_partition_restores_total", "source", "snapshot"); n != 1 {
		t.Errorf("%.0f partitions restored from a snapshot, want 1", n)
	}
	w.stop(t)
}
