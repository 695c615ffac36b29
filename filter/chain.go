package filter

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
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

// SubFilter describes one sub-filter of a chain.
type SubFilter struct {
	// ID names the sub-filter's pages (PageID.SubFilter). IDs are given in
	// creation order from 0 and never reused, so that the pages of a
	// dropped generation can be deleted after the metadata that dropped it
	// is durable, without racing a new sub-filter.
	ID uint32
	// Generation is the generation the sub-filter belongs to: with
	// Params.Window, it holds keys whose record timestamps fall in
	// [Generation*span, (Generation+1)*span) milliseconds since the Unix
	// epoch (or later ones, for records older than the window); without a
	// window it is 0.
	Generation int64
	// Pages is the number of pages, 1 to 2^20.
	Pages uint64
	// FingerprintBits is the fingerprint width f of this sub-filter.
	FingerprintBits int
	// Items is the number of fingerprints stored (inserts minus deletes that
	// found a fingerprint).
	Items uint64
	// bucketsPerPage, derived from the width, the bucket size and the page
	// size.
	bucketsPerPage uint64
}

// Buckets is the number of buckets of s.
func (s SubFilter) Buckets() uint64 { return s.Pages * s.bucketsPerPage }

// Slots is the number of slots of s for bucket size b.
func (s SubFilter) Slots(b int) uint64 { return s.Buckets() * uint64(b) }

// Stats summarizes a chain.
type Stats struct {
	SubFilters int
	// Generations is the number of live generations holding sub-filters
	// (1 without a window, 0 for a windowed chain that saw no key yet).
	Generations int
	Items       uint64
	Slots       uint64
	// LoadFactor is Items/Slots over the whole chain.
	LoadFactor float64
	// NewestLoadFactor is the load factor of the newest sub-filter, the
	// one inserts go to first.
	NewestLoadFactor float64
	// EstimatedFPR is the sum over sub-filters of 2*b*load/2^f: the
	// probability that a key never inserted is reported present.
	EstimatedFPR float64
	// Bytes is the size of all pages of the chain (allocated or not).
	Bytes uint64
	// NewestFingerprintBits is the fingerprint width of the newest
	// sub-filter of the newest generation.
	NewestFingerprintBits int
	// Watermark is the highest record timestamp seen, in milliseconds
	// since the Unix epoch (math.MinInt64 before any, and without a
	// window).
	Watermark int64
	// NearFull is set when the newest generation can add at most one more
	// sub-filter before inserts fail (ErrFull) or, with a target rate, before a new
	// sub-filter would need fingerprints wider than 32 bits and the chain
	// would exceed its target.
	NearFull bool
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
	// subs are sorted by generation, oldest first, and by age within one.
	subs      []SubFilter
	nextID    uint32
	watermark int64
	span      int64  // generation span in ms, 0 without a window
	kicks     []kick // reused eviction log
}

// New returns an empty chain with a secret hash seed (RandomSeed). Without
// a window it has one sub-filter sized for p.Capacity; with one, each
// generation gets its first sub-filter when its first key arrives. No page
// is touched until the first insert.
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
	if c.span == 0 {
		c.subs = []SubFilter{c.subFilter(0, 0, p.firstPages())}
	}
	return c, nil
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
	return &Chain{p: p, pager: pager, peeker: peeker, seed: seed, watermark: math.MinInt64, span: p.spanMillis(), kicks: make([]kick, 0, p.MaxKicks)}
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

// subFilter describes a new, empty sub-filter: the i-th of generation gen,
// of the given page count, with the next unused ID.
func (c *Chain) subFilter(gen int64, i int, pages uint64) SubFilter {
	f := c.p.SubFilterBits(i)
	id := c.nextID
	c.nextID++
	return SubFilter{ID: id, Generation: gen, Pages: pages, FingerprintBits: f, bucketsPerPage: c.p.bucketsPerPage(f)}
}

// Params returns the chain's parameters (defaults applied).
func (c *Chain) Params() Params { return c.p }

// SubFilters returns a copy of the chain's sub-filters, oldest first.
func (c *Chain) SubFilters() []SubFilter { return append([]SubFilter(nil), c.subs...) }

