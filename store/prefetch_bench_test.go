package store_test

import (
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kdedup/kdedup/dedup"
	"github.com/kdedup/kdedup/filter"
	"github.com/kdedup/kdedup/internal/benchenv"
	"github.com/kdedup/kdedup/store"
)

// BenchmarkPrefetchRate measures Prefetch where it matters: a state larger
// than the page cache, fed at a fixed record rate in polls, as the worker
// decides them (one poll per partition per hundredth of a second, Prefetch
// before deciding it, a write batch at FlushBytes or every second). It is
// sized by environment variables:
//
//	KDEDUP_BENCH_KEYS       keys held before measuring (default 5,000,000)
//	KDEDUP_BENCH_PARTITIONS topic-partitions sharing them (default 4)
//	KDEDUP_BENCH_RATE       records per second in total (default 50,000; 0: flat out)
//	KDEDUP_BENCH_CACHE_MIB  page cache in MiB (default 4)
//	KDEDUP_BENCH_PREFETCH   0 decides without Prefetch (default 1)
//	KDEDUP_BENCH_CPUPROFILE a file for the CPU profile of the timed records
//
// b.N is the number of timed records. Keys are new (16 hexadecimal
// characters of a 64-bit mix of a counter), so every record reads one page
// per sub-filter and writes one. The preload prefetches either way: its
// state is the same (fixed hash seeds), only sooner.
//
//	KDEDUP_BENCH_PREFETCH=0 go test -run '^$' -bench 'PrefetchRate' -benchtime 500000x -timeout 60m ./store
//	KDEDUP_BENCH_PREFETCH=1 go test -run '^$' -bench 'PrefetchRate' -benchtime 500000x -timeout 60m ./store
func BenchmarkPrefetchRate(b *testing.B) {
	keys := benchenv.Int(b, "KDEDUP_BENCH_KEYS", 5_000_000)
	partitions := benchenv.Int(b, "KDEDUP_BENCH_PARTITIONS", 4)
	rate := benchenv.Int(b, "KDEDUP_BENCH_RATE", 50_000)
	cacheMiB := benchenv.Int(b, "KDEDUP_BENCH_CACHE_MIB", 4)
	prefetch := benchenv.Int(b, "KDEDUP_BENCH_PREFETCH", 1) != 0

	reg := prometheus.NewRegistry()
	db, err := store.Open(store.Options{Dir: b.TempDir(), CacheBytes: int64(cacheMiB) << 20, Registerer: reg,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	f := &pollFeeder{db: db, flushed: make([]int64, partitions), next: make([]int64, partitions),
		polls: make([][]*kgo.Record, partitions), lastFlush: time.Now()}
	defer func() {
		for _, d := range f.parts {
			d.Close()
		}
		if err := db.Close(); err != nil {
			b.Error(err)
		}
	}()
	for p := range partitions {
		d, err := dedup.Open(db, "events", int32(p), dedup.Options{HashSeed: filter.Seed{K0: uint64(p) + 1, K1: 7}}, nil)
		if err != nil {
			b.Fatal(err)
		}
		f.parts = append(f.parts, d)
	}
	start := time.Now()
	f.prefetch = true
	for i := uint64(0); i < uint64(keys); i += 10_000 {
		if err := f.feed(i, min(i+10_000, uint64(keys))); err != nil {
			b.Fatal(err)
		}
	}
	if err := f.commitAll(); err != nil {
		b.Fatal(err)
	}
	var pageBytes uint64
	for _, d := range f.parts {
		pageBytes += d.Stats().Bytes
	}
	b.Logf("preload of %d keys (%d MiB of pages, cache %d MiB): %v", keys, pageBytes>>20, cacheMiB, time.Since(start).Round(time.Second))
	f.prefetch = prefetch
	fed := uint64(keys)
	b.Run(fmt.Sprintf("keys=%d/rate=%d/cache=%dMiB/prefetch=%t", keys, rate, cacheMiB, prefetch), func(b *testing.B) {
		slice := uint64(max(rate/100, 1))
		if rate == 0 {
			slice = 10_000
		}
		reads0 := benchenv.Gathered(b, reg, "kdedup_store_page_reads_total")
		stop := profileCPU(b)
		defer stop()
		cpu0, wall0 := benchenv.CPU(b), time.Now()
		for sent := uint64(0); sent < uint64(b.N); {
			if rate > 0 {
				due := wall0.Add(time.Duration(float64(sent) / float64(rate) * float64(time.Second)))
				if d := time.Until(due); d > 0 {
					time.Sleep(d)
				}
			}
			n := min(slice, uint64(b.N)-sent)
			if err := f.feed(fed+sent, fed+sent+n); err != nil {
				b.Fatal(err)
			}
			sent += n
		}
		if err := f.commitAll(); err != nil {
			b.Fatal(err)
		}
		cpu, wall := benchenv.CPU(b)-cpu0, time.Since(wall0)
		b.StopTimer()
		fed += uint64(b.N)
		n := float64(b.N)
		b.ReportMetric(n/wall.Seconds(), "rec/s")
		b.ReportMetric(float64(cpu)/1e3/n, "cpu-us/rec")
		b.ReportMetric((benchenv.Gathered(b, reg, "kdedup_store_page_reads_total")-reads0)/n, "page-reads/rec")
	})
}

// pollFeeder hands records to the deduplicators of several partitions in
// polls and cuts write batches as consumer.Worker does at least once.
type pollFeeder struct {
	db        *store.DB
	parts     []*dedup.Deduplicator
	prefetch  bool
	next      []int64
	flushed   []int64
	polls     [][]*kgo.Record
	lastFlush time.Time
}

// feed decides records [from, to): record i goes to partition i mod the
// partition count, each partition's records as one poll.
func (f *pollFeeder) feed(from, to uint64) error {
	n := uint64(len(f.parts))
	for p := range f.polls {
		f.polls[p] = f.polls[p][:0]
	}
	for i := from; i < to; i++ {
		p := i % n
		key := make([]byte, 16)
		benchenv.Key(key, i)
		r := &kgo.Record{Topic: "events", Partition: int32(p), Key: key, Value: []byte("v"), Offset: f.next[p]}
		f.next[p]++
		f.polls[p] = append(f.polls[p], r)
	}
	for p, poll := range f.polls {
		d := f.parts[p]
		if f.prefetch {
			if err := d.Prefetch(poll); err != nil {
				return err
			}
		}
		for _, r := range poll {
			if _, err := d.Decide(r); err != nil {
				return err
			}
			if d.DirtyBytes() >= store.DefaultFlushBytes {
				if err := f.commit(p, r.Offset+1); err != nil {
					return err
				}
			}
		}
	}
	if time.Since(f.lastFlush) >= time.Second {
		return f.commitAll()
	}
	return nil
}

func (f *pollFeeder) commit(p int, next int64) error {
	if next == f.flushed[p] {
		return nil
	}
	f.flushed[p] = next
	return f.parts[p].Commit(store.Checkpoint{Offset: next, LeaderEpoch: -1})
}

func (f *pollFeeder) commitAll() error {
	f.lastFlush = time.Now()
	for p := range f.parts {
		if err := f.commit(p, f.next[p]); err != nil {
			return err
		}
	}
	return nil
}
