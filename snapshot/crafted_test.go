package snapshot

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/klauspost/compress/zstd"
	"gocloud.dev/blob"

	"github.com/kdedup/kdedup/filter"
	"github.com/kdedup/kdedup/store"
)

// plainObject is the uncompressed stream of a snapshot object (format.go):
// header, the pages given, trailer with count pages. Tests build crafted
// objects from it, as a bucket writer could.
func plainObject(tp store.TopicPartition, img store.Image, pages map[filter.PageID][]byte, order []filter.PageID, count uint64) []byte {
	b := append([]byte(nil), magic[:]...)
	b = binary.BigEndian.AppendUint32(b, FormatVersion)
	b = binary.BigEndian.AppendUint16(b, uint16(len(tp.Topic)))
	b = append(b, tp.Topic...)
	b = binary.BigEndian.AppendUint32(b, uint32(tp.Partition))
	b = binary.BigEndian.AppendUint64(b, uint64(img.Checkpoint.Offset))
	b = binary.BigEndian.AppendUint32(b, uint32(img.Checkpoint.LeaderEpoch))
	b = binary.BigEndian.AppendUint32(b, uint32(img.PageBytes))
	b = binary.BigEndian.AppendUint32(b, uint32(len(img.Meta)))
	b = append(b, img.Meta...)
	for _, id := range order {
		b = binary.BigEndian.AppendUint32(b, id.SubFilter)
		b = binary.BigEndian.AppendUint32(b, id.Page)
		b = append(b, pages[id]...)
	}
	b = binary.BigEndian.AppendUint32(b, endOfPages)
	return binary.BigEndian.AppendUint64(b, count)
}

// rawFrame is a zstd frame (RFC 8878 section 3.1.1) of plain in raw
// blocks whose header declares a window of 2^windowLog bytes, as no
// encoder of this package writes it.
func rawFrame(plain []byte, windowLog uint) []byte {
	b := []byte{0x28, 0xb5, 0x2f, 0xfd, 0x00, byte(windowLog-10) << 3}
	blockMax := min(1<<windowLog, 128<<10)
	for {
		n := min(len(plain), blockMax)
		last := uint32(0)
		if n == len(plain) {
			last = 1
		}
		h := last | uint32(n)<<3 // block type 0: raw
		b = append(b, byte(h), byte(h>>8), byte(h>>16))
		b = append(b, plain[:n]...)
		plain = plain[n:]
		if last == 1 {
			return b
		}
	}
}

