package store

import (
	"bytes"
	"math"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kdedup/kdedup/filter"
)

// dirtyFreed reports whether the dirty page of id is garbage-collected after
// act runs (with the partition's references to it gone).
func dirtyFreed(t *testing.T, shareChunk bool, act func(p *PartitionState)) bool {
	const pb = 64
	db := openT(t, Options{InMemory: true, PageBytes: pb, CacheBytes: 64 * pb, FlushBytes: smallFlush})
	p := partitionT(t, db, "orders", 1)
	clean := filter.PageID{SubFilter: 3, Page: 0} // same chunk as dirty
	if !shareChunk {
		clean = filter.PageID{SubFilter: 3, Page: 1000} // another chunk
	}
	dirty := filter.PageID{SubFilter: 3, Page: 1}
	mustPage(t, p, clean) // a clean cached page: a ring entry points into its chunk
	pg := mustPage(t, p, dirty)
	pg[0] = 1
	p.MarkChanged(dirty, pg, 0, 1)
	mustPage(t, p, filter.PageID{SubFilter: 4, Page: 0}) // sub 3 is not last in table.subs
	var freed atomic.Bool
	ch, i := p.table.slot(dirty, false)
	runtime.SetFinalizer(ch.dirty[i], func(*dirtyPage) { freed.Store(true) })
	pg = nil
	act(p)
	for range 5 {
		runtime.GC()
		time.Sleep(10 * time.Millisecond)
	}
	runtime.KeepAlive(p)
	return freed.Load()
}

// TestForgottenDirtyPagesAreFreed: the dirty pages Discard, Close and Drop
// forget are garbage once the partition lets go of them, even when a clean
// page of the same page-table chunk is still cached (the cache's entry
// keeps the chunk, which must not keep them).
func TestForgottenDirtyPagesAreFreed(t *testing.T) {
	for _, c := range []struct {
		name string
		act  func(p *PartitionState)
	}{
		{"Discard", func(p *PartitionState) { p.Discard() }},
		{"Close", func(p *PartitionState) { p.Close() }},
		{"Drop", func(p *PartitionState) { p.Drop(3) }},
	} {
		t.Logf("%s: control freed=%v, shared chunk freed=%v", c.name, dirtyFreed(t, false, c.act), dirtyFreed(t, true, c.act))
		if !dirtyFreed(t, false, c.act) {
			t.Errorf("%s, control (no clean page in the chunk): dirty page not freed", c.name)
		}
		if !dirtyFreed(t, true, c.act) {
			t.Errorf("%s: the forgotten dirty page is still reachable (ring entry -> pageChunk.dirty)", c.name)
		}
	}
}

// TestPrefetchedPageOutlivesTheNextAdd: a page Prefetch reads is not the
// next page evicted, even when every older page was read since it entered
// (a new page enters with its reference bit set, as an LRU puts it in
// front), so the Page call that follows finds it cached.
func TestPrefetchedPageOutlivesTheNextAdd(t *testing.T) {
	const pb = 64
	db := openT(t, Options{InMemory: true, PageBytes: pb, CacheBytes: 8 * pb, FlushBytes: smallFlush})
	p := partitionT(t, db, "orders", 1)
	defer p.Close()
	id := func(i int) filter.PageID { return filter.PageID{Page: uint32(i)} }
	var hot []filter.PageID
	for i := range 8 {
		mustPage(t, p, id(i))
		hot = append(hot, id(i))
	}
	if err := p.Prefetch(hot); err != nil { // all cached: reference bits set
		t.Fatal(err)
	}
	pg := mustPage(t, p, id(5))
	pg[0] = 9
	p.MarkChanged(id(5), pg, 0, 1) // its ring entry goes on the free list
	t.Logf("PrefetchLimit %d", p.PrefetchLimit())
	if err := p.Prefetch([]filter.PageID{id(8), id(9)}); err != nil {
		t.Fatal(err)
	}
	misses := p.CacheMisses()
	mustPage(t, p, id(8))
	if p.CacheMisses() != misses {
		t.Errorf("page 8, prefetched (2 pages, limit %d, 7 other clean pages, capacity 8), was evicted before its Page call: read twice", p.PrefetchLimit())
	}
}

