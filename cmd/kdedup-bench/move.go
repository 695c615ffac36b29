package main

import (
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kdedup/kdedup/config"
	"github.com/kdedup/kdedup/filter"
	"github.com/kdedup/kdedup/internal/app"
	"github.com/kdedup/kdedup/internal/benchenv"
	"github.com/kdedup/kdedup/internal/embedded"
	"github.com/kdedup/kdedup/internal/kafkatest"
	"github.com/kdedup/kdedup/internal/s3test"
	"github.com/kdedup/kdedup/snapshot"
	"github.com/kdedup/kdedup/store"
)

// moveCmd measures what moving one topic-partition to a worker with
// an empty disk costs, with snapshots and without (see docs/bench/HISTORY.md,
// "Moving a partition"):
//
//  1. worker A decides -keys records of distinct keys on one partition,
//     with snapshots, then stops (a revocation: its last state uploaded);
//  2. worker B, empty disk, restores the snapshot: the planned move, timed
//     from A's stop to B's readiness;
//  3. -gap more records are decided on A's disk by a worker without
//     snapshots, so that the newest snapshot is -gap records behind the
//     group (a crash, or an interval's worth);
//  4. worker C, empty disk, restores the snapshot and replays the gap;
//  5. worker D, empty disk, no snapshots: the full replay of today.
func moveCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("move", flag.ContinueOnError)
	fs.SetOutput(stderr)
	keys := fs.Int("keys", 25_000_000, "records of distinct 16-byte keys the partition holds before the move")
	gap := fs.Int("gap", 1_200_000, "records decided after the newest snapshot before the unplanned move (a minute at 20,000 records/s)")
	broker := fs.String("broker", "apache", "apache (one Apache Kafka broker, internal/kafkatest) or kfake")
	storeKind := fs.String("store", "s3", "s3 (VersityGW on loopback, internal/s3test) or file")
	verbose := fs.Bool("v", false, "show the workers' info logs")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	root, err := os.MkdirTemp("", "kdedup-bench-move-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(root)

	const in, out, group = "events", "events-dedup", "kdedup-move"
	var brokers []string
	switch *broker {
	case "apache":
		cluster, err := kafkatest.Start(ctx, 1, kafkatest.Options{})
		if err != nil {
			return fmt.Errorf("starting Apache Kafka: %w", err)
		}
		defer cluster.Close()
		brokers = cluster.Addrs()
	case "kfake":
		cluster, err := embedded.NewCluster(1)
		if err != nil {
			return err
		}
		defer cluster.Close()
		brokers = cluster.Brokers
	default:
		return fmt.Errorf("%w: -broker %q: want apache or kfake", errUsage, *broker)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ProducerLinger(5*time.Millisecond), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		return err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	if _, err := adm.CreateTopic(ctx, 1, 1, nil, in); err != nil {
		return fmt.Errorf("creating %s: %w", in, err)
	}
	if _, err := adm.CreateTopic(ctx, 1, 1, nil, out); err != nil {
		return fmt.Errorf("creating %s: %w", out, err)
	}

	var snapURL, storeDesc string
	switch *storeKind {
	case "s3":
		srv, err := s3test.Start(ctx, filepath.Join(root, "s3"))
		if err != nil {
			return err
		}
		defer srv.Close()
		for k, v := range s3test.Env() {
			os.Setenv(k, v)
		}
		snapURL, storeDesc = srv.URL("move"), "VersityGW "+s3test.Version+" on loopback"
	case "file":
		snapURL, storeDesc = "file://"+filepath.Join(root, "snapshots"), "a directory (file://)"
	default:
		return fmt.Errorf("%w: -store %q: want s3 or file", errUsage, *storeKind)
	}
	fmt.Fprintf(stdout, "broker %s, snapshot store %s; one partition of %d records of distinct keys, then a gap of %d\n", *broker, storeDesc, *keys, *gap)

	produced := 0
	produce := func(n int) error {
		start := time.Now()
		var wg sync.WaitGroup
		var mu sync.Mutex
		var perr error
		for i := produced; i < produced+n; i++ {
			k := make([]byte, 16)
			binary.BigEndian.PutUint64(k, uint64(i)*0x9E3779B97F4A7C15)
			binary.BigEndian.PutUint64(k[8:], uint64(i))
			wg.Add(1)
			cl.Produce(ctx, &kgo.Record{Topic: in, Key: k, Value: k[:8]}, func(_ *kgo.Record, err error) {
				if err != nil {
					mu.Lock()
					perr = err
					mu.Unlock()
				}
				wg.Done()
			})
		}
		wg.Wait()
		if perr != nil {
			return perr
		}
		produced += n
		fmt.Fprintf(stdout, "produced %d records in %s\n", n, time.Since(start).Round(time.Millisecond))
		return nil
	}
	worker := func(name, dir string, snapshots bool) (*embedded.Worker, error) {
		env := map[string]string{
			"KDEDUP_BROKERS": brokers[0], "KDEDUP_INPUT_TOPICS": in, "KDEDUP_OUTPUT_TOPIC": out, "KDEDUP_GROUP": group,
			"KDEDUP_DATA_DIR": filepath.Join(root, dir), "KDEDUP_HTTP_ADDR": "127.0.0.1:0",
			"KDEDUP_LOG_FORMAT": "text", "KDEDUP_LOG_LEVEL": map[bool]string{true: "info", false: "warn"}[*verbose],
			"KDEDUP_SNAPSHOT_INTERVAL": "24h", // only the stop's snapshot
			"KDEDUP_SHUTDOWN_TIMEOUT":  "10m",
		}
		if snapshots {
			env["KDEDUP_SNAPSHOT_URL"] = snapURL
		}
		cfg, err := config.LoadFrom(env)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", errUsage, err)
		}
		return embedded.StartWorker(ctx, cfg, app.NewLogger(stderr, cfg.SlogLevel(), cfg.LogFormat))
	}
	decide := func(w *embedded.Worker, name string) error {
		wait, cancel := context.WithTimeout(ctx, 30*time.Minute)
		defer cancel()
		_, err := embedded.WaitCommitted(wait, adm, group, in, produced, w.ReadyAt, stdout)
		return err
	}
	hist := func(w *embedded.Worker, name string) (sum float64, count uint64) {
		mfs, err := w.Registry.Gather()
		if err != nil {
			return 0, 0
		}
		for _, mf := range mfs {
			if mf.GetName() == name && mf.GetType() == dto.MetricType_HISTOGRAM {
				for _, m := range mf.GetMetric() {
					sum += m.GetHistogram().GetSampleSum()
					count += m.GetHistogram().GetSampleCount()
				}
			}
		}
		return sum, count
	}
	counter := func(w *embedded.Worker, name string) float64 {
		mfs, err := w.Registry.Gather()
		if err != nil {
			return 0
		}
		total := 0.0
		for _, mf := range mfs {
			if mf.GetName() == name {
				total += benchenv.FamilySum(mf)
			}
		}
		return total
	}

	// 1. A builds the state and stops: its last snapshot uploads.
	if err := produce(*keys); err != nil {
		return err
	}
	a, err := worker("A", "a", true)
	if err != nil {
		return err
	}
	start := time.Now()
	if err := decide(a, "A"); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "A: decided %d records in %s\n", *keys, time.Since(start).Round(time.Millisecond))
	revoked := time.Now()
	if err := a.Stop(); err != nil {
		return err
	}
	stopped := time.Since(revoked)
	upSum, upN := hist(a, "kdedup_snapshot_upload_seconds")
	upBytes := counter(a, "kdedup_snapshot_upload_bytes_total")
	fmt.Fprintf(stdout, "A: stopped in %s, of which %d snapshot upload(s) %.3fs, %.1f MiB uploaded (%.2f bytes per key)\n",
		stopped.Round(time.Millisecond), upN, upSum, upBytes/(1<<20), upBytes/float64(*keys))
	root0, err := snapshot.Open(ctx, snapURL)
	if err != nil {
		return err
	}
	st := root0.In(group)
	ms, _, err := st.List(ctx, store.TopicPartition{Topic: in, Partition: 0})
	st.Close()
	if err != nil || len(ms) == 0 {
		return fmt.Errorf("listing the snapshot A uploaded: %v (%d found)", err, len(ms))
	}
	stateBytes := float64(ms[0].StateBytes())
	fmt.Fprintf(stdout, "snapshot: offset %d, %d pages, %.1f MiB of state, %.1f MiB compressed\n", ms[0].Offset, ms[0].Pages, stateBytes/(1<<20), float64(ms[0].Bytes)/(1<<20))
	if err := measureUploads(ctx, filepath.Join(root, "a"), snapURL, store.TopicPartition{Topic: in, Partition: 0}, stdout); err != nil {
		return err
	}

	// 2. The planned move.
	b, err := worker("B", "b", true)
	if err != nil {
		return err
	}
	bReady := b.ReadyAt.Sub(b.Started)
	rsSum, _ := hist(b, "kdedup_snapshot_restore_seconds")
	fmt.Fprintf(stdout, "B (empty disk, snapshot): ready %s after its start (snapshot download and load %.3fs: %.0f MiB/s of state; %.0f records replayed); move from A's revocation: %s\n",
		bReady.Round(time.Millisecond), rsSum, stateBytes/(1<<20)/rsSum, counter(b, "kdedup_replayed_records_total"), (stopped + bReady).Round(time.Millisecond))
	if err := b.Stop(); err != nil {
		return err
	}

	// 3. A gap after the newest snapshot.
	if err := produce(*gap); err != nil {
		return err
	}
	a2, err := worker("A'", "a", false)
	if err != nil {
		return err
	}
	if err := decide(a2, "A'"); err != nil {
		return err
	}
	if err := a2.Stop(); err != nil {
		return err
	}

	// 4. Unplanned move: snapshot and gap replay.
	c, err := worker("C", "c", true)
	if err != nil {
		return err
	}
	cReady := c.ReadyAt.Sub(c.Started)
	rsSum, _ = hist(c, "kdedup_snapshot_restore_seconds")
	fmt.Fprintf(stdout, "C (empty disk, snapshot %d records behind): ready %s after its start (snapshot %.3fs, then %.0f records replayed)\n",
		*gap, cReady.Round(time.Millisecond), rsSum, counter(c, "kdedup_replayed_records_total"))
	if err := c.Stop(); err != nil {
		return err
	}

	// 5. Today's move: replay everything.
	d, err := worker("D", "d", false)
	if err != nil {
		return err
	}
	dReady := d.ReadyAt.Sub(d.Started)
	replayed := counter(d, "kdedup_replayed_records_total")
	fmt.Fprintf(stdout, "D (empty disk, no snapshots): ready %s after its start (%.0f records replayed, %.0f records/s)\n",
		dReady.Round(time.Millisecond), replayed, replayed/dReady.Seconds())
	if err := d.Stop(); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "\nmove of a partition of %d keys to an empty disk:\n  planned (revocation to ready, snapshot): %s\n  unplanned, snapshot %d records behind:   %s\n  full replay, no snapshots:               %s\n",
		*keys, (stopped + bReady).Round(time.Millisecond), *gap, cReady.Round(time.Millisecond), dReady.Round(time.Millisecond))
	return nil
}

