package store_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"expvar"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/debug"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dgraph-io/badger/v4"
	"github.com/dgraph-io/badger/v4/options"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kdedup/kdedup/dedup"
	"github.com/kdedup/kdedup/filter"
	"github.com/kdedup/kdedup/internal/benchenv"
	"github.com/kdedup/kdedup/internal/budget"
	"github.com/kdedup/kdedup/store"
)

// The durable benchmarks run the real deduplicator (dedup.Deduplicator) over a
// Badger store on disk. They are sized by environment variables, because
// their point is a large state:
//
//	KDEDUP_BENCH_KEYS        keys held before measuring (default 10,000,000)
//	KDEDUP_BENCH_PARTITIONS  topic-partitions sharing them (default 16)
//
// Keys are 16 hexadecimal characters of a 64-bit mix of a counter (random
// looking, so that neither store gains from shared prefixes); record i goes
// to partition i mod partitions, as a key-hash partitioner spreads keys.
// Every filter parameter is the default except PageBytes.
//
//	go test -run '^$' -bench 'Durable' -benchtime 5000000x -timeout 60m ./store
//	go test -run '^$' -bench 'KeySetAtRest' -benchtime 10000000x -timeout 60m ./store

// rig feeds records to the deduplicators of several partitions of one store
// and cuts write batches as consumer.Worker does at least once: a partition
// commits when its dirty pages reach FlushBytes, and every FlushInterval of
// work every partition with changes commits.
type rig struct {
	db         *store.DB
	parts      []*dedup.Deduplicator
	next       []int64 // next offset of each partition
	flushed    []int64 // checkpoint offset of each partition's last write batch
	interval   time.Duration
	flushBytes int64
	lastFlush  time.Time
	rec        kgo.Record
	key        [16]byte
	batches    int
	// maxDirty bounds the dirty pages of all partitions as the worker
	// does (consumer.Options.MaxDirtyPageBytes); 0: no bound.
	maxDirty int64
}

// benchWindow is the dedup window of a benchmark's partitions,
// KDEDUP_BENCH_WINDOW (a Go duration; default none). Record i is
// timestamped i milliseconds after benchEpoch, one key a millisecond of
// record time over the partitions, so a window of K milliseconds holds
// the last K keys: KDEDUP_BENCH_WINDOW=1000s with KDEDUP_BENCH_KEYS=1000000
// preloads one window's keys and expires one generation every 125,000
// records after that.
func benchWindow() (time.Duration, error) {
	v := os.Getenv("KDEDUP_BENCH_WINDOW")
	if v == "" {
		return 0, nil
	}
	w, err := time.ParseDuration(v)
	if err != nil || w <= 0 {
		return 0, fmt.Errorf("KDEDUP_BENCH_WINDOW: %q is not a positive duration", v)
	}
	return w, nil
}

// benchEpoch is the timestamp of record 0 of a benchmark (rig.feed).
var benchEpoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixMilli()

