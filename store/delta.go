package store

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"slices"
	"sync/atomic"

	"github.com/dgraph-io/badger/v4"
	"github.com/dgraph-io/badger/v4/skl"

	"github.com/kdedup/kdedup/filter"
)

// A page is stored as a base entry and a run of delta entries under one key
// prefix (see the package comment). pageLog is what a PartitionState knows of a
// page's stored entries; it travels with the page in memory so that a
// write batch can choose between a delta and a whole page without reading
// Badger.
type pageLog struct {
	// baseSeq is the last delta folded into the stored base (0 without a
	// base); deltas at or below it are obsolete.
	baseSeq uint32
	// lastSeq is the newest delta written, or baseSeq if none since.
	lastSeq uint32
	// oldest is the lowest sequence number of a delta entry still stored,
	// live or obsolete, and 0 when none is known to be.
	oldest uint32
	// deltaBytes is the key and value bytes of the live deltas.
	deltaBytes int
}

// cachedPage is a clean page in the DB's cache, or the one a PartitionState last
// read.
type cachedPage struct {
	data []byte
	log  pageLog
	// ref is the CLOCK reference bit: set when the page is read, cleared
	// by the pageCache's hand.
	ref atomic.Bool
	// ring is the page's entry in the pageCache.
	ring int32
	// spared is set by the pageCache's hand when it passes over a listed
	// page (costlyToRead) whose reference bit is clear, and cleared with
	// the bit: such a page is evicted at the hand's second pass without a
	// read, not its first. Under the pageCache's lock only.
	spared bool
}

// costlyToRead reports whether a page whose stored entries are lg is read
// by listing them through an iterator (more live deltas than
// maxPointDeltas), at about three times the CPU of a point lookup
// (BENCHMARKS.md, "Page reads by point lookups"): the pageCache's hand
// passes once more over such a page before evicting it (pageCache.take).
func costlyToRead(lg pageLog) bool { return lg.lastSeq-lg.baseSeq > maxPointDeltas }

// touch sets c's reference bit, writing it only when it is clear so that
// a hot page's cache line is not written on every read.
func (c *cachedPage) touch() {
	if !c.ref.Load() {
		c.ref.Store(true)
	}
}

// dirtyPage is a page changed since the last write batch: its bytes, its
// stored entries and the byte ranges changed since (nil with whole).
type dirtyPage struct {
	data  []byte
	log   pageLog
	spans []span
	raw   int // bytes the spans would encode to at most
	whole bool
	// batchBytes is the page's share of PartitionState.DirtyBytes.
	batchBytes int64
}

// minDirtyBytes returns the least a dirty page of pageBytes counts in
// PartitionState.DirtyBytes: a quarter of a page, and never less than Badger's
// skiplist node size (on which Badger bases its limit on a transaction's
// entries, MaxBatchSize over it) nor more than the page. A quarter of a
// page keeps what a write batch cut at FlushBytes holds in memory, the
// dirty pages outside the cache, at most four times FlushBytes, and its
// entries at most four per page of FlushBytes; a delta's own entry is far
// smaller. It was half a page: then a replay into a partition of more than
// 2,048 pages (4 KiB pages, 8 MiB FlushBytes: about 5 million keys) cut a
// write batch every 2,048 pages dirtied, about one delta entry per record
// (a Badger skiplist insert each), where a quarter lets the flush interval
// cut it with several records per delta up to twice that state.
func minDirtyBytes(pageBytes int) int64 {
	return min(max(int64(pageBytes/4), int64(skl.MaxNodeSize)), int64(pageBytes))
}

// sizeInBatch returns what d adds to a write batch, as PartitionState.DirtyBytes
// counts it, with delta keys of keyBytes: PageBytes when Commit may write
// it whole (the key, header and Badger's bytes of a whole page are in the
// allowance batchLimits adds per page); for a delta, its key, at most raw
// value bytes and Badger's per-entry bytes, at least minDirtyBytes, never
// more than PageBytes.
func (d *dirtyPage) sizeInBatch(pageBytes, keyBytes int) int64 {
	if d.whole || d.log.deltaBytes+keyBytes+d.raw > maxDeltaBytes(pageBytes) {
		return int64(pageBytes)
	}
	return min(max(int64(keyBytes+d.raw+entryOverheadBytes), minDirtyBytes(pageBytes)), int64(pageBytes))
}

