package filter

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"slices"
	"strings"

	"github.com/dchest/siphash"
)

// Errors returned by Chain methods. Errors from the Pager are returned
// wrapped; callers use errors.Is.
var (
	// ErrFull is returned by Add and Insert when a key cannot be placed and
	// the chain already has MaxSubFilters sub-filters.
	ErrFull = errors.New("filter: full")
	// ErrCorrupt is returned when metadata cannot be decoded or a page has
	// the wrong length.
	ErrCorrupt = errors.New("filter: corrupt state")
	// ErrParams is returned by Open (and DecodeMeta, for another format
	// version) when the stored state was written with another format
	// version, hash or Params.
	ErrParams = errors.New("filter: stored state was written with other parameters")
)

// ParamsError is the error Open returns for a state written with other
// Params than configured; errors.Is(err, ErrParams) holds. Callers that
// set Params from their own configuration name each Param their own way
// from Diffs (package dedup names the KDEDUP_* variables).
type ParamsError struct {
	// Diffs are the parameters that differ (Params.Diff), never empty.
	Diffs []ParamDiff
}

// Error lists the differences: "filter: stored state was written with
// other parameters: capacity stored 1000000, configured 2000000".
func (e *ParamsError) Error() string {
	var b strings.Builder
	b.WriteString(ErrParams.Error())
	for i, d := range e.Diffs {
		if i == 0 {
			b.WriteString(": ")
		} else {
			b.WriteString("; ")
		}
		b.WriteString(d.String())
	}
	return b.String()
}

// Unwrap returns ErrParams.
func (e *ParamsError) Unwrap() error { return ErrParams }

// SubFilter describes one sub-filter of a chain: a cuckoo filter that
// grows in place by splitting pages, up to MaxDepth doublings of its root
// pages, before the chain appends another.
//
// A copy returned by Chain.SubFilters shares its page depths with the
// chain: read it before the chain's next operation.
type SubFilter struct {
	// ID names the sub-filter's pages (PageID.SubFilter). IDs are given in
	// creation order from 0 and never reused, so that the pages of a
	// dropped generation can be deleted after the metadata that dropped it
	// is durable, without racing a new sub-filter.
	ID uint32
	// RootPages is the number of pages the sub-filter started with, 1 to
	// 2^20: a key's root page and buckets are chosen among them.
	RootPages uint64
	// Pages is the number of pages now: RootPages plus one per split.
	Pages uint64
	// FingerprintBits is the fingerprint width W of this sub-filter: an
	// entry is a tag, a prefix of up to MaxDepth bits and a terminating
	// bit, and with a window the generation tag above them
	// (Params.SlotBits).
	FingerprintBits int
	// Items is the number of live entries stored (inserts minus deletes
	// that found one, less the entries of expired generations).
	Items uint64
	// Lengths counts the live entries by fingerprint length: Lengths[i]
	// entries hold FingerprintBits-1+i bits of their key's hash (in their
	// slot and in the splits that led to their page), i being the depth of
	// the page they were inserted in. Their sum is Items.
	Lengths [MaxDepth + 1]uint64
	// byTag, with a window, is Lengths for each generation tag: the rows
	// of live generations add up to Lengths, the others are zero.
	byTag [][MaxDepth + 1]uint64
	// gens is the chain's generation clock, shared by its sub-filters;
	// nil without a window.
	gens *clock
	// slotBits is the slot width: FingerprintBits and the generation tag.
	slotBits int
	// fpMask has the low FingerprintBits bits set.
	fpMask uint32
	// share is the sub-filter's term of the chain's geometric
	// false-positive budget (Params.SubFilterBits): its index in the
	// chain, counting the sub-filters a window dropped.
	share int

	// depths[k] is the depth of page k (0 for the root pages never split
	// and for page numbers not in use), up to the highest page number in
	// use.
	depths []uint8
	// atDepth counts the pages at each depth; minDepth is the least depth
	// a page is at.
	atDepth  [MaxDepth + 1]uint64
	minDepth int
	// maxDepth and tagBits split the slot width (depthBits); maxWeight is
	// the weight (Σ Lengths[i]·2^(maxDepth-i)) at which the sub-filter's
	// estimated false-positive rate reaches its share of the target.
	maxDepth, tagBits int
	weight, maxWeight uint64
	// bucketsPerPage, derived from the width, the bucket size and the page
	// size.
	bucketsPerPage uint64
}

// Buckets is the number of buckets of s.
func (s SubFilter) Buckets() uint64 { return s.Pages * s.bucketsPerPage }

// Slots is the number of slots of s for bucket size b.
func (s SubFilter) Slots(b int) uint64 { return s.Buckets() * uint64(b) }

// Depth is the depth of page (0 for a root page never split), and false
// when page is not a page of s now.
func (s SubFilter) Depth(page uint32) (int, bool) {
	k := uint64(page)
	if s.RootPages == 0 { // described by hand (Pages alone): never split
		return 0, k < s.Pages
	}
	if k < s.RootPages {
		return int(s.depths[k]), true
	}
	if k >= uint64(len(s.depths)) {
		return 0, false
	}
	// Page k was born at depth b from page k - RootPages*2^(b-1), the
	// page of that number at depth b-1, when it split.
	b := bits.Len64(k / s.RootPages)
	if int(s.depths[k-s.RootPages<<(b-1)]) < b {
		return 0, false
	}
	return int(s.depths[k]), true
}

