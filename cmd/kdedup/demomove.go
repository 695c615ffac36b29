package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kdedup/kdedup/config"
	"github.com/kdedup/kdedup/internal/app"
	"github.com/kdedup/kdedup/internal/embedded"
	"github.com/kdedup/kdedup/internal/scenario"
)

// runMoveDemo moves every partition between two workers through snapshots:
// worker A decides the first half of the stream with snapshots in a
// directory store and stops (a graceful stop uploads each partition's last
// state); worker B, on an empty data directory, restores every partition
// from its snapshot, replays nothing and decides the second half. The
// output must be the exact model of the whole stream, as if one worker had
// decided it all.
func runMoveDemo(ctx context.Context, o demoOptions, recs []*kgo.Record, stdout, stderr io.Writer) error {
	const in, out, group = "events", "events-dedup", "kdedup-demo-move"
	cluster, err := embedded.NewCluster(o.partitions, in, out)
	if err != nil {
		return err
	}
	defer cluster.Close()
	recs = embedded.CloneRecords(recs)
	half := len(recs) / 2
	root, err := os.MkdirTemp("", "kdedup-demo-move-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(root)
	snapURL := "file://" + root + "/snapshots"
	fmt.Fprintf(stdout, "\n== moving %d partitions to a worker with an empty disk, through snapshots in %s\n", o.partitions, snapURL)

	run := func(name, dir string, part []*kgo.Record, total int) (replayed, fromSnapshot, fromReplay float64, ready time.Duration, err error) {
		if err := cluster.Produce(ctx, in, part, io.Discard); err != nil {
			return 0, 0, 0, 0, err
		}
		cfg, err := config.LoadFrom(map[string]string{
			"KDEDUP_BROKERS": cluster.Brokers[0], "KDEDUP_INPUT_TOPICS": in, "KDEDUP_OUTPUT_TOPIC": out, "KDEDUP_GROUP": group,
			"KDEDUP_DATA_DIR": dir, "KDEDUP_HTTP_ADDR": "127.0.0.1:0", "KDEDUP_FINGERPRINT_BITS": strconv.Itoa(o.bits),
			"KDEDUP_DELIVERY": o.delivery, "KDEDUP_SNAPSHOT_URL": snapURL,
			"KDEDUP_LOG_FORMAT": "text", "KDEDUP_LOG_LEVEL": map[bool]string{true: "info", false: "warn"}[o.verbose],
		})
		if err != nil {
			return 0, 0, 0, 0, fmt.Errorf("%w: %v", errUsage, err)
		}
		w, err := embedded.StartWorker(ctx, cfg, app.NewLogger(stderr, cfg.SlogLevel(), cfg.LogFormat))
		if err != nil {
			return 0, 0, 0, 0, err
		}
		wait, cancel := context.WithTimeout(ctx, 5*time.Minute)
		_, err = embedded.WaitCommitted(wait, cluster.Admin, group, in, total, w.ReadyAt, io.Discard)
		cancel()
		mfs, gerr := w.Registry.Gather()
		if serr := w.Stop(); err == nil {
			err = serr
		}
		if err == nil {
			err = gerr
		}
		if err != nil {
			return 0, 0, 0, 0, err
		}
		fmt.Fprintf(stdout, "worker %s: ready %s after start; the group committed %d records in all; stopped (its last state uploaded)\n",
			name, w.ReadyAt.Sub(w.Started).Round(time.Millisecond), total)
		return sumMetric(mfs, "kdedup_replayed_records_total"), sumMetricLabel(mfs, "kdedup_partition_restores_total", "source", "snapshot"),
			sumMetricLabel(mfs, "kdedup_partition_restores_total", "source", "replay"), w.ReadyAt.Sub(w.Started), nil
	}
	if _, _, _, _, err := run("A", root+"/a", recs[:half], half); err != nil {
		return err
	}
	replayed, snap, replay, ready, err := run("B", root+"/b", recs[half:], len(recs))
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "worker B (empty data directory): %.0f partitions restored from snapshots, %.0f rebuilt by replay, %.0f records replayed; ready %s after start\n",
		snap, replay, replayed, ready.Round(time.Millisecond))
	outRecs, err := scenario.ReadAll(ctx, cluster.Brokers, out)
	if err != nil {
		return err
	}
	want, got := scenario.Expect(recs, true), scenario.Observe(outRecs)
	if diffs := scenario.Diff(want, got, 10); len(diffs) > 0 {
		for _, d := range diffs {
			fmt.Fprintln(stdout, "  differs:", d)
		}
		return errors.New("demo: output after the move differs from the exact model")
	}
	if snap != float64(o.partitions) || replayed != 0 {
		return fmt.Errorf("demo: worker B restored %.0f of %d partitions from snapshots and replayed %.0f records; want all, and none", snap, o.partitions, replayed)
	}
	fmt.Fprintf(stdout, "output matches the exact model of all %d records: the move through snapshots forgot nothing and replayed nothing\n", len(recs))
	return nil
}
