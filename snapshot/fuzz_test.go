package snapshot

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"hash"
	"io"
	"runtime"
	"testing"

	"github.com/klauspost/compress/zstd"

	"github.com/kdedup/kdedup/filter"
	"github.com/kdedup/kdedup/store"
)

// refObject is a snapshot object as a plain reading of the format
// (format.go) finds it in a decompressed stream: the exact model the
// decoder is checked against.
type refObject struct {
	tp     store.TopicPartition
	img    store.Image
	header bool     // the header parsed: tp and img are set
	pages  int64    // pages listed before the trailer
	digest [32]byte // SHA-256 of every page's ID and bytes, in order
	err    error    // nil: the whole stream is one valid object
}

func parseRef(plain []byte) (o refObject) {
	b := plain
	take := func(n int) []byte {
		if n < 0 || n > len(b) {
			return nil
		}
		v := b[:n]
		b = b[n:]
		return v
	}
	bad := func(what string) refObject {
		o.err = errors.New(what)
		return o
	}
	h := take(14)
	if h == nil || [8]byte(h[:8]) != magic || binary.BigEndian.Uint32(h[8:]) != FormatVersion {
		return bad("magic or version")
	}
	topic := take(int(binary.BigEndian.Uint16(h[12:])))
	h = take(4 + 8 + 4 + 4 + 4)
	if topic == nil || h == nil {
		return bad("short header")
	}
	o.tp = store.TopicPartition{Topic: string(topic), Partition: int32(binary.BigEndian.Uint32(h))}
	o.img.Checkpoint = store.Checkpoint{Offset: int64(binary.BigEndian.Uint64(h[4:])), LeaderEpoch: int32(binary.BigEndian.Uint32(h[12:]))}
	o.img.PageBytes = int(binary.BigEndian.Uint32(h[16:]))
	ml := int(binary.BigEndian.Uint32(h[20:]))
	if o.img.PageBytes <= 0 || o.img.PageBytes > 1<<20 || ml > maxMetaBytes {
		return bad("page size or metadata length")
	}
	if o.img.Meta = take(ml); o.img.Meta == nil {
		return bad("short metadata")
	}
	o.header = true
	sum := sha256.New()
	for {
		rec := take(8)
		if rec == nil {
			return bad("short page record")
		}
		if binary.BigEndian.Uint32(rec) == endOfPages {
			low := take(4)
			if low == nil || uint64(binary.BigEndian.Uint32(rec[4:]))<<32|uint64(binary.BigEndian.Uint32(low)) != uint64(o.pages) {
				return bad("trailer")
			}
			break
		}
		page := take(o.img.PageBytes)
		if page == nil {
			return bad("short page")
		}
		sum.Write(rec)
		sum.Write(page)
		o.pages++
	}
	copy(o.digest[:], sum.Sum(nil))
	if len(b) != 0 {
		return bad("bytes after the trailer")
	}
	return o
}

// fuzzPlainLimit bounds the decompressed stream the fuzz target models.
const fuzzPlainLimit = 16 << 20