// EstimatedFPR is the probability that a key never inserted matches an
// entry of s, in expectation over keys: a key lands in the page of an
// entry at depth d with probability 2^-d/RootPages and in one of its
// buckets with probability 2/bucketsPerPage, and then matches an entry of
// fingerprint length l with probability 2^-(l-d) (the d bits of its page
// match already), so that the sum over the entries is
// 2/(bucketsPerPage*RootPages) * Σ_i Lengths[i]*2^-(W-1+i). For a
// sub-filter that never split, 2*b*load/2^(W-1): the rate of Fan et al.
// section 5.1 for the W-1 bits an entry holds.
func (s SubFilter) EstimatedFPR() float64 {
	if s.RootPages == 0 || s.bucketsPerPage == 0 {
		return 0
	}
	return float64(s.weight) / (float64(s.bucketsPerPage) * float64(s.RootPages) * math.Exp2(float64(s.FingerprintBits-2+s.maxDepth)))
}

// count adds n (1 or -1) entries inserted at depth d, of slot value v
// (whose generation tag is counted with a window).
func (s *SubFilter) count(v uint32, d, n int) {
	w := uint64(1) << (s.maxDepth - d)
	var row *[MaxDepth + 1]uint64
	if s.gens != nil {
		row = &s.byTag[v>>s.FingerprintBits&s.gens.mask]
	}
	if n > 0 {
		s.Items++
		s.Lengths[d]++
		s.weight += w
		if row != nil {
			row[d]++
			s.gens.used[v>>s.FingerprintBits&s.gens.mask] = true
		}
		return
	}
	// A corrupt page can hold more than the counts say.
	if s.Lengths[d] > 0 && (row == nil || row[d] > 0) {
		s.Items--
		s.Lengths[d]--
		s.weight -= w
		if row != nil {
			row[d]--
		}
	}
}

// expire uncounts the entries of generation tag g, which expired: they
// match nothing from now on, and their slots are free.
func (s *SubFilter) expire(g uint32) {
	row := &s.byTag[g]
	for d, n := range row {
		if n == 0 {
			continue
		}
		s.Items -= n
		s.Lengths[d] -= n
		s.weight -= n << (s.maxDepth - d)
	}
	*row = [MaxDepth + 1]uint64{}
}

// free reports whether slot value v is free for a new entry: empty, or an
// entry of an expired generation.
func (s *SubFilter) free(v uint32) bool {
	return v == 0 || s.gens != nil && !s.gens.live(v>>s.FingerprintBits)
}

// fingerprint is the entry part of slot value v: v without its generation
// tag.
func (s *SubFilter) fingerprint(v uint32) uint32 { return v & s.fpMask }

// splits reports whether the page of pos may split: it is not at the
// sub-filter's deepest, and its right child's number fits a page number.
func (s *SubFilter) splits(pos *position) bool {
	return pos.depth < s.maxDepth && uint64(pos.id.Page)+s.RootPages<<pos.depth < 1<<32
}

// MaxPagesChangedByInsert bounds the pages one Insert or Add of one key
// changes: the key's page, the page a split of it makes, and a page of
// another sub-filter when neither takes the key (placeOrGrow). A Refresh
// changes one more, in the generation the copy leaves.
const MaxPagesChangedByInsert = 2*maxSplitsPerInsert + 1

// full reports whether the sub-filter's estimated false-positive rate has
// reached its share of the target: it takes no more entries.
func (s *SubFilter) full() bool { return s.weight >= s.maxWeight }

// Stats summarizes a chain.
type Stats struct {
	SubFilters int
	// Generations is the number of live generations that took an entry
	// since they began (1 without a window, 0 for a windowed chain that
	// saw no key yet).
	Generations int
	Items       uint64
	Slots       uint64
	// LoadFactor is Items/Slots over the whole chain.
	LoadFactor float64
	// NewestLoadFactor is the load factor of the newest sub-filter, the
	// one inserts go to first.
	NewestLoadFactor float64
	// EstimatedFPR is the sum over sub-filters of SubFilter.EstimatedFPR:
	// the probability that a key never inserted is reported present.
	EstimatedFPR float64
	// Bytes is the size of all pages of the chain (allocated or not).
	Bytes uint64
	// Splits is the number of page splits of the live sub-filters: their
	// pages beyond their root pages.
	Splits uint64
	// Entries counts the entries of the live sub-filters by fingerprint
	// length: Entries[l] hold l bits of their key's hash (SubFilter.Lengths).
	Entries [MaxFingerprintBits + MaxDepth]uint64
	// Operations is the number of Contains, Count, Insert, Add, Refresh,
	// Delete, DeleteAll and Locate calls since the chain was opened, and
	// PageReads the pages they asked the Pager for: one per sub-filter an
	// operation looks in, and two more per page it splits.
	Operations, PageReads uint64
	// SweptPages is the number of pages the window's sweep read since the
	// chain was opened (Advance): every page once every
	// 2^GenerationBits - 1 - Generations generations. Not in PageReads.
	SweptPages uint64
	// NewestFingerprintBits is the fingerprint width of the newest
	// sub-filter.
	NewestFingerprintBits int
	// Watermark is the highest record timestamp seen, in milliseconds
	// since the Unix epoch (math.MinInt64 before any, and without a
	// window).
	Watermark int64
	// NearFull is set when the chain can add at most one more
	// sub-filter before inserts fail (ErrFull) or, with a target rate, before a new
	// sub-filter would need fingerprints wider than 32 bits and the chain
	// would exceed its target.
	NearFull bool
}

