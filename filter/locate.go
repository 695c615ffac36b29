package filter

// Location is a sub-filter holding copies of a key's fingerprint.
type Location struct {
	SubFilter SubFilter
	// Copies is the number of slots of the key's two candidate buckets in
	// SubFilter that hold its fingerprint (1 or more).
	Copies int
}

// Locate returns the sub-filters that hold a fingerprint matching key,
// oldest first (the order of SubFilters), with the copies each holds: the
// per-sub-filter breakdown of Count, whose total is the sum of Copies. A
// match may be another key's fingerprint, with probability about
// Stats().EstimatedFPR over the chain. Like Count it reads one page per
// sub-filter and changes nothing; errors are the Pager's, wrapped.
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
		if n := c.copies(pg, &pos); n > 0 {
			locs = append(locs, Location{SubFilter: *pos.sub, Copies: n})
		}
	}
	return locs, nil
}
