package store

import (
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/dgraph-io/badger/v4"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/kdedup/kdedup/filter"
)

// storedKeys returns every key of the partition's prefix, as strings of
// the bytes after the prefix.
func storedKeys(t *testing.T, db *DB, p *PartitionState) map[string]bool {
	t.Helper()
	keys := map[string]bool{}
	err := db.bdb.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: p.prefix})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			keys[string(it.Item().Key()[len(p.prefix):])] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return keys
}

func pageSuffix(id filter.PageID) string {
	return string(pageKey(nil, id))
}

// TestDropDeletesPagesAfterCommit checks the life of a dropped sub-filter:
// its dirty pages are not written, its stored pages and marker are gone
// after the write batch that drops it, the other sub-filters' pages are
// untouched, and a drop discarded before any commit deletes nothing.
func TestDropDeletesPagesAfterCommit(t *testing.T) {
	const pb = 512
	reg := prometheus.NewRegistry()
	db := openT(t, Options{Dir: t.TempDir(), PageBytes: pb, FlushBytes: smallFlush, Registerer: reg, Logger: quiet})
	p := partitionT(t, db, "orders", 0)
	ids := universe(3, 4)
	for _, id := range ids {
		write(t, p, id, pageBytes(pb, id, 1))
	}
	if err := p.Commit([]byte("m1"), Checkpoint{Offset: 10}); err != nil {
		t.Fatal(err)
	}

	// A dirty page of sub-filter 1 and a new page of it, then the drop.
	write(t, p, filter.PageID{SubFilter: 1, Page: 0}, pageBytes(pb, filter.PageID{SubFilter: 1}, 2))
	write(t, p, filter.PageID{SubFilter: 1, Page: 9}, pageBytes(pb, filter.PageID{SubFilter: 1, Page: 9}, 2))
	p.Drop(1)
	if p.DirtyBytes() != 0 {
		t.Fatalf("%d dirty bytes after dropping the only dirty sub-filter", p.DirtyBytes())
	}
	if err := p.Commit([]byte("m2"), Checkpoint{Offset: 20}); err != nil {
		t.Fatal(err)
	}
	keys := storedKeys(t, db, p)
	for _, id := range append(ids, filter.PageID{SubFilter: 1, Page: 9}) {
		if got, want := keys[pageSuffix(id)], id.SubFilter != 1; got != want {
			t.Errorf("%s stored: %v, want %v", fmtPageID(id), got, want)
		}
	}
	if keys[string(droppedKey(nil, 1))] {
		t.Error("the dropped-sub-filter marker outlived the deletion")
	}
	var m dto.Metric
	if err := db.metrics.pagesReclaimed.Write(&m); err != nil || m.GetCounter().GetValue() != 4 {
		t.Errorf("pages reclaimed %v (%v), want 4", m.GetCounter().GetValue(), err)
	}
	for _, id := range ids {
		if id.SubFilter != 1 && !bytes.Equal(mustPage(t, p, id), pageBytes(pb, id, 1)) {
			t.Errorf("%s changed", fmtPageID(id))
		}
	}

	// A drop that never commits deletes nothing.
	p.Drop(2)
	p.Discard()
	if err := p.Commit([]byte("m3"), Checkpoint{Offset: 30}); err != nil {
		t.Fatal(err)
	}
	if keys := storedKeys(t, db, p); !keys[pageSuffix(filter.PageID{SubFilter: 2, Page: 3})] {
		t.Error("a discarded drop deleted pages")
	}
}

// TestDropResumesOnOpen checks that a marker left by a crash between the
// write batch and the deletion is finished by the next open, and that a
// read-only open leaves it.
func TestDropResumesOnOpen(t *testing.T) {
	const pb = 512
	dir := t.TempDir()
	opts := Options{Dir: dir, PageBytes: pb, FlushBytes: smallFlush, Logger: quiet}
	db, err := Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	p, err := db.Partition("orders", 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range universe(2, 3) {
		write(t, p, id, pageBytes(pb, id, 1))
	}
	if err := p.Commit([]byte("m1"), Checkpoint{Offset: 10}); err != nil {
		t.Fatal(err)
	}
	// What a crash right after the dropping write batch leaves behind.
	if err := db.bdb.Update(func(txn *badger.Txn) error {
		return txn.Set(droppedKey(p.prefix, 0), binary.BigEndian.AppendUint64(nil, 2))
	}); err != nil {
		t.Fatal(err)
	}
	p.Close()
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}

	ro := openT(t, Options{Dir: dir, PageBytes: pb, FlushBytes: smallFlush, ReadOnly: true, Logger: quiet})
	rp := partitionT(t, ro, "orders", 0)
	if keys := storedKeys(t, ro, rp); !keys[pageSuffix(filter.PageID{SubFilter: 0, Page: 2})] || !keys[string(droppedKey(nil, 0))] {
		t.Fatal("a read-only open deleted dropped pages")
	}
	rp.Close()
	if err := ro.Close(); err != nil {
		t.Fatal(err)
	}

	db = openT(t, opts)
	p = partitionT(t, db, "orders", 0)
	keys := storedKeys(t, db, p)
	for _, id := range universe(2, 3) {
		if got, want := keys[pageSuffix(id)], id.SubFilter == 1; got != want {
			t.Errorf("%s stored after reopen: %v, want %v", fmtPageID(id), got, want)
		}
	}
	if keys[string(droppedKey(nil, 0))] {
		t.Error("marker left after the reopen finished the deletion")
	}
}