// GenerationItems is the live entries of one generation of a window
// (Chain.Generations).
type GenerationItems struct {
	// Generation holds record timestamps [Generation*span,
	// (Generation+1)*span) milliseconds since the Unix epoch
	// (Params.GenerationStart).
	Generation int64
	Items      uint64
}

// Generations returns, with a window, the live generations that took an
// entry since they began, oldest first, with their live entries (those
// deleted since count no more): Stats.Generations of them. Nil without a
// window.
func (c *Chain) Generations() []GenerationItems {
	if c.gens == nil {
		return nil
	}
	var gens []GenerationItems
	newest := generation(c.watermark, c.span)
	for age := int64(c.gens.maxAge); age >= 0; age-- {
		t := c.gens.tag(newest - age)
		if !c.gens.used[t] {
			continue
		}
		g := GenerationItems{Generation: newest - age}
		for _, sf := range c.subs {
			for _, n := range sf.byTag[t] {
				g.Items += n
			}
		}
		gens = append(gens, g)
	}
	return gens
}

// Chain is a chained cuckoo filter over pages supplied by a Pager.
//
// A Chain is not safe for concurrent use: one goroutine owns it (kdedup keeps
// one chain per topic-partition).
type Chain struct {
	p     Params
	pager Pager
	// peeker is pager as a Peeker, nil if it is not one (PrefetchBuckets).
	peeker Peeker
	// seed keys the hash: secret, drawn when the chain is created and kept
	// in its metadata, so that keys colliding with another key's page,
	// buckets and fingerprint cannot be computed without it.
	seed Seed
	// subs are oldest first.
	subs      []SubFilter
	nextID    uint32
	watermark int64
	span      int64 // generation span in ms, 0 without a window
	// gens is the generation clock, nil without a window; tag is the
	// generation tag of the entry the current operation stores (0 without
	// a window).
	gens *clock
	tag  uint32
	// newestGen is the watermark's generation, newestStart its first
	// timestamp, and nextTick the next watermark at which Advance sweeps
	// (tickAfter): all follow from the watermark.
	newestGen, newestStart, nextTick int64
	// sweepSub and sweepRoot are the sweep's cursor in the current pass:
	// the next root page to sweep (with the pages split from it), of
	// c.subs[sweepSub] (Advance).
	sweepSub  int
	sweepRoot uint64
	kicks     []kick // reused eviction log
	scratch   []byte // a split's right page, as it is built
	cleared   []int  // reused by the sweep
	// ops and reads count operations and the pages they read, swept the
	// pages the sweep read (Stats).
	ops, reads, swept uint64
}

// New returns an empty chain with a secret hash seed (RandomSeed) and one
// sub-filter sized for p.Capacity. No page is touched until the first
// insert (or, with a window, the first Advance's sweep).
func New(p Params, pager Pager) (*Chain, error) {
	return NewWithSeed(p, RandomSeed(), pager)
}

// NewWithSeed is New with the given hash seed. The state of a chain is a
// function of its seed, Params and operations; NewWithSeed is for tests and
// benchmarks that compare state across runs. A seed known outside the
// process lets keys that collide in the filter be computed: a worker uses
// New.
func NewWithSeed(p Params, seed Seed, pager Pager) (*Chain, error) {
	p = p.WithDefaults()
	if err := p.Validate(); err != nil {
		return nil, err
	}
	c := newChain(p, seed, pager)
	c.subs = []SubFilter{c.subFilter(0, p.firstPages())}
	return c, nil
}

// presizeLoad is the load factor Presize sizes a table for: below the
// about 0.83-0.86 at which a sub-filter's pages start to split
// (TestLoadAtFirstSplit), so that the keys it was sized for fit without a
// split.
const presizeLoad = 0.80

// presizeDoublings bounds Presize: at most 2^presizeDoublings times the
// root pages Params.Capacity gives.
const presizeDoublings = 4

// Presize makes the first sub-filter of an empty chain large enough for
// about records/2 keys, when that is more root pages than Params.Capacity
// gives: for a rebuild that knows how many records its replay reads (an
// upper bound on its keys). A replay of records distinct keys then ends after
// one round of page splits, at the load of a table sized for them (about
// 0.80: 26 bits a key at the defaults), instead of wherever the doublings
// from Capacity leave it (between about 24 and 45 bits, filter/doc.go); a
// replay whose records repeat keys more than 3 times in 4 holds at most
// about twice the pages it needs. The root pages stay at most
// presizeDoublings doublings of those Capacity gives (the pages a chain
// reaches after that many rounds of splits), so that a replay of mostly
// repeated keys cannot make a table far larger than its keys need, and at
// most 2^20. The design note behind it is DESIGN.md, "Growth" ("when the
// key count is known").
//
// It changes nothing and returns false on a chain that has taken a key,
// split a page or, with a window, seen a record time, or when records/2
// keys fit in the configured first sub-filter.
// It touches no page: the chain's metadata alone describes the new size,
// and its pages read as empty. Not safe for concurrent use with the
// chain's other methods.
func (c *Chain) Presize(records uint64) bool {
	if len(c.subs) != 1 || c.watermark != math.MinInt64 {
		return false
	}
	s := c.subs[0]
	if s.Items != 0 || s.Pages != s.RootPages || s.weight != 0 {
		return false
	}
	perPage := float64(s.bucketsPerPage) * float64(c.p.BucketSize) * presizeLoad
	pages := uint64(min(math.Ceil(float64(records/2)/perPage), float64(c.p.firstPages()<<presizeDoublings), 1<<maxPageBits))
	if pages <= s.RootPages {
		return false
	}
	c.nextID = s.ID
	c.subs[0] = c.subFilter(0, pages)
	return true
}