// span is bytes [lo, hi) of a page.
type span struct{ lo, hi uint32 }

// runHeaderBytes is the most the two uvarints (gap and length, each at most
// pageBytes) of a run of a delta take, so that a delta value is never
// longer than the raw bytes counted for it.
func runHeaderBytes(pageBytes int) int { return 2 * ((bits.Len(uint(pageBytes)) + 6) / 7) }

// maxDeltaBytes is how many key and value bytes of live deltas a page of
// pageBytes may have before the next write batch rewrites it whole: half a
// page. A page is thus rewritten after at least half a page of deltas, so a
// change costs at most three times its delta bytes, amortized, and a read
// on a cache miss reads at most 1.5 pages (see the package comment).
func maxDeltaBytes(pageBytes int) int { return pageBytes / 2 }

// mark records bytes [off, off+n) of d as changed. A page whose delta
// would be rewritten whole at the next write batch (its change, or its
// change and its live deltas, pass maxDeltaBytes) stops tracking ranges.
func (p *PartitionState) mark(d *dirtyPage, off, n int) {
	if d.whole {
		return
	}
	pb := p.db.opts.PageBytes
	if off < 0 || n <= 0 || off+n > pb {
		p.setWhole(d)
		return
	}
	lo, hi := uint32(off), uint32(off+n)
	if k := len(d.spans) - 1; k >= 0 && lo <= d.spans[k].hi && hi >= d.spans[k].lo {
		// Overlapping or touching the last range (a slot written again, or
		// its neighbour): widen it.
		last := &d.spans[k]
		grown := int(max(hi, last.hi)-min(lo, last.lo)) - int(last.hi-last.lo)
		last.lo, last.hi = min(lo, last.lo), max(hi, last.hi)
		d.raw += grown
	} else {
		if d.spans == nil && len(p.spareSpans) > 0 {
			d.spans, p.spareSpans = p.spareSpans[len(p.spareSpans)-1], p.spareSpans[:len(p.spareSpans)-1]
		}
		d.spans = append(d.spans, span{lo: lo, hi: hi})
		d.raw += n + runHeaderBytes(pb)
	}
	if d.log.deltaBytes+p.deltaKeyBytes()+d.raw > maxDeltaBytes(pb) {
		p.setWhole(d) // the next write batch writes it whole
	}
}

// setWhole makes d a page written whole, its ranges kept for reuse.
func (p *PartitionState) setWhole(d *dirtyPage) {
	p.recycle(d)
	d.whole = true
}

// recycle keeps d's range buffer for another dirty page.
func (p *PartitionState) recycle(d *dirtyPage) {
	if d.spans != nil && len(p.spareSpans) < maxSpareSpans {
		p.spareSpans = append(p.spareSpans, d.spans[:0])
	}
	d.spans, d.raw = nil, 0
}

// maxSpareSpans bounds the range buffers a PartitionState keeps for reuse.
const maxSpareSpans = 4096

// deltaKeyBytes is the length of p's delta keys.
func (p *PartitionState) deltaKeyBytes() int { return len(p.prefix) + pageKeySuffix + deltaSeqBytes }

// encodeDelta returns the delta value of the spans of page: for each run of
// changed bytes in increasing order, uvarint(gap from the end of the
// previous run) | uvarint(length) | bytes. Spans closer than a run header
// are merged, since the bytes between cost no more than a new header.
func encodeDelta(spans []span, page []byte) []byte {
	slices.SortFunc(spans, func(a, b span) int { return cmp.Compare(a.lo, b.lo) })
	out := make([]byte, 0, 64)
	end := 0
	for i := 0; i < len(spans); {
		lo, hi := int(spans[i].lo), int(spans[i].hi)
		for i++; i < len(spans) && int(spans[i].lo) <= hi+2; i++ {
			hi = max(hi, int(spans[i].hi))
		}
		out = binary.AppendUvarint(out, uint64(lo-end))
		out = binary.AppendUvarint(out, uint64(hi-lo))
		out = append(out, page[lo:hi]...)
		end = hi
	}
	return out
}

