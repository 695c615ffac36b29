package store

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/dgraph-io/badger/v4"
	dto "github.com/prometheus/client_model/go"

	"github.com/kdedup/kdedup/filter"
)

// storedEntries scans every page entry of p in Badger and returns, per
// page, its base sequence number (-1 without a base) and its delta
// sequence numbers in key order.
func storedEntries(t *testing.T, p *PartitionState) (bases map[filter.PageID]int64, deltas map[filter.PageID][]uint32) {
	t.Helper()
	bases, deltas = map[filter.PageID]int64{}, map[filter.PageID][]uint32{}
	start := append(append([]byte{}, p.prefix...), tagPage)
	err := p.db.bdb.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: start})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			k := it.Item().Key()[len(start):]
			id := filter.PageID{SubFilter: binary.BigEndian.Uint32(k), Page: binary.BigEndian.Uint32(k[4:])}
			switch len(k) {
			case 8:
				err := it.Item().Value(func(v []byte) error {
					bases[id] = int64(binary.BigEndian.Uint32(v))
					return nil
				})
				if err != nil {
					return err
				}
			case 12:
				deltas[id] = append(deltas[id], binary.BigEndian.Uint32(k[8:]))
			default:
				return fmt.Errorf("page key suffix %x", k)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return bases, deltas
}

// TestDeltaRandomized cross-checks a PartitionState written through MarkChanged
// and MarkDirty against an exact model (a map of page to bytes) over random
// byte-range writes, write batches, discards, drops of sub-filters and
// reopenings with a cache of a few pages, so that pages are read back from
// their base and deltas. After every write batch it checks what is stored:
// every page's live deltas stay within half a page (maxDeltaBytes), no
// delta folded into a base is left behind, a dropped sub-filter leaves
// no entry, and Consolidate (run after some write batches) leaves no delta. Both thresholds are crossed: pages are written as deltas and
// consolidated.
func TestDeltaRandomized(t *testing.T) {
	for _, pb := range []int{256, 4096} {
		t.Run(fmt.Sprint(pb), func(t *testing.T) {
			seed := uint64(time.Now().UnixNano())
			t.Logf("seed %d", seed)
			testDeltaRandomized(t, pb, rand.New(rand.NewPCG(seed, uint64(pb))))
		})
	}
}

