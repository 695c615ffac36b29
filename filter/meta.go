package filter

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"math"
	"math/bits"
	"slices"
	"time"
)

// FormatVersion is the version of the metadata and page format this package
// writes. DecodeMeta and Open refuse any other. Version 5 keyed the hash
// with a per-chain secret seed, kept a key's two buckets distinct (even
// bucket counts per page) and stored Params.KeySpec; version 6 grows
// sub-filters in place: variable-length entries (tag, prefix, terminating
// bit), the alternate bucket from the tag, and per sub-filter its root
// pages, page depths and entries by fingerprint length; version 7 keeps a
// window's generations in the entries: a generation tag above each
// fingerprint, entries by generation tag and length per sub-filter, the
// sweep's cursor and the generations that took entries, and no
// sub-filters per generation.
const FormatVersion = 7

// Hash identities in the metadata. Changing the hash is a format change.
const (
	// HashXXH64 is unkeyed xxhash64, formats up to 4.
	HashXXH64 = 1
	// HashSipHash24 is SipHash-2-4 keyed by the chain's secret 128-bit
	// Seed ("siphash-2-4-keyed"), format 5.
	HashSipHash24 = 2
)

// hashName names the hash of this format in messages.
const hashName = "siphash-2-4-keyed"

var metaMagic = [4]byte{'K', 'D', 'C', 'F'}

const (
	// magic .. target rate, window, generations, next ID, watermark,
	// sub-filter count, seed, key spec length (the key spec follows)
	metaHeaderLen = 4 + 1 + 1 + 1 + 1 + 4 + 2 + 4 + 8 + 8 + 8 + 1 + 4 + 8 + 2 + 16 + 2
	// with a window, after the key spec: the sweep's sub-filter index and
	// root page, then the used generation tags, one bit each
	metaWindowLen = 2 + 4
	// ID, share of the false-positive budget, root pages, width, entries
	// by length, page count (the page depths follow, two to a byte, then
	// with a window the entries by generation tag and length, as uvarints)
	metaSubLen = 4 + 2 + 4 + 1 + 8*(MaxDepth+1) + 4
	metaCRCLen = 4
)

// Meta is the decoded chain metadata.
type Meta struct {
	FormatVersion int
	HashID        int
	Params        Params
	// NextID is the ID the next new sub-filter gets.
	NextID uint32
	// Watermark is the highest record timestamp seen (ms), math.MinInt64
	// before any.
	Watermark int64
	// Seed is the chain's secret hash seed: keep it out of logs and
	// reports.
	Seed       Seed
	SubFilters []SubFilter

	// With a window: the generation tags that took entries, and the
	// sweep's cursor (Chain.Advance).
	used                []bool
	sweepSub, sweepRoot uint32
}

// MarshalMeta encodes the chain metadata: format version, hash id, Params
// but the key spec, next sub-filter ID, watermark, the sub-filter count,
// hash seed, the key spec (16-bit length and bytes), with a window the
// sweep's cursor and the used generation tags (2^GenerationBits bits),
// and every sub-filter (ID, root pages, fingerprint width, entries by
// fingerprint length, the number N of page numbers in use and their
// depths, 4 bits each, and with a window its entries by generation tag
// and length as uvarints), big endian, followed by a CRC-32C of the
// preceding bytes. The depths take half a byte per page number, about
// 1/8192 of the pages' bytes. It holds the secret hash seed: store it like
// the pages, never log it.
func (c *Chain) MarshalMeta() []byte {
	m := Meta{FormatVersion: FormatVersion, HashID: HashSipHash24, Params: c.p,
		NextID: c.nextID, Watermark: c.watermark, Seed: c.seed, SubFilters: c.subs}
	if c.gens != nil {
		m.used, m.sweepSub, m.sweepRoot = c.gens.used, uint32(c.sweepSub), uint32(c.sweepRoot)
	}
	return m.marshal()
}

// Marshal encodes m as MarshalMeta encodes a chain's metadata; DecodeMeta
// reads it back. A SubFilter of m described by hand, with Pages and no
// RootPages, is one whose pages never split. It holds the secret hash seed: store it like the pages,
// never log it.
func (m Meta) Marshal() []byte { return m.marshal() }

