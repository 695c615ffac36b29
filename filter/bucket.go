package filter

// The bit-packed buckets of a page: where a key's page, two candidate
// buckets and fingerprint lie in a sub-filter, the variable-length
// fingerprints of a sub-filter that grows in place, and reading and
// writing W-bit slots.

import (
	"encoding/binary"
	"math/bits"
)

// position is where a key lives in one sub-filter: its page, the bit
// offsets of its two candidate buckets in that page (always distinct, see
// altLocal), its tag and the hash bits from the page's depth on.
type position struct {
	id     PageID
	b1, b2 int // bit offsets of the buckets
	// tag is the low tagBits bits of the fingerprint: compared exactly, and
	// the only input of the alternate bucket, so that an entry's two
	// buckets never change as its page splits.
	tag uint32
	// q is the key's hash bits after its tag and its page's depth bits:
	// bit 0 chooses its child when the page splits, and the low bits are
	// what an entry of the key stores after its tag.
	q uint64
	// gen is the generation tag of a new entry of the key, in place above
	// the fingerprint (0 without a window).
	gen   uint32
	depth int
	sub   *SubFilter
}

// open sets *pos to where hash h lives in sub-filter s and returns the
// page holding it: how every operation on one sub-filter begins (pos is an
// out parameter, as a returned position, page and error take more
// registers than results are passed in). The error is the page's
// (Chain.page).
func (c *Chain) open(pos *position, h uint64, s int) ([]byte, error) {
	c.locate(pos, h, s)
	return c.page(pos.id)
}

// locate sets *pos to where hash h lives in sub-filter s, as open does,
// without reading the page.
//
// The low 32 bits of h choose the root page and the bucket inside it by
// one multiply-shift (Lemire's fast range, twice): x = lo32*RootPages, the
// root page is x>>32 and the bucket (uint32(x)*bucketsPerPage)>>32. The
// fingerprint bits (fingerprintBits) are independent of them: the tag, then
// one bit per split of the root page, which chooses the child (linear
// hashing's numbering: page k at depth d splits into k and
// k + RootPages*2^d), then the bits an entry stores.
func (c *Chain) locate(pos *position, h uint64, s int) {
	sf := &c.subs[s]
	x := uint64(uint32(h)) * sf.RootPages
	local := (x & 0xffffffff * sf.bucketsPerPage) >> 32
	g := fingerprintBits(h)
	tag := uint32(g) & (1<<sf.tagBits - 1)
	q := g >> sf.tagBits
	page, d := sf.pageOf(x>>32, q)
	bb := c.p.BucketSize * sf.slotBits
	*pos = position{
		id:    PageID{SubFilter: sf.ID, Page: uint32(page)},
		b1:    int(local) * bb,
		b2:    int(altLocal(local, tag, sf.bucketsPerPage)) * bb,
		tag:   tag,
		gen:   c.tag << sf.FingerprintBits,
		q:     q >> d,
		depth: d,
		sub:   sf,
	}
}

