package app_test

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kdedup/kdedup/config"
	"github.com/kdedup/kdedup/internal/app"
	"github.com/kdedup/kdedup/internal/kafkatest"
)

// BenchmarkReplay measures a rebuild through the whole worker: the input
// topic holds KDEDUP_BENCH_KEYS records (default 1,000,000), one per
// distinct key (16 random-looking hexadecimal characters), spread evenly
// over KDEDUP_BENCH_PARTITIONS partitions (default 4); the group's offsets
// are committed at the end of each partition, and the worker starts with
// an empty data directory and the default configuration, so it replays
// every record into its filters (forwarding nothing) through its restore
// clients before it is ready. Each iteration is one such rebuild into a
// fresh data directory: -benchtime 1x.
//
// Metrics: rec/s over the replay (from the first replayed record seen to
// the last, sampled every 20 ms), startup-to-ready-s (from app.Run to
// kdedup_worker_ready, including the group join), cpu-us/rec (the
// process's user and system CPU over the same span as startup-to-ready-s,
// divided by the records) and peak-RSS-MiB of the process. With
// KDEDUP_TEST_KAFKA=apache the broker is Apache Kafka in a process of its
// own (internal/kafkatest); by default it is kfake, in this process, whose
// fetch work is then in cpu-us/rec and peak-RSS-MiB.
//
//	KDEDUP_TEST_KAFKA=apache KDEDUP_BENCH_KEYS=20000000 go test -run '^$' -bench Replay -benchtime 1x -timeout 60m ./internal/app
func BenchmarkReplay(b *testing.B) {
	keys := benchEnv(b, "KDEDUP_BENCH_KEYS", 1_000_000)
	partitions := benchEnv(b, "KDEDUP_BENCH_PARTITIONS", 4)
	addrs := benchBroker(b)
	in, out, group := "replay-in", "replay-out", "replay-group"

	cl, err := kgo.NewClient(kgo.SeedBrokers(addrs...), kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.ProducerLinger(5*time.Millisecond), kgo.ProducerBatchCompression(kgo.NoCompression()),
		kgo.MaxBufferedRecords(1<<20))
	if err != nil {
		b.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	ctx := context.Background()
	if _, err := adm.CreateTopic(ctx, int32(partitions), 1, nil, in); err != nil {
		b.Fatal(err)
	}
	if _, err := adm.CreateTopic(ctx, int32(partitions), 1, nil, out); err != nil {
		b.Fatal(err)
	}
	produceStart := time.Now()
	var (
		mu      sync.Mutex
		prodErr error
	)
	for i := range keys {
		var raw [8]byte
		binary.BigEndian.PutUint64(raw[:], mix(uint64(i)))
		key := make([]byte, 16)
		hex.Encode(key, raw[:])
		r := &kgo.Record{Topic: in, Partition: int32(i % partitions), Key: key, Value: []byte("v")}
		cl.Produce(ctx, r, func(_ *kgo.Record, err error) {
			if err != nil {
				mu.Lock()
				prodErr = err
				mu.Unlock()
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
		cfg, err := config.LoadFrom(map[string]string{
			"KDEDUP_BROKERS":      addrs[0],
			"KDEDUP_INPUT_TOPICS": in,
			"KDEDUP_OUTPUT_TOPIC": out,
			"KDEDUP_GROUP":        group,
			"KDEDUP_DATA_DIR":     b.TempDir(),
			"KDEDUP_HTTP_ADDR":    "127.0.0.1:0",
		})
		if err != nil {
			b.Fatal(err)
		}
		reg := prometheus.NewRegistry()
		wctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		startCPU, start := cpuTime(b), time.Now()
		go func() {
			done <- app.Run(wctx, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), reg, nil)
		}()
		var first, last time.Time
		for {
			select {
			case err := <-done:
				cancel()
				b.Fatalf("worker stopped: %v", err)
			case <-time.After(20 * time.Millisecond):
			}
			replayed := gather(b, reg, "kdedup_replayed_records_total")
			if replayed > 0 && first.IsZero() {
				first = time.Now()
			}
			if replayed >= float64(keys) && gather(b, reg, "kdedup_worker_ready") == 1 {
				last = time.Now()
				break
			}
		}
		cpu := cpuTime(b) - startCPU
		cancel()
		if err := <-done; err != nil {
			b.Fatal(err)
		}
		n := float64(keys)
		b.ReportMetric(n/last.Sub(first).Seconds(), "rec/s")
		b.ReportMetric(last.Sub(start).Seconds(), "startup-to-ready-s")
		b.ReportMetric(float64(cpu)/1e3/n, "cpu-us/rec")
		b.ReportMetric(float64(peakRSS(b))/(1<<20), "peak-RSS-MiB")
	}
}

func benchEnv(b *testing.B, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		b.Fatalf("%s=%q: want a positive integer", name, v)
	}
	return n
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

// mix is splitmix64's finalizer: a bijection, so distinct i give distinct
// keys.
func mix(i uint64) uint64 {
	z := i + 0x9e3779b97f4a7c15
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	return z ^ z>>31
}

func gather(b *testing.B, reg *prometheus.Registry, name string) float64 {
	mfs, err := reg.Gather()
	if err != nil {
		b.Fatal(err)
	}
	total := 0.0
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				total += m.GetCounter().GetValue() + m.GetGauge().GetValue()
			}
		}
	}
	return total
}

func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// peakRSS is the process's peak resident set (VmHWM), in bytes.
func peakRSS(b *testing.B) int64 {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		b.Fatal(err)
	}
	var kb int64
	for _, line := range strings.Split(string(data), "\n") {
		if n, _ := fmt.Sscanf(line, "VmHWM: %d kB", &kb); n == 1 {
			return kb << 10
		}
	}
	b.Fatal("no VmHWM in /proc/self/status")
	return 0
}
