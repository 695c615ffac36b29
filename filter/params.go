package filter

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"strconv"
	"strings"
	"time"

	"github.com/kdedup/kdedup/internal/optcheck"
)

// Defaults of Params; a zero field means its default.
const (
	DefaultTargetFPR  = 1e-4
	DefaultBucketSize = 4
	DefaultCapacity   = 1_000_000
	DefaultMaxKicks   = 500
	DefaultExpansion  = 2
	DefaultPageBytes  = 4096
	// DefaultGenerations is the number of generations a window is cut into
	// when Params.Window is set and Params.Generations is not.
	DefaultGenerations = 8
	// MaxGenerations bounds Params.Generations.
	MaxGenerations = 64
	// MaxMaxKicks bounds Params.MaxKicks: a longer eviction walk costs more
	// than the sub-filter it would spare.
	MaxMaxKicks = 100_000
	// MaxExpansion bounds Params.Expansion.
	MaxExpansion = 64
	// MaxPageBytes bounds Params.PageBytes (1 MiB): with BucketSize 2 and
	// 4-bit fingerprints such a page holds 2^20 buckets, as many as a
	// sub-filter has pages, and the page index and the bucket inside the
	// page share the low 32 bits of the hash (Chain.position). Stores and
	// callers may bound pages tighter for their own reasons
	// (store.MaxPageBytes).
	MaxPageBytes = 1 << 20
)

// ValidBucketSize reports whether b slots per bucket is a BucketSize that
// Validate accepts: 2, 4 or 8, the sizes the paper measures (Fan et al.
// 2014, section 5.1).
func ValidBucketSize(b int) bool { return b == 2 || b == 4 || b == 8 }

// MinPageBytes is the smallest Params.PageBytes that Validate accepts with
// bucketSize slots per bucket: two buckets of the widest (32-bit)
// fingerprints, since a key's two buckets are distinct buckets of one page.
func MinPageBytes(bucketSize int) int {
	return 2 * bucketSize * MaxFingerprintBits / 8
}

// Fingerprint widths a sub-filter may use, in bits.
const (
	MinFingerprintBits = 4
	MaxFingerprintBits = 32
)

// MaxSubFilters bounds the chain. RedisBloom stops at 32 expansions by
// default; with tightened fingerprints the width reaches 32 bits long before
// this bound (see Params.SubFilterBits).
const MaxSubFilters = 64

// maxPageBits bounds a sub-filter to 2^20 pages, so that the page index and
// the bucket inside the page both come from the low 32 bits of the hash,
// leaving the high 32 bits to the fingerprint.
const maxPageBits = 20

// MaxDepth is the number of times a sub-filter doubles in place, by
// splitting its pages, before the chain appends another (256 times its
// root pages): the design of InfiniFilter (Dayan et al., SIGMOD 2023) and
// Taffy filters (Apple 2022), with linear hashing's page numbering. An
// entry stores up to MaxDepth bits of prefix, one of which each split
// consumes.
const MaxDepth = 8

// minTagBits is the least tag width that leaves a slot room for prefix
// bits: below MaxDepth+minTagBits+1 bits a sub-filter splits fewer times.
const minTagBits = 8

// depthBits splits a slot of width w into the tag and the prefix: the
// sub-filter doubles in place maxDepth times, and an entry is a tag of
// tagBits bits, maxDepth prefix bits and a terminating 1 bit. A wide slot
// keeps MaxDepth splits and gives the tag the rest; a narrow one keeps a
// tag of minTagBits bits (w-1 below that) and splits fewer times.
func depthBits(w int) (maxDepth, tagBits int) {
	maxDepth = min(max(w-1-minTagBits, 0), MaxDepth)
	return maxDepth, w - 1 - maxDepth
}

// tightening is the ratio r of the geometric false-positive budget: sub-filter
// i may contribute TargetFPR*(1-r)*r^i (see SubFilterBits).
const tightening = 0.5