// Open returns the chain described by meta (as written by MarshalMeta), over
// pager, with the hash seed meta holds. It returns ErrParams when meta was
// written with another format version or hash (wrapped, naming both), or
// with other Params than p (after defaults: a *ParamsError listing each
// parameter that differs, with its stored and configured values): a chain's
// layout depends on all of them, and recovery relies on state being a
// function of the seed, input and Params. A nil or empty meta is a new
// chain with a new secret seed, as New.
func Open(meta []byte, p Params, pager Pager) (*Chain, error) {
	if len(meta) == 0 {
		return New(p, pager)
	}
	configured := p // as given: Diff names the rate a fixed width overrides
	p = p.WithDefaults()
	if err := p.Validate(); err != nil {
		return nil, err
	}
	m, err := DecodeMeta(meta)
	if err != nil {
		return nil, err
	}
	if m.Params != p {
		return nil, &ParamsError{Diffs: m.Params.Diff(configured)}
	}
	c := newChain(p, m.Seed, pager)
	c.subs = m.SubFilters
	c.nextID = m.NextID
	c.watermark = m.Watermark
	if c.gens != nil {
		c.gens.newest = c.gens.tag(generation(m.Watermark, c.span))
		if m.Watermark != math.MinInt64 {
			c.newestGen = generation(m.Watermark, c.span)
			c.newestStart = c.newestGen * c.span
			c.nextTick = c.tickAfter(m.Watermark)
		}
		copy(c.gens.used, m.used)
		c.sweepSub, c.sweepRoot = int(m.sweepSub), uint64(m.sweepRoot)
		for i := range c.subs {
			c.subs[i].gens = c.gens
		}
	}
	return c, nil
}

// Seed is a chain's secret hash key: the 128-bit key of SipHash-2-4, as
// its two little-endian 64-bit halves. It is stored in the chain metadata
// and must stay there: never log or report it.
type Seed struct{ K0, K1 uint64 }

// RandomSeed returns a secret hash seed from crypto/rand, as New draws it.
func RandomSeed() Seed {
	var b [16]byte
	// crypto/rand.Read never returns an error: the program crashes when the
	// system cannot supply randomness.
	_, _ = rand.Read(b[:])
	return Seed{K0: binary.LittleEndian.Uint64(b[:8]), K1: binary.LittleEndian.Uint64(b[8:])}
}

func newChain(p Params, seed Seed, pager Pager) *Chain {
	peeker, _ := pager.(Peeker)
	return &Chain{p: p, pager: pager, peeker: peeker, seed: seed, watermark: math.MinInt64, span: p.spanMillis(), gens: newClock(p),
		newestStart: math.MaxInt64, nextTick: math.MinInt64, kicks: make([]kick, 0, p.MaxKicks)}
}

// hash is the 64-bit key hash: SipHash-2-4 keyed by the chain's secret
// seed (HashSipHash24, Aumasson and Bernstein 2012, via
// github.com/dchest/siphash). SipHash is a pseudo-random function built
// against hash flooding (Python's, Ruby's and Rust's hash tables and Redis
// key it with a random seed for that reason): without the seed, which
// keys share a page, buckets and fingerprint, and so which key would make
// another's record a duplicate, cannot be computed, only found by sending
// keys at random. A seeded non-cryptographic hash such as xxhash64 would
// cost the same here (about 15 ns a key) but is not designed to hide its
// seed from differential attacks. Every operation hashes its key once.
func (c *Chain) hash(key []byte) uint64 {
	return siphash.Hash(c.seed.K0, c.seed.K1, key)
}

// Hash is a key's hash under one chain's secret seed (Chain.Hash): what
// every operation computes from the key first. A caller that looks at a
// key twice, as dedup prefetches a record's buckets before it decides the
// record, hashes it once and passes the Hash to the ...Hash methods. A
// Hash is only valid for the chain that computed it, or one opened from
// its metadata (same seed).
type Hash uint64

// Hash returns key's hash (SipHash-2-4 under the chain's seed).
func (c *Chain) Hash(key []byte) Hash { return Hash(c.hash(key)) }

// subFilter describes a new, empty sub-filter with share i of the
// false-positive budget (the i-th of the chain), of the given root page
// count, with the next unused ID.
func (c *Chain) subFilter(i int, rootPages uint64) SubFilter {
	sf := SubFilter{ID: c.nextID, RootPages: rootPages, Pages: rootPages, FingerprintBits: c.p.SubFilterBits(i), gens: c.gens, share: i}
	c.nextID++
	sf.depths = make([]uint8, rootPages)
	sf.atDepth[0] = rootPages
	if c.gens != nil {
		sf.byTag = make([][MaxDepth + 1]uint64, len(c.gens.used))
	}
	c.p.derive(&sf, i)
	return sf
}

// Params returns the chain's parameters (defaults applied).
func (c *Chain) Params() Params { return c.p }

