package filter

import (
	"bytes"
	"fmt"
	"testing"
)

// pageCallCounter is a MemPager that counts its Page calls.
type pageCallCounter struct {
	*MemPager
	calls int
}

func (c *pageCallCounter) Page(id PageID) ([]byte, error) { c.calls++; return c.MemPager.Page(id) }

// TestPrefetchBucketsChangesNothing: PrefetchBuckets is a hint. Over a
// chain of several sub-filters it asks its Pager for no page (it peeks),
// changes no page and no decision: two chains fed the same keys, one with
// a prefetch of each key a few keys ahead, hold the same pages and answer
// the same. Through an Overlay it peeks at staged copies and stages none.
func TestPrefetchBucketsChangesNothing(t *testing.T) {
	p := Params{Capacity: 2000, FingerprintBits: 12, PageBytes: 512}
	mk := func() (*Chain, *pageCallCounter) {
		pg := &pageCallCounter{MemPager: NewMemPager(512)}
		c, err := NewWithSeed(p, testSeed, pg)
		if err != nil {
			t.Fatal(err)
		}
		return c, pg
	}
	plain, _ := mk()
	hinted, hp := mk()
	keys := make([][]byte, 20000)
	for i := range keys {
		keys[i] = fmt.Appendf(nil, "key-%d", i%15000)
	}
	for i, k := range keys {
		if i+4 < len(keys) {
			before := hp.calls
			hinted.PrefetchBuckets(keys[i+4])
			if hp.calls != before {
				t.Fatalf("key %d: PrefetchBuckets asked the Pager for %d pages", i, hp.calls-before)
			}
		}
		a, err := plain.Insert(k)
		if err != nil {
			t.Fatal(err)
		}
		b, err := hinted.Insert(k)
		if err != nil {
			t.Fatal(err)
		}
		if a != b {
			t.Fatalf("key %d %s: inserted %v with prefetch, %v without", i, k, b, a)
		}
	}
	if !grown(plain) || plain.subs[0].Pages < 4*plain.subs[0].RootPages {
		t.Fatalf("%d sub-filters, the first of %d pages: want a chain that grew", plain.Len(), plain.subs[0].Pages)
	}
	pa, pb := plain.pager.(*pageCallCounter).Pages(), hp.Pages()
	if len(pa) != len(pb) {
		t.Fatalf("%d pages with prefetch, %d without", len(pb), len(pa))
	}
	for id, pg := range pa {
		if !bytes.Equal(pg, pb[id]) {
			t.Fatalf("page %v differs with prefetch", id)
		}
	}

	o := NewOverlay(NewMemPager(512))
	c, err := NewWithSeed(p, testSeed, o)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Insert([]byte("a")); err != nil {
		t.Fatal(err)
	}
	staged := o.Staged()
	c.PrefetchBuckets([]byte("b"))
	c.PrefetchBuckets([]byte("a"))
	if o.Staged() != staged {
		t.Fatalf("PrefetchBuckets through an Overlay staged %d pages", o.Staged()-staged)
	}
}
