package store

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// fakeDisk is a statfs stub whose free space the test sets.
type fakeDisk struct{ free atomic.Int64 }

func (d *fakeDisk) freeBytes(string) (uint64, error) { return uint64(d.free.Load()), nil }

func TestDiskFullCommit(t *testing.T) {
	const pb = 4096
	dir := t.TempDir()
	disk := &fakeDisk{}
	disk.free.Store(1 << 40)
	opts := Options{Dir: dir, PageBytes: pb, FlushBytes: 1 << 20, Logger: quiet}
	db, err := open(opts, tuning{gcInterval: gcInterval, freeBytes: disk.freeBytes})
	if err != nil {
		t.Fatal(err)
	}
	p, err := db.Partition("orders", 0)
	if err != nil {
		t.Fatal(err)
	}
	m := newModel(pb)
	ids := universe(2, 64)
	writeAll := func(stamp uint64) {
		for _, id := range ids {
			c := pageBytes(pb, id, stamp)
			write(t, p, id, c)
			m.dirty[id] = c
		}
	}
	writeAll(1)
	if err := p.Commit([]byte("batch 1"), Checkpoint{Offset: 100}); err != nil {
		t.Fatal(err)
	}
	m.commit([]byte("batch 1"), Checkpoint{Offset: 100})

	need := db.requiredFreeBytes()
	// The batch and two memtable flushes: 3 x 1 MiB batches, 2 x 64 MiB.
	if min := 3*db.batchSize + 2*minMemTableBytes; need < min {
		t.Fatalf("required free space %d, want at least %d", need, min)
	}
	writeAll(2)
	disk.free.Store(need - 1)
	err = p.Commit([]byte("batch 2"), Checkpoint{Offset: 200})
	if !errors.Is(err, ErrDiskFull) {
		t.Fatalf("Commit with %d bytes free of %d needed: %v, want ErrDiskFull", need-1, need, err)
	}
	for _, s := range []string{dir, fmt.Sprintf("%d bytes free, %d needed", need-1, need), "orders/0"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not say %q", err, s)
		}
	}
	// In memory nothing changed: the pages are still dirty, the metadata
	// and checkpoint those of batch 1.
	m.check(t, p, ids)
	if got, want := p.DirtyBytes(), int64(len(ids)*pb); got != want {
		t.Errorf("DirtyBytes after the refused Commit = %d, want %d", got, want)
	}

	// With exactly the space needed the same batch commits.
	disk.free.Store(need)
	if err := p.Commit([]byte("batch 2"), Checkpoint{Offset: 200}); err != nil {
		t.Fatalf("Commit with exactly the space needed: %v", err)
	}
	m.commit([]byte("batch 2"), Checkpoint{Offset: 200})

	// A refused batch never reaches Badger: on disk, batch 2 and not 3.
	writeAll(3)
	disk.free.Store(0)
	if err := p.Commit([]byte("batch 3"), Checkpoint{Offset: 300}); !errors.Is(err, ErrDiskFull) {
		t.Fatalf("Commit with no space: %v, want ErrDiskFull", err)
	}
	p.Close()
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	clear(m.dirty)
	db = openT(t, opts)
	m.check(t, partitionT(t, db, "orders", 0), ids)
}

func TestDiskFullOpen(t *testing.T) {
	disk := &fakeDisk{}
	dir := t.TempDir() + "/state" // created by Open: the check asks the parent
	opts := Options{Dir: dir, Logger: quiet}
	db, err := open(opts, tuning{gcInterval: gcInterval, freeBytes: disk.freeBytes})
	if err == nil {
		db.Close()
		t.Fatal("Open with no free space succeeded")
	}
	if !errors.Is(err, ErrDiskFull) || !strings.Contains(err.Error(), dir) || !strings.Contains(err.Error(), "0 bytes free") {
		t.Fatalf("Open with no free space: %v, want ErrDiskFull naming %s and the free bytes", err, dir)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the refused Open created %s (stat: %v)", dir, err)
	}

	disk.free.Store(1 << 40)
	db = openTuned(t, opts, tuning{gcInterval: gcInterval, freeBytes: disk.freeBytes})
	p := partitionT(t, db, "orders", 0)
	if err := p.Commit(nil, Checkpoint{Offset: 1}); err != nil {
		t.Fatal(err)
	}
	p.Close()
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	// A reader writes nothing and needs no space.
	disk.free.Store(0)
	ro := openTuned(t, Options{Dir: dir, ReadOnly: true}, tuning{gcInterval: gcInterval, freeBytes: disk.freeBytes})
	if tps, err := ro.Partitions(); err != nil || len(tps) != 1 {
		t.Errorf("read-only Partitions with no free space: %v, %v", tps, err)
	}
}