// newRig opens a store in dir with a page cache of cacheBytes (0: the
// store's default) and the deduplicators of partitions partitions.
func newRig(dir string, partitions, pageBytes int, cacheBytes int64, interval time.Duration) (*rig, error) {
	flushBytes := int64(store.DefaultFlushBytes)
	if v, err := strconv.ParseInt(os.Getenv("KDEDUP_BENCH_FLUSH_BYTES"), 10, 64); err == nil && v > 0 {
		flushBytes = v
	}
	db, err := store.Open(store.Options{
		Dir:        dir,
		PageBytes:  pageBytes,
		CacheBytes: cacheBytes,
		FlushBytes: flushBytes,
		Logger:     slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		return nil, err
	}
	r := &rig{
		db:         db,
		next:       make([]int64, partitions),
		flushed:    make([]int64, partitions),
		interval:   interval,
		flushBytes: flushBytes,
		lastFlush:  time.Now(),
		rec:        kgo.Record{Topic: "events", Value: []byte("v")},
	}
	window, err := benchWindow()
	if err != nil {
		return nil, errors.Join(err, r.close())
	}
	for p := range partitions {
		d, err := dedup.Open(db, "events", int32(p), dedup.Options{Filter: filter.Params{PageBytes: pageBytes, Window: window}}, nil)
		if err != nil {
			return nil, errors.Join(err, r.close())
		}
		r.parts = append(r.parts, d)
	}
	return r, nil
}

// feed decides records [from, to).
func (r *rig) feed(from, to uint64) error {
	n := uint64(len(r.parts))
	for i := from; i < to; i++ {
		p := i % n
		benchenv.Key(r.key[:], i)
		r.rec.Key = r.key[:]
		r.rec.Partition = int32(p)
		r.rec.Offset = r.next[p]
		r.rec.Timestamp = time.UnixMilli(benchEpoch + int64(i))
		d := r.parts[p]
		if _, err := d.Decide(&r.rec); err != nil {
			return err
		}
		r.next[p]++
		if d.DirtyBytes() >= r.flushBytes || d.OverDirtyShare(r.maxDirty) {
			if err := r.commit(int(p)); err != nil {
				return err
			}
		}
		if i%1024 == 0 && time.Since(r.lastFlush) >= r.interval {
			if err := r.commitAll(); err != nil {
				return err
			}
		}
	}
	return nil
}

func (r *rig) commit(p int) error {
	if r.next[p] == r.flushed[p] {
		return nil
	}
	if err := r.parts[p].Commit(store.Checkpoint{Offset: r.next[p], LeaderEpoch: -1}); err != nil {
		return err
	}
	r.flushed[p] = r.next[p]
	r.batches++
	return nil
}

func (r *rig) batchCount() int { return r.batches }

func (r *rig) commitAll() error {
	r.lastFlush = time.Now()
	for p := range r.parts {
		if err := r.commit(p); err != nil {
			return err
		}
	}
	return nil
}

// stats sums the filter statistics of every partition.
func (r *rig) stats() (items, slots, pageBytes uint64) {
	for _, d := range r.parts {
		s := d.Stats()
		items += s.Items
		slots += s.Slots
		pageBytes += s.Bytes
	}
	return items, slots, pageBytes
}

func (r *rig) close() error {
	for _, d := range r.parts {
		d.Close()
	}
	return r.db.Close()
}

// usage is a sample of what the process has spent so far.
type usage struct {
	cpu                   time.Duration // user + system CPU time of the process
	user, wal, compaction int64         // Badger expvar counters, bytes
	diskWrite             int64         // /proc/self/io write_bytes
	wall                  time.Time
}

func sample(b *testing.B) usage {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return usage{
		cpu:        time.Duration(ru.Utime.Nano() + ru.Stime.Nano()),
		user:       expvarInt("badger_write_bytes_user"),
		wal:        expvarInt("badger_write_bytes_l0"),
		compaction: expvarInt("badger_write_bytes_compaction"),
		diskWrite:  procIO(b, "write_bytes"),
		wall:       time.Now(),
	}
}

// expvarInt reads a Badger expvar counter; a map (per level) is summed.
func expvarInt(name string) int64 {
	switch v := expvar.Get(name).(type) {
	case *expvar.Int:
		return v.Value()
	case *expvar.Map:
		var sum int64
		v.Do(func(kv expvar.KeyValue) {
			if i, ok := kv.Value.(*expvar.Int); ok {
				sum += i.Value()
			}
		})
		return sum
	}
	return 0
}

// procIO returns a field of /proc/self/io (bytes the kernel accounted to
// the process), or -1 where it is not available.
func procIO(b *testing.B, field string) int64 {
	data, err := os.ReadFile("/proc/self/io")
	if err != nil {
		return -1
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		name, value, ok := strings.Cut(sc.Text(), ": ")
		if ok && name == field {
			n, err := strconv.ParseInt(value, 10, 64)
			if err != nil {
				b.Fatalf("/proc/self/io %s: %v", field, err)
			}
			return n
		}
	}
	return -1
}

// diskBytes returns the space allocated to the files under dir (as du
// counts it: Badger preallocates sparse files).
func diskBytes(b *testing.B, dir string) int64 {
	var total int64
	err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			total += st.Blocks * 512
		} else {
			total += fi.Size()
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	return total
}

// atRest is the space a closed Badger directory takes at rest, as du
// counts it.
type atRest struct {
	// closed is the directory as its writer left it.
	closed int64
	// flattened is the directory after Flatten (with one level-0 table
	// allowed, so that level 0 is compacted too) and value-log GC run until
	// it has nothing to rewrite.
	flattened int64
	// latest is a copy holding only the latest version of each key, written
	// by Badger's Stream into a StreamWriter (the backup and restore path):
	// what the state needs once compaction has dropped every overwritten
	// page version.
	latest int64
}

// measureAtRest compacts the closed Badger directory dir in place and copies
// its latest versions into a new directory under tmp.
func measureAtRest(b *testing.B, dir, tmp string, compression options.CompressionType) atRest {
	b.Helper()
	res := atRest{closed: diskBytes(b, dir)}
	opts := func(d string) badger.Options {
		return badger.DefaultOptions(d).WithCompression(compression).WithLogger(nil)
	}
	bdb, err := badger.Open(opts(dir).WithNumLevelZeroTables(1).WithNumLevelZeroTablesStall(2))
	if err != nil {
		b.Fatalf("opening %s: %v", dir, err)
	}
	if err := bdb.Flatten(2); err != nil {
		b.Fatalf("flattening %s: %v", dir, err)
	}
	for {
		err := bdb.RunValueLogGC(0.01)
		if errors.Is(err, badger.ErrNoRewrite) || errors.Is(err, badger.ErrRejected) {
			break
		}
		if err != nil {
			b.Fatalf("value-log GC of %s: %v", dir, err)
		}
	}
	if err := bdb.Close(); err != nil {
		b.Fatalf("closing %s: %v", dir, err)
	}
	res.flattened = diskBytes(b, dir)

	src, err := badger.Open(opts(dir).WithReadOnly(true))
	if err != nil {
		b.Fatalf("opening %s read-only: %v", dir, err)
	}
	defer src.Close()
	copyDir := filepath.Join(tmp, "latest")
	dst, err := badger.Open(opts(copyDir))
	if err != nil {
		b.Fatal(err)
	}
	sw := dst.NewStreamWriter()
	if err := sw.Prepare(); err != nil {
		b.Fatal(err)
	}
	st := src.NewStream()
	st.Send = sw.Write
	if err := st.Orchestrate(context.Background()); err != nil {
		b.Fatalf("streaming %s: %v", dir, err)
	}
	if err := sw.Flush(); err != nil {
		b.Fatal(err)
	}
	if err := dst.Close(); err != nil {
		b.Fatal(err)
	}
	res.latest = diskBytes(b, copyDir)
	return res
}

func (r atRest) report(b *testing.B, keys float64) {
	b.ReportMetric(float64(r.closed*8)/keys, "closed-bits/key")
	b.ReportMetric(float64(r.flattened*8)/keys, "flat-bits/key")
	b.ReportMetric(float64(r.latest*8)/keys, "rest-bits/key")
}

// BenchmarkDurable measures the durable cost per record: each op is one
// record with a key never seen before (so every record inserts a
// fingerprint and dirties a page) decided by dedup.Deduplicator, as fast as
// the deduplicators take them, with write batches cut as the worker cuts
// them at least once (every flush interval of work, or at FlushBytes,
// default 8 MiB, per partition; the end of the run commits the rest). The
// store holds KDEDUP_BENCH_KEYS keys before the timed records start;
// preloading them is not timed. Nothing is produced to Kafka.
//
// Metrics, per record: cpu-us/rec is the process's user+system CPU time
// (getrusage, so it includes Badger's compactions and the Go runtime);
// user-B/rec is what transactions hand Badger (expvar
// badger_write_bytes_user); wal-B/rec what Badger wrote into memtables and
// their write-ahead logs (badger_write_bytes_l0, which Badger counts on
// memtable insertion, not on level-0 flush); compact-B/rec what compactions
// wrote (badger_write_bytes_compaction, all levels); disk-B/rec what the
// kernel accounted as written by the process (/proc/self/io write_bytes,
// which includes the flushes of memtables to level 0 that Badger does not
// count). batches/s are write batches (one per partition) per second.
// load-start and load-end are the filters' load factor before and after the
// timed records. peak-RSS-MiB is the process's peak resident memory (VmHWM)
// since the configuration started preloading: the state of
// KDEDUP_BENCH_KEYS keys, Badger, the page cache (256 MiB by default) and
// the benchmark itself.
//
// Run with a fixed count, e.g. -benchtime 5000000x: the metrics are deltas
// over the run, and short runs cover few flush intervals.
func BenchmarkDurable(b *testing.B) {
	keys := benchenv.Int(b, "KDEDUP_BENCH_KEYS", 10_000_000)
	partitions := benchenv.Int(b, "KDEDUP_BENCH_PARTITIONS", 16)
	configs := []struct {
		pageBytes int
		interval  time.Duration
	}{
		{4096, 100 * time.Millisecond},
		{4096, time.Second},
		{4096, 5 * time.Second},
		{1024, time.Second},
		{16384, time.Second},
	}
	for _, c := range configs {
		b.Run(fmt.Sprintf("page=%d/flush=%s", c.pageBytes, c.interval), func(b *testing.B) {
			r, err := newRig(b.TempDir(), partitions, c.pageBytes, 0, c.interval)
			if err != nil {
				b.Fatal(err)
			}
			defer func() {
				if err := r.close(); err != nil {
					b.Error(err)
				}
			}()
			benchenv.ResetPeakRSS()
			if err := r.feed(0, uint64(keys)); err != nil {
				b.Fatal(err)
			}
			if err := r.commitAll(); err != nil {
				b.Fatal(err)
			}
			items, slots, _ := r.stats()
			loadStart := float64(items) / float64(slots)
			fed := uint64(keys)
			b.Run("records", func(b *testing.B) {
				batches := r.batches
				before := sample(b)
				if err := r.feed(fed, fed+uint64(b.N)); err != nil {
					b.Fatal(err)
				}
				if err := r.commitAll(); err != nil {
					b.Fatal(err)
				}
				after := sample(b)
				b.StopTimer()
				fed += uint64(b.N)
				n := float64(b.N)
				b.ReportMetric(float64(after.cpu-before.cpu)/1e3/n, "cpu-us/rec")
				b.ReportMetric(float64(after.user-before.user)/n, "user-B/rec")
				b.ReportMetric(float64(after.wal-before.wal)/n, "wal-B/rec")
				b.ReportMetric(float64(after.compaction-before.compaction)/n, "compact-B/rec")
				if before.diskWrite >= 0 {
					b.ReportMetric(float64(after.diskWrite-before.diskWrite)/n, "disk-B/rec")
				}
				b.ReportMetric(float64(r.batches-batches)/after.wall.Sub(before.wall).Seconds(), "batches/s")
				items, slots, _ := r.stats()
				b.ReportMetric(loadStart, "load-start")
				b.ReportMetric(float64(items)/float64(slots), "load-end")
				b.ReportMetric(float64(benchenv.PeakRSS())/(1<<20), "peak-RSS-MiB")
			})
		})
	}
}

// BenchmarkDurableRate is BenchmarkDurable at a fixed record rate instead
// of flat out, with the default configuration (4 KiB pages, write batches
// every second or at 8 MiB per partition): the records arrive at
// KDEDUP_BENCH_RATE per second in total (default 50,000), in slices of a
// hundredth of a second, so that a flush interval holds a realistic number
// of records for the pages of KDEDUP_BENCH_KEYS keys held (default
// 1,000,000, over KDEDUP_BENCH_PARTITIONS partitions, default 4), with a
// page cache of KDEDUP_BENCH_CACHE bytes (default store.DefaultCacheBytes,
// 256 MiB; 15728640 puts the 60 MiB of pages of 20M keys at 4 times the
// cache), or the worker's memory budget of KDEDUP_BENCH_MEMORY bytes
// (benchBudget), and write batches cut at KDEDUP_BENCH_FLUSH_BYTES of
// dirty pages (default store.DefaultFlushBytes; Badger's memtable follows
// it). b.N is the number of timed records: -benchtime 1000000x is 20 s
// at 50,000/s.
// The metrics are atRate's: BenchmarkDurable's, plus rec/s, the rate
// achieved (below KDEDUP_BENCH_RATE when the process cannot keep up),
// preload-s, the time the preload took (flat out, untimed by the
// benchmark), page-bits/key and pages-MiB, the chains' pages after the
// timed records, and peak-RSS-MiB, the peak resident memory (VmHWM) of the
// timed records alone (preload-peak-RSS-MiB, the preload's), and
// peak-anon-MiB, the most anonymous memory (RssAnon, sampled every 100 ms)
// over the timed records: VmHWM also counts the pages of files the process
// maps, such as Badger's value log, which the kernel reclaims first.
// KDEDUP_BENCH_CPUPROFILE=file profiles the timed records alone.
// KDEDUP_BENCH_WINDOW sets a dedup window (benchWindow: record i is
// timestamped i ms, so a window of K ms holds K keys).
//
//	KDEDUP_BENCH_KEYS=1000000 go test -run '^$' -bench 'DurableRate' -benchtime 1000000x -timeout 60m ./store
func BenchmarkDurableRate(b *testing.B) {
	keys := benchenv.Int(b, "KDEDUP_BENCH_KEYS", 1_000_000)
	partitions := benchenv.Int(b, "KDEDUP_BENCH_PARTITIONS", 4)
	rate := benchenv.Int(b, "KDEDUP_BENCH_RATE", 50_000)
	cache, maxDirty := benchBudget(b)
	dir := b.TempDir()
	r, err := newRig(dir, partitions, 4096, cache, time.Second)
	if err != nil {
		b.Fatal(err)
	}
	r.maxDirty = maxDirty
	closed := false
	defer func() {
		if closed {
			return
		}
		if err := r.close(); err != nil {
			b.Error(err)
		}
	}()
	benchenv.ResetPeakRSS()
	start := time.Now()
	if err := r.feed(0, uint64(keys)); err != nil {
		b.Fatal(err)
	}
	if err := r.commitAll(); err != nil {
		b.Fatal(err)
	}
	preload := time.Since(start)
	fed := uint64(keys)
	b.Run(fmt.Sprintf("keys=%d/rate=%d", keys, rate), func(b *testing.B) {
		fed = atRate(b, r, fed, rate, preload)
	})
	if os.Getenv("KDEDUP_BENCH_AT_REST") == "" {
		return
	}
	// KDEDUP_BENCH_AT_REST=1 also measures the state at rest (untimed):
	// rest-bits/key as the run left it (deltas included), then
	// consolidated-bits/key after PartitionState.Consolidate, both after
	// Badger's compaction (measureAtRest's latest copy), beside
	// page-bits/key, the page bytes the filters hold; logged.
	items, _, pageBytes := r.stats()
	closed = true
	if err := r.close(); err != nil {
		b.Fatal(err)
	}
	keys64 := float64(items)
	rest := float64(measureAtRest(b, dir, b.TempDir(), options.None).latest*8) / keys64
	db, err := store.Open(store.Options{Dir: dir, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	for p := range partitions {
		sp, err := db.Partition("events", int32(p))
		if err != nil {
			b.Fatal(err)
		}
		if err := sp.Consolidate(); err != nil {
			b.Fatal(err)
		}
		sp.Close()
	}
	if err := db.Close(); err != nil {
		b.Fatal(err)
	}
	consolidated := float64(measureAtRest(b, dir, b.TempDir(), options.None).latest*8) / keys64
	// A parent benchmark prints no metrics of its own, hence the log line.
	b.Logf("at rest: %.0f keys, page-bits/key %.2f, rest-bits/key %.2f, consolidated-bits/key %.2f",
		keys64, float64(pageBytes*8)/keys64, rest, consolidated)
}

// benchBudget is the page cache and the dirty-page bound of a benchmark
// store: with KDEDUP_BENCH_MEMORY set, the worker's memory budget of that
// many bytes is applied as kdedup run applies it (internal/budget: the
// cache's share unless KDEDUP_BENCH_CACHE overrides it, the dirty-page
// bound, and Go's soft memory limit set for this process), its parts for
// Kafka (fetch buffers, a decompressed batch) reserved but unused here;
// without it, a cache of KDEDUP_BENCH_CACHE (default
// store.DefaultCacheBytes) and no dirty-page bound beyond FlushBytes per
// partition.
func benchBudget(b *testing.B) (cache, maxDirty int64) {
	total := benchenv.Int(b, "KDEDUP_BENCH_MEMORY", 0)
	override := int64(benchenv.Int(b, "KDEDUP_BENCH_CACHE", 0))
	if total == 0 {
		if override == 0 {
			override = store.DefaultCacheBytes
		}
		return override, 0
	}
	return applyBudget(b, total, override)
}

// applyBudget applies the worker's memory budget of total bytes as kdedup
// run applies it (benchBudget), with a page cache of override bytes
// instead of the budget's share when override > 0, and returns the page
// cache and the dirty-page bound.
func applyBudget(b *testing.B, total int, override int64) (cache, maxDirty int64) {
	s, err := budget.Plan(budget.Inputs{TotalBytes: int64(total), StoreBytes: store.Options{PageBytes: 4096}.MemoryBytes(),
		DecompressBytes: 64 << 20, PageBytes: 4096, CacheBytes: override})
	if err != nil {
		b.Fatal(err)
	}
	debug.SetMemoryLimit(s.GoLimit)
	b.Logf("memory budget %d MiB: page cache %d MiB, dirty pages %d MiB, Go memory limit %d MiB", s.Total>>20, s.Cache>>20, s.Dirty>>20, s.GoLimit>>20)
	return s.Cache, s.MaxDirtyPageBytes()
}

// feeder is a store fed records as the worker feeds it: rig (kdedup) or
// keySet (the exact key set).
type feeder interface {
	// feed decides records [from, to), committing as the store's write
	// batches are due.
	feed(from, to uint64) error
	// commitAll commits every change fed so far.
	commitAll() error
	// batchCount is the number of write batches committed so far.
	batchCount() int
}

// atRate feeds b.N records from record fed on at rate records per second,
// in slices of a hundredth of a second, commits them, and reports the cost
// per record (see BenchmarkDurable for the metrics) with rec/s, the rate
// achieved, and preload-s, the preload's duration in seconds. It returns
// the next record to feed. With KDEDUP_BENCH_CPUPROFILE set, it writes a
// CPU profile of the timed records alone (not the preload) to that file.
func atRate(b *testing.B, f feeder, fed uint64, rate int, preload time.Duration) uint64 {
	slice := max(uint64(rate)/100, 1)
	batches := f.batchCount()
	defer profileCPU(b)()
	preloadPeak := benchenv.PeakRSS()
	benchenv.ResetPeakRSS() // the peak of the timed records alone
	anon := benchenv.SampleAnonRSS(100 * time.Millisecond)
	before := sample(b)
	for sent := uint64(0); sent < uint64(b.N); {
		due := before.wall.Add(time.Duration(float64(sent) / float64(rate) * float64(time.Second)))
		if d := time.Until(due); d > 0 {
			time.Sleep(d)
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
	after := sample(b)
	b.StopTimer()
	n := float64(b.N)
	b.ReportMetric(n/after.wall.Sub(before.wall).Seconds(), "rec/s")
	b.ReportMetric(float64(after.cpu-before.cpu)/1e3/n, "cpu-us/rec")
	b.ReportMetric(float64(after.user-before.user)/n, "user-B/rec")
	b.ReportMetric(float64(after.compaction-before.compaction)/n, "compact-B/rec")
	if before.diskWrite >= 0 {
		b.ReportMetric(float64(after.diskWrite-before.diskWrite)/n, "disk-B/rec")
	}
	b.ReportMetric(float64(f.batchCount()-batches)/after.wall.Sub(before.wall).Seconds(), "batches/s")
	b.ReportMetric(float64(benchenv.PeakRSS())/(1<<20), "peak-RSS-MiB")
	b.ReportMetric(float64(preloadPeak)/(1<<20), "preload-peak-RSS-MiB")
	b.ReportMetric(float64(anon())/(1<<20), "peak-anon-MiB")
	if st, ok := f.(interface {
		stats() (items, slots, pageBytes uint64)
	}); ok {
		if items, _, pageBytes := st.stats(); items > 0 {
			b.ReportMetric(float64(pageBytes*8)/float64(items), "page-bits/key")
			b.ReportMetric(float64(pageBytes)/(1<<20), "pages-MiB")
		}
	}
	b.ReportMetric(preload.Seconds(), "preload-s")
	return fed + uint64(b.N)
}

// BenchmarkKeySetAtRest compares the space two stores need for the same
// b.N keys (run it with -benchtime 10000000x for ten million):
//
//   - filter: the keys decided by dedup.Deduplicator over KDEDUP_BENCH_PARTITIONS
//     partitions with the default parameters (write batches every second
//     or 8 MiB), then the store closed.
//   - exact-badger: one Badger key per dedup key with an empty value,
//     Badger's default options (Snappy compression), written with a
//     WriteBatch, then closed.
//
// Both directories are then measured as measureAtRest does. Metrics, in
// bits per key held (directory size as du counts it): closed-bits/key as
// the writer left it; flat-bits/key after Flatten and value-log GC;
// rest-bits/key for a copy holding only the latest version of each key
// (the state once compaction has dropped overwritten pages). For the filter
// also mem-bits/key, the chains' page bytes per key (what the page cache
// holds when every page is cached), f/load, the fingerprint bits of every
// slot divided by the keys held (sum over sub-filters of slots times
// fingerprint width: the space a cuckoo filter needs per key at that load,
// with nothing else), and load, the load factor. ns/op is the time to
// write one key, compaction not included.
func BenchmarkKeySetAtRest(b *testing.B) {
	partitions := benchenv.Int(b, "KDEDUP_BENCH_PARTITIONS", 16)
	b.Run("filter", func(b *testing.B) {
		dir := b.TempDir()
		r, err := newRig(dir, partitions, 0, 0, time.Second)
		if err != nil {
			b.Fatal(err)
		}
		if err := r.feed(0, uint64(b.N)); err != nil {
			b.Fatal(err)
		}
		if err := r.commitAll(); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		items, slots, pageBytes := r.stats()
		for _, d := range r.parts {
			d.Close()
		}
		r.parts = nil
		// The fingerprint bits of every slot, from the committed chain
		// metadata: sub-filters may differ in width.
		var fBits float64
		for p := range partitions {
			sp, err := r.db.Partition("events", int32(p))
			if err != nil {
				b.Fatal(err)
			}
			raw := sp.Meta()
			// At rest means compacted: the deltas folded into their pages,
			// then Badger's compaction (measureAtRest).
			if err := sp.Consolidate(); err != nil {
				b.Fatal(err)
			}
			sp.Close()
			if raw == nil {
				continue // no record reached this partition
			}
			meta, err := filter.DecodeMeta(raw)
			if err != nil {
				b.Fatal(err)
			}
			for _, sf := range meta.SubFilters {
				fBits += float64(sf.Slots(meta.Params.BucketSize)) * float64(sf.FingerprintBits)
			}
		}
		if err := r.close(); err != nil {
			b.Fatal(err)
		}
		rest := measureAtRest(b, dir, b.TempDir(), options.None)
		rest.report(b, float64(items))
		b.ReportMetric(float64(pageBytes*8)/float64(items), "mem-bits/key")
		b.ReportMetric(fBits/float64(items), "f/load")
		b.ReportMetric(float64(items)/float64(slots), "load")
	})
	b.Run("exact-badger", func(b *testing.B) {
		dir := b.TempDir()
		bdb, err := badger.Open(badger.DefaultOptions(dir).WithLogger(nil))
		if err != nil {
			b.Fatal(err)
		}
		wb := bdb.NewWriteBatch()
		var k [16]byte
		for i := range uint64(b.N) {
			benchenv.Key(k[:], i)
			if err := wb.Set(bytes.Clone(k[:]), nil); err != nil {
				b.Fatal(err)
			}
		}
		if err := wb.Flush(); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		if err := bdb.Close(); err != nil {
			b.Fatal(err)
		}
		rest := measureAtRest(b, dir, b.TempDir(), options.Snappy)
		rest.report(b, float64(b.N))
	})
}

// profileCPU starts a CPU profile written to the file KDEDUP_BENCH_CPUPROFILE
// names, if set, and returns the function that stops and writes it.
func profileCPU(b *testing.B) (stop func()) {
	name := os.Getenv("KDEDUP_BENCH_CPUPROFILE")
	if name == "" {
		return func() {}
	}
	prof, err := os.Create(name)
	if err != nil {
		b.Fatalf("creating the CPU profile: %v", err)
	}
	if err := pprof.StartCPUProfile(prof); err != nil {
		b.Fatalf("starting the CPU profile: %v", err)
	}
	return func() {
		pprof.StopCPUProfile()
		if err := prof.Close(); err != nil {
			b.Errorf("writing the CPU profile: %v", err)
		}
	}
}
