package filter

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"math"
	"time"
)

// FormatVersion is the version of the metadata and page format this package
// writes. DecodeMeta and Open refuse any other. Version 5 keys the hash with
// a per-chain secret seed, keeps a key's two buckets distinct (even bucket
// counts per page) and stores Params.KeySpec.
const FormatVersion = 5

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
	metaSubLen    = 4 + 8 + 8 + 1 + 8 // ID, generation, pages, width, items
	metaCRCLen    = 4
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
}

// MarshalMeta encodes the chain metadata: format version, hash id, Params
// but the key spec, next sub-filter ID, watermark, the sub-filter count,
// hash seed, the key spec (16-bit length and bytes) and every sub-filter
// (ID, generation, pages, fingerprint width, items), big endian, followed by
// a CRC-32C of the preceding bytes. It holds the secret hash seed: store it
// like the pages, never log it.
func (c *Chain) MarshalMeta() []byte {
	return Meta{FormatVersion: FormatVersion, HashID: HashSipHash24, Params: c.p,
		NextID: c.nextID, Watermark: c.watermark, Seed: c.seed, SubFilters: c.subs}.marshal()
}

// Marshal encodes m as MarshalMeta encodes a chain's metadata; DecodeMeta
// reads it back. It holds the secret hash seed: store it like the pages,
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
			return uint64(id.Page) < s.Pages
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
	b := make([]byte, 0, metaHeaderLen+len(m.Params.KeySpec)+len(m.SubFilters)*metaSubLen+metaCRCLen)
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
	for _, s := range m.SubFilters {
		b = binary.BigEndian.AppendUint32(b, s.ID)
		b = binary.BigEndian.AppendUint64(b, uint64(s.Generation))
		b = binary.BigEndian.AppendUint64(b, s.Pages)
		b = append(b, byte(s.FingerprintBits))
		b = binary.BigEndian.AppendUint64(b, s.Items)
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
	if len(rest) != n*metaSubLen {
		return Meta{}, fmt.Errorf("%w: metadata lists %d sub-filters in %d bytes", ErrCorrupt, n, len(rest))
	}
	windowed := m.Params.Window > 0
	if (n == 0 && !windowed) || n > MaxSubFilters*max(1, m.Params.liveGenerations()) {
		return Meta{}, fmt.Errorf("%w: %d sub-filters", ErrCorrupt, n)
	}
	if m.Params.Validate() != nil || m.Params != m.Params.WithDefaults() {
		// Versions and hashes are compared by Open, but geometry must be
		// sane before anything indexes pages with it.
		return Meta{}, fmt.Errorf("%w: metadata parameters %s", ErrCorrupt, m.Params)
	}
	seen := make(map[uint32]bool, n)
	inGen := 0 // index of the sub-filter within its generation
	for i := range n {
		r := rest[i*metaSubLen:]
		s := SubFilter{
			ID:              binary.BigEndian.Uint32(r),
			Generation:      int64(binary.BigEndian.Uint64(r[4:])),
			Pages:           binary.BigEndian.Uint64(r[12:]),
			FingerprintBits: int(r[20]),
			Items:           binary.BigEndian.Uint64(r[21:]),
		}
		if s.ID >= m.NextID || seen[s.ID] {
			return Meta{}, fmt.Errorf("%w: sub-filter %d has ID %d (next ID %d, duplicates not allowed)", ErrCorrupt, i, s.ID, m.NextID)
		}
		seen[s.ID] = true
		switch {
		case !windowed && s.Generation != 0:
			return Meta{}, fmt.Errorf("%w: sub-filter %d is in generation %d without a window", ErrCorrupt, i, s.Generation)
		case i > 0 && s.Generation < m.SubFilters[i-1].Generation:
			return Meta{}, fmt.Errorf("%w: sub-filter %d is in generation %d after generation %d", ErrCorrupt, i, s.Generation, m.SubFilters[i-1].Generation)
		case i > 0 && s.Generation == m.SubFilters[i-1].Generation:
			inGen++
		default:
			inGen = 0
		}
		if inGen >= MaxSubFilters {
			return Meta{}, fmt.Errorf("%w: generation %d has more than %d sub-filters", ErrCorrupt, s.Generation, MaxSubFilters)
		}
		if s.Pages == 0 || s.Pages > 1<<maxPageBits {
			return Meta{}, fmt.Errorf("%w: sub-filter %d has %d pages", ErrCorrupt, i, s.Pages)
		}
		if want := m.Params.SubFilterBits(inGen); s.FingerprintBits != want {
			return Meta{}, fmt.Errorf("%w: sub-filter %d has %d-bit fingerprints, its parameters give %d", ErrCorrupt, i, s.FingerprintBits, want)
		}
		s.bucketsPerPage = m.Params.bucketsPerPage(s.FingerprintBits)
		if s.Items > s.Slots(m.Params.BucketSize) {
			return Meta{}, fmt.Errorf("%w: sub-filter %d holds %d items in %d slots", ErrCorrupt, i, s.Items, s.Slots(m.Params.BucketSize))
		}
		m.SubFilters = append(m.SubFilters, s)
	}
	return m, nil
}
