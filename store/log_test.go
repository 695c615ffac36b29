package store

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/dgraph-io/badger/v4"
	dto "github.com/prometheus/client_model/go"

	"github.com/kdedup/kdedup/filter"
)

// storedState lists what p's partition holds in Badger: each page base's
// floor, and the sequence numbers of the log entries in order.
func storedState(t testing.TB, p *PartitionState) (floors map[filter.PageID]uint64, logs []uint64) {
	t.Helper()
	floors = map[filter.PageID]uint64{}
	err := p.db.bdb.View(func(txn *badger.Txn) error {
		start := append(append([]byte{}, p.prefix...), tagPage)
		it := txn.NewIterator(badger.IteratorOptions{Prefix: start})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			k := it.Item().Key()[len(start):]
			if len(k) != 8 {
				return fmt.Errorf("page key suffix %x", k)
			}
			id := filter.PageID{SubFilter: binary.BigEndian.Uint32(k), Page: binary.BigEndian.Uint32(k[4:])}
			err := it.Item().Value(func(v []byte) error {
				floors[id] = binary.BigEndian.Uint64(v)
				return nil
			})
			if err != nil {
				return err
			}
		}
		lp := logPrefix(p.prefix)
		lit := txn.NewIterator(badger.IteratorOptions{Prefix: lp})
		defer lit.Close()
		for lit.Rewind(); lit.Valid(); lit.Next() {
			logs = append(logs, binary.BigEndian.Uint64(lit.Item().Key()[len(lp):]))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return floors, logs
}

// storedPages returns every page Export reads of tp: the committed state as
// Badger alone holds it, its bases with their logged changes applied.
func storedPages(t testing.TB, db *DB, tp TopicPartition) map[filter.PageID][]byte {
	t.Helper()
	got := map[filter.PageID][]byte{}
	var last filter.PageID
	_, err := db.Export(tp, func(Image) error { return nil }, func(id filter.PageID, data []byte) error {
		if len(got) > 0 && comparePageIDs(last, id) >= 0 {
			return fmt.Errorf("%s exported after %s", fmtPageID(id), fmtPageID(last))
		}
		last = id
		got[id] = bytes.Clone(data)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// pendingSnapshot is what p knows of its pending pages: since and patch
// of each.
func pendingSnapshot(p *PartitionState) map[filter.PageID]string {
	m := make(map[filter.PageID]string, len(p.pending))
	for id, pp := range p.pending {
		m[id] = fmt.Sprintf("%d:%x", pp.since, pp.patch)
	}
	return m
}

// TestLogRandomized cross-checks a PartitionState written through
// MarkChanged and MarkDirty against an exact model (a map of page to
// bytes) over random byte-range writes, write batches on a clock that
// passes the write-back interval, discards, drops of sub-filters and
// reopenings with a cache of a few pages, so that pages are read back
// from their base and their patch. After every write batch it checks:
//   - what Badger alone holds (Export: bases with the logged changes
//     after their floor applied) is the committed model, page for page;
//   - every stored log entry is at or after the write batch the oldest
//     pending page is pending since (the log is trimmed to what is
//     pending, and no further), and no page's floor is past the last
//     write batch or at or after its pending patch's first write batch;
//   - no page pending since a write batch older than the interval is
//     left, unless the write batch wrote back as many pages as it may;
//   - the patch bytes held are the sum of the pending pages', each at
//     most half a page;
//   - the write batch's transaction held one log entry, whole pages and
//     the metadata, checkpoint and sequence number, no other entry.
//
// Reopening rebuilds the pending pages (since and patch) exactly as they
// were, and Consolidate leaves no pending page and no log entry.
func TestLogRandomized(t *testing.T) {
	for _, pb := range []int{256, 4096} {
		t.Run(fmt.Sprint(pb), func(t *testing.T) {
			seed := uint64(time.Now().UnixNano())
			t.Logf("seed %d", seed)
			testLogRandomized(t, pb, rand.New(rand.NewPCG(seed, uint64(pb))))
		})
	}
}

func testLogRandomized(t *testing.T, pb int, rng *rand.Rand) {
	clock := time.Unix(1_700_000_000, 0)
	const interval = 10 * time.Second
	db := openTuned(t, Options{Dir: t.TempDir(), PageBytes: pb, CacheBytes: int64(3 * pb), FlushBytes: smallFlush, WriteBackInterval: interval},
		tuning{now: func() time.Time { return clock }})
	tp := TopicPartition{Topic: "orders", Partition: 7}
	p := partitionT(t, db, tp.Topic, tp.Partition)
	defer func() { p.Close() }()

	const pagesPerSub = 24
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
	var pendingSeen, writtenBack, logged, reopened int
	for step := range 3000 {
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
			if rng.IntN(30) == 0 {
				for i := range pg {
					pg[i] = byte(rng.Uint32())
				}
				p.MarkDirty(id, pg)
			} else {
				for range 1 + rng.IntN(3) {
					off := rng.IntN(pb)
					n := 1 + rng.IntN(min(pb-off, 6))
					for i := off; i < off+n; i++ {
						pg[i] = byte(rng.Uint32())
					}
					p.MarkChanged(id, pg, off, n)
				}
			}
			copy(m, pg)
			current[id] = m
		case r < 88: // write batch, the clock a few seconds on
			clock = clock.Add(time.Duration(rng.IntN(4000)) * time.Millisecond)
			dirtyBytes, dirtyPages := p.DirtyBytes(), int64(p.DirtyPages())
			if least := minDirtyBytes(pb); dirtyPages*least > dirtyBytes {
				t.Fatalf("step %d: %d dirty pages count %d bytes, less than %d each", step, dirtyPages, dirtyBytes, least)
			}
			floorsBefore, logsBefore := storedState(t, p)
			seqBefore := p.seq
			wbBefore := counterValue(t, db.metrics.writtenBack)
			if err := p.Commit([]byte("meta"), Checkpoint{Offset: int64(step)}); err != nil {
				t.Fatalf("step %d: Commit: %v", step, err)
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
			wb := counterValue(t, db.metrics.writtenBack) - wbBefore
			writtenBack += int(wb)
			if rng.IntN(10) == 0 {
				if err := p.Consolidate(); err != nil {
					t.Fatalf("step %d: Consolidate: %v", step, err)
				}
				if _, logs := storedState(t, p); len(p.pending) != 0 || len(logs) != 0 || p.LogEntries() != 0 {
					t.Fatalf("step %d: after Consolidate %d pages pending, %d log entries stored", step, len(p.pending), len(logs))
				}
			}
			floors, logs := storedState(t, p)
			// The transaction: the log entry it added, if any, is the last
			// write batch's, and the pages whose floor moved are at it.
			if n := len(logs); n > 0 && logs[n-1] > p.seq {
				t.Fatalf("step %d: log entry %d after the last write batch %d", step, logs[n-1], p.seq)
			}
			for id, f := range floors {
				if f > p.seq {
					t.Fatalf("step %d: %s has floor %d after the last write batch %d", step, fmtPageID(id), f, p.seq)
				}
				if b, ok := floorsBefore[id]; (!ok || f != b) && f <= seqBefore {
					t.Fatalf("step %d: %s floor moved from %d to %d, not to a write batch of this step (after %d)", step, fmtPageID(id), b, f, seqBefore)
				}
				if _, ok := committed[id]; !ok {
					t.Fatalf("step %d: %s is stored but not in the model (dropped?)", step, fmtPageID(id))
				}
			}
			if len(logs) > len(logsBefore)+2 { // this step's Commit and Consolidate's
				t.Fatalf("step %d: %d log entries after %d: more than one a write batch", step, len(logs), len(logsBefore))
			}
			got := storedPages(t, db, tp)
			for id, pg := range committed {
				if g, ok := got[id]; !bytes.Equal(want(got, id), pg) {
					t.Fatalf("step %d: %s as stored (exported: %t) differs from the model", step, fmtPageID(id), ok && g != nil)
				}
			}
			for id, g := range got {
				if _, ok := committed[id]; !ok && !bytes.Equal(g, make([]byte, pb)) {
					t.Fatalf("step %d: %s is exported but not in the model", step, fmtPageID(id))
				}
			}
			var patchBytes int64
			oldest := p.seq + 1
			for id, pp := range p.pending {
				patchBytes += int64(len(pp.patch))
				oldest = min(oldest, pp.since)
				if len(pp.patch) > maxPatchBytes(pb) {
					t.Fatalf("step %d: %s holds %d patch bytes, more than %d", step, fmtPageID(id), len(pp.patch), maxPatchBytes(pb))
				}
				if f, ok := floors[id]; ok && f >= pp.since {
					t.Fatalf("step %d: %s has floor %d, pending since %d", step, fmtPageID(id), f, pp.since)
				}
			}
			if patchBytes != p.patchBytes || db.PatchBytes() != patchBytes {
				t.Fatalf("step %d: patch bytes %d, counted %d by the partition and %d by the DB", step, patchBytes, p.patchBytes, db.PatchBytes())
			}
			if len(logs) > 0 && logs[0] < oldest {
				t.Fatalf("step %d: log entry %d kept, the oldest pending page is pending since %d", step, logs[0], oldest)
			}
			if len(p.pending) > 0 && (len(logs) == 0 || logs[0] > oldest) {
				t.Fatalf("step %d: pages pending since %d, the log starts at %v", step, oldest, logs)
			}
			if wb < int64(db.writeBackPages) {
				cutoff := clock.Add(-interval).UnixNano()
				for _, b := range p.queue {
					if b.at <= cutoff {
						t.Fatalf("step %d: %d pages pending since write batch %d, older than the interval, after a write-back of %d pages", step, len(b.ids), b.seq, wb)
					}
				}
			}
			pendingSeen = max(pendingSeen, len(p.pending))
			if len(logs) > 0 {
				logged++
			}
		case r < 91: // uncommitted changes void
			p.Discard()
			current = copyPages(committed)
			dropped = dropped[:0]
		case r < 95: // reopen: every page read back from Badger
			before := pendingSnapshot(p)
			p.Close()
			if db.PatchBytes() != 0 {
				t.Fatalf("step %d: %d patch bytes counted after the only partition closed", step, db.PatchBytes())
			}
			p = partitionT(t, db, tp.Topic, tp.Partition)
			reopened++
			after := pendingSnapshot(p)
			if len(after) != len(before) {
				t.Fatalf("step %d: %d pages pending after reopening, %d before", step, len(after), len(before))
			}
			for id, s := range before {
				if after[id] != s {
					t.Fatalf("step %d: %s pending as %s after reopening, %s before", step, fmtPageID(id), after[id], s)
				}
			}
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
	if pendingSeen < 10 || writtenBack == 0 || logged == 0 || reopened == 0 {
		t.Fatalf("the workload did not reach the write-back: at most %d pages pending, %d written back, %d write batches with a log", pendingSeen, writtenBack, logged)
	}
	t.Logf("up to %d pages pending, %d written back, %d reopenings", pendingSeen, writtenBack, reopened)
}

func counterValue(t testing.TB, c interface{ Write(*dto.Metric) error }) int64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return int64(m.GetCounter().GetValue())
}

// TestCommitWritesOneLogEntry: a write batch of small changes to many
// pages is one log entry, whatever the number of pages (not an entry a
// page), and no page is written whole until the write-back interval has
// passed; then the next write batch writes them whole and deletes the
// log entries, all of them once every page is written back.
func TestCommitWritesOneLogEntry(t *testing.T) {
	const pb, pages = 4096, 500
	clock := time.Unix(1_700_000_000, 0)
	db := openTuned(t, Options{Dir: t.TempDir(), PageBytes: pb, WriteBackInterval: time.Minute},
		tuning{now: func() time.Time { return clock }})
	p := partitionT(t, db, "orders", 1)
	defer p.Close()
	change := func(b byte) {
		for i := range pages {
			id := filter.PageID{Page: uint32(i)}
			pg := mustPage(t, p, id)
			pg[i%pb] = b
			p.MarkChanged(id, pg, i%pb, 1)
		}
	}
	for batch := range 3 {
		change(byte(batch + 1))
		clock = clock.Add(time.Second)
		if err := p.Commit([]byte("meta"), Checkpoint{Offset: int64(batch)}); err != nil {
			t.Fatal(err)
		}
		floors, logs := storedState(t, p)
		if len(floors) != 0 || len(logs) != batch+1 {
			t.Fatalf("after write batch %d: %d pages stored whole, %d log entries; want none and %d", batch+1, len(floors), len(logs), batch+1)
		}
	}
	clock = clock.Add(time.Minute)
	change(9)
	if err := p.Commit([]byte("meta"), Checkpoint{Offset: 9}); err != nil {
		t.Fatal(err)
	}
	floors, logs := storedState(t, p)
	if len(floors) != pages || len(logs) != 0 || len(p.pending) != 0 {
		t.Fatalf("after the interval: %d pages stored whole, %d log entries, %d pending; want %d, 0, 0", len(floors), len(logs), len(p.pending), pages)
	}
	for id, f := range floors {
		if f != 4 {
			t.Fatalf("%s has floor %d, want 4", fmtPageID(id), f)
		}
	}
}

// TestWriteBackBoundsPatchBytes: with the interval far off, the
// write-back still keeps a partition's patches within its share of
// WriteBackBytes plus what one write batch logs, writing the oldest
// pending pages whole; without that bound the patches of a partition
// that changes more pages than its share holds grow with every batch.
func TestWriteBackBoundsPatchBytes(t *testing.T) {
	const pb, share = 4096, 32 << 10
	db := openT(t, Options{Dir: t.TempDir(), PageBytes: pb, WriteBackInterval: time.Hour, WriteBackBytes: share, Logger: quiet})
	p := partitionT(t, db, "orders", 2)
	defer p.Close()
	rng := rand.New(rand.NewPCG(5, 6))
	var most int64
	for batch := range 200 {
		for range 300 {
			id := filter.PageID{Page: rng.Uint32N(2000)}
			pg := mustPage(t, p, id)
			off := rng.IntN(pb - 4)
			pg[off] ^= 0xa5
			p.MarkChanged(id, pg, off, 1)
		}
		// A one-byte change logs a record of at most 8 bytes (a length, a
		// run's gap and length, the byte) beside its page ID.
		logged := int64(16 * p.DirtyPages())
		if err := p.Commit([]byte("meta"), Checkpoint{Offset: int64(batch)}); err != nil {
			t.Fatal(err)
		}
		if p.patchBytes > share+logged {
			t.Fatalf("after write batch %d: %d patch bytes, share %d plus the batch's %d", batch, p.patchBytes, share, logged)
		}
		most = max(most, p.patchBytes)
	}
	if n := counterValue(t, db.metrics.writtenBack); n == 0 {
		t.Fatal("nothing written back")
	}
	t.Logf("at most %d patch bytes, share %d", most, share)
}

// TestCommitFailureWithWriteBack: a write batch that fails before its
// transaction commits, with pages the write-back chose and pages logged,
// changes nothing: the same pages stay pending with the same patches, the
// log and the counted patch bytes are as before, and the next write batch
// writes them back and reads as the model, also after reopening.
func TestCommitFailureWithWriteBack(t *testing.T) {
	const pb = 512
	clock := time.Unix(1_700_000_000, 0)
	fail := false
	injected := fmt.Errorf("injected failure")
	dir := t.TempDir()
	opts := Options{Dir: dir, PageBytes: pb, FlushBytes: smallFlush, WriteBackInterval: time.Minute, Logger: quiet}
	db := openTuned(t, opts, tuning{now: func() time.Time { return clock }, beforeTxnCommit: func(TopicPartition) error {
		if fail {
			return injected
		}
		return nil
	}})
	p := partitionT(t, db, "orders", 4)
	model := map[filter.PageID][]byte{}
	change := func(id filter.PageID, off int, b byte) {
		pg := mustPage(t, p, id)
		pg[off] = b
		p.MarkChanged(id, pg, off, 1)
		model[id] = bytes.Clone(pg)
	}
	for i := range 20 {
		change(filter.PageID{Page: uint32(i)}, i, 1)
	}
	if err := p.Commit([]byte("m1"), Checkpoint{Offset: 1}); err != nil {
		t.Fatal(err)
	}
	clock = clock.Add(2 * time.Minute) // every pending page is due
	for i := 10; i < 30; i++ {
		change(filter.PageID{Page: uint32(i)}, i+1, 2) // some due and dirty, some new
	}
	before, patchBytes, logs := pendingSnapshot(p), p.patchBytes, p.LogEntries()
	fail = true
	if err := p.Commit([]byte("m2"), Checkpoint{Offset: 2}); err == nil {
		t.Fatal("Commit succeeded through the injected failure")
	}
	fail = false
	after := pendingSnapshot(p)
	if fmt.Sprint(after) != fmt.Sprint(before) || p.patchBytes != patchBytes || p.LogEntries() != logs || db.PatchBytes() != patchBytes {
		t.Fatalf("a failed write batch changed the pending pages: %d before, %d after; patch bytes %d, %d; log entries %d, %d",
			len(before), len(after), patchBytes, p.patchBytes, logs, p.LogEntries())
	}
	for id, pp := range p.pending {
		if pp.writeBack {
			t.Fatalf("%s still marked for a write-back after the failed write batch", fmtPageID(id))
		}
	}
	if err := p.Commit([]byte("m2"), Checkpoint{Offset: 2}); err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		if id := (filter.PageID{Page: uint32(i)}); p.pending[id] != nil {
			t.Fatalf("%s, pending past the interval, not written back by the write batch after the failed one", fmtPageID(id))
		}
	}
	check := func(p *PartitionState) {
		t.Helper()
		for id, want := range model {
			if got := mustPage(t, p, id); !bytes.Equal(got, want) {
				t.Fatalf("%s differs from the model", fmtPageID(id))
			}
		}
	}
	check(p)
	p.Close()
	p = partitionT(t, db, "orders", 4)
	defer p.Close()
	check(p)
}