// TestHugeCacheBytesOpens: any CacheBytes opens; the cache's ring grows
// with the pages cached instead of being allocated for CacheBytes.
func TestHugeCacheBytesOpens(t *testing.T) {
	defer func() {
		if r := recover(); r != nil {
			t.Errorf("Open panicked: %v", r)
		}
	}()
	db, err := Open(Options{InMemory: true, CacheBytes: math.MaxInt64})
	if err == nil {
		db.Close()
	}
}

// TestPageCacheConcurrentAgainstModel: four partitions over a cache of
// three pages, reading, changing, prefetching, committing, discarding and
// reopening at once, each checked against its model; afterwards no slot has
// two entries in the cache, no cached page is without one, and the cache
// holds at most its capacity.
func TestPageCacheConcurrentAgainstModel(t *testing.T) {
	const pb = 32
	db := openT(t, Options{InMemory: true, PageBytes: pb, FlushBytes: smallFlush, CacheBytes: 3 * pb})
	ids := universe(3, 600) // pages span several chunks
	var wg sync.WaitGroup
	var mu sync.Mutex
	var live []*PartitionState
	for w := range int32(4) {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			p, _ := db.Partition("t", w)
			m := newModel(pb)
			for step := range 8000 {
				id := ids[rng.IntN(len(ids))]
				switch r := rng.IntN(100); {
				case r < 40:
					got, err := p.Page(id)
					if err != nil {
						t.Error(err)
						return
					}
					if !bytes.Equal(got, m.page(id)) {
						t.Errorf("w%d step %d: %v differs", w, step, id)
						return
					}
				case r < 65:
					got, err := p.Page(id)
					if err != nil {
						t.Error(err)
						return
					}
					got[rng.IntN(pb)] = byte(rng.Uint32())
					p.MarkChanged(id, got, 0, pb)
					m.dirty[id] = append([]byte{}, got...)
				case r < 80:
					if err := p.Prefetch([]filter.PageID{id, ids[rng.IntN(len(ids))]}); err != nil {
						t.Error(err)
						return
					}
				case r < 95:
					if err := p.Commit([]byte{1}, Checkpoint{Offset: int64(step)}); err != nil {
						t.Error(err)
						return
					}
					m.commit([]byte{1}, Checkpoint{Offset: int64(step)})
				case r < 98:
					p.Discard()
					clear(m.dirty)
				default:
					p.Close()
					clear(m.dirty)
					p, _ = db.Partition("t", w)
				}
			}
			mu.Lock()
			live = append(live, p)
			mu.Unlock()
		})
	}
	wg.Wait()
	pc := db.cache
	entries := map[*atomic.Pointer[cachedPage]]int{}
	for _, e := range pc.ring[:pc.used] {
		if e.page != nil && e.slot.Load() == e.page {
			entries[e.slot]++
		}
	}
	for s, n := range entries {
		if n > 1 {
			t.Errorf("slot %p has %d resident entries", s, n)
		}
	}
	orphans := 0
	for _, p := range live {
		for _, st := range p.table.subs {
			for _, ch := range st.chunks {
				if ch == nil {
					continue
				}
				for i := range ch.clean {
					if ch.clean[i].Load() != nil && entries[&ch.clean[i]] == 0 {
						orphans++
					}
				}
			}
		}
	}
	if orphans > 0 || pc.resident() > len(pc.ring) {
		t.Errorf("%d cached pages without an entry; resident %d of %d", orphans, pc.resident(), len(pc.ring))
	}
}