// Params are the parameters of a chain. They are written in the chain
// metadata; Open refuses state written with other Params (a *ParamsError
// listing each that differs, see Diff).
type Params struct {
	// TargetFPR is the false-positive rate the whole chain must stay under
	// as it grows (default 1e-4): each new sub-filter gets a narrower share
	// of it and a wider fingerprint (SubFilterBits). Ignored when
	// FingerprintBits is set.
	TargetFPR float64
	// FingerprintBits, when set, fixes every sub-filter's fingerprint
	// width (4 to 32 bits) instead of deriving widths from TargetFPR; the
	// chain's false-positive rate then grows with every sub-filter, as
	// RedisBloom's does.
	FingerprintBits int
	// BucketSize is the number of slots per bucket b: 2, 4 or 8 (default 4).
	// The paper's maximum load is 84% at b=2, 95% at b=4 and 98% at b=8.
	BucketSize int
	// Capacity is the number of keys the first sub-filter is sized for
	// (default 1,000,000); its page count is rounded up to whole pages.
	Capacity uint64
	// MaxKicks is the length limit of an eviction walk in a page that
	// cannot split (at its sub-filter's deepest, or in an older
	// sub-filter) before the key goes to another sub-filter (default 500,
	// as RedisBloom's MAXITERATIONS). A page that can split does after
	// at most min(MaxKicks, 64) kicks.
	MaxKicks int
	// Expansion is how many times more root pages each new sub-filter
	// starts with than the newest one, once that one has doubled in
	// place MaxDepth times or spent its share of TargetFPR (default 2; 1
	// keeps the size).
	Expansion int
	// PageBytes is the size of a page in bytes (default 4096): a power of
	// two holding at least two buckets of 32-bit fingerprints. 2-4 KiB pages
	// store 96-98% useful bytes in an LSM store (Kvrocks PR #3481 review).
	PageBytes int
	// Window, when set, makes the chain forget keys by record timestamp:
	// the timeline is cut into generations of Window/Generations (the
	// span, in whole milliseconds), a key's entry is tagged with the
	// generation of its record's timestamp, and a generation expires once
	// the highest timestamp seen (the watermark) is a window past its end:
	// its entries match nothing from then on and their slots are free. A
	// key is therefore remembered while the watermark is less than a window
	// past its timestamp, and forgotten once it is a window plus one span
	// past it. 0 (default) remembers every key until it is deleted. See
	// Chain.Advance for late and out-of-order timestamps.
	Window time.Duration
	// Generations is how many generations a window holds (default 8 when
	// Window is set, 1 to 64): more generations expire keys closer to the
	// window (the overshoot is one span) at the price of a wider
	// generation tag in every slot (GenerationBits: 2 bits for 1 or 2
	// generations, 3 up to 6, 4 up to 14, 5 up to 30, 6 up to 62, 7
	// above).
	Generations int
	// KeySpec names how the caller derives the keys it inserts (dedup
	// stores its key spec, KDEDUP_KEY, here; default empty). The filter does
	// not interpret it: it is stored with the other Params so that state
	// holding keys derived one way is refused when opened to hold keys
	// derived another, whose fingerprints would match nothing. At most
	// 65,535 bytes.
	KeySpec string
}

// maxKeySpecBytes bounds Params.KeySpec (its length is stored in 16 bits).
const maxKeySpecBytes = 1<<16 - 1