// applyDelta applies the delta value v to page.
func applyDelta(page, v []byte) error {
	end := 0
	for len(v) > 0 {
		gap, n1 := binary.Uvarint(v)
		if n1 <= 0 {
			return fmt.Errorf("delta run offset is not a uvarint")
		}
		length, n2 := binary.Uvarint(v[n1:])
		if n2 <= 0 {
			return fmt.Errorf("delta run length is not a uvarint")
		}
		v = v[n1+n2:]
		if gap > uint64(len(page)) || length > uint64(len(v)) || uint64(end)+gap+length > uint64(len(page)) {
			return fmt.Errorf("delta run of %d bytes at %d+%d outside a %d-byte page or its %d-byte value",
				length, end, gap, len(page), len(v))
		}
		lo := end + int(gap)
		end = lo + copy(page[lo:lo+int(length)], v[:length])
		v = v[length:]
	}
	return nil
}

// readPage reads page id from txn: its base (zeros without one) with its
// live deltas applied in sequence order, and its log. found reports whether
// any entry of the page is stored. Errors wrap ErrCorrupt for entries that
// cannot be right.
func (p *PartitionState) readPage(txn *badger.Txn, id filter.PageID) (data []byte, log pageLog, found bool, err error) {
	prefix := pageKey(p.prefix, id)
	it := txn.NewIterator(badger.IteratorOptions{Prefix: prefix})
	defer it.Close()
	return p.readPageAt(it, prefix)
}

// readPageAt is readPage through it, an iterator of the partition's keys
// that may be reused for other pages: it seeks prefix, page id's key, and
// reads the page's entries.
func (p *PartitionState) readPageAt(it *badger.Iterator, prefix []byte) (data []byte, log pageLog, found bool, err error) {
	data = make([]byte, p.db.opts.PageBytes)
	it.Seek(prefix)
	log, found, err = p.foldPage(it, prefix, data)
	if err != nil {
		return nil, pageLog{}, found, err
	}
	return data, log, found, nil
}

// maxPointDeltas is the most live deltas a page may have for readKnown to
// read it: a point lookup per entry costs less than listing them through
// an iterator while they are few. A Badger iterator seeks in a table of
// every level and reads past the page's last entry; a point lookup skips
// the tables whose bloom filter rules the key out and stops at the entry
// (BENCHMARKS.md, "Page reads by point lookups").
const maxPointDeltas = 2

// readKnown reads the page whose key is prefix and whose stored entries lg
// describes (PartitionState.storedLog: its base, written with lg.baseSeq,
// and its live deltas lg.baseSeq+1 to lg.lastSeq), with a point lookup of
// each entry and of the delta that would follow them, into a new
// PageBytes slice. found reports whether any entry of the page is stored.
// ok is false when the entries found are not those of lg (a base of
// another sequence number, a delta missing, a delta after lg.lastSeq);
// then data is nil and the caller reads the page by listing its entries
// (foldPage).
// Errors are foldPage's.
func (p *PartitionState) readKnown(txn *badger.Txn, prefix []byte, lg pageLog) (data []byte, found, ok bool, err error) {
	pb := p.db.opts.PageBytes
	data = make([]byte, pb)
	item, err := txn.Get(prefix)
	switch {
	case errors.Is(err, badger.ErrKeyNotFound):
		if lg.baseSeq != 0 {
			return nil, false, false, nil
		}
	case err != nil:
		return nil, false, false, err
	default:
		found = true
		var seq uint32
		err = item.Value(func(v []byte) (err error) {
			seq, err = decodeBase(v, data)
			return err
		})
		if err != nil {
			return nil, true, false, err
		}
		if seq != lg.baseSeq {
			return nil, true, false, nil
		}
	}
	key := make([]byte, len(prefix)+deltaSeqBytes)
	copy(key, prefix)
	for seq := lg.baseSeq + 1; seq <= lg.lastSeq+1; seq++ {
		binary.BigEndian.PutUint32(key[len(prefix):], seq)
		item, err := txn.Get(key)
		if seq > lg.lastSeq {
			// No delta after the last known: a write lg missed would
			// otherwise go unseen (bloom filters answer most of this one).
			if errors.Is(err, badger.ErrKeyNotFound) {
				break
			}
			if err != nil {
				return nil, found, false, err
			}
			return nil, true, false, nil
		}
		if errors.Is(err, badger.ErrKeyNotFound) {
			return nil, found, false, nil
		}
		if err != nil {
			return nil, found, false, err
		}
		found = true
		err = item.Value(func(v []byte) error {
			if err := applyDelta(data, v); err != nil {
				return fmt.Errorf("delta %d: %w: %w", seq, err, errBadEntry)
			}
			return nil
		})
		if err != nil {
			return nil, true, false, err
		}
	}
	return data, found, true, nil
}

