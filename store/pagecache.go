package store

import (
	"math"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/kdedup/kdedup/filter"
)

// The page cache is in two parts:
//
//   - each PartitionState's pageTable, indexed by sub-filter and page
//     number, holds a slot per page: the clean cached page (an atomic
//     pointer, which other goroutines clear when they evict it) and the
//     dirty page (the owner's alone). A lookup is a short scan of the
//     chain's sub-filters and two slice indexes, with no lock and no hash.
//   - the DB's pageCache bounds the clean pages of all PartitionStates
//     together and chooses which to evict by CLOCK (second chance, Corbató
//     1968; the approximation of LRU operating systems use for their page
//     caches): a hit only sets the page's reference bit, and the lock is
//     taken when a page enters or leaves the cache.
//
// It replaces a hash map plus LRU list shared by every partition, whose
// lookup, list move and lock cost about a quarter of the CPU per record
// at 20M keys held (docs/bench/HISTORY.md, "Page table").

// chunkPages is the number of page slots of a pageChunk: 256 slots of 28
// bytes, 7 KiB of table per MiB of 4 KiB pages.
const chunkPages = 256

// pageChunk holds the slots of chunkPages consecutive pages of one
// sub-filter.
type pageChunk struct {
	// clean is the page's entry in the DB's pageCache, nil when it is not
	// cached. The owner stores it; any goroutine evicting it clears it.
	clean [chunkPages]atomic.Pointer[cachedPage]
	// dirty is the page's dirty record (PartitionState.dirty), nil when it
	// is clean. The owner's alone.
	dirty [chunkPages]*dirtyPage
	// pend is the page's pendingPage (PartitionState.pending), nil when
	// its base holds every committed change, and patchLen its patch's
	// length: looked up here on a record's path rather than in the map.
	// The owner's alone.
	pend     [chunkPages]*pendingPage
	patchLen [chunkPages]uint32
}

// subTable is the slots of one sub-filter's pages, created chunk by chunk
// as pages are used.
type subTable struct {
	id     uint32
	chunks []*pageChunk
}

// pageTable is a PartitionState's index of its cached and dirty pages. It
// is not safe for concurrent use (its owner's goroutine alone), except
// that pageCache clears the clean slots of evicted pages from any
// goroutine, atomically.
type pageTable struct {
	subs []subTable
}

// slot returns the chunk holding id's slot and the slot's index in it;
// with create it makes the chunk if there is none, else it returns nil.
func (t *pageTable) slot(id filter.PageID, create bool) (*pageChunk, int) {
	var st *subTable
	// Newest sub-filters last: most lookups of a chain are of its larger,
	// newer sub-filters.
	for i := len(t.subs) - 1; i >= 0; i-- {
		if t.subs[i].id == id.SubFilter {
			st = &t.subs[i]
			break
		}
	}
	if st == nil {
		if !create {
			return nil, 0
		}
		t.subs = append(t.subs, subTable{id: id.SubFilter})
		st = &t.subs[len(t.subs)-1]
	}
	c := int(id.Page / chunkPages)
	if c >= len(st.chunks) {
		if !create {
			return nil, 0
		}
		st.chunks = append(st.chunks, make([]*pageChunk, c+1-len(st.chunks))...)
	}
	ch := st.chunks[c]
	if ch == nil {
		if !create {
			return nil, 0
		}
		ch = new(pageChunk)
		st.chunks[c] = ch
	}
	return ch, int(id.Page % chunkPages)
}

// drop forgets sub-filter id's slots; its cached pages age out of the
// pageCache, whose entries still point at their slots.
func (t *pageTable) drop(id uint32) {
	for i := range t.subs {
		if t.subs[i].id == id {
			t.subs = slices.Delete(t.subs, i, i+1) // zeroes the vacated element
			return
		}
	}
}

// clockEntry is one page of the pageCache: the slot that holds it and the
// page, nil when the entry is free.
type clockEntry struct {
	slot *atomic.Pointer[cachedPage]
	page *cachedPage
}

// pageCache bounds the clean cached pages of a DB's PartitionStates to its
// capacity and evicts by CLOCK. It is safe for concurrent use.
type pageCache struct {
	mu   sync.Mutex
	ring []clockEntry
	// used is the number of ring entries ever used: entries from used on
	// are free without being on the free list.
	used int
	free []int32
	hand int
	// capacity is the most entries ring grows to (int32 indexes).
	capacity int
}

func newPageCache(pages int) *pageCache {
	return &pageCache{capacity: min(max(pages, 1), math.MaxInt32)}
}

// add caches c in slot, evicting a page if the cache is full. The caller
// owns slot and it holds no page.
func (pc *pageCache) add(slot *atomic.Pointer[cachedPage], c *cachedPage) {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	i := pc.take()
	pc.ring[i] = clockEntry{slot: slot, page: c}
	c.ring = int32(i)
	c.ref.Store(true) // just read: a second chance, as LRU puts it in front
	slot.Store(c)
}

// take returns a free entry, evicting the first page the hand finds with
// its reference bit clear (clearing the bits it passes), so a call scans
// at most one lap and a page just added, whose bit is set, is not evicted
// before the hand has passed every other page (Prefetch relies on its
// pages staying until their Page call).
func (pc *pageCache) take() int {
	if n := len(pc.free); n > 0 {
		i := pc.free[n-1]
		pc.free = pc.free[:n-1]
		return int(i)
	}
	if pc.used < pc.capacity {
		if pc.used == len(pc.ring) {
			pc.ring = append(pc.ring, clockEntry{})
			pc.ring = pc.ring[:cap(pc.ring)][:min(cap(pc.ring), pc.capacity)]
		}
		pc.used++
		return pc.used - 1
	}
	for {
		i := pc.hand
		pc.hand++
		if pc.hand == pc.used {
			pc.hand = 0
		}
		e := &pc.ring[i]
		if e.page == nil {
			return i
		}
		if e.page.ref.Load() {
			e.page.ref.Store(false)
			continue
		}
		// Evicted here, unless its owner took it out since (a stale
		// entry, taken as free).
		e.slot.CompareAndSwap(e.page, nil)
		*e = clockEntry{}
		return i
	}
}

// remove takes the page in slot out of the cache, if one is there: the
// slot's owner does, when the page becomes dirty.
func (pc *pageCache) remove(slot *atomic.Pointer[cachedPage]) {
	c := slot.Swap(nil)
	if c == nil {
		return
	}
	pc.mu.Lock()
	defer pc.mu.Unlock()
	// An evictor may have reused the entry between the Swap and the lock:
	// then it no longer names c.
	if e := &pc.ring[c.ring]; e.page == c {
		*e = clockEntry{}
		pc.free = append(pc.free, c.ring)
	}
}

// purge empties the cache.
func (pc *pageCache) purge() {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	for i := range pc.ring[:pc.used] {
		if e := &pc.ring[i]; e.page != nil {
			e.slot.CompareAndSwap(e.page, nil)
			*e = clockEntry{}
		}
	}
	pc.used, pc.free, pc.hand = 0, nil, 0
}