// WithDefaults returns p with every zero field set to its default.
func (p Params) WithDefaults() Params {
	if p.TargetFPR == 0 && p.FingerprintBits == 0 {
		p.TargetFPR = DefaultTargetFPR
	}
	if p.FingerprintBits != 0 {
		p.TargetFPR = 0 // the explicit width wins; keep one encoding per state
	}
	if p.BucketSize == 0 {
		p.BucketSize = DefaultBucketSize
	}
	if p.Capacity == 0 {
		p.Capacity = DefaultCapacity
	}
	if p.MaxKicks == 0 {
		p.MaxKicks = DefaultMaxKicks
	}
	if p.Expansion == 0 {
		p.Expansion = DefaultExpansion
	}
	if p.PageBytes == 0 {
		p.PageBytes = DefaultPageBytes
	}
	if p.Window == 0 {
		p.Generations = 0 // one encoding per state
	} else if p.Generations == 0 {
		p.Generations = DefaultGenerations
	}
	return p
}

// ErrInvalidParams is wrapped by Validate's error (an *optcheck.Error whose
// problems name Params fields), and so by New's and Open's.
var ErrInvalidParams = errors.New("filter: invalid parameters")

// Validate reports every invalid field of p, as given, in one
// *optcheck.Error wrapping ErrInvalidParams, each problem naming the field
// (its Go name: "BucketSize"). It does not apply defaults: a zero field
// that should mean its default needs WithDefaults first, as New and Open
// do (Pebble's EnsureDefaults, then Validate); a caller that sets every
// field (kdedup's config) validates its values as they are. A rule that
// relates two fields is skipped while either is invalid. The limits are
// the filter's own: what its page layout and hashing can represent; a
// caller may support a narrower range.
func (p Params) Validate() error {
	l := optcheck.New(ErrInvalidParams)
	if p.FingerprintBits != 0 && (p.FingerprintBits < MinFingerprintBits || p.FingerprintBits > MaxFingerprintBits) {
		l.Add("FingerprintBits", p.FingerprintBits, fmt.Sprintf("must be 0 (derived from the target false-positive rate) or from %d to %d", MinFingerprintBits, MaxFingerprintBits))
	}
	// With a fixed width the rate is not used, and 0 leaves it unset.
	if (p.FingerprintBits == 0 || p.TargetFPR != 0) && !(p.TargetFPR > 0 && p.TargetFPR < 1) {
		l.Add("TargetFPR", p.TargetFPR, "must be between 0 and 1, such as 0.0001")
	}
	if p.Capacity < 1 {
		l.Add("Capacity", p.Capacity, "must be at least 1 key")
	}
	if !ValidBucketSize(p.BucketSize) {
		l.Add("BucketSize", p.BucketSize, "must be 2, 4 or 8")
	}
	if p.MaxKicks < 1 || p.MaxKicks > MaxMaxKicks {
		l.Add("MaxKicks", p.MaxKicks, fmt.Sprintf("must be from 1 to %d", MaxMaxKicks))
	}
	if p.Expansion < 1 || p.Expansion > MaxExpansion {
		l.Add("Expansion", p.Expansion, fmt.Sprintf("must be from 1 to %d", MaxExpansion))
	}
	if p.PageBytes <= 0 || p.PageBytes&(p.PageBytes-1) != 0 || p.PageBytes > MaxPageBytes {
		l.Add("PageBytes", p.PageBytes, fmt.Sprintf("must be a power of two up to %d bytes", MaxPageBytes))
	} else if !l.Has("BucketSize") && p.PageBytes < MinPageBytes(p.BucketSize) {
		// A key's two buckets are distinct buckets of one page.
		l.Add("PageBytes", p.PageBytes, fmt.Sprintf("must hold two buckets of %d-bit fingerprints, %d bytes", MaxFingerprintBits, MinPageBytes(p.BucketSize)))
	}
	if p.Window < 0 {
		l.Add("Window", p.Window, "must not be negative; 0 remembers keys until they are deleted")
	}
	if p.Window > 0 && (p.Generations < 1 || p.Generations > MaxGenerations) {
		l.Add("Generations", p.Generations, fmt.Sprintf("must be from 1 to %d", MaxGenerations))
	} else if p.Window > 0 && p.Window.Milliseconds() < int64(p.Generations) {
		l.Add("Window", p.Window, fmt.Sprintf("must be at least one millisecond per generation (%d)", p.Generations))
	}
	if p.Window > 0 && !l.Has("Generations") && !l.Has("FingerprintBits") && p.FingerprintBits > p.maxFingerprintBits() {
		l.Add("FingerprintBits", p.FingerprintBits, fmt.Sprintf("must be at most %d with a window of %d generations: a slot holds 32 bits, %d of them the generation tag", p.maxFingerprintBits(), p.Generations, p.genBits()))
	}
	if len(p.KeySpec) > maxKeySpecBytes {
		l.Add("KeySpec", fmt.Sprintf("(%d bytes)", len(p.KeySpec)), fmt.Sprintf("must be at most %d bytes", maxKeySpecBytes))
	}
	if l.Err() == nil && p.Capacity > p.MaxCapacity() {
		l.Add("Capacity", p.Capacity, fmt.Sprintf("must be at most %d keys with %d-byte pages and %d-bit fingerprints: the first sub-filter holds at most 2^%d pages; raise the page size or lower the capacity",
			p.MaxCapacity(), p.PageBytes, p.SubFilterBits(0), maxPageBits))
	}
	return l.Err()
}