// HasPage reports whether id is a page of the chain m describes: a page
// of one of its sub-filters (the live ones: a dropped sub-filter has left
// SubFilters) below that sub-filter's page count. A state holds no other
// page, so an image that does is not this metadata's
// (store.PartitionState.Import refuses it).
func (m Meta) HasPage(id PageID) bool {
	for _, s := range m.SubFilters {
		if s.ID == id.SubFilter {
			_, ok := s.Depth(id.Page)
			return ok
		}
	}
	return false
}

// TotalPages is the number of pages of m's sub-filters: the most a state
// of this metadata stores.
func (m Meta) TotalPages() uint64 {
	var n uint64
	for _, s := range m.SubFilters {
		n += s.Pages
	}
	return n
}

func (m Meta) marshal() []byte {
	n := metaHeaderLen + len(m.Params.KeySpec) + metaCRCLen
	for _, s := range m.SubFilters {
		n += metaSubLen + (max(len(s.depths), int(s.RootPages), int(s.Pages))+1)/2
	}
	b := make([]byte, 0, n)
	b = append(b, metaMagic[:]...)
	b = append(b, byte(m.FormatVersion), byte(m.HashID), byte(m.Params.FingerprintBits), byte(m.Params.BucketSize))
	b = binary.BigEndian.AppendUint32(b, uint32(m.Params.MaxKicks))
	b = binary.BigEndian.AppendUint16(b, uint16(m.Params.Expansion))
	b = binary.BigEndian.AppendUint32(b, uint32(m.Params.PageBytes))
	b = binary.BigEndian.AppendUint64(b, m.Params.Capacity)
	b = binary.BigEndian.AppendUint64(b, math.Float64bits(m.Params.TargetFPR))
	b = binary.BigEndian.AppendUint64(b, uint64(m.Params.Window))
	b = append(b, byte(m.Params.Generations))
	b = binary.BigEndian.AppendUint32(b, m.NextID)
	b = binary.BigEndian.AppendUint64(b, uint64(m.Watermark))
	b = binary.BigEndian.AppendUint16(b, uint16(len(m.SubFilters)))
	b = binary.BigEndian.AppendUint64(b, m.Seed.K0)
	b = binary.BigEndian.AppendUint64(b, m.Seed.K1)
	b = binary.BigEndian.AppendUint16(b, uint16(len(m.Params.KeySpec)))
	b = append(b, m.Params.KeySpec...)
	tags := 0
	if m.Params.Window > 0 {
		tags = 1 << m.Params.WithDefaults().genBits()
		b = binary.BigEndian.AppendUint16(b, uint16(m.sweepSub))
		b = binary.BigEndian.AppendUint32(b, m.sweepRoot)
		used := make([]byte, (tags+7)/8)
		for t, u := range m.used {
			if u {
				used[t/8] |= 1 << (t % 8)
			}
		}
		b = append(b, used...)
	}
	for i, s := range m.SubFilters {
		b = binary.BigEndian.AppendUint32(b, s.ID)
		if s.RootPages == 0 {
			s.share = i // described by hand
		}
		b = binary.BigEndian.AppendUint16(b, uint16(s.share))
		depths := s.depths
		if s.RootPages == 0 {
			// Described by hand (Pages alone): a sub-filter never split.
			s.RootPages, depths = s.Pages, make([]uint8, s.Pages)
		}
		// Page numbers past the last in use (room the chain keeps for
		// splits to come) are not stored.
		for uint64(len(depths)) > s.RootPages && depths[len(depths)-1] == 0 {
			depths = depths[:len(depths)-1]
		}
		b = binary.BigEndian.AppendUint32(b, uint32(s.RootPages))
		b = append(b, byte(s.FingerprintBits))
		for _, n := range s.Lengths {
			b = binary.BigEndian.AppendUint64(b, n)
		}
		b = binary.BigEndian.AppendUint32(b, uint32(len(depths)))
		for i := 0; i < len(depths); i += 2 {
			v := depths[i]
			if i+1 < len(depths) {
				v |= depths[i+1] << 4
			}
			b = append(b, v)
		}
		for t := range tags {
			var row [MaxDepth + 1]uint64
			if t < len(s.byTag) {
				row = s.byTag[t]
			}
			for _, n := range row {
				b = binary.AppendUvarint(b, n)
			}
		}
	}
	return append(b, m.crc(b)...)
}

