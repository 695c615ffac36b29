package store

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"

	"github.com/dgraph-io/badger/v4"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/kdedup/kdedup/filter"
)

func TestPageNeverWrittenIsZero(t *testing.T) {
	for _, pageBytes := range []int{0, 8, 4096, 64 << 10} {
		t.Run(fmt.Sprint(pageBytes), func(t *testing.T) {
			db := openT(t, Options{InMemory: true, PageBytes: pageBytes, FlushBytes: smallFlush})
			p := partitionT(t, db, "orders", 0)
			want := pageBytes
			if want == 0 {
				want = DefaultPageBytes
			}
			for _, id := range []filter.PageID{{}, {SubFilter: 3, Page: 1 << 31}} {
				page := mustPage(t, p, id)
				if !bytes.Equal(page, make([]byte, want)) {
					t.Errorf("Page(%v): %d bytes, not %d zeros", id, len(page), want)
				}
			}
			if p.Meta() != nil {
				t.Errorf("Meta of a new partition = %x, want nil", p.Meta())
			}
			if cp, ok := p.Checkpoint(); ok {
				t.Errorf("Checkpoint of a new partition = %+v, true", cp)
			}
		})
	}
}

func TestCommitReopen(t *testing.T) {
	dir := t.TempDir()
	const pb = 512
	ids := []filter.PageID{{SubFilter: 0, Page: 0}, {SubFilter: 0, Page: 7}, {SubFilter: 1, Page: 0}, {SubFilter: 4, Page: 1 << 20}}
	meta := []byte("chain metadata")
	cp := Checkpoint{Offset: 12345, LeaderEpoch: 6}

	db, err := Open(Options{Dir: dir, PageBytes: pb, FlushBytes: smallFlush, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	p, err := db.Partition("orders", 2)
	if err != nil {
		t.Fatal(err)
	}
	other, err := db.Partition("orders", 3)
	if err != nil {
		t.Fatal(err)
	}
	for i, id := range ids {
		write(t, p, id, pageBytes(pb, id, uint64(i+1)))
	}
	if got, want := p.DirtyBytes(), int64(len(ids)*pb); got != want {
		t.Errorf("DirtyBytes = %d, want %d", got, want)
	}
	if err := p.Commit(meta, cp); err != nil {
		t.Fatal(err)
	}
	if p.DirtyBytes() != 0 {
		t.Errorf("DirtyBytes after Commit = %d, want 0", p.DirtyBytes())
	}
	// An empty write batch still records metadata and checkpoint.
	if err := other.Commit(nil, Checkpoint{Offset: 1, LeaderEpoch: -1}); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}

	db = openT(t, Options{Dir: dir, PageBytes: pb, FlushBytes: smallFlush})
	p = partitionT(t, db, "orders", 2)
	if !bytes.Equal(p.Meta(), meta) {
		t.Errorf("Meta after reopen = %q, want %q", p.Meta(), meta)
	}
	if got, ok := p.Checkpoint(); !ok || got != cp {
		t.Errorf("Checkpoint after reopen = %+v, %t; want %+v, true", got, ok, cp)
	}
	for i, id := range ids {
		if got := mustPage(t, p, id); !bytes.Equal(got, pageBytes(pb, id, uint64(i+1))) {
			t.Errorf("page %v after reopen differs", id)
		}
	}
	if got := mustPage(t, p, filter.PageID{SubFilter: 0, Page: 1}); !bytes.Equal(got, make([]byte, pb)) {
		t.Error("a page never written is not zeros after reopen")
	}
	other = partitionT(t, db, "orders", 3)
	if got, ok := other.Checkpoint(); !ok || got != (Checkpoint{Offset: 1, LeaderEpoch: -1}) || other.Meta() == nil || len(other.Meta()) != 0 {
		t.Errorf("empty write batch after reopen: checkpoint %+v, %t, meta %#v", got, ok, other.Meta())
	}
	tps, err := db.Partitions()
	if err != nil {
		t.Fatal(err)
	}
	if want := []TopicPartition{{"orders", 2}, {"orders", 3}}; fmt.Sprint(tps) != fmt.Sprint(want) {
		t.Errorf("Partitions = %v, want %v", tps, want)
	}
}

// model is the exact expected state of one PartitionState.
type model struct {
	pageBytes int
	committed map[filter.PageID][]byte
	dirty     map[filter.PageID][]byte
	meta      []byte
	cp        Checkpoint
	hasCP     bool
}

func newModel(pageBytes int) *model {
	return &model{pageBytes: pageBytes, committed: map[filter.PageID][]byte{}, dirty: map[filter.PageID][]byte{}}
}

func (m *model) page(id filter.PageID) []byte {
	if b, ok := m.dirty[id]; ok {
		return b
	}
	if b, ok := m.committed[id]; ok {
		return b
	}
	return make([]byte, m.pageBytes)
}

func (m *model) commit(meta []byte, cp Checkpoint) {
	for id, b := range m.dirty {
		m.committed[id] = b
	}
	clear(m.dirty)
	m.meta, m.cp, m.hasCP = append([]byte{}, meta...), cp, true
}

// check compares p with m: every page of the universe, metadata,
// checkpoint and DirtyBytes.
func (m *model) check(t testing.TB, p *PartitionState, universe []filter.PageID) {
	t.Helper()
	if err := m.diff(p, universe); err != nil {
		t.Fatal(err)
	}
}

func (m *model) checkMeta(t testing.TB, p *PartitionState) {
	t.Helper()
	if err := m.diff(p, nil); err != nil {
		t.Fatal(err)
	}
}

// diff returns the first difference between p and m, nil if none.
func (m *model) diff(p *PartitionState, universe []filter.PageID) error {
	for _, id := range universe {
		got, err := p.Page(id)
		if err != nil {
			return err
		}
		if !bytes.Equal(got, m.page(id)) {
			return fmt.Errorf("%v: page %v differs from the model", p.TopicPartition(), id)
		}
	}
	if cp, ok := p.Checkpoint(); ok != m.hasCP || cp != m.cp {
		return fmt.Errorf("%v: Checkpoint = %+v, %t; want %+v, %t", p.TopicPartition(), cp, ok, m.cp, m.hasCP)
	}
	if !bytes.Equal(p.Meta(), m.meta) || (p.Meta() == nil) != (m.meta == nil) {
		return fmt.Errorf("%v: Meta = %x, want %x", p.TopicPartition(), p.Meta(), m.meta)
	}
	if got, want := p.DirtyBytes(), int64(len(m.dirty)*m.pageBytes); got != want {
		return fmt.Errorf("%v: DirtyBytes = %d, want %d", p.TopicPartition(), got, want)
	}
	return nil
}

func universe(subFilters, pages uint32) []filter.PageID {
	var ids []filter.PageID
	for s := range subFilters {
		for pg := range pages {
			ids = append(ids, filter.PageID{SubFilter: s, Page: pg})
		}
	}
	return ids
}

// TestRandomizedAgainstModel runs random page writes, reads, commits,
// discards, partition reopens and DB reopens against an exact model, with a
// page cache of two pages so that nearly every read evicts.
func TestRandomizedAgainstModel(t *testing.T) {
	const pb = 64
	dir := t.TempDir()
	opts := Options{Dir: dir, PageBytes: pb, FlushBytes: smallFlush, CacheBytes: 2 * pb, Logger: quiet}
	ids := universe(3, 12)
	rng := rand.New(rand.NewPCG(1, 2))
	m := newModel(pb)

	db, err := Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { db.Close() }()
	p, err := db.Partition("events", 7)
	if err != nil {
		t.Fatal(err)
	}
	var stamp uint64
	for step := range 2000 {
		switch r := rng.IntN(100); {
		case r < 45:
			id := ids[rng.IntN(len(ids))]
			stamp++
			content := pageBytes(pb, id, stamp)
			write(t, p, id, content)
			m.dirty[id] = content
		case r < 85:
			id := ids[rng.IntN(len(ids))]
			if got := mustPage(t, p, id); !bytes.Equal(got, m.page(id)) {
				t.Fatalf("step %d: page %v differs from the model", step, id)
			}
		case r < 93:
			meta := make([]byte, rng.IntN(40))
			for i := range meta {
				meta[i] = byte(rng.Uint32())
			}
			cp := Checkpoint{Offset: int64(step), LeaderEpoch: int32(step % 5)}
			if err := p.Commit(meta, cp); err != nil {
				t.Fatalf("step %d: %v", step, err)
			}
			m.commit(meta, cp)
		case r < 96:
			p.Discard()
			clear(m.dirty)
		case r < 99:
			p.Close()
			clear(m.dirty)
			if p, err = db.Partition("events", 7); err != nil {
				t.Fatal(err)
			}
		default:
			p.Close()
			clear(m.dirty)
			if err := db.Close(); err != nil {
				t.Fatal(err)
			}
			if db, err = Open(opts); err != nil {
				t.Fatal(err)
			}
			if p, err = db.Partition("events", 7); err != nil {
				t.Fatal(err)
			}
		}
		m.checkMeta(t, p)
		if db.cache.resident() > 2 {
			t.Fatalf("step %d: cache holds %d pages, budget is 2", step, db.cache.resident())
		}
	}
	m.check(t, p, ids)
}

// TestDirtyPagesSurviveEviction dirties more pages than the cache holds,
// then reads enough other pages to evict everything evictable.
func TestDirtyPagesSurviveEviction(t *testing.T) {
	const pb = 128
	db := openT(t, Options{InMemory: true, PageBytes: pb, FlushBytes: smallFlush, CacheBytes: 3 * pb})
	p := partitionT(t, db, "orders", 0)
	m := newModel(pb)
	ids := universe(2, 50)
	for i, id := range ids[:40] {
		c := pageBytes(pb, id, uint64(i+1))
		write(t, p, id, c)
		m.dirty[id] = c
	}
	for _, id := range ids[40:] {
		mustPage(t, p, id)
	}
	m.check(t, p, ids)
	if err := p.Commit([]byte("m"), Checkpoint{Offset: 40}); err != nil {
		t.Fatal(err)
	}
	m.commit([]byte("m"), Checkpoint{Offset: 40})
	m.check(t, p, ids) // committed pages come back from Badger, not the three-page cache
}

func TestDiscard(t *testing.T) {
	const pb = 256
	db := openT(t, Options{InMemory: true, PageBytes: pb, FlushBytes: smallFlush})
	p := partitionT(t, db, "orders", 1)
	m := newModel(pb)
	ids := universe(2, 4)

	a := filter.PageID{SubFilter: 0, Page: 1}
	write(t, p, a, pageBytes(pb, a, 1))
	m.dirty[a] = pageBytes(pb, a, 1)
	if err := p.Commit([]byte("one"), Checkpoint{Offset: 10}); err != nil {
		t.Fatal(err)
	}
	m.commit([]byte("one"), Checkpoint{Offset: 10})

	// Modify the committed page in place (as the chain does) and a new one.
	b := filter.PageID{SubFilter: 1, Page: 3}
	write(t, p, a, pageBytes(pb, a, 2))
	write(t, p, b, pageBytes(pb, b, 2))
	if p.DirtyBytes() != 2*pb {
		t.Fatalf("DirtyBytes = %d, want %d", p.DirtyBytes(), 2*pb)
	}
	p.Discard()
	m.check(t, p, ids)

	// A cached clean page modified in place but never marked dirty is a
	// broken Pager contract; Discard still restores the committed bytes.
	copy(mustPage(t, p, a), pageBytes(pb, a, 3))
	p.Discard()
	m.check(t, p, ids)
}

func TestCorruptPageLength(t *testing.T) {
	const pb = 64
	db := openT(t, Options{InMemory: true, PageBytes: pb, FlushBytes: smallFlush})
	id := filter.PageID{SubFilter: 2, Page: 9}
	for _, n := range []int{0, pb - 1, pb + 1} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			err := db.bdb.Update(func(txn *badger.Txn) error {
				return txn.Set(pageKey(partitionPrefix("orders", 4), id), make([]byte, pageBaseHeader+n))
			})
			if err != nil {
				t.Fatal(err)
			}
			p := partitionT(t, db, "orders", 4)
			defer p.Close()
			_, err = p.Page(id)
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("Page of a %d-byte page: %v, want ErrCorrupt", n, err)
			}
			for _, s := range []string{"orders/4", "page 9 of sub-filter 2", fmt.Sprintf("%d bytes, want %d", n, pb)} {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not name %q", err, s)
				}
			}
			// A dirty page of the wrong length is refused at commit.
			p.MarkDirty(id, make([]byte, n))
			if err := p.Commit(nil, Checkpoint{}); !errors.Is(err, ErrCorrupt) {
				t.Errorf("Commit of a %d-byte page: %v, want ErrCorrupt", n, err)
			}
		})
	}
}