func testDeltaRandomized(t *testing.T, pb int, rng *rand.Rand) {
	db := openT(t, Options{InMemory: true, PageBytes: pb, CacheBytes: int64(3 * pb), FlushBytes: smallFlush})
	p := partitionT(t, db, "orders", 7)
	defer func() { p.Close() }()

	const pagesPerSub = 12
	subs := []uint32{0, 1} // live sub-filters
	nextSub := uint32(2)
	var dropped []uint32 // dropped since the last write batch
	committed := map[filter.PageID][]byte{}
	current := map[filter.PageID][]byte{}
	copyPages := func(m map[filter.PageID][]byte) map[filter.PageID][]byte {
		c := make(map[filter.PageID][]byte, len(m))
		for id, pg := range m {
			c[id] = bytes.Clone(pg)
		}
		return c
	}
	want := func(m map[filter.PageID][]byte, id filter.PageID) []byte {
		if pg, ok := m[id]; ok {
			return pg
		}
		return make([]byte, pb)
	}
	var deltasSeen, consolidations, consolidated int
	var pointReads, pointMisses uint64
	counted := func() {
		pointReads += p.pointReads.Load()
		pointMisses += p.pointMisses.Load()
	}
	for step := range 4000 {
		switch r := rng.IntN(100); {
		case r < 75: // write some byte ranges of one page
			id := filter.PageID{SubFilter: subs[rng.IntN(len(subs))], Page: rng.Uint32N(pagesPerSub)}
			pg, err := p.Page(id)
			if err != nil {
				t.Fatalf("step %d: Page(%v): %v", step, id, err)
			}
			if !bytes.Equal(pg, want(current, id)) {
				t.Fatalf("step %d: page %v differs from the model", step, id)
			}
			m := bytes.Clone(want(current, id))
			if rng.IntN(20) == 0 {
				for i := range pg {
					pg[i] = byte(rng.Uint32())
				}
				p.MarkDirty(id, pg)
			} else {
				for range 1 + rng.IntN(4) {
					off := rng.IntN(pb)
					n := 1 + rng.IntN(min(pb-off, 12))
					for i := off; i < off+n; i++ {
						pg[i] = byte(rng.Uint32())
					}
					p.MarkChanged(id, pg, off, n)
				}
			}
			copy(m, pg)
			current[id] = m
		case r < 88: // write batch
			dirtyBytes, dirtyPages := p.DirtyBytes(), int64(p.DirtyPages())
			if least := minDirtyBytes(pb); dirtyPages*least > dirtyBytes {
				t.Fatalf("step %d: %d dirty pages count %d bytes, less than %d each", step, dirtyPages, dirtyBytes, least)
			}
			before := counterValue(t, db.metrics.commitBytes)
			if err := p.Commit([]byte("meta"), Checkpoint{Offset: int64(step)}); err != nil {
				t.Fatalf("step %d: Commit: %v", step, err)
			}
			// What the transaction held (keys and values; the deletes of
			// obsolete deltas come after it) is within DirtyBytes plus a
			// whole page's key and header per page, as batchLimits assumes.
			txnBytes := counterValue(t, db.metrics.commitBytes) - before - obsoleteDeleted(p)
			limit := dirtyBytes + dirtyPages*int64(pageBaseHeader+len(pageKey(p.prefix, filter.PageID{}))) +
				int64(len(metaKey(p.prefix))+len("meta")+len(checkpointKey(p.prefix))+checkpointBytes+len(droppedKey(p.prefix, 0))*len(dropped))
			if txnBytes > limit {
				t.Fatalf("step %d: the write batch wrote %d bytes, DirtyBytes %d allows %d", step, txnBytes, dirtyBytes, limit)
			}
			for _, sub := range dropped {
				for id := range current {
					if id.SubFilter == sub {
						delete(current, id)
					}
				}
			}
			dropped = dropped[:0]
			committed = copyPages(current)
			if rng.IntN(8) == 0 {
				if err := p.Consolidate(); err != nil {
					t.Fatalf("step %d: Consolidate: %v", step, err)
				}
				if _, deltas := storedEntries(t, p); len(deltas) != 0 {
					t.Fatalf("step %d: %d pages keep deltas after Consolidate", step, len(deltas))
				}
				consolidated++
			}
			checkStoredLogs(t, p, step)
			bases, deltas := storedEntries(t, p)
			for id, seqs := range deltas {
				base := bases[id] // 0 without a base: no delta is obsolete
				var live []uint32
				for _, s := range seqs {
					if int64(s) <= base {
						t.Fatalf("step %d: page %v keeps delta %d folded into its base of %d", step, id, s, base)
					}
					live = append(live, s)
				}
				_, lg, _, err := readPageT(p, id)
				if err != nil {
					t.Fatal(err)
				}
				if lg.deltaBytes > maxDeltaBytes(pb) {
					t.Fatalf("step %d: page %v has %d bytes of deltas, limit %d", step, id, lg.deltaBytes, maxDeltaBytes(pb))
				}
				deltasSeen = max(deltasSeen, len(live))
			}
			for id, base := range bases {
				if base > 0 {
					consolidations++
				}
				if _, ok := committed[id]; !ok {
					t.Fatalf("step %d: page %v is stored but not in the model (dropped?)", step, id)
				}
			}
		case r < 91: // uncommitted changes void
			p.Discard()
			current = copyPages(committed)
			dropped = dropped[:0]
		case r < 95: // reopen: every page read back from Badger
			counted()
			p.Close()
			p = partitionT(t, db, "orders", 7)
			current = copyPages(committed)
			dropped = dropped[:0]
			for id, pg := range committed {
				got, err := p.Page(id)
				if err != nil {
					t.Fatalf("step %d: Page(%v) after reopening: %v", step, id, err)
				}
				if !bytes.Equal(got, pg) {
					t.Fatalf("step %d: page %v read back differs from the model", step, id)
				}
			}
		default: // a sub-filter leaves the chain, a new one joins
			if len(subs) < 2 {
				continue
			}
			i := rng.IntN(len(subs))
			sub := subs[i]
			subs = append(subs[:i:i], subs[i+1:]...)
			subs = append(subs, nextSub)
			nextSub++
			p.Drop(sub)
			dropped = append(dropped, sub)
		}
	}
	p.Discard()
	if err := p.Consolidate(); err != nil {
		t.Fatal(err)
	}
	for id, pg := range committed {
		if got := mustPage(t, p, id); !bytes.Equal(got, pg) {
			t.Fatalf("page %v after the last Consolidate differs from the model", id)
		}
	}
	if deltasSeen < 2 || consolidations == 0 || consolidated == 0 {
		t.Fatalf("the workload did not reach the thresholds: at most %d live deltas per page, %d consolidated bases", deltasSeen, consolidations)
	}
	counted()
	// Pages evicted from the 3-page cache are read again by point lookups
	// of the entries their PartitionState knows, and those are always
	// the stored ones.
	if pointReads == 0 || pointMisses != 0 {
		t.Fatalf("%d pages read by point lookups, %d of them with entries other than the known ones; want some and none", pointReads, pointMisses)
	}
	t.Logf("up to %d live deltas per page, %d consolidated bases seen, %d point reads", deltasSeen, consolidations, pointReads)
}

