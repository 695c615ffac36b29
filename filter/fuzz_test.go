package filter

import (
	"bytes"
	"errors"
	"testing"
)

// FuzzDecodeMeta feeds arbitrary bytes to DecodeMeta. Invariants:
//   - it never panics;
//   - it fails only with ErrCorrupt, or ErrParams for another format
//     version or hash;
//   - what it accepts re-encodes to exactly the input (one encoding per
//     state), and a chain opened from it answers lookups without panicking.
func FuzzDecodeMeta(f *testing.F) {
	c, _ := New(Params{Capacity: 4096, PageBytes: 512}, NewMemPager(512))
	for i := range 3000 {
		_ = c.Add(key("k", i))
	}
	f.Add(c.MarshalMeta())
	f.Add([]byte{})
	f.Add([]byte("KDCF"))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := DecodeMeta(b)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrParams) {
				t.Fatalf("error %v is neither ErrCorrupt nor ErrParams", err)
			}
			return
		}
		if got := m.marshal(); !bytes.Equal(got, b) {
			t.Fatalf("re-encoding differs:\n got %x\nwant %x", got, b)
		}
		ch, err := Open(b, m.Params, NewMemPager(m.Params.PageBytes))
		if err != nil {
			t.Fatalf("Open of decodable meta: %v", err)
		}
		if _, err := ch.Contains([]byte("x")); err != nil {
			t.Fatal(err)
		}
	})
}

// FuzzPage runs chain operations over pages holding arbitrary bytes.
// Invariants:
//   - nothing panics, whatever the page content or length;
//   - a page of the wrong length fails with ErrCorrupt;
//   - on a page of the right length, a key just inserted is contained and
//     Count is at least 1 (no false negative even over garbage).
func FuzzPage(f *testing.F) {
	f.Add(make([]byte, 512), []byte("key"), uint64(0))
	f.Add(bytes.Repeat([]byte{0xff}, 512), []byte("k"), uint64(1))
	f.Add([]byte{1, 2, 3}, []byte("k"), uint64(2))
	f.Fuzz(func(t *testing.T, page []byte, k []byte, seed uint64) {
		// The chain writes into the page, and the fuzzing engine's inputs
		// must not be modified (k may share their memory).
		page, k = bytes.Clone(page), bytes.Clone(k)
		pager := &fixedPager{page: page}
		c, err := NewWithSeed(Params{Capacity: 1, PageBytes: 512, MaxKicks: 20}, Seed{K0: seed, K1: ^seed}, pager)
		if err != nil {
			t.Fatal(err)
		}
		if len(page) != 512 {
			if _, err := c.Contains(k); !errors.Is(err, ErrCorrupt) {
				t.Fatalf("page of %d bytes: %v", len(page), err)
			}
			return
		}
		if err := c.Add(k); err != nil {
			t.Fatal(err)
		}
		if ok, err := c.Contains(k); err != nil || !ok {
			t.Fatalf("key not contained after Add: %v %v", ok, err)
		}
		if n, err := c.Count(k); err != nil || n < 1 {
			t.Fatalf("Count = %d, %v", n, err)
		}
		if _, err := c.Delete(k); err != nil {
			t.Fatal(err)
		}
	})
}

// fixedPager serves one page (a copy of the fuzz input) for page 0 of
// sub-filter 0 and zeroed pages elsewhere.
type fixedPager struct {
	page  []byte
	other map[PageID][]byte
}

func (p *fixedPager) Page(id PageID) ([]byte, error) {
	if id == (PageID{}) {
		return p.page, nil
	}
	if p.other == nil {
		p.other = map[PageID][]byte{}
	}
	if _, ok := p.other[id]; !ok {
		p.other[id] = make([]byte, 512)
	}
	return p.other[id], nil
}

func (p *fixedPager) MarkDirty(PageID, []byte) {}

func (p *fixedPager) MarkChanged(PageID, []byte, int, int) {}

func (p *fixedPager) Drop(uint32) {}
