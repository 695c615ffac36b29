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

// A page is stored as a base entry, the page whole as of its floor (the
// last write batch whose changes of the page it holds), and the changes
// of later write batches, which are in the partition's log until a
// write-back writes the page whole again (see the package comment).

// cachedPage is a clean page in the DB's cache, or the one a
// PartitionState last read.
type cachedPage struct {
	data []byte
	// ref is the CLOCK reference bit: set when the page is read, cleared
	// by the pageCache's hand.
	ref atomic.Bool
	// ring is the page's entry in the pageCache.
	ring int32
}

// touch sets c's reference bit, writing it only when it is clear so that
// a hot page's cache line is not written on every read.
func (c *cachedPage) touch() {
	if !c.ref.Load() {
		c.ref.Store(true)
	}
}

// pendingPage is a page whose stored base lacks changes the partition's
// log holds: those of write batch since and of later ones, whose runs
// patch holds in the order they apply (each a uvarint length and a delta
// value, encodeDelta). A page read from Badger is its base with patch
// applied, so an evicted page needs no log read. The owner's alone.
type pendingPage struct {
	since uint64
	patch []byte
	// writeBack marks a page the write batch being committed writes
	// whole.
	writeBack bool
}

// pendingBatch is the pages that became pending in write batch seq,
// committed at unix time at (nanoseconds); the write-back takes them in
// this order. A page written whole since is skipped (its pendingPage is
// gone or has a later since).
type pendingBatch struct {
	seq uint64
	at  int64
	ids []filter.PageID
}

// dropMarker is a sub-filter dropped by write batch seq.
type dropMarker struct {
	sub uint32
	seq uint64
}

// dirtyPage is a page changed since the last write batch: its bytes and
// the byte ranges changed since (nil with whole).
type dirtyPage struct {
	id    filter.PageID
	data  []byte
	spans []span
	raw   int // bytes the spans would encode to at most
	whole bool
	// pend is the page's pendingPage when it was marked (nil if none),
	// patched its patch bytes; ch and slot its page-table slot; clean the
	// cachedPage it was, reused when the write batch caches it again.
	pend    *pendingPage
	patched int
	ch      *pageChunk
	slot    int
	clean   *cachedPage
	// batchBytes is the page's share of PartitionState.DirtyBytes.
	batchBytes int64
}

// minDirtyBytes returns the least a dirty page of pageBytes counts in
// PartitionState.DirtyBytes: a quarter of a page, and never less than
// Badger's skiplist node size nor more than the page. It bounds what a
// write batch cut at FlushBytes holds in memory, the dirty pages outside
// the cache, to four times FlushBytes.
func minDirtyBytes(pageBytes int) int64 {
	return min(max(int64(pageBytes/4), int64(skl.MaxNodeSize)), int64(pageBytes))
}

// sizeInBatch returns what d adds to a write batch, as
// PartitionState.DirtyBytes counts it: PageBytes when Commit may write it
// whole; for a page whose changes go to the log, at most raw bytes and
// its record's page ID, at least minDirtyBytes, never more than PageBytes.
func (d *dirtyPage) sizeInBatch(pageBytes int) int64 {
	if d.whole || d.patched+logRecordBytes(d.raw) > maxPatchBytes(pageBytes) {
		return int64(pageBytes)
	}
	return min(max(int64(logRecordHeader+d.raw), minDirtyBytes(pageBytes)), int64(pageBytes))
}

// span is bytes [lo, hi) of a page.
type span struct{ lo, hi uint32 }

// runHeaderBytes is the most the two uvarints (gap and length, each at most
// pageBytes) of a run of a delta take, so that a delta value is never
// longer than the raw bytes counted for it.
func runHeaderBytes(pageBytes int) int { return 2 * ((bits.Len(uint(pageBytes)) + 6) / 7) }

// maxPatchBytes is how many patch bytes a page of pageBytes may hold
// before its next change is written whole instead of logged: half a page.
// It bounds the memory of a pending page's patch, and a page read on a
// cache miss applies at most half a page of runs.
func maxPatchBytes(pageBytes int) int { return pageBytes / 2 }

