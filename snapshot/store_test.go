package snapshot

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"gocloud.dev/blob"

	"github.com/kdedup/kdedup/filter"
	"github.com/kdedup/kdedup/internal/s3test"
	"github.com/kdedup/kdedup/store"
)

const pb = 512

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// source is an exact model of a partition's state, exportable like
// store.DB.Export.
type source struct {
	img   store.Image
	pages map[filter.PageID][]byte
	order []filter.PageID
}

func newSource(seed uint64, n int, offset int64) *source {
	rng := rand.New(rand.NewPCG(seed, seed))
	s := &source{img: store.Image{Meta: sourceMeta(seed, n), Checkpoint: store.Checkpoint{Offset: offset, LeaderEpoch: 3}, PageBytes: pb},
		pages: map[filter.PageID][]byte{}}
	for i := range n {
		id := filter.PageID{SubFilter: uint32(i / 64), Page: uint32(i % 64)}
		b := make([]byte, pb)
		for j := range b[:pb/2] { // half empty, like a part-full page
			b[j] = byte(rng.Uint32())
		}
		s.pages[id] = b
		s.order = append(s.order, id)
	}
	return s
}

// sourceMeta is the chain metadata of newSource's pages: sub-filters of
// 64 pages, as many as n pages fill; seed is its watermark, so that the
// metadata of different sources differ.
func sourceMeta(seed uint64, n int) []byte {
	m := filter.Meta{FormatVersion: filter.FormatVersion, HashID: filter.HashSipHash24,
		Params: filter.Params{FingerprintBits: 16, PageBytes: pb}.WithDefaults(), Watermark: int64(seed), Seed: filter.Seed{K0: seed, K1: 1}}
	for id := range uint32((n + 63) / 64) {
		m.SubFilters = append(m.SubFilters, filter.SubFilter{ID: id, Pages: 64, FingerprintBits: 16})
		m.NextID = id + 1
	}
	return m.Marshal()
}

func (s *source) export(header func(store.Image) error, page func(filter.PageID, []byte) error) (bool, error) {
	if err := header(s.img); err != nil {
		return true, err
	}
	for _, id := range s.order {
		if err := page(id, s.pages[id]); err != nil {
			return true, err
		}
	}
	return true, nil
}

// load reads m back into a model.
func load(st *Store, m Manifest) (*source, error) {
	return loadCtx(context.Background(), st, m)
}

func loadCtx(ctx context.Context, st *Store, m Manifest) (*source, error) {
	got := &source{pages: map[filter.PageID][]byte{}}
	err := st.Load(ctx, m, func(img store.Image, pages func(func(filter.PageID, []byte) error) error) error {
		got.img = img
		return pages(func(id filter.PageID, b []byte) error {
			if _, dup := got.pages[id]; dup {
				return fmt.Errorf("%v twice", id)
			}
			got.pages[id] = append([]byte{}, b...)
			return nil
		})
	})
	return got, err
}

func (s *source) equal(o *source) error {
	if !bytes.Equal(s.img.Meta, o.img.Meta) || s.img.Checkpoint != o.img.Checkpoint || s.img.PageBytes != o.img.PageBytes {
		return fmt.Errorf("header %+v, want %+v", o.img, s.img)
	}
	if len(s.pages) != len(o.pages) {
		return fmt.Errorf("%d pages, want %d", len(o.pages), len(s.pages))
	}
	for id, b := range s.pages {
		if !bytes.Equal(o.pages[id], b) {
			return fmt.Errorf("%v differs", id)
		}
	}
	return nil
}

