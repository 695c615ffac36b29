package harness_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kdedup/kdedup/config"
	"github.com/kdedup/kdedup/dedup"
	"github.com/kdedup/kdedup/filter"
	"github.com/kdedup/kdedup/internal/benchenv"
	"github.com/kdedup/kdedup/internal/harness"
	"github.com/kdedup/kdedup/snapshot"
	"github.com/kdedup/kdedup/store"
)

// BenchmarkRestoreMemory measures the worker's memory while every
// partition it is assigned restores from a snapshot at once: the input
// topic has KDEDUP_BENCH_PARTITIONS partitions (default 16), one record
// each, and the group's offset 1 committed on each; a file:// snapshot
// store holds a snapshot of each partition at offset 1 with
// KDEDUP_BENCH_STATE_BYTES of pages (default 128 MiB, rounded down to
// whole pages) of random bytes (incompressible, as fingerprints are). The
// snapshots' metadata is that of a real chain with the worker's filter
// parameters and key spec (a Deduplicator opened in this process with
// the options the worker derives from the same environment, committed at
// offset 1 and exported), with KDEDUP_CAPACITY raised so that its first
// sub-filter has every page written. The worker runs as kdedup run in a
// child process (KDEDUP_BENCH_WORKER_PROCESS: "1", the default, builds
// cmd/kdedup; another value is the path of a kdedup binary) in a memory
// cgroup of KDEDUP_BENCH_MEMORY_LIMIT bytes (default 3 GiB, the chart's
// container limit; the worker takes 90% of it as its budget by itself),
// on an empty data directory, so it plans a restore of every partition
// from its snapshot. The benchmark is skipped where no memory cgroup can
// be made (benchenv.ErrNoMemoryCgroup: root and a writable cgroup file
// system are needed). Each iteration is one such start: -benchtime 1x.
//
// It fails when the worker exits (an OOM kill) before every partition is
// restored, or when a partition was not restored from its snapshot (the
// worker's log has one "restored from a snapshot" line a partition).
//
// Metrics: partitions; state-MiB, each partition's pages; restore-s,
// from the worker's start to every partition restored
// (kdedup_partition_restores_total at the partitions and
// kdedup_partitions_restoring 0, polled every 100 ms; the group join
// included); peak-anon-MiB, peak-RSS-MiB and cgroup-peak-MiB
// (memoryWatch); oom-kills; and from the worker's "memory budget" log
// line budget-MiB (its total) and restores-at-once (absent from a worker
// that logs none: a binary before the bound on restores).
//
//	KDEDUP_TEST_KAFKA=apache go test -run '^$' -bench RestoreMemory -benchtime 1x -timeout 30m ./internal/harness
func BenchmarkRestoreMemory(b *testing.B) {
	partitions := max(benchenv.Int(b, "KDEDUP_BENCH_PARTITIONS", 16), 1)
	limit := benchenv.Int(b, "KDEDUP_BENCH_MEMORY_LIMIT", 3<<30)
	if limit <= 0 {
		b.Fatalf("KDEDUP_BENCH_MEMORY_LIMIT=%d: want a limit in bytes", limit)
	}
	probe, err := benchenv.NewMemoryCgroup(fmt.Sprintf("kdedup-bench-probe-%d", os.Getpid()), int64(limit))
	if errors.Is(err, benchenv.ErrNoMemoryCgroup) {
		b.Skipf("the worker must run in a memory cgroup: %v", err)
	}
	if err != nil {
		b.Fatal(err)
	}
	if err := probe.Remove(); err != nil {
		b.Fatal(err)
	}
	// startWorkerProcess reads both.
	b.Setenv("KDEDUP_BENCH_MEMORY_LIMIT", strconv.Itoa(limit))
	if os.Getenv("KDEDUP_BENCH_WORKER_PROCESS") == "" {
		b.Setenv("KDEDUP_BENCH_WORKER_PROCESS", "1")
	}

	addrs := benchBroker(b)
	in, out, group := "restore-in", "restore-out", "restore-group"
	cl, err := kgo.NewClient(kgo.SeedBrokers(addrs...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		b.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	ctx := context.Background()
	created, err := adm.CreateTopics(ctx, int32(partitions), 1, nil, in, out)
	if err == nil {
		err = created.Error()
	}
	if err != nil {
		b.Fatal(err)
	}
	produceKeys(b, cl, in, partitions, 0, partitions, 0) // one record a partition
	offsets := kadm.Offsets{}
	for p := range partitions {
		offsets.Add(kadm.Offset{Topic: in, Partition: int32(p), At: 1, LeaderEpoch: -1})
	}
	if err := adm.CommitAllOffsets(ctx, group, offsets); err != nil {
		b.Fatal(err)
	}

	snapDir := b.TempDir()
	env := map[string]string{
		"KDEDUP_BROKERS":           addrs[0],
		"KDEDUP_INPUT_TOPICS":      in,
		"KDEDUP_OUTPUT_TOPIC":      out,
		"KDEDUP_GROUP":             group,
		"KDEDUP_SNAPSHOT_URL":      "file://" + snapDir,
		"KDEDUP_SNAPSHOT_INTERVAL": "24h",
	}
	cfg, err := config.LoadFrom(env)
	if err != nil {
		b.Fatal(err)
	}
	pages := uint64(benchenv.Int(b, "KDEDUP_BENCH_STATE_BYTES", 128<<20) / int(cfg.PageBytes))
	if pages == 0 {
		b.Fatalf("KDEDUP_BENCH_STATE_BYTES: less than a page of %d bytes", cfg.PageBytes)
	}
	params := cfg.FilterParams()
	params.PageBytes = int(cfg.PageBytes) // the store's, which the deduplicators take
	env["KDEDUP_CAPACITY"] = strconv.FormatUint(capacityFor(b, params, pages), 10)
	if cfg, err = config.LoadFrom(env); err != nil {
		b.Fatal(err)
	}
	writeStart := time.Now()
	writeSnapshots(b, cfg, in, partitions, pages)
	stateBytes := int64(pages) * int64(cfg.PageBytes)
	b.Logf("wrote %d snapshots of %d MiB of pages in %s", partitions, stateBytes>>20, time.Since(writeStart).Round(time.Millisecond))

	b.ResetTimer()
	for range b.N {
		env["KDEDUP_DATA_DIR"] = b.TempDir()
		c := startWorkerProcess(b, env)
		restoredAt := waitRestored(b, c, partitions)
		mem := c.watch.sample()
		restored, budget, atOnce := restoreLog(b, c.output)
		if restored != partitions {
			b.Fatalf("%d of %d partitions restored from their snapshots (the worker's log: %s)", restored, partitions, c.output)
		}
		if err := c.stop(); err != nil {
			b.Fatal(err)
		}
		if kills, err := c.cg.OOMKills(); err != nil || kills > 0 {
			b.Fatalf("the worker's cgroup: %d OOM kills (%v)", kills, err)
		}
		b.ReportMetric(float64(partitions), "partitions")
		b.ReportMetric(float64(stateBytes)/(1<<20), "state-MiB")
		b.ReportMetric(restoredAt.Sub(c.run.started).Seconds(), "restore-s")
		mem.report(b, "")
		b.ReportMetric(float64(budget)/(1<<20), "budget-MiB")
		if atOnce >= 0 {
			b.ReportMetric(float64(atOnce), "restores-at-once")
		}
	}
}

// capacityFor returns the smallest Capacity with which p's first
// sub-filter (as filter.New lays it out) has at least pages pages.
func capacityFor(b *testing.B, p filter.Params, pages uint64) uint64 {
	firstPages := func(capacity uint64) uint64 {
		p.Capacity = capacity
		c, err := filter.New(p, filter.NewMemPager(p.WithDefaults().PageBytes))
		if err != nil {
			b.Fatal(err)
		}
		m, err := filter.DecodeMeta(c.MarshalMeta())
		if err != nil {
			b.Fatal(err)
		}
		if len(m.SubFilters) == 0 {
			b.Fatal("a new chain has no sub-filter (KDEDUP_WINDOW set?): no pages to restore")
		}
		return m.SubFilters[0].Pages
	}
	lo, hi := uint64(1), p.WithDefaults().MaxCapacity()
	if firstPages(hi) < pages {
		b.Fatalf("%d pages: more than a first sub-filter holds", pages)
	}
	for lo < hi {
		mid := lo + (hi-lo)/2
		if firstPages(mid) >= pages {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	return lo
}

// writeSnapshots writes to cfg's snapshot store, under its group, a
// snapshot at offset 1 of each partition of topic: the metadata of a new
// chain of the worker's options (dedup.Opener over a store in memory,
// committed at offset 1, exported), then pages pages of its first
// sub-filter, of random bytes.
func writeSnapshots(b *testing.B, cfg config.Config, topic string, partitions int, pages uint64) {
	ctx := context.Background()
	dopts, err := cfg.DedupOptions()
	if err != nil {
		b.Fatal(err)
	}
	db, err := store.Open(store.Options{InMemory: true, PageBytes: int(cfg.PageBytes), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	opener, err := dedup.NewOpener(db, dopts, nil)
	if err != nil {
		b.Fatal(err)
	}
	st, err := snapshot.Open(ctx, cfg.SnapshotURL)
	if err != nil {
		b.Fatal(err)
	}
	st = st.In(cfg.Group)
	defer st.Close()
	rng := rand.NewChaCha8([32]byte{'k', 'd', 'e', 'd', 'u', 'p'})
	page := make([]byte, cfg.PageBytes)
	for p := range int32(partitions) {
		tp := store.TopicPartition{Topic: topic, Partition: p}
		d, err := opener.Open(topic, p)
		if err != nil {
			b.Fatal(err)
		}
		err = d.Commit(store.Checkpoint{Offset: 1, LeaderEpoch: -1})
		d.Close()
		if err != nil {
			b.Fatal(err)
		}
		var img store.Image
		if _, err := opener.Export(tp, func(i store.Image) error { img = i; return nil }, func(filter.PageID, []byte) error { return nil }); err != nil {
			b.Fatal(err)
		}
		meta, err := filter.DecodeMeta(img.Meta)
		if err != nil {
			b.Fatal(err)
		}
		first := meta.SubFilters[0].ID
		_, err = st.Put(ctx, tp, func(header func(store.Image) error, put func(filter.PageID, []byte) error) (bool, error) {
			if err := header(img); err != nil {
				return true, err
			}
			for i := range pages {
				_, _ = rng.Read(page)
				if err := put(filter.PageID{SubFilter: first, Page: uint32(i)}, page); err != nil {
					return true, err
				}
			}
			return true, nil
		})
		if err != nil {
			b.Fatal(err)
		}
	}
}

// waitRestored polls the worker's metrics every 100 ms until
// kdedup_partition_restores_total (its sources summed) reaches partitions
// and kdedup_partitions_restoring is 0, and returns when it saw that. The
// benchmark fails when the worker exits first, or after 30 minutes.
func waitRestored(b *testing.B, c *childProcess, partitions int) time.Time {
	deadline := time.Now().Add(30 * time.Minute)
	for {
		metrics, err := harness.Scrape(context.Background(), c.addr)
		if err == nil && metrics["kdedup_partition_restores_total"] >= float64(partitions) && metrics["kdedup_partitions_restoring"] == 0 {
			return time.Now()
		}
		if time.Now().After(deadline) {
			c.fail("restoring", fmt.Errorf("not restored after 30 minutes (last scrape: %v)", err))
		}
		select {
		case err := <-c.done:
			c.stopped = true
			c.fail("while restoring", err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// restoreLog reads the worker's JSON log: how many partitions it restored
// from a snapshot, and from its "memory budget" line the budget's total
// and restores_at_once (-1 when the line has none).
func restoreLog(b *testing.B, file string) (restored int, budget int64, atOnce int) {
	f, err := os.Open(file)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	atOnce, budget = -1, -1
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var line struct {
			Msg    string `json:"msg"`
			Total  int64  `json:"total_bytes"`
			AtOnce *int   `json:"restores_at_once"`
		}
		if json.Unmarshal(sc.Bytes(), &line) != nil {
			continue
		}
		switch line.Msg {
		case "restored from a snapshot; replaying the input after it":
			restored++
		case "memory budget":
			budget = line.Total
			if line.AtOnce != nil {
				atOnce = *line.AtOnce
			}
		}
	}
	if err := sc.Err(); err != nil {
		b.Fatal(err)
	}
	if budget < 0 {
		b.Fatalf("no \"memory budget\" line in the worker's log %s", file)
	}
	return restored, budget, atOnce
}