// fingerprintBits are the hash bits a fingerprint is cut from: the high 32
// bits of h, then 32 bits of a SplitMix64 finalizer of h (Steele et al.
// 2014) for the widest slots at the deepest pages, which need up to 39
// bits (tag, MaxDepth split bits, MaxDepth stored bits).
func fingerprintBits(h uint64) uint64 {
	z := (h ^ h>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	z ^= z >> 31
	return h>>32 | z&^0xffffffff
}

// pageOf returns the page holding hash bits q (after the tag) whose root
// page is root, and that page's depth: from the depth every page has
// reached, it follows the splits down, one bit of q per split.
func (s *SubFilter) pageOf(root, q uint64) (uint64, int) {
	d := s.minDepth
	k := root + s.RootPages*(q&(1<<d-1))
	for d < s.maxDepth && int(s.depths[k]) > d {
		if q>>d&1 != 0 {
			k += s.RootPages << d
		}
		d++
	}
	return k, d
}

// entry is the slot value of a new entry of pos: its tag, then maxDepth
// bits of q, then a terminating 1 bit; a split drops the lowest bit of
// the stored prefix (it chose the child), so an entry keeps one bit less
// per split since it was inserted.
func (pos *position) entry() uint32 {
	d := pos.sub.maxDepth
	return pos.gen | pos.tag | uint32(pos.q&(1<<d-1)|1<<d)<<pos.sub.tagBits
}

// matches reports whether slot value v holds a live entry pos's key may
// have inserted: the tags are equal, the prefix the entry kept equals the
// key's bits at the same places and, with a window, its generation has not
// expired. 0 is an empty slot.
func (pos *position) matches(v uint32) bool {
	// The tags differ in all but about one slot in 2^tagBits: the rest is
	// not inlined.
	return (v^pos.tag)&(1<<pos.sub.tagBits-1) == 0 && v != 0 && pos.matchesRest(v)
}

// matchesRest is matches for a slot value whose tag is pos's.
func (pos *position) matchesRest(v uint32) bool {
	sf := pos.sub
	k := sf.tagBits
	if sf.gens == nil {
		return prefixMatches(uint64(v>>k), pos.q)
	}
	return prefixMatches(uint64(sf.fingerprint(v)>>k), pos.q) && sf.gens.live(v>>sf.FingerprintBits)
}

// prefixMatches compares the stored part s (prefix then a terminating 1
// bit) with the key's bits q.
func prefixMatches(s, q uint64) bool {
	l := bits.Len64(s) - 1
	return (s^q)&(1<<l-1) == 0
}

// prefixLen is the number of prefix bits the entry in slot value v keeps
// (tagBits k).
func prefixLen(v uint32, k int) int { return bits.Len32(v>>k) - 1 }

// altLocal is the page-local alternate bucket of partial-key cuckoo hashing
// (Fan et al. section 3.1) over a page of n buckets, n even and at least 2
// (Params.bucketsPerPage) but not a power of two in general:
//
//	alt(i) = (m - i) mod n, m = 2*(mix(tag) mod n/2) + 1
//
// It is an involution in i (alt(alt(i)) = i), like the paper's i XOR
// hash(fp) for power-of-two n, so an eviction walk finds a fingerprint's
// other bucket from the bucket it is in. m is odd and n even, so
// 2i = m (mod n) has no solution: the alternate never equals the primary,
// and every key has two distinct buckets, 2b slots, for its copies. mix
// takes the high half of a 64-bit multiplicative hash so that every bit of
// the tag matters. The tag is a fixed part of the fingerprint that a split
// never shortens, so an entry's buckets are the same in every page it is
// moved to.
func altLocal(local uint64, tag uint32, n uint64) uint64 {
	m := (((uint64(tag)*0x9e3779b97f4a7c15)>>32)*(n/2)>>32)*2 + 1
	if m >= local {
		return m - local
	}
	return m + n - local
}

func fpMask(f int) uint32 { return uint32(uint64(1)<<f - 1) }

// get reads the f-bit slot at bit offset off, little endian.
func get(pg []byte, off, f int) uint32 {
	i, sh := off>>3, uint(off&7)
	if i+8 <= len(pg) {
		return uint32(binary.LittleEndian.Uint64(pg[i:])>>sh) & fpMask(f)
	}
	var w uint64
	for k := 0; i+k < len(pg) && k < 8; k++ {
		w |= uint64(pg[i+k]) << (8 * k)
	}
	return uint32(w>>sh) & fpMask(f)
}

// set writes fp into the f-bit slot at bit offset off.
func set(pg []byte, off, f int, fp uint32) {
	i, sh := off>>3, uint(off&7)
	mask := uint64(fpMask(f)) << sh
	if i+8 <= len(pg) {
		w := binary.LittleEndian.Uint64(pg[i:])
		binary.LittleEndian.PutUint64(pg[i:], w&^mask|uint64(fp)<<sh)
		return
	}
	v := uint64(fp) << sh
	for k := 0; i+k < len(pg) && k < 8; k++ {
		b := uint64(pg[i+k])
		m := (mask >> (8 * k)) & 0xff
		pg[i+k] = byte(b&^m | (v>>(8*k))&m)
	}
}

// bucketBits holds the bits of one bucket in registers: the 128 bits of the
// page from the byte holding the bucket's first bit, so that its slots are
// extracted with shifts instead of one memory load each. ok is false when
// the bucket does not fit (more than 121 bits, as b=8 with f>15, or too
// close to the end of the page); the slots are then read one by one.
type bucketBits struct {
	lo, hi uint64
	sh     int
	ok     bool
}

func loadBucket(pg []byte, off, bucketLen int) bucketBits {
	i, sh := off>>3, off&7
	if sh+bucketLen > 128 || i+16 > len(pg) {
		return bucketBits{}
	}
	return bucketBits{lo: binary.LittleEndian.Uint64(pg[i:]), hi: binary.LittleEndian.Uint64(pg[i+8:]), sh: sh, ok: true}
}

// slot returns slot k of f bits.
func (w bucketBits) slot(k, f int) uint32 {
	p := uint(w.sh + k*f)
	var v uint64
	switch {
	case p >= 64:
		v = w.hi >> (p - 64)
	case p+uint(f) <= 64:
		v = w.lo >> p
	default:
		v = w.lo>>p | w.hi<<(64-p)
	}
	return uint32(v) & fpMask(f)
}

// slotAt returns slot k of the bucket at bit offset b, from w when it holds
// the bucket.
func slotAt(pg []byte, w bucketBits, b, k, f int) uint32 {
	if w.ok {
		return w.slot(k, f)
	}
	return get(pg, b+k*f, f)
}

// copies returns how many slots of both buckets of pos hold an entry
// matching pos's key.
func (c *Chain) copies(pg []byte, pos *position) int {
	f, bs := pos.sub.slotBits, c.p.BucketSize
	w1, w2 := loadBucket(pg, pos.b1, bs*f), loadBucket(pg, pos.b2, bs*f)
	n := 0
	for k := range bs {
		if pos.matches(slotAt(pg, w1, pos.b1, k, f)) {
			n++
		}
		if pos.matches(slotAt(pg, w2, pos.b2, k, f)) {
			n++
		}
	}
	return n
}

// longest returns the bit offset of the slot of pos's buckets holding the
// matching entry with the longest fingerprint (the one least likely to be
// another key's, as InfiniFilter deletes), or -1.
func (c *Chain) longest(pg []byte, pos *position) int {
	f, bs, k := pos.sub.slotBits, c.p.BucketSize, pos.sub.tagBits
	best, bestLen := -1, -1
	for _, b := range [2]int{pos.b1, pos.b2} {
		for i := range bs {
			off := b + i*f
			if v := get(pg, off, f); pos.matches(v) {
				if l := prefixLen(pos.sub.fingerprint(v), k); l > bestLen {
					best, bestLen = off, l
				}
			}
		}
	}
	return best
}

// findEmpty returns the bit offset of the first free slot of sub-filter
// sf (empty, or an expired entry's) in the bucket at bit offset b, or -1.
func (c *Chain) findEmpty(pg []byte, sf *SubFilter, b int) int {
	f := sf.slotBits
	for k := range c.p.BucketSize {
		if off := b + k*f; sf.free(get(pg, off, f)) {
			return off
		}
	}
	return -1
}

// probe reads both buckets of pos once: found reports whether either holds
// an entry matching pos's key, and empty is the bit offset of the first
// free slot (the primary bucket's first), or -1.
func (c *Chain) probe(pg []byte, pos *position) (found bool, empty int) {
	sf := pos.sub
	f, bs := sf.slotBits, c.p.BucketSize
	w1, w2 := loadBucket(pg, pos.b1, bs*f), loadBucket(pg, pos.b2, bs*f)
	e1, e2 := -1, -1
	for k := range bs {
		s1, s2 := slotAt(pg, w1, pos.b1, k, f), slotAt(pg, w2, pos.b2, k, f)
		if pos.matches(s1) || pos.matches(s2) {
			return true, -1
		}
		if e1 < 0 && sf.free(s1) {
			e1 = pos.b1 + k*f
		}
		if e2 < 0 && sf.free(s2) {
			e2 = pos.b2 + k*f
		}
	}
	if e1 >= 0 {
		return false, e1
	}
	return false, e2
}

// holds reports whether either bucket of pos holds an entry matching pos's
// key: a lookup. Both buckets are loaded before either is compared, so
// that their two cache misses overlap.
func (c *Chain) holds(pg []byte, pos *position) bool {
	f, bs := pos.sub.slotBits, c.p.BucketSize
	w1, w2 := loadBucket(pg, pos.b1, bs*f), loadBucket(pg, pos.b2, bs*f)
	for k := range bs {
		if pos.matches(slotAt(pg, w1, pos.b1, k, f)) || pos.matches(slotAt(pg, w2, pos.b2, k, f)) {
			return true
		}
	}
	return false
}