// MaxCapacity is the largest Capacity that Validate accepts with p's other
// fields (after defaults): the first sub-filter has at most 2^20 pages, so
// the bound grows with PageBytes and shrinks as the first sub-filter's
// fingerprints widen (TargetFPR, FingerprintBits, Window and Generations).
// About 1.9 billion keys at the defaults (4 KiB pages, 18-bit
// fingerprints). It returns 0 when a field it depends on is invalid.
func (p Params) MaxCapacity() uint64 {
	p = p.WithDefaults()
	switch {
	case p.BucketSize < 1, p.PageBytes < 1, p.SubFilterBits(0) < MinFingerprintBits:
		return 0
	}
	perPage := p.bucketsPerPage(p.slotBits(0)) * uint64(p.BucketSize)
	return perPage << maxPageBits
}

// String formats p as name=value pairs, one per Param in AllParams order.
func (p Params) String() string {
	var b strings.Builder
	for i, f := range p.values() {
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%s=%s", f.param, f.value)
	}
	return b.String()
}

// Param names one field of Params, as String and Diff print it. The
// caller that sets a field from its own configuration names it its own
// way (kdedup maps each to its KDEDUP_* variable).
type Param string

// The fields of Params.
const (
	ParamTargetFPR       Param = "target_fpr"
	ParamFingerprintBits Param = "fingerprint_bits"
	ParamBucketSize      Param = "bucket_size"
	ParamCapacity        Param = "capacity"
	ParamMaxKicks        Param = "max_kicks"
	ParamExpansion       Param = "expansion"
	ParamPageBytes       Param = "page_bytes"
	ParamWindow          Param = "window"
	ParamGenerations     Param = "generations"
	ParamKeySpec         Param = "key"
)

// AllParams returns every Param, in the order of Params' fields: what a
// caller naming them must cover.
func AllParams() []Param {
	return []Param{ParamTargetFPR, ParamFingerprintBits, ParamBucketSize, ParamCapacity, ParamMaxKicks,
		ParamExpansion, ParamPageBytes, ParamWindow, ParamGenerations, ParamKeySpec}
}

// paramValue is one field of Params, formatted.
type paramValue struct {
	param Param
	value string
}

// values formats every field of p in AllParams order: numbers in decimal
// (%g for the rate), the window as a time.Duration, the key spec quoted.
func (p Params) values() []paramValue {
	return []paramValue{
		{ParamTargetFPR, fmt.Sprintf("%g", p.TargetFPR)},
		{ParamFingerprintBits, strconv.Itoa(p.FingerprintBits)},
		{ParamBucketSize, strconv.Itoa(p.BucketSize)},
		{ParamCapacity, strconv.FormatUint(p.Capacity, 10)},
		{ParamMaxKicks, strconv.Itoa(p.MaxKicks)},
		{ParamExpansion, strconv.Itoa(p.Expansion)},
		{ParamPageBytes, strconv.Itoa(p.PageBytes)},
		{ParamWindow, p.Window.String()},
		{ParamGenerations, strconv.Itoa(p.Generations)},
		{ParamKeySpec, strconv.Quote(p.KeySpec)},
	}
}

