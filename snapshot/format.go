package snapshot

import (
	"bufio"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"

	"github.com/klauspost/compress/zstd"

	"github.com/kdedup/kdedup/filter"
	"github.com/kdedup/kdedup/store"
)

// FormatVersion is the version of the snapshot object format this package
// writes and the only one it reads.
const FormatVersion = 1

// magic opens every decoded snapshot object.
var magic = [8]byte{'K', 'D', 'S', 'N', 'A', 'P', 0, 1}

// endOfPages is the sub-filter field of the record that ends the pages.
const endOfPages = 0xFFFFFFFF

// maxMetaBytes bounds the chain metadata a snapshot may carry (a chain's
// metadata is tens of bytes per sub-filter), so that a damaged length is
// refused instead of allocated.
const maxMetaBytes = 16 << 20

// The zstd window the encoder uses, and the largest the decoder accepts,
// in bytes. The encoder pins SpeedFastest's 4 MiB window
// (klauspost/compress zstd encoder_options.go, WithEncoderLevel) so that
// a change of level cannot outgrow the decoder; the decoder allows twice
// that (zstd's default level uses 8 MiB) instead of zstd's default 512
// MiB, since a frame header alone makes the decoder allocate its window
// (a ring of the window plus two blocks: zstd history.go) for every
// concurrent restore.
const (
	encoderWindowBytes    = 4 << 20
	maxDecoderWindowBytes = 8 << 20
)

// LoadMemoryBytes is the most memory one Fetched.Load (or Store.Load)
// holds while it reads a snapshot: the zstd decoder's window and buffers
// (bounded to maxDecoderWindowBytes) and the read buffers; restores
// running at once hold it each (the worker's memory budget counts it).
const LoadMemoryBytes = maxDecoderWindowBytes + 2<<20

// ErrCorrupt is returned (wrapped) for a snapshot object that is not what
// its manifest says: a checksum or size mismatch, a truncated or
// undecodable object, another format version, or another topic-partition.
var ErrCorrupt = errors.New("snapshot: corrupt snapshot")

// The object format, before zstd compression (klauspost/compress, one
// frame stream), integers big-endian:
//
//	magic "KDSNAP\x00\x01" | uint32 format version
//	uint16 len(topic) | topic | int32 partition
//	int64 checkpoint offset | int32 leader epoch
//	uint32 page bytes | uint32 len(meta) | meta
//	per stored page: uint32 sub-filter | uint32 page | page bytes
//	uint32 0xFFFFFFFF | uint64 page count
//
// The manifest holds the SHA-256 and the size of the compressed object,
// checked as it is read; a decoder checks the structure too.

// encoder writes one snapshot object to w.
type encoder struct {
	zw    *zstd.Encoder
	buf   []byte
	pages uint64
	pb    int
}

func newEncoder(w io.Writer) (*encoder, error) {
	// The fastest level: pages are fingerprints, near random but for the
	// empty slots of part-full pages, which any level finds.
	zw, err := zstd.NewWriter(w, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithWindowSize(encoderWindowBytes), zstd.WithEncoderConcurrency(1))
	if err != nil {
		return nil, err
	}
	return &encoder{zw: zw}, nil
}

func (e *encoder) header(tp store.TopicPartition, img store.Image) error {
	b := append(e.buf[:0], magic[:]...)
	b = binary.BigEndian.AppendUint32(b, FormatVersion)
	b = binary.BigEndian.AppendUint16(b, uint16(len(tp.Topic)))
	b = append(b, tp.Topic...)
	b = binary.BigEndian.AppendUint32(b, uint32(tp.Partition))
	b = binary.BigEndian.AppendUint64(b, uint64(img.Checkpoint.Offset))
	b = binary.BigEndian.AppendUint32(b, uint32(img.Checkpoint.LeaderEpoch))
	b = binary.BigEndian.AppendUint32(b, uint32(img.PageBytes))
	b = binary.BigEndian.AppendUint32(b, uint32(len(img.Meta)))
	b = append(b, img.Meta...)
	e.buf, e.pb = b, img.PageBytes
	_, err := e.zw.Write(b)
	return err
}