// compress is plain as the encoder compresses it.
func compress(t testing.TB, plain []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw, err := zstd.NewWriter(&buf, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithEncoderConcurrency(1))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := zw.Write(plain); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// manifestOf is the manifest a bucket writer would write for obj: its
// true size and SHA-256, and pages of pageBytes each, at src's checkpoint.
func manifestOf(obj []byte, key string, img store.Image, pages int64) Manifest {
	sum := sha256.Sum256(obj)
	return Manifest{Format: FormatVersion, Topic: tp.Topic, Partition: tp.Partition,
		Offset: img.Checkpoint.Offset, LeaderEpoch: img.Checkpoint.LeaderEpoch,
		Object: dir(tp) + "data/" + key + ".kds", Bytes: int64(len(obj)), SHA256: hex.EncodeToString(sum[:]),
		Pages: pages, PageBytes: img.PageBytes}
}

// putObject stores obj under m.Object, as a bucket writer could.
func putObject(t testing.TB, st *Store, m Manifest, obj []byte) {
	t.Helper()
	if err := st.b.WriteAll(context.Background(), m.Object, obj, &blob.WriterOptions{ContentType: "application/octet-stream"}); err != nil {
		t.Fatal(err)
	}
}

// TestCraftedObjects loads objects a bucket writer could craft, each with
// a manifest that matches its bytes: one in a frame declaring a window
// over the decoder's bound, one with more pages than its manifest (a page
// bomb: pages of zeros compress to almost nothing), one whose pages are
// of another size than the manifest's. Each is refused as ErrCorrupt,
// with a message naming the fault, before put sees more pages than the
// manifest lists and without allocating the declared window; a frame of
// the encoder's window loads.
func TestCraftedObjects(t *testing.T) {
	st, _ := openStore(t)
	src := newSource(11, 40, 600)
	plain := plainObject(tp, src.img, src.pages, src.order, uint64(len(src.order)))
	zero := make([]byte, pb)
	bomb := map[filter.PageID][]byte{}
	var bombOrder []filter.PageID
	for i := range 20000 {
		id := filter.PageID{SubFilter: uint32(i >> 16), Page: uint32(i & 0xffff)}
		bomb[id] = zero
		bombOrder = append(bombOrder, id)
	}
	half := src.img
	half.PageBytes = pb / 2
	halfPages := map[filter.PageID][]byte{}
	for id, b := range src.pages {
		halfPages[id] = b[:pb/2]
	}
	for _, tc := range []struct {
		name     string
		obj      []byte
		img      store.Image // the manifest's header fields
		pages    int64       // the manifest's page count
		wantErr  string      // "" for success
		maxPages int
	}{
		{"encoder's window in raw blocks", rawFrame(plain, 22), src.img, 40, "", 40},
		{"window bomb", rawFrame(plain, 29), src.img, 40, "window", 0},
		{"window of 16 MiB", rawFrame(plain, 24), src.img, 40, "window", 0},
		{"page bomb", compress(t, plainObject(tp, src.img, bomb, bombOrder, uint64(len(bombOrder)))), src.img, 100, "more pages than the manifest's 100", 100},
		{"pages of another size", compress(t, plainObject(tp, half, halfPages, src.order, uint64(len(src.order)))), src.img, 40, "page size", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := manifestOf(tc.obj, strings.ReplaceAll(tc.name, " ", "-"), tc.img, tc.pages)
			putObject(t, st, m, tc.obj)
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			n := 0
			err := st.Load(context.Background(), m, func(_ store.Image, pages func(func(filter.PageID, []byte) error) error) error {
				return pages(func(filter.PageID, []byte) error {
					n++
					return nil
				})
			})
			runtime.ReadMemStats(&after)
			if n > tc.maxPages {
				t.Errorf("put saw %d pages, the manifest lists %d", n, tc.pages)
			}
			if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 32<<20 {
				t.Errorf("Load allocated %d MiB", alloc>>20)
			}
			if tc.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("Load = %v, want ErrCorrupt saying %q", err, tc.wantErr)
			}
		})
	}
}

// TestLoadChecksBeforeDecoding: Load and Verify compare an object's size
// and SHA-256 with its manifest before decoding any of it, so a damaged
// object never reaches into or the decoder. A flipped byte near the end
// (which a decoder meets only after handing over most pages), a window
// bomb whose manifest does not match it, and a longer object are each
// refused for their bytes, with into never called.
func TestLoadChecksBeforeDecoding(t *testing.T) {
	st, dir := openStore(t)
	ctx := context.Background()
	m, err := st.Put(ctx, tp, newSource(12, 200, 800).export)
	if err != nil {
		t.Fatal(err)
	}
	obj := filepath.Join(dir, filepath.FromSlash(m.Object))
	good, err := os.ReadFile(obj)
	if err != nil {
		t.Fatal(err)
	}
	flipped := bytes.Clone(good)
	flipped[len(flipped)-20] ^= 0x08
	src := newSource(11, 40, 800)
	bomb := rawFrame(plainObject(tp, src.img, src.pages, src.order, 40), 29)
	bm := manifestOf(bomb, "bomb", src.img, 40)
	bm.SHA256 = m.SHA256 // a manifest that does not match its object
	putObject(t, st, bm, bomb)
	for _, tc := range []struct {
		name string
		m    Manifest
		obj  []byte
		want string
	}{
		{"byte flipped near the end", m, flipped, "SHA-256"},
		{"longer object", m, append(bytes.Clone(good), 0), "bytes, the manifest says"},
		{"window bomb not matching its manifest", bm, nil, "SHA-256"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.obj != nil {
				if err := os.WriteFile(filepath.Join(dir, filepath.FromSlash(tc.m.Object)), tc.obj, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			called := false
			err := st.Load(ctx, tc.m, func(store.Image, func(func(filter.PageID, []byte) error) error) error {
				called = true
				return nil
			})
			if called || !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Load = %v (into called: %t), want ErrCorrupt saying %q before into", err, called, tc.want)
			}
			if _, err := st.Verify(ctx, tc.m); !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Verify = %v, want ErrCorrupt saying %q", err, tc.want)
			}
		})
	}
}