// checkStoredLogs fails t unless every page log p keeps beyond the cache
// (pageChunk.stored) describes the page's stored entries as listing them
// does: its base's sequence number, its last live delta and their bytes.
func checkStoredLogs(t *testing.T, p *PartitionState, step int) {
	t.Helper()
	for _, st := range p.table.subs {
		for c, ch := range st.chunks {
			if ch == nil {
				continue
			}
			for i := range chunkPages {
				known, ok := ch.storedLog(i)
				if !ok {
					continue
				}
				id := filter.PageID{SubFilter: st.id, Page: uint32(c*chunkPages + i)}
				_, lg, _, err := readPageT(p, id)
				if err != nil {
					t.Fatal(err)
				}
				if known.baseSeq != lg.baseSeq || known.lastSeq != lg.lastSeq || known.deltaBytes != lg.deltaBytes {
					t.Fatalf("step %d: %s is known as base %d, last delta %d, %d delta bytes; stored: %d, %d, %d",
						step, fmtPageID(id), known.baseSeq, known.lastSeq, known.deltaBytes, lg.baseSeq, lg.lastSeq, lg.deltaBytes)
				}
			}
		}
	}
}

func counterValue(t *testing.T, c interface{ Write(*dto.Metric) error }) int64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return int64(m.GetCounter().GetValue())
}

// obsoleteDeleted returns the key bytes of the obsolete deltas p's last
// Commit deleted after its transaction (all of them: the deletes do not
// fail in memory).
func obsoleteDeleted(p *PartitionState) int64 { return p.lastObsoleteBytes }

func readPageT(p *PartitionState, id filter.PageID) (data []byte, lg pageLog, found bool, err error) {
	err = p.db.bdb.View(func(txn *badger.Txn) error {
		data, lg, found, err = p.readPage(txn, id)
		return err
	})
	return data, lg, found, err
}

