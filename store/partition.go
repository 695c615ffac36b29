package store

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/dgraph-io/badger/v4"

	"github.com/kdedup/kdedup/filter"
)

// Checkpoint is what a write batch records besides pages and metadata.
type Checkpoint struct {
	// Offset is the next input offset the state reflects: every record
	// below it has been applied, none at or above it.
	Offset int64
	// LeaderEpoch is the leader epoch of the record before Offset (-1 when
	// unknown), for fencing a consumer that resumes from Offset.
	LeaderEpoch int32
}

// PartitionState is the durable state of one topic-partition: the pages of its
// chain, the chain metadata and the checkpoint. It implements filter.Pager.
// Pages read or written since the last Commit stay in memory; Commit writes
// the dirty ones together with metadata and checkpoint in one Badger
// transaction, so the durable state is always that of a whole write batch.
//
// A PartitionState is not safe for concurrent use: one goroutine owns it. The
// PartitionStates of one DB may be used from different goroutines at once.
type PartitionState struct {
	db     *DB
	tp     TopicPartition
	prefix []byte
	// table indexes the partition's cached and dirty pages (pagecache.go).
	table pageTable
	// dirty are the pages changed since the last write batch, each also in
	// its table slot.
	dirty map[filter.PageID]*dirtyPage
	// last is the clean page Page returned last (lastID), whose log
	// MarkChanged needs even if the shared cache evicted it since.
	last   *cachedPage
	lastID filter.PageID
	// lastDirty is the dirty page Page returned or MarkChanged marked last
	// (lastDirtyID), nil after a write batch, Discard or Drop.
	lastDirty   *dirtyPage
	lastDirtyID filter.PageID
	// markErr is the error of reading the log of a page marked dirty
	// without Page; Commit returns it.
	markErr error
	// obsolete are delta entries folded into a committed base, to delete.
	obsolete []obsoleteDeltas
	// dirtyBytes is the sum of the dirty pages' batchBytes.
	dirtyBytes int64
	// staged is the pages the caller holds staged (SetStagedPages).
	staged int
	// lastObsoleteBytes is the key bytes deleteObsolete deleted last.
	lastObsoleteBytes int64
	// spareSpans are range buffers of committed dirty pages, for reuse.
	spareSpans [][]span
	// dropped are the sub-filters dropped since the last write batch;
	// reclaim are those committed as dropped whose pages are not yet
	// deleted.
	dropped []uint32
	reclaim []uint32
	meta    []byte
	cp      Checkpoint
	hasCP   bool
	origin  Origin
	closed  bool
	// reservation is the free space reserved for p's restore
	// (ReserveSpace), counted as p's own by Import's checks.
	reservation *Reservation
	// consolidated: ConsolidateStep found no live delta and no write batch
	// has written one since.
	consolidated bool
	// misses counts page lookups that read Badger (CacheMisses).
	misses uint64
	// pointReads counts pages read by point lookups of their known
	// entries (loadKnown), pointMisses those whose entries were not the
	// ones known and were listed instead; atomic, since Prefetch's
	// readers count them.
	pointReads, pointMisses atomic.Uint64
	// hits counts the page lookups served from memory (Page), written by
	// the owner alone and read by the metrics (DB.cacheHits).
	hits atomic.Uint64
	// prefetchIDs and prefetchSeen are Prefetch's buffers, reused.
	prefetchIDs  []filter.PageID
	prefetchSeen map[filter.PageID]struct{}
}

