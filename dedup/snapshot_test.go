package dedup

import (
	"errors"
	"fmt"
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
