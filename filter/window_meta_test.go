package filter

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"math/rand/v2"
	"testing"
	"time"
)

func rvWindowChain(t *testing.T) (*Chain, *MemPager, Params) {
	p := Params{Capacity: 50, PageBytes: 256, Expansion: 1, Window: 80 * time.Millisecond, Generations: 8}
	pager := NewMemPager(256)
	c := must(NewWithSeed(p, testSeed, pager))
	for i := range 6000 {
		must(c.InsertAt(key("k", i), int64(i/50)))
		if i%3 == 0 {
			must(0, c.AddAt(key("m", i%40), int64(i/50)-int64(i%70)))
		}
	}
	return c, pager, p
}

func reCRC(b []byte) []byte {
	body := b[:len(b)-4]
	return binary.BigEndian.AppendUint32(bytes.Clone(body), crc32.Checksum(body, crcTable))
}

// TestDecodeMetaRefusesOverlongCounts: an overlong uvarint (0x80 0x00 for
// 0) in the entries by generation tag is refused, so that one state has
// one encoding (FuzzDecodeMeta's invariant).
func TestDecodeMetaRefusesOverlongCounts(t *testing.T) {
	c, _, _ := rvWindowChain(t)
	b := c.MarshalMeta()
	m := must(DecodeMeta(b))
	// The last uvarint of the last sub-filter is the count of the last tag
	// at depth MaxDepth: 0, one byte, just before the CRC.
	if b[len(b)-5] != 0 {
		t.Fatalf("last count byte %x", b[len(b)-5])
	}
	bad := append(bytes.Clone(b[:len(b)-5]), 0x80, 0x00)
	bad = append(bad, 0, 0, 0, 0)
	bad = reCRC(bad)
	if m2, err := DecodeMeta(bad); !errors.Is(err, ErrCorrupt) {
		t.Errorf("DecodeMeta of an overlong count = %v (re-encoding to %d bytes of %d), want ErrCorrupt; %d sub-filters", err, len(m2.marshal()), len(bad), len(m.SubFilters))
	}
}

// TestDecodeMetaMutatedWindowState: one- and two-bit mutations of a
// windowed chain's metadata (CRC fixed up); whatever DecodeMeta accepts
// must open and run operations (inserts, jumps, refreshes, deletes)
// without panicking.
func TestDecodeMetaMutatedWindowState(t *testing.T) {
	c, pager, _ := rvWindowChain(t)
	b := c.MarshalMeta()
	rng := rand.New(rand.NewPCG(3, 4))
	accepted := 0
	for trial := range 4000 {
		bad := bytes.Clone(b)
		for range 1 + rng.IntN(2) {
			bad[rng.IntN(len(bad)-4)] ^= byte(1 << rng.IntN(8))
		}
		bad = reCRC(bad)
		m, err := DecodeMeta(bad)
		if err != nil {
			continue
		}
		accepted++
		pg := NewMemPager(256)
		for id, page := range pager.Pages() {
			pg.MarkDirty(id, bytes.Clone(page))
		}
		func() {
			defer func() {
				if r := recover(); r != nil {
					t.Errorf("trial %d: accepted metadata (diff at %v) panics: %v", trial, diffAt(b, bad), r)
				}
			}()
			ch, err := Open(bad, m.Params, pg)
			if err != nil {
				return
			}
			ts := int64(120)
			for i := range 3000 {
				ts += int64(rng.IntN(3))
				if i%500 == 0 {
					ts += int64(rng.IntN(40)) * 10
				}
				if _, err := ch.InsertAt(key("z", i), ts); err != nil {
					return
				}
				_, _ = ch.Refresh(key("k", i), ts)
				_, _ = ch.Delete(key("k", i+1))
				_, _ = ch.Count(key("m", i%40))
				_ = ch.Stats()
				_ = ch.MarshalMeta()
			}
		}()
	}
	t.Logf("%d of 4000 mutations accepted", accepted)
}

func diffAt(a, b []byte) []int {
	var d []int
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			d = append(d, i)
		}
	}
	return d
}