// foldPage reads the entries of the page whose key is prefix into data
// (zeros, PageBytes long), it being at the page's first entry or past
// it: the base, then the deltas after it applied in order. It leaves it
// at the first key after the page's entries, so that a caller reading
// pages in key order need not seek (a seek drops what the iterator
// prefetched).
func (p *PartitionState) foldPage(it *badger.Iterator, prefix, data []byte) (log pageLog, found bool, err error) {
	for ; it.ValidForPrefix(prefix); it.Next() {
		item := it.Item()
		k := item.Key()
		found = true
		switch len(k) {
		case len(prefix):
			err = item.Value(func(v []byte) (err error) {
				log.baseSeq, err = decodeBase(v, data)
				log.lastSeq = log.baseSeq
				return err
			})
		case len(prefix) + deltaSeqBytes:
			seq := binary.BigEndian.Uint32(k[len(prefix):])
			if log.oldest == 0 {
				log.oldest = seq
			}
			if seq <= log.baseSeq {
				continue // folded into the base, awaiting deletion
			}
			if seq != log.lastSeq+1 {
				return pageLog{}, true, fmt.Errorf("delta %d follows delta %d: %w", seq, log.lastSeq, errBadEntry)
			}
			err = item.Value(func(v []byte) error {
				log.deltaBytes += len(k) + len(v)
				if err := applyDelta(data, v); err != nil {
					return fmt.Errorf("delta %d: %w: %w", seq, err, errBadEntry)
				}
				return nil
			})
			log.lastSeq = seq
		default:
			err = fmt.Errorf("page entry key %x is %d bytes: %w", k, len(k), errBadEntry)
		}
		if err != nil {
			return pageLog{}, true, err
		}
	}
	return log, found, nil
}

// decodeBase copies the page bytes of v, a stored base entry, into data
// (PageBytes long) and returns the sequence number of the last delta
// folded into it; a value of another length is errBadEntry.
func decodeBase(v, data []byte) (uint32, error) {
	if len(v) < pageBaseHeader {
		return 0, fmt.Errorf("stored page entry is %d bytes, shorter than its %d-byte header: %w", len(v), pageBaseHeader, errBadEntry)
	}
	if len(v) != pageBaseHeader+len(data) {
		return 0, fmt.Errorf("stored page is %d bytes, want %d: %w", len(v)-pageBaseHeader, len(data), errBadEntry)
	}
	copy(data, v[pageBaseHeader:])
	return binary.BigEndian.Uint32(v), nil
}

// errBadEntry marks a stored page entry that cannot be right; Page reports
// it as ErrCorrupt.
var errBadEntry = errors.New("store: bad page entry")

// obsoleteDeltas are the delta entries of a page folded into its base by a
// committed write batch and not yet deleted.
type obsoleteDeltas struct {
	id       filter.PageID
	from, to uint32
}

// deleteObsolete deletes the obsolete delta entries listed, after the write
// batch that made them obsolete committed. Reads skip them, so this is a
// separate WriteBatch, outside the write batch's transaction and its size
// limit; a failure is logged and retried after the next write batch, and
// entries left by a crash are deleted when their page is next rewritten
// whole.
func (p *PartitionState) deleteObsolete() {
	p.lastObsoleteBytes = 0
	if len(p.obsolete) == 0 {
		return
	}
	if err := p.db.checkFreeSpace(); err != nil {
		return // the next Commit reports the shortage
	}
	wb := p.db.bdb.NewWriteBatch()
	defer wb.Cancel()
	var err error
	var written int64
	for _, o := range p.obsolete {
		for seq := o.from; seq <= o.to && err == nil; seq++ {
			k := deltaKey(p.prefix, o.id, seq)
			written += int64(len(k))
			err = wb.Delete(k)
		}
	}
	if err == nil {
		err = wb.Flush()
	}
	if err != nil {
		p.db.logger.Error("deleting obsolete page deltas failed; will retry after the next write batch",
			"partition", p.tp.String(), "pages", len(p.obsolete), "err", err)
		return
	}
	p.db.metrics.commitBytes.Add(float64(written))
	p.lastObsoleteBytes = written
	p.obsolete = p.obsolete[:0]
}

