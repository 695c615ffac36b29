package tests

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kdedup/kdedup/internal/s3test"
	"github.com/kdedup/kdedup/internal/scenario"
)

// withSnapshots has the pipeline's workers keep snapshots every second
// in an object store: an S3-compatible server on loopback with
// KDEDUP_TEST_S3=versitygw (internal/s3test, as CI runs), else a
// directory (file://). It returns the directory holding the objects, one
// file per object key in both cases.
func (p *pipeline) withSnapshots(t *testing.T) string {
	t.Helper()
	if p.extraEnv == nil {
		p.extraEnv = map[string]string{}
	}
	p.extraEnv["KDEDUP_SNAPSHOT_INTERVAL"] = "1s"
	if s3test.Enabled() {
		srv := s3test.New(t)
		p.extraEnv["KDEDUP_SNAPSHOT_URL"] = srv.URL(p.group)
		return filepath.Join(srv.Dir(), p.group)
	}
	dir := t.TempDir()
	p.extraEnv["KDEDUP_SNAPSHOT_URL"] = "file://" + dir
	return dir
}

// snapshotObjects lists the data objects of a directory store.
func snapshotObjects(t *testing.T, dir string) []string {
	t.Helper()
	var objs []string
	err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(path, ".kds") {
			objs = append(objs, path)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

// TestSnapshotRestoresOnEmptyDisk moves every partition to a worker with
// an empty data directory three ways, in both delivery modes, and requires
// the output to be exactly the model's each time:
//
//   - planned: the first worker stopped gracefully, so its last snapshots
//     are at the group's offsets: the new worker restores them and replays
//     nothing;
//   - with a gap: a worker without snapshots then decided part two on the
//     first worker's disk, so the snapshots are a part behind: the new
//     worker restores them and replays exactly part two;
//   - damaged: every snapshot object corrupted: the new worker refuses
//     each (counted) and replays the whole input, as without snapshots.
func TestSnapshotRestoresOnEmptyDisk(t *testing.T) {
	deliveries(t, func(t *testing.T, delivery string) {
		for _, tc := range []string{"planned", "gap", "damaged"} {
			t.Run(tc, func(t *testing.T) {
				p := newPipeline(t, 3)
				p.delivery = delivery
				snaps := p.withSnapshots(t)
				part1, part2 := twoParts()
				all := append(append([]*kgo.Record{}, part1...), part2...)
				dirA := t.TempDir()
				p.runPart(t, dirA, part1)
				if len(snapshotObjects(t, snaps)) < 3 {
					t.Fatalf("%d snapshot objects after a graceful stop, want one per partition at least", len(snapshotObjects(t, snaps)))
				}
				var replayed int
				switch tc {
				case "planned":
					p.feed(t, part2, len(part2), 0).wait(t)
				case "gap":
					url := p.extraEnv["KDEDUP_SNAPSHOT_URL"]
					delete(p.extraEnv, "KDEDUP_SNAPSHOT_URL")
					p.runPart(t, dirA, part2)
					p.extraEnv["KDEDUP_SNAPSHOT_URL"] = url
					replayed = len(part2)
					// Part three decides differently unless both the
					// snapshot and the gap are in the filter: part two
					// deleted k0..k499 and created k1000..k1499.
					var part3 []*kgo.Record
					for i := range 1500 {
						part3 = append(part3, &kgo.Record{Key: fmt.Appendf(nil, "k%d", i), Value: fmt.Appendf(nil, "v3-%d", i), Timestamp: scenario.Base})
					}
					all = append(all, part3...)
					p.feed(t, part3, len(part3), 0).wait(t)
				case "damaged":
					for _, obj := range snapshotObjects(t, snaps) {
						b, err := os.ReadFile(obj)
						if err != nil {
							t.Fatal(err)
						}
						b[len(b)/2] ^= 1
						if err := os.WriteFile(obj, b, 0o644); err != nil {
							t.Fatal(err)
						}
					}
					p.feed(t, part2, len(part2), 0).wait(t)
					replayed = len(part1)
				}
				w := p.startWorker(t, t.TempDir())
				w.waitReplayed(t)
				want, got := p.output(t, all)
				requireExact(t, want, got)
				if tc == "gap" && want.Stats.Forwarded != 1000+500+500+500 {
					// part one, part two's tombstones and new keys, part
					// three's re-created keys; none of its repeats.
					t.Fatalf("model forwards %d records, want 2500: part three must test the restored filter", want.Stats.Forwarded)
				}
				if n := w.metric(t, "kdedup_replayed_records_total"); n != float64(replayed) {
					t.Errorf("replayed %.0f records, want %d", n, replayed)
				}
				restored, failed := w.metricWith(t, "kdedup_partition_restores_total", "source", "snapshot"), w.metric(t, "kdedup_snapshot_restore_failures_total")
				if tc == "damaged" {
					if restored != 0 || failed < 3 {
						t.Errorf("%.0f partitions restored from damaged snapshots, %.0f refused; want 0 and at least 3", restored, failed)
					}
				} else if restored != 3 || failed != 0 {
					t.Errorf("%.0f partitions restored from snapshots, %.0f failures; want 3 and 0", restored, failed)
				}
				w.stop(t)
			})
		}
	})
}

// TestSnapshotOutlivesRetention deletes every record a snapshot covers
// (as retention would) before a worker with an empty disk takes the
// partitions: it restores the snapshot, no rebuild is partial, and
// repeats of the deleted records' keys are still dropped, exactly as the
// model of the whole input says.
func TestSnapshotOutlivesRetention(t *testing.T) {
	p := newPipeline(t, 1)
	p.withSnapshots(t)
	part1, part2 := twoParts()
	p.runPart(t, t.TempDir(), part1)
	ctx := context.Background()
	if _, err := p.b.admin(t).DeleteRecords(ctx, kadm.Offsets{p.in: {0: {Topic: p.in, Partition: 0, At: int64(len(part1))}}}); err != nil {
		t.Fatal(err)
	}
	p.feed(t, part2, len(part2), 0).wait(t)
	w := p.startWorker(t, t.TempDir())
	w.waitReplayed(t)
	want, got := p.output(t, append(append([]*kgo.Record{}, part1...), part2...))
	requireExact(t, want, got)
	if n := w.metric(t, "kdedup_partial_rebuilds_total"); n != 0 {
		t.Errorf("%.0f partial rebuilds, want none: the snapshot holds the deleted input", n)
	}
	if n := w.metricWith(t, "kdedup_partition_restores_total", "source", "snapshot"); n != 1 {
		t.Errorf("%.0f partitions restored from a snapshot, want 1", n)
	}
	w.stop(t)
}
