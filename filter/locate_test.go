package filter

import (
	"slices"
	"testing"
	"time"
)

// TestLocate checks Locate against where the keys were put, with 32-bit
// fingerprints so that no other key matches:
//   - on a chain that grew in place several times, every inserted key is found
//     in exactly one sub-filter with one copy, and the keys found in each
//     sub-filter number its Items;
//   - copies added with Add are found where they went, and their sum is
//     Count;
//   - with a window, a key is found in the generation of its timestamp;
//   - a key never inserted is found nowhere.
func TestLocate(t *testing.T) {
	t.Run("chain", func(t *testing.T) {
		c, _ := newMem(t, Params{FingerprintBits: 32, Capacity: 500, PageBytes: 512, MaxKicks: 50})
		const n = 5000
		for i := range n {
			if _, err := c.Insert(key("k", i)); err != nil {
				t.Fatal(err)
			}
		}
		subs := c.SubFilters()
		if subs[0].Pages < 4*subs[0].RootPages {
			t.Fatalf("sub-filter of %d pages from %d root pages, want one grown in place", subs[0].Pages, subs[0].RootPages)
		}
		perSub := map[uint32]uint64{}
		for i := range n {
			locs := must(c.Locate(key("k", i)))
			if len(locs) != 1 || locs[0].Copies != 1 {
				t.Fatalf("Locate(k%d) = %+v, want one copy in one sub-filter", i, locs)
			}
			perSub[locs[0].SubFilter.ID]++
		}
		for _, sf := range subs {
			if perSub[sf.ID] != sf.Items {
				t.Errorf("sub-filter %d: %d keys located, Items %d", sf.ID, perSub[sf.ID], sf.Items)
			}
		}
		for i := range 1000 {
			if locs := must(c.Locate(key("absent", i))); len(locs) != 0 {
				t.Fatalf("Locate(absent%d) = %+v, want nothing", i, locs)
			}
		}

		// Copies: 2b copies fill a bucket pair, the next goes to a new
		// sub-filter.
		hot := []byte("hot")
		for range 2*c.Params().BucketSize + 1 {
			if err := c.Add(hot); err != nil {
				t.Fatal(err)
			}
		}
		locs := must(c.Locate(hot))
		total := 0
		for i, l := range locs {
			total += l.Copies
			if i > 0 && l.SubFilter.ID <= locs[i-1].SubFilter.ID {
				t.Errorf("locations not oldest first: %+v", locs)
			}
		}
		if count := must(c.Count(hot)); total != count || count != 2*c.Params().BucketSize+1 {
			t.Errorf("Locate copies %d, Count %d, want %d", total, count, 2*c.Params().BucketSize+1)
		}
	})

	t.Run("window", func(t *testing.T) {
		p := Params{FingerprintBits: 29, Capacity: 1000, PageBytes: 512, Window: 8 * time.Second, Generations: 4}
		c, _ := newMem(t, p)
		span := int64(2000) // ms
		for i := range 100 {
			ts := int64(i) * 100 // 10 s of record time: generations 0 to 4
			if added := must(c.InsertAt(key("k", i), ts)); !added {
				t.Fatalf("InsertAt(k%d) found it present", i)
			}
		}
		for i := range 100 {
			locs := must(c.Locate(key("k", i)))
			want := int64(i) * 100 / span
			if len(locs) != 1 || !slices.Equal(locs[0].Generations, []int64{want}) || locs[0].Copies != 1 {
				t.Errorf("Locate(k%d) = %+v, want one copy in generation %d", i, locs, want)
			}
		}
	})

	t.Run("empty windowed chain", func(t *testing.T) {
		c, _ := newMem(t, Params{Window: time.Hour})
		if locs := must(c.Locate([]byte("x"))); locs != nil {
			t.Errorf("Locate on a chain without sub-filters = %+v", locs)
		}
	})
}
