package filter

import (
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// benchChain returns an in-memory chain of 2^20 slots of capacity holding
// keys "k0".."kN" and the number of keys inserted: 90% of its capacity, or
// KDEDUP_BENCH_CHAIN_KEYS keys (the chain grows in place to them: 25M keys
// is one sub-filter of depth 4 to 5, a partition of a 100M-key worker on
// 4 partitions).
func benchChain(b *testing.B) (*Chain, int) {
	c, _ := newMem(b, Params{Capacity: 1 << 20})
	n := (1 << 20) * 9 / 10
	if v := os.Getenv("KDEDUP_BENCH_CHAIN_KEYS"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 1 {
			b.Fatalf("KDEDUP_BENCH_CHAIN_KEYS=%q: want a key count", v)
		}
	}
	for i := range n {
		if err := c.Add(key("k", i)); err != nil {
			b.Fatal(err)
		}
	}
	return c, n
}

// reportChain reports c's sub-filters, splits and bits a key (over keys),
// after the timed loop (b.ResetTimer and b.Loop drop metrics reported
// before it).
func reportChain(b *testing.B, c *Chain, keys int) {
	st := c.Stats()
	b.ReportMetric(float64(st.SubFilters), "sub-filters")
	b.ReportMetric(float64(st.Splits), "splits")
	b.ReportMetric(float64(st.Bytes)*8/float64(keys), "bits/key")
}

// benchRing is how many keys the lookups of a benchmark cycle through:
// enough that at 25M keys their buckets (64 MiB of cache lines) are not
// all in the CPU's caches.
const benchRing = 1 << 20

// BenchmarkChainContains measures lookups at 90% load (or at
// KDEDUP_BENCH_CHAIN_KEYS keys), half of them hits.
func BenchmarkChainContains(b *testing.B) {
	c, n := benchChain(b)
	keys := make([][]byte, benchRing)
	for i := range keys {
		if i%2 == 0 {
			keys[i] = key("k", i*7%n)
		} else {
			keys[i] = key("absent", i)
		}
	}
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		if _, err := c.Contains(keys[i&(len(keys)-1)]); err != nil {
			b.Fatal(err)
		}
	}
	reportChain(b, c, n)
}

// BenchmarkChainInsert measures check-and-insert of new keys into a chain
// at 90% load (each insert is followed by a delete so the load stays put).
func BenchmarkChainInsert(b *testing.B) {
	c, n := benchChain(b)
	keys := make([][]byte, benchRing)
	for i := range keys {
		keys[i] = key("new", i)
	}
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		k := keys[i&(len(keys)-1)]
		if _, err := c.Insert(k); err != nil {
			b.Fatal(err)
		}
		if _, err := c.Delete(k); err != nil {
			b.Fatal(err)
		}
	}
	reportChain(b, c, n)
}