// logRecordHeader is a log record's page ID (uint32 sub-filter, uint32
// page); logRecordBytes the most a record of raw delta bytes takes in a
// patch (its uvarint length and the delta).
const logRecordHeader = 8

// maxKeptLogBuffer is the largest log entry buffer a PartitionState keeps
// for its next write batch: at 50,000 records a second a write batch logs
// about 200 KB; a larger one (a replay flat out) is not kept.
const maxKeptLogBuffer = 1 << 20

func logRecordBytes(raw int) int { return binary.MaxVarintLen32 + raw }

// mark records bytes [off, off+n) of d as changed. A page whose changes
// would pass maxPatchBytes is written whole at the next write batch and
// stops tracking ranges.
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
	if d.patched+logRecordBytes(d.raw) > maxPatchBytes(pb) {
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

// appendDelta appends to out the delta value of the spans of page: for
// each run of changed bytes in increasing order, uvarint(gap from the end
// of the previous run) | uvarint(length) | bytes. Spans closer than a run
// header are merged, since the bytes between cost no more than a new
// header.
func appendDelta(out []byte, spans []span, page []byte) []byte {
	slices.SortFunc(spans, func(a, b span) int { return cmp.Compare(a.lo, b.lo) })
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

// encodeDelta returns the delta value of the spans of page (appendDelta).
func encodeDelta(spans []span, page []byte) []byte { return appendDelta(nil, spans, page) }

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

// nextPatchRecord splits the first record (uvarint length | delta) off a
// patch or a log record list: the delta and the rest.
func nextPatchRecord(v []byte) (delta, rest []byte, err error) {
	n, k := binary.Uvarint(v)
	if k <= 0 || n > uint64(len(v)-k) {
		return nil, nil, fmt.Errorf("patch record of %d bytes is cut short: %w", len(v), errBadEntry)
	}
	return v[k : k+int(n)], v[k+int(n):], nil
}

// applyPatch applies every delta of patch to page, in order.
func applyPatch(page, patch []byte) error {
	for len(patch) > 0 {
		delta, rest, err := nextPatchRecord(patch)
		if err != nil {
			return err
		}
		if err := applyDelta(page, delta); err != nil {
			return fmt.Errorf("%w: %w", err, errBadEntry)
		}
		patch = rest
	}
	return nil
}

// The value of a log entry: int64 unix time of the write batch in
// nanoseconds, then for each page the batch logged: uint32 sub-filter |
// uint32 page | uvarint length | delta.
const logValueHeader = 8

// decodeLog calls record for every record of v, a log entry's value, with
// the record's patch bytes (uvarint length | delta), and returns the write
// batch's time. A value that cannot be a log entry's is errBadEntry.
func decodeLog(v []byte, record func(id filter.PageID, rec []byte) error) (int64, error) {
	if len(v) < logValueHeader {
		return 0, fmt.Errorf("log entry of %d bytes, shorter than its header: %w", len(v), errBadEntry)
	}
	at := int64(binary.BigEndian.Uint64(v))
	v = v[logValueHeader:]
	for len(v) > 0 {
		if len(v) < logRecordHeader {
			return 0, fmt.Errorf("log record of %d bytes, shorter than its page ID: %w", len(v), errBadEntry)
		}
		id := filter.PageID{SubFilter: binary.BigEndian.Uint32(v), Page: binary.BigEndian.Uint32(v[4:])}
		_, rest, err := nextPatchRecord(v[logRecordHeader:])
		if err != nil {
			return 0, err
		}
		if err := record(id, v[logRecordHeader:len(v)-len(rest)]); err != nil {
			return 0, err
		}
		v = rest
	}
	return at, nil
}

// decodeBase copies the page bytes of v, a stored base entry, into data
// (PageBytes long) and returns its floor; a value of another length is
// errBadEntry.
func decodeBase(v, data []byte) (uint64, error) {
	if len(v) < pageBaseHeader {
		return 0, fmt.Errorf("stored page entry is %d bytes, shorter than its %d-byte header: %w", len(v), pageBaseHeader, errBadEntry)
	}
	if len(v) != pageBaseHeader+len(data) {
		return 0, fmt.Errorf("stored page is %d bytes, want %d: %w", len(v)-pageBaseHeader, len(data), errBadEntry)
	}
	copy(data, v[pageBaseHeader:])
	return binary.BigEndian.Uint64(v), nil
}

// errBadEntry marks a stored page entry that cannot be right; Page reports
// it as ErrCorrupt.
var errBadEntry = errors.New("store: bad page entry")

// readBase reads the base of the page whose key is key through txn into
// data (PageBytes long, zeros without a base) and returns its floor (0
// without one) and whether it is stored.
func readBase(txn *badger.Txn, key, data []byte) (floor uint64, found bool, err error) {
	item, err := txn.Get(key)
	if errors.Is(err, badger.ErrKeyNotFound) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, err
	}
	err = item.Value(func(v []byte) (err error) {
		floor, err = decodeBase(v, data)
		return err
	})
	return floor, true, err
}

// readPage reads page id of p's committed state through txn: its base
// (zeros without one) with its pending patch pp (nil if none) applied, in
// a new PageBytes slice. found reports whether the page has a base or a
// patch. A base whose floor is not below the patch's first write batch is
// errBadEntry, like any stored entry that cannot be right.
func (p *PartitionState) readPage(txn *badger.Txn, id filter.PageID, pp *pendingPage) (data []byte, found bool, err error) {
	data = make([]byte, p.db.opts.PageBytes)
	floor, found, err := readBase(txn, pageKey(p.prefix, id), data)
	if err != nil {
		return nil, found, err
	}
	if pp != nil {
		if floor >= pp.since {
			return nil, true, fmt.Errorf("stored base holds write batch %d, its logged changes start at %d: %w", floor, pp.since, errBadEntry)
		}
		if err := applyPatch(data, pp.patch); err != nil {
			return nil, true, err
		}
		found = true
	}
	return data, found, nil
}

// replayLog reads p's log through txn and rebuilds what is pending: the
// pages each write batch since their base's floor changed, with their
// patches, in the order they became pending. Records of the sub-filters
// in dropped are skipped. A log entry after the last write batch, or one
// that cannot be right, is ErrCorrupt (wrapped).
func (p *PartitionState) replayLog(txn *badger.Txn, dropped []dropMarker) error {
	prefix := logPrefix(p.prefix)
	floors := make(map[filter.PageID]uint64)
	scratch := make([]byte, p.db.opts.PageBytes)
	it := txn.NewIterator(badger.IteratorOptions{Prefix: prefix})
	defer it.Close()
	for it.Rewind(); it.Valid(); it.Next() {
		item := it.Item()
		k := item.Key()
		if len(k) != len(prefix)+seqBytes {
			return fmt.Errorf("log key %x is %d bytes, want %d: %w", k, len(k), len(prefix)+seqBytes, ErrCorrupt)
		}
		seq := binary.BigEndian.Uint64(k[len(prefix):])
		if seq > p.seq {
			return fmt.Errorf("log entry %d after the last write batch %d: %w", seq, p.seq, ErrCorrupt)
		}
		b := pendingBatch{seq: seq}
		err := item.Value(func(v []byte) (err error) {
			b.at, err = decodeLog(v, func(id filter.PageID, rec []byte) error {
				if slices.ContainsFunc(dropped, func(m dropMarker) bool { return m.sub == id.SubFilter }) {
					return nil
				}
				floor, ok := floors[id]
				if !ok {
					if floor, _, err = readBase(txn, pageKey(p.prefix, id), scratch); err != nil {
						return fmt.Errorf("%s: %w", fmtPageID(id), err)
					}
					floors[id] = floor
				}
				if seq <= floor {
					return nil // written whole since
				}
				pp := p.pending[id]
				if pp == nil {
					pp = &pendingPage{since: seq}
					p.setPending(id, pp)
					b.ids = append(b.ids, id)
				}
				pp.patch = append(pp.patch, rec...)
				p.patchBytes += int64(len(rec))
				return nil
			})
			return err
		})
		if err != nil {
			if errors.Is(err, errBadEntry) {
				err = fmt.Errorf("log entry %d: %w: %w", seq, err, ErrCorrupt)
			}
			return err
		}
		p.logSeqs = append(p.logSeqs, seq)
		if len(b.ids) > 0 {
			p.queue = append(p.queue, b)
		}
	}
	for id, pp := range p.pending {
		p.setPending(id, pp) // the patch's final length
	}
	p.db.addPatchBytes(p.patchBytes)
	return nil
}

// PendingPages returns how many pages of p have changes in the log that
// their stored base lacks: 0 once a write-back (ConsolidateStep) has
// written every one whole.
func (p *PartitionState) PendingPages() int { return len(p.pending) }

// LogEntries returns how many log entries of p are stored: 0 once a
// write-back has written every pending page whole and the log is trimmed.
func (p *PartitionState) LogEntries() int { return len(p.logSeqs) }

// Consolidate writes back every pending page of p, in write batches of
// up to Options.FlushBytes (ConsolidateStep until it reports nothing
// more): the state at rest is then its pages and an empty log. It returns
// ConsolidateStep's errors.
func (p *PartitionState) Consolidate() error {
	for {
		more, err := p.ConsolidateStep(p.db.opts.FlushBytes)
		if err != nil || !more {
			return err
		}
	}
}

// ConsolidateStep writes back the oldest pending pages of p, about
// maxBytes of them (at least one page), whatever their age, in one write
// batch with the current metadata and checkpoint: the pages read the same
// before and after, so every intermediate state is the committed one. The
// log entries every page has since been written past are deleted once
// the batch is durable. more reports that pending pages remain.
//
// Call it on an idle partition, never between the changes of a write
// batch: it returns ErrDirty when p has uncommitted changes (nothing is
// done), ErrClosed after Close, and Commit's errors; nothing, and no
// more, without a committed write batch or a pending page.
func (p *PartitionState) ConsolidateStep(maxBytes int64) (more bool, err error) {
	if p.closed || p.db.closed.Load() {
		return false, fmt.Errorf("store: consolidating %s: %w", p.tp, ErrClosed)
	}
	if len(p.dirty) > 0 || len(p.dropped) > 0 {
		return false, fmt.Errorf("store: consolidating %s: %w", p.tp, ErrDirty)
	}
	if !p.hasCP || len(p.pending) == 0 {
		return false, nil
	}
	n := len(p.pending)
	p.forceWriteBack = min(p.db.writeBackPages, max(1, int(maxBytes/int64(p.db.opts.PageBytes))))
	err = p.Commit(p.meta, p.cp)
	p.forceWriteBack = 0
	if err != nil {
		return false, err
	}
	p.db.metrics.consolidatedPages.Add(float64(n - len(p.pending)))
	return len(p.pending) > 0, nil
}

// forgetLog forgets what p knows of its stored log, pending pages and
// dropped sub-filters: its state is being replaced or closed. p has no
// dirty page (Discard first).
func (p *PartitionState) forgetLog() {
	p.db.addPatchBytes(-p.patchBytes)
	p.reclaim, p.markers, p.queue, p.logSeqs = nil, nil, nil, nil
	p.pending = make(map[filter.PageID]*pendingPage)
	p.patchBytes, p.seq = 0, 0
	p.dropCached()
}

// pendingOf returns page id's pendingPage, or nil.
func (p *PartitionState) pendingOf(id filter.PageID) *pendingPage {
	if ch, i := p.table.slot(id, false); ch != nil {
		return ch.pend[i]
	}
	return nil
}

// setPending records pp as page id's pendingPage, in the map and the
// page table.
func (p *PartitionState) setPending(id filter.PageID, pp *pendingPage) {
	p.pending[id] = pp
	ch, i := p.table.slot(id, true)
	ch.pend[i], ch.patchLen[i] = pp, uint32(len(pp.patch))
}

// clearPending forgets page id's pendingPage, if it has one, and returns
// its patch bytes.
func (p *PartitionState) clearPending(id filter.PageID) int {
	ch, i := p.table.slot(id, false)
	if ch == nil || ch.pend[i] == nil {
		return 0
	}
	n := len(ch.pend[i].patch)
	ch.pend[i], ch.patchLen[i] = nil, 0
	delete(p.pending, id)
	return n
}
