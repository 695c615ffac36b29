package filter

import (
	"errors"
	"fmt"
	"math/bits"
)

// Defaults of Params; a zero field means its default.
const (
	DefaultFingerprintBits = 16
	DefaultBucketSize      = 4
	DefaultCapacity        = 1_000_000
	DefaultMaxKicks        = 500
	DefaultExpansion       = 2
	DefaultPageBytes       = 4096
)

// MaxSubFilters bounds the chain. With the default expansion of 2 it is never
// reached in practice (the 64th sub-filter would hold 2^63 times the
// initial capacity); RedisBloom stops at 32 expansions by default.
const MaxSubFilters = 64

// maxBuckets bounds one sub-filter so that bucket indexes never reach the
// high 32 bits of the hash, which belong to the fingerprint.
const maxBuckets = 1 << 32

// Params are the parameters of a chain. They are written in the chain
// metadata; state written with other Params is refused (ErrParams).
type Params struct {
	// FingerprintBits is the fingerprint width f in bits: 8, 16 or 32
	// (default 16). The false-positive rate of a sub-filter is about
	// 2*b*load/2^f.
	FingerprintBits int
	// BucketSize is the number of slots per bucket b: 2, 4 or 8 (default 4).
	// The paper's maximum load is 84% at b=2, 95% at b=4 and 98% at b=8.
	BucketSize int
	// Capacity is the number of keys the first sub-filter is sized for
	// (default 1,000,000); its bucket count is Capacity/BucketSize rounded
	// up to a power of two and to at least one page.
	Capacity uint64
	// MaxKicks is the length limit of an eviction walk before the chain
	// grows (default 500, as RedisBloom's MAXITERATIONS).
	MaxKicks int
	// Expansion is how many times more buckets each new sub-filter has than
	// the newest one (default 2; rounded up to a power of two; 1 keeps the
	// size).
	Expansion int
	// PageBytes is the size of a page in bytes (default 4096): a power of
	// two holding at least one bucket. 2-4 KiB pages store 96-98% useful
	// bytes in an LSM store (Kvrocks PR #3481 review).
	PageBytes int
}

// WithDefaults returns p with every zero field set to its default.
func (p Params) WithDefaults() Params {
	if p.FingerprintBits == 0 {
		p.FingerprintBits = DefaultFingerprintBits
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
	return p
}

// Validate reports every invalid field of p (after defaults) in one error.
func (p Params) Validate() error {
	p = p.WithDefaults()
	var errs []error
	switch p.FingerprintBits {
	case 8, 16, 32:
	default:
		errs = append(errs, fmt.Errorf("filter: fingerprint bits %d: must be 8, 16 or 32", p.FingerprintBits))
	}
	switch p.BucketSize {
	case 2, 4, 8:
	default:
		errs = append(errs, fmt.Errorf("filter: bucket size %d: must be 2, 4 or 8", p.BucketSize))
	}
	if p.Capacity > maxBuckets {
		errs = append(errs, fmt.Errorf("filter: capacity %d: must be at most %d", p.Capacity, uint64(maxBuckets)))
	}
	if p.MaxKicks < 1 || p.MaxKicks > 100_000 {
		errs = append(errs, fmt.Errorf("filter: max kicks %d: must be 1..100000", p.MaxKicks))
	}
	if p.Expansion < 1 || p.Expansion > 64 {
		errs = append(errs, fmt.Errorf("filter: expansion %d: must be 1..64", p.Expansion))
	}
	if p.PageBytes <= 0 || p.PageBytes&(p.PageBytes-1) != 0 || p.PageBytes > 1<<20 {
		errs = append(errs, fmt.Errorf("filter: page bytes %d: must be a power of two up to 1 MiB", p.PageBytes))
	} else if len(errs) == 0 && p.PageBytes < p.bucketBytes() {
		errs = append(errs, fmt.Errorf("filter: page bytes %d: smaller than one bucket (%d bytes)", p.PageBytes, p.bucketBytes()))
	}
	return errors.Join(errs...)
}

// String formats p as the stored-versus-configured comparisons print it.
func (p Params) String() string {
	return fmt.Sprintf("fingerprint_bits=%d bucket_size=%d capacity=%d max_kicks=%d expansion=%d page_bytes=%d",
		p.FingerprintBits, p.BucketSize, p.Capacity, p.MaxKicks, p.Expansion, p.PageBytes)
}

func (p Params) bucketBytes() int { return p.BucketSize * p.FingerprintBits / 8 }

// BucketsPerPage is the number of buckets one page holds.
func (p Params) BucketsPerPage() uint64 {
	p = p.WithDefaults()
	return uint64(p.PageBytes / p.bucketBytes())
}

// firstBuckets is the bucket count of sub-filter 0.
func (p Params) firstBuckets() uint64 {
	n := (p.Capacity + uint64(p.BucketSize) - 1) / uint64(p.BucketSize)
	return max(nextPow2(n), p.BucketsPerPage())
}

// nextBuckets is the bucket count of the sub-filter after one of n buckets.
func (p Params) nextBuckets(n uint64) uint64 {
	return min(nextPow2(n*uint64(p.Expansion)), maxBuckets)
}

func nextPow2(n uint64) uint64 {
	if n <= 1 {
		return 1
	}
	return 1 << (64 - bits.LeadingZeros64(n-1))
}

// ExpectedFPR is the false-positive rate bound of one sub-filter with bucket
// size b, f-bit fingerprints and the given load factor: 2*b*load/2^f (Fan et
// al. section 5.1: a lookup compares 2b fingerprints, each matching with
// probability 1/2^f).
func ExpectedFPR(bucketSize, fingerprintBits int, load float64) float64 {
	return 2 * float64(bucketSize) * load / float64(uint64(1)<<fingerprintBits)
}
