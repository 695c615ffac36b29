package dedup

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kdedup/kdedup/filter"
	"github.com/kdedup/kdedup/store"
)

// image is a partition's state as store.DB.Export reads it.
type image struct {
	img   store.Image
	ids   []filter.PageID
	pages [][]byte
}

func exportImage(t *testing.T, db *store.DB, topic string, partition int32) image {
	t.Helper()
	var im image
	found, err := db.Export(store.TopicPartition{Topic: topic, Partition: partition}, func(img store.Image) error {
		im.img = img
		return nil
	}, func(id filter.PageID, b []byte) error {
		im.ids, im.pages = append(im.ids, id), append(im.pages, append([]byte{}, b...))
		return nil
	})
	if err != nil || !found {
		t.Fatalf("Export = %t, %v", found, err)
	}
	return im
}

func (im image) put(put func(filter.PageID, []byte) error) error {
	for i, id := range im.ids {
		if err := put(id, im.pages[i]); err != nil {
			return err
		}
	}
	return nil
}

// TestRestoreDecidesAsTheOriginal: a partition restored from another
// worker's snapshot, over a state of its own (a stale one, with staged
// changes pending), decides every later record exactly as the partition
// the snapshot was taken of, and as the exact key-set model; its
// checkpoint is the snapshot's. Both delivery modes' deduplicators
// (staged and not). A snapshot of other parameters is refused and the
// partition keeps its state.
func TestRestoreDecidesAsTheOriginal(t *testing.T) {
	const topic = "events"
	fp := filter.Params{FingerprintBits: 32, Capacity: 1024, PageBytes: 512}
	rec := func(i int, key string) *kgo.Record {
		return &kgo.Record{Topic: topic, Key: []byte(key), Value: []byte("v"), Offset: int64(i)}
	}
	key := func(i int) string { return fmt.Sprintf("user-%d", (i*7919)%6000) } // repeats after 6000
	for _, staged := range []bool{false, true} {
		t.Run(fmt.Sprintf("staged=%t", staged), func(t *testing.T) {
			opts := Options{Filter: fp, Staged: staged}
			commit := func(p *Deduplicator, off int) {
				t.Helper()
				if err := p.CommitStaged(); err != nil {
					t.Fatal(err)
				}
				if err := p.Commit(store.Checkpoint{Offset: int64(off), LeaderEpoch: 1}); err != nil {
					t.Fatal(err)
				}
			}
			seen := map[string]bool{}
			decide := func(p *Deduplicator, i int, check bool) {
				t.Helper()
				d, err := p.Decide(rec(i, key(i)))
				if err != nil {
					t.Fatal(err)
				}
				if check && p.Forwards(d) == seen[key(i)] {
					t.Fatalf("record %d (%s): forwarded %t, seen before %t", i, key(i), p.Forwards(d), seen[key(i)])
				}
				seen[key(i)] = true
			}
			dbA := openDB(t, "", store.Options{PageBytes: 512})
			a := openPartition(t, dbA, topic, 0, opts, nil)
			defer a.Close()
			for i := range 9000 {
				decide(a, i, true)
				if i%1000 == 999 {
					commit(a, i+1)
				}
			}
			im := exportImage(t, dbA, topic, 0)
			if im.img.Checkpoint.Offset != 9000 {
				t.Fatalf("image at %d, want 9000", im.img.Checkpoint.Offset)
			}

			dbB := openDB(t, "", store.Options{PageBytes: 512})
			b := openPartition(t, dbB, topic, 0, opts, nil)
			defer b.Close()
			for i := range 3000 { // a stale state of its own
				if _, err := b.Decide(rec(i, fmt.Sprintf("other-%d", i))); err != nil {
					t.Fatal(err)
				}
			}
			commit(b, 3000)
			if _, err := b.Decide(rec(3000, "pending")); err != nil { // uncommitted
				t.Fatal(err)
			}

			other := openPartition(t, openDB(t, "", store.Options{PageBytes: 512}), topic, 0, Options{Filter: filter.Params{FingerprintBits: 16, Capacity: 1024, PageBytes: 512}, Staged: staged}, nil)
			if err := other.Restore(im.img, im.put); !errors.Is(err, ErrSnapshotParams) || !errors.Is(err, filter.ErrParams) {
				t.Fatalf("Restore under other parameters = %v, want ErrSnapshotParams", err)
			}
			if _, ok := other.Checkpoint(); ok {
				t.Fatal("a refused snapshot left a checkpoint")
			}
			other.Close()
			// A snapshot of the previous format (6: a window's generations
			// as sub-filters of their own) is refused the same way: the
			// restore replays instead.
			old := im.img
			old.Meta = bytes.Clone(old.Meta)
			old.Meta[4] = filter.FormatVersion - 1
			body := old.Meta[:len(old.Meta)-4]
			binary.BigEndian.PutUint32(old.Meta[len(body):], crc32.Checksum(body, crc32.MakeTable(crc32.Castagnoli)))
			if err := b.Restore(old, im.put); !errors.Is(err, ErrSnapshotParams) || !errors.Is(err, filter.ErrParams) || !strings.Contains(err.Error(), fmt.Sprintf("stored format version %d", filter.FormatVersion-1)) {
				t.Fatalf("Restore of a format %d snapshot = %v, want ErrSnapshotParams naming the version", filter.FormatVersion-1, err)
			}

			if err := b.Restore(im.img, im.put); err != nil {
				t.Fatal(err)
			}
			if cp, ok := b.Checkpoint(); !ok || cp != im.img.Checkpoint {
				t.Fatalf("Checkpoint after Restore = %+v, %t; want %+v", cp, ok, im.img.Checkpoint)
			}
			for i := 9000; i < 15000; i++ {
				da, err := a.Decide(rec(i, key(i)))
				if err != nil {
					t.Fatal(err)
				}
				db, err := b.Decide(rec(i, key(i)))
				if err != nil {
					t.Fatal(err)
				}
				if da != db {
					t.Fatalf("record %d (%s): restored partition decided %v, original %v", i, key(i), db, da)
				}
				if a.Forwards(da) == seen[key(i)] {
					t.Fatalf("record %d (%s): forwarded %t, seen before %t", i, key(i), a.Forwards(da), seen[key(i)])
				}
				seen[key(i)] = true
				if i%1000 == 999 {
					commit(a, i+1)
					commit(b, i+1)
				}
			}
			if _, err := b.Decide(rec(15000, "other-5")); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestRestoreFailures: a snapshot whose pages fail part way (found
// damaged while it loads) leaves the partition with no state and a clean
// empty filter, no page of the partial image left to be read as
// fingerprints: it decides a stream like a new partition, and its next
// write batch is a state like any other. A snapshot of another page size
// is refused before anything changes: the local state and its filter
// stay.
func TestRestoreFailures(t *testing.T) {
	const topic = "events"
	fp := filter.Params{FingerprintBits: 8, Capacity: 4096, PageBytes: 512} // 8-bit: leftover pages would show as false drops
	opts := Options{Filter: fp, HashSeed: filter.Seed{K0: 3, K1: 4}}
	rec := func(i int, key string) *kgo.Record {
		return &kgo.Record{Topic: topic, Key: []byte(key), Value: []byte("v"), Offset: int64(i)}
	}
	dbA := openDB(t, "", store.Options{PageBytes: 512})
	a := openPartition(t, dbA, topic, 0, Options{Filter: fp, HashSeed: filter.Seed{K0: 9, K1: 9}}, nil)
	defer a.Close()
	for i := range 20_000 {
		if _, err := a.Decide(rec(i, fmt.Sprintf("a-%d", i))); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.Commit(store.Checkpoint{Offset: 20_000}); err != nil {
		t.Fatal(err)
	}
	im := exportImage(t, dbA, topic, 0)

	dbB := openDB(t, "", store.Options{PageBytes: 512})
	b := openPartition(t, dbB, topic, 0, opts, nil)
	for i := range 1000 {
		if _, err := b.Decide(rec(i, fmt.Sprintf("b-%d", i))); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Commit(store.Checkpoint{Offset: 1000}); err != nil {
		t.Fatal(err)
	}

	other := im
	other.img.PageBytes = 1024
	if err := b.Restore(other.img, other.put); !errors.Is(err, ErrSnapshotParams) {
		t.Fatalf("Restore of 1024-byte pages into 512: %v, want ErrSnapshotParams", err)
	}
	if cp, ok := b.Checkpoint(); !ok || cp.Offset != 1000 {
		t.Fatalf("after a refused snapshot: checkpoint %+v, %t; want 1000", cp, ok)
	}
	if d, err := b.Decide(rec(1000, "b-5")); err != nil || b.Forwards(d) {
		t.Fatalf("after a refused snapshot b-5 decided %v, %v: the local filter is gone", d, err)
	}

	damaged := errors.New("damaged at the end")
	err := b.Restore(im.img, func(put func(filter.PageID, []byte) error) error {
		if err := im.put(put); err != nil {
			return err
		}
		return damaged // every page written, then found wrong
	})
	if !errors.Is(err, damaged) {
		t.Fatalf("Restore = %v, want the pages' error", err)
	}
	if _, ok := b.Checkpoint(); ok {
		t.Fatal("a checkpoint after a failed restore")
	}
	// A new partition with this seed, as the model of what b must decide.
	fresh := openPartition(t, openDB(t, "", store.Options{PageBytes: 512}), topic, 0, opts, nil)
	defer fresh.Close()
	for i := range 20_000 {
		k := fmt.Sprintf("a-%d", i) // the damaged snapshot's keys
		db, err := b.Decide(rec(i, k))
		if err != nil {
			t.Fatal(err)
		}
		df, err := fresh.Decide(rec(i, k))
		if err != nil {
			t.Fatal(err)
		}
		if db != df {
			t.Fatalf("record %d (%s): decided %v after a failed restore, a new partition %v", i, k, db, df)
		}
	}
	if err := b.Commit(store.Checkpoint{Offset: 20_000}); err != nil {
		t.Fatal(err)
	}
	if found, err := dbB.Export(store.TopicPartition{Topic: topic}, func(store.Image) error { return nil }, func(filter.PageID, []byte) error { return nil }); err != nil || !found {
		t.Fatalf("Export after the next write batch = %t, %v; want the state", found, err)
	}
	b.Close()
	b = openPartition(t, dbB, topic, 0, opts, nil)
	defer b.Close()
	if cp, ok := b.Checkpoint(); !ok || cp.Offset != 20_000 {
		t.Fatalf("reopened: checkpoint %+v, %t; want 20000", cp, ok)
	}
}
