package filter

import (
	"encoding/binary"
	"math"
	"math/bits"
)

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

// passGens is the number of generations P one pass of the sweep takes:
// 2^GenerationBits - 1 - Generations (7 at the defaults). A pass visits
// every page once, a block of about 1/P of them in each generation, so
// that a page is visited once every P generations exactly; a visit clears
// every expired entry, whose age is then at most Generations, and it is
// at most Generations + P = 2^GenerationBits - 1 at the next visit: no
// entry lives to see its tag come back.
func (k *clock) passGens() int64 { return int64(k.mask) - int64(k.maxAge) }

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
// splits) and by a sweep that Advance runs: over P = 2^GenerationBits - 1
// - Generations generations (7 at the defaults) it reads every page of the
// chain once, root page by root page (each with the pages split from
// it), a block of about 1/P of them in each generation, in step with the
// watermark's progress through the generation's span, and clears the
// expired entries of the pages it reads. A page is read once every P
// generations, so an entry has been cleared before it is
// 2^GenerationBits generations old, and a tag's age (modulo
// 2^GenerationBits) is its true age. A watermark that jumps two
// generations or more reads every page at once, clearing every entry the
// jump expires. The sweep is a function of the watermark and the pages,
// not of the wall clock: replays reproduce it. It costs a read of every
// page per P generations (at 1,000 entries a page, about 1/6,000 of a
// page read per key a window holds). Sub-filters older than the newest
// that hold no live entry leave the chain (Pager.Drop), oldest first.
// Errors are the Pager's, wrapped; the chain's counts are then already
// those of the new watermark, and the caller should stop using the chain
// (a partition stops), as for any storage error.
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
	if ts < c.nextTick {
		c.watermark = ts // the same generation, and no page due
		return 0, nil
	}
	n, err := c.advance(ts)
	c.newestGen = generation(ts, c.span)
	c.newestStart = c.newestGen * c.span
	c.nextTick = c.tickAfter(ts)
	return n, err
}

// sweepTicks is how many steps a generation's block of the sweep is read
// in: the watermark is compared with the next step's first timestamp
// alone in between.
const sweepTicks = 64

// tickAfter is the first timestamp after ts at which Advance sweeps: the
// next of the sweepTicks steps of ts's generation, start + ⌈i·span/64⌉
// for i = 1..64, the last the next generation's first timestamp. It
// follows from ts alone, so a chain opened again sweeps where it would
// have.
func (c *Chain) tickAfter(ts int64) int64 {
	start := generation(ts, c.span) * c.span
	i := (ts-start)*sweepTicks/c.span + 1
	for {
		if t := start + (i*c.span+sweepTicks-1)/sweepTicks; t > ts {
			return t
		}
		i++
	}
}

// advance is Advance past the check for a sweep step.
func (c *Chain) advance(ts int64) (int, error) {
	k := generation(ts, c.span)
	g := c.gens
	if c.watermark == math.MinInt64 {
		// Entries stored before any timestamp (Insert, Add) are a window
		// older than any: they expire now, as every generation before.
		c.watermark = ts
		expired := 0
		for t, u := range g.used {
			if u {
				expired++
				g.used[t] = false
			}
			for i := range c.subs {
				c.subs[i].expire(uint32(t))
			}
		}
		var err error
		if expired > 0 {
			c.sweepSub, c.sweepRoot = 0, 0
			err = c.sweepUntil(c.pagePositions(), 0)
		}
		return expired, c.startAt(k, ts, err)
	}
	old := generation(c.watermark, c.span)
	c.watermark = ts
	if k == old {
		return 0, c.sweepUntil(c.sweepTarget(ts), g.maxAge+1)
	}
	// The clock still stands at old: finish old's block, or, past a jump,
	// read every page, clearing what is expired at k (older than G at k).
	j := k - old
	var err error
	if j == 1 {
		err = c.sweepUntil(c.blockEnd(old), g.maxAge+1)
	} else {
		c.sweepSub, c.sweepRoot = 0, 0
		err = c.sweepUntil(c.pagePositions(), uint32(max(int64(g.maxAge)+1-j, 0)))
	}
	// Expire the generations the jump passed, the live ones of old only.
	expired := 0
	for gen := old - int64(g.maxAge); gen < min(k-int64(g.maxAge), old+1); gen++ {
		t := g.tag(gen)
		if g.used[t] {
			expired++
			g.used[t] = false
		}
		for i := range c.subs {
			c.subs[i].expire(t)
		}
	}
	if j == 1 {
		g.newest = g.tag(k)
		c.dropEmpty()
		if floorMod(k, g.passGens()) == 0 {
			c.sweepSub, c.sweepRoot = 0, 0 // a new pass
		}
		if err != nil {
			return expired, err
		}
		return expired, c.sweepUntil(c.sweepTarget(ts), g.maxAge+1)
	}
	return expired, c.startAt(k, ts, err)
}

// startAt sets the clock to generation k after every page was read (or
// the chain was empty): the pass of k stands at the start of k's block,
// and the sweep goes on to ts. err is an error of the reading, returned
// unchanged after the clock is set.
func (c *Chain) startAt(k, ts int64, err error) error {
	c.gens.newest = c.gens.tag(k)
	c.dropEmpty()
	c.sweepSub, c.sweepRoot = 0, 0
	if err != nil {
		return err
	}
	c.skipTo(c.blockEnd(k - 1))
	if floorMod(k, c.gens.passGens()) == 0 {
		c.sweepSub, c.sweepRoot = 0, 0
	}
	return c.sweepUntil(c.sweepTarget(ts), c.gens.maxAge+1)
}