// ParamDiff is one parameter whose stored value differs from the
// configured one, both formatted as String formats them.
type ParamDiff struct {
	Param              Param
	Stored, Configured string
}

// String formats d as "capacity stored 1000000, configured 2000000".
func (d ParamDiff) String() string {
	return fmt.Sprintf("%s stored %s, configured %s", d.Param, d.Stored, d.Configured)
}

// Diff returns the parameters in which p, the Params a state was written
// with, differs from configured, in AllParams order: empty exactly when a
// state written with p opens with configured (p.WithDefaults() ==
// configured.WithDefaults()). Both are compared after defaults, and a
// field the state does not depend on is left out, so that each difference
// listed is one to restore: TargetFPR only when p derives widths from it
// (FingerprintBits 0), configured as given (or its default) even when
// configured fixes FingerprintBits; Generations only when both have a
// Window.
func (p Params) Diff(configured Params) []ParamDiff {
	p = p.WithDefaults()
	c := configured.WithDefaults()
	switch {
	case p.FingerprintBits != 0:
		c.TargetFPR = p.TargetFPR // ignored by the state: FingerprintBits tells
	case configured.TargetFPR != 0:
		// WithDefaults drops TargetFPR with FingerprintBits set; the state
		// needs the rate it was written with whatever replaces it.
		c.TargetFPR = configured.TargetFPR
	default:
		c.TargetFPR = DefaultTargetFPR
	}
	if p.Window == 0 || c.Window == 0 {
		c.Generations = p.Generations // Window differs, or neither has one
	}
	var diffs []ParamDiff
	stored, conf := p.values(), c.values()
	for i := range stored {
		if stored[i] != conf[i] {
			diffs = append(diffs, ParamDiff{Param: stored[i].param, Stored: stored[i].value, Configured: conf[i].value})
		}
	}
	return diffs
}

// The generation arithmetic of a window: the chain, the rebuild planning of
// a consumer and the inspection tools all compute generations with these,
// so that they cannot disagree.

// SpanMillis is the record time one generation covers, in milliseconds:
// Window/Generations after defaults, rounded down to whole milliseconds
// (Validate makes it at least 1); 0 without a window.
func (p Params) SpanMillis() int64 { return p.WithDefaults().spanMillis() }

// Generation is the generation of record timestamp ts (milliseconds since
// the Unix epoch): ⌊ts/span⌋, so that generation g holds the timestamps
// [GenerationStart(g), GenerationStart(g+1)); 0 without a window. A chain
// keeps a record older than the window in its oldest live generation
// instead (Chain.Advance).
func (p Params) Generation(ts int64) int64 { return generation(ts, p.WithDefaults().spanMillis()) }

// OldestLive is the oldest generation live when the watermark, the highest
// record timestamp seen, is watermark (milliseconds since the Unix epoch):
// Generation(watermark) minus Generations, since the generation the
// watermark is in and the Generations before it are live (G+1); a chain
// has dropped every older one. 0 without a window. The watermark must be
// above math.MinInt64 + Generations*span, which every record timestamp is.
func (p Params) OldestLive(watermark int64) int64 {
	p = p.WithDefaults()
	return oldestLive(watermark, p.spanMillis(), p.Generations)
}

// GenerationStart is the first record timestamp of generation gen, in
// milliseconds since the Unix epoch: gen*span; 0 without a window.
func (p Params) GenerationStart(gen int64) int64 { return gen * p.WithDefaults().spanMillis() }

