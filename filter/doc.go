// Package filter implements kdedup's chained cuckoo filter over fixed-size
// pages: hashing, fingerprints, buckets, the page-local alternate bucket,
// deterministic eviction with rollback, and the chain of sub-filters that
// grows by an expansion factor. It is pure Go and does no I/O: pages come
// from a Pager supplied by the caller and modified pages are handed back
// through Pager.MarkDirty, so that a store can persist exactly the pages a
// write batch changed.
//
// # Layout
//
// A key is hashed once with SipHash-2-4 (github.com/dchest/siphash) keyed
// by the chain's secret 128-bit seed, drawn from crypto/rand when the chain
// is created (New) and kept in its metadata: where a key lands depends on a
// value no one outside the process knows, so keys that collide with a
// victim's page, buckets and fingerprint (and would make its record a
// duplicate) cannot be computed from outside, as keyed SipHash keeps
// Python's and Rust's hash tables from being flooded. (Format 4 and older
// hashed with unkeyed xxhash64: a colliding key was found in seconds.)
// State is a function of the seed, the Params and the operations; a chain
// rebuilt from nothing gets a new seed. The fingerprint is the high 32 bits truncated to the sub-filter's width f (4
// to 32 bits), with 0 mapped to 1 because 0 marks an empty slot; the bucket
// comes from the low 32 bits only, so index and fingerprint come from
// independent bits (RedisBloom derives its 8-bit fingerprint as hash%255+1,
// tying it to the index bits; this package does not).
//
// A sub-filter is any number P of pages (1 to 2^20) of PageBytes bytes, so
// that Capacity is what the first sub-filter holds, not a power of two above
// it. A page holds n buckets of b bit-packed f-bit slots, n the even number
// at or below PageBytes*8/(b*f): slot k of bucket j occupies bits
// [(j*b+k)*f, (j*b+k+1)*f) of the page, little endian. With
// x = lo32(hash)*P, the page is x>>32 and the bucket in the page (lo32(x)*n)>>32 (Lemire's multiply-shift range
// reduction, twice). A page that was never written reads as all zeros
// (empty).
//
// The alternate bucket is computed inside the page (partial-key cuckoo
// hashing, Fan et al. CoNEXT 2014 section 3.1, restricted to a page as the
// Kvrocks paged design proposes). n is not a power of two in general, so
// instead of the paper's i XOR hash(fp) it is
//
//	alt(i, fp) = (m - i) mod n, m = 2*(mix(fp) mod n/2) + 1
//
// which is also an involution: alt(alt(i, fp), fp) == i. n is made even
// (an odd count of whole buckets leaves the page's last one unused) and m is
// odd, so the alternate never equals the primary bucket: every key has two
// buckets, 2b slots. Every Contains, Insert, Count and Delete touches
// exactly one page per sub-filter and an insert dirties one page. The price is a lower load at the first failed
// insertion than with a global alternate (about 89-92% at b=4 instead of
// ~96%); TestLoadAtFirstExpansion measures it.
//
// Widths come from Params.TargetFPR: each new sub-filter gets half the
// remaining false-positive budget and one more bit (Params.SubFilterBits),
// so the chain's rate stays under the target as it grows.
//
// # Eviction
//
// When both candidate buckets are full, Add walks an eviction path of at most
// MaxKicks steps, choosing the victim bucket and slot with a PRNG seeded from
// the key's hash, so that the filter state is a pure function of the sequence
// of operations and the Params (recovery replays input to rebuild state). A
// walk that fails is rolled back step by step, so no fingerprint is ever lost
// (seiflotfy/cuckoofilter and panmari/cuckoofilter drop the last victim, a
// false negative that a dedup worker would turn into a forwarded duplicate).
//
// # Chain
//
// Inserts go to the newest sub-filter. When its walk fails the key goes to
// an older sub-filter that has room for it (an empty slot in its buckets,
// then an eviction walk), and only when none has does the chain append a
// sub-filter with Expansion times the pages of the newest one and insert
// there, as RedisBloom's scalable cuckoo filter does on the first failure.
// With page-local buckets the first failure comes when the fullest page of
// the newest sub-filter overflows, at a load of 0.87-0.91 over thousands
// of pages: filling the older ones first lets the chain reach a load of
// 0.93-0.94 before it grows, and reuses slots that deletes freed
// in older sub-filters (TestChainGrowsOnlyWhenFull). Lookups check newest
// first. The false-positive rate of one
// sub-filter is about 2*b*load/2^f (paper section 5.1); the chain's is the sum
// of its sub-filters' rates, see Stats.EstimatedFPR.
//
// # Generations
//
// With Params.Window the chain forgets by record time: sub-filters belong to
// generations of Window/Generations milliseconds of record timestamps, each
// generation a chain of its own (its own capacity, expansion and width
// budget, TargetFPR/(Generations+1) since that many can be live at once). A
// key goes to the generation of its record's timestamp; Advance moves the
// watermark (the highest timestamp seen) and drops every generation that
// ended a window before it, handing its sub-filters to Pager.Drop. Lookups,
// counts and deletes cover every live generation. Sub-filter IDs are never
// reused, so a store can delete a dropped sub-filter's pages lazily.
//
// An Overlay stages a chain's page changes over another Pager until they are
// committed or discarded (exactly-once delivery rewinds aborted
// transactions).
package filter
