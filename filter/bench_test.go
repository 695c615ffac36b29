package filter

import (
	"encoding/binary"
	"fmt"
	"os"
	"strconv"
	"testing"
)

// benchChain returns an in-memory chain of 2^20 slots filled to 90% load
// with keys "k0".."kN" and the number of keys inserted.
func benchChain(b *testing.B) (*Chain, int) {
	c, _ := newMem(b, Params{Capacity: 1 << 20})
	n := (1 << 20) * 9 / 10
	for i := range n {
		if err := c.Add(key("k", i)); err != nil {
			b.Fatal(err)
		}
	}
	return c, n
}

// BenchmarkChainContains measures lookups at 90% load, half of them hits.
func BenchmarkChainContains(b *testing.B) {
	c, n := benchChain(b)
	keys := make([][]byte, 1<<16)
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
}

// BenchmarkChainInsert measures check-and-insert of new keys into a chain
// at 90% load (each insert is followed by a delete so the load stays put).
func BenchmarkChainInsert(b *testing.B) {
	c, _ := benchChain(b)
	keys := make([][]byte, 1<<16)
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
	b.ReportMetric(float64(c.Stats().SubFilters), "sub-filters")
}

// BenchmarkLoadAtFirstExpansion reports the load factor at the first failed
// insert of a sub-filter with default parameters (18-bit fingerprints from
// the default target rate, b=4, 4 KiB pages) at 2^20 and 2^24 keys of
// capacity, as the load-factor metric.
func BenchmarkLoadAtFirstExpansion(b *testing.B) {
	for _, capacity := range []uint64{1 << 20, 1 << 24} {
		b.Run(fmt.Sprintf("capacity=%d", capacity), func(b *testing.B) {
			var load float64
			for b.Loop() {
				c, _ := newMem(b, Params{Capacity: capacity})
				load = fillUntilExpansion(b, c)
			}
			b.ReportMetric(load, "load")
		})
	}
}

// BenchmarkChainGrowth grows one chain with the default Params (capacity
// 1,000,000, 18-bit first fingerprints, b = 4, 4 KiB pages) to
// KDEDUP_BENCH_GROWTH_KEYS distinct keys (default 25,000,000, the keys a
// partition of a 100M-key worker on 4 partitions holds) and reports, for
// each sub-filter k the chain adds, the chain's load factor just before
// (load-before-sub-k) and its bits of pages per key just after
// (bits/key-after-sub-k), the saw-tooth's peaks; then bits/key and the
// chain's load at the end. Not timed: b.N only repeats it.
//
//	go test -run '^$' -bench ChainGrowth -benchtime 1x ./filter
func BenchmarkChainGrowth(b *testing.B) {
	n := 25_000_000
	if v, err := strconv.Atoi(os.Getenv("KDEDUP_BENCH_GROWTH_KEYS")); err == nil && v > 0 {
		n = v
	}
	for b.Loop() {
		c, _ := newMem(b, Params{})
		var k [8]byte
		for i := 1; i <= n; i++ {
			binary.LittleEndian.PutUint64(k[:], uint64(i))
			subs, load := len(c.subs), c.Stats().LoadFactor
			if _, err := c.Insert(k[:]); err != nil {
				b.Fatal(err)
			}
			if len(c.subs) != subs {
				s := c.Stats()
				b.ReportMetric(load, fmt.Sprintf("load-before-sub-%d", s.SubFilters))
				b.ReportMetric(float64(s.Bytes*8)/float64(i), fmt.Sprintf("bits/key-after-sub-%d", s.SubFilters))
			}
		}
		s := c.Stats()
		b.ReportMetric(float64(s.Bytes*8)/float64(n), "bits/key")
		b.ReportMetric(s.LoadFactor, "load")
		b.ReportMetric(0, "ns/op")
	}
}
