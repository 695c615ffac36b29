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
// that altLocal has a partner for each; the odd whole-bucket counts (455
// with 18-bit slots) leave their last bucket unused. A page of one bucket (the
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
	if p := (Params{FingerprintBits: 18}).WithDefaults(); p.PageBytes*8/(p.BucketSize*18) != 455 || p.bucketsPerPage(18) != 454 {
		t.Fatalf("18-bit slots: %d buckets a page", p.bucketsPerPage(18))
	}
	if odd == 0 {
		t.Fatal("no odd whole-bucket count was covered")
	}
}

// TestKeysHold2bCopies adds 2b copies of each of 25 keys to a one-page
// sub-filter of 18-bit slots, 455 whole buckets (odd: the last one is
// unused, so that no key's alternate is its primary bucket, under which a
// key had b slots and its (b+1)th copy grew the chain): each key holds
// its 2b copies in its two buckets without a split or a new sub-filter,
// and all are counted and deleted.
func TestKeysHold2bCopies(t *testing.T) {
	c, _ := newMem(t, Params{FingerprintBits: 18, Capacity: 1000})
	sf := c.subs[0]
	b := c.p.BucketSize
	if whole := uint64(c.p.PageBytes * 8 / (b * sf.FingerprintBits)); sf.Pages != 1 || whole != 455 {
		t.Fatalf("%d pages of %d whole buckets, want 1 of 455", sf.Pages, whole)
	}
	for i := range 25 {
		k := key("hot", i)
		for range 2 * b {
			if err := c.Add(k); err != nil {
				t.Fatal(err)
			}
		}
		if got := len(c.subs); got != 1 || c.subs[0].Pages != 1 {
			t.Fatalf("key %s: %d copies grew the chain to %d sub-filters, %d pages", k, 2*b, got, c.subs[0].Pages)
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
