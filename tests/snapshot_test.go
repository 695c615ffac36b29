package tests

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

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

// TestSnapshotCrashLoop runs three worker processes in one group over 6
// partitions, with snapshots every second, while input keeps arriving,
// and for 8 rounds SIGKILLs one of them and restarts it on an empty data
// directory: each restart restores its partitions from snapshots (or
// replays where none is usable yet) and replays the gap, and the kills
// land while snapshots upload, while restores download and load, and
// while gaps replay. Exactly once the read_committed output must equal the
// exact model; at least once nothing may be missing, and the repeats stay
// within the README's bound per kill. At least one partition must have
// been restored from a snapshot.
func TestSnapshotCrashLoop(t *testing.T) {
	deliveries(t, func(t *testing.T, delivery string) {
		p := newPipeline(t, 6)
		p.delivery = delivery
		p.withSnapshots(t)
		p.extraEnv["KDEDUP_LOG_LEVEL"] = "info"
		recs := scenario.Generate(scenario.Options{Keys: 8000, Seed: 11})
		procs := make([]*process, 3)
		for i := range procs {
			procs[i] = p.startProcess(t, t.TempDir())
		}
		const chunk, pause = 10, 60 * time.Millisecond
		budget := p.newRepeatBudget(t, chunk)
		f := p.feed(t, recs, chunk, pause)
		rng := rand.New(rand.NewPCG(uint64(len(delivery)), 21))
		var logs []string
		for kill := 1; kill <= 8; kill++ {
			for _, pr := range procs {
				pr.waitReady(t)
			}
			p.waitMembers(t, len(procs))
			i := rng.IntN(len(procs))
			time.Sleep(time.Duration(200+rng.IntN(1500)) * time.Millisecond)
			budget.lose(t, fmt.Sprintf("kill %d", kill), time.Now())
			procs[i].kill()
			logs = append(logs, procs[i].log)
			procs[i] = p.startProcess(t, t.TempDir())
		}
		f.hurry()
		f.wait(t)
		want, got := p.output(t, recs)
		restored := 0
		for _, pr := range procs {
			logs = append(logs, pr.log)
		}
		for _, l := range logs {
			b, err := os.ReadFile(l)
			if err != nil {
				t.Fatal(err)
			}
			restored += strings.Count(string(b), "restored from a snapshot")
		}
		if restored == 0 {
			t.Error("no partition was restored from a snapshot: the test did not test snapshots")
		}
		t.Logf("%s: 8 kills, each restart on an empty disk; %d partitions restored from snapshots", delivery, restored)
		if delivery == "exactly-once" {
			requireExact(t, want, got)
			return
		}
		extra := requireNothingMissing(t, want, got)
		budget.require(t, extra)
	})
}

