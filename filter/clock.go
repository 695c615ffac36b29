package filter

import "math"

// The generations of a window, built into the entries: each entry of a
// windowed chain carries the tag of its generation (GenerationBits bits
// above its fingerprint), a lookup probes one page per sub-filter whatever
// the generations, and an entry whose generation expired matches nothing
// and leaves its slot free, to be taken by the next insert that meets it.
// A sweep clears what inserts leave, so that no expired entry is left when
// its tag comes back.

// clock is a windowed chain's generation tags, shared by its sub-filters.
// Tags are generations modulo 2^GenerationBits; a tag's age is how many
// generations it lies behind the newest (the watermark's), modulo the
// same, which is its true age as long as no entry is 2^GenerationBits
// generations old: the sweep's invariant (Chain.Advance).
type clock struct {
	mask   uint32 // 2^GenerationBits - 1
	newest uint32 // tag of the watermark's generation
	maxAge uint32 // Generations: tags up to this age are live (G+1)
	// used marks the tags of live generations that took an entry since
	// they began (Stats.Generations, and what Advance reports expired).
	used []bool
}

func newClock(p Params) *clock {
	span := p.spanMillis()
	if span == 0 {
		return nil
	}
	n := 1 << p.genBits()
	k := &clock{mask: uint32(n - 1), maxAge: uint32(p.Generations), used: make([]bool, n)}
	k.newest = k.tag(generation(math.MinInt64, span))
	return k
}

// age is how many generations tag lies behind the newest.
func (k *clock) age(tag uint32) uint32 { return (k.newest - tag) & k.mask }

// live reports whether entries of tag are live: at most Generations behind
// the newest.
func (k *clock) live(tag uint32) bool { return k.age(tag) <= k.maxAge }

// tag is the tag of generation gen.
func (k *clock) tag(gen int64) uint32 { return uint32(gen) & k.mask }

// Advance moves the watermark, the highest record timestamp seen (ts, in
// milliseconds since the Unix epoch), to ts if ts is higher, and expires
// every generation that ended a window or more before the new watermark:
// its entries are uncounted, match nothing from then on and leave their
// slots free. It returns the number of generations that expired holding
// entries (ones that took an entry while live). Without a window it does
// nothing.
//
// Expired entries are reclaimed by the inserts that meet them (a slot of
// an expired entry is an empty slot to Insert, Add, eviction walks and
// splits) and by a sweep that Advance runs: while the watermark crosses a
// generation's span it reads every page of the chain once, in order, a
// share of the pages in step with the watermark's progress through the
// span, and clears the entries whose tag is about to come back
// (2^GenerationBits - 1 generations old). A watermark that jumps two
// generations or more sweeps every page at once, clearing every entry the
// jump expired. So no entry is ever 2^GenerationBits generations old, and
// a tag's age is exact. The sweep is a function of the watermark and the
// pages, not of the wall clock: replays reproduce it. Its errors are the
// Pager's, wrapped; the chain's counts are then already those of the new
// watermark, and the caller should stop using the chain (a partition
// stops), as for any storage error.
//
// Time is the records' own: the wall clock is never read, so the state stays
// a function of the input and replays reproduce it. Out-of-order records
// are remembered in the generation of their own timestamp while that
// generation is live, so a late key is kept at least a window past its
// timestamp like any other; a record more than a window older than the
// watermark (or with no timestamp, -1) goes to the oldest live generation
// and is kept for at least what remains of that generation's life. A record
// timestamped far in the future moves the watermark there and expires
// everything older than a window before it: producers' clocks matter
// (log-append time on the input topic removes the question).
func (c *Chain) Advance(ts int64) (int, error) {
	if c.span == 0 || ts <= c.watermark {
		return 0, nil
	}
	k := generation(ts, c.span)
	if c.watermark == math.MinInt64 {
		// Entries stored before any timestamp (Insert, Add) are a window
		// older than any: they expire now, as every generation before.
		c.watermark = ts
		expired := 0
		for t, u := range c.gens.used {
			if u {
				expired++
				c.gens.used[t] = false
			}
			for i := range c.subs {
				c.subs[i].expire(uint32(t))
			}
		}
		c.sweepSub, c.sweepPage = 0, 0
		var err error
		if expired > 0 {
			err = c.sweepRest(0)
		}
		c.gens.newest = c.gens.tag(k)
		c.dropEmpty()
		c.sweepSub, c.sweepPage = 0, 0
		if err != nil {
			return expired, err
		}
		return expired, c.sweepTo(ts, c.gens.mask)
	}
	old := generation(c.watermark, c.span)
	c.watermark = ts
	if k == old {
		return 0, c.sweepTo(ts, c.gens.mask)
	}
	// The pass of generation old ends: with the ages of old (the clock
	// still stands there), clear what must not see the next generation.
	j := k - old
	var err error
	if j == 1 {
		err = c.sweepRest(c.gens.mask)
	} else {
		// Every entry the jump expires: older than G at k.
		c.sweepSub, c.sweepPage = 0, 0
		err = c.sweepRest(uint32(max(int64(c.gens.maxAge)+1-j, 0)))
	}
	// Expire the generations the jump passed, the live ones of old only.
	expired := 0
	for g := old - int64(c.gens.maxAge); g < min(k-int64(c.gens.maxAge), old+1); g++ {
		t := c.gens.tag(g)
		if c.gens.used[t] {
			expired++
			c.gens.used[t] = false
		}
		for i := range c.subs {
			c.subs[i].expire(t)
		}
	}
	c.gens.newest = c.gens.tag(k)
	c.dropEmpty()
	c.sweepSub, c.sweepPage = 0, 0
	if err != nil {
		return expired, err
	}
	return expired, c.sweepTo(ts, c.gens.mask)
}

