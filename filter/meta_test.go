package filter

import (
	"reflect"
	"testing"
	"time"
)

// askedPager is a MemPager that records every page the chain asks
// for.
type askedPager struct {
	*MemPager
	asked map[PageID]bool
}

func (r *askedPager) Page(id PageID) ([]byte, error) {
	r.asked[id] = true
	return r.MemPager.Page(id)
}

// TestMetaHasPage builds a windowed chain that grows and drops
// generations, then checks HasPage and TotalPages against its
// sub-filters: every page the chain asked for since the last drop is one
// HasPage accepts, a dropped sub-filter's pages, a page past a sub-filter's
// count and a sub-filter not yet made are not, and Marshal round-trips.
func TestMetaHasPage(t *testing.T) {
	p := Params{FingerprintBits: 16, Capacity: 64, PageBytes: 512, Window: 4 * time.Second, Generations: 2}
	pager := &askedPager{MemPager: NewMemPager(512), asked: map[PageID]bool{}}
	c, err := NewWithSeed(p, testSeed, pager)
	if err != nil {
		t.Fatal(err)
	}
	span := p.WithDefaults().SpanMillis()
	// A burst of keys in generation 0 fills a sub-filter grown to its
	// deepest and appends another; a window later the first holds no live
	// entry and is dropped; a second burst, in generation 5, appends a
	// third.
	i := 0
	for gen := range int64(6) {
		n := 1000
		switch gen {
		case 0:
			n = 40_000
		case 5:
			n = 52_000
		}
		for range n {
			first := c.subs[0].ID
			if _, err := c.InsertAt(key("k", i), gen*span); err != nil {
				t.Fatal(err)
			}
			if c.subs[0].ID != first {
				clear(pager.asked) // the dropped sub-filter's pages are no longer the chain's
			}
			i++
		}
	}
	m, err := DecodeMeta(c.MarshalMeta())
	if err != nil {
		t.Fatal(err)
	}
	if m.SubFilters[0].ID == 0 || len(m.SubFilters) < 2 {
		t.Fatalf("sub-filters %+v: the test needs dropped and grown ones", m.SubFilters)
	}
	var total uint64
	for _, s := range c.SubFilters() {
		total += s.Pages
	}
	if m.TotalPages() != total {
		t.Fatalf("TotalPages = %d, want %d", m.TotalPages(), total)
	}
	for id := range pager.asked {
		if !m.HasPage(id) {
			t.Fatalf("the chain asked for %+v, HasPage says it is not the chain's", id)
		}
	}
	first, last := m.SubFilters[0], m.SubFilters[len(m.SubFilters)-1]
	// The highest page number in use, and one below it not in use (a
	// child of a page that did not split).
	inUse, unused := uint32(0), uint32(1<<32-1)
	for k := uint32(len(last.depths)) - 1; k > 0; k-- {
		if _, ok := last.Depth(k); ok && inUse == 0 {
			inUse = k
		} else if !ok && unused == 1<<32-1 {
			unused = k
		}
	}
	if inUse < uint32(last.RootPages) || unused == 1<<32-1 {
		t.Fatalf("newest sub-filter %+v: the test needs split and unsplit pages", last)
	}
	for _, tc := range []struct {
		name string
		id   PageID
		want bool
	}{
		{"first page of the oldest live sub-filter", PageID{SubFilter: first.ID}, true},
		{"highest page of the newest", PageID{SubFilter: last.ID, Page: inUse}, true},
		{"a page of the newest not split off", PageID{SubFilter: last.ID, Page: unused}, false},
		{"past the newest's page numbers", PageID{SubFilter: last.ID, Page: uint32(len(last.depths))}, false},
		{"a dropped sub-filter", PageID{SubFilter: first.ID - 1}, false},
		{"the next sub-filter ID", PageID{SubFilter: m.NextID}, false},
		{"far past every count", PageID{SubFilter: first.ID, Page: 1<<32 - 1}, false},
	} {
		if got := m.HasPage(tc.id); got != tc.want {
			t.Errorf("%s: HasPage(%+v) = %t, want %t", tc.name, tc.id, got, tc.want)
		}
	}
	again, err := DecodeMeta(m.Marshal())
	if err != nil || !reflect.DeepEqual(again, m) {
		t.Fatalf("DecodeMeta(Marshal()) = %+v, %v; want %+v", again, err, m)
	}
}
