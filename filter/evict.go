package filter

// Eviction: placing a fingerprint in a sub-filter whose candidate buckets
// are full by moving others to their alternate buckets (Fan et al.
// Algorithm 1), deterministically, so that replays reproduce the state.

// kick is one step of an eviction walk, logged so that a walk that fails
// can be rolled back.
type kick struct {
	slot int    // bit offset of the slot in the page
	old  uint32 // entry the slot held before the kick
}

// place stores h's fingerprint in sub-filter s: in an empty slot of either
// candidate bucket, else by an eviction walk. A walk that fails after MaxKicks
// is rolled back and place returns false with the page unchanged.
func (c *Chain) place(h uint64, s int) (bool, error) {
	var pos position
	pg, err := c.open(&pos, h, s)
	if err != nil {
		return false, err
	}
	return c.placeIn(&pos, pg, c.p.MaxKicks), nil
}

// placeEmpty stores pos's entry in an empty slot of either bucket of pos
// (page pg), if one has one, and reports whether it did.
func (c *Chain) placeEmpty(pos *position, pg []byte) bool {
	for _, b := range [2]int{pos.b1, pos.b2} {
		if off := c.findEmpty(pg, pos.sub, b); off >= 0 {
			c.store(pos, pg, off)
			return true
		}
	}
	return false
}

// store writes pos's new entry into the empty slot at bit offset off of pg
// and counts it.
func (c *Chain) store(pos *position, pg []byte, off int) {
	f := pos.sub.slotBits
	v := pos.entry()
	set(pg, off, f, v)
	c.markSlot(pos.id, pg, off, f)
	pos.sub.count(v, pos.depth, 1)
}

// placeIn is place on the page pg of pos, already read, with an eviction
// walk of at most kicks steps.
func (c *Chain) placeIn(pos *position, pg []byte, kicks int) bool {
	if c.placeEmpty(pos, pg) {
		return true
	}
	f := pos.sub.slotBits
	tagMask := uint32(1)<<pos.sub.tagBits - 1

	// Eviction walk (Fan et al. Algorithm 1), victims chosen by a PRNG
	// seeded from the key's position so that replays evict identically.
	// An entry's other bucket comes from its tag alone (altLocal).
	rng := splitmix64{state: uint64(pos.tag)<<32 ^ pos.q ^ uint64(pos.b1)<<48}
	bb := c.p.BucketSize * f
	n := pos.sub.bucketsPerPage
	cur := pos.b1
	if rng.next()&1 == 1 {
		cur = pos.b2
	}
	v := pos.entry()
	c.kicks = c.kicks[:0]
	for range kicks {
		off := cur + int(rng.next()%uint64(c.p.BucketSize))*f
		victim := get(pg, off, f)
		set(pg, off, f, v)
		c.kicks = append(c.kicks, kick{slot: off, old: victim})
		v = victim
		cur = int(altLocal(uint64(cur/bb), v&tagMask, n)) * bb
		if off := c.findEmpty(pg, pos.sub, cur); off >= 0 {
			set(pg, off, f, v)
			if len(c.kicks) > maxMarkedKicks {
				// Slots all over the page changed: the page as a whole.
				c.pager.MarkDirty(pos.id, pg)
			} else {
				for _, k := range c.kicks {
					c.markSlot(pos.id, pg, k.slot, f)
				}
				c.markSlot(pos.id, pg, off, f)
			}
			pos.sub.count(pos.entry(), pos.depth, 1)
			return true
		}
	}
	for i := len(c.kicks) - 1; i >= 0; i-- {
		set(pg, c.kicks[i].slot, f, c.kicks[i].old)
	}
	return false
}

// maxMarkedKicks is the longest eviction walk whose changed slots the
// chain reports one by one; after a longer one it reports its page changed
// as a whole: such a walk moved fingerprints all over the page, and a
// store writing changed bytes would write most of the page's bytes with a
// header each (the store also writes a page whole once its changed ranges
// pass a share of it). At least splitKicks.
const maxMarkedKicks = 64

// markSlot tells the pager that the f-bit slot at bit offset off of page id
// changed: the bytes it shares with its neighbours included, since a store
// persists whole bytes.
func (c *Chain) markSlot(id PageID, pg []byte, off, f int) {
	lo := off >> 3
	c.pager.MarkChanged(id, pg, lo, (off+f-1)>>3+1-lo)
}

// splitmix64 is the PRNG of eviction walks (Steele, Lea, Flood 2014); it is
// tiny, has no state beyond one word and is fully determined by its seed.
type splitmix64 struct{ state uint64 }

func (r *splitmix64) next() uint64 {
	r.state += 0x9e3779b97f4a7c15
	z := r.state
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}