// TestSnapshotStoreUnreachable points the workers at an S3 endpoint where
// nothing listens: the worker starts (a WARN, not a stop), its uploads
// fail and are counted, a worker with an empty disk replays instead of
// restoring, and the output is exactly the model's.
func TestSnapshotStoreUnreachable(t *testing.T) {
	p := newPipeline(t, 2)
	for k, v := range s3test.Env() {
		t.Setenv(k, v)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	p.extraEnv = map[string]string{
		"KDEDUP_SNAPSHOT_URL":      "s3://kdedup/x?region=us-east-1&use_path_style=true&endpoint=http://" + addr,
		"KDEDUP_SNAPSHOT_INTERVAL": "1s",
	}
	part1, part2 := twoParts()
	p.runPart(t, t.TempDir(), part1)
	p.feed(t, part2, len(part2), 0).wait(t)
	w := p.startWorker(t, t.TempDir())
	w.waitReplayed(t)
	want, got := p.output(t, append(append([]*kgo.Record{}, part1...), part2...))
	requireExact(t, want, got)
	if n := w.metric(t, "kdedup_replayed_records_total"); n != float64(len(part1)) {
		t.Errorf("replayed %.0f records, want %d: the whole input before the move", n, len(part1))
	}
	if n := w.metric(t, "kdedup_snapshot_restore_failures_total"); n < 1 {
		t.Errorf("%.0f restore failures counted, want the unreachable store's", n)
	}
	w.stop(t)
}

// TestSnapshotStoreGoesAway stops the S3-compatible server while a worker
// runs (needs KDEDUP_TEST_S3=versitygw): its uploads fail and are
// counted, it keeps deciding, and the output is exactly the model's.
func TestSnapshotStoreGoesAway(t *testing.T) {
	if !s3test.Enabled() {
		t.Skip("needs an S3-compatible server to stop: set KDEDUP_TEST_S3=versitygw")
	}
	p := newPipeline(t, 2)
	p.extraEnv = map[string]string{"KDEDUP_SNAPSHOT_INTERVAL": "1s"}
	srv := s3test.New(t)
	p.extraEnv["KDEDUP_SNAPSHOT_URL"] = srv.URL(p.group)
	part1, part2 := twoParts()
	p.feed(t, part1, len(part1), 0).wait(t)
	w := p.startWorker(t, t.TempDir())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for w.metricWith(t, "kdedup_snapshot_uploads_total", "result", "ok") < 2 {
		if ctx.Err() != nil {
			t.Fatal("no snapshot uploaded within a minute")
		}
		time.Sleep(50 * time.Millisecond)
	}
	srv.Stop()
	p.feed(t, part2, len(part2), 0).wait(t)
	want, got := p.output(t, append(append([]*kgo.Record{}, part1...), part2...))
	requireExact(t, want, got)
	for w.metricWith(t, "kdedup_snapshot_uploads_total", "result", "error") < 1 {
		if ctx.Err() != nil {
			t.Fatal("no failed upload counted within a minute of the store going away")
		}
		time.Sleep(50 * time.Millisecond)
	}
	w.running(t)
	w.stop(t)
}

// TestSnapshotScaleOut grows the group from one worker to three while
// records flow, exactly once, with snapshots: the partitions that move
// restore from the snapshot their previous owner uploaded when they were
// revoked, and the output is exactly the model's.
func TestSnapshotScaleOut(t *testing.T) {
	p := newPipeline(t, 6)
	p.delivery = "exactly-once"
	p.withSnapshots(t)
	recs := scenario.Generate(scenario.Options{Keys: 8000, Seed: 12})
	f := p.feed(t, recs, 10, 40*time.Millisecond)
	a := p.startWorker(t, t.TempDir())
	time.Sleep(2 * time.Second)
	b := p.startWorker(t, t.TempDir())
	time.Sleep(2 * time.Second)
	c := p.startWorker(t, t.TempDir())
	f.hurry()
	f.wait(t)
	want, got := p.output(t, recs)
	requireExact(t, want, got)
	moved := b.metricWith(t, "kdedup_partition_restores_total", "source", "snapshot") + c.metricWith(t, "kdedup_partition_restores_total", "source", "snapshot")
	if moved < 1 {
		t.Errorf("no partition restored from a snapshot on the workers that joined")
	}
	t.Logf("partitions restored from snapshots by the workers that joined: %.0f", moved)
	for _, w := range []*worker{c, b, a} {
		w.stop(t)
	}
}

// TestSnapshotReplacesDamagedState corrupts a table of a stopped worker's
// data directory (as TestCorruptStateRefused does, which without
// snapshots stops the worker): with snapshots the worker moves the
// damaged files aside into a damaged-* subdirectory, keeping them, starts
// without local state and restores its partitions from their snapshots;
// the output of the whole stream is exactly the model's.
// kdedup_damaged_state_bytes is what the damaged-* directory takes on
// disk, after the move and at the next start.
func TestSnapshotReplacesDamagedState(t *testing.T) {
	p := newPipeline(t, 2)
	p.withSnapshots(t)
	recs := stream(22)
	dir := filepath.Join(t.TempDir(), "state")
	p.runPart(t, dir, recs[:len(recs)/2])
	tables, err := filepath.Glob(filepath.Join(dir, "*.sst"))
	if err != nil || len(tables) == 0 {
		t.Fatalf("no table in %s after a graceful stop (%v)", dir, err)
	}
	b, err := os.ReadFile(tables[0])
	if err != nil {
		t.Fatal(err)
	}
	for i := len(b) / 2; i < len(b)/2+16; i++ {
		b[i] ^= 0xff
	}
	if err := os.WriteFile(tables[0], b, 0o644); err != nil {
		t.Fatal(err)
	}
	p.feed(t, recs[len(recs)/2:], len(recs)-len(recs)/2, 0).wait(t)
	w := p.startWorker(t, dir)
	w.waitReplayed(t)
	want, got := p.output(t, recs)
	requireExact(t, want, got)
	if n := w.metricWith(t, "kdedup_partition_restores_total", "source", "snapshot"); n != 2 {
		t.Errorf("%.0f partitions restored from snapshots, want 2", n)
	}
	kept, err := filepath.Glob(filepath.Join(dir, "damaged-*", filepath.Base(tables[0])))
	if err != nil || len(kept) != 1 {
		t.Fatalf("the damaged table was not kept in a damaged-* directory: %v, %v", kept, err)
	}
	damaged := filepath.Dir(kept[0])
	if got, want := w.metric(t, "kdedup_damaged_state_bytes"), duBytes(t, damaged); got != want || want == 0 {
		t.Errorf("after the move kdedup_damaged_state_bytes = %v, want %v, what %s takes on disk", got, want, damaged)
	}
	w.stop(t)
	// A start on the repaired state keeps the damaged directory and
	// measures it.
	w = p.startWorker(t, dir)
	w.waitReplayed(t)
	if got, want := w.metric(t, "kdedup_damaged_state_bytes"), duBytes(t, damaged); got != want || want == 0 {
		t.Errorf("at the next start kdedup_damaged_state_bytes = %v, want %v, what %s takes on disk", got, want, damaged)
	}
	w.stop(t)
}

// duBytes sums the allocated blocks (st_blocks*512) of dir and everything
// under it, as du does.
func duBytes(t *testing.T, dir string) float64 {
	t.Helper()
	var n int64
	err := filepath.Walk(dir, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		var st syscall.Stat_t
		if err := syscall.Lstat(p, &st); err != nil {
			return err
		}
		n += st.Blocks * 512
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return float64(n)
}
