package filter

import "slices"

// Location is a sub-filter holding copies of a key's fingerprint.
type Location struct {
	SubFilter SubFilter
	// Copies is the number of slots of the key's two candidate buckets in
	// SubFilter that hold its fingerprint (1 or more).
	Copies int
	// Generations is, with a window, the generation of each copy, oldest
	// first (len Copies); nil without a window.
	Generations []int64
}

// Locate returns the sub-filters that hold a live fingerprint matching
// key, oldest first (the order of SubFilters), with the copies each holds
// and, with a window, their generations: the per-sub-filter breakdown of
// Count, whose total is the sum of Copies. A match may be another key's
// fingerprint, with probability about Stats().EstimatedFPR over the chain.
// Like Count it reads one page per sub-filter and changes nothing; errors
// are the Pager's, wrapped.
func (c *Chain) Locate(key []byte) ([]Location, error) {
	c.ops++
	h := c.hash(key)
	var locs []Location
	for s := range c.subs {
		var pos position
		pg, err := c.open(&pos, h, s)
		if err != nil {
			return nil, err
		}
		n := c.copies(pg, &pos)
		if n == 0 {
			continue
		}
		l := Location{SubFilter: *pos.sub, Copies: n}
		if c.gens != nil {
			newest := generation(c.watermark, c.span)
			w := pos.sub.slotBits
			for _, b := range [2]int{pos.b1, pos.b2} {
				for i := range c.p.BucketSize {
					if v := get(pg, b+i*w, w); pos.matches(v) {
						l.Generations = append(l.Generations, newest-int64(c.gens.age(v>>pos.sub.FingerprintBits)))
					}
				}
			}
			slices.Sort(l.Generations)
		}
		locs = append(locs, l)
	}
	return locs, nil
}
