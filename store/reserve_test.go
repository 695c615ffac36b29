package store

import (
	"errors"
	"testing"

	"github.com/kdedup/kdedup/filter"
)

// TestReserveSpace: restores running at once reserve their bytes of the
// free space; one that does not fit beside the others' reservations and
// the write batches' reserve is refused (ErrDiskFull) before anything is
// written, a released reservation frees its bytes, write batches of other
// partitions see reserved bytes as taken, and an Import stops with
// ErrDiskFull (leaving no state) when the free space falls below what its
// reservation left for write batches while it writes.
func TestReserveSpace(t *testing.T) {
	const pb = 4096
	disk := &fakeDisk{}
	disk.free.Store(1 << 40)
	db, err := open(Options{Dir: t.TempDir(), PageBytes: pb, FlushBytes: 1 << 20, Logger: quiet}, tuning{gcInterval: gcInterval, freeBytes: disk.freeBytes})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	need := db.requiredFreeBytes()
	const restore = 100 << 20
	disk.free.Store(need + 2*restore + restore/2) // room for two restores, not three

	a, err := db.ReserveSpace(restore)
	if err != nil {
		t.Fatal(err)
	}
	b, err := db.ReserveSpace(restore)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.ReserveSpace(restore); !errors.Is(err, ErrDiskFull) {
		t.Fatalf("a third restore of %d bytes with %d free for two: %v, want ErrDiskFull", restore, disk.free.Load(), err)
	}
	// Another partition's write batch needs `need` bytes: with half a
	// restore's bytes unreserved, it is refused until a reservation goes.
	p, err := db.Partition("orders", 0)
	if err != nil {
		t.Fatal(err)
	}
	write(t, p, filter.PageID{}, pageBytes(pb, filter.PageID{}, 1))
	disk.free.Store(need + 2*restore - 1)
	if err := p.Commit([]byte("m"), Checkpoint{Offset: 1}); !errors.Is(err, ErrDiskFull) {
		t.Fatalf("a write batch into space reserved for restores: %v, want ErrDiskFull", err)
	}
	a.Release()
	a.Release() // once only
	if err := p.Commit([]byte("m"), Checkpoint{Offset: 1}); err != nil {
		t.Fatalf("a write batch once a reservation was released: %v", err)
	}
	if c, err := db.ReserveSpace(restore / 2); err != nil {
		t.Fatalf("a restore of half the bytes after a release: %v", err)
	} else {
		c.Release()
	}
	b.Release()

	// An Import within its reservation: the volume fills under it.
	q, err := db.Partition("orders", 1)
	if err != nil {
		t.Fatal(err)
	}
	disk.free.Store(need + restore)
	if _, err := q.ReserveSpace(restore); err != nil {
		t.Fatal(err)
	}
	src := &exported{img: Image{Meta: chainMeta(pb, 1, 3*importSpaceCheckPages, 0), Checkpoint: Checkpoint{Offset: 9}, PageBytes: pb}, pages: map[filter.PageID][]byte{}}
	for i := range 3 * importSpaceCheckPages {
		id := filter.PageID{Page: uint32(i)}
		src.pages[id] = pageBytes(pb, id, 2)
	}
	written := 0
	var first filter.PageID
	err = q.Import(src.img, func(put func(filter.PageID, []byte) error) error {
		return src.put(func(id filter.PageID, data []byte) error {
			if written == 0 {
				first = id
			}
			if written++; written == importSpaceCheckPages {
				disk.free.Store(need - 1) // something else filled the volume
			}
			return put(id, data)
		})
	})
	if !errors.Is(err, ErrDiskFull) {
		t.Fatalf("Import onto a volume that filled under it: %v, want ErrDiskFull", err)
	}
	if written >= 2*importSpaceCheckPages {
		t.Errorf("Import wrote %d pages after the volume filled, want it stopped within %d", written-importSpaceCheckPages, importSpaceCheckPages)
	}
	if _, ok := q.Checkpoint(); ok {
		t.Error("a failed Import left a state")
	}
	// The pages it warmed into the page cache as it wrote are gone too.
	if b := mustPage(t, q, first); string(b) != string(make([]byte, pb)) {
		t.Error("a page of the failed Import is still in the page cache")
	}
	q.Close() // releases the reservation
	disk.free.Store(need + restore)
	if r, err := db.ReserveSpace(restore); err != nil {
		t.Fatalf("Close did not release the partition's reservation: %v", err)
	} else {
		r.Release()
	}
}
