package store

import (
	"testing"

	"github.com/kdedup/kdedup/filter"
)

// MaxFlushBytes is the boundary of what Open accepts, for every page size
// config allows.
func TestMaxFlushBytes(t *testing.T) {
	for _, pb := range []int{512, 1024, 4096, 64 << 10} {
		most := MaxFlushBytes(pb)
		if most < int64(pb) {
			t.Fatalf("PageBytes %d: MaxFlushBytes %d is below one page", pb, most)
		}
		ok := Options{Dir: "data", PageBytes: pb, FlushBytes: most}.withDefaults()
		if err := ok.Validate(); err != nil {
			t.Errorf("PageBytes %d: FlushBytes %d (MaxFlushBytes) refused: %v", pb, most, err)
		}
		over := Options{Dir: "data", PageBytes: pb, FlushBytes: most + 1}.withDefaults()
		if err := over.Validate(); err == nil {
			t.Errorf("PageBytes %d: FlushBytes %d (MaxFlushBytes+1) accepted", pb, most+1)
		}
	}
	// Smaller pages weigh more per byte of FlushBytes (keys and pointers).
	if MaxFlushBytes(512) >= MaxFlushBytes(4096) {
		t.Errorf("MaxFlushBytes(512) = %d, not below MaxFlushBytes(4096) = %d", MaxFlushBytes(512), MaxFlushBytes(4096))
	}
}

// MaxPageBytes is the largest power of two the filter allows whose stored
// value (page and header) stays under Badger's largest ValueThreshold
// (an InMemory store, without a value log, keeps pages in its LSM tree).
func TestMaxPageBytes(t *testing.T) {
	if MaxPageBytes&(MaxPageBytes-1) != 0 || MaxPageBytes > filter.MaxPageBytes {
		t.Fatalf("MaxPageBytes %d: not a power of two up to filter.MaxPageBytes %d", MaxPageBytes, filter.MaxPageBytes)
	}
	if MaxPageBytes+pageBaseHeader >= valueThresholdBytes {
		t.Errorf("a page of MaxPageBytes %d is stored as %d bytes, not under the ValueThreshold %d", MaxPageBytes, MaxPageBytes+pageBaseHeader, valueThresholdBytes)
	}
	if next := 2 * MaxPageBytes; next <= filter.MaxPageBytes && next+pageBaseHeader < valueThresholdBytes {
		t.Errorf("pages of %d bytes would fit too", next)
	}
}