func openStore(t *testing.T) (*Store, string) {
	t.Helper()
	dir := t.TempDir()
	st, err := Open(context.Background(), "file://"+dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st, dir
}

var tp = store.TopicPartition{Topic: "events", Partition: 2}

// TestPutLoad uploads snapshots and reads them back equal, and lists them
// newest first.
func TestPutLoad(t *testing.T) {
	st, _ := openStore(t)
	ctx := context.Background()
	var srcs []*source
	for i, off := range []int64{500, 100, 900} {
		src := newSource(uint64(i), 300, off)
		srcs = append(srcs, src)
		m, err := st.Put(ctx, tp, src.export)
		if err != nil {
			t.Fatal(err)
		}
		if m.Pages != 300 || m.Offset != off || m.StateBytes() != 300*pb {
			t.Fatalf("manifest %+v", m)
		}
		if m.Bytes >= m.StateBytes()*3/4 {
			t.Errorf("object of %d bytes for %d bytes of half-empty pages: not compressed", m.Bytes, m.StateBytes())
		}
	}
	other := store.TopicPartition{Topic: "events", Partition: 20}
	if _, err := st.Put(ctx, other, newSource(9, 10, 10_000).export); err != nil {
		t.Fatal(err)
	}
	ms, skipped, err := st.List(ctx, tp)
	if err != nil || len(skipped) != 0 {
		t.Fatal(err, skipped)
	}
	if len(ms) != 3 || ms[0].Offset != 900 || ms[1].Offset != 500 || ms[2].Offset != 100 {
		t.Fatalf("List = %+v, want offsets 900, 500, 100", ms)
	}
	for i, want := range []*source{srcs[2], srcs[0], srcs[1]} {
		got, err := load(st, ms[i])
		if err != nil {
			t.Fatal(err)
		}
		if err := want.equal(got); err != nil {
			t.Fatalf("snapshot at %d: %v", ms[i].Offset, err)
		}
	}
	if _, err := st.Put(ctx, tp, func(func(store.Image) error, func(filter.PageID, []byte) error) (bool, error) { return false, nil }); !errors.Is(err, ErrNoState) {
		t.Fatalf("Put of no state = %v, want ErrNoState", err)
	}
}

// TestLoadRefusesDamage damages a snapshot's object in every way the
// store can (a flipped byte anywhere, truncation, a missing object, the
// object of another snapshot) and requires ErrCorrupt from Load each
// time, however many pages it handed over first.
func TestLoadRefusesDamage(t *testing.T) {
	st, dir := openStore(t)
	ctx := context.Background()
	src := newSource(1, 200, 700)
	m, err := st.Put(ctx, tp, src.export)
	if err != nil {
		t.Fatal(err)
	}
	m2, err := st.Put(ctx, tp, newSource(2, 200, 700).export)
	if err != nil {
		t.Fatal(err)
	}
	obj := filepath.Join(dir, filepath.FromSlash(m.Object))
	good, err := os.ReadFile(obj)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := load(st, m); err != nil || src.equal(got) != nil {
		t.Fatalf("undamaged: %v", err)
	}
	damage := map[string][]byte{"truncated": good[:len(good)-7], "empty": nil}
	for _, at := range []int{0, 10, len(good) / 2, len(good) - 1} {
		b := bytes.Clone(good)
		b[at] ^= 0x40
		damage[fmt.Sprintf("byte %d flipped", at)] = b
	}
	other, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(m2.Object)))
	if err != nil {
		t.Fatal(err)
	}
	damage["another snapshot's object"] = other
	for name, b := range damage {
		if err := os.WriteFile(obj, b, 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := load(st, m); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: Load = %v, want ErrCorrupt", name, err)
		}
	}
	if err := os.Remove(obj); err != nil {
		t.Fatal(err)
	}
	if _, err := load(st, m); !errors.Is(err, ErrCorrupt) {
		t.Errorf("missing object: Load = %v, want ErrCorrupt", err)
	}
}

