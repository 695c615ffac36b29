package store

import (
	"fmt"
	"testing"
)

// BenchmarkCommit measures one write batch of n dirty 4 KiB pages on disk.
// Each iteration dirties the same n pages again (a page read from the cache,
// modified in place, marked dirty) and commits; the dirtying is excluded
// from the timing.
func BenchmarkCommit(b *testing.B) {
	for _, n := range []int{1, 64, 512, 2048} {
		b.Run(fmt.Sprintf("pages=%d", n), func(b *testing.B) {
			db := openT(b, Options{Dir: b.TempDir(), CacheBytes: int64(n+1) * DefaultPageBytes})
			p := partitionT(b, db, "orders", 0)
			ids := universe(1, uint32(n))
			meta := make([]byte, 256)
			b.SetBytes(int64(n * DefaultPageBytes))
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				b.StopTimer()
				for _, id := range ids {
					page, err := p.Page(id)
					if err != nil {
						b.Fatal(err)
					}
					page[0], page[len(page)-1] = byte(i), byte(i)
					p.MarkDirty(id, page)
				}
				b.StartTimer()
				if err := p.Commit(meta, Checkpoint{Offset: int64(i)}); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(n*DefaultPageBytes), "page-bytes/op")
		})
	}
}

// BenchmarkPageCached measures Page of a clean page held by the cache: the
// per-operation path of the filter.
func BenchmarkPageCached(b *testing.B) {
	db := openT(b, Options{InMemory: true})
	p := partitionT(b, db, "orders", 0)
	ids := universe(1, 1024)
	for _, id := range ids {
		if _, err := p.Page(id); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	for i := range b.N {
		if _, err := p.Page(ids[i%len(ids)]); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkPageRead measures Page of a committed page that is not cached: a
// Badger point read, the cost a cache miss adds.
func BenchmarkPageRead(b *testing.B) {
	db := openT(b, Options{Dir: b.TempDir(), CacheBytes: DefaultPageBytes})
	p := partitionT(b, db, "orders", 0)
	ids := universe(2, 1024) // FlushBytes: the most one write batch holds
	for _, id := range ids {
		page, err := p.Page(id)
		if err != nil {
			b.Fatal(err)
		}
		page[0] = 1
		p.MarkDirty(id, page)
	}
	if err := p.Commit(nil, Checkpoint{}); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := range b.N {
		// Stride through the pages so that the one-page cache never hits.
		if _, err := p.Page(ids[(i*7919)%len(ids)]); err != nil {
			b.Fatal(err)
		}
	}
}