// dropEmpty drops the sub-filters older than the newest that hold no live
// entry, once their generations expired: a chain that grew for a burst of
// keys goes back to one page a lookup and gives the pages back a window
// after the burst (Pager.Drop). The newest is kept, to take inserts.
func (c *Chain) dropEmpty() {
	n := 0
	for i := range c.subs {
		if i < len(c.subs)-1 && c.subs[i].Items == 0 {
			c.pager.Drop(c.subs[i].ID)
			continue
		}
		c.subs[n] = c.subs[i]
		n++
	}
	clear(c.subs[n:])
	c.subs = c.subs[:n]
}

// sweepTo sweeps the pages of the current pass up to the share of the
// chain's page numbers that ts has reached in its generation's span.
func (c *Chain) sweepTo(ts int64, minAge uint32) error {
	total := uint64(0)
	for i := range c.subs {
		total += uint64(len(c.subs[i].depths))
	}
	k := generation(ts, c.span)
	into := uint64(ts - k*c.span) // ms into the span, < span
	target := (into*total + uint64(c.span) - 1) / uint64(c.span)
	done := c.sweepPage
	for i := range c.sweepSub {
		if i < len(c.subs) {
			done += uint64(len(c.subs[i].depths))
		}
	}
	for ; done < target && c.sweepSub < len(c.subs); done++ {
		if err := c.sweepNext(minAge); err != nil {
			return err
		}
	}
	return nil
}

// sweepRest sweeps the pages of the current pass not yet swept.
func (c *Chain) sweepRest(minAge uint32) error {
	for c.sweepSub < len(c.subs) {
		if err := c.sweepNext(minAge); err != nil {
			return err
		}
	}
	return nil
}

// sweepNext sweeps the page number at the cursor, if it is a page now, and
// moves the cursor on: it clears every entry at least minAge generations
// old (expired ones: minAge is above Generations).
func (c *Chain) sweepNext(minAge uint32) error {
	sf := &c.subs[c.sweepSub]
	page := c.sweepPage
	c.sweepPage++
	if c.sweepPage >= uint64(len(sf.depths)) {
		c.sweepSub, c.sweepPage = c.sweepSub+1, 0
	}
	if _, ok := sf.Depth(uint32(page)); !ok {
		return nil
	}
	id := PageID{SubFilter: sf.ID, Page: uint32(page)}
	pg, err := c.page(id)
	if err != nil {
		return err
	}
	w := sf.slotBits
	cleared := c.cleared[:0]
	for i := range int(sf.bucketsPerPage) * c.p.BucketSize {
		off := i * w
		if v := get(pg, off, w); v != 0 && c.gens.age(v>>sf.FingerprintBits) >= minAge {
			set(pg, off, w, 0)
			cleared = append(cleared, off)
		}
	}
	if len(cleared) > maxMarkedKicks {
		c.pager.MarkDirty(id, pg)
	} else {
		for _, off := range cleared {
			c.markSlot(id, pg, off, w)
		}
	}
	c.cleared = cleared
	return nil
}
