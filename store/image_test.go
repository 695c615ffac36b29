package store

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"

	"github.com/dgraph-io/badger/v4"

	"github.com/kdedup/kdedup/filter"
)

// exported is an image read by Export.
type exported struct {
	img   Image
	pages map[filter.PageID][]byte
}

// chainMeta is chain metadata (filter.Meta) of fixed 16-bit fingerprints
// whose sub-filters have the given IDs, each of pages pages; stamp is its
// watermark, so that metadata of different write batches differ.
func chainMeta(pageBytes int, stamp int64, pages uint64, ids ...uint32) []byte {
	m := filter.Meta{FormatVersion: filter.FormatVersion, HashID: filter.HashSipHash24,
		Params: filter.Params{FingerprintBits: 16, PageBytes: pageBytes}.WithDefaults(), Watermark: stamp, Seed: filter.Seed{K0: 1, K1: 2}}
	for _, id := range ids {
		m.SubFilters = append(m.SubFilters, filter.SubFilter{ID: id, Pages: pages, FingerprintBits: 16})
		m.NextID = max(m.NextID, id+1)
	}
	return m.Marshal()
}

func export(t testing.TB, db *DB, tp TopicPartition) (exported, bool) {
	t.Helper()
	e := exported{pages: map[filter.PageID][]byte{}}
	found, err := db.Export(tp, func(img Image) error {
		e.img = img
		return nil
	}, func(id filter.PageID, data []byte) error {
		if _, dup := e.pages[id]; dup {
			return fmt.Errorf("%v exported twice", id)
		}
		e.pages[id] = append([]byte{}, data...)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return e, found
}

func (e exported) put(put func(filter.PageID, []byte) error) error {
	for id, b := range e.pages {
		if err := put(id, b); err != nil {
			return err
		}
	}
	return nil
}

// TestExportImportAgainstModel builds a partition's state by whole-page
// writes, slot changes (deltas, some folded into their base by
// consolidation), uncommitted changes and a dropped sub-filter, exports it
// while dirty pages are pending, and imports it into another store over a
// partition holding other state: the imported partition must equal the
// model of the committed state, page by page, with its metadata and
// checkpoint, and survive reopening.
func TestExportImportAgainstModel(t *testing.T) {
	const pb = 256
	opts := Options{Dir: t.TempDir(), PageBytes: pb, FlushBytes: smallFlush, CacheBytes: 4 * pb}
	db := openT(t, opts)
	p, err := db.Partition("events", 3)
	if err != nil {
		t.Fatal(err)
	}
	ids := universe(4, 16)
	m := newModel(pb)
	rng := rand.New(rand.NewPCG(7, 8))
	for batch := range 60 {
		for range 1 + rng.IntN(20) {
			id := ids[rng.IntN(len(ids))]
			if batch >= 40 && id.SubFilter == 2 {
				continue // a dropped sub-filter's ID is never used again
			}
			page := mustPage(t, p, id)
			if rng.IntN(4) == 0 {
				copy(page, pageBytes(pb, id, uint64(batch)))
				p.MarkDirty(id, page)
			} else {
				off := rng.IntN(pb - 8)
				binary.BigEndian.PutUint64(page[off:], rng.Uint64())
				p.MarkChanged(id, page, off, 8)
			}
			m.dirty[id] = append([]byte{}, page...)
		}
		meta := chainMeta(pb, int64(batch), 16, 0, 1, 2, 3)
		if batch >= 40 {
			meta = chainMeta(pb, int64(batch), 16, 0, 1, 3) // sub-filter 2 dropped
		}
		cp := Checkpoint{Offset: int64(100 * batch), LeaderEpoch: int32(batch % 3)}
		if batch == 40 {
			p.Drop(2)
			for id := range m.dirty {
				if id.SubFilter == 2 {
					delete(m.dirty, id)
				}
			}
			for id := range m.committed {
				if id.SubFilter == 2 {
					delete(m.committed, id)
				}
			}
		}
		if err := p.Commit(meta, cp); err != nil {
			t.Fatal(err)
		}
		m.commit(meta, cp)
	}
	if n := p.PendingPages(); n == 0 {
		t.Fatalf("PendingPages = %d: the test needs pages whose changes are in the log", n)
	}
	// Uncommitted changes are not part of the image.
	write(t, p, ids[0], pageBytes(pb, ids[0], 999))

	e, found := export(t, db, p.TopicPartition())
	if !found {
		t.Fatal("Export found no state")
	}
	if e.img.Checkpoint != m.cp || !bytes.Equal(e.img.Meta, m.meta) || e.img.PageBytes != pb {
		t.Fatalf("image header %+v, want checkpoint %+v, meta %q, %d-byte pages", e.img, m.cp, m.meta, pb)
	}
	for id := range e.pages {
		if id.SubFilter == 2 {
			t.Fatalf("%v of the dropped sub-filter 2 exported", id)
		}
		if _, ok := m.committed[id]; !ok {
			t.Fatalf("%v exported, never committed", id)
		}
	}
	for id, want := range m.committed {
		if got, ok := e.pages[id]; !ok || !bytes.Equal(got, want) {
			t.Fatalf("%v: exported %t, differs from the committed page", id, ok)
		}
	}

	// Import over other state in another store.
	opts2 := Options{Dir: t.TempDir(), PageBytes: pb, FlushBytes: smallFlush, CacheBytes: 4 * pb}
	db2 := openT(t, opts2)
	q, err := db2.Partition("events", 3)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		write(t, q, id, pageBytes(pb, id, 5000))
	}
	q.Drop(1)
	if err := q.Commit([]byte("other"), Checkpoint{Offset: 7}); err != nil {
		t.Fatal(err)
	}
	write(t, q, ids[1], pageBytes(pb, ids[1], 6000)) // dirty, dropped by Import
	if err := q.Import(e.img, e.put); err != nil {
		t.Fatal(err)
	}
	m.check(t, q, ids)
	q.Close()
	if q, err = db2.Partition("events", 3); err != nil {
		t.Fatal(err)
	}
	m.check(t, q, ids)
	// The imported state takes write batches like any other.
	write(t, q, ids[5], pageBytes(pb, ids[5], 7000))
	m.dirty[ids[5]] = pageBytes(pb, ids[5], 7000)
	if err := q.Commit([]byte("after"), Checkpoint{Offset: 9000}); err != nil {
		t.Fatal(err)
	}
	m.commit([]byte("after"), Checkpoint{Offset: 9000})
	q.Close()
	if q, err = db2.Partition("events", 3); err != nil {
		t.Fatal(err)
	}
	m.check(t, q, ids)
	q.Close()
}

// TestImportOfOtherPageSize refuses an image of another page size before
// writing anything: the state it would replace is kept.
func TestImportOfOtherPageSize(t *testing.T) {
	const pb = 128
	db := openT(t, Options{Dir: t.TempDir(), PageBytes: pb, FlushBytes: smallFlush})
	p, err := db.Partition("events", 0)
	if err != nil {
		t.Fatal(err)
	}
	id := filter.PageID{Page: 1}
	write(t, p, id, pageBytes(pb, id, 1))
	if err := p.Commit([]byte("m"), Checkpoint{Offset: 5}); err != nil {
		t.Fatal(err)
	}
	err = p.Import(Image{Meta: []byte("x"), PageBytes: 2 * pb}, func(func(filter.PageID, []byte) error) error { return nil })
	if !errors.Is(err, ErrCorrupt) {
		t.Fatalf("Import of 256-byte pages into 128: %v, want ErrCorrupt", err)
	}
	if cp, ok := p.Checkpoint(); !ok || cp.Offset != 5 {
		t.Fatalf("Checkpoint after a refused import = %+v, %t; want offset 5", cp, ok)
	}
	if !bytes.Equal(mustPage(t, p, id), pageBytes(pb, id, 1)) {
		t.Fatal("page changed by a refused import")
	}
}

// TestInterruptedImport cuts an import short after some of its pages
// (the image's source failing, or a crash: the store closed without the
// import's last write): the partition has no state, Export finds none,
// and opening it again deletes the pages the import wrote, so that no
// page of the old state or the partial image is read as a state.
func TestInterruptedImport(t *testing.T) {
	const pb = 128
	opts := Options{Dir: t.TempDir(), PageBytes: pb, FlushBytes: smallFlush}
	db := openT(t, opts)
	p, err := db.Partition("events", 0)
	if err != nil {
		t.Fatal(err)
	}
	ids := universe(2, 8)
	for _, id := range ids {
		write(t, p, id, pageBytes(pb, id, 1))
	}
	if err := p.Commit([]byte("old"), Checkpoint{Offset: 50}); err != nil {
		t.Fatal(err)
	}
	cut := errors.New("source gone")
	err = p.Import(Image{Meta: chainMeta(pb, 0, 8, 0, 1), Checkpoint: Checkpoint{Offset: 90}, PageBytes: pb}, func(put func(filter.PageID, []byte) error) error {
		for _, id := range ids[:5] {
			if err := put(id, pageBytes(pb, id, 2)); err != nil {
				return err
			}
		}
		return cut
	})
	if !errors.Is(err, cut) {
		t.Fatalf("Import = %v, want the source's error", err)
	}
	if _, ok := p.Checkpoint(); ok {
		t.Fatal("a checkpoint after an interrupted import")
	}
	if _, found := export(t, db, p.TopicPartition()); found {
		t.Fatal("Export found a state during an interrupted import")
	}
	p.Close()
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	db = openT(t, opts)
	p, err = db.Partition("events", 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := p.Checkpoint(); ok || p.Meta() != nil {
		t.Fatal("state after reopening an interrupted import")
	}
	zero := make([]byte, pb)
	for _, id := range ids {
		if !bytes.Equal(mustPage(t, p, id), zero) {
			t.Fatalf("%v not zero after an interrupted import was deleted", id)
		}
	}
	if tps, err := db.Partitions(); err != nil || len(tps) != 0 {
		t.Fatalf("Partitions = %v, %v; want none left", tps, err)
	}

	// A crash in the middle of an import: its marker and some pages in
	// Badger, no metadata or checkpoint yet (the import's first writes,
	// without the cleanup a failing source gets). Opening the partition
	// must delete them and report no state.
	p.Close()
	prefix := partitionPrefix("events", 0)
	if err := db.bdb.Update(func(txn *badger.Txn) error {
		if err := txn.Set(importingKey(prefix), nil); err != nil {
			return err
		}
		for _, id := range ids[:5] {
			v := make([]byte, pageBaseHeader+pb)
			copy(v[pageBaseHeader:], pageBytes(pb, id, 3))
			if err := txn.Set(pageKey(prefix, id), v); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if p, err = db.Partition("events", 0); err != nil {
		t.Fatal(err)
	}
	if _, ok := p.Checkpoint(); ok {
		t.Fatal("state after opening a crashed import")
	}
	for _, id := range ids {
		if !bytes.Equal(mustPage(t, p, id), zero) {
			t.Fatalf("%v of a crashed import read as a page", id)
		}
	}
	if tps, err := db.Partitions(); err != nil || len(tps) != 0 {
		t.Fatalf("Partitions after a crashed import = %v, %v; want none left", tps, err)
	}
}

// TestExportIsOneWriteBatch exports a partition over and over while its
// owner commits write batches that rewrite every page with the batch
// number: each image's pages must all be of the batch its checkpoint
// names, never a mix of two.
func TestExportIsOneWriteBatch(t *testing.T) {
	const pb = 128
	db := openT(t, Options{Dir: t.TempDir(), PageBytes: pb, FlushBytes: smallFlush})
	p, err := db.Partition("events", 0)
	if err != nil {
		t.Fatal(err)
	}
	ids := universe(2, 32)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for batch := uint64(1); ; batch++ {
			select {
			case <-stop:
				return
			default:
			}
			for _, id := range ids {
				page := mustPage(t, p, id)
				copy(page, pageBytes(pb, id, batch))
				p.MarkDirty(id, page)
			}
			if err := p.Commit([]byte("m"), Checkpoint{Offset: int64(batch)}); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	defer wg.Wait()
	defer close(stop)
	seen := map[int64]bool{}
	for len(seen) < 20 {
		e, found := export(t, db, p.TopicPartition())
		if !found {
			continue
		}
		seen[e.img.Checkpoint.Offset] = true
		if len(e.pages) != len(ids) {
			t.Fatalf("image at %d has %d pages, want %d", e.img.Checkpoint.Offset, len(e.pages), len(ids))
		}
		for id, b := range e.pages {
			if want := pageBytes(pb, id, uint64(e.img.Checkpoint.Offset)); !bytes.Equal(b, want) {
				t.Fatalf("image at checkpoint %d: %v is of another write batch", e.img.Checkpoint.Offset, id)
			}
		}
	}
}

// TestImportRefusesPagesNotOfItsMetadata imports images whose pages are
// not all their metadata's (sub-filters 0, 1 and 3 of 8 pages each): a
// page of a dropped or a future sub-filter, one past its sub-filter's
// page count, more pages than the metadata has. Each is refused as
// ErrCorrupt before the page is written, and what the import wrote
// before it is deleted: the partition has no state and no key left in
// Badger, also after reopening. Metadata that does not decode is refused
// before anything is written: the partition keeps its state.
func TestImportRefusesPagesNotOfItsMetadata(t *testing.T) {
	const pb = 128
	opts := Options{Dir: t.TempDir(), PageBytes: pb, FlushBytes: smallFlush}
	db := openT(t, opts)
	meta := chainMeta(pb, 0, 8, 0, 1, 3)
	var good []filter.PageID
	for _, sub := range []uint32{0, 1, 3} {
		for pg := range uint32(8) {
			good = append(good, filter.PageID{SubFilter: sub, Page: pg})
		}
	}
	for i, tc := range []struct {
		name  string
		meta  []byte
		pages []filter.PageID // put in this order
		want  string
		keeps bool // refused before anything was written
	}{
		{"dropped sub-filter", meta, append(good[:5:5], filter.PageID{SubFilter: 2}), "not a page of the image's metadata", false},
		{"future sub-filter", meta, append(good[:5:5], filter.PageID{SubFilter: 4, Page: 1}), "not a page of the image's metadata", false},
		{"past the page count", meta, append(good[:5:5], filter.PageID{SubFilter: 1, Page: 8}), "not a page of the image's metadata", false},
		{"more pages than the metadata", meta, append(append([]filter.PageID{}, good...), good[0]), "more pages than the 24", false},
		{"metadata that does not decode", []byte("not metadata"), good[:1], "metadata", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := partitionT(t, db, "events", int32(i))
			old := filter.PageID{SubFilter: 0, Page: 1}
			write(t, p, old, pageBytes(pb, old, 1))
			if err := p.Commit(meta, Checkpoint{Offset: 50}); err != nil {
				t.Fatal(err)
			}
			written := map[filter.PageID]bool{}
			err := p.Import(Image{Meta: tc.meta, Checkpoint: Checkpoint{Offset: 90}, PageBytes: pb}, func(put func(filter.PageID, []byte) error) error {
				for _, id := range tc.pages {
					if err := put(id, pageBytes(pb, id, 2)); err != nil {
						return err
					}
					written[id] = true
				}
				return nil
			})
			if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Import = %v, want ErrCorrupt saying %q", err, tc.want)
			}
			if last := tc.pages[len(tc.pages)-1]; written[last] && !tc.keeps && last != good[0] {
				t.Fatalf("put accepted %v", last)
			}
			if tc.keeps {
				if cp, ok := p.Checkpoint(); !ok || cp.Offset != 50 || !bytes.Equal(mustPage(t, p, old), pageBytes(pb, old, 1)) {
					t.Fatalf("state after a refused import: checkpoint %+v %t; want the old state kept", cp, ok)
				}
				return
			}
			if _, ok := p.Checkpoint(); ok || p.Meta() != nil {
				t.Fatal("state after a refused import")
			}
			prefix := partitionPrefix("events", int32(i))
			if err := db.bdb.View(func(txn *badger.Txn) error {
				it := txn.NewIterator(badger.IteratorOptions{Prefix: prefix})
				defer it.Close()
				for it.Rewind(); it.Valid(); it.Next() {
					return fmt.Errorf("key %x left by a refused import", it.Item().Key())
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
		})
	}
}
