package filter

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"math"
)

// FormatVersion is the version of the metadata and page format this package
// writes. Open refuses any other.
const FormatVersion = 2

// HashXXH64 identifies xxhash64 as the key hash in the metadata. Changing
// the hash is a format change.
const HashXXH64 = 1

var metaMagic = [4]byte{'K', 'D', 'C', 'F'}

const (
	metaHeaderLen = 4 + 1 + 1 + 1 + 1 + 4 + 2 + 4 + 8 + 8 + 2 // magic .. sub-filter count
	metaSubLen    = 8 + 1 + 8
	metaCRCLen    = 4
)

// Meta is the decoded chain metadata.
type Meta struct {
	FormatVersion int
	HashID        int
	Params        Params
	SubFilters    []SubFilter
}

// MarshalMeta encodes the chain metadata: format version, hash id, Params and
// every sub-filter (pages, fingerprint width, items), big endian, followed
// by a CRC-32C of the preceding bytes.
func (c *Chain) MarshalMeta() []byte {
	return Meta{FormatVersion: FormatVersion, HashID: HashXXH64, Params: c.p, SubFilters: c.subs}.marshal()
}

func (m Meta) marshal() []byte {
	b := make([]byte, 0, metaHeaderLen+len(m.SubFilters)*metaSubLen+metaCRCLen)
	b = append(b, metaMagic[:]...)
	b = append(b, byte(m.FormatVersion), byte(m.HashID), byte(m.Params.FingerprintBits), byte(m.Params.BucketSize))
	b = binary.BigEndian.AppendUint32(b, uint32(m.Params.MaxKicks))
	b = binary.BigEndian.AppendUint16(b, uint16(m.Params.Expansion))
	b = binary.BigEndian.AppendUint32(b, uint32(m.Params.PageBytes))
	b = binary.BigEndian.AppendUint64(b, m.Params.Capacity)
	b = binary.BigEndian.AppendUint64(b, math.Float64bits(m.Params.TargetFPR))
	b = binary.BigEndian.AppendUint16(b, uint16(len(m.SubFilters)))
	for _, s := range m.SubFilters {
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
// sub-filter geometry that the recorded Params could not have produced. It
// does not compare versions or Params; Open does.
func DecodeMeta(b []byte) (Meta, error) {
	if len(b) < metaHeaderLen+metaCRCLen {
		return Meta{}, fmt.Errorf("%w: metadata is %d bytes, shorter than its header", ErrCorrupt, len(b))
	}
	body, sum := b[:len(b)-metaCRCLen], binary.BigEndian.Uint32(b[len(b)-metaCRCLen:])
	if [4]byte(body[:4]) != metaMagic {
		return Meta{}, fmt.Errorf("%w: metadata magic %q", ErrCorrupt, body[:4])
	}
	if got := crc32.Checksum(body, crcTable); got != sum {
		return Meta{}, fmt.Errorf("%w: metadata checksum %08x, want %08x", ErrCorrupt, got, sum)
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
		},
	}
	n := int(binary.BigEndian.Uint16(body[34:]))
	rest := body[metaHeaderLen:]
	if len(rest) != n*metaSubLen {
		return Meta{}, fmt.Errorf("%w: metadata lists %d sub-filters in %d bytes", ErrCorrupt, n, len(rest))
	}
	if n == 0 || n > MaxSubFilters {
		return Meta{}, fmt.Errorf("%w: %d sub-filters", ErrCorrupt, n)
	}
	if m.Params.Validate() != nil || m.Params != m.Params.WithDefaults() {
		// Versions and hashes are compared by Open, but geometry must be
		// sane before anything indexes pages with it.
		return Meta{}, fmt.Errorf("%w: metadata parameters %s", ErrCorrupt, m.Params)
	}
	for i := range n {
		r := rest[i*metaSubLen:]
		s := SubFilter{
			Pages:           binary.BigEndian.Uint64(r),
			FingerprintBits: int(r[8]),
			Items:           binary.BigEndian.Uint64(r[9:]),
		}
		if s.Pages == 0 || s.Pages > 1<<maxPageBits || s.Pages&(s.Pages-1) != 0 {
			return Meta{}, fmt.Errorf("%w: sub-filter %d has %d pages", ErrCorrupt, i, s.Pages)
		}
		if want := m.Params.SubFilterBits(i); s.FingerprintBits != want {
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

// Open returns the chain described by meta (as written by MarshalMeta), over
// pager. It returns ErrParams, naming the stored and the configured values,
// when meta was written with another format version, hash or Params than p
// (after defaults): a chain's layout depends on all of them, and recovery
// relies on state being a function of input and Params. A nil or empty meta
// is a new chain, as New.
func Open(meta []byte, p Params, pager Pager) (*Chain, error) {
	if len(meta) == 0 {
		return New(p, pager)
	}
	p = p.WithDefaults()
	if err := p.Validate(); err != nil {
		return nil, err
	}
	m, err := DecodeMeta(meta)
	if err != nil {
		return nil, err
	}
	if m.FormatVersion != FormatVersion || m.HashID != HashXXH64 {
		return nil, fmt.Errorf("%w: stored format version %d hash %d, this build reads format version %d hash %d",
			ErrParams, m.FormatVersion, m.HashID, FormatVersion, HashXXH64)
	}
	if m.Params != p {
		return nil, fmt.Errorf("%w: stored %s, configured %s", ErrParams, m.Params, p)
	}
	c := newChain(p, pager)
	c.subs = m.SubFilters
	return c, nil
}