// spanMillis is SpanMillis of p with its defaults already applied.
func (p Params) spanMillis() int64 {
	if p.Window <= 0 || p.Generations <= 0 {
		return 0
	}
	return p.Window.Milliseconds() / int64(p.Generations)
}

// generation is Params.Generation for a span in milliseconds (0: no
// window).
func generation(ts, span int64) int64 {
	if span == 0 {
		return 0
	}
	return floorDiv(ts, span)
}

// oldestLive is Params.OldestLive for a span in milliseconds (0: no
// window) and g generations.
func oldestLive(watermark, span int64, g int) int64 {
	if span == 0 {
		return 0
	}
	return floorDiv(watermark, span) - int64(g)
}

// floorDiv is a/b rounded towards negative infinity: timestamps before the
// epoch (-1 for a record without one) fall in negative generations.
func floorDiv(a, b int64) int64 {
	q := a / b
	if (a%b != 0) && ((a < 0) != (b < 0)) {
		q--
	}
	return q
}

// GenerationBits is the width of the generation tag each entry of a
// windowed chain stores beside its fingerprint (0 without a window): the
// least t with 2^t >= Generations+2, 4 bits at the default 8 generations.
// G+1 generations are live at once; the tags of the generations that
// expired before them are told apart by age modulo 2^t, and the chain
// clears every entry of an expired generation before its tag comes back
// (Chain.Advance), which needs one tag value beyond the live ones.
func (p Params) GenerationBits() int {
	p = p.WithDefaults()
	return p.genBits()
}

// genBits is GenerationBits of p with its defaults already applied.
func (p Params) genBits() int {
	if p.spanMillis() == 0 {
		return 0
	}
	return bits.Len(uint(p.Generations + 1))
}

// maxFingerprintBits is the widest fingerprint a slot of p holds: 32 bits
// less the generation tag.
func (p Params) maxFingerprintBits() int { return MaxFingerprintBits - p.genBits() }

// SlotBits is the width of a slot of sub-filter i: its fingerprint
// (SubFilterBits) and the generation tag (GenerationBits).
func (p Params) SlotBits(i int) int {
	p = p.WithDefaults()
	return p.slotBits(i)
}

func (p Params) slotBits(i int) int { return p.SubFilterBits(i) + p.genBits() }

// SubFilterBits is the fingerprint width W of sub-filter i of the chain
// (0 is its oldest): the bits of an entry that hold its key's hash. A slot
// holds W bits and, with a window, the generation tag (SlotBits).
//
// With FingerprintBits set it is that width. Otherwise the chain keeps its
// false-positive rate under TargetFPR by a geometric budget, as scalable
// Bloom filters do (Almeida et al. 2007): sub-filter i may contribute
// ε_i = ε(1-r)r^i with r = 1/2, and Σ ε_i = ε(1-r)/(1-r) = ε for any
// number of sub-filters. A sub-filter that doubled d times in place at
// load α holds entries of d+1 ages: those inserted at depth i keep
// W-1+i bits, and about a half of its entries are the newest, a quarter
// one doubling older and so on, so its rate is about 2bα(2+d)/2^W
// (SubFilter.EstimatedFPR is the exact sum). Hence
//
//	W_i = ⌈log2(2b(MaxDepth+2)/ε_i)⌉ = ⌈log2(2b(MaxDepth+2)/ε) + 1 + i⌉
//
// bits: 21 for the first sub-filter with b=4 and ε=1e-4, 22 for the
// second, and so on, clamped to 4..32 bits (less the generation tag with a
// window); past that the chain can no longer keep the target, and
// Stats.EstimatedFPR shows by how much. A sub-filter whose estimated rate
// reaches ε_i takes no more keys (the chain appends the next), unless its
// width is clamped: the next would be no wider.
//
// A window does not change the widths: a lookup probes one page per
// sub-filter whatever the generations, and an expired entry matches
// nothing, so the budget is the one of a chain without a window holding
// the live keys; the generation tag costs GenerationBits more per slot.
func (p Params) SubFilterBits(i int) int {
	if p.FingerprintBits != 0 {
		return p.FingerprintBits
	}
	f := math.Ceil(math.Log2(2 * float64(p.BucketSize) * (MaxDepth + 2) / p.subFilterShare(i)))
	if !(f < float64(p.maxFingerprintBits())) { // +Inf for a share that underflowed
		return p.maxFingerprintBits()
	}
	return max(int(f), MinFingerprintBits)
}

