package dedup

import (
	"fmt"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kdedup/kdedup/filter"
)

// readAhead is the state of a poll handed to Prefetch whose records are
// being decided.
type readAhead struct {
	recs []*kgo.Record
	// end is the number of recs, from the start, whose pages were
	// prefetched; a Decide of recs[end] or later prefetches the next part.
	end int
	// missesAt is the store's CacheMisses when the previous poll's
	// Prefetch started; primed is false until then.
	missesAt uint64
	primed   bool
	ids      []filter.PageID
}

// Prefetch reads into memory, before recs are decided, the filter pages
// their decisions will read first (filter.Chain.PagesOf: one page per
// sub-filter per key, keys derived as Decide derives them, deletes
// included), with concurrent Badger reads (store.PartitionState.Prefetch), so
// that a poll whose pages are not cached waits for its reads together
// instead of one after another inside each Decide. recs must be the next
// records to decide, in offset order, as the poll delivered them; records
// Decide never sees (skipped) cost a read at most. It changes no decision
// and no state, only what is cached.
//
// Work is bounded by the page cache: recs are prefetched in parts of at
// most store.PartitionState.PrefetchLimit pages, the first now and each next
// one when Decide (or Replay) reaches its first record, so that
// prefetched pages are not evicted before they are used.
//
// With a state of at least minBucketPrefetchBytes, Decide (and Replay)
// of each record of recs also prefetches, into the CPU's caches, the
// buckets of the records bucketsAhead after it (filter.Chain.PrefetchBuckets).
//
// It reads no page when the previous poll, its prefetch and decisions
// included, read no page from Badger (store.PartitionState.CacheMisses did not
// move): a state that fits in the page cache pays a counter comparison per
// poll. The first poll after a cache miss prefetches again; the first
// poll of a Deduplicator always does.
//
// Errors are storage errors, as Decide's: the partition must stop.
func (p *Deduplicator) Prefetch(recs []*kgo.Record) error {
	p.startBucketAhead(recs)
	a := &p.ahead
	a.recs, a.end = nil, 0
	misses := p.state.CacheMisses()
	if a.primed && misses == a.missesAt {
		return nil
	}
	a.primed, a.missesAt = true, misses
	if len(recs) == 0 {
		return nil
	}
	a.recs = recs
	if err := p.prefetchFrom(0); err != nil {
		return fmt.Errorf("prefetching the pages of %s/%d offsets %d to %d: %w", p.topic, p.partition, recs[0].Offset, recs[len(recs)-1].Offset, err)
	}
	return nil
}

// readAheadOf prefetches the next part of the poll when r is at or past
// its end.
func (p *Deduplicator) readAheadOf(r *kgo.Record) error {
	a := &p.ahead
	if a.end >= len(a.recs) || r.Offset < a.recs[a.end].Offset {
		return nil
	}
	i := a.end
	for i < len(a.recs) && a.recs[i].Offset < r.Offset {
		i++
	}
	return p.prefetchFrom(i)
}

// prefetchFrom prefetches the pages of the poll's records from index i on,
// up to the store's limit, and moves the end of the read-ahead past them.
func (p *Deduplicator) prefetchFrom(i int) error {
	a := &p.ahead
	limit := p.state.PrefetchLimit()
	ids := a.ids[:0]
	for ; i < len(a.recs); i++ {
		key, err := p.opts.Key.Of(a.recs[i])
		if err != nil {
			continue // unkeyed: reads nothing
		}
		n := len(ids)
		ids = p.chain.PagesOf(key, ids)
		if len(ids) > limit && n > 0 {
			// A part holds whole records: this one starts the next.
			ids = ids[:n]
			break
		}
	}
	a.ids, a.end = ids, i
	if a.end >= len(a.recs) {
		a.recs = nil // the last part: hold no records past the poll
		a.end = 0
	}
	return p.chain.Prefetch(ids)
}