func (Meta) crc(body []byte) []byte {
	return binary.BigEndian.AppendUint32(nil, crc32.Checksum(body, crcTable))
}

var crcTable = crc32.MakeTable(crc32.Castagnoli)

// DecodeMeta decodes metadata written by MarshalMeta. It returns ErrCorrupt
// (wrapped, with the reason) for a wrong length, magic, checksum, or
// sub-filter geometry that the recorded Params could not have produced, and
// ErrParams (wrapped, naming both versions) for metadata of another format
// version, whose layout it does not read. It does not compare Params; Open
// does.
func DecodeMeta(b []byte) (Meta, error) {
	// The magic, version and hash id precede the checksum-covered body's
	// version-specific part, and the checksum ends every version.
	if len(b) < 6+metaCRCLen {
		return Meta{}, fmt.Errorf("%w: metadata is %d bytes, shorter than its header", ErrCorrupt, len(b))
	}
	body, sum := b[:len(b)-metaCRCLen], binary.BigEndian.Uint32(b[len(b)-metaCRCLen:])
	if [4]byte(body[:4]) != metaMagic {
		return Meta{}, fmt.Errorf("%w: metadata magic %q", ErrCorrupt, body[:4])
	}
	if got := crc32.Checksum(body, crcTable); got != sum {
		return Meta{}, fmt.Errorf("%w: metadata checksum %08x, want %08x", ErrCorrupt, got, sum)
	}
	if v, h := int(body[4]), int(body[5]); v != FormatVersion || h != HashSipHash24 {
		return Meta{}, fmt.Errorf("%w: stored format version %d hash %d, this build reads format version %d hash %d (%s); move the data directory aside and let the state be rebuilt by replay",
			ErrParams, v, h, FormatVersion, HashSipHash24, hashName)
	}
	if len(body) < metaHeaderLen {
		return Meta{}, fmt.Errorf("%w: metadata is %d bytes, shorter than its header", ErrCorrupt, len(b))
	}
	m := Meta{
		FormatVersion: int(body[4]),
		HashID:        int(body[5]),
		Params: Params{
			FingerprintBits: int(body[6]),
			BucketSize:      int(body[7]),
			MaxKicks:        int(binary.BigEndian.Uint32(body[8:])),
			Expansion:       int(binary.BigEndian.Uint16(body[12:])),
			PageBytes:       int(binary.BigEndian.Uint32(body[14:])),
			Capacity:        binary.BigEndian.Uint64(body[18:]),
			TargetFPR:       math.Float64frombits(binary.BigEndian.Uint64(body[26:])),
			Window:          time.Duration(binary.BigEndian.Uint64(body[34:])),
			Generations:     int(body[42]),
		},
		NextID:    binary.BigEndian.Uint32(body[43:]),
		Watermark: int64(binary.BigEndian.Uint64(body[47:])),
	}
	n := int(binary.BigEndian.Uint16(body[55:]))
	m.Seed = Seed{K0: binary.BigEndian.Uint64(body[57:]), K1: binary.BigEndian.Uint64(body[65:])}
	keyLen := int(binary.BigEndian.Uint16(body[73:]))
	rest := body[metaHeaderLen:]
	if len(rest) < keyLen {
		return Meta{}, fmt.Errorf("%w: metadata holds a key spec of %d bytes in %d", ErrCorrupt, keyLen, len(rest))
	}
	m.Params.KeySpec, rest = string(rest[:keyLen]), rest[keyLen:]
	if n == 0 || n > MaxSubFilters {
		return Meta{}, fmt.Errorf("%w: %d sub-filters", ErrCorrupt, n)
	}
	if m.Params.Validate() != nil || m.Params != m.Params.WithDefaults() {
		// Versions and hashes are compared by Open, but geometry must be
		// sane before anything indexes pages with it.
		return Meta{}, fmt.Errorf("%w: metadata parameters %s", ErrCorrupt, m.Params)
	}
	k := newClock(m.Params)
	tags := 0
	if k != nil {
		tags = len(k.used)
		if len(rest) < metaWindowLen+(tags+7)/8 {
			return Meta{}, fmt.Errorf("%w: metadata ends in the window's state", ErrCorrupt)
		}
		m.sweepSub, m.sweepRoot = uint32(binary.BigEndian.Uint16(rest)), binary.BigEndian.Uint32(rest[2:])
		rest = rest[metaWindowLen:]
		if m.Watermark != math.MinInt64 {
			k.newest = k.tag(generation(m.Watermark, m.Params.spanMillis()))
		}
		m.used = make([]bool, tags)
		for t := range tags {
			m.used[t] = rest[t/8]>>(t%8)&1 != 0
			if m.used[t] && !k.live(uint32(t)) {
				return Meta{}, fmt.Errorf("%w: expired generation tag %d marked used", ErrCorrupt, t)
			}
		}
		if tags < 8 && rest[0]>>tags != 0 {
			return Meta{}, fmt.Errorf("%w: used generation bits past the tags", ErrCorrupt)
		}
		rest = rest[(tags+7)/8:]
		if int(m.sweepSub) > n {
			return Meta{}, fmt.Errorf("%w: the sweep is at sub-filter %d of %d", ErrCorrupt, m.sweepSub, n)
		}
	}
	seen := make(map[uint32]bool, n)
	for i := range n {
		if len(rest) < metaSubLen {
			return Meta{}, fmt.Errorf("%w: metadata ends in sub-filter %d of %d", ErrCorrupt, i, n)
		}
		share := int(binary.BigEndian.Uint16(rest[4:]))
		s := SubFilter{
			ID:              binary.BigEndian.Uint32(rest),
			RootPages:       uint64(binary.BigEndian.Uint32(rest[6:])),
			FingerprintBits: int(rest[10]),
			gens:            k,
		}
		for d := range s.Lengths {
			s.Lengths[d] = binary.BigEndian.Uint64(rest[11+8*d:])
		}
		pages := uint64(binary.BigEndian.Uint32(rest[metaSubLen-4:]))
		rest = rest[metaSubLen:]
		if s.ID >= m.NextID || seen[s.ID] {
			return Meta{}, fmt.Errorf("%w: sub-filter %d has ID %d (next ID %d, duplicates not allowed)", ErrCorrupt, i, s.ID, m.NextID)
		}
		seen[s.ID] = true
		if s.RootPages == 0 || s.RootPages > 1<<maxPageBits {
			return Meta{}, fmt.Errorf("%w: sub-filter %d has %d root pages", ErrCorrupt, i, s.RootPages)
		}
		switch {
		case k == nil && share != i, share >= MaxSubFilters,
			slices.ContainsFunc(m.SubFilters, func(o SubFilter) bool { return o.share == share }):
			// Only a window drops sub-filters; a new one takes the least
			// share free, so that the shares are distinct.
			return Meta{}, fmt.Errorf("%w: sub-filter %d has share %d of the budget", ErrCorrupt, i, share)
		}
		if want := m.Params.SubFilterBits(share); s.FingerprintBits != want {
			return Meta{}, fmt.Errorf("%w: sub-filter %d has %d-bit fingerprints, its parameters give %d", ErrCorrupt, i, s.FingerprintBits, want)
		}
		m.Params.derive(&s, share)
		if pages < s.RootPages || pages > s.RootPages<<s.maxDepth || uint64(len(rest)) < (pages+1)/2 {
			return Meta{}, fmt.Errorf("%w: sub-filter %d has %d page numbers for %d root pages in %d bytes", ErrCorrupt, i, pages, s.RootPages, len(rest))
		}
		if err := s.decodeDepths(rest[:(pages+1)/2], pages); err != nil {
			return Meta{}, fmt.Errorf("%w: sub-filter %d: %w", ErrCorrupt, i, err)
		}
		rest = rest[(pages+1)/2:]
		for d, c := range s.Lengths {
			if d > s.maxDepth && c != 0 {
				return Meta{}, fmt.Errorf("%w: sub-filter %d has %d entries inserted at depth %d, beyond its %d", ErrCorrupt, i, c, d, s.maxDepth)
			}
			if c > s.Slots(m.Params.BucketSize)-s.Items {
				return Meta{}, fmt.Errorf("%w: sub-filter %d holds more entries than its %d slots", ErrCorrupt, i, s.Slots(m.Params.BucketSize))
			}
			s.Items += c
			s.weight += c << (s.maxDepth - min(d, s.maxDepth))
		}
		if s.Items > s.Slots(m.Params.BucketSize) {
			return Meta{}, fmt.Errorf("%w: sub-filter %d holds %d items in %d slots", ErrCorrupt, i, s.Items, s.Slots(m.Params.BucketSize))
		}
		if k != nil {
			s.byTag = make([][MaxDepth + 1]uint64, tags)
			var sum [MaxDepth + 1]uint64
			for t := range tags {
				for d := range MaxDepth + 1 {
					v, l := binary.Uvarint(rest)
					if l <= 0 || l != len(binary.AppendUvarint(nil, v)) {
						return Meta{}, fmt.Errorf("%w: sub-filter %d: entries of generation tag %d unreadable", ErrCorrupt, i, t)
					}
					rest = rest[l:]
					if v != 0 && !k.live(uint32(t)) {
						return Meta{}, fmt.Errorf("%w: sub-filter %d counts %d entries of expired generation tag %d", ErrCorrupt, i, v, t)
					}
					s.byTag[t][d] = v
					sum[d] += v
				}
			}
			if sum != s.Lengths {
				return Meta{}, fmt.Errorf("%w: sub-filter %d: entries by generation %v do not add up to %v", ErrCorrupt, i, sum, s.Lengths)
			}
		}
		m.SubFilters = append(m.SubFilters, s)
	}
	if k != nil && (int(m.sweepSub) == n && m.sweepRoot != 0 || int(m.sweepSub) < n && uint64(m.sweepRoot) >= m.SubFilters[m.sweepSub].RootPages) {
		return Meta{}, fmt.Errorf("%w: the sweep is at root page %d of sub-filter %d", ErrCorrupt, m.sweepRoot, m.sweepSub)
	}
	if len(rest) != 0 {
		return Meta{}, fmt.Errorf("%w: %d bytes after the last sub-filter", ErrCorrupt, len(rest))
	}
	return m, nil
}