// SubFilters returns a copy of the chain's sub-filters, oldest first.
func (c *Chain) SubFilters() []SubFilter { return append([]SubFilter(nil), c.subs...) }

// Len returns the number of sub-filters in the chain.
func (c *Chain) Len() int { return len(c.subs) }

// Stats returns the chain's load and estimated false-positive rate.
func (c *Chain) Stats() Stats {
	s := Stats{SubFilters: len(c.subs), Watermark: c.watermark, Operations: c.ops, PageReads: c.reads, SweptPages: c.swept}
	if c.span == 0 {
		s.Watermark = math.MinInt64
	}
	b := c.p.BucketSize
	for _, sf := range c.subs {
		slots := sf.Slots(b)
		s.Items += sf.Items
		s.Slots += slots
		s.Bytes += sf.Pages * uint64(c.p.PageBytes)
		s.Splits += sf.Pages - sf.RootPages
		for i, n := range sf.Lengths {
			if l := sf.FingerprintBits - 1 + i; n > 0 && l < len(s.Entries) {
				s.Entries[l] += n
			}
		}
		s.EstimatedFPR += sf.EstimatedFPR()
	}
	s.Generations = 1
	if c.gens != nil {
		s.Generations = 0 // len(c.Generations()), without its allocation
		for _, u := range c.gens.used {
			if u {
				s.Generations++
			}
		}
	}
	s.LoadFactor = float64(s.Items) / float64(s.Slots)
	newest := c.subs[len(c.subs)-1]
	s.NewestLoadFactor = float64(newest.Items) / float64(newest.Slots(b))
	s.NewestFingerprintBits = newest.FingerprintBits
	next := c.freeShare(-1)
	s.NearFull = len(c.subs) >= MaxSubFilters-1 ||
		(c.p.FingerprintBits == 0 && c.p.SubFilterBits(c.freeShare(next)) >= c.p.maxFingerprintBits() && c.p.SubFilterBits(next) >= c.p.maxFingerprintBits())
	return s
}

// oldestLive is the oldest generation still live at the watermark
// (Params.OldestLive).
func (c *Chain) oldestLive() int64 {
	return oldestLive(c.watermark, c.span, c.p.Generations)
}

// generationOf is the generation a record of timestamp ts is remembered
// in: its own, or the oldest live one for a record older than the window.
func (c *Chain) generationOf(ts int64) int64 {
	if c.span == 0 {
		return 0
	}
	if ts >= c.newestStart {
		return c.newestGen
	}
	return max(generation(ts, c.span), c.oldestLive())
}

// page reads page id from the pager for an operation, counts it
// (Stats.PageReads) and checks its length.
func (c *Chain) page(id PageID) ([]byte, error) {
	c.reads++
	return c.readPage(id)
}

// readPage is page without the count.
func (c *Chain) readPage(id PageID) ([]byte, error) {
	pg, err := c.pager.Page(id)
	if err != nil {
		return nil, fmt.Errorf("filter: reading page %d of sub-filter %d: %w", id.Page, id.SubFilter, err)
	}
	if len(pg) != c.p.PageBytes {
		return nil, fmt.Errorf("%w: page %d of sub-filter %d is %d bytes, want %d", ErrCorrupt, id.Page, id.SubFilter, len(pg), c.p.PageBytes)
	}
	return pg, nil
}

// Contains reports whether key may have been inserted: false means it was
// certainly not (no false negatives), true is wrong with probability about
// Stats().EstimatedFPR.
func (c *Chain) Contains(key []byte) (bool, error) {
	c.ops++
	return c.containsHash(c.hash(key))
}

func (c *Chain) containsHash(h uint64) (bool, error) {
	for s := len(c.subs) - 1; s >= 0; s-- {
		if found, err := c.lookup(h, s); err != nil || found {
			return found, err
		}
	}
	return false, nil
}

// Count returns the number of copies of key's fingerprint across the chain
// (CF.COUNT): at least the number of Adds of key not yet deleted, more when
// other keys share its fingerprint and buckets.
func (c *Chain) Count(key []byte) (int, error) { return c.CountHash(c.Hash(key)) }

// CountHash is Count of the key of hash hh.
func (c *Chain) CountHash(hh Hash) (int, error) {
	c.ops++
	h := uint64(hh)
	n := 0
	for s := len(c.subs) - 1; s >= 0; s-- {
		var pos position
		pg, err := c.open(&pos, h, s)
		if err != nil {
			return 0, err
		}
		n += c.copies(pg, &pos)
	}
	return n, nil
}

// Insert adds key unless the chain may already contain it (CF.ADDNX): it
// returns true when key was added and false when it was (probably) present.
// This is the dedup check-and-insert: false means "duplicate".
// Returns ErrFull when the chain cannot grow. With a window it inserts at
// the watermark; use InsertAt.
func (c *Chain) Insert(key []byte) (bool, error) {
	return c.InsertAt(key, c.watermark)
}

// InsertAt is Insert for a record of timestamp ts (milliseconds since the
// Unix epoch): it advances the watermark to ts and, if key is new, adds it
// to the generation of ts (see Advance). Without a window ts is ignored.
func (c *Chain) InsertAt(key []byte, ts int64) (bool, error) {
	return c.InsertHashAt(c.Hash(key), ts)
}

// InsertHashAt is InsertAt of the key of hash h.
func (c *Chain) InsertHashAt(h Hash, ts int64) (bool, error) {
	c.ops++
	if err := c.at(ts); err != nil {
		return false, err
	}
	return c.insertHash(uint64(h))
}