// Len returns the number of sub-filters in the chain, every generation's.
func (c *Chain) Len() int { return len(c.subs) }

// Stats returns the chain's load and estimated false-positive rate.
func (c *Chain) Stats() Stats {
	s := Stats{SubFilters: len(c.subs), Watermark: c.watermark}
	if c.span == 0 {
		s.Watermark = math.MinInt64
	}
	b := c.p.BucketSize
	for i, sf := range c.subs {
		slots := sf.Slots(b)
		s.Items += sf.Items
		s.Slots += slots
		s.Bytes += sf.Pages * uint64(c.p.PageBytes)
		s.EstimatedFPR += ExpectedFPR(b, sf.FingerprintBits, float64(sf.Items)/float64(slots))
		if i == 0 || sf.Generation != c.subs[i-1].Generation {
			s.Generations++
		}
	}
	if len(c.subs) == 0 {
		s.NewestFingerprintBits = c.p.SubFilterBits(0)
		return s
	}
	s.LoadFactor = float64(s.Items) / float64(s.Slots)
	newest := c.subs[len(c.subs)-1]
	s.NewestLoadFactor = float64(newest.Items) / float64(newest.Slots(b))
	s.NewestFingerprintBits = newest.FingerprintBits
	lo, hi := c.generation(newest.Generation)
	n := hi - lo
	s.NearFull = n >= MaxSubFilters-1 ||
		(c.p.FingerprintBits == 0 && c.p.SubFilterBits(n+1) >= MaxFingerprintBits && c.p.SubFilterBits(n) >= MaxFingerprintBits)
	return s
}

// generation returns the index range [lo, hi) of the sub-filters of
// generation gen in c.subs (lo == hi, the insertion point, when it has
// none).
func (c *Chain) generation(gen int64) (lo, hi int) {
	if c.span == 0 {
		return 0, len(c.subs) // one generation
	}
	lo = sort.Search(len(c.subs), func(i int) bool { return c.subs[i].Generation >= gen })
	hi = lo
	for hi < len(c.subs) && c.subs[hi].Generation == gen {
		hi++
	}
	return lo, hi
}

// Advance moves the watermark, the highest record timestamp seen (ts, in
// milliseconds since the Unix epoch), to ts if ts is higher, and drops every
// generation that ended a window or more before the new watermark: their
// sub-filters leave the chain and their pages are handed to Pager.Drop. It
// returns the number of generations dropped. Without a window it does
// nothing.
//
// Time is the records' own: the wall clock is never read, so the state stays
// a function of the input and replays reproduce it. Out-of-order records
// are remembered in the generation of their own timestamp while that
// generation is live, so a late key is kept at least a window past its
// timestamp like any other; a record more than a window older than the
// watermark (or with no timestamp, -1) goes to the oldest live generation
// and is kept for at least what remains of that generation's life. A record
// timestamped far in the future moves the watermark there and expires
// everything older than a window before it: producers' clocks matter
// (log-append time on the input topic removes the question).
func (c *Chain) Advance(ts int64) int {
	if c.span == 0 || ts <= c.watermark {
		return 0
	}
	c.watermark = ts
	oldest := c.oldestLive()
	n, dropped := 0, 0
	for n < len(c.subs) && c.subs[n].Generation < oldest {
		if n == 0 || c.subs[n].Generation != c.subs[n-1].Generation {
			dropped++
		}
		c.pager.Drop(c.subs[n].ID)
		n++
	}
	c.subs = append(c.subs[:0], c.subs[n:]...)
	return dropped
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
	return max(generation(ts, c.span), c.oldestLive())
}

