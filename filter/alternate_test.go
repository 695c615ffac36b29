package filter

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// TestAltLocalIsAFixedPointFreeInvolution checks, for every bucket i of
// pages of n buckets and many fingerprints, that the alternate bucket is
// in the page, differs from i, and leads back to i: the eviction walk
// relies on the last, a key's 2b slots on the second. n is even by
// construction (Params.bucketsPerPage); odd counts of whole buckets, 455 at
// the defaults and 1 for the smallest pages, are checked below.
func TestAltLocalIsAFixedPointFreeInvolution(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	fps := []uint32{1, 2, 3, 0xffff, 0x3ffff, 0xffffffff}
	for range 2000 {
		fps = append(fps, rng.Uint32()|1)
	}
	for _, n := range []uint64{2, 4, 6, 10, 128, 454, 456, 512, 1 << 14} {
		t.Run(fmt.Sprintf("n=%d", n), func(t *testing.T) {
			for i := range n {
				for _, fp := range fps {
					a := altLocal(i, fp, n)
					switch {
					case a >= n:
						t.Fatalf("alt(%d, %#x) = %d, outside the page", i, fp, a)
					case a == i:
						t.Fatalf("alt(%d, %#x) = %d, the primary bucket", i, fp, a)
					case altLocal(a, fp, n) != i:
						t.Fatalf("alt(alt(%d, %#x)) = %d", i, fp, altLocal(a, fp, n))
					}
				}
			}
		})
	}
}

// TestBucketsPerPageEvenAndAtLeastTwo covers every valid page size, bucket
// size and width: a page has an even number of buckets, at least two, so
// that altLocal has a partner for each; the odd whole-bucket counts (455 at
// the defaults) leave their last bucket unused. A page of one bucket (the
// smallest pages of 32-bit fingerprints) is refused by Validate: a key
// would have one bucket and b slots.
func TestBucketsPerPageEvenAndAtLeastTwo(t *testing.T) {
	odd := 0
	for pageBytes := 8; pageBytes <= 1<<20; pageBytes *= 2 {
		for _, b := range []int{2, 4, 8} {
			p := Params{FingerprintBits: 8, BucketSize: b, PageBytes: pageBytes}.WithDefaults()
			whole := pageBytes * 8 / (b * MaxFingerprintBits)
			if err := p.Validate(); (err != nil) != (whole < 2) {
				t.Fatalf("page bytes %d, b=%d: %d whole buckets of 32 bits, Validate: %v", pageBytes, b, whole, err)
			}
			if whole < 2 {
				continue
			}
			for f := MinFingerprintBits; f <= MaxFingerprintBits; f++ {
				whole := uint64(pageBytes * 8 / (b * f))
				n := p.bucketsPerPage(f)
				if n%2 != 0 || n < 2 || n > whole || whole-n > 1 {
					t.Fatalf("page bytes %d, b=%d, f=%d: %d buckets of %d whole", pageBytes, b, f, n, whole)
				}
				if whole%2 == 1 {
					odd++
				}
			}
		}
	}
	if p := (Params{}).WithDefaults(); p.PageBytes*8/(p.BucketSize*p.SubFilterBits(0)) != 455 || p.bucketsPerPage(p.SubFilterBits(0)) != 454 {
		t.Fatalf("defaults: %d buckets a page", p.bucketsPerPage(p.SubFilterBits(0)))
	}
	if odd == 0 {
		t.Fatal("no odd whole-bucket count was covered")
	}
}

// TestKeysOnceSelfPairedHold2bCopies takes keys whose alternate bucket
// equalled their primary one under the former alternate, (m - i) mod n
// over the 455 whole buckets of a default page: such a key had b slots,
// so its (b+1)th copy grew the chain, and with MAX_OCCURRENCES between b+1
// and 2b every hot key among them added a sub-filter. Now each holds 2b
// copies in one sub-filter, and all are counted and deleted.
func TestKeysOnceSelfPairedHold2bCopies(t *testing.T) {
	c, _ := newMem(t, Params{Capacity: 1000}) // one page, 18-bit fingerprints
	sf := c.subs[0]
	b := c.p.BucketSize
	whole := uint64(c.p.PageBytes * 8 / (b * sf.FingerprintBits))
	if sf.Pages != 1 || whole != 455 {
		t.Fatalf("%d pages of %d whole buckets, want 1 of 455", sf.Pages, whole)
	}
	formerPrimaryIsAlternate := func(k []byte) bool {
		h := c.hash(k)
		i := (uint64(uint32(h)) * sf.Pages & 0xffffffff * whole) >> 32
		fp := max(uint32(h>>32)&fpMask(sf.FingerprintBits), 1)
		m := ((uint64(fp) * 0x9e3779b97f4a7c15) >> 32) * whole >> 32
		return (m+whole-i)%whole == i
	}
	found := 0
	for i := 0; found < 25; i++ {
		k := key("hot", i)
		if !formerPrimaryIsAlternate(k) {
			continue
		}
		found++
		for range 2 * b {
			if err := c.Add(k); err != nil {
				t.Fatal(err)
			}
		}
		if got := len(c.subs); got != 1 {
			t.Fatalf("key %s: %d copies grew the chain to %d sub-filters", k, 2*b, got)
		}
		if n, err := c.Count(k); err != nil || n != 2*b {
			t.Fatalf("key %s: Count = %d, %v; want %d", k, n, err, 2*b)
		}
		for range 2 * b {
			if ok, err := c.Delete(k); err != nil || !ok {
				t.Fatalf("key %s: Delete = %v, %v", k, ok, err)
			}
		}
		if c.subs[0].Items != 0 {
			t.Fatalf("key %s: %d items left", k, c.subs[0].Items)
		}
	}
}
