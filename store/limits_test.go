package store

import "testing"

// MaxFlushBytes is the boundary of what Open accepts, for every page size
// config allows.
func TestMaxFlushBytes(t *testing.T) {
	for _, pb := range []int{512, 1024, 4096, 64 << 10} {
		most := MaxFlushBytes(pb)
		if most < int64(pb) {
			t.Fatalf("PageBytes %d: MaxFlushBytes %d is below one page", pb, most)
		}
		ok := Options{InMemory: true, PageBytes: pb, FlushBytes: most}.withDefaults()
		if err := ok.validate(); err != nil {
			t.Errorf("PageBytes %d: FlushBytes %d (MaxFlushBytes) refused: %v", pb, most, err)
		}
		over := Options{InMemory: true, PageBytes: pb, FlushBytes: most + 1}.withDefaults()
		if err := over.validate(); err == nil {
			t.Errorf("PageBytes %d: FlushBytes %d (MaxFlushBytes+1) accepted", pb, most+1)
		}
	}
	if got := MaxFlushBytes(512); got >= 128<<20 {
		t.Errorf("MaxFlushBytes(512) = %d: 128MiB would fit, yet a write batch of 512B pages that large needs a memtable above 1GiB", got)
	}
}