// decodeDepths reads the depths of s's pages numbers 0..n-1 (two to a
// byte, the first in the low half) and checks that they describe pages
// split in two, each child of page k at depth d numbered k and
// k + RootPages*2^d: a number beyond the root pages is in use exactly when
// the page it split from reached its depth, and then its depth is at
// least that.
func (s *SubFilter) decodeDepths(b []byte, n uint64) error {
	s.depths = make([]uint8, n)
	for k := range n {
		d := b[k/2] >> (4 * (k % 2)) & 0xf
		if int(d) > s.maxDepth {
			return fmt.Errorf("page %d at depth %d, beyond its %d", k, d, s.maxDepth)
		}
		s.depths[k] = d
		if k < s.RootPages {
			s.atDepth[d]++
			continue
		}
		born := bits.Len64(k / s.RootPages)
		inUse := int(s.depths[k-s.RootPages<<(born-1)]) >= born
		switch {
		case inUse && int(d) < born:
			return fmt.Errorf("page %d at depth %d, born at %d", k, d, born)
		case !inUse && d != 0:
			return fmt.Errorf("page %d at depth %d is not in use", k, d)
		case inUse:
			s.atDepth[d]++
		}
	}
	if n%2 == 1 && b[len(b)-1]>>4 != 0 {
		return fmt.Errorf("depth bits after the last page")
	}
	if n > s.RootPages && s.depths[n-1] == 0 {
		// Marshal stores no page number past the last in use.
		return fmt.Errorf("page numbers stored past the last in use (%d of %d)", n-1, n)
	}
	s.Pages = 0
	for d, c := range s.atDepth {
		s.Pages += c
		if c > 0 && s.Pages == c {
			s.minDepth = d
		}
	}
	// Every page at depth d has its child numbers: a chain of splits
	// cannot end at a number beyond n.
	for k := range n {
		if d := int(s.depths[k]); d > 0 {
			born := 0
			if k >= s.RootPages {
				born = bits.Len64(k / s.RootPages)
			}
			for j := born; j < d; j++ {
				if k+s.RootPages<<j >= n {
					return fmt.Errorf("page %d at depth %d has no page %d", k, d, k+s.RootPages<<j)
				}
			}
		}
	}
	return nil
}
