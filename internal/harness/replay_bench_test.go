package harness_test

import (
	"context"
	"io"
	"log/slog"
	"os"
	"runtime/debug"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kdedup/kdedup/config"
	"github.com/kdedup/kdedup/internal/app"
	"github.com/kdedup/kdedup/internal/benchenv"
	"github.com/kdedup/kdedup/internal/harness"
	"github.com/kdedup/kdedup/internal/kafkatest"
)

// BenchmarkReplay measures a rebuild through the whole worker: the input
// topic holds KDEDUP_BENCH_KEYS records (default 1,000,000), one per
// distinct key (benchenv.Key), spread evenly over KDEDUP_BENCH_PARTITIONS
// partitions (default 4); the group's offsets are committed at the end of
// each partition, and the worker starts with an empty data directory and
// the default configuration, so it replays every record into its filters
// (forwarding nothing) through its restore clients before it is ready.
// Each iteration is one such rebuild into a fresh data directory:
// -benchtime 1x.
//
// Metrics: rec/s, the records over the time from start to /readyz (the
// group join included); cpu-us/rec, the process's user and system CPU over
// that time per record; peak-RSS-MiB, the process's peak resident memory
// (VmHWM) from the worker's start. With
// KDEDUP_TEST_KAFKA=apache the broker is Apache Kafka in a process of its
// own (internal/kafkatest); by default it is kfake, in this process, whose
// fetch work is then in cpu-us/rec and peak-RSS-MiB. KDEDUP_BENCH_MEMORY
// sets the worker's KDEDUP_MEMORY_BYTES and, as kdedup run does, the Go
// soft memory limit of that budget (default: the worker's own default
// budget, from the container's limit, and no Go memory limit).
//
//	KDEDUP_TEST_KAFKA=apache KDEDUP_BENCH_KEYS=20000000 go test -run '^$' -bench Replay -benchtime 1x -timeout 60m ./internal/harness
func BenchmarkReplay(b *testing.B) {
	keys := benchenv.Int(b, "KDEDUP_BENCH_KEYS", 1_000_000)
	partitions := max(benchenv.Int(b, "KDEDUP_BENCH_PARTITIONS", 4), 1)
	addrs := benchBroker(b)
	in, out, group := "replay-in", "replay-out", "replay-group"

	cl, err := kgo.NewClient(kgo.SeedBrokers(addrs...), kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.ProducerLinger(5*time.Millisecond), kgo.MaxBufferedRecords(1<<20))
	if err != nil {
		b.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	ctx := context.Background()
	for _, topic := range []string{in, out} {
		if _, err := adm.CreateTopic(ctx, int32(partitions), 1, nil, topic); err != nil {
			b.Fatal(err)
		}
	}
	produceStart := time.Now()
	var once sync.Once
	var prodErr error
	for i := range keys {
		key := make([]byte, 16)
		benchenv.Key(key, uint64(i))
		cl.Produce(ctx, &kgo.Record{Topic: in, Partition: int32(i % partitions), Key: key, Value: []byte("v")},
			func(_ *kgo.Record, err error) {
				if err != nil {
					once.Do(func() { prodErr = err })
				}
			})
	}
	if err := cl.Flush(ctx); err != nil {
		b.Fatal(err)
	}
	if prodErr != nil {
		b.Fatal(prodErr)
	}
	b.Logf("produced %d records over %d partitions in %s", keys, partitions, time.Since(produceStart).Round(time.Millisecond))
	ends, err := adm.ListEndOffsets(ctx, in)
	if err != nil {
		b.Fatal(err)
	}
	offsets := kadm.Offsets{}
	ends.Each(func(o kadm.ListedOffset) {
		offsets.Add(kadm.Offset{Topic: o.Topic, Partition: o.Partition, At: o.Offset, LeaderEpoch: -1})
	})
	if err := adm.CommitAllOffsets(ctx, group, offsets); err != nil {
		b.Fatal(err)
	}

	b.ResetTimer()
	for range b.N {
		env := map[string]string{
			"KDEDUP_BROKERS":      addrs[0],
			"KDEDUP_INPUT_TOPICS": in,
			"KDEDUP_OUTPUT_TOPIC": out,
			"KDEDUP_GROUP":        group,
			"KDEDUP_DATA_DIR":     b.TempDir(),
			"KDEDUP_HTTP_ADDR":    "127.0.0.1:0",
		}
		if mem := os.Getenv("KDEDUP_BENCH_MEMORY"); mem != "" {
			env["KDEDUP_MEMORY_BYTES"] = mem
		}
		cfg, err := config.LoadFrom(env)
		if err != nil {
			b.Fatal(err)
		}
		if _, ok := env["KDEDUP_MEMORY_BYTES"]; ok {
			// As kdedup run does: the Go soft memory limit of the budget
			// (the broker runs in another process with apache; with kfake
			// it shares this heap).
			app.SetMemoryLimit(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
		}
		debug.FreeOSMemory() // the producer's buffers returned, out of the worker's peak
		benchenv.ResetPeakRSS()
		cpu := benchenv.CPU(b)
		w, err := harness.StartWorker(ctx, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
		if err != nil {
			b.Fatal(err)
		}
		cpu = benchenv.CPU(b) - cpu
		if got := benchenv.Gathered(b, w.Registry, "kdedup_replayed_records_total"); got != float64(keys) {
			b.Fatalf("ready after replaying %v records, want %d", got, keys)
		}
		if err := w.Stop(); err != nil {
			b.Fatal(err)
		}
		n := float64(keys)
		b.ReportMetric(n/w.ReadyAt.Sub(w.Started).Seconds(), "rec/s")
		b.ReportMetric(float64(cpu)/1e3/n, "cpu-us/rec")
		b.ReportMetric(float64(benchenv.PeakRSS())/(1<<20), "peak-RSS-MiB")
	}
}

// benchBroker starts the broker KDEDUP_TEST_KAFKA selects: Apache Kafka or
// (default) kfake.
func benchBroker(b *testing.B) []string {
	switch k := os.Getenv("KDEDUP_TEST_KAFKA"); k {
	case "apache":
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		c, err := kafkatest.Start(ctx, 1, kafkatest.Options{})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = c.Close() })
		return c.Addrs()
	case "", "kfake":
		c, err := kfake.NewCluster(kfake.NumBrokers(1))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(c.Close)
		return c.ListenAddrs()
	default:
		b.Fatalf("KDEDUP_TEST_KAFKA=%q: want apache, or kfake (the default)", k)
		return nil
	}
}