// dropEmpty drops the oldest sub-filters, older than the newest, while
// they hold no live entry: a chain that appended sub-filters for a burst
// of keys goes back to one page a lookup and gives their pages back a
// window after the burst (Pager.Drop). Only the oldest leave, so that no
// page's place in the sweep's order moves later; the newest is kept, with
// its pages, to take inserts.
func (c *Chain) dropEmpty() {
	n := 0
	for n < len(c.subs)-1 && c.subs[n].Items == 0 {
		c.pager.Drop(c.subs[n].ID)
		n++
	}
	if n == 0 {
		return
	}
	c.subs = append(c.subs[:0], c.subs[n:]...)
	if c.sweepSub < n {
		c.sweepSub, c.sweepRoot = 0, 0
	} else {
		c.sweepSub -= n
	}
}

// pagePositions is the number of positions of the sweep's order: the
// root pages of every sub-filter, oldest first, each standing for itself
// and every page split from it (the page numbers k + RootPages·2^d that
// descend from it, which the sweep reads with it). A root's position never
// moves later: root pages are fixed when a sub-filter is made, new
// sub-filters come last and only the oldest leave. And a split keeps its
// entries within the root's pages, so that every entry is read once in
// every pass, P generations after the last time, wherever splits move it.
func (c *Chain) pagePositions() uint64 {
	var n uint64
	for i := range c.subs {
		n += c.subs[i].RootPages
	}
	return n
}

// sweepPosition is the position of the sweep's cursor.
func (c *Chain) sweepPosition() uint64 {
	n := c.sweepRoot
	for i := range min(c.sweepSub, len(c.subs)) {
		n += c.subs[i].RootPages
	}
	return n
}

// blockEnd is the position the sweep reaches by the end of generation
// gen: ⌈(b+1)·N/P⌉ for gen's block b of its pass, all N positions for the
// last.
func (c *Chain) blockEnd(gen int64) uint64 {
	p := c.gens.passGens()
	return mulDivCeil(uint64(floorMod(gen, p)+1), c.pagePositions(), uint64(p))
}

// sweepTarget is the position the sweep reaches at watermark ts: through
// ts's block in proportion to ts's progress through its generation's
// span.
func (c *Chain) sweepTarget(ts int64) uint64 {
	k := generation(ts, c.span)
	p := c.gens.passGens()
	done := uint64(floorMod(k, p))*uint64(c.span) + uint64(ts-k*c.span)
	return mulDivCeil(done, c.pagePositions(), uint64(p)*uint64(c.span))
}

// mulDivCeil is ⌈a·b/d⌉ for a <= d, without overflow.
func mulDivCeil(a, b, d uint64) uint64 {
	hi, lo := bits.Mul64(a, b)
	q, r := bits.Div64(hi, lo, d)
	if r != 0 {
		q++
	}
	return q
}

// floorMod is a mod b in [0, b).
func floorMod(a, b int64) int64 { return a - floorDiv(a, b)*b }

// skipTo moves the cursor to position target without reading pages.
func (c *Chain) skipTo(target uint64) {
	pos := c.sweepPosition()
	for pos < target && c.sweepSub < len(c.subs) {
		n := c.subs[c.sweepSub].RootPages - c.sweepRoot
		if pos+n > target {
			c.sweepRoot += target - pos
			return
		}
		pos += n
		c.sweepSub, c.sweepRoot = c.sweepSub+1, 0
	}
}

// sweepUntil sweeps the pages from the cursor up to position target (or
// the end), clearing entries at least minAge generations old.
func (c *Chain) sweepUntil(target uint64, minAge uint32) error {
	for pos := c.sweepPosition(); pos < target && c.sweepSub < len(c.subs); pos++ {
		if err := c.sweepNext(minAge); err != nil {
			return err
		}
	}
	return nil
}

// sweepNext sweeps the root page at the cursor and the pages split from
// it, and moves the cursor on: it clears every entry at least minAge
// generations old (expired ones: minAge is above Generations).
func (c *Chain) sweepNext(minAge uint32) error {
	sf := &c.subs[c.sweepSub]
	root := c.sweepRoot
	c.sweepRoot++
	if c.sweepRoot >= sf.RootPages {
		c.sweepSub, c.sweepRoot = c.sweepSub+1, 0
	}
	for page := root; page < uint64(len(sf.depths)); page += sf.RootPages {
		if _, ok := sf.Depth(uint32(page)); ok {
			if err := c.clearExpired(sf, uint32(page), minAge); err != nil {
				return err
			}
		}
	}
	return nil
}

// clearExpired clears the entries of page of sf at least minAge generations
// old.
func (c *Chain) clearExpired(sf *SubFilter, page uint32, minAge uint32) error {
	id := PageID{SubFilter: sf.ID, Page: page}
	c.swept++
	pg, err := c.readPage(id)
	if err != nil {
		return err
	}
	w := sf.slotBits
	cleared := c.cleared[:0]
	// Only the slots that share bits with a non-zero 64-bit word can hold
	// an entry: a page holding few keys (a window far below the capacity)
	// is read a word at a time.
	slots := int(sf.bucketsPerPage) * c.p.BucketSize
	next := 0 // the first slot not yet looked at
	for word := 0; word+8 <= len(pg) && next < slots; word += 8 {
		if binary.LittleEndian.Uint64(pg[word:]) == 0 {
			continue
		}
		last := min((word*8+63)/w, slots-1)
		for i := max(next, word*8/w); i <= last; i++ {
			off := i * w
			if v := get(pg, off, w); v != 0 && c.gens.age(v>>sf.FingerprintBits) >= minAge {
				set(pg, off, w, 0)
				cleared = append(cleared, off)
			}
		}
		next = last + 1
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
