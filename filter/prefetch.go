package filter

import (
	"fmt"
	"unsafe"
)

// Prefetcher is an optional extension of Pager for a Pager whose Page may
// wait on storage: Prefetch loads the pages ids into memory ahead of the
// operations that will ask for them, so that those reads are issued
// together (concurrently, in store.PartitionState) instead of one at a time as
// the chain asks for each. Prefetch is a hint: it never changes what Page
// returns, may load fewer pages than asked (a bound on memory), and may be
// given a page more than once or one never written. Errors are those Page
// would return for the same pages. A caller finds it by a type assertion
// on the Pager; an Overlay passes it on to its base Pager.
//
// This is the batched point lookup (RocksDB's MultiGet, which Kvrocks
// issues for its commands over many keys) applied to the pages a batch of
// keys will read.
type Prefetcher interface {
	Prefetch(ids []PageID) error
}

// PagesOf appends to dst the pages that Contains, Insert, Count or Delete
// of key read first and returns the extended slice: one page per
// sub-filter of the chain as it is now, oldest first, since both candidate
// buckets of a key lie on one page (see open) and an eviction walk
// stays on that page. Operations that split a page or grow the chain read
// pages no store holds yet; Advance may drop sub-filters whose
// pages are listed. It reads no page and changes nothing; it costs one
// hash of key and a few multiplications per sub-filter.
func (c *Chain) PagesOf(key []byte, dst []PageID) []PageID {
	h := c.hash(key)
	var pos position
	for s := range c.subs {
		c.locate(&pos, h, s) // the page open reads
		dst = append(dst, pos.id)
	}
	return dst
}

// Prefetch hands ids to the Chain's Pager if it is a Prefetcher, and does
// nothing otherwise. Errors are the Pager's, wrapped.
func (c *Chain) Prefetch(ids []PageID) error {
	pf, ok := c.pager.(Prefetcher)
	if !ok || len(ids) == 0 {
		return nil
	}
	if err := pf.Prefetch(ids); err != nil {
		return fmt.Errorf("filter: prefetching %d pages: %w", len(ids), err)
	}
	return nil
}

// Prefetch passes to the base Pager, if it is a Prefetcher, the pages of
// ids not staged this round: a staged page is read from the Overlay, and
// the base's copy of it is read again only by Commit.
func (o *Overlay) Prefetch(ids []PageID) error {
	pf, ok := o.base.(Prefetcher)
	if !ok {
		return nil
	}
	rest := make([]PageID, 0, len(ids))
	for _, id := range ids {
		if _, staged := o.staged[id]; !staged {
			rest = append(rest, id)
		}
	}
	if len(rest) == 0 {
		return nil
	}
	return pf.Prefetch(rest)
}

var _ Prefetcher = (*Overlay)(nil)

// Peeker is an optional extension of Pager: Peek returns page id if it is
// in memory now (cached, dirty or staged), without reading storage and
// without changing what any later call returns; nil otherwise. A Chain
// uses it to prefetch buckets (PrefetchBuckets), which must not read storage.
type Peeker interface {
	Peek(id PageID) []byte
}

// PrefetchBuckets asks the CPU to start loading, without waiting, the
// cache lines of key's two candidate buckets in every sub-filter whose page
// is in memory (Peeker), so that an operation on key soon after finds them
// in its caches instead of waiting on memory for each. A caller deciding a
// batch of keys calls it a few keys ahead of the one it decides: the loads
// of several keys then overlap (memory-level parallelism), where the
// operations alone wait for them one key at a time. It is a hint: it
// changes nothing, reads no storage (pages not in memory are skipped) and
// costs one hash of key and a few multiplications per sub-filter. Without
// a Peeker it does nothing. (The batched, prefetching lookups of hash
// tables and filters, as in Kvrocks' and RocksDB's MultiGet, one level
// down: the CPU cache instead of the disk.)
func (c *Chain) PrefetchBuckets(key []byte) {
	if c.peeker != nil && PrefetchesBuckets {
		c.PrefetchBucketsHash(c.Hash(key))
	}
}

// PrefetchBucketsHash is PrefetchBuckets of the key of hash hh.
func (c *Chain) PrefetchBucketsHash(hh Hash) {
	pk := c.peeker
	if pk == nil || !PrefetchesBuckets {
		return
	}
	h := uint64(hh)
	var pos position
	for s := range c.subs {
		c.locate(&pos, h, s) // the buckets open finds
		pg := pk.Peek(pos.id)
		if pg == nil {
			continue
		}
		for _, b := range [2]int{pos.b1, pos.b2} {
			// The first and last byte loadBucket reads of the bucket (16
			// from its first); a second line only when they straddle one
			// (each prefetch holds a line-fill buffer, of which a core has
			// about ten).
			i := b >> 3
			j := min(i+15, len(pg)-1)
			if i >= len(pg) {
				continue
			}
			first := unsafe.Pointer(&pg[i])
			prefetchLine(first)
			if last := unsafe.Pointer(&pg[j]); uintptr(last)>>6 != uintptr(first)>>6 {
				prefetchLine(last)
			}
		}
	}
}

// Peek returns the staged copy of id if the round holds one, nil
// otherwise: the chain reads an Overlay's pages from their staged copies
// only, so the base's copy of a page not staged yet is read once, by the
// copy (Page), and prefetching it would not serve the decision.
func (o *Overlay) Peek(id PageID) []byte { return o.staged[id] }

var _ Peeker = (*Overlay)(nil)