// bucketsAhead is how many records ahead of the one it decides a
// Deduplicator prefetches the buckets of (filter.Chain.PrefetchBuckets):
// enough for the loads of several records to overlap, few enough that
// their cache lines are still there when the records are decided.
const bucketsAhead = 8

// minBucketPrefetchBytes is the least state (pages of the chain) for which
// a Deduplicator prefetches buckets: below it a partition's buckets mostly
// stay in the CPU's caches, and the prefetch would cost a second key and
// hash of each record for little. A variable for tests.
var minBucketPrefetchBytes uint64 = 4 << 20

// bucketAhead is the poll whose records' buckets Decide prefetches
// bucketsAhead records ahead (prefetchBuckets).
type bucketAhead struct {
	recs []*kgo.Record
	at   int // index of the record being decided, or the last one
	next int // index of the next record whose buckets are prefetched
}

// startBucketAhead makes Decide prefetch the buckets of recs, the poll
// handed to Prefetch, when the state is large enough for it to pay.
func (p *Deduplicator) startBucketAhead(recs []*kgo.Record) {
	p.buckets = bucketAhead{}
	if filter.PrefetchesBuckets && len(recs) > 1 && p.chain.Stats().Bytes >= minBucketPrefetchBytes {
		p.buckets.recs = recs
	}
}

// prefetchBuckets prefetches the buckets of the records of the poll up to
// bucketsAhead past r, which is about to be decided, and keeps the hash of
// each one's key for its decision (hashOf): one key derivation and one
// hash a record.
func (p *Deduplicator) prefetchBuckets(r *kgo.Record) {
	b := &p.buckets
	recs := b.recs
	from, to := b.advance(r.Offset)
	for _, rec := range recs[from:to] {
		if key, err := p.opts.Key.Of(rec); err == nil {
			h := p.chain.Hash(key)
			p.chain.PrefetchBucketsHash(h)
			p.hashed[uint64(rec.Offset)%uint64(len(p.hashed))] = hashedKey{rec: rec, chain: p.chain, hash: h}
		}
	}
}

// hashedKey is the hash of a record's key under chain, kept from the
// prefetch of its buckets to its decision.
type hashedKey struct {
	rec   *kgo.Record
	chain *filter.Chain
	hash  filter.Hash
}

// hashOf returns the hash of r's key under the chain: the one its bucket
// prefetch kept, when it kept one for r and this chain (a chain opened
// again is another, whose seed may differ), else the key derived and
// hashed now. The error is the key's (Unkeyed).
func (p *Deduplicator) hashOf(r *kgo.Record) (filter.Hash, error) {
	e := &p.hashed[uint64(r.Offset)%uint64(len(p.hashed))]
	if e.rec == r && e.chain == p.chain {
		h := e.hash
		*e = hashedKey{}
		return h, nil
	}
	key, err := p.opts.Key.Of(r)
	if err != nil {
		return 0, err
	}
	return p.chain.Hash(key), nil
}

// advance moves the window to the record at offset, about to be decided,
// and returns the indexes [from, to) of the poll's records whose buckets
// are to be prefetched now: each record once, at most bucketsAhead past
// the one decided, never the one decided (it is needed at once). Records
// the caller skips are passed over; a record past the poll, or the poll's
// last prefetch, releases the poll.
func (b *bucketAhead) advance(offset int64) (from, to int) {
	for b.at < len(b.recs) && b.recs[b.at].Offset < offset {
		b.at++
	}
	if b.at >= len(b.recs) {
		*b = bucketAhead{}
		return 0, 0
	}
	first := b.at + 1
	if b.recs[b.at].Offset > offset {
		first = b.at // the record decided is not in the poll: recs[at] is next
	}
	from = max(b.next, first)
	to = max(from, min(len(b.recs), first+bucketsAhead))
	b.next = to
	if b.next >= len(b.recs) {
		*b = bucketAhead{} // the poll's last buckets are asked for: hold no records past it
	}
	return from, to
}
