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

// BenchmarkPageReadTables measures Page of a committed page that is not
// cached, stored in Badger's tables rather than its memtable (128 MiB of
// pages written whole in 16 write batches) with one logged change: a
// point lookup of its base in the value log and its patch applied.
func BenchmarkPageReadTables(b *testing.B) {
	db := openT(b, Options{Dir: b.TempDir(), CacheBytes: DefaultPageBytes})
	p := partitionT(b, db, "orders", 0)
	ids := universe(16, 2048) // 2,048 pages: FlushBytes, the most one write batch holds
	for round := range 2 {
		for i, id := range ids {
			page, err := p.Page(id)
			if err != nil {
				b.Fatal(err)
			}
			page[round] = 1
			if round == 0 {
				p.MarkDirty(id, page)
			} else {
				p.MarkChanged(id, page, round, 1)
			}
			if (i+1)%2048 == 0 {
				if err := p.Commit(nil, Checkpoint{Offset: int64(i)}); err != nil {
					b.Fatal(err)
				}
			}
		}
	}
	if p.PendingPages() != len(ids) {
		b.Fatalf("%d pages pending, want %d", p.PendingPages(), len(ids))
	}
	misses0 := p.misses
	b.ResetTimer()
	for i := range b.N {
		// Stride through the pages so that the one-page cache never hits.
		if _, err := p.Page(ids[(i*7919)%len(ids)]); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	if misses := p.misses - misses0; misses < uint64(b.N)/2 {
		b.Fatalf("%d of %d pages read from Badger", misses, b.N)
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