func (e *encoder) page(id filter.PageID, data []byte) error {
	b := binary.BigEndian.AppendUint32(e.buf[:0], id.SubFilter)
	b = binary.BigEndian.AppendUint32(b, id.Page)
	e.buf = b
	if _, err := e.zw.Write(b); err != nil {
		return err
	}
	e.pages++
	_, err := e.zw.Write(data)
	return err
}

func (e *encoder) close() error {
	b := binary.BigEndian.AppendUint32(e.buf[:0], endOfPages)
	b = binary.BigEndian.AppendUint64(b, e.pages)
	if _, err := e.zw.Write(b); err != nil {
		return err
	}
	return e.zw.Close()
}

// decoder reads one snapshot object, checking its size and SHA-256 against
// the manifest's when it reaches the end.
type decoder struct {
	m      Manifest
	raw    *countingReader
	zr     *zstd.Decoder
	r      *bufio.Reader
	img    store.Image
	buf    []byte
	closed bool
}

// countingReader hashes and counts the object's bytes, and refuses to
// read past max (the manifest's size) rather than decode whatever follows.
type countingReader struct {
	r   io.Reader
	h   hash.Hash
	n   int64
	max int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	if c.n > c.max {
		return 0, fmt.Errorf("%w: more than the manifest's %d bytes", ErrCorrupt, c.max)
	}
	n, err := c.r.Read(p)
	c.n += int64(n)
	c.h.Write(p[:n])
	return n, err
}

func newDecoder(r io.Reader, m Manifest) (*decoder, error) {
	cr := &countingReader{r: r, h: sha256.New(), max: m.Bytes}
	// MaxMemory bounds the window too (for a stream it is the window's
	// bound; the output is not bounded by it) and catches a single-segment
	// frame whose content size stands in for its window.
	zr, err := zstd.NewReader(cr, zstd.WithDecoderConcurrency(1), zstd.WithDecoderLowmem(true),
		zstd.WithDecoderMaxWindow(maxDecoderWindowBytes), zstd.WithDecoderMaxMemory(maxDecoderWindowBytes))
	if err != nil {
		return nil, err
	}
	d := &decoder{m: m, raw: cr, zr: zr, r: bufio.NewReaderSize(zr, 64<<10)}
	if err := d.header(); err != nil {
		zr.Close()
		return nil, d.corrupt(err)
	}
	return d, nil
}

func (d *decoder) corrupt(err error) error {
	if errors.Is(err, ErrCorrupt) {
		return err
	}
	if errors.Is(err, io.EOF) {
		err = io.ErrUnexpectedEOF
	}
	if errors.Is(err, zstd.ErrWindowSizeExceeded) || errors.Is(err, zstd.ErrDecoderSizeExceeded) {
		err = fmt.Errorf("zstd frame with a window over the %d MiB this build decodes (its writer uses %d MiB): %w",
			maxDecoderWindowBytes>>20, encoderWindowBytes>>20, err)
	}
	return fmt.Errorf("%w: %s: %w", ErrCorrupt, d.m.Object, err)
}

func (d *decoder) read(n int) ([]byte, error) {
	if cap(d.buf) < n {
		d.buf = make([]byte, n)
	}
	b := d.buf[:n]
	_, err := io.ReadFull(d.r, b)
	return b, err
}