// FuzzDecoder hands arbitrary objects to the decoder, each with the
// manifest a bucket writer could write for it: its true size and SHA-256,
// the topic-partition, checkpoint and page size of its header when it has
// one (the page size pageBytes instead, unless 0), and the page count the
// object lists plus delta. Invariants:
//   - it never panics;
//   - it returns nil or ErrCorrupt (wrapped), never another error;
//   - put never sees more pages than the manifest's Pages, nor a page of
//     another size than its PageBytes;
//   - on nil, put saw exactly the pages the object encodes, as a plain
//     reading of the decompressed stream (parseRef) finds them, in order,
//     and as many as the manifest says; and an object that reading accepts,
//     with a manifest of its page count, decodes (nil);
//   - it allocates at most 32 MiB, whatever window, lengths or page count
//     the object declares.
//
// The seeds (valid objects from the encoder, a window bomb, a page bomb,
// pages of another size, garbage) run under go test; fuzz with
//
//	go test -run '^$' -fuzz FuzzDecoder -fuzztime 60s ./snapshot
func FuzzDecoder(f *testing.F) {
	for _, n := range []int{0, 1, 40} {
		src := newSource(uint64(n), n, 600)
		var buf bytes.Buffer
		enc, err := newEncoder(&buf)
		if err != nil {
			f.Fatal(err)
		}
		if err := enc.header(tp, src.img); err != nil {
			f.Fatal(err)
		}
		for _, id := range src.order {
			if err := enc.page(id, src.pages[id]); err != nil {
				f.Fatal(err)
			}
		}
		if err := enc.close(); err != nil {
			f.Fatal(err)
		}
		f.Add(buf.Bytes(), int8(0), uint16(0))
		f.Add(buf.Bytes(), int8(-1), uint16(0))
		plain := plainObject(tp, src.img, src.pages, src.order, uint64(n))
		f.Add(rawFrame(plain, 22), int8(0), uint16(0))
		f.Add(rawFrame(plain, 29), int8(0), uint16(0)) // window bomb
		half := src.img
		half.PageBytes = pb / 2
		halfPages := map[filter.PageID][]byte{}
		for id, b := range src.pages {
			halfPages[id] = b[:pb/2]
		}
		f.Add(rawFrame(plainObject(tp, half, halfPages, src.order, uint64(n)), 20), int8(0), uint16(pb))
	}
	src := newSource(3, 0, 600)
	zero := make([]byte, pb)
	bomb := map[filter.PageID][]byte{}
	var order []filter.PageID
	for i := range 5000 {
		id := filter.PageID{Page: uint32(i)}
		bomb[id], order = zero, append(order, id)
	}
	f.Add(compress(f, plainObject(tp, src.img, bomb, order, uint64(len(order)))), int8(-100), uint16(0)) // page bomb
	f.Add([]byte{}, int8(0), uint16(0))
	f.Add([]byte("not a zstd stream"), int8(0), uint16(0))

	f.Fuzz(func(t *testing.T, obj []byte, delta int8, pageBytes uint16) {
		zr, err := zstd.NewReader(bytes.NewReader(obj), zstd.WithDecoderConcurrency(1),
			zstd.WithDecoderMaxWindow(maxDecoderWindowBytes), zstd.WithDecoderMaxMemory(maxDecoderWindowBytes))
		if err != nil {
			t.Fatal(err)
		}
		plain, zerr := io.ReadAll(io.LimitReader(zr, fuzzPlainLimit+1))
		zr.Close()
		if len(plain) > fuzzPlainLimit {
			return // beyond the model's bound
		}
		ref := parseRef(plain)
		if zerr != nil {
			ref.err = zerr
		}
		m := Manifest{Format: FormatVersion, Topic: tp.Topic, Partition: tp.Partition, Object: "fuzz", PageBytes: pb}
		if ref.header {
			m.Topic, m.Partition, m.Offset, m.LeaderEpoch, m.PageBytes = ref.tp.Topic, ref.tp.Partition, ref.img.Checkpoint.Offset, ref.img.Checkpoint.LeaderEpoch, ref.img.PageBytes
		}
		if pageBytes != 0 {
			m.PageBytes = int(pageBytes)
		}
		m.Pages = max(ref.pages+int64(delta), 0)
		sum := sha256.Sum256(obj)
		m.Bytes, m.SHA256 = int64(len(obj)), hex.EncodeToString(sum[:])

		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		n, tooBig, sizes := int64(0), false, true
		h := sha256.New()
		d, err := newDecoder(bytes.NewReader(obj), m)
		if err == nil {
			err = d.pages(func(id filter.PageID, b []byte) error {
				n++
				tooBig = tooBig || n > m.Pages
				sizes = sizes && len(b) == m.PageBytes
				writePage(h, id, b)
				return nil
			})
			d.close()
		}
		runtime.ReadMemStats(&after)
		if err != nil && !errors.Is(err, ErrCorrupt) {
			t.Fatalf("error %v is not ErrCorrupt", err)
		}
		if tooBig || !sizes {
			t.Fatalf("put saw %d pages (manifest: %d of %d bytes), sizes right: %t", n, m.Pages, m.PageBytes, sizes)
		}
		if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 32<<20 {
			t.Fatalf("the decoder allocated %d MiB", alloc>>20)
		}
		valid := ref.err == nil && m.Pages == ref.pages && m.PageBytes == ref.img.PageBytes
		switch {
		case err == nil && !valid:
			t.Fatalf("decoded an object the model refuses (%v, %d pages listed, manifest %d)", ref.err, ref.pages, m.Pages)
		case err == nil && (n != ref.pages || [32]byte(h.Sum(nil)) != ref.digest):
			t.Fatalf("decoded %d pages, not the %d the object encodes", n, ref.pages)
		case err != nil && valid:
			t.Fatalf("refused an object the model accepts: %v", err)
		}
	})
}

func writePage(h hash.Hash, id filter.PageID, b []byte) {
	var rec [8]byte
	binary.BigEndian.PutUint32(rec[:], id.SubFilter)
	binary.BigEndian.PutUint32(rec[4:], id.Page)
	h.Write(rec[:])
	h.Write(b)
}