// TestListSkipsBadManifests: a manifest that does not parse, names
// another topic-partition's object, or is larger than maxManifestBytes
// (however valid) is skipped and reported as ErrCorrupt.
func TestListSkipsBadManifests(t *testing.T) {
	st, dir := openStore(t)
	ctx := context.Background()
	m, err := st.Put(ctx, tp, newSource(1, 5, 10).export)
	if err != nil {
		t.Fatal(err)
	}
	mdir := filepath.Join(dir, "events", "2", "manifest")
	if err := os.WriteFile(filepath.Join(mdir, "00000000000000000099-x.json"), []byte("{not json"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(mdir, "00000000000000000098-y.json"), []byte(`{"format":1,"topic":"events","partition":2,"offset":98,"object":"other/0/data/x.kds"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	// A valid manifest, padded past the 64 KiB bound: refused unread.
	body, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(m.Key())))
	if err != nil {
		t.Fatal(err)
	}
	body = append(body, bytes.Repeat([]byte(" "), maxManifestBytes)...)
	if err := os.WriteFile(filepath.Join(mdir, "00000000000000000097-z.json"), body, 0o644); err != nil {
		t.Fatal(err)
	}
	ms, skipped, err := st.List(ctx, tp)
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != 1 || ms[0].Key() != m.Key() || len(skipped) != 3 {
		t.Fatalf("List = %v, skipped %v; want only %s and three skipped", ms, skipped, m.Key())
	}
	for _, e := range skipped {
		if !errors.Is(e, ErrCorrupt) {
			t.Errorf("skipped %v, want ErrCorrupt", e)
		}
	}
}

// TestPrune keeps the newest manifests and the objects they name, deletes
// the others' objects, and keeps an object no manifest names while it is
// younger than the grace period (an upload whose manifest is not written
// yet, maybe by another worker).
func TestPrune(t *testing.T) {
	st, dir := openStore(t)
	ctx := context.Background()
	var ms []Manifest
	for i := range 5 {
		m, err := st.Put(ctx, tp, newSource(uint64(i), 3, int64(100*(i+1))).export)
		if err != nil {
			t.Fatal(err)
		}
		ms = append(ms, m)
	}
	// An upload in progress: its object, no manifest yet.
	pending := filepath.Join(dir, "events", "2", "data", "00000000000000000999-pending.kds")
	if err := os.WriteFile(pending, []byte("partial"), 0o644); err != nil {
		t.Fatal(err)
	}
	n, err := st.Prune(ctx, tp, 2, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if n != 3+3 {
		t.Errorf("Prune deleted %d objects, want 6 (3 manifests, 3 data objects)", n)
	}
	left, _, err := st.List(ctx, tp)
	if err != nil {
		t.Fatal(err)
	}
	if len(left) != 2 || left[0].Key() != ms[4].Key() || left[1].Key() != ms[3].Key() {
		t.Fatalf("left %v, want the two newest", left)
	}
	for i, m := range ms {
		_, err := os.Stat(filepath.Join(dir, filepath.FromSlash(m.Object)))
		if kept := err == nil; kept != (i >= 3) {
			t.Errorf("object of snapshot %d kept %t", i, kept)
		}
	}
	if _, err := os.Stat(pending); err != nil {
		t.Fatalf("a young object no manifest names was deleted: %v", err)
	}
	old := time.Now().Add(-2 * time.Hour)
	if err := os.Chtimes(pending, old, old); err != nil {
		t.Fatal(err)
	}
	if n, err := st.Prune(ctx, tp, 2, time.Hour); err != nil || n != 1 {
		t.Fatalf("Prune after the grace period = %d, %v; want the orphan deleted", n, err)
	}
	for _, m := range left {
		if _, err := load(st, m); err != nil {
			t.Fatalf("kept snapshot unreadable: %v", err)
		}
	}
}

// TestRoundTripThroughStore exports a real partition, uploads it, and
// imports it into another store: page for page the same state.
func TestRoundTripThroughStore(t *testing.T) {
	ctx := context.Background()
	st, _ := openStore(t)
	db, err := store.Open(store.Options{Dir: t.TempDir(), PageBytes: pb, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	p, err := db.Partition(tp.Topic, tp.Partition)
	if err != nil {
		t.Fatal(err)
	}
	want := newSource(5, 150, 4321)
	for id, b := range want.pages {
		page, err := p.Page(id)
		if err != nil {
			t.Fatal(err)
		}
		copy(page, b)
		p.MarkDirty(id, page)
	}
	if err := p.Commit(want.img.Meta, want.img.Checkpoint); err != nil {
		t.Fatal(err)
	}
	m, err := st.Put(ctx, tp, func(h func(store.Image) error, pg func(filter.PageID, []byte) error) (bool, error) {
		return db.Export(tp, h, pg)
	})
	if err != nil {
		t.Fatal(err)
	}
	db2, err := store.Open(store.Options{Dir: t.TempDir(), PageBytes: pb, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer db2.Close()
	q, err := db2.Partition(tp.Topic, tp.Partition)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Load(ctx, m, func(img store.Image, pages func(func(filter.PageID, []byte) error) error) error {
		return q.Import(img, pages)
	}); err != nil {
		t.Fatal(err)
	}
	if cp, ok := q.Checkpoint(); !ok || cp != want.img.Checkpoint || !bytes.Equal(q.Meta(), want.img.Meta) {
		t.Fatalf("imported checkpoint %+v %t, meta %q", cp, ok, q.Meta())
	}
	for id, b := range want.pages {
		got, err := q.Page(id)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, b) {
			t.Fatalf("%v differs after the round trip", id)
		}
	}
}

// TestS3 runs the store against an S3-compatible server on loopback
// (VersityGW, internal/s3test): snapshots put, listed newest first, loaded
// equal, a damaged object refused, pruned; the manifest is create-only.
func TestS3(t *testing.T) {
	srv := s3test.New(t)
	ctx := context.Background()
	st, err := Open(ctx, srv.URL("snapshots"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := st.Probe(ctx); err != nil {
		t.Fatal(err)
	}
	var srcs []*source
	for i := range 4 {
		src := newSource(uint64(i), 200, int64(100*(i+1)))
		srcs = append(srcs, src)
		if _, err := st.Put(ctx, tp, src.export); err != nil {
			t.Fatal(err)
		}
	}
	ms, skipped, err := st.List(ctx, tp)
	if err != nil || len(skipped) != 0 || len(ms) != 4 || ms[0].Offset != 400 {
		t.Fatalf("List = %v, %v, %v", ms, skipped, err)
	}
	got, err := load(st, ms[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := srcs[3].equal(got); err != nil {
		t.Fatal(err)
	}
	// The manifest is create-only: writing it again fails.
	if err := st.b.WriteAll(ctx, ms[0].Key(), []byte("{}"), &blob.WriterOptions{IfNotExist: true}); err == nil {
		t.Fatal("a manifest was overwritten")
	}
	obj := filepath.Join(srv.Dir(), "snapshots", filepath.FromSlash(ms[1].Object))
	b, err := os.ReadFile(obj)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/3] ^= 0x10
	if err := os.WriteFile(obj, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := load(st, ms[1]); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("damaged object on S3: %v, want ErrCorrupt", err)
	}
	if n, err := st.Prune(ctx, tp, 2, time.Hour); err != nil || n != 4 {
		t.Fatalf("Prune = %d, %v; want 2 manifests and their 2 objects", n, err)
	}
	if ms, _, err = st.List(ctx, tp); err != nil || len(ms) != 2 {
		t.Fatalf("after Prune: %v, %v", ms, err)
	}
}

// TestPutCutShortLeavesNoSnapshot: a source that fails after some pages
// (a worker killed in the middle of an upload stops the same way) leaves
// no manifest: List finds nothing, and Prune deletes the orphaned object
// once it is past its grace period.
func TestPutCutShortLeavesNoSnapshot(t *testing.T) {
	st, dir := openStore(t)
	ctx := context.Background()
	src := newSource(3, 100, 50)
	cut := errors.New("killed")
	_, err := st.Put(ctx, tp, func(h func(store.Image) error, pg func(filter.PageID, []byte) error) (bool, error) {
		if err := h(src.img); err != nil {
			return true, err
		}
		for _, id := range src.order[:40] {
			if err := pg(id, src.pages[id]); err != nil {
				return true, err
			}
		}
		return true, cut
	})
	if !errors.Is(err, cut) {
		t.Fatalf("Put = %v, want the source's error", err)
	}
	if ms, _, err := st.List(ctx, tp); err != nil || len(ms) != 0 {
		t.Fatalf("List after a cut upload = %v, %v; want nothing", ms, err)
	}
	// Whatever the driver left of the object goes once old enough.
	old := time.Now().Add(-2 * time.Hour)
	_ = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			_ = os.Chtimes(p, old, old)
		}
		return nil
	})
	if _, err := st.Prune(ctx, tp, 1, time.Hour); err != nil {
		t.Fatal(err)
	}
	var left []string
	_ = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(p, ".kds") {
			left = append(left, p)
		}
		return nil
	})
	if len(left) != 0 {
		t.Fatalf("objects left after Prune: %v", left)
	}
}

// TestTwoOwners has two stores (two workers during a rebalance) upload
// and prune snapshots of one topic-partition at once, keeping one each
// time: whatever the interleaving, a snapshot is left, and every manifest
// left names an object that loads.
func TestTwoOwners(t *testing.T) {
	_, dir := openStore(t)
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for owner := range 2 {
		st, err := Open(ctx, "file://"+dir)
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 30 {
				src := newSource(uint64(owner*100+i), 20, int64(1000*owner+i))
				if _, err := st.Put(ctx, tp, src.export); err != nil {
					errs <- err
					return
				}
				if _, err := st.Prune(ctx, tp, 1, time.Hour); err != nil {
					errs <- err
					return
				}
				ms, _, err := st.List(ctx, tp)
				if err != nil {
					errs <- err
					return
				}
				for _, m := range ms {
					if _, err := load(st, m); err != nil && !errors.Is(err, ErrCorrupt) {
						errs <- err
						return
					} else if err != nil {
						// Deleted by the other owner's prune between
						// List and Load: a missing object, refused.
						continue
					}
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	final, err := Open(ctx, "file://"+dir)
	if err != nil {
		t.Fatal(err)
	}
	defer final.Close()
	ms, _, err := final.List(ctx, tp)
	if err != nil || len(ms) == 0 {
		t.Fatalf("List after both owners = %v, %v", ms, err)
	}
	for _, m := range ms {
		if _, err := load(final, m); err != nil {
			t.Errorf("manifest %s left naming an unusable object: %v", m.Key(), err)
		}
	}
}

// TestFetchThenLoad: a fetched snapshot loads equal to its source from
// the local file, even once the store has lost the object; Load stops
// with the context's error part way when the context ends (a revocation
// must not wait for a whole import); a damaged object is refused by
// Fetch itself, leaving nothing in the directory.
func TestFetchThenLoad(t *testing.T) {
	st, dir := openStore(t)
	ctx := context.Background()
	src := newSource(4, 1000, 77)
	m, err := st.Put(ctx, tp, src.export)
	if err != nil {
		t.Fatal(err)
	}
	local := t.TempDir()
	f, err := st.Fetch(ctx, m, local)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(dir, filepath.FromSlash(m.Object))); err != nil {
		t.Fatal(err)
	}
	got := &source{pages: map[filter.PageID][]byte{}}
	if err := f.Load(ctx, func(img store.Image, pages func(func(filter.PageID, []byte) error) error) error {
		got.img = img
		return pages(func(id filter.PageID, b []byte) error {
			got.pages[id] = append([]byte{}, b...)
			return nil
		})
	}); err != nil {
		t.Fatal(err)
	}
	if err := src.equal(got); err != nil {
		t.Fatal(err)
	}
	f.Close()

	m2, err := st.Put(ctx, tp, src.export)
	if err != nil {
		t.Fatal(err)
	}
	f, err = st.Fetch(ctx, m2, local)
	if err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithCancel(ctx)
	n := 0
	err = f.Load(cctx, func(_ store.Image, pages func(func(filter.PageID, []byte) error) error) error {
		return pages(func(filter.PageID, []byte) error {
			if n++; n == 10 {
				cancel()
			}
			return nil
		})
	})
	f.Close()
	if !errors.Is(err, context.Canceled) || n >= 1000 {
		t.Fatalf("Load with its context ended after 10 pages: %v after %d pages, want context.Canceled before the 1000", err, n)
	}

	obj := filepath.Join(dir, filepath.FromSlash(m2.Object))
	b, err := os.ReadFile(obj)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)-5] ^= 1
	if err := os.WriteFile(obj, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Fetch(ctx, m2, local); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("Fetch of a damaged object = %v, want ErrCorrupt", err)
	}
	if left, _ := os.ReadDir(local); len(left) != 0 {
		t.Fatalf("files left after fetches: %v", left)
	}
}
