package store

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"

	"github.com/dgraph-io/badger/v4"

	"github.com/kdedup/kdedup/filter"
)

// Image is the header of a topic-partition's state as a write batch left
// it: what Export reads before the pages and Import writes after them.
type Image struct {
	// Meta is the chain metadata (opaque here; filter.MarshalMeta). It
	// holds the chain's secret hash seed.
	Meta []byte
	// Checkpoint is the write batch's checkpoint.
	Checkpoint Checkpoint
	// PageBytes is the size of every page, in bytes (Options.PageBytes of
	// the DB exported from).
	PageBytes int
	// Origin is the topic and cluster the state was built from (zero:
	// not recorded). Export reads it with the state; Import records it
	// with the state, in the image's last transaction.
	Origin Origin
}

// Export reads the committed state of tp as of one Badger read timestamp,
// so as of one whole write batch, whatever write batches commit while it
// runs: header gets the image's metadata and checkpoint, then page gets
// every stored page of a live sub-filter with its logged changes applied, in
// (sub-filter, page) order. A page never written is all zeros and not
// exported; pages of a dropped sub-filter are not exported. data is
// PageBytes long and reused after page returns. found is false (and
// nothing called) when tp has no state. An error of header or page ends
// the export and is returned.
//
// Export does not open the partition: it may run while a PartitionState
// of tp commits write batches, from any goroutine. ErrCorrupt (wrapped)
// reports a stored entry that cannot be right.
func (db *DB) Export(tp TopicPartition, header func(Image) error, page func(id filter.PageID, data []byte) error) (found bool, err error) {
	if db.closed.Load() {
		return false, fmt.Errorf("store: exporting %s: %w", tp, ErrClosed)
	}
	p := &PartitionState{db: db, tp: tp, prefix: partitionPrefix(tp.Topic, tp.Partition)}
	err = db.bdb.View(func(txn *badger.Txn) error {
		meta, hasMeta, err := get(txn, metaKey(p.prefix))
		if err != nil {
			return err
		}
		cpb, hasCP, err := get(txn, checkpointKey(p.prefix))
		if err != nil {
			return err
		}
		if importing, err := has(txn, importingKey(p.prefix)); err != nil || importing || !hasCP || !hasMeta {
			return err // no state, or an import not finished: nothing to export
		}
		cp, err := decodeCheckpoint(cpb)
		if err != nil {
			return err
		}
		var origin Origin
		if ob, ok, err := get(txn, originKey(p.prefix)); err != nil {
			return err
		} else if ok {
			if origin, err = decodeOrigin(ob); err != nil {
				return err
			}
		}
		dropped := map[uint32]bool{}
		it := txn.NewIterator(badger.IteratorOptions{Prefix: append(append([]byte{}, p.prefix...), tagDropped)})
		for it.Rewind(); it.Valid(); it.Next() {
			k := it.Item().Key()
			dropped[binary.BigEndian.Uint32(k[len(k)-4:])] = true
		}
		it.Close()
		found = true
		if err := header(Image{Meta: meta, Checkpoint: cp, PageBytes: db.opts.PageBytes, Origin: origin}); err != nil {
			return err
		}
		// The log, by page: the records of live sub-filters, in the order
		// they apply.
		type logged struct {
			seq uint64
			rec []byte
		}
		logs := make(map[filter.PageID][]logged)
		lp := logPrefix(p.prefix)
		lit := txn.NewIterator(badger.IteratorOptions{Prefix: lp})
		for lit.Rewind(); lit.Valid(); lit.Next() {
			item := lit.Item()
			k := item.Key()
			if len(k) != len(lp)+seqBytes {
				lit.Close()
				return fmt.Errorf("log key %x is %d bytes: %w", k, len(k), ErrCorrupt)
			}
			seq := binary.BigEndian.Uint64(k[len(lp):])
			v, err := item.ValueCopy(nil)
			if err == nil {
				_, err = decodeLog(v, func(id filter.PageID, rec []byte) error {
					if !dropped[id.SubFilter] {
						logs[id] = append(logs[id], logged{seq: seq, rec: rec})
					}
					return nil
				})
			}
			if err != nil {
				lit.Close()
				if errors.Is(err, errBadEntry) {
					err = fmt.Errorf("log entry %d: %w: %w", seq, err, ErrCorrupt)
				}
				return err
			}
		}
		lit.Close()
		logIDs := make([]filter.PageID, 0, len(logs))
		for id := range logs {
			logIDs = append(logIDs, id)
		}
		slices.SortFunc(logIDs, comparePageIDs)
		data := make([]byte, db.opts.PageBytes)
		// emit hands page id over, data holding its base of floor (zeros
		// and 0 without one), with the logged changes after floor applied.
		emit := func(id filter.PageID, floor uint64) error {
			for _, l := range logs[id] {
				if l.seq > floor {
					if err := applyPatch(data, l.rec); err != nil {
						return fmt.Errorf("%s: log entry %d: %w: %w", fmtPageID(id), l.seq, err, ErrCorrupt)
					}
				}
			}
			return page(id, data)
		}
		pages := append(append([]byte{}, p.prefix...), tagPage)
		it = txn.NewIterator(badger.IteratorOptions{Prefix: pages, PrefetchValues: true, PrefetchSize: 16})
		defer it.Close()
		li := 0
		for it.Rewind(); it.Valid(); it.Next() {
			item := it.Item()
			k := item.Key()
			if len(k) != len(pages)+8 {
				return fmt.Errorf("page entry key %x is %d bytes: %w", k, len(k), ErrCorrupt)
			}
			id := filter.PageID{SubFilter: binary.BigEndian.Uint32(k[len(pages):]), Page: binary.BigEndian.Uint32(k[len(pages)+4:])}
			if dropped[id.SubFilter] {
				continue
			}
			// Pages only in the log (never written whole) come in order
			// among those with a base.
			for ; li < len(logIDs) && comparePageIDs(logIDs[li], id) < 0; li++ {
				clear(data)
				if err := emit(logIDs[li], 0); err != nil {
					return err
				}
			}
			if li < len(logIDs) && logIDs[li] == id {
				li++
			}
			var floor uint64
			if err := item.Value(func(v []byte) (err error) {
				floor, err = decodeBase(v, data)
				return err
			}); err != nil {
				if errors.Is(err, errBadEntry) {
					err = fmt.Errorf("%s: %w: %w", fmtPageID(id), err, ErrCorrupt)
				}
				return err
			}
			if err := emit(id, floor); err != nil {
				return err
			}
		}
		for ; li < len(logIDs); li++ {
			clear(data)
			if err := emit(logIDs[li], 0); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return found, fmt.Errorf("store: exporting %s: %w", tp, err)
	}
	return found, nil
}

// Import replaces the whole state of p, committed or not, by an image: the
// pages pages yields (each PageBytes long, in any order, each page once;
// pages absent are zeros) and then img's metadata and checkpoint. Every
// page must be one of the metadata's (filter.Meta.HasPage: a live
// sub-filter's, below its page count), and there can be no more of them
// than the metadata has pages: an image that is not its metadata's (a
// damaged or crafted snapshot, whose pages for a sub-filter not yet made
// would become that sub-filter's content when the chain grows) is refused
// at its first page that is not, before that page is written. The
// replacement is atomic for readers of the store: until its last write
// the partition's state is marked as being imported, and a PartitionState
// opened on a marked state (a crash in the middle) deletes it and starts
// with no state; Export skips it. p's cached and dirty pages are dropped.
//
// An error from pages (returned wrapped) or from Badger ends the import
// without its last write; what it wrote is deleted with the marker, so p
// has no state (Checkpoint reports none); if that deletion fails too the
// marker stays and the next Import or open deletes the rest. A page not
// of the metadata is such an error (ErrCorrupt, wrapped). ErrReadOnly
// on a read-only DB, a lack of free space, and an image of another page
// size or whose metadata does not decode (filter.DecodeMeta; ErrCorrupt,
// wrapped) are refused before anything is written: p keeps its state. Like every PartitionState method, Import is not safe for
// concurrent use with p's other methods.
func (p *PartitionState) Import(img Image, pages func(put func(id filter.PageID, data []byte) error) error) error {
	if p.db.opts.ReadOnly {
		return fmt.Errorf("store: importing %s: %w", p.tp, ErrReadOnly)
	}
	if img.PageBytes != p.db.opts.PageBytes {
		return fmt.Errorf("store: importing %s: image of %d-byte pages into a store of %d-byte pages: %w", p.tp, img.PageBytes, p.db.opts.PageBytes, ErrCorrupt)
	}
	meta, err := filter.DecodeMeta(img.Meta)
	if err != nil {
		return fmt.Errorf("store: importing %s: the image's metadata: %w: %w", p.tp, err, ErrCorrupt)
	}
	if err := p.db.checkFreeSpaceBut(p.reservation.Bytes()); err != nil {
		return fmt.Errorf("store: importing %s: %w", p.tp, err)
	}
	if err := p.db.bdb.Update(func(txn *badger.Txn) error {
		if err := txn.Set(importingKey(p.prefix), nil); err != nil {
			return err
		}
		if err := txn.Delete(metaKey(p.prefix)); err != nil {
			return err
		}
		return txn.Delete(checkpointKey(p.prefix))
	}); err != nil {
		return fmt.Errorf("store: importing %s: marking the import: %w", p.tp, err) // nothing replaced
	}
	p.Discard()
	p.meta, p.cp, p.hasCP, p.origin = nil, Checkpoint{}, false, Origin{}
	p.forgetLog()
	// From here on a failure leaves no state: what was imported is deleted
	// with the marker (or, if that fails too, when the partition is next
	// opened), so that nothing reads a partial image as pages.
	fail := func(err error) error {
		p.dropCached() // the pages warmed so far are of no state
		if cerr := p.finishInterruptedImport(); cerr != nil {
			// The partial import stays (marked): a storage failure, whatever
			// ended the import, so its cause is not wrapped.
			p.db.logger.Error("deleting an import that failed; it is deleted when the partition is next opened", "partition", p.tp.String(), "err", cerr)
			return fmt.Errorf("store: importing %s: %v; deleting the partial import failed: %w", p.tp, err, cerr)
		}
		return fmt.Errorf("store: importing %s: %w", p.tp, err)
	}
	if err := p.deleteImported(); err != nil {
		return fail(fmt.Errorf("deleting the state it replaces: %w", err))
	}
	wb := p.db.bdb.NewWriteBatch()
	defer wb.Cancel()
	// Badger's default lets a WriteBatch queue 16 transactions of up to
	// MaxBatchSize each while its writes wait on memtable flushes; an
	// import holds at most importPendingTxns (Options.ImportMemoryBytes).
	wb.SetMaxPendingTxns(importPendingTxns)
	pb := p.db.opts.PageBytes
	// The first pages imported, up to half the page cache, enter it as
	// they are written: a restored partition goes on to replay its gap and
	// decide, and reading back from Badger every page it just wrote made a
	// replay after a restore five times slower than one over a warm cache.
	// They go into the cache at once, within its bound, rather than into
	// copies held until the commit (half the cache per import running,
	// outside the memory budget); an import that fails drops them with the
	// page table (fail).
	warmed, warmMax := 0, p.db.cachePages()/2
	var n, most uint64 = 0, meta.TotalPages()
	err = pages(func(id filter.PageID, data []byte) error {
		// The free space again every so often: the image may be
		// larger than its reservation said, or something else fills
		// the volume meanwhile; stopping here keeps Badger's writes
		// off a full volume (a SIGBUS).
		if (n+1)%importSpaceCheckPages == 0 {
			p.reservation.Consume(importSpaceCheckPages * int64(pb)) // written since the last check
			if err := p.db.checkFreeSpaceBut(p.reservation.Bytes()); err != nil {
				return err
			}
		}
		if len(data) != pb {
			return fmt.Errorf("%s is %d bytes, want %d: %w", fmtPageID(id), len(data), pb, ErrCorrupt)
		}
		if !meta.HasPage(id) {
			return fmt.Errorf("%s is not a page of the image's metadata (no such live sub-filter, or past its page count): %w", fmtPageID(id), ErrCorrupt)
		}
		if n++; n > most {
			return fmt.Errorf("more pages than the %d of the image's metadata: %w", most, ErrCorrupt)
		}
		v := make([]byte, pageBaseHeader+pb) // floor 0: the image's pages, before any write batch
		copy(v[pageBaseHeader:], data)
		if warmed < warmMax {
			warmed++
			p.cache(id, &cachedPage{data: append([]byte(nil), data...)})
		}
		return wb.Set(pageKey(p.prefix, id), v)
	})
	if err == nil {
		err = wb.Flush()
	}
	if err != nil {
		return fail(err)
	}
	if err := p.db.bdb.Update(func(txn *badger.Txn) error {
		if err := txn.Set(metaKey(p.prefix), img.Meta); err != nil {
			return err
		}
		if err := txn.Set(checkpointKey(p.prefix), encodeCheckpoint(img.Checkpoint)); err != nil {
			return err
		}
		if !img.Origin.IsZero() {
			if err := txn.Set(originKey(p.prefix), encodeOrigin(img.Origin)); err != nil {
				return err
			}
		}
		return txn.Delete(importingKey(p.prefix))
	}); err != nil {
		return fail(fmt.Errorf("committing the image: %w", err))
	}
	p.meta, p.cp, p.hasCP, p.origin = append([]byte{}, img.Meta...), img.Checkpoint, true, img.Origin
	return nil
}

// deleteImported deletes every key of p's partition but the import marker:
// pages, log entries and dropped-sub-filter markers of the state an import
// replaces, or of an import a crash cut short. Deletes go through a
// WriteBatch, not Badger's DropPrefix, which would block every partition's
// write batches while it runs.
func (p *PartitionState) deleteImported() error {
	wb := p.db.bdb.NewWriteBatch()
	defer wb.Cancel()
	marker := importingKey(p.prefix)
	err := p.db.bdb.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: p.prefix})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			k := it.Item().KeyCopy(nil)
			if string(k) == string(marker) {
				continue
			}
			if err := wb.Delete(k); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	return wb.Flush()
}

// finishInterruptedImport deletes the state of an import a crash cut
// short (its marker is set) and then the marker, leaving no state.
func (p *PartitionState) finishInterruptedImport() error {
	if err := p.deleteImported(); err != nil {
		return err
	}
	return p.db.bdb.Update(func(txn *badger.Txn) error { return txn.Delete(importingKey(p.prefix)) })
}

func importingKey(prefix []byte) []byte {
	return append(append(make([]byte, 0, len(prefix)+1), prefix...), tagImporting)
}

func has(txn *badger.Txn, key []byte) (bool, error) {
	_, err := txn.Get(key)
	if errors.Is(err, badger.ErrKeyNotFound) {
		return false, nil
	}
	return err == nil, err
}

// comparePageIDs orders page IDs as their keys: by sub-filter, then page.
func comparePageIDs(a, b filter.PageID) int {
	return cmp.Or(cmp.Compare(a.SubFilter, b.SubFilter), cmp.Compare(a.Page, b.Page))
}