// subFilterShare is ε_i, the false-positive rate sub-filter i may reach
// (SubFilterBits); +Inf with FingerprintBits set.
func (p Params) subFilterShare(i int) float64 {
	if p.FingerprintBits != 0 {
		return math.Inf(1)
	}
	return p.TargetFPR * (1 - tightening) * math.Pow(tightening, float64(i))
}

// derive sets the fields of sf, with share i of the budget, that follow
// from Params and its width: the split of its slots, the buckets per page
// and the weight at which it has spent its share of the target.
func (p Params) derive(sf *SubFilter, i int) {
	sf.share = i
	sf.maxDepth, sf.tagBits = depthBits(sf.FingerprintBits)
	sf.slotBits = sf.FingerprintBits + p.genBits()
	sf.fpMask = fpMask(sf.FingerprintBits)
	sf.bucketsPerPage = p.bucketsPerPage(sf.slotBits)
	share := p.subFilterShare(i)
	limit := share * float64(sf.bucketsPerPage) * float64(sf.RootPages) * math.Exp2(float64(sf.FingerprintBits-2+sf.maxDepth))
	// A width clamped at MaxFingerprintBits cannot keep its share, and the
	// sub-filters after it are no wider: they would each take no key. Such
	// a chain grows as one of fixed widths, over the target
	// (Stats.EstimatedFPR shows by how much).
	clamped := math.Log2(2*float64(p.BucketSize)*(MaxDepth+2)/share) > float64(p.maxFingerprintBits())
	if clamped || limit >= math.MaxUint64/2 || math.IsInf(limit, 1) {
		sf.maxWeight = math.MaxUint64
	} else {
		sf.maxWeight = uint64(limit)
	}
}

// bucketsPerPage is how many buckets of f-bit slots (SlotBits) a page holds:
// not a power of two in general, as slots are bit-packed, but even,
// so that every bucket has a partner other than itself (altLocal). An odd
// count leaves the page's last bucket unused: 1/391 of the slots at the
// defaults. Validate makes it at least 2.
func (p Params) bucketsPerPage(f int) uint64 {
	return uint64(p.PageBytes*8/(p.BucketSize*f)) &^ 1
}

// firstPages is the root page count of a chain's first sub-filter:
// enough pages for Capacity keys at a load of 1 (any count; the page
// index is a multiply-shift, see Chain.locate). It grows in place from
// there.
func (p Params) firstPages() uint64 {
	perPage := p.bucketsPerPage(p.slotBits(0)) * uint64(p.BucketSize)
	return max(1, (p.Capacity+perPage-1)/perPage)
}

// nextPages is the root page count of the sub-filter appended after one
// of n root pages: Expansion times n, at most 2^20. It grows in place
// from there, as its predecessor did.
func (p Params) nextPages(n uint64) uint64 {
	return min(n*uint64(p.Expansion), 1<<maxPageBits)
}

// ExpectedFPR is the false-positive rate bound of one sub-filter with bucket
// size b, f-bit fingerprints and the given load factor: 2*b*load/2^f (Fan et
// al. section 5.1: a lookup compares 2b fingerprints, each matching with
// probability 1/2^f).
func ExpectedFPR(bucketSize, fingerprintBits int, load float64) float64 {
	return 2 * float64(bucketSize) * load / math.Exp2(float64(fingerprintBits))
}