// BenchmarkChainInsertNew measures check-and-insert of b.N keys never
// inserted into the chain of benchChain, which grows (in place) as it
// takes them: the insert of a dedup worker's new key.
func BenchmarkChainInsertNew(b *testing.B) {
	c, n := benchChain(b)
	keys := make([][]byte, b.N)
	for i := range keys {
		keys[i] = key("new", i)
	}
	b.ResetTimer()
	for i := range b.N {
		if _, err := c.Insert(keys[i]); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	reportChain(b, c, n+b.N)
}

// BenchmarkLoadAtFirstSplit reports the load factor of a sub-filter with
// default parameters (21-bit slots from the default target rate, b=4,
// 4 KiB pages) when its first page splits, at 2^20 and 2^24 keys of
// capacity, as the load-factor metric.
func BenchmarkLoadAtFirstSplit(b *testing.B) {
	for _, capacity := range []uint64{1 << 20, 1 << 24} {
		b.Run(fmt.Sprintf("capacity=%d", capacity), func(b *testing.B) {
			var load float64
			for b.Loop() {
				c, _ := newMem(b, Params{Capacity: capacity})
				load = fillUntilSplit(b, c)
			}
			b.ReportMetric(load, "load")
		})
	}
}

// BenchmarkChainGrowth grows one chain with the default Params (capacity
// 1,000,000, 21-bit slots, b = 4, 4 KiB pages) to KDEDUP_BENCH_GROWTH_KEYS
// distinct keys (default 25,000,000, the keys a partition of a 100M-key
// worker on 4 partitions holds) and reports the bits of pages per key at
// the end (bits/key), their maximum and mean over 200 points spaced
// evenly on a log scale from 2M keys (n/10 below 20M keys) to the end (bits/key-max,
// bits/key-mean), the load, the sub-filters and the most pages a lookup
// reads (pages/lookup: the sub-filters). With KDEDUP_BENCH_DATA set it
// writes the points as CSV (keys, bits/key, load, sub-filters, estimated
// FPR) for internal/benchplot. Not timed: b.N only repeats it.
//
//	go test -run '^$' -bench ChainGrowth -benchtime 1x ./filter
func BenchmarkChainGrowth(b *testing.B) {
	n := 25_000_000
	if v, err := strconv.Atoi(os.Getenv("KDEDUP_BENCH_GROWTH_KEYS")); err == nil && v > 0 {
		n = v
	}
	from := 2_000_000 // where the goal's curve starts
	if n < 20_000_000 {
		from = n / 10
	}
	const points = 200
	for b.Loop() {
		c, _ := newMem(b, Params{})
		var k [8]byte
		var csv strings.Builder
		csv.WriteString("keys,bits_per_key,load,sub_filters,estimated_fpr\n")
		most, sum, taken := 0.0, 0.0, 0
		next := float64(from)
		for i := 1; i <= n; i++ {
			binary.LittleEndian.PutUint64(k[:], uint64(i))
			if _, err := c.Insert(k[:]); err != nil {
				b.Fatal(err)
			}
			if float64(i) >= next {
				s := c.Stats()
				bits := float64(s.Bytes*8) / float64(i)
				most, sum, taken = max(most, bits), sum+bits, taken+1
				fmt.Fprintf(&csv, "%d,%.3f,%.4f,%d,%.4g\n", i, bits, s.LoadFactor, s.SubFilters, s.EstimatedFPR)
				next *= math.Pow(float64(n)/float64(from), 1.0/points)
			}
		}
		s := c.Stats()
		b.ReportMetric(float64(s.Bytes*8)/float64(n), "bits/key")
		b.ReportMetric(most, "bits/key-max")
		b.ReportMetric(sum/float64(max(taken, 1)), "bits/key-mean")
		b.ReportMetric(s.LoadFactor, "load")
		b.ReportMetric(float64(s.SubFilters), "pages/lookup")
		b.ReportMetric(s.EstimatedFPR, "estimated-fpr")
		b.ReportMetric(0, "ns/op")
		if out := os.Getenv("KDEDUP_BENCH_DATA"); out != "" {
			if err := os.WriteFile(out, []byte(csv.String()), 0o644); err != nil {
				b.Fatal(err)
			}
		}
	}
}

// BenchmarkWindowInsert measures the check-and-insert of a stream of new
// keys, one a millisecond of record time, through a chain whose window
// holds KDEDUP_BENCH_WINDOW_KEYS of them (default 1,000,000: a window of
// that many milliseconds, 8 generations), against the same stream through
// a chain without a window, which keeps every key. Each chain first takes
// that many keys, untimed (the window's is then full), then b.N more, one
// InsertAt each (the window expires a generation every 1/8 of its keys
// and sweeps its pages), and reports ns/op, the sub-filters, the pages'
// bits a key held (live keys with the window), the pages the sweep read
// per key and, with the window, plain-bits/key: the bits a key of a chain
// without a window holding as many keys as the window holds live (the
// same state without a window). Run it with -benchtime of several windows:
//
//	KDEDUP_BENCH_WINDOW_KEYS=1000000 go test -run '^$' -bench WindowInsert -benchtime 6000000x ./filter
func BenchmarkWindowInsert(b *testing.B) {
	n := 1_000_000
	if v := os.Getenv("KDEDUP_BENCH_WINDOW_KEYS"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 8 {
			b.Fatalf("KDEDUP_BENCH_WINDOW_KEYS=%q: want a key count of 8 or more", v)
		}
	}
	for _, window := range []time.Duration{0, time.Duration(n) * time.Millisecond} {
		name := "window=none"
		if window != 0 {
			name = fmt.Sprintf("window=%dkeys", n)
		}
		b.Run(name, func(b *testing.B) {
			c, _ := newMem(b, Params{Window: window})
			var k [8]byte
			insert := func(i int) {
				binary.LittleEndian.PutUint64(k[:], uint64(i))
				if _, err := c.InsertAt(k[:], int64(i)); err != nil {
					b.Fatal(err)
				}
			}
			for i := range n {
				insert(i)
			}
			swept := c.Stats().SweptPages
			b.ResetTimer()
			for i := range b.N {
				insert(n + i)
			}
			b.StopTimer()
			st := c.Stats()
			b.ReportMetric(float64(st.SubFilters), "sub-filters")
			b.ReportMetric(float64(st.Bytes)*8/float64(st.Items), "bits/key")
			b.ReportMetric(float64(st.SweptPages-swept)/float64(b.N), "swept-pages/key")
			if window == 0 {
				return
			}
			// The same state without a window: a chain holding as many
			// keys as the window holds live.
			plain, _ := newMem(b, Params{})
			for i := range st.Items {
				binary.LittleEndian.PutUint64(k[:], i)
				if _, err := plain.Insert(k[:]); err != nil {
					b.Fatal(err)
				}
			}
			ps := plain.Stats()
			b.ReportMetric(float64(ps.Bytes)*8/float64(ps.Items), "plain-bits/key")
		})
	}
}