// TestPurgeWhilePartitionsRead: partitions may still be reading when
// DB.Close purges the cache (a data race shows under -race).
func TestPurgeWhilePartitionsRead(t *testing.T) {
	const pb = 32
	db := openT(t, Options{InMemory: true, PageBytes: pb, FlushBytes: smallFlush, CacheBytes: 4 * pb})
	var wg sync.WaitGroup
	for w := range int32(3) {
		p := partitionT(t, db, "t", w)
		wg.Go(func() {
			for i := range 20000 {
				id := filter.PageID{Page: uint32(i % 50)}
				pg, err := p.Page(id)
				if err != nil {
					return
				}
				if i%3 == 0 {
					p.MarkChanged(id, pg, 0, 1)
				}
				_ = p.Prefetch([]filter.PageID{{Page: uint32(i % 7)}})
			}
		})
	}
	time.Sleep(20 * time.Millisecond)
	db.Close()
	wg.Wait()
}

// TestDroppedSubFilterTableFreed: a dropped sub-filter's page-table chunks
// are garbage, the last sub-filter of the table's slice included.
func TestDroppedSubFilterTableFreed(t *testing.T) {
	var tb pageTable
	ch, _ := tb.slot(filter.PageID{SubFilter: 1}, true)
	var freed atomic.Bool
	runtime.SetFinalizer(ch, func(*pageChunk) { freed.Store(true) })
	ch = nil
	tb.drop(1)
	for range 5 {
		runtime.GC()
		time.Sleep(10 * time.Millisecond)
	}
	runtime.KeepAlive(&tb)
	if !freed.Load() {
		t.Errorf("dropped sub-filter's chunk still reachable; cap(subs)=%d, subs[:1][0].id=%d", cap(tb.subs), tb.subs[:1][0].id)
	}
}

// resident returns the number of pages cached: ring entries whose slot
// still holds their page.
func (pc *pageCache) resident() int {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	n := 0
	for _, e := range pc.ring[:pc.used] {
		if e.page != nil && e.slot.Load() == e.page {
			n++
		}
	}
	return n
}

// TestPeekReadsNothing: Peek returns a page only if it is in memory (the
// bytes Page returns, dirty or cached), nil otherwise, and never reads
// Badger: a page written and evicted stays unread, and Page reads it after.
func TestPeekReadsNothing(t *testing.T) {
	const pb = 64
	db := openT(t, Options{InMemory: true, PageBytes: pb, CacheBytes: 4 * pb, FlushBytes: smallFlush})
	p := partitionT(t, db, "orders", 1)
	defer p.Close()
	id := func(i int) filter.PageID { return filter.PageID{Page: uint32(i)} }
	pg := mustPage(t, p, id(0))
	pg[0] = 7
	p.MarkChanged(id(0), pg, 0, 1)
	if got := p.Peek(id(0)); got == nil || got[0] != 7 {
		t.Fatalf("Peek of a dirty page = %v, want its bytes", got)
	}
	if err := p.Commit(nil, Checkpoint{Offset: 1}); err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 8; i++ { // evict page 0 from a cache of 4 pages
		mustPage(t, p, id(i))
	}
	misses := p.CacheMisses()
	if got := p.Peek(id(0)); got != nil {
		t.Errorf("Peek of a page not in memory = %v, want nil", got)
	}
	if got := p.Peek(id(100)); got != nil {
		t.Errorf("Peek of a page never written = %v, want nil", got)
	}
	if p.CacheMisses() != misses {
		t.Fatalf("Peek read %d pages from Badger", p.CacheMisses()-misses)
	}
	if got := mustPage(t, p, id(0)); got[0] != 7 {
		t.Fatalf("page 0 read back %v", got)
	}
	if p.CacheMisses() != misses+1 {
		t.Fatalf("Page of an evicted page read %d pages, want 1", p.CacheMisses()-misses)
	}
	if got := p.Peek(id(0)); got == nil || got[0] != 7 {
		t.Fatalf("Peek of a cached page = %v, want its bytes", got)
	}
}