func (p *PartitionState) load() error {
	var meta, cp, origin []byte
	var hasMeta, hasCP, hasOrigin, importing bool
	err := p.db.bdb.View(func(txn *badger.Txn) error {
		var err error
		if importing, err = has(txn, importingKey(p.prefix)); err != nil || importing {
			return err
		}
		if meta, hasMeta, err = get(txn, metaKey(p.prefix)); err != nil {
			return err
		}
		if origin, hasOrigin, err = get(txn, originKey(p.prefix)); err != nil {
			return err
		}
		cp, hasCP, err = get(txn, checkpointKey(p.prefix))
		return err
	})
	if err != nil {
		return fmt.Errorf("store: loading %s: %w", p.tp, err)
	}
	if importing {
		// An Import a crash cut short: its pages are not a state.
		p.db.logger.Warn("deleting the state of an import that did not finish", "partition", p.tp.String())
		if p.db.opts.ReadOnly {
			return nil
		}
		if err := p.finishInterruptedImport(); err != nil {
			return fmt.Errorf("store: loading %s: deleting an unfinished import: %w", p.tp, err)
		}
		return nil
	}
	if hasOrigin {
		if p.origin, err = decodeOrigin(origin); err != nil {
			return p.db.corrupted(fmt.Errorf("store: loading %s: %w; %s", p.tp, err, recoverHint))
		}
	}
	if hasMeta != hasCP {
		return p.db.corrupted(fmt.Errorf("store: loading %s: %w", p.tp, corruptError(p.db.where,
			fmt.Sprintf("metadata present %t, checkpoint present %t; a write batch writes both", hasMeta, hasCP))))
	}
	if !hasCP {
		return nil
	}
	if p.cp, err = decodeCheckpoint(cp); err != nil {
		return p.db.corrupted(fmt.Errorf("store: loading %s: %w; %s", p.tp, err, recoverHint))
	}
	p.meta, p.hasCP = meta, true
	if p.reclaim, err = p.droppedMarkers(); err != nil {
		return fmt.Errorf("store: loading %s: %w", p.tp, err)
	}
	if !p.db.opts.ReadOnly {
		p.deleteDropped()
	}
	return nil
}

// droppedMarkers lists the sub-filters whose drop was committed and whose
// pages may not all be deleted yet.
func (p *PartitionState) droppedMarkers() ([]uint32, error) {
	var subs []uint32
	start := append(append([]byte{}, p.prefix...), tagDropped)
	err := p.db.bdb.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: start})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			k := it.Item().Key()
			if len(k) != len(start)+4 {
				return fmt.Errorf("dropped-sub-filter key %x is %d bytes, want %d: %w", k, len(k), len(start)+4, ErrCorrupt)
			}
			subs = append(subs, binary.BigEndian.Uint32(k[len(start):]))
		}
		return nil
	})
	return subs, err
}

// deleteDropped deletes the pages of the sub-filters in p.reclaim and then
// their markers. A failure is logged and the sub-filters stay listed, to be
// retried after the next write batch (or the next open): the pages are
// garbage, nothing reads them, and the committed state is unaffected.
func (p *PartitionState) deleteDropped() {
	for len(p.reclaim) > 0 {
		if err := p.db.checkFreeSpace(); err != nil {
			// Deletes are writes too; the next Commit reports the shortage.
			return
		}
		sub := p.reclaim[0]
		n, err := p.deleteSubFilter(sub)
		if err != nil {
			p.db.logger.Error("deleting the pages of a dropped sub-filter failed; will retry after the next write batch",
				"partition", p.tp.String(), "sub_filter", sub, "err", err)
			return
		}
		p.db.metrics.pagesReclaimed.Add(float64(n))
		p.reclaim = p.reclaim[1:]
	}
}

func (p *PartitionState) deleteSubFilter(sub uint32) (int, error) {
	prefix := subFilterPagesPrefix(p.prefix, sub)
	wb := p.db.bdb.NewWriteBatch()
	defer wb.Cancel()
	n := 0
	err := p.db.bdb.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: prefix})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			if err := wb.Delete(it.Item().KeyCopy(nil)); err != nil {
				return err
			}
			n++
		}
		return nil
	})
	if err == nil {
		err = wb.Flush()
	}
	if err == nil {
		err = p.db.bdb.Update(func(txn *badger.Txn) error { return txn.Delete(droppedKey(p.prefix, sub)) })
	}
	return n, err
}

