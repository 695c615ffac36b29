package store_test

import (
	"fmt"
	"io"
	"log/slog"
	"strings"
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
// before deciding it, a write batch at FlushBytes, when the partition's
// dirty pages pass its share of the worker's bound, or every second). It is
// sized by environment variables:
//
//	KDEDUP_BENCH_KEYS       keys held before measuring (default 5,000,000)
//	KDEDUP_BENCH_PARTITIONS topic-partitions sharing them (default 4)
//	KDEDUP_BENCH_RATE       records per second in total (default 50,000; 0: flat out)
//	KDEDUP_BENCH_CACHE_MIB  page cache in MiB (default 4; with KDEDUP_BENCH_MEMORY, the budget's share)
//	KDEDUP_BENCH_MEMORY     the worker's memory budget in bytes, applied as benchBudget does (default: none)
//	KDEDUP_BENCH_PREFETCH   0 decides without Prefetch (default 1)
//	KDEDUP_BENCH_ROUNDS     the timed rounds, comma-separated: new (b.N keys never
//	                        seen) or dup (b.N keys of the preload again) (default "new")
//	KDEDUP_BENCH_CPUPROFILE a file for the CPU profile of the timed records (of the last round)
//
// b.N is the number of timed records of each round. Keys are 16
// hexadecimal characters of a 64-bit mix of a counter, so every new record
// reads one page per sub-filter and writes one. The preload prefetches
// either way: its state is the same (fixed hash seeds), only sooner. With
// more than one round, each round is a sub-benchmark of its own
// (round=I-new, round=I-dup), run one after the other on the same state.
//
// Metrics of a round: rec/s achieved, cpu-us/rec (the process's user and
// system time), page-reads/rec (Badger reads of pages), user-B/rec and
// disk-B/rec (bytes handed to Badger and written by the process, as
// BenchmarkDurable counts them), peak-RSS-MiB (VmHWM of the round alone,
// the pages of mapped files included: Badger maps its tables and value
// log), peak-anon-MiB (the most RssAnon sampled every 100 ms in the
// round) and anon-outside-pages-MiB (that less the pages-MiB),
// pages-MiB and page-bits/key (the chains' pages after the round),
// sub-filters (the most of any partition) and load (the chains' load
// factor).
//
//	KDEDUP_BENCH_PREFETCH=0 go test -run '^$' -bench 'PrefetchRate' -benchtime 500000x -timeout 60m ./store
//	KDEDUP_BENCH_PREFETCH=1 go test -run '^$' -bench 'PrefetchRate' -benchtime 500000x -timeout 60m ./store
func BenchmarkPrefetchRate(b *testing.B) {
	keys := benchenv.Int(b, "KDEDUP_BENCH_KEYS", 5_000_000)
	partitions := benchenv.Int(b, "KDEDUP_BENCH_PARTITIONS", 4)
	rate := benchenv.Int(b, "KDEDUP_BENCH_RATE", 50_000)
	cacheMiB := benchenv.Int(b, "KDEDUP_BENCH_CACHE_MIB", 0)
	prefetch := benchenv.Int(b, "KDEDUP_BENCH_PREFETCH", 1) != 0
	rounds := strings.Split(benchEnvString("KDEDUP_BENCH_ROUNDS", "new"), ",")
	for _, r := range rounds {
		if r != "new" && r != "dup" {
			b.Fatalf("KDEDUP_BENCH_ROUNDS: round %q, want new or dup", r)
		}
	}
	cache, maxDirty := int64(cacheMiB)<<20, int64(0)
	if total := benchenv.Int(b, "KDEDUP_BENCH_MEMORY", 0); total > 0 {
		cache, maxDirty = applyBudget(b, total, cache)
	} else if cache == 0 {
		cache = 4 << 20
	}

	reg := prometheus.NewRegistry()
	db, err := store.Open(store.Options{Dir: b.TempDir(), CacheBytes: cache, Registerer: reg,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	f := &pollFeeder{db: db, flushed: make([]int64, partitions), next: make([]int64, partitions),
		polls: make([][]*kgo.Record, partitions), lastFlush: time.Now(), maxDirty: maxDirty}
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
	b.Logf("preload of %d keys (%d MiB of pages, cache %d MiB): %v", keys, f.stats().Bytes>>20, cache>>20, time.Since(start).Round(time.Second))
	f.prefetch = prefetch
	fed := uint64(keys)
	name := fmt.Sprintf("keys=%d/rate=%d/cache=%dMiB/prefetch=%t", keys, rate, cache>>20, prefetch)
	for i, round := range rounds {
		if len(rounds) > 1 {
			name = fmt.Sprintf("keys=%d/rate=%d/cache=%dMiB/prefetch=%t/round=%d-%s", keys, rate, cache>>20, prefetch, i+1, round)
		}
		b.Run(name, func(b *testing.B) {
			from := fed
			if round == "dup" {
				if b.N > keys {
					b.Fatalf("a dup round of %d records repeats more keys than the %d held", b.N, keys)
				}
				from = 0
			}
			slice := uint64(max(rate/100, 1))
			if rate == 0 {
				slice = 10_000
			}
			reads0 := benchenv.Gathered(b, reg, "kdedup_store_page_reads_total")
			var stop func()
			if i == len(rounds)-1 {
				stop = profileCPU(b)
			}
			benchenv.ResetPeakRSS()
			anon := benchenv.SampleAnonRSS(100 * time.Millisecond)
			before := sample(b)
			for sent := uint64(0); sent < uint64(b.N); {
				if rate > 0 {
					due := before.wall.Add(time.Duration(float64(sent) / float64(rate) * float64(time.Second)))
					if d := time.Until(due); d > 0 {
						time.Sleep(d)
					}
				}
				n := min(slice, uint64(b.N)-sent)
				if err := f.feed(from+sent, from+sent+n); err != nil {
					b.Fatal(err)
				}
				sent += n
			}
			if err := f.commitAll(); err != nil {
				b.Fatal(err)
			}
			after := sample(b)
			if stop != nil {
				stop()
			}
			b.StopTimer()
			if round == "new" {
				fed += uint64(b.N)
			}
			n := float64(b.N)
			b.ReportMetric(n/after.wall.Sub(before.wall).Seconds(), "rec/s")
			b.ReportMetric(float64(after.cpu-before.cpu)/1e3/n, "cpu-us/rec")
			b.ReportMetric((benchenv.Gathered(b, reg, "kdedup_store_page_reads_total")-reads0)/n, "page-reads/rec")
			b.ReportMetric(float64(after.user-before.user)/n, "user-B/rec")
			if before.diskWrite >= 0 {
				b.ReportMetric(float64(after.diskWrite-before.diskWrite)/n, "disk-B/rec")
			}
			b.ReportMetric(float64(benchenv.PeakRSS())/(1<<20), "peak-RSS-MiB")
			st := f.stats()
			peakAnon := anon()
			b.ReportMetric(float64(peakAnon)/(1<<20), "peak-anon-MiB")
			// Memory outside the pages: the round's peak anonymous memory
			// less the pages the filters hold.
			b.ReportMetric(float64(peakAnon-int64(st.Bytes))/(1<<20), "anon-outside-pages-MiB")
			b.ReportMetric(float64(st.Bytes)/(1<<20), "pages-MiB")
			b.ReportMetric(float64(st.Bytes*8)/float64(st.Items), "page-bits/key")
			b.ReportMetric(float64(st.SubFilters), "sub-filters")
			b.ReportMetric(float64(st.Items)/float64(st.Slots), "load")
		})
	}
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
	// maxDirty bounds the dirty pages of all partitions as the worker
	// does (consumer.Options.MaxDirtyPageBytes); 0: no bound.
	maxDirty int64
}

// stats sums the chains' statistics over the partitions (SubFilters: the
// most of any partition).
func (f *pollFeeder) stats() filter.Stats {
	var sum filter.Stats
	for _, d := range f.parts {
		st := d.Stats()
		sum.Bytes += st.Bytes
		sum.Items += st.Items
		sum.Slots += st.Slots
		sum.SubFilters = max(sum.SubFilters, st.SubFilters)
	}
	return sum
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
			if d.DirtyBytes() >= store.DefaultFlushBytes || d.OverDirtyShare(f.maxDirty) {
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