// at advances the watermark to ts and sets the generation tag of the
// entries the operation stores to the generation of ts.
func (c *Chain) at(ts int64) error {
	if c.gens == nil {
		return nil
	}
	_, err := c.Advance(ts)
	c.tag = c.gens.tag(c.generationOf(ts))
	return err
}

// insertHash is Insert for hash h, into generation tag c.tag.
func (c *Chain) insertHash(h uint64) (bool, error) {
	// The sub-filter the key would go to, the newest, is looked at last,
	// so that its page, just read, takes the key without a second lookup.
	target := len(c.subs) - 1
	for s := target - 1; s >= 0; s-- {
		if found, err := c.lookup(h, s); err != nil || found {
			return false, err
		}
	}
	var pos position
	pg, err := c.open(&pos, h, target)
	if err != nil {
		return false, err
	}
	found, empty := c.probe(pg, &pos)
	if found {
		return false, nil
	}
	if pos.sub.full() {
		return true, c.placeOrGrow(h)
	}
	if empty >= 0 {
		c.store(&pos, pg, empty)
		return true, nil
	}
	return true, c.placeSplitting(h, target, &pos, pg)
}

// maxSplitsPerInsert bounds the page splits one insert makes before it
// gives up on the newest sub-filter (placeOrGrow): a split leaves the
// key's page about half full, where an eviction walk finds room unless the
// key's buckets are full of copies of one fingerprint, which no further
// split would part. An insert therefore changes at most
// MaxPagesChangedByInsert pages.
const maxSplitsPerInsert = 1

// splitKicks bounds the eviction walk of an insert into a page that can
// split: after it fails, the page splits (placeSplitting). Params.MaxKicks
// bounds the walk only where no split can follow (a page at the
// sub-filter's deepest, an older sub-filter), before the key goes to
// another sub-filter. A walk that fails runs to its bound and is rolled
// back, and the walks that succeed near a page's fill run long: at 500
// kicks, growing a partition to 10M keys flat out spent 3.0 µs of CPU and
// wrote 114 B to Badger a record, against 2.6 µs and 44 B at 64
// (docs/bench/HISTORY.md, "The walk before a split"). The price is load: the first
// page splits at about 0.83-0.86 of the sub-filter's load instead of
// 0.88-0.89, and the mean bits of pages a key over 2M-200M keys go from
// 31.4 to 32.3.
// At most maxMarkedKicks, so that a walk before a split changes slots,
// never a page whole.
const splitKicks = 64

// placeSplitting places pos's key (hash h) in sub-filter s, whose page pg
// has no empty slot in the key's buckets: by an eviction walk (of at most
// splitKicks kicks while the page can split, MaxKicks once it cannot),
// else by splitting the page and placing it in the key's half, else in
// another sub-filter (placeOrGrow).
func (c *Chain) placeSplitting(h uint64, s int, pos *position, pg []byte) error {
	for splits := 0; ; splits++ {
		canSplit := splits < maxSplitsPerInsert && pos.sub.splits(pos)
		kicks := c.p.MaxKicks
		if canSplit {
			kicks = min(kicks, splitKicks)
		} else if c.gens != nil && s == len(c.subs)-1 && s > 0 {
			// A window's older sub-filters get slots back as generations
			// expire: a free slot there is cheaper than a walk of MaxKicks
			// in a page that cannot split, most of which fail when the
			// newest sub-filter is near full at its deepest. (A chain of
			// one sub-filter reads no other page.)
			placed, err := c.placeOlder(h)
			if err != nil || placed {
				return err
			}
			if pg, err = c.open(pos, h, s); err != nil {
				return err
			}
		}
		if c.placeIn(pos, pg, kicks) {
			return nil
		}
		if !canSplit {
			return c.placeOrGrow(h)
		}
		if err := c.split(pos, pg); err != nil {
			return err
		}
		var err error
		if pg, err = c.open(pos, h, s); err != nil {
			return err
		}
	}
}

// split splits the page of pos (pg, at depth d) in two: entries whose next
// hash bit is 0 stay in it, those whose bit is 1 move to page
// pos.id.Page + RootPages*2^d, each into the slot it had, with the bit
// dropped from its prefix. A bucket of at most b entries gives two of at
// most b, and an entry's other bucket, from its tag alone, is the same
// slot pair in either page: no entry is kicked or rehashed. Both pages are
// written whole (MarkDirty).
func (c *Chain) split(pos *position, pg []byte) error {
	sf := pos.sub
	f, k := sf.slotBits, sf.tagBits
	tagMask := uint32(1)<<k - 1
	if cap(c.scratch) < len(pg) {
		c.scratch = make([]byte, len(pg))
	}
	right := c.scratch[:len(pg)]
	clear(right)
	slots := int(sf.bucketsPerPage) * c.p.BucketSize
	// An entry without prefix bits left cannot be in a page that may
	// split (it would be at the deepest): refuse the page before changing
	// any of it.
	for i := range slots {
		if v := get(pg, i*f, f); v != 0 && sf.fingerprint(v)>>k <= 1 {
			return fmt.Errorf("%w: entry without prefix bits in page %d of sub-filter %d at depth %d", ErrCorrupt, pos.id.Page, sf.ID, pos.depth)
		}
	}
	for i := range slots {
		off := i * f
		v := get(pg, off, f)
		if v == 0 {
			continue
		}
		if sf.free(v) {
			set(pg, off, f, 0) // expired: reclaimed
			continue
		}
		fp := sf.fingerprint(v)
		rest := fp >> k
		nv := v&^fpMask(sf.FingerprintBits) | fp&tagMask | rest>>1<<k
		if rest&1 != 0 {
			set(pg, off, f, 0)
			set(right, off, f, nv)
		} else {
			set(pg, off, f, nv)
		}
	}
	c.pager.MarkDirty(pos.id, pg)
	rid := PageID{SubFilter: sf.ID, Page: pos.id.Page + uint32(sf.RootPages<<pos.depth)}
	rp, err := c.page(rid)
	if err != nil {
		return err
	}
	copy(rp, right)
	c.pager.MarkDirty(rid, rp)
	sf.grew(uint64(pos.id.Page), uint64(rid.Page), pos.depth)
	return nil
}

