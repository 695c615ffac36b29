//go:build unix

package snapshot

import (
	"context"
	"errors"
	"io/fs"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/kdedup/kdedup/filter"
	"github.com/kdedup/kdedup/store"
)

// pipedObject replaces the data object at path by a FIFO that a goroutine
// feeds as a store would stream it: head, then mid() (if not nil), then
// tail, in 64 KiB writes, until the reader closes its end. wait returns
// the bytes written after head, once the feeder has stopped.
func pipedObject(t *testing.T, path string, head []byte, mid func(), tail []byte) (wait func() int) {
	t.Helper()
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(path, 0o644); err != nil {
		t.Skipf("no FIFO: %v", err)
	}
	done := make(chan int, 1)
	go func() {
		f, err := os.OpenFile(path, os.O_WRONLY, 0) // until the reader opens
		if err != nil {
			done <- -1
			return
		}
		defer f.Close()
		write := func(b []byte) (int, bool) {
			n := 0
			for len(b) > 0 {
				k, err := f.Write(b[:min(len(b), 64<<10)])
				n += k
				if err != nil {
					return n, false // the reader went away: EPIPE
				}
				b = b[k:]
			}
			return n, true
		}
		if _, ok := write(head); !ok {
			done <- 0
			return
		}
		if mid != nil {
			mid()
		}
		n, _ := write(tail)
		done <- n
	}()
	return func() int { return <-done }
}

// TestFetchLimitsDownload serves a snapshot's object followed by 32 MiB
// more (a store object longer than its manifest says): Fetch refuses it as
// ErrCorrupt having read no more than the manifest's size and a buffer,
// and leaves no file.
func TestFetchLimitsDownload(t *testing.T) {
	st, dir := openStore(t)
	ctx := context.Background()
	m, err := st.Put(ctx, tp, newSource(6, 300, 40).export)
	if err != nil {
		t.Fatal(err)
	}
	obj := filepath.Join(dir, filepath.FromSlash(m.Object))
	good, err := os.ReadFile(obj)
	if err != nil {
		t.Fatal(err)
	}
	wait := pipedObject(t, obj, good, nil, make([]byte, 32<<20))
	local := t.TempDir()
	_, err = st.Fetch(ctx, m, local)
	extra := wait()
	if !errors.Is(err, ErrCorrupt) {
		t.Fatalf("Fetch of an object longer than its manifest = %v, want ErrCorrupt", err)
	}
	// The pipe's buffer and one write may be taken past what Fetch reads.
	if extra > 2<<20 {
		t.Fatalf("Fetch read %d bytes past the manifest's %d", extra, m.Bytes)
	}
	if left, _ := os.ReadDir(local); len(left) != 0 {
		t.Fatalf("files left after a refused fetch: %v", left)
	}
}