// measureUploads times three uploads of the partition's state from the
// stopped worker's data directory (what the snapshotter does each
// interval): wall time and this process's CPU time (export, compression,
// SHA-256, the HTTP client; the store's server is another process).
func measureUploads(ctx context.Context, dir, snapURL string, tp store.TopicPartition, stdout io.Writer) error {
	db, err := store.Open(store.Options{Dir: dir, ReadOnly: true, Logger: app.NewLogger(io.Discard, 0, "text")})
	if err != nil {
		return err
	}
	defer db.Close()
	root, err := snapshot.Open(ctx, snapURL)
	if err != nil {
		return err
	}
	st := root.In("bench-move-uploads") // apart from the workers' snapshots
	defer st.Close()
	for i := range 3 {
		var before, after syscall.Rusage
		_ = syscall.Getrusage(syscall.RUSAGE_SELF, &before)
		start := time.Now()
		m, err := st.Put(ctx, tp, func(h func(store.Image) error, p func(filter.PageID, []byte) error) (bool, error) {
			return db.Export(tp, h, p)
		})
		if err != nil {
			return err
		}
		wall := time.Since(start)
		_ = syscall.Getrusage(syscall.RUSAGE_SELF, &after)
		cpu := time.Duration(after.Utime.Nano()+after.Stime.Nano()-before.Utime.Nano()-before.Stime.Nano()) * time.Nanosecond
		fmt.Fprintf(stdout, "upload %d of the state: %.1f MiB in %s wall, %s CPU of this process (%.0f MiB/s of state)\n",
			i+1, float64(m.Bytes)/(1<<20), wall.Round(time.Millisecond), cpu.Round(time.Millisecond), float64(m.StateBytes())/(1<<20)/wall.Seconds())
	}
	return nil
}