func TestFreeSpaceMetrics(t *testing.T) {
	disk := &fakeDisk{}
	disk.free.Store(1 << 40)
	reg := prometheus.NewRegistry()
	db := openTuned(t, Options{Dir: t.TempDir(), Registerer: reg}, tuning{gcInterval: gcInterval, freeBytes: disk.freeBytes})
	disk.free.Store(123 << 20)
	gauges := map[string]float64{}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if strings.HasSuffix(f.GetName(), "free_bytes") {
			gauges[f.GetName()] = f.GetMetric()[0].GetGauge().GetValue()
		}
	}
	want := map[string]float64{
		"kdedup_store_free_bytes":          123 << 20,
		"kdedup_store_required_free_bytes": float64(db.requiredFreeBytes()),
	}
	if fmt.Sprint(gauges) != fmt.Sprint(want) {
		t.Errorf("gauges %v, want %v", gauges, want)
	}
}

func TestCompactionBytes(t *testing.T) {
	for _, tt := range []struct {
		levels []int64
		want   int64
	}{
		{nil, 0},
		{[]int64{0, 0, 0}, 0},
		{[]int64{64, 0, 0, 0, 0, 0, 0}, 64},
		{[]int64{64, 0, 0, 0, 0, 0, 500}, 564},
		{[]int64{128, 0, 0, 0, 20, 200, 2000}, 148},
	} {
		if got := compactionBytes(tt.levels); got != tt.want {
			t.Errorf("compactionBytes(%v) = %d, want %d", tt.levels, got, tt.want)
		}
	}
}

// TestDiskFullTmpfs fills a real filesystem: write batches go on until
// Commit refuses with ErrDiskFull, the process never dies of a SIGBUS in
// Badger's memory maps, Close succeeds, and once the filesystem has room
// again the state is that of the last committed write batch. It needs to
// mount a tmpfs (root); TestDiskFullCommit, with a statfs stub, always runs.
func TestDiskFullTmpfs(t *testing.T) {
	mnt := t.TempDir()
	const size = 200 << 20 // above the 154 MiB Open needs at the defaults
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", fmt.Sprintf("size=%d", size), "tmpfs", mnt).CombinedOutput(); err != nil {
		t.Skipf("mounting a %d-byte tmpfs was refused (needs root): %v: %s", size, err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", mnt).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", mnt, err, out)
		}
	})
	const pb = 4096
	opts := Options{Dir: mnt + "/state", PageBytes: pb, Logger: quiet}
	db, err := Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	p, err := db.Partition("orders", 0)
	if err != nil {
		t.Fatal(err)
	}
	m := newModel(pb)
	ids := universe(4, 1024) // 16 MiB of distinct pages
	var refused error
	batch := 0
	for batch = 1; batch <= 100 && refused == nil; batch++ {
		for i := range 512 { // 2 MiB per write batch
			id := ids[(batch*512+i)%len(ids)]
			c := pageBytes(pb, id, uint64(batch))
			write(t, p, id, c)
			m.dirty[id] = c
		}
		meta, cp := []byte(fmt.Sprint("batch ", batch)), Checkpoint{Offset: int64(batch)}
		if refused = p.Commit(meta, cp); refused == nil {
			m.commit(meta, cp)
		}
	}
	if !errors.Is(refused, ErrDiskFull) {
		t.Fatalf("after %d write batches of 2 MiB on a %d-byte tmpfs: %v, want ErrDiskFull", batch-1, size, refused)
	}
	t.Logf("batch %d refused: %v", batch-1, refused)
	m.check(t, p, ids)
	p.Close()
	if err := db.Close(); err != nil {
		t.Fatalf("Close after ErrDiskFull: %v", err)
	}
	if _, err := Open(opts); !errors.Is(err, ErrDiskFull) {
		t.Fatalf("reopening the full filesystem: %v, want ErrDiskFull", err)
	}

	if out, err := exec.Command("mount", "-o", fmt.Sprintf("remount,size=%d", 2*size), mnt).CombinedOutput(); err != nil {
		t.Fatalf("growing the tmpfs: %v: %s", err, out)
	}
	db = openT(t, opts)
	clear(m.dirty)
	m.check(t, partitionT(t, db, "orders", 0), ids)
}

func TestCheckSpaceBounds(t *testing.T) {
	db := &DB{where: "d", batchSize: 1, memTable: 1}
	for _, tt := range []struct {
		free uint64
		need int64
		ok   bool
	}{
		{0, 0, true},
		{0, 1, false},
		{99, 100, false},
		{100, 100, true},
		{1<<64 - 1, 1 << 40, true}, // no statfs (not Linux): unlimited
	} {
		if err := db.checkSpace(tt.free, tt.need); (err == nil) != tt.ok || (err != nil && !errors.Is(err, ErrDiskFull)) {
			t.Errorf("checkSpace(%d free, %d needed) = %v, want ok %t", tt.free, tt.need, err, tt.ok)
		}
	}
}