// Consolidate rewrites whole every stored page of p that has live deltas,
// in write batches of up to Options.FlushBytes (ConsolidateStep until it
// reports nothing more). With Badger's compaction it brings the state at
// rest to its page bytes: live deltas add up to half a page per page until
// then. It returns ConsolidateStep's errors.
func (p *PartitionState) Consolidate() error {
	for {
		more, err := p.ConsolidateStep(p.db.opts.FlushBytes)
		if err != nil || !more {
			return err
		}
	}
}

// ConsolidateStep rewrites whole the stored pages of p that have live
// deltas, until about maxBytes of them (at least one page) are in one write
// batch, and commits it with the current metadata and checkpoint: the pages
// read the same before and after, so every intermediate state is the
// committed one. The deltas folded in are deleted once the batch is
// durable. more reports that pages with live deltas remain. A step that
// finds none is cheap afterwards: p remembers that no write batch has
// written a delta since, and returns at once until one has.
//
// It costs a listing of p's page keys (not their values), a read of each
// page it consolidates (most are in the page cache) and a whole write of
// it: call it on an idle partition, never between the changes of a write
// batch. It returns ErrDirty when p has uncommitted changes (nothing is
// done), ErrClosed after Close, and Commit's and Page's errors; nothing,
// and no more, without a committed write batch.
func (p *PartitionState) ConsolidateStep(maxBytes int64) (more bool, err error) {
	if p.closed || p.db.closed.Load() {
		return false, fmt.Errorf("store: consolidating %s: %w", p.tp, ErrClosed)
	}
	if len(p.dirty) > 0 || len(p.dropped) > 0 {
		return false, fmt.Errorf("store: consolidating %s: %w", p.tp, ErrDirty)
	}
	if !p.hasCP || p.consolidated {
		return false, nil
	}
	ids, err := p.deltaPages()
	if err != nil {
		return false, err
	}
	maxBytes = max(maxBytes, 1)
	for i, id := range ids {
		page, err := p.Page(id)
		if err != nil {
			return false, err
		}
		if c := p.last; c != nil && p.lastID == id && c.log.lastSeq == c.log.baseSeq && c.log.oldest == 0 {
			continue // folded into its base by a write batch since the listing
		}
		p.MarkDirty(id, page)
		if p.DirtyBytes() >= maxBytes {
			more = i+1 < len(ids)
			break
		}
	}
	if len(p.dirty) > 0 {
		n := len(p.dirty)
		if err := p.Commit(p.meta, p.cp); err != nil {
			return false, err
		}
		p.db.metrics.consolidatedPages.Add(float64(n))
	}
	if !more {
		p.consolidated = true
	}
	return more, nil
}

// DeltaPages returns how many pages of p have delta entries stored (live,
// or folded into a newer base and not yet deleted): 0 once ConsolidateStep
// has folded every delta in. It lists keys, not values, and returns
// ErrClosed after Close.
func (p *PartitionState) DeltaPages() (int, error) {
	if p.closed || p.db.closed.Load() {
		return 0, fmt.Errorf("store: listing the deltas of %s: %w", p.tp, ErrClosed)
	}
	ids, err := p.deltaPages()
	return len(ids), err
}

// deltaPages lists, in key order, the pages of p with a stored delta entry,
// live or folded into a newer base and not yet deleted; keys only.
func (p *PartitionState) deltaPages() ([]filter.PageID, error) {
	var ids []filter.PageID
	start := append(append([]byte{}, p.prefix...), tagPage)
	err := p.db.bdb.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: start})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			k := it.Item().Key()[len(start):]
			if len(k) != 8+deltaSeqBytes {
				continue
			}
			id := filter.PageID{SubFilter: binary.BigEndian.Uint32(k), Page: binary.BigEndian.Uint32(k[4:])}
			if len(ids) == 0 || ids[len(ids)-1] != id {
				ids = append(ids, id)
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("store: consolidating %s: listing deltas: %w", p.tp, err)
	}
	return ids, nil
}