// TestCommitWritesChangedBytes checks that a write batch of a few inserts
// into a chain of many pages hands Badger bytes in proportion to the
// inserts, not to the pages they touch (4 KiB each), and that the state
// read back after reopening holds every key.
func TestCommitWritesChangedBytes(t *testing.T) {
	db := openT(t, Options{InMemory: true})
	p := partitionT(t, db, "events", 0)
	params := filter.Params{Capacity: 4_000_000}
	c, err := filter.NewWithSeed(params, filter.Seed{}, p)
	if err != nil {
		t.Fatal(err)
	}
	key := func(i int) []byte { return []byte(fmt.Sprintf("key-%08d", i)) }
	const preload, inserts = 20_000, 200
	for i := range preload {
		if _, err := c.Insert(key(i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Commit(c.MarshalMeta(), Checkpoint{Offset: preload}); err != nil {
		t.Fatal(err)
	}
	commitBytes := func() float64 {
		var m dto.Metric
		if err := db.metrics.commitBytes.Write(&m); err != nil {
			t.Fatal(err)
		}
		return m.GetCounter().GetValue()
	}
	before := commitBytes()
	for i := preload; i < preload+inserts; i++ {
		if _, err := c.Insert(key(i)); err != nil {
			t.Fatal(err)
		}
	}
	dirty := p.DirtyPages()
	meta := c.MarshalMeta()
	if err := p.Commit(meta, Checkpoint{Offset: preload + inserts}); err != nil {
		t.Fatal(err)
	}
	// The metadata and checkpoint are written whatever changed.
	fixed := float64(len(metaKey(p.prefix)) + len(meta) + len(checkpointKey(p.prefix)) + checkpointBytes)
	perInsert := (commitBytes() - before - fixed) / inserts
	t.Logf("%d inserts dirtied %d pages; %.1f bytes per insert handed to Badger", inserts, dirty, perInsert)
	if dirty < inserts/2 {
		t.Fatalf("only %d pages dirtied by %d inserts: the test needs most inserts on a page of their own", dirty, inserts)
	}
	if perInsert > 64 {
		t.Errorf("%.1f bytes per insert handed to Badger, want at most 64", perInsert)
	}

	p.Close()
	p = partitionT(t, db, "events", 0)
	defer p.Close()
	c, err = filter.Open(p.Meta(), params, p)
	if err != nil {
		t.Fatal(err)
	}
	for i := range preload + inserts {
		if ok, err := c.Contains(key(i)); err != nil || !ok {
			t.Fatalf("key %d after reopening: %t, %v", i, ok, err)
		}
	}
}

// TestReadKnownFallsBackToListing changes a page's stored entries behind its
// PartitionState's back (a delta after the last it wrote, a delta gone, a
// base of another sequence number): each point read finds entries other
// than the known ones and the page is read by listing them, as stored,
// and a read after that, with nothing changed, is a point read again.
func TestReadKnownFallsBackToListing(t *testing.T) {
	const pb = 256
	db := openT(t, Options{InMemory: true, PageBytes: pb, CacheBytes: pb, FlushBytes: smallFlush})
	p := partitionT(t, db, "orders", 3)
	id, other := filter.PageID{Page: 0}, filter.PageID{Page: 1}
	pg := mustPage(t, p, id)
	for i := range pg {
		pg[i] = byte(i)
	}
	p.MarkDirty(id, pg)
	if err := p.Commit(nil, Checkpoint{Offset: 1}); err != nil {
		t.Fatal(err)
	}
	pg = mustPage(t, p, id)
	pg[7] = 0xee
	p.MarkChanged(id, pg, 7, 1)
	if err := p.Commit(nil, Checkpoint{Offset: 2}); err != nil {
		t.Fatal(err)
	}
	if lg, ok := p.storedLog(id); !ok || lg.baseSeq != 0 || lg.lastSeq != 1 {
		t.Fatalf("known log %+v (known %t), want base 0 and delta 1", lg, ok)
	}
	behind := func(f func(txn *badger.Txn) error) {
		t.Helper()
		if err := db.bdb.Update(f); err != nil {
			t.Fatal(err)
		}
	}
	changed := make([]byte, pb)
	changed[9] = 0x99
	for _, c := range []struct {
		name   string
		change func(txn *badger.Txn) error
		miss   bool
	}{
		{"a delta after the last", func(txn *badger.Txn) error {
			return txn.Set(deltaKey(p.prefix, id, 2), encodeDelta([]span{{lo: 9, hi: 10}}, changed))
		}, true},
		{"nothing changed", func(*badger.Txn) error { return nil }, false},
		{"the last delta gone", func(txn *badger.Txn) error { return txn.Delete(deltaKey(p.prefix, id, 2)) }, true},
		{"a base of another sequence number", func(txn *badger.Txn) error {
			base := binary.BigEndian.AppendUint32(nil, 5)
			return txn.Set(pageKey(p.prefix, id), append(base, changed...))
		}, true},
		{"nothing changed again", func(*badger.Txn) error { return nil }, false},
	} {
		behind(c.change)
		mustPage(t, p, other) // evicts id from the one-page cache
		want, _, _, err := readPageT(p, id)
		if err != nil {
			t.Fatal(err)
		}
		reads, misses := p.pointReads.Load(), p.pointMisses.Load()
		if got := mustPage(t, p, id); !bytes.Equal(got, want) {
			t.Fatalf("%s: the page read differs from its stored entries", c.name)
		}
		if c.miss && (p.pointMisses.Load() != misses+1 || p.pointReads.Load() != reads) {
			t.Fatalf("%s: %d point reads, %d fallbacks; want the point read to fall back to listing",
				c.name, p.pointReads.Load()-reads, p.pointMisses.Load()-misses)
		}
		if !c.miss && (p.pointReads.Load() != reads+1 || p.pointMisses.Load() != misses) {
			t.Fatalf("%s: %d point reads, %d fallbacks; want one point read",
				c.name, p.pointReads.Load()-reads, p.pointMisses.Load()-misses)
		}
	}
}

// TestReadKnownCorrupt: a page read by point lookups of its known entries
// reports a stored base of the wrong length as ErrCorrupt, as a listing
// does, instead of a page.
func TestReadKnownCorrupt(t *testing.T) {
	const pb = 256
	db := openT(t, Options{InMemory: true, PageBytes: pb, CacheBytes: pb, FlushBytes: smallFlush})
	p := partitionT(t, db, "orders", 4)
	id, other := filter.PageID{Page: 0}, filter.PageID{Page: 1}
	pg := mustPage(t, p, id)
	pg[0] = 1
	p.MarkDirty(id, pg)
	if err := p.Commit(nil, Checkpoint{Offset: 1}); err != nil {
		t.Fatal(err)
	}
	err := db.bdb.Update(func(txn *badger.Txn) error {
		return txn.Set(pageKey(p.prefix, id), make([]byte, pageBaseHeader+pb/2))
	})
	if err != nil {
		t.Fatal(err)
	}
	mustPage(t, p, other) // evicts id from the one-page cache
	if lg, ok := p.storedLog(id); !ok || costlyToRead(lg) {
		t.Fatalf("known log %+v (known %t): the page would not be read by point lookups", lg, ok)
	}
	if _, err := p.Page(id); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("Page of a base cut in half: %v, want ErrCorrupt", err)
	}
}