func TestCorruptCheckpoint(t *testing.T) {
	tests := []struct {
		name string
		keys map[string][]byte
	}{
		{"short checkpoint", map[string][]byte{"m": {}, "c": make([]byte, 5)}},
		{"checkpoint without meta", map[string][]byte{"c": encodeCheckpoint(Checkpoint{Offset: 1})}},
		{"meta without checkpoint", map[string][]byte{"m": []byte("x")}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			db := openT(t, Options{InMemory: true})
			pre := partitionPrefix("orders", 0)
			err := db.bdb.Update(func(txn *badger.Txn) error {
				for tag, v := range tt.keys {
					if err := txn.Set(append(bytes.Clone(pre), tag...), v); err != nil {
						return err
					}
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := db.Partition("orders", 0); !errors.Is(err, ErrCorrupt) {
				t.Errorf("Partition: %v, want ErrCorrupt", err)
			}
		})
	}
}

func TestLayoutVersion(t *testing.T) {
	dir := t.TempDir()
	db, err := Open(Options{Dir: dir, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	var got []byte
	err = db.bdb.View(func(txn *badger.Txn) error {
		v, _, err := get(txn, layoutKey)
		got = v
		return err
	})
	if err != nil || !bytes.Equal(got, []byte{0, 0, 0, 3}) {
		t.Fatalf("layout version of a new store = %x, %v; want 00000003", got, err)
	}
	// Version 2 stored per-page deltas and a 4-byte base header.
	if err := db.bdb.Update(func(txn *badger.Txn) error { return txn.Set(layoutKey, []byte{0, 0, 0, 2}) }); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	db, err = Open(Options{Dir: dir, Logger: quiet})
	if err == nil {
		db.Close()
		t.Fatal("Open of a version-2 store succeeded")
	}
	if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "layout version 2 on disk, this build reads version 3") {
		t.Errorf("Open of a version-2 store: %v; want ErrCorrupt naming versions 2 and 3", err)
	}

	// State without a version is refused too.
	db = openT(t, Options{InMemory: true})
	err = db.bdb.Update(func(txn *badger.Txn) error {
		if err := txn.Delete(layoutKey); err != nil {
			return err
		}
		return txn.Set(metaKey(partitionPrefix("a", 0)), nil)
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.checkLayout(); !errors.Is(err, ErrCorrupt) {
		t.Errorf("checkLayout of state without a version: %v, want ErrCorrupt", err)
	}
}

// fullBatch dirties FlushBytes plus one page of the longest possible topic:
// the largest write batch Options promise to hold.
func fullBatch(t testing.TB, db *DB) *PartitionState {
	t.Helper()
	p := partitionT(t, db, strings.Repeat("t", maxTopicBytes), 0)
	pb := int64(db.opts.PageBytes)
	for i := range uint32((db.opts.FlushBytes+pb-1)/pb + 1) {
		id := filter.PageID{Page: i}
		write(t, p, id, pageBytes(int(pb), id, 1))
	}
	return p
}

func TestFlushBytes(t *testing.T) {
	tests := []struct {
		name         string
		opts         Options
		wantMemTable int64 // 0: the open must fail
	}{
		// The least memtable over 100/15 of the batch, in whole MiB. Whole
		// pages are in the value log: the transaction holds their keys and
		// pointers, a write batch's share of the write-back's too.
		{"defaults", Options{}, 16 << 20},
		{"large pages", Options{PageBytes: 256 << 10, FlushBytes: 4 << 20}, 16 << 20},
		{"a small FlushBytes takes the least memtable", Options{FlushBytes: 1 << 20}, 16 << 20},
		{"64 MiB raises the memtable", Options{FlushBytes: 64 << 20}, 39 << 20},
		{"4 GiB is refused", Options{FlushBytes: 4 << 30}, 0},
		// Without a value log, pages count whole.
		{"in memory", Options{InMemory: true}, 122 << 20},
		{"in memory, 1 GiB is refused", Options{InMemory: true, FlushBytes: 1 << 30}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if !tt.opts.InMemory {
				tt.opts.Dir = t.TempDir()
			}
			tt.opts.Logger = quiet
			db, err := Open(tt.opts)
			if tt.wantMemTable == 0 {
				if err == nil {
					db.Close()
					t.Fatal("Open succeeded")
				}
				if !errors.Is(err, ErrInvalidOptions) || !strings.Contains(err.Error(), "FlushBytes") {
					t.Fatalf("Open: %v; want ErrInvalidOptions naming FlushBytes", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { db.Close() })
			if got := memTableBytes(db.batchSize); got != tt.wantMemTable {
				t.Errorf("memtable = %d bytes, want %d", got, tt.wantMemTable)
			}
			t.Logf("batch of %d bytes, %d entries; Badger limit %d bytes, %d entries",
				db.batchSize, db.batchCount, db.bdb.MaxBatchSize(), db.bdb.MaxBatchCount())
			p := fullBatch(t, db)
			if err := p.Commit(make([]byte, 32<<10), Checkpoint{Offset: 1}); err != nil {
				t.Fatalf("Commit of a full write batch: %v", err)
			}
		})
	}
}

func TestOptionsValidate(t *testing.T) {
	tests := []struct {
		name string
		opts Options
		want []string // substrings of the error; none: valid
	}{
		{"in memory", Options{InMemory: true}, nil},
		{"dir", Options{Dir: "/x"}, nil},
		{"neither", Options{}, []string{"Dir : must not be empty"}},
		{"both", Options{Dir: "/x", InMemory: true}, []string{"must be empty"}},
		{"read-only in memory", Options{InMemory: true, ReadOnly: true}, []string{"ReadOnly"}},
		{
			"every problem at once",
			Options{Dir: "/x", PageBytes: MaxPageBytes + 1, CacheBytes: -1, FlushBytes: -1},
			[]string{"PageBytes", "CacheBytes", "FlushBytes"},
		},
		{"negative page", Options{InMemory: true, PageBytes: -4}, []string{"PageBytes -4:"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.opts.withDefaults().Validate()
			if len(tt.want) == 0 {
				if err != nil {
					t.Fatalf("validate: %v", err)
				}
				return
			}
			if !errors.Is(err, ErrInvalidOptions) {
				t.Fatalf("validate: %v, want ErrInvalidOptions", err)
			}
			for _, s := range tt.want {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not name %q", err, s)
				}
			}
		})
	}
}

// TestCommitFailureKeepsState makes commits fail before Txn.Commit, once by
// exceeding Badger's transaction limit and once through the test hook, and
// checks that memory and disk keep the previous write batch.
func TestCommitFailureKeepsState(t *testing.T) {
	failHook := errors.New("injected failure")
	tests := []struct {
		name    string
		pb      int
		pages   int // dirty pages of the failing batch
		hook    bool
		wantErr error
	}{
		// 100,000 whole pages, 3.4 MB of keys and value pointers; a
		// FlushBytes of 64 KiB makes the least memtable, which admits
		// under 2.4 MiB.
		{"transaction too big", 64, 100_000, false, ErrBatchTooBig},
		{"error before Txn.Commit", 64 << 10, 8, true, failHook},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			var fail bool
			tn := tuning{gcInterval: gcInterval, beforeTxnCommit: func(TopicPartition) error {
				if fail {
					return failHook
				}
				return nil
			}}
			pb := tt.pb
			opts := Options{Dir: dir, PageBytes: pb, FlushBytes: 64 << 10, CacheBytes: 4 * int64(pb), Logger: quiet}
			db, err := open(opts, tn)
			if err != nil {
				t.Fatal(err)
			}
			p, err := db.Partition("orders", 0)
			if err != nil {
				t.Fatal(err)
			}
			m := newModel(pb)
			ids := universe(1, uint32(tt.pages))
			for _, id := range ids[:4] {
				c := pageBytes(pb, id, 1)
				write(t, p, id, c)
				m.dirty[id] = c
			}
			if err := p.Commit([]byte("batch 1"), Checkpoint{Offset: 100, LeaderEpoch: 1}); err != nil {
				t.Fatal(err)
			}
			m.commit([]byte("batch 1"), Checkpoint{Offset: 100, LeaderEpoch: 1})

			for _, id := range ids {
				c := pageBytes(pb, id, 2)
				write(t, p, id, c)
				m.dirty[id] = c
			}
			fail = tt.hook
			err = p.Commit([]byte("batch 2"), Checkpoint{Offset: 200, LeaderEpoch: 1})
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("Commit: %v, want %v", err, tt.wantErr)
			}
			// In memory: the dirty set and the previous metadata are kept.
			m.check(t, p, ids)
			p.Close()
			if err := db.Close(); err != nil {
				t.Fatal(err)
			}

			// On disk: exactly the first write batch.
			db = openT(t, opts)
			p = partitionT(t, db, "orders", 0)
			clear(m.dirty)
			m.check(t, p, ids)
		})
	}
}

func TestPartitions(t *testing.T) {
	db := openT(t, Options{InMemory: true, PageBytes: 16, FlushBytes: smallFlush})
	want := []TopicPartition{{"a", 0}, {"a", 2}, {"a", 10}, {"ab", 1}, {"b", 0}, {"b", 300}}
	// Commit in an order unlike the sorted one; ("a", 5) gets pages only and
	// is not committed, so it has no state.
	for _, i := range []int{5, 3, 0, 4, 2, 1} {
		p := partitionT(t, db, want[i].Topic, want[i].Partition)
		for pg := range uint32(3) {
			write(t, p, filter.PageID{Page: pg}, make([]byte, 16))
		}
		if err := p.Commit([]byte("m"), Checkpoint{Offset: int64(i)}); err != nil {
			t.Fatal(err)
		}
		p.Close()
	}
	lost := partitionT(t, db, "a", 5)
	write(t, lost, filter.PageID{}, make([]byte, 16))
	got, err := db.Partitions()
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("Partitions = %v, want %v", got, want)
	}
}

func TestPartitionOpenOnce(t *testing.T) {
	db := openT(t, Options{InMemory: true})
	p := partitionT(t, db, "orders", 0)
	if _, err := db.Partition("orders", 0); !errors.Is(err, ErrPartitionOpen) {
		t.Errorf("second Partition: %v, want ErrPartitionOpen", err)
	}
	p.Close()
	p.Close()
	if _, err := p.Page(filter.PageID{}); !errors.Is(err, ErrClosed) {
		t.Errorf("Page after Close: %v, want ErrClosed", err)
	}
	if err := p.Commit(nil, Checkpoint{}); !errors.Is(err, ErrClosed) {
		t.Errorf("Commit after Close: %v, want ErrClosed", err)
	}
	partitionT(t, db, "orders", 0)

	for _, topic := range []string{"", strings.Repeat("x", maxTopicBytes+1)} {
		if _, err := db.Partition(topic, 0); !errors.Is(err, ErrInvalidTopic) {
			t.Errorf("Partition(%d-byte topic): %v, want ErrInvalidTopic", len(topic), err)
		}
	}
}

func TestClosedDB(t *testing.T) {
	db, err := Open(Options{InMemory: true, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	p, err := db.Partition("orders", 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if _, err := db.Partition("orders", 1); !errors.Is(err, ErrClosed) {
		t.Errorf("Partition after Close: %v, want ErrClosed", err)
	}
	if _, err := db.Partitions(); !errors.Is(err, ErrClosed) {
		t.Errorf("Partitions after Close: %v, want ErrClosed", err)
	}
	if _, err := p.Page(filter.PageID{}); !errors.Is(err, ErrClosed) {
		t.Errorf("Page after DB Close: %v, want ErrClosed", err)
	}
	if err := p.Commit(nil, Checkpoint{}); !errors.Is(err, ErrClosed) {
		t.Errorf("Commit after DB Close: %v, want ErrClosed", err)
	}
	p.Close()
}

func TestDirectoryLocked(t *testing.T) {
	dir := t.TempDir()
	openT(t, Options{Dir: dir})
	db, err := Open(Options{Dir: dir, Logger: quiet})
	if err == nil {
		db.Close()
		t.Fatal("second Open of one directory succeeded")
	}
	if !errors.Is(err, ErrLocked) || !strings.Contains(err.Error(), "another") {
		t.Errorf("second Open: %v; want ErrLocked explaining another process holds it", err)
	}
}

func TestReadOnly(t *testing.T) {
	dir := t.TempDir()
	db, err := Open(Options{Dir: dir, PageBytes: 32, FlushBytes: smallFlush, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	p, err := db.Partition("orders", 0)
	if err != nil {
		t.Fatal(err)
	}
	id := filter.PageID{Page: 1}
	write(t, p, id, pageBytes(32, id, 1))
	if err := p.Commit([]byte("m"), Checkpoint{Offset: 5}); err != nil {
		t.Fatal(err)
	}
	p.Close()
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}

	ro1 := openT(t, Options{Dir: dir, PageBytes: 32, FlushBytes: smallFlush, ReadOnly: true})
	ro2 := openT(t, Options{Dir: dir, PageBytes: 32, FlushBytes: smallFlush, ReadOnly: true}) // a shared lock
	for _, ro := range []*DB{ro1, ro2} {
		p := partitionT(t, ro, "orders", 0)
		if got := mustPage(t, p, id); !bytes.Equal(got, pageBytes(32, id, 1)) {
			t.Error("read-only page differs")
		}
		if cp, ok := p.Checkpoint(); !ok || cp.Offset != 5 {
			t.Errorf("read-only Checkpoint = %+v, %t", cp, ok)
		}
		write(t, p, id, pageBytes(32, id, 2))
		if err := p.Commit(nil, Checkpoint{Offset: 6}); !errors.Is(err, ErrReadOnly) {
			t.Errorf("read-only Commit: %v, want ErrReadOnly", err)
		}
	}

	// Badger refuses a read-only open of a directory it never wrote.
	if db, err := Open(Options{Dir: t.TempDir(), ReadOnly: true, Logger: quiet}); err == nil {
		db.Close()
		t.Error("read-only Open of an empty directory succeeded")
	}
}

func TestMetrics(t *testing.T) {
	reg1, reg2 := prometheus.NewRegistry(), prometheus.NewRegistry()
	db1 := openT(t, Options{InMemory: true, PageBytes: 8, FlushBytes: smallFlush, CacheBytes: 8, Registerer: reg1})
	openT(t, Options{InMemory: true, Registerer: reg2})
	openT(t, Options{InMemory: true}) // nil Registerer: nothing registered
	// A failed Open registers nothing, so the next one may use the registry.
	reg3 := prometheus.NewRegistry()
	refuse := tuning{gcInterval: gcInterval, badgerOpen: func(badger.Options) (*badger.DB, error) {
		return nil, errors.New("refused")
	}}
	if _, err := open(Options{InMemory: true, Registerer: reg3, Logger: quiet}, refuse); err == nil {
		t.Fatal("Open with a refusing badger.Open succeeded")
	}
	openT(t, Options{InMemory: true, Registerer: reg3})

	p := partitionT(t, db1, "orders", 0)
	a, b := filter.PageID{Page: 1}, filter.PageID{Page: 2}
	write(t, p, a, pageBytes(8, a, 1)) // miss, zero page
	mustPage(t, p, a)                  // hit, dirty
	if err := p.Commit([]byte("meta"), Checkpoint{Offset: 1}); err != nil {
		t.Fatal(err)
	}
	mustPage(t, p, b) // miss, zero page; evicts a from the one-page cache
	mustPage(t, p, a) // miss, read from Badger

	m := db1.metrics
	for _, c := range []struct {
		name string
		c    prometheus.Metric
		want float64
	}{
		{"commits", m.commits, 1},
		{"commit errors", m.commitErrors, 0},
		{"hits", m.cacheHits, 1},
		{"misses", m.cacheMisses, 3},
		{"page reads", m.pageReads, 1},
		// page key 22 + base header 8 + 8, meta key 14 + 4, checkpoint key
		// 14 + 12, sequence-number key 14 + 8
		{"commit bytes", m.commitBytes, 104},
	} {
		var got dto.Metric
		if err := c.c.Write(&got); err != nil {
			t.Fatal(err)
		}
		if got.GetCounter().GetValue() != c.want {
			t.Errorf("%s = %v, want %v", c.name, got.GetCounter().GetValue(), c.want)
		}
	}
	families, err := reg1.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range families {
		names = append(names, f.GetName())
		// One commit; one partition opened.
		for name, want := range map[string]uint64{"kdedup_store_commit_seconds": 1, "kdedup_store_partition_open_seconds": 1} {
			if f.GetName() == name && f.GetMetric()[0].GetHistogram().GetSampleCount() != want {
				t.Errorf("%s has %d samples, want %d", name, f.GetMetric()[0].GetHistogram().GetSampleCount(), want)
			}
		}
	}
	want := []string{
		"kdedup_badger_cache_evictions_total", "kdedup_badger_cache_hits_total", "kdedup_badger_cache_misses_total",
		"kdedup_badger_level_size_bytes", "kdedup_badger_level_tables", "kdedup_badger_lsm_size_bytes", "kdedup_badger_vlog_size_bytes",
		"kdedup_store_commit_bytes_total", "kdedup_store_commit_errors_total", "kdedup_store_commit_seconds",
		"kdedup_store_commits_total", "kdedup_store_corruptions_total",
		"kdedup_store_dirty_page_bytes", "kdedup_store_dirty_page_peak_bytes", "kdedup_store_page_cache_capacity_bytes",
		"kdedup_store_page_cache_hits_total", "kdedup_store_page_cache_misses_total",
		"kdedup_store_page_reads_total", "kdedup_store_pages_consolidated_total", "kdedup_store_pages_reclaimed_total",
		"kdedup_store_pages_written_back_total", "kdedup_store_partition_open_seconds", "kdedup_store_patch_bytes",
	}
	if fmt.Sprint(names) != fmt.Sprint(want) {
		t.Errorf("registered %v, want %v", names, want)
	}
}

// TestConcurrentPartitions uses several PartitionStates of one DB from their own
// goroutines over a small shared cache; run with -race.
func TestConcurrentPartitions(t *testing.T) {
	const pb = 64
	db := openT(t, Options{InMemory: true, PageBytes: pb, FlushBytes: smallFlush, CacheBytes: 8 * pb})
	ids := universe(2, 16)
	var wg sync.WaitGroup
	for w := range int32(4) {
		p := partitionT(t, db, "orders", w)
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 9))
			m := newModel(pb)
			for step := range 600 {
				id := ids[rng.IntN(len(ids))]
				page, err := p.Page(id)
				if err != nil {
					t.Error(err)
					return
				}
				switch r := rng.IntN(10); {
				case r < 5:
					c := pageBytes(pb, id, uint64(step+1)<<8|uint64(w))
					copy(page, c)
					p.MarkDirty(id, page)
					m.dirty[id] = c
				case r < 9:
					if !bytes.Equal(page, m.page(id)) {
						t.Errorf("partition %d step %d: page %v differs", w, step, id)
						return
					}
				default:
					if err := p.Commit([]byte{byte(step)}, Checkpoint{Offset: int64(step)}); err != nil {
						t.Error(err)
						return
					}
					m.commit([]byte{byte(step)}, Checkpoint{Offset: int64(step)})
				}
			}
			if err := m.diff(p, ids); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
}

func TestValueLogGCLoop(t *testing.T) {
	ran := make(chan struct{}, 1)
	tn := tuning{gcInterval: 1, afterGC: func() {
		select {
		case ran <- struct{}{}:
		default:
		}
	}}
	db := openTuned(t, Options{Dir: t.TempDir()}, tn)
	<-ran
	<-ran
	if err := db.Close(); err != nil { // stops the loop; goleak checks it
		t.Fatal(err)
	}
}

type recordingHandler struct {
	mu      sync.Mutex
	records []slog.Record
}

func (h *recordingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *recordingHandler) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	h.records = append(h.records, r)
	h.mu.Unlock()
	return nil
}
func (h *recordingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *recordingHandler) WithGroup(string) slog.Handler      { return h }

func TestBadgerLogger(t *testing.T) {
	h := &recordingHandler{}
	l := badgerLogger{slog.New(h)}
	l.Errorf("e %d\n", 1)
	l.Warningf("w")
	l.Infof("i")
	l.Debugf("d")
	// Badger's cache-size warnings, as monitorCache writes them.
	l.Warningf("%s might be too small. Metrics: %s\n", "Block cache", "hit: 0 miss: 9")
	l.Warningf("Cache life expectancy (in seconds): %+v\n", "histogram")
	l.Warningf("%s might be too small. Metrics: %s\n", "Index cache", "hit: 0 miss: 9")
	l.Warningf("Block cache is full")
	want := []struct {
		level slog.Level
		msg   string
	}{
		{slog.LevelError, "e 1"}, {slog.LevelWarn, "w"}, {slog.LevelDebug, "i"}, {slog.LevelDebug - 4, "d"},
		{slog.LevelDebug, "Block cache might be too small. Metrics: hit: 0 miss: 9"},
		{slog.LevelDebug, "Cache life expectancy (in seconds): histogram"},
		{slog.LevelDebug, "Index cache might be too small. Metrics: hit: 0 miss: 9"},
		{slog.LevelWarn, "Block cache is full"},
	}
	if len(h.records) != len(want) {
		t.Fatalf("%d records, want %d", len(h.records), len(want))
	}
	for i, w := range want {
		if r := h.records[i]; r.Level != w.level || r.Message != w.msg {
			t.Errorf("record %d = %v %q, want %v %q", i, r.Level, r.Message, w.level, w.msg)
		}
	}

	// Through Badger, nothing at info or above on a clean open and close.
	h = &recordingHandler{}
	db := openT(t, Options{Dir: t.TempDir(), Logger: slog.New(h)})
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, r := range h.records {
		if r.Level >= slog.LevelInfo {
			t.Errorf("badger logged %v %q on a clean open", r.Level, r.Message)
		}
	}
}

// TestOpenRetriesMemtables checks the badger#2207 workaround: an Open that
// fails while opening memtables is retried exactly once.
func TestOpenRetriesMemtables(t *testing.T) {
	memtables := errors.New("while opening memtables err: truncated")
	tests := []struct {
		name      string
		failures  int   // leading badger.Open calls that fail
		err       error // their error
		wantCalls int
		wantOK    bool
	}{
		{"first open fails", 1, memtables, 2, true},
		{"both opens fail", 2, memtables, 2, false},
		{"other errors are not retried", 1, errors.New("manifest has unsupported version"), 1, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			calls := 0
			tn := tuning{gcInterval: gcInterval, badgerOpen: func(o badger.Options) (*badger.DB, error) {
				calls++
				if calls <= tt.failures {
					return nil, tt.err
				}
				return badger.Open(o)
			}}
			db, err := open(Options{Dir: t.TempDir(), Logger: quiet}, tn)
			if err == nil {
				db.Close()
			}
			if calls != tt.wantCalls || (err == nil) != tt.wantOK {
				t.Errorf("%d badger.Open calls, error %v; want %d calls, success %t", calls, err, tt.wantCalls, tt.wantOK)
			}
			if err != nil && !errors.Is(err, tt.err) {
				t.Errorf("error %v does not wrap %v", err, tt.err)
			}
		})
	}
}

// TestCacheHitsCountedPerPartition: each PartitionState counts its own
// page cache hits (no counter every partition's goroutine writes), and
// kdedup_store_page_cache_hits_total is their sum, the hits of the
// partitions closed since Open included.
func TestCacheHitsCountedPerPartition(t *testing.T) {
	db := openT(t, Options{InMemory: true, Registerer: prometheus.NewRegistry()})
	a, b := partitionT(t, db, "orders", 0), partitionT(t, db, "orders", 1)
	id := filter.PageID{Page: 1}
	for i, p := range []*PartitionState{a, b} {
		write(t, p, id, pageBytes(8, id, 1)) // a miss (a zero page), then dirty
		for range 3 + i {
			mustPage(t, p, id) // hits
		}
	}
	if got := counter(t, db.metrics.cacheHits); got != 7 {
		t.Errorf("hits of two open partitions = %v, want 3 + 4", got)
	}
	a.Close()
	mustPage(t, b, id)
	if got := counter(t, db.metrics.cacheHits); got != 8 {
		t.Errorf("hits after one partition closed = %v, want 3 (closed) + 5", got)
	}
}

// TestOpenAfterALargerMemtable: a memtable log written with a larger
// memtable (an older layout's, or a larger FlushBytes', left by a crash)
// is replayed into a memtable large enough for it: Open succeeds, where
// Badger would exit the process replaying it into the default one.
func TestOpenAfterALargerMemtable(t *testing.T) {
	dir := t.TempDir()
	db := openT(t, Options{Dir: dir, FlushBytes: 64 << 20, Logger: quiet})
	if db.memTable <= memTableBytes(0) {
		t.Fatalf("memtable %d, not above the least", db.memTable)
	}
	// 24 MiB of values under ValueThreshold, in the memtable log: more
	// than the least memtable holds.
	v := bytes.Repeat([]byte{7}, 1000)
	for batch := range 24 {
		err := db.bdb.Update(func(txn *badger.Txn) error {
			for i := range 1000 {
				if err := txn.Set(fmt.Appendf(nil, "zz-%02d-%04d", batch, i), v); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	// The directory as a crash leaves it: copied while open.
	crashed := copyDir(t, dir)
	db2, err := Open(Options{Dir: crashed, Logger: quiet})
	if err != nil {
		t.Fatalf("Open after a larger memtable: %v", err)
	}
	if db2.memTable < db.memTable {
		t.Errorf("memtable %d replaying a log of a %d-byte memtable", db2.memTable, db.memTable)
	}
	err = db2.bdb.View(func(txn *badger.Txn) error {
		_, err := txn.Get([]byte("zz-23-0999"))
		return err
	})
	if err != nil {
		t.Errorf("the last value of the memtable log: %v", err)
	}
	if err := db2.Close(); err != nil {
		t.Fatal(err)
	}
}