// grew records that page left, at depth d, split into left and right.
func (s *SubFilter) grew(left, right uint64, d int) {
	if right >= uint64(len(s.depths)) {
		// Exactly up to the highest page number in use, as the metadata
		// stores them: the sweep's positions (pagePositions) are the same
		// in a chain opened again.
		s.depths = append(s.depths, make([]uint8, right+1-uint64(len(s.depths)))...)
	}
	s.depths[left], s.depths[right] = uint8(d+1), uint8(d+1)
	s.atDepth[d]--
	s.atDepth[d+1] += 2
	s.Pages++
	for s.minDepth < s.maxDepth && s.atDepth[s.minDepth] == 0 {
		s.minDepth++
	}
}

// lookup reports whether sub-filter s may hold h.
func (c *Chain) lookup(h uint64, s int) (bool, error) {
	var pos position
	pg, err := c.open(&pos, h, s)
	if err != nil {
		return false, err
	}
	return c.holds(pg, &pos), nil
}

// Add inserts a copy of key's fingerprint whether or not it is present
// (CF.ADD), for counting occurrences. A bucket pair holds at most 2b copies
// of one fingerprint; more copies of one key go to older sub-filters with
// room, else to a new one (placeOrGrow).
// Returns ErrFull when the chain cannot grow. With a window it adds at the
// watermark; use AddAt.
func (c *Chain) Add(key []byte) error {
	return c.AddAt(key, c.watermark)
}

// AddAt is Add for a record of timestamp ts: it advances the watermark to
// ts and adds the copy to the generation of ts.
func (c *Chain) AddAt(key []byte, ts int64) error { return c.AddHashAt(c.Hash(key), ts) }

// AddHashAt is AddAt of the key of hash h.
func (c *Chain) AddHashAt(h Hash, ts int64) error {
	c.ops++
	if err := c.at(ts); err != nil {
		return err
	}
	return c.addHash(uint64(h))
}

// Refresh re-remembers key for a record of timestamp ts (sliding expiry):
// it advances the watermark to ts and, if the oldest copy of key's
// fingerprint lies in a generation older than that of ts, moves it there
// by rewriting its generation tag in place, so that the key lives a
// window past ts. The number of copies is unchanged. It reports whether a
// copy moved. Like Delete it may move another key's matching fingerprint
// instead (probability about the false-positive rate), which only keeps
// that key longer. Without a window it does nothing. It reads one page per
// sub-filter and changes at most one slot; errors are the Pager's.
func (c *Chain) Refresh(key []byte, ts int64) (bool, error) {
	if c.span == 0 {
		return false, nil
	}
	return c.RefreshHash(c.Hash(key), ts)
}

// RefreshHash is Refresh of the key of hash hh.
func (c *Chain) RefreshHash(hh Hash, ts int64) (bool, error) {
	if c.span == 0 {
		return false, nil
	}
	c.ops++
	if err := c.at(ts); err != nil {
		return false, err
	}
	h := uint64(hh)
	// The oldest live copy: the greatest age, the newest sub-filter's
	// first on a tie.
	best, bestOff, bestAge := -1, -1, c.gens.age(c.tag)
	for s := len(c.subs) - 1; s >= 0; s-- {
		var pos position
		pg, err := c.open(&pos, h, s)
		if err != nil {
			return false, err
		}
		w := pos.sub.slotBits
		for _, b := range [2]int{pos.b1, pos.b2} {
			for i := range c.p.BucketSize {
				off := b + i*w
				if v := get(pg, off, w); pos.matches(v) {
					if a := c.gens.age(v >> pos.sub.FingerprintBits); a > bestAge {
						best, bestOff, bestAge = s, off, a
					}
				}
			}
		}
	}
	if best < 0 {
		return false, nil
	}
	var pos position
	pg, err := c.open(&pos, h, best)
	if err != nil {
		return false, err
	}
	sf := pos.sub
	v := get(pg, bestOff, sf.slotBits)
	d := max(pos.depth-(sf.maxDepth-prefixLen(sf.fingerprint(v), sf.tagBits)), 0)
	nv := sf.fingerprint(v) | c.tag<<sf.FingerprintBits
	sf.count(v, d, -1)
	set(pg, bestOff, sf.slotBits, nv)
	c.markSlot(pos.id, pg, bestOff, sf.slotBits)
	sf.count(nv, d, 1)
	return true, nil
}

