package store_test

import (
	"bytes"
	"flag"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/kdedup/kdedup/internal/benchenv"
	"github.com/kdedup/kdedup/store"
)

// scaleStores maps each store BenchmarkScale compares to the benchmark
// that measures one of its points.
var scaleStores = map[string]string{
	"kdedup": "BenchmarkDurableRate",
	"keyset": "BenchmarkKeySetRate",
}

// BenchmarkScale measures the cost per record against the keys held, for
// kdedup (BenchmarkDurableRate) and the exact key set (BenchmarkKeySetRate)
// fed the same records at the same rate. Each point runs in a process of
// its own (this test binary again, running only that point's benchmark),
// so that its peak RSS and /proc/self/io are the point's alone. The points
// are every keys-held value of KDEDUP_BENCH_SCALE_KEYS (comma-separated,
// default "1000000,5000000,20000000") for every store of
// KDEDUP_BENCH_SCALE_STORES (default "kdedup,keyset"), each timed over
// KDEDUP_BENCH_SCALE_RECORDS records (default 1,000,000: 20 s at 50,000
// per second). The other variables (KDEDUP_BENCH_RATE,
// KDEDUP_BENCH_PARTITIONS, KDEDUP_BENCH_CACHE, KDEDUP_BENCH_MEMORY: the
// worker's memory budget applied to kdedup) pass to every point.
// KDEDUP_BENCH_MEMORY_LIMIT runs each point's process in a memory cgroup
// of that many bytes, as a container's limit would hold it
// (benchenv.MemoryCgroup: root and a writable cgroup file system needed),
// and adds cgroup-peak-MiB, the cgroup's peak from the preload on (page
// cache included), and oom-kills; a point killed fails with the count.
//
// Each point prints one result line,
//
//	BenchmarkScale/keys=K/store=S/cache=CMiB  1  V rec/s  V cpu-us/rec ...
//
// with the point's metrics (atRate's: rec/s, cpu-us/rec, user-B/rec,
// disk-B/rec, peak-RSS-MiB, preload-s and the rest) and load-before, the
// machine's 1-minute load average when the point started. cache is the
// page cache for kdedup (KDEDUP_BENCH_CACHE) and the block cache for the
// key set. The point's own result line is logged below it. The benchmark's
// -timeout applies to each point as well. Run it with -benchtime 1x: the
// number of timed records is KDEDUP_BENCH_SCALE_RECORDS, and a larger b.N
// only repeats the point's result line.
//
//	go test -run '^$' -bench 'Scale' -benchtime 1x -timeout 180m ./store | tee docs/bench/scale.txt
func BenchmarkScale(b *testing.B) {
	var keysHeld []int
	for _, f := range strings.Split(benchEnvString("KDEDUP_BENCH_SCALE_KEYS", "1000000,5000000,20000000"), ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			b.Fatalf("KDEDUP_BENCH_SCALE_KEYS: %q is not a positive integer", f)
		}
		keysHeld = append(keysHeld, n)
	}
	var stores []string
	for _, s := range strings.Split(benchEnvString("KDEDUP_BENCH_SCALE_STORES", "kdedup,keyset"), ",") {
		s = strings.TrimSpace(s)
		if _, ok := scaleStores[s]; !ok {
			b.Fatalf("KDEDUP_BENCH_SCALE_STORES: %q, want any of %v", s, slices.Sorted(maps.Keys(scaleStores)))
		}
		stores = append(stores, s)
	}
	records := benchenv.Int(b, "KDEDUP_BENCH_SCALE_RECORDS", 1_000_000)
	cacheMiB := map[string]int{
		"kdedup": benchenv.Int(b, "KDEDUP_BENCH_CACHE", store.DefaultCacheBytes) >> 20,
		"keyset": keySetBlockCacheBytes >> 20,
	}
	timeout := "0"
	if f := flag.Lookup("test.timeout"); f != nil {
		timeout = f.Value.String()
	}
	for _, keys := range keysHeld {
		for _, s := range stores {
			// The body runs again for each b.N the framework tries (only
			// once with -benchtime 1x): the point is measured once.
			var (
				line    string
				metrics map[string]float64
				load    float64
			)
			name := fmt.Sprintf("keys=%d/store=%s/cache=%dMiB", keys, s, cacheMiB[s])
			if mem := benchenv.Int(b, "KDEDUP_BENCH_MEMORY", 0); mem > 0 && s == "kdedup" {
				name = fmt.Sprintf("keys=%d/store=%s/memory=%dMiB", keys, s, mem>>20) // the cache is the budget's share
			}
			b.Run(name, func(b *testing.B) {
				if metrics == nil {
					load = loadAverage()
					var err error
					line, metrics, err = runScalePoint(b, scaleStores[s], keys, records, timeout)
					if err != nil {
						b.Fatalf("keys %d, store %s: %v", keys, s, err)
					}
					b.Log(line)
				}
				for _, unit := range slices.Sorted(maps.Keys(metrics)) {
					b.ReportMetric(metrics[unit], unit)
				}
				if load >= 0 {
					b.ReportMetric(load, "load-before")
				}
				b.ReportMetric(0, "ns/op") // the point's wall time per record is not this process's
			})
		}
	}
}