// page reads page id from the pager and checks its length.
func (c *Chain) page(id PageID) ([]byte, error) {
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
func (c *Chain) Count(key []byte) (int, error) {
	h := c.hash(key)
	n := 0
	for s := len(c.subs) - 1; s >= 0; s-- {
		var pos position
		pg, err := c.open(&pos, h, s)
		if err != nil {
			return 0, err
		}
		n += c.copies(pg, pos)
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
	c.Advance(ts)
	h := c.hash(key)
	gen := c.generationOf(ts)
	_, hi := c.generation(gen)
	// The sub-filter the key would go to is looked at last, so that its
	// page, just read, takes the key without a second lookup.
	target := hi - 1
	if target < 0 || c.subs[target].Generation != gen {
		target = -1
	}
	for s := len(c.subs) - 1; s >= 0; s-- {
		if s == target {
			continue
		}
		if found, err := c.lookup(h, s); err != nil || found {
			return false, err
		}
	}
	if target >= 0 {
		var pos position
		pg, err := c.open(&pos, h, target)
		if err != nil {
			return false, err
		}
		found, empty := c.probe(pg, pos)
		if found {
			return false, nil
		}
		if empty >= 0 {
			set(pg, empty, pos.sub.FingerprintBits, pos.fp)
			c.markSlot(pos.id, pg, empty, pos.sub.FingerprintBits)
			c.subs[target].Items++
			return true, nil
		}
		if c.placeIn(h, target, pos, pg) {
			return true, nil
		}
		return true, c.placeOrGrow(h, gen)
	}
	return true, c.grow(h, gen)
}

// lookup reports whether sub-filter s may hold h.
func (c *Chain) lookup(h uint64, s int) (bool, error) {
	var pos position
	pg, err := c.open(&pos, h, s)
	if err != nil {
		return false, err
	}
	f, bs := pos.sub.FingerprintBits, c.p.BucketSize
	// Both buckets are loaded before either is compared, so that their two
	// cache misses overlap.
	w1, w2 := loadBucket(pg, pos.b1, bs*f), loadBucket(pg, pos.b2, bs*f)
	if w1.ok && w2.ok {
		for k := range bs {
			if w1.slot(k, f) == pos.fp || w2.slot(k, f) == pos.fp {
				return true, nil
			}
		}
		return false, nil
	}
	return c.find(pg, pos.b1, f, pos.fp) >= 0 || c.find(pg, pos.b2, f, pos.fp) >= 0, nil
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
func (c *Chain) AddAt(key []byte, ts int64) error {
	c.Advance(ts)
	return c.addHash(c.hash(key), c.generationOf(ts))
}

// Refresh re-remembers key for a record of timestamp ts (sliding expiry):
// it advances the watermark to ts and, if the oldest copy of key's
// fingerprint lies in a generation older than that of ts, moves it there
// (a Delete from the old generation and an Add to the new one), so that
// the key lives a window past ts. The number of copies is unchanged. It
// reports whether a copy moved. Like Delete it may move another key's
// matching fingerprint instead (probability about the false-positive
// rate), which only keeps that key longer. Without a window it does
// nothing. When the generation of ts is full it returns ErrFull and leaves
// the copy where it was.
func (c *Chain) Refresh(key []byte, ts int64) (bool, error) {
	if c.span == 0 {
		return false, nil
	}
	c.Advance(ts)
	h := c.hash(key)
	gen := c.generationOf(ts)
	for s := range c.subs {
		if c.subs[s].Generation >= gen {
			break
		}
		removed, err := c.removeCopy(h, s)
		if err != nil {
			return false, err
		}
		if !removed {
			continue
		}
		err = c.addHash(h, gen)
		if errors.Is(err, ErrFull) {
			// Put the copy back in the slot it just left, so that a
			// full generation leaves the key remembered where it was.
			if ok, perr := c.place(h, s); perr != nil || !ok {
				return false, fmt.Errorf("%w: restoring a copy after %w", ErrCorrupt, err)
			}
			return false, err
		}
		return err == nil, err
	}
	return false, nil
}

// addHash adds h's fingerprint to generation gen: to its newest sub-filter,
// else to an older one or a new one (placeOrGrow), or to a new one when gen
// has none yet.
func (c *Chain) addHash(h uint64, gen int64) error {
	if lo, hi := c.generation(gen); hi > lo {
		ok, err := c.place(h, hi-1)
		if err != nil || ok {
			return err
		}
		return c.placeOrGrow(h, gen)
	}
	return c.grow(h, gen)
}

// maxFallbackWalks is the most older sub-filters placeOrGrow walks in
// for one key (their empty slots are all tried).
const maxFallbackWalks = 4

// placeOrGrow places h in generation gen, whose newest sub-filter could
// not take it: in an older sub-filter of gen if one has room (an empty
// slot in one of h's buckets, newest first, then an eviction walk, newest
// first), else in a new sub-filter (grow).
//
// With buckets local to a page, the newest sub-filter fails its first
// insert when its fullest page overflows, at a load of 0.88 to 0.90 over
// 1,000 to 20,000 pages of 4 KiB (b = 4), not at the 0.95 a cuckoo filter
// reaches over the whole table (Fan et al. section 5.1); a chain that grew
// on that first failure left every sub-filter at that load and grew one
// step early. Filling the older sub-filters first lets the chain grow only
// once a key's buckets are full in every sub-filter of its generation and
// no walk in the newest five of them finds room, and
// reuses the slots deletes free in older sub-filters. Every sub-filter's
// fingerprint width is sized for a load of 1 (Params.SubFilterBits), so
// the false-positive bound holds at any load.
//
// An insert walks in at most maxFallbackWalks older sub-filters, so that a
// chain of many sub-filters near their maximum load (Expansion 1, or a
// full chain that can no longer grow) costs an insert at most
// (1 + maxFallbackWalks) x MaxKicks kicks, not one walk per sub-filter.
func (c *Chain) placeOrGrow(h uint64, gen int64) error {
	lo, hi := c.generation(gen)
	for s := hi - 2; s >= lo; s-- {
		var pos position
		pg, err := c.open(&pos, h, s)
		if err != nil {
			return err
		}
		if c.placeEmpty(s, pos, pg) {
			return nil
		}
	}
	for s := hi - 2; s >= max(lo, hi-1-maxFallbackWalks); s-- {
		if ok, err := c.place(h, s); err != nil || ok {
			return err
		}
	}
	return c.grow(h, gen)
}

// grow appends a sub-filter to generation gen (its first, or one Expansion
// times the size of its newest, which could not take h) and places h there.
func (c *Chain) grow(h uint64, gen int64) error {
	lo, hi := c.generation(gen)
	if hi-lo == MaxSubFilters {
		return fmt.Errorf("%w: %d sub-filters", ErrFull, MaxSubFilters)
	}
	pages := c.p.firstPages()
	if hi > lo {
		pages = c.p.nextPages(c.subs[hi-1].Pages)
	}
	c.subs = slices.Insert(c.subs, hi, c.subFilter(gen, hi-lo, pages))
	ok, err := c.place(h, hi)
	if err == nil && !ok {
		// An empty sub-filter has room in the key's primary bucket.
		err = fmt.Errorf("%w: no room in a new sub-filter", ErrCorrupt)
	}
	return err
}

// Delete removes one copy of key's fingerprint, newest sub-filter first, and
// reports whether it found one. Deleting a key that was never inserted can
// remove another key's matching fingerprint (RedisBloom's "false deletion");
// in dedup that forwards one later duplicate of that other key, it never
// loses an event.
func (c *Chain) Delete(key []byte) (bool, error) {
	h := c.hash(key)
	for s := len(c.subs) - 1; s >= 0; s-- {
		if removed, err := c.removeCopy(h, s); err != nil || removed {
			return removed, err
		}
	}
	return false, nil
}

// removeCopy empties one slot of sub-filter s holding h's fingerprint and
// reports whether it found one.
func (c *Chain) removeCopy(h uint64, s int) (bool, error) {
	var pos position
	pg, err := c.open(&pos, h, s)
	if err != nil {
		return false, err
	}
	f := pos.sub.FingerprintBits
	off := c.find(pg, pos.b1, f, pos.fp)
	if off < 0 {
		off = c.find(pg, pos.b2, f, pos.fp)
	}
	if off < 0 {
		return false, nil
	}
	set(pg, off, f, 0)
	c.markSlot(pos.id, pg, off, f)
	if c.subs[s].Items > 0 { // a corrupt page can hold more than Items says
		c.subs[s].Items--
	}
	return true, nil
}
