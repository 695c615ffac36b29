package filter

// The bit-packed buckets of a page: where a key's two candidate buckets and
// fingerprint lie in a sub-filter, and reading and writing f-bit slots.

import "encoding/binary"

// position is where a key lives in one sub-filter: its page, the bit
// offsets of its two candidate buckets in that page (always distinct, see
// altLocal), and its fingerprint.
type position struct {
	id     PageID
	b1, b2 int // bit offsets of the buckets
	fp     uint32
	sub    *SubFilter
}

// open sets *pos to where hash h lives in sub-filter s and returns the
// page holding it: how every operation on one sub-filter begins (pos is
// an out parameter, as a returned position, page and error take more
// registers than results are passed in). The low 32 bits of h
// choose the page and the bucket inside it by one multiply-shift (Lemire's
// fast range, twice): x = lo32*Pages, the page is x>>32 and the bucket in
// the page is (uint32(x)*bucketsPerPage)>>32, so any page count works and
// the two indexes use the bits of the product's two halves. The fingerprint
// comes from the high 32 bits, so index and fingerprint never share bits.
// The error is the page's (Chain.page).
func (c *Chain) open(pos *position, h uint64, s int) ([]byte, error) {
	c.locate(pos, h, s)
	return c.page(pos.id)
}

// locate sets *pos to where hash h lives in sub-filter s, as open does,
// without reading the page.
func (c *Chain) locate(pos *position, h uint64, s int) {
	sf := &c.subs[s]
	x := uint64(uint32(h)) * sf.Pages
	local := (x & 0xffffffff * sf.bucketsPerPage) >> 32
	f := sf.FingerprintBits
	fp := uint32(h>>32) & fpMask(f)
	if fp == 0 {
		fp = 1
	}
	bb := c.p.BucketSize * f
	*pos = position{
		id:  PageID{SubFilter: sf.ID, Page: uint32(x >> 32)},
		b1:  int(local) * bb,
		b2:  int(altLocal(local, fp, sf.bucketsPerPage)) * bb,
		fp:  fp,
		sub: sf,
	}
}

func fpMask(f int) uint32 { return uint32(uint64(1)<<f - 1) }

// altLocal is the page-local alternate bucket of partial-key cuckoo hashing
// (Fan et al. section 3.1) over a page of n buckets, n even and at least 2
// (Params.bucketsPerPage) but not a power of two in general:
//
//	alt(i) = (m - i) mod n, m = 2*(mix(fp) mod n/2) + 1
//
// It is an involution in i (alt(alt(i)) = i), like the paper's i XOR
// hash(fp) for power-of-two n, so an eviction walk finds a fingerprint's
// other bucket from the bucket it is in. m is odd and n even, so
// 2i = m (mod n) has no solution: the alternate never equals the primary,
// and every key has two distinct buckets, 2b slots, for its copies. (With an
// odd n no involution is free of fixed points, hence the even n: an odd
// page count of buckets gave about one key in n a single bucket.) mix takes
// the high half of a 64-bit multiplicative hash so that every bit of fp
// matters.
func altLocal(local uint64, fp uint32, n uint64) uint64 {
	m := (((uint64(fp)*0x9e3779b97f4a7c15)>>32)*(n/2)>>32)*2 + 1
	if m >= local {
		return m - local
	}
	return m + n - local
}

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

// count returns how many f-bit slots of the bucket at bit offset b hold fp.
func (c *Chain) count(pg []byte, b, f int, fp uint32) int {
	n := 0
	bs := c.p.BucketSize
	if w := loadBucket(pg, b, bs*f); w.ok {
		for k := range bs {
			if w.slot(k, f) == fp {
				n++
			}
		}
		return n
	}
	for k := range bs {
		if get(pg, b+k*f, f) == fp {
			n++
		}
	}
	return n
}

// find returns the bit offset of the first f-bit slot of bucket b holding
// fp, or -1.
func (c *Chain) find(pg []byte, b, f int, fp uint32) int {
	bs := c.p.BucketSize
	if w := loadBucket(pg, b, bs*f); w.ok {
		for k := range bs {
			if w.slot(k, f) == fp {
				return b + k*f
			}
		}
		return -1
	}
	for k := range bs {
		if off := b + k*f; get(pg, off, f) == fp {
			return off
		}
	}
	return -1
}

// copies returns how many slots of both buckets of pos hold pos.fp.
func (c *Chain) copies(pg []byte, pos position) int {
	f := pos.sub.FingerprintBits
	return c.count(pg, pos.b1, f, pos.fp) + c.count(pg, pos.b2, f, pos.fp)
}

// probe reads both buckets of pos once: found reports whether either holds
// pos.fp, and empty is the bit offset of the first empty slot (the primary
// bucket's first), or -1.
func (c *Chain) probe(pg []byte, pos position) (found bool, empty int) {
	f, bs := pos.sub.FingerprintBits, c.p.BucketSize
	w1, w2 := loadBucket(pg, pos.b1, bs*f), loadBucket(pg, pos.b2, bs*f)
	if !w1.ok || !w2.ok {
		if c.find(pg, pos.b1, f, pos.fp) >= 0 || c.find(pg, pos.b2, f, pos.fp) >= 0 {
			return true, -1
		}
		if empty = c.find(pg, pos.b1, f, 0); empty < 0 {
			empty = c.find(pg, pos.b2, f, 0)
		}
		return false, empty
	}
	e1, e2 := -1, -1
	for k := range bs {
		s1, s2 := w1.slot(k, f), w2.slot(k, f)
		if s1 == pos.fp || s2 == pos.fp {
			return true, -1
		}
		if s1 == 0 && e1 < 0 {
			e1 = pos.b1 + k*f
		}
		if s2 == 0 && e2 < 0 {
			e2 = pos.b2 + k*f
		}
	}
	if e1 >= 0 {
		return false, e1
	}
	return false, e2
}
