package filter

// MemPager is an in-memory Pager: every page stays in memory, indexed by
// sub-filter ID and page number (slices, not a map, so that a lookup costs a
// few nanoseconds), and the pages marked dirty since the last TakeDirty are
// remembered. The zero value is not usable; use NewMemPager. Not safe for
// concurrent use.
type MemPager struct {
	pageBytes int
	subs      [][][]byte // [sub-filter ID][page] -> page, nil until touched
	dirty     [][]uint64 // [sub-filter ID] -> bit set of dirty pages
}

// NewMemPager returns an empty MemPager of pages of pageBytes bytes (0 means
// DefaultPageBytes).
func NewMemPager(pageBytes int) *MemPager {
	if pageBytes == 0 {
		pageBytes = DefaultPageBytes
	}
	return &MemPager{pageBytes: pageBytes}
}

// Page returns page id, allocating a zeroed page on first use.
func (m *MemPager) Page(id PageID) ([]byte, error) {
	if int(id.SubFilter) < len(m.subs) {
		if pages := m.subs[id.SubFilter]; int(id.Page) < len(pages) {
			if pg := pages[id.Page]; pg != nil {
				return pg, nil
			}
		}
	}
	pg := make([]byte, m.pageBytes)
	m.store(id, pg)
	return pg, nil
}

// Peek returns page id if it was touched, nil otherwise (Peeker).
func (m *MemPager) Peek(id PageID) []byte {
	if int(id.SubFilter) < len(m.subs) {
		if pages := m.subs[id.SubFilter]; int(id.Page) < len(pages) {
			return pages[id.Page]
		}
	}
	return nil
}

// store puts pg at id, growing the index as needed.
func (m *MemPager) store(id PageID, pg []byte) {
	for int(id.SubFilter) >= len(m.subs) {
		m.subs = append(m.subs, nil)
		m.dirty = append(m.dirty, nil)
	}
	pages := m.subs[id.SubFilter]
	if int(id.Page) >= len(pages) {
		pages = append(pages, make([][]byte, int(id.Page)+1-len(pages))...)
		m.subs[id.SubFilter] = pages
		m.dirty[id.SubFilter] = append(m.dirty[id.SubFilter], make([]uint64, (len(pages)+63)/64-len(m.dirty[id.SubFilter]))...)
	}
	pages[id.Page] = pg
}

// MarkDirty records id as changed.
func (m *MemPager) MarkDirty(id PageID, page []byte) {
	m.store(id, page)
	m.dirty[id.SubFilter][id.Page/64] |= 1 << (id.Page % 64)
}

// MarkChanged records id as changed; MemPager keeps no finer record than the
// page.
func (m *MemPager) MarkChanged(id PageID, page []byte, _, _ int) { m.MarkDirty(id, page) }

// Drop deletes every page of subFilter.
func (m *MemPager) Drop(subFilter uint32) {
	if int(subFilter) < len(m.subs) {
		m.subs[subFilter], m.dirty[subFilter] = nil, nil
	}
}

// TakeDirty returns the pages marked dirty since the previous call and
// forgets them.
func (m *MemPager) TakeDirty() map[PageID]struct{} {
	d := map[PageID]struct{}{}
	for sub, set := range m.dirty {
		for w, bits := range set {
			for b := range 64 {
				if bits&(1<<b) != 0 {
					d[PageID{SubFilter: uint32(sub), Page: uint32(w*64 + b)}] = struct{}{}
				}
			}
			set[w] = 0
		}
	}
	return d
}

// Pages returns every page touched so far and not dropped, by ID (the pages
// themselves, not copies; the map is built on each call).
func (m *MemPager) Pages() map[PageID][]byte {
	all := map[PageID][]byte{}
	for sub, pages := range m.subs {
		for i, pg := range pages {
			if pg != nil {
				all[PageID{SubFilter: uint32(sub), Page: uint32(i)}] = pg
			}
		}
	}
	return all
}
