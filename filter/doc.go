// Package filter implements kdedup's chained cuckoo filter over fixed-size
// pages: hashing, variable-length fingerprints, buckets, the page-local
// alternate bucket, deterministic eviction with rollback, sub-filters that
// grow in place by splitting pages, and the chain of sub-filters. It is
// pure Go and does no I/O: pages come from a Pager supplied by the caller
// and modified pages are handed back through Pager.MarkDirty, so that a
// store can persist exactly the pages a write batch changed.
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
// rebuilt from nothing gets a new seed.
//
// A sub-filter starts as RootPages pages (1 to 2^20) of PageBytes bytes,
// so that Capacity is what the first sub-filter holds at a load of 1, not
// a power of two above it. A page holds n buckets of b bit-packed W-bit
// slots, n the even number at or below PageBytes*8/(b*W): slot k of bucket
// j occupies bits [(j*b+k)*W, (j*b+k+1)*W) of the page, little endian.
// With x = lo32(hash)*RootPages, the root page is x>>32 and the bucket in
// the page (lo32(x)*n)>>32 (Lemire's multiply-shift range reduction,
// twice). The fingerprint comes from the other bits of the hash (the high
// 32, then a SplitMix64 finalizer of the hash for the widest slots), so
// index and fingerprint come from independent bits (RedisBloom derives its
// 8-bit fingerprint as hash%255+1, tying it to the index bits; this
// package does not). A page that was never written reads as all zeros
// (empty).
//
// # Growth in place
//
// A sub-filter grows by splitting pages, as InfiniFilter (Dayan et al.,
// SIGMOD 2023) and Taffy filters (Apple 2022) do, with linear hashing's
// numbering (Litwin 1980): when a key cannot be placed in its page, not
// even by an eviction walk, page k at depth d splits into k and
// k + RootPages*2^d, each key's next fingerprint bit choosing its half.
// An entry is a variable-length fingerprint in its slot:
//
//	tag (W-1-D bits) | prefix (up to D bits) | 1 | zeros
//
// with D = MaxDepth (8) for slots of 17 bits or more. The tag never
// changes and alone gives the alternate bucket, so a split moves each
// entry to the same slot of one of the two pages and drops one prefix bit:
// a bit shuffle, no kick, and a bucket of at most b entries gives two of
// at most b. A new entry keeps D prefix bits; an entry matches a key when
// the tags are equal and the prefix it kept equals the key's bits. The
// page a key is in follows from the sub-filter's page depths (kept in the
// metadata, 4 bits a page number), one hash bit per split, so every
// Contains, Insert, Count and Delete reads one page of a sub-filter
// however far it grew: one page up to 256 times Capacity, and an insert
// dirties one page, two when it splits one, and at most
// MaxPagesChangedByInsert. A page splits when an insert's eviction walk
// in it fails after 64 kicks (splitKicks; Params.MaxKicks bounds the walk
// only in a page that cannot split), at about 0.85-0.87 of the
// sub-filter's load (TestLoadAtFirstSplit), so a sub-filter's load runs
// from about 0.5 after a doubling to 0.87 before the next: between 24 and
// 42 bits of pages a key at the defaults.
//
// Entries are counted by fingerprint length: one inserted in a page at
// depth i holds W-1+i bits of its key's hash (its slot's and the i the
// splits took), and a key never inserted matches it with probability
// 2^-(W-1+i) given it lands in its page and buckets, so
// SubFilter.EstimatedFPR is the exact expectation, not a bound. Widths
// come from Params.TargetFPR (Params.SubFilterBits): 21 bits at the
// defaults, enough for the rate of a sub-filter grown to its deepest, and
// one more for each sub-filter the chain appends. A delete removes the
// matching entry with the longest fingerprint, the one least likely to be
// another key's.
//
// The alternate bucket is computed inside the page (partial-key cuckoo
// hashing, Fan et al. CoNEXT 2014 section 3.1, restricted to a page as the
// Kvrocks paged design proposes). n is not a power of two in general, so
// instead of the paper's i XOR hash(fp) it is
//
//	alt(i, tag) = (m - i) mod n, m = 2*(mix(tag) mod n/2) + 1
//
// which is also an involution: alt(alt(i, tag), tag) == i. n is made even
// (an odd count of whole buckets leaves the page's last one unused) and m
// is odd, so the alternate never equals the primary bucket: every key has
// two buckets, 2b slots.
//
// # Eviction
//
// When both candidate buckets are full, an insert walks an eviction path
// of at most MaxKicks steps within the page, choosing the victim bucket and
// slot with a PRNG seeded from the key's hash bits, so that the filter
// state is a pure function of the sequence of operations and the Params
// (recovery replays input to rebuild state). A walk that fails is rolled
// back step by step, so no fingerprint is ever lost (seiflotfy/cuckoofilter
// and panmari/cuckoofilter drop the last victim, a false negative that a
// dedup worker would turn into a forwarded duplicate); the page then
// splits.
//
// # Chain
//
// Inserts go to the newest sub-filter. When its page is at the deepest
// (MaxDepth doublings) and full, or still full after one split (a key's
// buckets full of copies of one fingerprint), or the sub-filter's
// estimated rate has reached its share of the target, the key goes to an
// older sub-filter
// with an empty slot in its buckets and a share left, else the chain
// appends a sub-filter one bit wider with Expansion times the root pages
// of the newest (RedisBloom's scalable cuckoo filter, reached after 256
// times growth instead of 2). Lookups check newest first. The chain's
// estimated false-positive rate is the sum of its sub-filters'
// (Stats.EstimatedFPR), kept under the target by the geometric budget of
// scalable Bloom filters.
//
// # Generations
//
// With Params.Window the chain forgets by record time, at the cost of a
// chain without a window: one chain of sub-filters, one page read a
// lookup. Each entry carries, above its fingerprint, the tag of its
// generation: GenerationBits bits (4 at the default 8 generations, the
// least t with 2^t >= Generations+2), the generation of its record's
// timestamp modulo 2^t. Generations are Window/Generations milliseconds
// of record timestamps; Advance moves the watermark (the highest
// timestamp seen) and expires every generation that ended a window before
// it: G+1 generations are live, and an entry whose tag is more than G
// behind the watermark's matches nothing and its slot is free, taken by
// the next insert, eviction walk or split that meets it. Entries are
// counted by generation tag and length in each sub-filter, so that an
// expiry uncounts a generation at once and Items and the estimated
// false-positive rate are those of the live entries: the fingerprints are
// as wide as without a window. A sweep reads each page once every
// 2^t - 1 - G generations (7 at the defaults), a block of the pages in
// each generation in step with the watermark, and clears the expired
// entries it finds: no entry lives 2^t generations, so a tag's age is
// exact. Refresh re-tags a copy in place. The oldest sub-filters leave
// the chain once they hold no live entry (Pager.Drop), so that a chain
// that appended sub-filters for a burst goes back to one page a lookup a
// window later (the newest stays, at the size it grew to), and a new
// sub-filter takes the least share of the budget no live one has.
// Sub-filter IDs are never reused, so a store can delete a dropped
// sub-filter's pages lazily. Format 6 and older gave each generation a
// chain of its own, a lookup reading a page of each of the G+1 (9 by
// default) and each generation's fingerprints log2(G+1) bits wider.
//
// An Overlay stages a chain's page changes over another Pager until they are
// committed or discarded (exactly-once delivery rewinds aborted
// transactions).
package filter