// get returns a copy of key's value (non-nil when found, even if empty).
func get(txn *badger.Txn, key []byte) ([]byte, bool, error) {
	item, err := txn.Get(key)
	if errors.Is(err, badger.ErrKeyNotFound) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	v, err := item.ValueCopy(nil)
	if err != nil {
		return nil, false, err
	}
	if v == nil {
		v = []byte{}
	}
	return v, true, nil
}

// TopicPartition returns the topic-partition whose state p holds.
func (p *PartitionState) TopicPartition() TopicPartition { return p.tp }

// Meta returns the chain metadata of the last committed write batch, or nil
// if the partition has none. The caller must not modify it.
func (p *PartitionState) Meta() []byte { return p.meta }

// Checkpoint returns the checkpoint of the last committed write batch, and
// false if the partition has none.
func (p *PartitionState) Checkpoint() (Checkpoint, bool) { return p.cp, p.hasCP }

// Page returns page id, PageBytes long: the dirty copy if there is one, else
// the cached or stored clean page (its base with its deltas applied); a page
// never written reads as zeros. The caller may modify the page in place and
// must then call MarkChanged or MarkDirty before its next call to Page,
// since an unmarked clean page can be evicted from the cache (and its
// changes lost) at any time. A stored entry that cannot be right (a base of
// the wrong length, a delta out of the page or out of sequence) returns
// ErrCorrupt; after Close, ErrClosed.
func (p *PartitionState) Page(id filter.PageID) ([]byte, error) {
	// The chain asks again for the page it read last (an insert reads the
	// newest sub-filter's page in its lookup, then to place the key): found
	// without a map or cache lookup. p.last is never a dirty page
	// (markDirty clears it), and its bytes stay valid when the shared cache
	// evicts it: only this PartitionState writes them.
	if d := p.lastDirty; d != nil && p.lastDirtyID == id {
		p.hits.Add(1)
		return d.data, nil
	}
	if c := p.last; c != nil && p.lastID == id && !p.closed && !p.db.closed.Load() {
		p.hits.Add(1)
		return c.data, nil
	}
	ch, i := p.table.slot(id, false)
	if ch != nil {
		if d := ch.dirty[i]; d != nil {
			p.hits.Add(1)
			p.lastDirty, p.lastDirtyID = d, id
			return d.data, nil
		}
	}
	if p.closed || p.db.closed.Load() {
		return nil, fmt.Errorf("store: reading %s of %s: %w", fmtPageID(id), p.tp, ErrClosed)
	}
	if ch != nil {
		if c := ch.clean[i].Load(); c != nil {
			c.touch()
			p.hits.Add(1)
			p.last, p.lastID = c, id
			return c.data, nil
		}
	}
	p.db.metrics.cacheMisses.Inc()
	p.misses++
	c, err := p.load1(id)
	if err != nil {
		return nil, err
	}
	p.cache(id, c)
	p.last, p.lastID = c, id
	return c.data, nil
}

// Peek returns page id if it is in memory, dirty or cached, and nil
// otherwise, reading nothing from Badger and changing nothing (not even
// the page's recent use): filter.Peeker, for the chain's bucket
// prefetch. Like Page, for the owner of p only.
func (p *PartitionState) Peek(id filter.PageID) []byte {
	if p.closed || p.db.closed.Load() {
		return nil
	}
	ch, i := p.table.slot(id, false)
	if ch == nil {
		return nil
	}
	if d := ch.dirty[i]; d != nil {
		return d.data
	}
	if c := ch.clean[i].Load(); c != nil {
		return c.data
	}
	return nil
}

// cache adds c, the clean page id read from Badger, to the DB's page cache,
// and keeps its log beyond it.
func (p *PartitionState) cache(id filter.PageID, c *cachedPage) {
	ch, i := p.table.slot(id, true)
	ch.setStored(i, c.log)
	p.db.cache.add(&ch.clean[i], c)
}