func (d *decoder) header() error {
	b, err := d.read(8 + 4 + 2)
	if err != nil {
		return err
	}
	if [8]byte(b[:8]) != magic {
		return errors.New("not a snapshot object")
	}
	if v := binary.BigEndian.Uint32(b[8:]); v != FormatVersion {
		return fmt.Errorf("format version %d, this build reads %d", v, FormatVersion)
	}
	tl := int(binary.BigEndian.Uint16(b[12:]))
	if b, err = d.read(tl + 4 + 8 + 4 + 4 + 4); err != nil {
		return err
	}
	tp := store.TopicPartition{Topic: string(b[:tl]), Partition: int32(binary.BigEndian.Uint32(b[tl:]))}
	if tp != d.m.TopicPartition() {
		return fmt.Errorf("object of %s, manifest of %s", tp, d.m.TopicPartition())
	}
	b = b[tl+4:]
	d.img.Checkpoint = store.Checkpoint{Offset: int64(binary.BigEndian.Uint64(b)), LeaderEpoch: int32(binary.BigEndian.Uint32(b[8:]))}
	if d.img.Checkpoint != d.m.Checkpoint() {
		return fmt.Errorf("object at checkpoint %+v, manifest at %+v", d.img.Checkpoint, d.m.Checkpoint())
	}
	d.img.PageBytes = int(binary.BigEndian.Uint32(b[12:]))
	if d.img.PageBytes <= 0 || d.img.PageBytes > 1<<20 {
		return fmt.Errorf("page size %d", d.img.PageBytes)
	}
	if d.img.PageBytes != d.m.PageBytes {
		return fmt.Errorf("page size %d, the manifest says %d", d.img.PageBytes, d.m.PageBytes)
	}
	ml := int64(binary.BigEndian.Uint32(b[16:]))
	if ml > maxMetaBytes {
		return fmt.Errorf("metadata of %d bytes", ml)
	}
	// Read, not allocated up front: a damaged length costs what the
	// object holds, not 16 MiB.
	meta, err := io.ReadAll(io.LimitReader(d.r, ml))
	if err != nil {
		return err
	}
	if int64(len(meta)) != ml {
		return io.ErrUnexpectedEOF
	}
	d.img.Meta = meta
	return nil
}

// pages calls put with every page of the object, in its order, then reads
// to the end and checks the count, the size and the SHA-256: an object
// that is not exactly the manifest's returns ErrCorrupt (wrapped) after
// put has seen some of its pages, which is why store.PartitionState.Import,
// which commits only after its source returns nil, is the caller. put
// never sees more than the manifest's Pages pages, each of its PageBytes:
// an object of more (pages of zeros compress to almost nothing) is
// refused at the first page past the count.
func (d *decoder) pages(put func(filter.PageID, []byte) error) error {
	var n uint64
	want := uint64(max(d.m.Pages, 0))
	for {
		b, err := d.read(8)
		if err != nil {
			return d.corrupt(err)
		}
		sub, page := binary.BigEndian.Uint32(b), binary.BigEndian.Uint32(b[4:])
		if sub == endOfPages {
			b, err := d.read(4) // the count's low half (page was its high half)
			if err != nil {
				return d.corrupt(err)
			}
			if count := uint64(page)<<32 | uint64(binary.BigEndian.Uint32(b)); count != n {
				return d.corrupt(fmt.Errorf("%d pages, the object says %d", n, count))
			}
			if n != want {
				return d.corrupt(fmt.Errorf("%d pages, the manifest says %d", n, want))
			}
			break
		}
		if n >= want {
			return d.corrupt(fmt.Errorf("more pages than the manifest's %d", want))
		}
		if b, err = d.read(d.img.PageBytes); err != nil {
			return d.corrupt(err)
		}
		if err := put(filter.PageID{SubFilter: sub, Page: page}, b); err != nil {
			return err
		}
		n++
	}
	if _, err := d.r.ReadByte(); err != io.EOF {
		return d.corrupt(errors.New("bytes after the last page"))
	}
	if _, err := io.Copy(io.Discard, d.raw); err != nil {
		return d.corrupt(err)
	}
	if d.raw.n != d.m.Bytes {
		return d.corrupt(fmt.Errorf("%d bytes, the manifest says %d", d.raw.n, d.m.Bytes))
	}
	if sum := hex.EncodeToString(d.raw.h.Sum(nil)); sum != d.m.SHA256 {
		return d.corrupt(fmt.Errorf("SHA-256 %s, the manifest says %s", sum, d.m.SHA256))
	}
	return nil
}

func (d *decoder) close() {
	if !d.closed {
		d.closed = true
		d.zr.Close()
	}
}
