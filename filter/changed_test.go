package filter

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"
)

// rangePager is a MemPager that records how pages were reported changed:
// the byte ranges given to MarkChanged per page, and the pages given to
// MarkDirty (whole-page changes).
type rangePager struct {
	*MemPager
	ranges map[PageID][][2]int
	whole  map[PageID]bool
}

func newRangePager(pageBytes int) *rangePager {
	return &rangePager{MemPager: NewMemPager(pageBytes), ranges: map[PageID][][2]int{}, whole: map[PageID]bool{}}
}

func (r *rangePager) MarkDirty(id PageID, page []byte) {
	r.whole[id] = true
	r.MemPager.MarkDirty(id, page)
}

func (r *rangePager) MarkChanged(id PageID, page []byte, off, n int) {
	r.ranges[id] = append(r.ranges[id], [2]int{off, off + n})
	r.MemPager.MarkDirty(id, page)
}

func (r *rangePager) reset() { clear(r.ranges); clear(r.whole) }

// snapshot copies every page of m.
func snapshot(m *MemPager) map[PageID][]byte {
	s := map[PageID][]byte{}
	for id, pg := range m.Pages() {
		s[id] = bytes.Clone(pg)
	}
	return s
}

// TestChainReportsChangedBytes checks that inserts and deletes, eviction
// walks included, report every byte they change through MarkChanged (a
// page as a whole only after a long eviction walk, rarely), directly and through an Overlay's Commit: a byte
// of a page that differs after a round lies in a range reported for it,
// and the ranges cover few bytes per operation (a slot's bytes each, not a
// page). Nothing reaches the base before the Overlay commits, and a
// discarded round reports nothing.
func TestChainReportsChangedBytes(t *testing.T) {
	for _, staged := range []bool{false, true} {
		t.Run(fmt.Sprintf("staged=%t", staged), func(t *testing.T) {
			const pb = 512
			p := Params{FingerprintBits: 12, Capacity: 4000, PageBytes: pb, MaxKicks: 50}
			base := newRangePager(pb)
			var pager Pager = base
			var ov *Overlay
			if staged {
				ov = NewOverlay(base)
				pager = ov
			}
			c, err := NewWithSeed(p, testSeed, pager)
			if err != nil {
				t.Fatal(err)
			}
			rng := rand.New(rand.NewPCG(5, 6))
			next := 0
			for round := range 60 {
				before := snapshot(base.MemPager)
				base.reset()
				ops := 1 + rng.IntN(150)
				for range ops {
					if rng.IntN(6) == 0 && next > 0 {
						if _, err := c.Delete(key("k", rng.IntN(next))); err != nil {
							t.Fatal(err)
						}
						continue
					}
					if _, err := c.Insert(key("k", next)); err != nil {
						t.Fatal(err)
					}
					next++
				}
				if staged {
					if len(base.ranges)+len(base.whole) != 0 {
						t.Fatalf("round %d: the base saw changes before the Overlay committed", round)
					}
					if round%5 == 4 {
						ov.Discard()
						if len(base.ranges)+len(base.whole) != 0 {
							t.Fatalf("round %d: a discarded round reported changes", round)
						}
						continue // the chain is now ahead of the base; only bytes reported matter below
					}
					if err := ov.Commit(); err != nil {
						t.Fatal(err)
					}
				}
				// Only an eviction walk of maxMarkedKicks or more reports its
				// page whole; those are rare.
				if len(base.whole) > len(base.ranges)/10 {
					t.Fatalf("round %d: %d pages reported changed as a whole, %d by ranges", round, len(base.whole), len(base.ranges))
				}
				covered := 0
				for id, pg := range base.Pages() {
					if base.whole[id] {
						continue
					}
					old := before[id]
					if old == nil {
						old = make([]byte, pb)
					}
					for i := range pg {
						if pg[i] == old[i] {
							continue
						}
						in := false
						for _, r := range base.ranges[id] {
							in = in || (r[0] <= i && i < r[1])
						}
						if !in {
							t.Fatalf("round %d: byte %d of %v changed outside every reported range %v", round, i, id, base.ranges[id])
						}
					}
					for _, r := range base.ranges[id] {
						covered += r[1] - r[0]
					}
				}
				// A 12-bit slot spans at most 3 bytes; a round changes at most
				// MaxKicks+1 slots per operation, far fewer on average.
				if covered > 3*ops*(p.MaxKicks+1) || covered == 0 {
					t.Fatalf("round %d: %d bytes reported for %d operations", round, covered, ops)
				}
			}
			if st := c.Stats(); st.Items == 0 {
				t.Fatal("nothing inserted")
			}
		})
	}
}
