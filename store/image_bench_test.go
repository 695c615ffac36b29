package store

import (
	"math/rand/v2"
	"testing"

	"github.com/kdedup/kdedup/filter"
)

// BenchmarkExport reads a partition of 64 MiB of 4 KiB pages (16,384
// pages, each written whole once and then changed by a few deltas, as a
// worker leaves them) with Export: the Badger side of a snapshot. MB/s is
// of state.
//
//	go test -run '^$' -bench Export -benchtime 5x ./store
func BenchmarkExport(b *testing.B) {
	const pb, pages = 4096, 16384
	db := openT(b, Options{Dir: b.TempDir(), PageBytes: pb})
	p, err := db.Partition("events", 0)
	if err != nil {
		b.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(3, 4))
	for i := range pages {
		id := filter.PageID{SubFilter: uint32(i / 4096), Page: uint32(i % 4096)}
		page := mustPage(b, p, id)
		for j := range page {
			page[j] = byte(rng.Uint32())
		}
		p.MarkDirty(id, page)
		if i%512 == 511 {
			if err := p.Commit([]byte("m"), Checkpoint{Offset: int64(i)}); err != nil {
				b.Fatal(err)
			}
		}
	}
	for round := range 3 { // deltas on every page
		for i := range pages {
			id := filter.PageID{SubFilter: uint32(i / 4096), Page: uint32(i % 4096)}
			page := mustPage(b, p, id)
			off := rng.IntN(pb - 8)
			page[off] ^= 1
			p.MarkChanged(id, page, off, 1)
			if i%2048 == 2047 {
				if err := p.Commit([]byte("m"), Checkpoint{Offset: int64(pages*(round+1) + i)}); err != nil {
					b.Fatal(err)
				}
			}
		}
	}
	b.SetBytes(pages * pb)
	b.ResetTimer()
	for range b.N {
		n := 0
		if _, err := db.Export(p.TopicPartition(), func(Image) error { return nil }, func(filter.PageID, []byte) error { n++; return nil }); err != nil {
			b.Fatal(err)
		}
		if n != pages {
			b.Fatalf("%d pages exported, want %d", n, pages)
		}
	}
}