func benchEnvString(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// runScalePoint runs bench in a new process of this test binary with
// KDEDUP_BENCH_KEYS=keys over records timed records, and returns its
// result line and metrics.
func runScalePoint(b *testing.B, bench string, keys, records int, timeout string) (string, map[string]float64, error) {
	args := []string{
		"-test.run=^$",
		"-test.bench=^" + bench + "$",
		fmt.Sprintf("-test.benchtime=%dx", records),
		"-test.timeout=" + timeout,
	}
	cmd := exec.CommandContext(b.Context(), os.Args[0], args...)
	var cg *benchenv.MemoryCgroup
	if limit := benchenv.Int(b, "KDEDUP_BENCH_MEMORY_LIMIT", 0); limit > 0 {
		var err error
		if cg, err = benchenv.NewMemoryCgroup(fmt.Sprintf("kdedup-scale-%d-%d", os.Getpid(), keys), int64(limit)); err != nil {
			return "", nil, fmt.Errorf("KDEDUP_BENCH_MEMORY_LIMIT=%d: %w", limit, err)
		}
		defer func() {
			if err := cg.Remove(); err != nil {
				b.Error(err)
			}
		}()
		cmd = cg.Command(os.Args[0], args...)
	}
	cmd.Env = append(os.Environ(), "KDEDUP_BENCH_KEYS="+strconv.Itoa(keys))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		if cg != nil {
			kills, kerr := cg.OOMKills()
			err = fmt.Errorf("%w (%d OOM kills in its %d-byte memory cgroup, %v)", err, kills, benchenv.Int(b, "KDEDUP_BENCH_MEMORY_LIMIT", 0), kerr)
		}
		return "", nil, fmt.Errorf("running %s: %w\n%s%s", bench, err, out, stderr.Bytes())
	}
	line, metrics, err := parseScalePoint(out, bench)
	if err != nil {
		return "", nil, fmt.Errorf("%w in the output of %s:\n%s", err, bench, out)
	}
	if cg != nil {
		peak, err := cg.Peak()
		if err != nil {
			return "", nil, err
		}
		kills, err := cg.OOMKills()
		if err != nil {
			return "", nil, err
		}
		metrics["cgroup-peak-MiB"], metrics["oom-kills"] = float64(peak)/(1<<20), float64(kills)
	}
	return line, metrics, nil
}

// scaleResult matches the result line of a point's sub-benchmark (the
// parent prints none) and captures its value-unit pairs.
var scaleResult = regexp.MustCompile(`^(Benchmark\w+/\S+)\s+\d+\s+(.*)$`)

// parseScalePoint returns the last result line of bench in out and its
// metrics by unit, ns/op left out.
func parseScalePoint(out []byte, bench string) (string, map[string]float64, error) {
	var line string
	var metrics map[string]float64
	for l := range strings.Lines(string(out)) {
		l = strings.TrimSpace(l)
		m := scaleResult.FindStringSubmatch(l)
		if m == nil || !strings.HasPrefix(m[1], bench+"/") {
			continue
		}
		fields := strings.Fields(m[2])
		if len(fields)%2 != 0 {
			return "", nil, fmt.Errorf("result line %q: odd number of fields", l)
		}
		got := map[string]float64{}
		for i := 0; i < len(fields); i += 2 {
			v, err := strconv.ParseFloat(fields[i], 64)
			if err != nil {
				return "", nil, fmt.Errorf("result line %q: %w", l, err)
			}
			if fields[i+1] != "ns/op" {
				got[fields[i+1]] = v
			}
		}
		line, metrics = l, got
	}
	if metrics == nil {
		return "", nil, fmt.Errorf("no %s result line", bench)
	}
	return line, metrics, nil
}

// loadAverage returns the 1-minute load average of /proc/loadavg, or -1
// where it is not available.
func loadAverage() float64 {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return -1
	}
	f, _, _ := strings.Cut(string(data), " ")
	v, err := strconv.ParseFloat(f, 64)
	if err != nil {
		return -1
	}
	return v
}

// TestParseScalePoint checks that a point's metrics are read from its
// sub-benchmark's result line, the last one if there are several, and
// that output without one is an error.
func TestParseScalePoint(t *testing.T) {
	out := []byte(`goos: linux
BenchmarkDurableRate/keys=1000/rate=50000-2   	       1	      1200 ns/op	         1.000 rec/s
BenchmarkDurableRate/keys=1000/rate=50000-2   	 1000000	     20000 ns/op	         3.973 batches/s	         1.259 cpu-us/rec	        35.95 peak-RSS-MiB	     49666 rec/s	         6.998 user-B/rec
BenchmarkKeySetRate/keys=1000/rate=50000-2   	 1000000	     20000 ns/op	         9 cpu-us/rec
PASS
`)
	line, got, err := parseScalePoint(out, "BenchmarkDurableRate")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]float64{"batches/s": 3.973, "cpu-us/rec": 1.259, "peak-RSS-MiB": 35.95, "rec/s": 49666, "user-B/rec": 6.998}
	if !maps.Equal(got, want) {
		t.Errorf("metrics %v, want %v", got, want)
	}
	if !strings.HasPrefix(line, "BenchmarkDurableRate/keys=1000/rate=50000-2") || !strings.HasSuffix(line, "user-B/rec") {
		t.Errorf("line %q", line)
	}
	if _, _, err := parseScalePoint([]byte("PASS\n"), "BenchmarkDurableRate"); err == nil {
		t.Error("no result line: no error")
	}
}