// TestListBoundsManifestReads serves a manifest that the store lists as
// empty and streams without end (as a FIFO does): List reads no more than
// maxManifestBytes of it and skips it as ErrCorrupt.
func TestListBoundsManifestReads(t *testing.T) {
	st, dir := openStore(t)
	m, err := st.Put(context.Background(), tp, newSource(8, 3, 40).export)
	if err != nil {
		t.Fatal(err)
	}
	key := filepath.Join(dir, "events", "2", "manifest", "00000000000000000041-x.json")
	if err := os.WriteFile(key, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	wait := pipedObject(t, key, []byte(`{"format":1,`), nil, make([]byte, 8<<20))
	ms, skipped, err := st.List(context.Background(), tp)
	extra := wait()
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != 1 || ms[0].Key() != m.Key() || len(skipped) != 1 || !errors.Is(skipped[0], ErrCorrupt) {
		t.Fatalf("List = %v, skipped %v; want %s and the endless manifest skipped as ErrCorrupt", ms, skipped, m.Key())
	}
	if extra > 1<<20 {
		t.Fatalf("List read %d bytes of a manifest", extra)
	}
}

// TestTransfersStopWhenCancelled cancels transfers with a directory store
// (whose driver ignores contexts while data flows) in the middle: each
// returns context.Canceled within a buffer of the cancellation, not at
// the end of the object, and leaves neither a manifest nor a file.
func TestTransfersStopWhenCancelled(t *testing.T) {
	t.Run("upload", func(t *testing.T) {
		st, dir := openStore(t)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		const pageBytes, pages, cancelAt = 4096, 4000, 100
		rng := rand.New(rand.NewPCG(1, 1))
		data := make([]byte, pageBytes) // incompressible, so that blocks reach the store
		after := 0
		_, err := st.Put(ctx, tp, func(h func(store.Image) error, pg func(filter.PageID, []byte) error) (bool, error) {
			if err := h(store.Image{Meta: []byte("m"), Checkpoint: store.Checkpoint{Offset: 9}, PageBytes: pageBytes}); err != nil {
				return true, err
			}
			for i := range pages {
				if i == cancelAt {
					cancel()
				}
				if i >= cancelAt {
					after++
				}
				for j := range data {
					data[j] = byte(rng.Uint32())
				}
				// Like store.DB.Export, the source does not watch ctx:
				// only an error from pg stops it.
				if err := pg(filter.PageID{Page: uint32(i)}, data); err != nil {
					return true, err
				}
			}
			return true, nil
		})
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Put cancelled at page %d = %v, want context.Canceled", cancelAt, err)
		}
		// A zstd block is 64 KiB: 16 pages, then one write to the store.
		if after > 64 {
			t.Fatalf("Put took %d pages after its context ended, want at most a block's", after)
		}
		if files := regularFiles(t, dir); len(files) != 0 {
			t.Fatalf("files left by a cancelled upload: %v", files)
		}
	})
	for _, op := range []string{"fetch", "load"} {
		t.Run(op, func(t *testing.T) {
			st, dir := openStore(t)
			m, err := st.Put(context.Background(), tp, newSource(7, 1000, 40).export)
			if err != nil {
				t.Fatal(err)
			}
			obj := filepath.Join(dir, filepath.FromSlash(m.Object))
			good, err := os.ReadFile(obj)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			// Cancelled after the first 128 KiB; then the rest of the
			// object and 32 MiB more, all of which a download that
			// ignored ctx would read.
			tail := append(append([]byte{}, good[128<<10:]...), make([]byte, 32<<20)...)
			wait := pipedObject(t, obj, good[:128<<10], cancel, tail)
			local := t.TempDir()
			switch op {
			case "fetch":
				_, err = st.Fetch(ctx, m, local)
			case "load":
				_, err = loadCtx(ctx, st, m)
			}
			extra := wait()
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("%s cancelled part way = %v, want context.Canceled", op, err)
			}
			if extra > 2<<20 {
				t.Fatalf("%s read %d bytes after its context ended", op, extra)
			}
			if left, _ := os.ReadDir(local); len(left) != 0 {
				t.Fatalf("files left after a cancelled %s: %v", op, left)
			}
		})
	}
}

func regularFiles(t *testing.T, dir string) []string {
	t.Helper()
	var files []string
	if err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			files = append(files, p)
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return files
}

// TestRestoreBytes: the object and the pages, saturating rather than
// overflowing or going negative for a manifest no restore would accept.
func TestRestoreBytes(t *testing.T) {
	for _, tc := range []struct {
		m    Manifest
		want int64
	}{
		{Manifest{Bytes: 1000, Pages: 10, PageBytes: 4096}, 1000 + 40960},
		{Manifest{Bytes: 0, Pages: 0, PageBytes: 4096}, 0},
		{Manifest{Bytes: 7, Pages: 3, PageBytes: 0}, 7},
		{Manifest{Bytes: 1, Pages: math.MaxInt64 / 2, PageBytes: 4}, math.MaxInt64},
		{Manifest{Bytes: math.MaxInt64, Pages: 1, PageBytes: 1}, math.MaxInt64},
		{Manifest{Bytes: -1, Pages: 1, PageBytes: 1}, math.MaxInt64},
		{Manifest{Bytes: 1, Pages: -5, PageBytes: 4096}, math.MaxInt64},
		{Manifest{Bytes: 1, Pages: 5, PageBytes: -4096}, math.MaxInt64},
	} {
		if got := tc.m.RestoreBytes(); got != tc.want {
			t.Errorf("%+v.RestoreBytes() = %d, want %d", tc.m, got, tc.want)
		}
	}
}
