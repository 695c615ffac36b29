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
	dirty []*dirtyPage
	// last is the clean page Page returned last (lastID), found again
	// without a lookup, and whose record MarkChanged reuses even if the
	// shared cache evicted it since.
	last   *cachedPage
	lastID filter.PageID
	// lastDirty is the dirty page Page returned or MarkChanged marked last
	// (lastDirtyID), nil after a write batch, Discard or Drop.
	lastDirty   *dirtyPage
	lastDirtyID filter.PageID
	// dirtyBytes is the sum of the dirty pages' batchBytes.
	dirtyBytes int64
	// staged is the pages the caller holds staged (SetStagedPages).
	staged int
	// spareSpans are range buffers of committed dirty pages, for reuse.
	spareSpans [][]span
	// dropped are the sub-filters dropped since the last write batch;
	// reclaim are those committed as dropped whose pages are not yet
	// deleted, markers those whose pages are deleted and whose markers
	// stay until no log entry before their drop is stored.
	dropped []uint32
	reclaim []dropMarker
	markers []dropMarker
	// seq is the sequence number of the last committed write batch.
	seq uint64
	// pending are the pages whose changes since their base are in the
	// log, queue the order they became pending in (the write-back's),
	// patchBytes the bytes of their patches.
	pending    map[filter.PageID]*pendingPage
	queue      []pendingBatch
	patchBytes int64
	// logSeqs are the sequence numbers of the stored log entries, in
	// order.
	logSeqs []uint64
	// forceWriteBack is how many pending pages the next write batch
	// writes back whatever their age (ConsolidateStep), 0 for the
	// write-back's own rule.
	forceWriteBack int
	// logBuf and deltaBuf are Commit's buffers, reused (logBuf up to
	// maxKeptLogBuffer); spareDirty dirtyPage records for reuse.
	logBuf, deltaBuf []byte
	spareDirty       []*dirtyPage
	meta             []byte
	cp               Checkpoint
	hasCP            bool
	origin           Origin
	closed           bool
	// reservation is the free space reserved for p's restore
	// (ReserveSpace), counted as p's own by Import's checks.
	reservation *Reservation
	// misses counts page lookups that read Badger (CacheMisses).
	misses uint64
	// hits counts the page lookups served from memory (Page), written by
	// the owner alone and read by the metrics (DB.cacheHits).
	hits atomic.Uint64
	// prefetchIDs and prefetchSeen are Prefetch's buffers, reused.
	prefetchIDs  []filter.PageID
	prefetchSeen map[filter.PageID]struct{}
}

func (p *PartitionState) load() error {
	var meta, cp, origin, seq []byte
	var hasMeta, hasCP, hasOrigin, hasSeq, importing bool
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
		if seq, hasSeq, err = get(txn, sequenceKey(p.prefix)); err != nil {
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
	if hasSeq {
		if len(seq) != seqBytes {
			return p.db.corrupted(fmt.Errorf("store: loading %s: %w", p.tp, corruptError(p.db.where,
				fmt.Sprintf("write-batch sequence number of %d bytes, want %d", len(seq), seqBytes))))
		}
		p.seq = binary.BigEndian.Uint64(seq)
	}
	p.meta, p.hasCP = meta, true
	if p.reclaim, err = p.droppedMarkers(); err != nil {
		return fmt.Errorf("store: loading %s: %w", p.tp, err)
	}
	if err := p.db.bdb.View(func(txn *badger.Txn) error { return p.replayLog(txn, p.reclaim) }); err != nil {
		if isDamaged(err) {
			return p.db.corrupted(fmt.Errorf("store: loading %s: replaying its log: %w", p.tp, corruptError(p.db.where, err.Error())))
		}
		return fmt.Errorf("store: loading %s: replaying its log: %w", p.tp, err)
	}
	if !p.db.opts.ReadOnly {
		p.deleteDropped()
	}
	return nil
}

// droppedMarkers lists the sub-filters whose drop was committed and whose
// pages may not all be deleted yet, or whose records the log may still
// hold.
func (p *PartitionState) droppedMarkers() ([]dropMarker, error) {
	var subs []dropMarker
	start := append(append([]byte{}, p.prefix...), tagDropped)
	err := p.db.bdb.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: start})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			k := it.Item().Key()
			if len(k) != len(start)+4 {
				return fmt.Errorf("dropped-sub-filter key %x is %d bytes, want %d: %w", k, len(k), len(start)+4, ErrCorrupt)
			}
			m := dropMarker{sub: binary.BigEndian.Uint32(k[len(start):])}
			err := it.Item().Value(func(v []byte) error {
				if len(v) != seqBytes {
					return fmt.Errorf("dropped-sub-filter marker of %d bytes, want %d: %w", len(v), seqBytes, ErrCorrupt)
				}
				m.seq = binary.BigEndian.Uint64(v)
				return nil
			})
			if err != nil {
				return err
			}
			subs = append(subs, m)
		}
		return nil
	})
	return subs, err
}

