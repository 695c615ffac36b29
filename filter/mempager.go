package filter

// MemPager is an in-memory Pager: every page stays in a map, and the pages
// marked dirty since the last TakeDirty are remembered. The zero value is not
// usable; use NewMemPager. Not safe for concurrent use.
type MemPager struct {
	pageBytes int
	pages     map[PageID][]byte
	dirty     map[PageID]struct{}
}

// NewMemPager returns an empty MemPager of pages of pageBytes bytes (0 means
// DefaultPageBytes).
func NewMemPager(pageBytes int) *MemPager {
	if pageBytes == 0 {
		pageBytes = DefaultPageBytes
	}
	return &MemPager{pageBytes: pageBytes, pages: map[PageID][]byte{}, dirty: map[PageID]struct{}{}}
}

// Page returns page id, allocating a zeroed page on first use.
func (m *MemPager) Page(id PageID) ([]byte, error) {
	pg, ok := m.pages[id]
	if !ok {
		pg = make([]byte, m.pageBytes)
		m.pages[id] = pg
	}
	return pg, nil
}

// MarkDirty records id as changed.
func (m *MemPager) MarkDirty(id PageID, page []byte) {
	m.pages[id] = page
	m.dirty[id] = struct{}{}
}

// Drop deletes every page of subFilter.
func (m *MemPager) Drop(subFilter uint32) {
	for id := range m.pages {
		if id.SubFilter == subFilter {
			delete(m.pages, id)
			delete(m.dirty, id)
		}
	}
}

// TakeDirty returns the pages marked dirty since the previous call and
// forgets them.
func (m *MemPager) TakeDirty() map[PageID]struct{} {
	d := m.dirty
	m.dirty = map[PageID]struct{}{}
	return d
}

// Pages returns the map of every page touched so far (not a copy).
func (m *MemPager) Pages() map[PageID][]byte { return m.pages }