// storedLog returns what page id's stored entries are, if p knows.
func (p *PartitionState) storedLog(id filter.PageID) (pageLog, bool) {
	ch, i := p.table.slot(id, false)
	if ch == nil {
		return pageLog{}, false
	}
	return ch.storedLog(i)
}

// load1 reads page id and its log from Badger: with point lookups when p
// knows its stored entries (loadKnown), else by listing them.
func (p *PartitionState) load1(id filter.PageID) (*cachedPage, error) {
	var (
		c    *cachedPage
		lerr error
	)
	lg, known := p.storedLog(id)
	err := p.db.bdb.View(func(txn *badger.Txn) error {
		prefix := pageKey(p.prefix, id)
		if known {
			var ok bool
			if c, ok, lerr = p.loadKnown(txn, id, prefix, lg); ok || lerr != nil {
				return nil
			}
		}
		it := txn.NewIterator(badger.IteratorOptions{Prefix: prefix})
		defer it.Close()
		c, lerr = p.loadAt(it, id, prefix)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("store: reading %s of %s: %w", fmtPageID(id), p.tp, err)
	}
	return c, lerr
}

// loadAt reads page id and its log through it (readPageAt), prefix being
// id's page key, and counts the read; a stored entry that cannot be right
// is ErrCorrupt (logged and counted as corruption).
func (p *PartitionState) loadAt(it *badger.Iterator, id filter.PageID, prefix []byte) (*cachedPage, error) {
	var c cachedPage
	var found bool
	var err error
	c.data, c.log, found, err = p.readPageAt(it, prefix)
	if err != nil {
		return nil, p.readFailed(id, err)
	}
	if found {
		p.db.metrics.pageReads.Inc()
	}
	return &c, nil
}

// loadKnown reads page id, whose stored entries lg describes, with a point
// lookup of each (readKnown) and counts the read. ok is false, with
// nothing read, when the page has more live deltas than maxPointDeltas or
// its entries are not those of lg; the caller then lists them (loadAt).
// Errors are loadAt's.
func (p *PartitionState) loadKnown(txn *badger.Txn, id filter.PageID, prefix []byte, lg pageLog) (*cachedPage, bool, error) {
	if lg.lastSeq-lg.baseSeq > maxPointDeltas {
		return nil, false, nil
	}
	data, found, ok, err := p.readKnown(txn, prefix, lg)
	if err != nil {
		return nil, false, p.readFailed(id, err)
	}
	if !ok {
		p.pointMisses.Add(1)
		return nil, false, nil
	}
	p.pointReads.Add(1)
	if found {
		p.db.metrics.pageReads.Inc()
	}
	return &cachedPage{data: data, log: lg}, true, nil
}

// readFailed returns err, an error reading page id, as Page reports it: a
// stored entry that cannot be right is ErrCorrupt (logged and counted as
// corruption).
func (p *PartitionState) readFailed(id filter.PageID, err error) error {
	switch {
	case errors.Is(err, errBadEntry):
		return p.db.corrupted(fmt.Errorf("store: reading %s of %s: %w", fmtPageID(id), p.tp,
			corruptError(p.db.where, err.Error())))
	case isChecksumError(err):
		return p.db.corrupted(fmt.Errorf("store: reading %s of %s: %w",
			fmtPageID(id), p.tp, corruptError(p.db.where, err.Error())))
	default:
		return fmt.Errorf("store: reading %s of %s: %w", fmtPageID(id), p.tp, err)
	}
}

// MarkDirty records that page, the slice Page returned for id, was modified
// as a whole; the next Commit persists it whole. Until then it is held
// outside the cache and never evicted. It has no effect after Close.
func (p *PartitionState) MarkDirty(id filter.PageID, page []byte) {
	if d := p.markDirty(id, page); d != nil {
		p.setWhole(d)
		p.account(d)
	}
}

// MarkChanged records that bytes [off, off+n) of page, the slice Page
// returned for id, were modified; the next Commit persists the changed
// bytes of the page as a delta, or the whole page (see the package
// comment). A range outside the page counts as MarkDirty. Until then the
// page is held outside the cache and never evicted. It has no effect after
// Close.
func (p *PartitionState) MarkChanged(id filter.PageID, page []byte, off, n int) {
	if d := p.markDirty(id, page); d != nil {
		p.mark(d, off, n)
		p.account(d)
	}
}

// markDirty returns the dirty record of id, creating it from the page's
// clean record, or nil after Close.
func (p *PartitionState) markDirty(id filter.PageID, page []byte) *dirtyPage {
	if p.closed {
		return nil
	}
	// The chain marks the page it just asked for: most marks find it here
	// without a map lookup.
	if d := p.lastDirty; d != nil && p.lastDirtyID == id {
		d.data = page
		return d
	}
	ch, i := p.table.slot(id, true)
	if d := ch.dirty[i]; d != nil {
		d.data = page
		p.lastDirty, p.lastDirtyID = d, id
		return d
	}
	d := &dirtyPage{data: page}
	// The page's log comes from the record Page returned. Another PartitionState
	// sharing the cache may have evicted it since, hence p.last.
	lg, known := ch.storedLog(i)
	switch c := ch.clean[i].Load(); {
	case p.last != nil && p.lastID == id:
		d.log = p.last.log
	case c != nil:
		d.log = c.log
	case known:
		d.log = lg
	default:
		// Marked without a Page call first: the log must come from Badger.
		c, err := p.load1(id)
		if err != nil {
			p.markErr = errors.Join(p.markErr, err)
		} else {
			d.log = c.log
		}
	}
	p.dirty[id] = d
	ch.dirty[i] = d
	if p.staged > 0 {
		// A staged copy applied (filter.Overlay.Commit): it is this dirty
		// page now, counted once throughout, so that no other partition
		// sees the DB's pages dip while it is applied.
		p.staged--
	} else {
		p.db.addDirtyPages(1)
	}
	// The cache holds clean pages only; this one no longer is.
	p.db.cache.remove(&ch.clean[i])
	p.last = nil
	p.lastDirty, p.lastDirtyID = d, id
	return d
}

// Drop implements filter.Pager: the sub-filter's dirty pages are forgotten,
// and the next Commit records the drop and then deletes its stored pages
// (see the package comment). Its clean cached pages are left to age out
// of the page cache: IDs are never reused, so nothing asks for them again. It has
// no effect after Close.
func (p *PartitionState) Drop(subFilter uint32) {
	if p.closed {
		return
	}
	for id, d := range p.dirty {
		if id.SubFilter == subFilter {
			if ch, i := p.table.slot(id, false); ch != nil {
				ch.dirty[i] = nil
			}
			p.dirtyBytes -= d.batchBytes
			delete(p.dirty, id)
			p.db.addDirtyPages(-1)
		}
	}
	p.table.drop(subFilter)
	if p.last != nil && p.lastID.SubFilter == subFilter {
		p.last = nil
	}
	p.lastDirty = nil
	p.obsolete = slices.DeleteFunc(p.obsolete, func(o obsoleteDeltas) bool { return o.id.SubFilter == subFilter })
	p.dropped = append(p.dropped, subFilter)
}

// DirtyBytes returns the size of the write batch the changes since the last
// successful Commit (or Discard) make: PageBytes for a page written whole,
// and for a page written as a delta an upper bound of the delta entry's
// key, value and Badger's per-entry bytes, at least a quarter of a page
// (minDirtyBytes). A page counts at most PageBytes, so that a write batch
// cut when DirtyBytes reaches Options.FlushBytes stays within the Badger
// transaction Open sized for it, and at least a quarter of it, so that the
// dirty pages it holds take at most four times FlushBytes.
func (p *PartitionState) DirtyBytes() int64 { return p.dirtyBytes }

// DirtyPages returns the number of pages changed since the last successful
// Commit (or Discard).
func (p *PartitionState) DirtyPages() int { return len(p.dirty) }

// account updates d's share of DirtyBytes after a change.
func (p *PartitionState) account(d *dirtyPage) {
	b := d.sizeInBatch(p.db.opts.PageBytes, p.deltaKeyBytes())
	p.dirtyBytes += b - d.batchBytes
	d.batchBytes = b
}

// Commit writes a write batch in one Badger transaction: every dirty page
// (as a delta of its changed bytes, or whole; see the package comment),
// meta as the chain metadata and cp as the checkpoint. On success the dirty
// pages become clean cached pages and Meta and Checkpoint return meta and
// cp. On error nothing changes in memory: the dirty pages stay dirty, Meta
// and Checkpoint keep their values. The durable state is that of the
// previous or of this write batch, never a mix. Errors: ErrDiskFull when
// the data directory's filesystem has less free space than the batch, the
// memtable flushes and a compaction need (checked before Badger writes
// anything), ErrBatchTooBig when the batch exceeds Badger's transaction
// limit (the caller let DirtyBytes grow past FlushBytes), ErrCorrupt when a
// dirty page is not PageBytes long, ErrReadOnly, ErrClosed, the error of
// reading a page marked without Page, or Badger's error.
func (p *PartitionState) Commit(meta []byte, cp Checkpoint) error {
	if p.closed || p.db.closed.Load() {
		return fmt.Errorf("store: committing a write batch of %s: %w", p.tp, ErrClosed)
	}
	if p.db.opts.ReadOnly {
		return fmt.Errorf("store: committing a write batch of %s: %w", p.tp, ErrReadOnly)
	}
	start := time.Now()
	// Checked before Badger sees the batch: Badger writes through memory
	// maps, and a write the filesystem has no room for kills the process.
	err := p.markErr
	if err == nil {
		err = p.db.checkFreeSpace()
	}
	var (
		written int64
		logs    map[filter.PageID]pageLog
	)
	if err == nil {
		written, logs, err = p.commit(meta, cp)
	}
	if err != nil {
		p.db.metrics.commitErrors.Inc()
		return fmt.Errorf("store: committing a write batch of %s (%d dirty pages, checkpoint offset %d): %w",
			p.tp, len(p.dirty), cp.Offset, err)
	}
	p.db.metrics.commitSeconds.Observe(time.Since(start).Seconds())
	p.db.metrics.commitBytes.Add(float64(written))
	p.db.metrics.commits.Inc()

	for id, d := range p.dirty {
		lg := logs[id]
		if d.log.oldest != 0 && lg.oldest == 0 {
			p.obsolete = append(p.obsolete, obsoleteDeltas{id: id, from: d.log.oldest, to: lg.baseSeq})
		}
		ch, i := p.table.slot(id, true)
		ch.dirty[i] = nil
		ch.setStored(i, lg)
		p.db.cache.add(&ch.clean[i], &cachedPage{data: d.data, log: lg})
		p.recycle(d)
	}
	p.db.addDirtyPages(-int64(len(p.dirty)))
	clear(p.dirty)
	p.dirtyBytes = 0
	p.lastDirty = nil
	p.meta = append([]byte{}, meta...)
	p.cp, p.hasCP = cp, true
	p.reclaim = append(p.reclaim, p.dropped...)
	p.dropped = p.dropped[:0]
	p.deleteDropped()
	p.deleteObsolete()
	return nil
}

// commit stages and commits the transaction and returns the key and value
// bytes it wrote and the log of every dirty page once it is committed.
func (p *PartitionState) commit(meta []byte, cp Checkpoint) (int64, map[filter.PageID]pageLog, error) {
	txn := p.db.bdb.NewTransaction(true)
	defer txn.Discard()
	var written int64
	set := func(key, value []byte) error {
		written += int64(len(key) + len(value))
		err := txn.Set(key, value)
		if errors.Is(err, badger.ErrTxnTooBig) {
			return fmt.Errorf("%w (FlushBytes %d, Badger's limit %d bytes): %w",
				ErrBatchTooBig, p.db.opts.FlushBytes, p.db.bdb.MaxBatchSize(), err)
		}
		return err
	}
	pb := p.db.opts.PageBytes
	logs := make(map[filter.PageID]pageLog, len(p.dirty))
	for id, d := range p.dirty {
		if len(d.data) != pb {
			return 0, nil, fmt.Errorf("dirty %s is %d bytes, want %d: %w", fmtPageID(id), len(d.data), pb, ErrCorrupt)
		}
		lg := d.log
		if !d.whole {
			v := encodeDelta(d.spans, d.data)
			k := deltaKey(p.prefix, id, lg.lastSeq+1)
			if cost := len(k) + len(v); lg.deltaBytes+cost <= maxDeltaBytes(pb) && len(v) < pb {
				if err := set(k, v); err != nil {
					return 0, nil, err
				}
				lg.lastSeq++
				lg.deltaBytes += cost
				p.consolidated = false
				if lg.oldest == 0 {
					lg.oldest = lg.lastSeq
				}
				logs[id] = lg
				continue
			}
		}
		// Consolidation: the base takes every delta written so far, which
		// become obsolete (deleted once this batch is durable).
		base := make([]byte, pageBaseHeader, pageBaseHeader+pb)
		binary.BigEndian.PutUint32(base, lg.lastSeq)
		if err := set(pageKey(p.prefix, id), append(base, d.data...)); err != nil {
			return 0, nil, err
		}
		logs[id] = pageLog{baseSeq: lg.lastSeq, lastSeq: lg.lastSeq}
	}
	for _, sub := range p.dropped {
		if err := set(droppedKey(p.prefix, sub), nil); err != nil {
			return 0, nil, err
		}
	}
	if err := set(metaKey(p.prefix), meta); err != nil {
		return 0, nil, err
	}
	if err := set(checkpointKey(p.prefix), encodeCheckpoint(cp)); err != nil {
		return 0, nil, err
	}
	if hook := p.db.tuning.beforeTxnCommit; hook != nil {
		if err := hook(p.tp); err != nil {
			return 0, nil, err
		}
	}
	if err := txn.Commit(); err != nil {
		return 0, nil, err
	}
	return written, logs, nil
}

// Discard drops the dirty pages and this partition's cached pages, in
// memory only: the next Page reads the last committed state from Badger.
// Use it when the partition is lost or its uncommitted changes are void.
func (p *PartitionState) Discard() {
	p.db.addDirtyPages(-int64(len(p.dirty)))
	for id := range p.dirty {
		if ch, i := p.table.slot(id, false); ch != nil {
			ch.dirty[i] = nil // old chunks live on while ring entries point into them
		}
	}
	clear(p.dirty)
	p.dirtyBytes = 0
	p.last, p.lastDirty, p.markErr = nil, nil, nil
	p.dropped = p.dropped[:0]
	p.dropCached()
}

// dropCached makes the partition's cached pages unreachable by starting a
// new, empty page table (clear its dirty slots first: the cache's entries
// keep the old table's chunks until they are evicted): they age out of the
// page cache like any page nobody asks for,
// in O(1). Removing them one by one scanned the whole cache once per
// partition, which a thousand partitions closing at once with a 650 MiB
// cache turned into 24 s of shutdown and 1.5 GiB of garbage.
func (p *PartitionState) dropCached() {
	p.table = pageTable{}
	p.last = nil
}

// Close releases the in-memory state of the partition, dropping its dirty
// and cached pages, so that the topic-partition can be opened again. Later
// calls do nothing.
func (p *PartitionState) Close() {
	if p.closed {
		return
	}
	p.Discard()
	p.SetStagedPages(0)
	p.reservation.Release()
	p.closed = true
	p.db.release(p.tp)
}

var _ filter.Pager = (*PartitionState)(nil)

func fmtPageID(id filter.PageID) string {
	return fmt.Sprintf("page %d of sub-filter %d", id.Page, id.SubFilter)
}
