package store

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sync"
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

// TestConcurrentRestoresTmpfs: four restores at once on a real, small
// filesystem (a tmpfs sized so that two fit beside the write batches'
// reserve): each reserves its download and state, writes its "download"
// and imports an image, as the consumer's restore does. Those that do not
// fit are refused (ErrDiskFull) by their reservation, before writing
// anything; those that fit import exactly their image, none refused
// halfway; the process never dies of a SIGBUS and every
// write batch after them still finds its reserve. It needs to mount a
// tmpfs (root), as TestDiskFullTmpfs does.
func TestConcurrentRestoresTmpfs(t *testing.T) {
	mnt := t.TempDir()
	const size = 64 << 20 // two restores fit, and their imports (the memtable of 16 MiB) are not flushed meanwhile
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", fmt.Sprintf("size=%d", size), "tmpfs", mnt).CombinedOutput(); err != nil {
		t.Skipf("mounting a %d-byte tmpfs was refused (needs root): %v: %s", size, err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", mnt).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", mnt, err, out)
		}
	})
	const pb = 4096
	db, err := Open(Options{Dir: mnt + "/state", PageBytes: pb, FlushBytes: 1 << 20, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	free, err := db.tuning.freeBytes(db.opts.Dir)
	if err != nil {
		t.Fatal(err)
	}
	// Room for two restores of a download and a state of imageBytes each.
	avail := int64(free) - db.requiredFreeBytes()
	pages := int(avail / 5 / pb)
	imageBytes := int64(pages) * pb
	if pages < 256 {
		t.Fatalf("%d bytes free beyond the %d write batches need: too few for the test", avail, db.requiredFreeBytes())
	}
	images := make([]exported, 4)
	for i := range images {
		images[i] = exported{img: Image{Meta: chainMeta(pb, int64(i), uint64(pages), 0), Checkpoint: Checkpoint{Offset: int64(100 + i)}, PageBytes: pb},
			pages: map[filter.PageID][]byte{}}
		for pg := range pages {
			id := filter.PageID{Page: uint32(pg)}
			images[i].pages[id] = pageBytes(pb, id, uint64(i+1))
		}
	}
	parts := make([]*PartitionState, len(images))
	for i := range parts {
		if parts[i], err = db.Partition("orders", int32(i)); err != nil {
			t.Fatal(err)
		}
	}
	errs := make([]error, len(images))
	atReserve := make([]bool, len(images))
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range images {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			r, err := parts[i].ReserveSpace(2 * imageBytes)
			if err != nil {
				errs[i], atReserve[i] = err, true
				return
			}
			defer r.Release()
			dl := fmt.Sprintf("%s/state/download-%d", mnt, i)
			if err := os.WriteFile(dl, make([]byte, imageBytes), 0o600); err != nil {
				errs[i] = err
				return
			}
			defer os.Remove(dl)
			errs[i] = parts[i].Import(images[i].img, images[i].put)
		}()
	}
	close(start)
	wg.Wait()
	imported, refused := 0, 0
	for i, err := range errs {
		switch {
		case err == nil:
			imported++
			cp, ok := parts[i].Checkpoint()
			if !ok || cp != images[i].img.Checkpoint {
				t.Errorf("partition %d imported: checkpoint %v %t, want %v", i, cp, ok, images[i].img.Checkpoint)
			}
			for id, want := range images[i].pages {
				if got := mustPage(t, parts[i], id); string(got) != string(want) {
					t.Fatalf("partition %d: %v is not the image's", i, id)
				}
			}
		case errors.Is(err, ErrDiskFull) && atReserve[i]:
			refused++
			if _, ok := parts[i].Checkpoint(); ok {
				t.Errorf("partition %d: refused, yet it has a state", i)
			}
		default:
			t.Errorf("partition %d: %v", i, err)
		}
	}
	for i, err := range errs {
		t.Logf("restore %d: %v", i, err)
	}
	if imported < 1 || refused < 1 || imported+refused != len(images) {
		t.Fatalf("%d imported, %d refused of %d restores with room for 2 at once; want some of each", imported, refused, len(images))
	}
	t.Logf("%d restores of %d bytes each imported, %d refused on a %d-byte tmpfs", imported, 2*imageBytes, refused, size)
	// A write batch after them still finds its reserve.
	write(t, parts[0], filter.PageID{Page: 1}, pageBytes(pb, filter.PageID{Page: 1}, 9))
	if err := parts[0].Commit(chainMeta(pb, 9, uint64(pages), 0), Checkpoint{Offset: 1000}); err != nil && !errors.Is(err, ErrDiskFull) {
		t.Fatalf("a write batch after the restores: %v", err)
	}
}