// addHash adds h's fingerprint, with generation tag c.tag: to the newest
// sub-filter, splitting its page if need be, else to an older one or a new
// one (placeOrGrow).
func (c *Chain) addHash(h uint64) error {
	newest := len(c.subs) - 1
	var pos position
	pg, err := c.open(&pos, h, newest)
	if err != nil {
		return err
	}
	if pos.sub.full() {
		return c.placeOrGrow(h)
	}
	return c.placeSplitting(h, newest, &pos, pg)
}

// placeOrGrow places h, which the newest sub-filter could not take (its
// page at the deepest and full, or its share of the false-positive target
// spent): in an older sub-filter with a free slot in h's buckets and a
// share left (newest first: the slots deletes and expiry freed), else in
// a new sub-filter (grow).
func (c *Chain) placeOrGrow(h uint64) error {
	if placed, err := c.placeOlder(h); err != nil || placed {
		return err
	}
	return c.grow(h)
}

// placeOlder places h in a free slot of its buckets in a sub-filter older
// than the newest with a share left, newest first, and reports whether it
// did.
func (c *Chain) placeOlder(h uint64) (bool, error) {
	for s := len(c.subs) - 2; s >= 0; s-- {
		if c.subs[s].full() {
			continue
		}
		var pos position
		pg, err := c.open(&pos, h, s)
		if err != nil {
			return false, err
		}
		if c.placeEmpty(&pos, pg) {
			return true, nil
		}
	}
	return false, nil
}

// freeShare is the least share of the false-positive budget (0, 1, ...)
// that no sub-filter of the chain has, other than but: a new sub-filter
// takes it, so that the shares of the live sub-filters are distinct terms
// of the geometric budget and add up to at most the target however many
// sub-filters a window dropped (without a window, the next index).
func (c *Chain) freeShare(but int) int {
	for i := 0; ; i++ {
		if i != but && !slices.ContainsFunc(c.subs, func(s SubFilter) bool { return s.share == i }) {
			return i
		}
	}
}

// grow appends a sub-filter with Expansion times the root pages of the
// newest, which could not take h, and places h there.
func (c *Chain) grow(h uint64) error {
	n := len(c.subs)
	if n == MaxSubFilters {
		return fmt.Errorf("%w: %d sub-filters", ErrFull, MaxSubFilters)
	}
	c.subs = append(c.subs, c.subFilter(c.freeShare(-1), c.p.nextPages(c.subs[n-1].RootPages)))
	ok, err := c.place(h, n)
	if err == nil && !ok {
		// An empty sub-filter has room in the key's primary bucket.
		err = fmt.Errorf("%w: no room in a new sub-filter", ErrCorrupt)
	}
	return err
}

// Delete removes one copy of key's fingerprint, newest sub-filter first
// and, in a sub-filter, the matching entry with the longest fingerprint,
// and reports whether it found one. Deleting a key that was never inserted,
// or one whose copy is in an older sub-filter than another key's matching
// entry, can remove that other key's entry instead (RedisBloom's "false
// deletion", with probability about the false-positive rate); in dedup
// that forwards one later duplicate of the other key, it never loses an
// event.
func (c *Chain) Delete(key []byte) (bool, error) {
	c.ops++
	h := c.hash(key)
	for s := len(c.subs) - 1; s >= 0; s-- {
		if removed, err := c.removeCopy(h, s); err != nil || removed {
			return removed, err
		}
	}
	return false, nil
}

// DeleteAll removes every entry matching key, in every sub-filter (one
// page of each), and returns how many it removed: every copy Add stored,
// and any other key's matching entry (a false deletion, see Delete).
func (c *Chain) DeleteAll(key []byte) (int, error) { return c.DeleteAllHash(c.Hash(key)) }

// DeleteAllHash is DeleteAll of the key of hash hh.
func (c *Chain) DeleteAllHash(hh Hash) (int, error) {
	c.ops++
	h := uint64(hh)
	n := 0
	for s := len(c.subs) - 1; s >= 0; s-- {
		var pos position
		pg, err := c.open(&pos, h, s)
		if err != nil {
			return n, err
		}
		f := pos.sub.slotBits
		for _, b := range [2]int{pos.b1, pos.b2} {
			for i := range c.p.BucketSize {
				off := b + i*f
				if v := get(pg, off, f); pos.matches(v) {
					c.remove(&pos, pg, off, v)
					n++
				}
			}
		}
	}
	return n, nil
}

// remove empties the slot at bit offset off of pos's page pg, which holds
// entry v, and uncounts it.
func (c *Chain) remove(pos *position, pg []byte, off int, v uint32) {
	sf := pos.sub
	// The depth the entry was inserted at: its page's, less the splits
	// since, which took one prefix bit each.
	d := pos.depth - (sf.maxDepth - prefixLen(sf.fingerprint(v), sf.tagBits))
	set(pg, off, sf.slotBits, 0)
	c.markSlot(pos.id, pg, off, sf.slotBits)
	sf.count(v, max(d, 0), -1)
}

// removeCopy empties the slot of sub-filter s holding the longest entry
// matching h and reports whether it found one.
func (c *Chain) removeCopy(h uint64, s int) (bool, error) {
	var pos position
	pg, err := c.open(&pos, h, s)
	if err != nil {
		return false, err
	}
	off := c.longest(pg, &pos)
	if off < 0 {
		return false, nil
	}
	c.remove(&pos, pg, off, get(pg, off, pos.sub.slotBits))
	return true, nil
}