// deleteDropped deletes the pages of the sub-filters in p.reclaim, and
// the markers of those whose pages are deleted once no log entry written
// before their drop is stored (a log entry's records of a dropped
// sub-filter are skipped by their marker when the log is replayed). A
// failure is logged and the sub-filters stay listed, to be retried after
// the next write batch (or the next open): the pages are garbage, nothing
// reads them, and the committed state is unaffected.
func (p *PartitionState) deleteDropped() {
	for len(p.reclaim) > 0 {
		if err := p.db.checkFreeSpace(); err != nil {
			// Deletes are writes too; the next Commit reports the shortage.
			return
		}
		m := p.reclaim[0]
		n, err := p.deleteSubFilter(m.sub)
		if err != nil {
			p.db.logger.Error("deleting the pages of a dropped sub-filter failed; will retry after the next write batch",
				"partition", p.tp.String(), "sub_filter", m.sub, "err", err)
			return
		}
		p.db.metrics.pagesReclaimed.Add(float64(n))
		p.reclaim = p.reclaim[1:]
		p.markers = append(p.markers, m)
	}
	var done []dropMarker
	p.markers = slices.DeleteFunc(p.markers, func(m dropMarker) bool {
		if len(p.logSeqs) > 0 && p.logSeqs[0] < m.seq {
			return false
		}
		done = append(done, m)
		return true
	})
	if len(done) == 0 {
		return
	}
	err := p.db.bdb.Update(func(txn *badger.Txn) error {
		for _, m := range done {
			if err := txn.Delete(droppedKey(p.prefix, m.sub)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		p.db.logger.Error("deleting the markers of dropped sub-filters failed; will retry after the next write batch",
			"partition", p.tp.String(), "sub_filters", len(done), "err", err)
		p.markers = append(p.markers, done...)
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
// the cached or stored clean page (its base with its logged changes
// applied); a page never written reads as zeros. The caller may modify the page in place and
// must then call MarkChanged or MarkDirty before its next call to Page,
// since an unmarked clean page can be evicted from the cache (and its
// changes lost) at any time. A stored entry that cannot be right (a base of
// the wrong length or of a floor past its logged changes, a patch run out
// of the page) returns ErrCorrupt; after Close, ErrClosed.
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

// cache adds c, the clean page id read from Badger, to the DB's page
// cache.
func (p *PartitionState) cache(id filter.PageID, c *cachedPage) {
	ch, i := p.table.slot(id, true)
	p.db.cache.add(&ch.clean[i], c)
}

// load1 reads page id of the committed state from Badger: one point
// lookup of its base, and its patch applied if it is pending.
func (p *PartitionState) load1(id filter.PageID) (*cachedPage, error) {
	var (
		data  []byte
		found bool
		rerr  error
	)
	err := p.db.bdb.View(func(txn *badger.Txn) error {
		data, found, rerr = p.readPage(txn, id, p.pendingOf(id))
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("store: reading %s of %s: %w", fmtPageID(id), p.tp, err)
	}
	if rerr != nil {
		return nil, p.readFailed(id, rerr)
	}
	if found {
		p.db.metrics.pageReads.Inc()
	}
	return &cachedPage{data: data}, nil
}

// readFailed returns err, an error reading page id, as Page reports it: a
// stored entry that cannot be right is ErrCorrupt (logged and counted as
// corruption).
func (p *PartitionState) readFailed(id filter.PageID, err error) error {
	if isDamaged(err) {
		return p.db.corrupted(fmt.Errorf("store: reading %s of %s: %w", fmtPageID(id), p.tp,
			corruptError(p.db.where, err.Error())))
	}
	return fmt.Errorf("store: reading %s of %s: %w", fmtPageID(id), p.tp, err)
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
// returned for id, were modified; the next Commit logs the changed
// bytes of the page, or writes the whole page (see the package
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
	var d *dirtyPage
	if n := len(p.spareDirty); n > 0 {
		d, p.spareDirty = p.spareDirty[n-1], p.spareDirty[:n-1]
	} else {
		d = new(dirtyPage)
	}
	d.data, d.ch, d.slot = page, ch, i
	d.pend, d.patched = ch.pend[i], int(ch.patchLen[i])
	// The cached record, reused when the write batch caches the page
	// again: the one Page returned (another PartitionState sharing the
	// cache may have evicted it since), else the cached one.
	if d.clean = ch.clean[i].Load(); p.last != nil && p.lastID == id {
		d.clean = p.last
	}
	d.id = id
	p.dirty = append(p.dirty, d)
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
	p.dirty = slices.DeleteFunc(p.dirty, func(d *dirtyPage) bool {
		if d.id.SubFilter != subFilter {
			return false
		}
		d.ch.dirty[d.slot] = nil
		p.dirtyBytes -= d.batchBytes
		p.db.addDirtyPages(-1)
		return true
	})
	p.table.drop(subFilter)
	if p.last != nil && p.lastID.SubFilter == subFilter {
		p.last = nil
	}
	p.lastDirty = nil
	p.dropped = append(p.dropped, subFilter)
}

// DirtyBytes returns the size of the write batch the changes since the last
// successful Commit (or Discard) make: PageBytes for a page written whole,
// and for a logged page an upper bound of its log record, at least a
// quarter of a page (minDirtyBytes). A page counts at most PageBytes, so that a write batch
// cut when DirtyBytes reaches Options.FlushBytes stays within the Badger
// transaction Open sized for it, and at least a quarter of it, so that the
// dirty pages it holds take at most four times FlushBytes.
func (p *PartitionState) DirtyBytes() int64 { return p.dirtyBytes }

// DirtyPages returns the number of pages changed since the last successful
// Commit (or Discard).
func (p *PartitionState) DirtyPages() int { return len(p.dirty) }

// account updates d's share of DirtyBytes after a change.
func (p *PartitionState) account(d *dirtyPage) {
	b := d.sizeInBatch(p.db.opts.PageBytes)
	p.dirtyBytes += b - d.batchBytes
	d.batchBytes = b
}

// Commit writes a write batch in one Badger transaction: one log entry
// holding the changed bytes of every dirty page (pages written whole
// instead: those marked whole, those whose logged changes would pass half
// a page), the pages the write-back takes this time written whole (see
// the package comment), meta as the chain metadata and cp as the
// checkpoint. On success the dirty pages become clean cached pages and
// Meta and Checkpoint return meta and cp; the log entries every page has
// since been written past are deleted. On error nothing changes in
// memory: the dirty pages stay dirty, Meta and Checkpoint keep their
// values. The durable state is that of the previous or of this write
// batch, never a mix. Errors: ErrDiskFull when the data directory's
// filesystem has less free space than the batch, the memtable flushes and
// a compaction need (checked before Badger writes anything),
// ErrBatchTooBig when the batch exceeds Badger's transaction limit (the
// caller let DirtyBytes grow past FlushBytes), ErrCorrupt when a dirty
// page is not PageBytes long or a page to write back cannot be read
// right, ErrReadOnly, ErrClosed, or Badger's error.
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
	err := p.db.checkFreeSpace()
	var r commitResult
	if err == nil {
		r, err = p.commit(meta, cp, p.db.now())
	}
	if err != nil {
		p.db.metrics.commitErrors.Inc()
		return fmt.Errorf("store: committing a write batch of %s (%d dirty pages, checkpoint offset %d): %w",
			p.tp, len(p.dirty), cp.Offset, err)
	}
	p.db.metrics.commitSeconds.Observe(time.Since(start).Seconds())
	p.db.metrics.commitBytes.Add(float64(r.written))
	p.db.metrics.commits.Inc()
	p.db.metrics.writtenBack.Add(float64(r.writtenBack))

	p.settle(r)
	for _, d := range p.dirty {
		d.ch.dirty[d.slot] = nil
		c := d.clean
		if c == nil {
			c = new(cachedPage)
		}
		c.data = d.data
		p.db.cache.add(&d.ch.clean[d.slot], c)
		p.recycle(d)
		if len(p.spareDirty) < maxSpareSpans {
			*d = dirtyPage{}
			p.spareDirty = append(p.spareDirty, d)
		}
	}
	p.db.addDirtyPages(-int64(len(p.dirty)))
	clear(p.dirty)
	p.dirty = p.dirty[:0]
	p.dirtyBytes = 0
	p.lastDirty = nil
	p.meta = append([]byte{}, meta...)
	p.cp, p.hasCP = cp, true
	p.trimLog()
	p.deleteDropped()
	return nil
}

// commitResult is what a committed write batch changed of the log and
// the pending pages.
type commitResult struct {
	seq     uint64
	at      int64
	written int64
	// logged are the records of the batch's log entry, logv: page id's
	// patch bytes are logv[lo:hi].
	logv   []byte
	logged []loggedRecord
	hasLog bool
	// whole are the pages written whole, writtenBack how many of them the
	// write-back took.
	whole       []filter.PageID
	writtenBack int
	// qi, qj are where in p.queue the write-back stopped.
	qi, qj int
}

type loggedRecord struct {
	id     filter.PageID
	d      *dirtyPage
	lo, hi int
}

// commit stages and commits the transaction of write batch p.seq+1 at
// now.
func (p *PartitionState) commit(meta []byte, cp Checkpoint, now time.Time) (r commitResult, err error) {
	txn := p.db.bdb.NewTransaction(true)
	defer txn.Discard()
	set := func(key, value []byte) error {
		r.written += int64(len(key) + len(value))
		err := txn.Set(key, value)
		if errors.Is(err, badger.ErrTxnTooBig) {
			return fmt.Errorf("%w (FlushBytes %d, Badger's limit %d bytes): %w",
				ErrBatchTooBig, p.db.opts.FlushBytes, p.db.bdb.MaxBatchSize(), err)
		}
		return err
	}
	pb := p.db.opts.PageBytes
	r.seq, r.at = p.seq+1, now.UnixNano()
	seq := binary.BigEndian.AppendUint64(make([]byte, 0, seqBytes), r.seq)
	chosen, qi, qj := p.chooseWriteBack(now)
	r.qi, r.qj, r.writtenBack = qi, qj, len(chosen)
	defer func() {
		if err != nil {
			for _, id := range chosen {
				if pp := p.pending[id]; pp != nil {
					pp.writeBack = false
				}
			}
		}
	}()
	putBase := func(id filter.PageID, data []byte) error {
		v := make([]byte, pageBaseHeader+pb)
		copy(v, seq)
		copy(v[pageBaseHeader:], data)
		r.whole = append(r.whole, id)
		return set(pageKey(p.prefix, id), v)
	}
	logv := binary.BigEndian.AppendUint64(p.logBuf[:0], uint64(r.at))
	for _, d := range p.dirty {
		id := d.id
		if len(d.data) != pb {
			return r, fmt.Errorf("dirty %s is %d bytes, want %d: %w", fmtPageID(id), len(d.data), pb, ErrCorrupt)
		}
		pp := d.pend
		if !d.whole && (pp == nil || !pp.writeBack) {
			start := len(logv)
			logv = binary.BigEndian.AppendUint32(logv, id.SubFilter)
			logv = binary.BigEndian.AppendUint32(logv, id.Page)
			p.deltaBuf = appendDelta(p.deltaBuf[:0], d.spans, d.data)
			logv = binary.AppendUvarint(logv, uint64(len(p.deltaBuf)))
			logv = append(logv, p.deltaBuf...)
			patched := 0
			if pp != nil {
				patched = len(pp.patch)
			}
			if patched+len(logv)-start-logRecordHeader <= maxPatchBytes(pb) {
				r.logged = append(r.logged, loggedRecord{id: id, d: d, lo: start + logRecordHeader, hi: len(logv)})
				continue
			}
			logv = logv[:start]
		}
		if err := putBase(id, d.data); err != nil {
			return r, err
		}
	}
	for _, id := range chosen {
		if ch, i := p.table.slot(id, false); ch != nil && ch.dirty[i] != nil {
			continue // written whole above
		}
		data, err := p.committedPage(id)
		if err != nil {
			return r, err
		}
		if err := putBase(id, data); err != nil {
			return r, err
		}
	}
	r.logv = logv
	if cap(logv) <= maxKeptLogBuffer {
		p.logBuf = logv // Badger copies values: reused by the next batch
	} else {
		p.logBuf = nil
	}
	if len(logv) > logValueHeader {
		r.hasLog = true
		if err := set(logKey(p.prefix, r.seq), logv); err != nil {
			return r, err
		}
	}
	for _, sub := range p.dropped {
		if err := set(droppedKey(p.prefix, sub), seq); err != nil {
			return r, err
		}
	}
	if err := set(metaKey(p.prefix), meta); err != nil {
		return r, err
	}
	if err := set(checkpointKey(p.prefix), encodeCheckpoint(cp)); err != nil {
		return r, err
	}
	if err := set(sequenceKey(p.prefix), seq); err != nil {
		return r, err
	}
	if hook := p.db.tuning.beforeTxnCommit; hook != nil {
		if err := hook(p.tp); err != nil {
			return r, err
		}
	}
	if err := txn.Commit(); err != nil {
		return r, err
	}
	return r, nil
}

// committedPage returns page id of the committed state, which is not
// dirty: the cached copy, or read from Badger (not cached: a write-back
// must not evict the pages records need).
func (p *PartitionState) committedPage(id filter.PageID) ([]byte, error) {
	if c := p.last; c != nil && p.lastID == id {
		return c.data, nil
	}
	if ch, i := p.table.slot(id, false); ch != nil {
		if c := ch.clean[i].Load(); c != nil {
			return c.data, nil
		}
	}
	c, err := p.load1(id)
	if err != nil {
		return nil, err
	}
	return c.data, nil
}

// chooseWriteBack marks the pending pages the next write batch writes
// whole, oldest first: those pending since a write batch older than
// Options.WriteBackInterval, and older ones still while p's patches pass
// its share of Options.WriteBackBytes, at most writeBackPages (or
// forceWriteBack, whatever their age). It returns them and where in
// p.queue it stopped.
func (p *PartitionState) chooseWriteBack(now time.Time) (chosen []filter.PageID, qi, qj int) {
	if len(p.pending) == 0 {
		return nil, 0, 0
	}
	limit := p.forceWriteBack
	if limit == 0 {
		limit = p.db.writeBackPages
	}
	cutoff := now.Add(-p.db.opts.WriteBackInterval).UnixNano()
	over := p.patchBytes - p.db.patchShare()
	for qi = 0; qi < len(p.queue); qi++ {
		b := &p.queue[qi]
		if p.forceWriteBack == 0 && b.at > cutoff && over <= 0 {
			return chosen, qi, 0
		}
		for qj = 0; qj < len(b.ids); qj++ {
			if len(chosen) == limit {
				return chosen, qi, qj
			}
			id := b.ids[qj]
			pp := p.pending[id]
			if pp == nil || pp.since != b.seq || pp.writeBack || slices.Contains(p.dropped, id.SubFilter) {
				continue
			}
			pp.writeBack = true
			chosen = append(chosen, id)
			over -= int64(len(pp.patch))
		}
	}
	return chosen, len(p.queue), 0
}

// settle applies committed write batch r to what p knows of its pending
// pages and log.
func (p *PartitionState) settle(r commitResult) {
	p.seq = r.seq
	var newly []filter.PageID
	var grown int64
	for _, rec := range r.logged {
		d := rec.d
		pp := d.pend
		if pp == nil {
			pp = &pendingPage{since: r.seq}
			p.pending[rec.id] = pp
			d.ch.pend[d.slot] = pp
			newly = append(newly, rec.id)
		}
		pp.patch = append(pp.patch, r.logv[rec.lo:rec.hi]...)
		d.ch.patchLen[d.slot] = uint32(len(pp.patch))
		grown += int64(rec.hi - rec.lo)
	}
	for _, id := range r.whole {
		grown -= int64(p.clearPending(id))
	}
	for _, sub := range p.dropped {
		for id, pp := range p.pending {
			if id.SubFilter == sub {
				grown -= int64(len(pp.patch))
				delete(p.pending, id) // its slots went with the sub-filter (Drop)
			}
		}
		p.reclaim = append(p.reclaim, dropMarker{sub: sub, seq: r.seq})
	}
	p.dropped = p.dropped[:0]
	p.patchBytes += grown
	p.db.addPatchBytes(grown)
	if r.qi < len(p.queue) {
		p.queue[r.qi].ids = p.queue[r.qi].ids[r.qj:]
	}
	p.queue = p.queue[min(r.qi, len(p.queue)):]
	if len(newly) > 0 {
		p.queue = append(p.queue, pendingBatch{seq: r.seq, at: r.at, ids: newly})
	}
	// Pages written whole since they became pending leave their batches;
	// the oldest batch with a page still pending is where the log starts.
	for len(p.queue) > 0 {
		b := &p.queue[0]
		for len(b.ids) > 0 {
			if pp := p.pending[b.ids[0]]; pp != nil && pp.since == b.seq {
				break
			}
			b.ids = b.ids[1:]
		}
		if len(b.ids) > 0 {
			break
		}
		p.queue = p.queue[1:]
	}
	if r.hasLog {
		p.logSeqs = append(p.logSeqs, r.seq)
	}
}

// trimLog deletes the log entries older than every pending page: those
// before the oldest write batch a page is pending since. They are
// obsolete once the write batch that wrote their pages whole committed,
// so this is a separate WriteBatch, outside the write batch's
// transaction and its size limit; a failure is logged and retried after
// the next write batch, and the entries left by a crash are deleted at
// the first write batch after the next open.
func (p *PartitionState) trimLog() {
	keep := p.seq + 1
	if len(p.queue) > 0 {
		keep = p.queue[0].seq
	}
	n := 0
	for n < len(p.logSeqs) && p.logSeqs[n] < keep {
		n++
	}
	if n == 0 {
		return
	}
	if err := p.db.checkFreeSpace(); err != nil {
		return // the next Commit reports the shortage
	}
	wb := p.db.bdb.NewWriteBatch()
	defer wb.Cancel()
	var err error
	for _, seq := range p.logSeqs[:n] {
		if err = wb.Delete(logKey(p.prefix, seq)); err != nil {
			break
		}
	}
	if err == nil {
		err = wb.Flush()
	}
	if err != nil {
		p.db.logger.Error("deleting log entries written back failed; will retry after the next write batch",
			"partition", p.tp.String(), "entries", n, "err", err)
		return
	}
	p.logSeqs = p.logSeqs[n:]
}

// Discard drops the dirty pages and this partition's cached pages, in
// memory only: the next Page reads the last committed state from Badger.
// Use it when the partition is lost or its uncommitted changes are void.
func (p *PartitionState) Discard() {
	p.db.addDirtyPages(-int64(len(p.dirty)))
	for _, d := range p.dirty {
		d.ch.dirty[d.slot] = nil // old chunks live on while ring entries point into them
	}
	clear(p.dirty)
	p.dirty = p.dirty[:0]
	p.dirtyBytes = 0
	p.last, p.lastDirty = nil, nil
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
	for id, pp := range p.pending {
		p.setPending(id, pp)
	}
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
	p.forgetLog()
	p.reservation.Release()
	p.closed = true
	p.db.release(p.tp)
}

var _ filter.Pager = (*PartitionState)(nil)

func fmtPageID(id filter.PageID) string {
	return fmt.Sprintf("page %d of sub-filter %d", id.Page, id.SubFilter)
}
