package snapshot

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"math"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"gocloud.dev/blob"
	_ "gocloud.dev/blob/azureblob" // azblob:// URLs
	_ "gocloud.dev/blob/fileblob"  // file:// URLs
	_ "gocloud.dev/blob/gcsblob"   // gs:// URLs
	_ "gocloud.dev/blob/s3blob"    // s3:// URLs
	"gocloud.dev/gcerrors"

	"github.com/kdedup/kdedup/filter"
	"github.com/kdedup/kdedup/store"
)

// ErrNoState is returned by Store.Put for a topic-partition without state
// to snapshot.
var ErrNoState = errors.New("snapshot: no state to snapshot")

// Store keeps snapshots of topic-partitions in an object store (a bucket
// and key prefix), through gocloud.dev/blob: S3 and S3-compatible
// servers, Google Cloud Storage, Azure Blob Storage, or a directory.
//
// Objects are immutable and named uniquely. A snapshot is a data object
// (the partition's state, see format.go) and a manifest, written after the
// data object and only if no object of its name exists: a snapshot whose
// manifest is absent does not exist, so a writer killed in the middle of
// an upload leaves an object no manifest names, deleted by Prune once
// older than its grace period. Keys, under the prefix:
//
//	<topic>/<partition>/manifest/<offset, 20 digits>-<id>.json
//	<topic>/<partition>/data/<offset, 20 digits>-<id>.kds
//
// Safe for concurrent use; two workers may write snapshots of the same
// topic-partition at once (as during a rebalance) without either deleting
// what the other's manifests name.
type Store struct {
	b *blob.Bucket
	// where names the store in errors and logs: the URL without its query
	// (which may carry an endpoint, never a credential, but is long).
	where string
}

// Open opens the store at rawURL: s3://bucket/prefix?region=...&endpoint=...
// (S3 and S3-compatible servers; credentials from the AWS SDK's usual
// sources: environment, shared files, instance or pod identity),
// gs://bucket/prefix (Application Default Credentials), azblob://container/prefix
// (AZURE_STORAGE_ACCOUNT and the Azure SDK's credential chain), or
// file:///path for a directory (a shared volume; created if absent). The URL's path below the bucket is
// the key prefix. Query parameters are those of gocloud.dev's drivers.
//
// Neither the store's String nor any error Open returns holds the URL's
// password (url.URL.Redacted), should the URL carry user:password@.
func Open(ctx context.Context, rawURL string) (*Store, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		// url.Error quotes the whole URL; its cause names only the bad part.
		var uerr *url.Error
		if errors.As(err, &uerr) {
			err = uerr.Err
		}
		return nil, fmt.Errorf("snapshot: parsing the store URL %s: %w", redactRawURL(rawURL), redacted(err, rawURL, nil))
	}
	where := u.Scheme + "://" + u.Host + u.Path
	prefix := ""
	if u.Scheme == "file" {
		q := u.Query()
		if q.Get("create_dir") == "" {
			q.Set("create_dir", "true")
		}
		u.RawQuery = q.Encode()
	} else {
		prefix = strings.Trim(u.Path, "/")
		u.Path = ""
	}
	b, err := blob.OpenBucket(ctx, u.String())
	if err != nil {
		// gocloud quotes the URL it was given, password included.
		return nil, fmt.Errorf("snapshot: opening %s: %w", where, redacted(err, rawURL, u))
	}
	if prefix != "" {
		b = blob.PrefixedBucket(b, prefix+"/")
	}
	return &Store{b: b, where: where}, nil
}

// In returns the store of one consumer group: its keys under namespace/,
// so that deployments sharing a URL neither restore nor prune each
// other's snapshots. Close either s or the result, not both: they share
// the bucket.
func (s *Store) In(namespace string) *Store {
	return &Store{b: blob.PrefixedBucket(s.b, namespace+"/"), where: strings.TrimSuffix(s.where, "/") + "/" + namespace}
}

// String returns the store's URL without its query.
func (s *Store) String() string { return s.where }

// Close closes the bucket.
func (s *Store) Close() error { return s.b.Close() }

// Manifest describes one snapshot; it is stored as JSON.
type Manifest struct {
	Format      int       `json:"format"`
	Topic       string    `json:"topic"`
	Partition   int32     `json:"partition"`
	Offset      int64     `json:"offset"`
	LeaderEpoch int32     `json:"leader_epoch"`
	Created     time.Time `json:"created"`
	// Object is the data object's key, Bytes its size and SHA256 the hex
	// SHA-256 of its bytes.
	Object string `json:"object"`
	Bytes  int64  `json:"bytes"`
	SHA256 string `json:"sha256"`
	// Pages is the pages in the object; PageBytes their size.
	Pages     int64 `json:"pages"`
	PageBytes int   `json:"page_bytes"`
	// TopicID and ClusterID are the origin of the state (store.Origin):
	// the topic incarnation and the Kafka cluster it was built from,
	// absent in snapshots of state written before origins were recorded.
	// A consumer restores no snapshot of another topic ID or cluster.
	TopicID   string `json:"topic_id,omitempty"`
	ClusterID string `json:"cluster_id,omitempty"`

	key string
	// stored is when the store wrote the manifest (its clock, not the
	// writer's).
	stored time.Time
}

// TopicPartition is the snapshot's topic-partition.
func (m Manifest) TopicPartition() store.TopicPartition {
	return store.TopicPartition{Topic: m.Topic, Partition: m.Partition}
}

// Checkpoint is the offset the snapshot's state reflects.
func (m Manifest) Checkpoint() store.Checkpoint {
	return store.Checkpoint{Offset: m.Offset, LeaderEpoch: m.LeaderEpoch}
}

// Origin is the topic and cluster the snapshot's state was built from
// (zero: not recorded).
func (m Manifest) Origin() store.Origin {
	return store.Origin{TopicID: m.TopicID, ClusterID: m.ClusterID}
}

// Key is the manifest's object key in its store.
func (m Manifest) Key() string { return m.key }

// StateBytes is the pages' size before compression.
func (m Manifest) StateBytes() int64 { return m.Pages * int64(m.PageBytes) }

// RestoreBytes is the disk space, in bytes, that restoring m takes at
// most on the data directory's filesystem: the downloaded object (Fetch
// writes at most Bytes+1 bytes and keeps Bytes until Fetched.Close) and
// the imported pages (StateBytes: the decoder refuses more pages, or
// pages of another size, than the manifest's) held at once. It does not
// count the store's own overhead (Badger's logs and the free space it
// keeps; store.DB owns those). A manifest whose sizes are negative or
// overflow gives math.MaxInt64: no reservation fits it, and Fetch or Load
// would refuse it anyway.
func (m Manifest) RestoreBytes() int64 {
	if m.Bytes < 0 || m.Pages < 0 || m.PageBytes < 0 {
		return math.MaxInt64
	}
	if m.PageBytes > 0 && m.Pages > (math.MaxInt64-m.Bytes)/int64(m.PageBytes) {
		return math.MaxInt64
	}
	return m.Bytes + m.StateBytes()
}

func dir(tp store.TopicPartition) string {
	return tp.Topic + "/" + strconv.Itoa(int(tp.Partition)) + "/"
}

// Source reads a topic-partition's state: store.DB.Export for one
// topic-partition.
type Source func(header func(store.Image) error, page func(filter.PageID, []byte) error) (found bool, err error)

// Put uploads a snapshot of tp read from src: the data object, streamed
// as src reads it, then the manifest, created only if absent. It returns
// the manifest written; ErrNoState (wrapped) when src finds no state; an
// error of src or of the store otherwise, after which no manifest names
// what was uploaded.
func (s *Store) Put(ctx context.Context, tp store.TopicPartition, src Source) (Manifest, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // a writer whose context is cancelled aborts its upload
	id := newID()
	m := Manifest{Format: FormatVersion, Topic: tp.Topic, Partition: tp.Partition}
	var (
		w   *blob.Writer
		h   hash.Hash
		n   *countingWriter
		enc *encoder
	)
	found, err := src(func(img store.Image) error {
		m.Offset, m.LeaderEpoch, m.PageBytes = img.Checkpoint.Offset, img.Checkpoint.LeaderEpoch, img.PageBytes
		m.TopicID, m.ClusterID = img.Origin.TopicID, img.Origin.ClusterID
		m.Object = dir(tp) + "data/" + fmt.Sprintf("%020d-%s.kds", m.Offset, id)
		var err error
		if w, err = s.b.NewWriter(ctx, m.Object, &blob.WriterOptions{ContentType: "application/octet-stream"}); err != nil {
			return err
		}
		h = sha256.New()
		n = &countingWriter{w: io.MultiWriter(ctxWriter{ctx, w}, h)}
		if enc, err = newEncoder(n); err != nil {
			return err
		}
		return enc.header(tp, img)
	}, func(pid filter.PageID, data []byte) error {
		return enc.page(pid, data)
	})
	if err == nil && !found {
		err = ErrNoState
	}
	if err == nil {
		err = enc.close()
	}
	if err != nil {
		cancel()
		if w != nil {
			_ = w.Close()
		}
		return Manifest{}, fmt.Errorf("snapshot: uploading %s to %s: %w", tp, s.where, err)
	}
	if err := w.Close(); err != nil {
		return Manifest{}, fmt.Errorf("snapshot: uploading %s to %s: %w", tp, s.where, err)
	}
	m.Bytes, m.SHA256, m.Pages, m.Created = n.n, hex.EncodeToString(h.Sum(nil)), int64(enc.pages), time.Now().UTC()
	body, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return Manifest{}, err
	}
	m.key = dir(tp) + "manifest/" + fmt.Sprintf("%020d-%s.json", m.Offset, id)
	if err := s.b.WriteAll(ctx, m.key, body, &blob.WriterOptions{ContentType: "application/json", IfNotExist: true}); err != nil {
		return Manifest{}, fmt.Errorf("snapshot: writing the manifest of %s to %s: %w", tp, s.where, err)
	}
	return m, nil
}

type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// newID is unique across writers: the time and 48 random bits.
func newID() string {
	var r [6]byte
	_, _ = rand.Read(r[:])
	return strconv.FormatInt(time.Now().UnixNano(), 36) + hex.EncodeToString(r[:])
}

// List returns the manifests of tp, newest first (highest offset, then
// latest created). A manifest that cannot be read or parsed, or is larger
// than 64 KiB (maxManifestBytes; ErrCorrupt, wrapped), is skipped and
// reported in skipped (the caller logs them); err is for a store that
// cannot be listed.
func (s *Store) List(ctx context.Context, tp store.TopicPartition) (ms []Manifest, skipped []error, err error) {
	ms, bad, err := s.manifests(ctx, tp)
	for _, b := range bad {
		skipped = append(skipped, b.err)
	}
	return ms, skipped, err
}

// badManifest is a manifest List skips.
type badManifest struct {
	key    string
	stored time.Time
	err    error
	// corrupt: its bytes were read and are no manifest of tp this build
	// writes or reads (ErrCorrupt). Otherwise the store did not serve
	// them, and the manifest may be valid.
	corrupt bool
	// newer is the object a manifest of tp in a format newer than this
	// build's names: valid, maybe, for a newer build ("" if not one).
	newer string
}

// manifests is List, with what it knows of the manifests it skips.
func (s *Store) manifests(ctx context.Context, tp store.TopicPartition) (ms []Manifest, bad []badManifest, err error) {
	objs, err := s.list(ctx, dir(tp)+"manifest/")
	if err != nil {
		return nil, nil, fmt.Errorf("snapshot: listing the snapshots of %s in %s: %w", tp, s.where, err)
	}
	for _, obj := range objs {
		if obj.IsDir || !strings.HasSuffix(obj.Key, ".json") {
			continue
		}
		skip := badManifest{key: obj.Key, stored: obj.ModTime, corrupt: true}
		body, err := s.readManifest(ctx, obj)
		if err != nil {
			if gcerrors.Code(err) == gcerrors.NotFound {
				continue // deleted since the listing
			}
			skip.err, skip.corrupt = err, errors.Is(err, ErrCorrupt)
			bad = append(bad, skip)
			continue
		}
		m, skip, ok := parseManifest(tp, obj, body, skip)
		if !ok {
			bad = append(bad, skip)
			continue
		}
		ms = append(ms, m)
	}
	slices.SortFunc(ms, func(a, b Manifest) int {
		if a.Offset != b.Offset {
			return cmpInt(b.Offset, a.Offset)
		}
		return b.Created.Compare(a.Created)
	})
	return ms, bad, nil
}

// parseManifest parses body, the manifest obj of tp: ok false, with skip
// filled in, when it is not a manifest of tp this build reads.
func parseManifest(tp store.TopicPartition, obj *blob.ListObject, body []byte, skip badManifest) (Manifest, badManifest, bool) {
	var m Manifest
	if err := json.Unmarshal(body, &m); err != nil {
		skip.err = fmt.Errorf("%w: manifest %s: %w", ErrCorrupt, obj.Key, err)
		return m, skip, false
	}
	inDir := strings.HasPrefix(m.Object, dir(tp)+"data/")
	if m.Format != FormatVersion || m.TopicPartition() != tp || !inDir {
		skip.err = fmt.Errorf("%w: manifest %s: format %d of %s, want format %d of %s", ErrCorrupt, obj.Key, m.Format, m.TopicPartition(), FormatVersion, tp)
		if m.Format > FormatVersion && m.TopicPartition() == tp && inDir {
			skip.newer = m.Object
		}
		return m, skip, false
	}
	m.key, m.stored = obj.Key, obj.ModTime
	return m, skip, true
}

// Listing is the manifests of one topic-partition as one listing found
// them, ordered by the offset in their names, highest first, not read yet:
// Next reads them one at a time, so that a restore reads the newest first
// and stops at the first it can use. Not safe for concurrent use.
type Listing struct {
	s    *Store
	tp   store.TopicPartition
	objs []*blob.ListObject
}

// Newest lists the manifests of tp (one listing of its manifest/
// directory; no manifest is read). A manifest whose name holds no offset
// comes after those that do. It returns the store's error when it cannot
// be listed.
func (s *Store) Newest(ctx context.Context, tp store.TopicPartition) (*Listing, error) {
	objs, err := s.list(ctx, dir(tp)+"manifest/")
	if err != nil {
		return nil, fmt.Errorf("snapshot: listing the snapshots of %s in %s: %w", tp, s.where, err)
	}
	objs = slices.DeleteFunc(objs, func(o *blob.ListObject) bool { return o.IsDir || !strings.HasSuffix(o.Key, ".json") })
	offset := func(o *blob.ListObject) int64 {
		name := path.Base(o.Key)
		if i := strings.IndexByte(name, '-'); i > 0 {
			if n, err := strconv.ParseInt(name[:i], 10, 64); err == nil {
				return n
			}
		}
		return -1
	}
	slices.SortStableFunc(objs, func(a, b *blob.ListObject) int {
		if c := cmpInt(offset(b), offset(a)); c != 0 {
			return c
		}
		return strings.Compare(b.Key, a.Key) // same offset: the later id first
	})
	return &Listing{s: s, tp: tp, objs: objs}, nil
}

// Next reads the next manifest, newest first, within perRead (0: ctx
// alone). ok is false once every manifest was returned. skipped is a
// manifest that is not one this build can use (damaged, larger than
// maxManifestBytes, another format or topic-partition; ErrCorrupt,
// wrapped): log it and call Next again. err is the store failing the read
// (a manifest deleted since the listing is passed over silently); the
// manifest stays next, so that the caller may retry it.
func (l *Listing) Next(ctx context.Context, perRead time.Duration) (m Manifest, ok bool, skipped, err error) {
	for len(l.objs) > 0 {
		obj := l.objs[0]
		rctx, cancel := ctx, context.CancelFunc(func() {})
		if perRead > 0 {
			rctx, cancel = context.WithTimeout(ctx, perRead)
		}
		body, err := l.s.readManifest(rctx, obj)
		cancel()
		switch {
		case err != nil && gcerrors.Code(err) == gcerrors.NotFound:
			l.objs = l.objs[1:]
			continue
		case err != nil && !errors.Is(err, ErrCorrupt):
			return Manifest{}, false, nil, fmt.Errorf("snapshot: reading the manifest %s in %s: %w", obj.Key, l.s.where, err)
		}
		l.objs = l.objs[1:]
		if err != nil {
			return Manifest{}, false, err, nil
		}
		m, skip, ok := parseManifest(l.tp, obj, body, badManifest{key: obj.Key})
		if !ok {
			return Manifest{}, false, skip.err, nil
		}
		return m, true, nil, nil
	}
	return Manifest{}, false, nil, nil
}

// Skip passes over the next manifest without reading it: one the store
// keeps failing to serve. It reports its key ("" at the end).
func (l *Listing) Skip() string {
	if len(l.objs) == 0 {
		return ""
	}
	key := l.objs[0].Key
	l.objs = l.objs[1:]
	return key
}

// maxManifestBytes bounds the manifests List reads, in bytes: a manifest
// is a few hundred bytes of JSON, and a larger object under manifest/ (a
// bucket writer's mistake or malice) is skipped as ErrCorrupt rather than
// read into memory at every plan of its partition.
const maxManifestBytes = 64 << 10

// readManifest reads the manifest obj lists, refusing one of more than
// maxManifestBytes (by its listed size, and by what is read: a store may
// list one size and serve more).
func (s *Store) readManifest(ctx context.Context, obj *blob.ListObject) ([]byte, error) {
	tooLarge := func(n int64) error {
		return fmt.Errorf("%w: manifest %s: more than %d bytes (%d)", ErrCorrupt, obj.Key, maxManifestBytes, n)
	}
	if obj.Size > maxManifestBytes {
		return nil, tooLarge(obj.Size)
	}
	r, err := s.b.NewReader(ctx, obj.Key, nil)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", obj.Key, err)
	}
	defer r.Close()
	body, err := io.ReadAll(io.LimitReader(ctxReader{ctx, r}, maxManifestBytes+1))
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", obj.Key, err)
	}
	if len(body) > maxManifestBytes {
		return nil, tooLarge(int64(len(body)))
	}
	return body, nil
}

func cmpInt(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Load reads the snapshot m names and hands it to into: img is the
// snapshot's metadata and checkpoint, and pages calls put with every page.
// It reads the object twice: first to check its size and SHA-256 against
// the manifest, so that a damaged object never reaches the decoder (nor
// into), then to decode it, checking the structure and, again, the size
// and SHA-256 (the object might be replaced between the two reads). An
// object that is not exactly the manifest's is ErrCorrupt (wrapped), a
// missing one too: the snapshot is unusable. into must not make the state
// durable before pages returns nil (store.PartitionState.Import). into's
// error is returned as is; ctx's (wrapped) once ctx is done, within one
// buffer. Fetch and Fetched.Load read the object once, into a file.
func (s *Store) Load(ctx context.Context, m Manifest, into func(img store.Image, pages func(put func(filter.PageID, []byte) error) error) error) error {
	if err := s.check(ctx, m); err != nil {
		return err
	}
	r, err := s.open(ctx, m)
	if err != nil {
		return err
	}
	defer r.Close()
	d, err := newDecoder(ctxReader{ctx, r}, m)
	if err != nil {
		return err
	}
	defer d.close()
	return into(d.img, d.pages)
}

// open opens the object m names; a missing one is ErrCorrupt.
func (s *Store) open(ctx context.Context, m Manifest) (*blob.Reader, error) {
	r, err := s.b.NewReader(ctx, m.Object, nil)
	if err != nil {
		if gcerrors.Code(err) == gcerrors.NotFound {
			return nil, fmt.Errorf("%w: %s: data object missing: %w", ErrCorrupt, m.Object, err)
		}
		return nil, fmt.Errorf("snapshot: reading %s from %s: %w", m.Object, s.where, err)
	}
	return r, nil
}

// check reads the object m names, at most m.Bytes+1 bytes of it, and
// compares its size and SHA-256 with the manifest's.
func (s *Store) check(ctx context.Context, m Manifest) error {
	r, err := s.open(ctx, m)
	if err != nil {
		return err
	}
	defer r.Close()
	h := sha256.New()
	n, err := io.Copy(h, io.LimitReader(ctxReader{ctx, r}, m.Bytes+1))
	if err != nil {
		return readError(m, s.where, err)
	}
	return checkSum(m, n, h)
}

// readError is the error of reading m's object from where: ErrCorrupt
// (wrapped) when the store's client found the bytes it received not
// those the store holds checksums of (the AWS SDK validates S3's CRC32 of
// a whole object, and says "checksum did not match" in an error type it
// does not export), the store's error otherwise.
func readError(m Manifest, where string, err error) error {
	if strings.Contains(err.Error(), "checksum did not match") {
		return fmt.Errorf("%w: %s: %w", ErrCorrupt, m.Object, err)
	}
	return fmt.Errorf("snapshot: reading %s from %s: %w", m.Object, where, err)
}

// checkSum compares an object's size n and SHA-256 h with m's.
func checkSum(m Manifest, n int64, h hash.Hash) error {
	if n != m.Bytes {
		return fmt.Errorf("%w: %s: %d bytes, the manifest says %d", ErrCorrupt, m.Object, n, m.Bytes)
	}
	if sum := hex.EncodeToString(h.Sum(nil)); sum != m.SHA256 {
		return fmt.Errorf("%w: %s: SHA-256 %s, the manifest says %s", ErrCorrupt, m.Object, sum, m.SHA256)
	}
	return nil
}

// Fetched is a snapshot downloaded to a local file and checked against
// its manifest (size and SHA-256): loading it reads no byte from the
// store, so a snapshot that fails is refused before any state is
// replaced. Close removes the file. Not safe for concurrent use.
type Fetched struct {
	m Manifest
	f *os.File
}

// fetchPrefix starts the name of a Fetch's file in its directory.
const fetchPrefix = "snapshot-download-"

// Fetch downloads the snapshot m names into a new file in dir (the data
// directory's filesystem, sized for the state, not a small /tmp) and
// checks its size and SHA-256 against the manifest (RemoveStaleFetches
// deletes the files of a process killed in the middle of one). It writes
// at most m.Bytes+1 bytes to dir, however long the object. It returns
// ErrCorrupt (wrapped) for an object that is missing or not the
// manifest's, ctx's error (wrapped) once ctx is done, within one buffer
// even from a directory store, and the store's error when it cannot be
// read; whatever the error, nothing is left in dir.
func (s *Store) Fetch(ctx context.Context, m Manifest, dir string) (*Fetched, error) {
	r, err := s.open(ctx, m)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	f, err := os.CreateTemp(dir, fetchPrefix+"*")
	if err != nil {
		return nil, fmt.Errorf("snapshot: downloading %s: %w", m.Object, err)
	}
	h := sha256.New()
	// One byte past the manifest's size is enough to refuse a longer
	// object: a restore must not fill the disk with whatever the store
	// holds (RestoreBytes is what it reserves).
	n, err := io.Copy(io.MultiWriter(f, h), io.LimitReader(ctxReader{ctx, r}, m.Bytes+1))
	if err != nil {
		err = readError(m, s.where, err)
	} else {
		err = checkSum(m, n, h)
	}
	if err == nil {
		if _, err = f.Seek(0, io.SeekStart); err != nil {
			err = fmt.Errorf("snapshot: downloading %s: %w", m.Object, err)
		}
	}
	if err != nil {
		f.Close()
		os.Remove(f.Name())
		return nil, err
	}
	return &Fetched{m: m, f: f}, nil
}

// Load hands the fetched snapshot to into, as Store.Load does (the
// structure is checked as the pages are read, ErrCorrupt if wrong). When
// ctx ends, the pages stop at the next 256 with ctx's error, so that a
// revocation does not wait for a whole import.
func (f *Fetched) Load(ctx context.Context, into func(img store.Image, pages func(put func(filter.PageID, []byte) error) error) error) error {
	d, err := newDecoder(bufio.NewReaderSize(f.f, 1<<20), f.m)
	if err != nil {
		return err
	}
	defer d.close()
	return into(d.img, func(put func(filter.PageID, []byte) error) error {
		n := 0
		return d.pages(func(id filter.PageID, b []byte) error {
			if n++; n%256 == 0 && ctx.Err() != nil {
				return ctx.Err()
			}
			return put(id, b)
		})
	})
}

// RemoveStaleFetches deletes the files Fetch left in dir when its process
// was killed in the middle of one; call it before any Fetch into dir.
func RemoveStaleFetches(dir string) {
	if old, err := filepath.Glob(filepath.Join(dir, fetchPrefix+"*")); err == nil {
		for _, o := range old {
			_ = os.Remove(o)
		}
	}
}

// Close removes the downloaded file.
func (f *Fetched) Close() {
	f.f.Close()
	os.Remove(f.f.Name())
}

// Prune deletes old snapshots of tp and what no snapshot needs, returning
// the number of objects deleted (PruneReport also names the unreadable
// manifests it deleted, for the caller to log):
//
//   - the manifests beyond the keep newest by the store's clock, and their
//     data objects, but never the snapshot of the highest offset (the
//     newest by offset, first in List's order), which would otherwise go
//     when another worker's late uploads of lower offsets are newer;
//   - a manifest whose bytes are no manifest of tp this build reads
//     (ErrCorrupt in List's skipped) once older than grace, so that one
//     bad manifest does not stay forever;
//   - the data objects of tp that no manifest names and that were last
//     modified more than grace ago (an object younger than that may belong
//     to an upload whose manifest is not written yet, by this worker or
//     another).
//
// A manifest that might be valid and name any object stops the last
// step, so that no object is deleted that it might name: one the store
// did not serve (a store error, maybe passing; it is never deleted), and
// a corrupt one younger than grace. A manifest of a newer format is kept,
// and so is the object it names. Safe for concurrent use, by this worker
// and others, on the same topic-partition.
func (s *Store) Prune(ctx context.Context, tp store.TopicPartition, keep int, grace time.Duration) (deleted int, err error) {
	p, err := s.PruneReport(ctx, tp, keep, grace)
	return p.Objects, err
}

// Pruned is what PruneReport deleted.
type Pruned struct {
	// Objects is the number of objects deleted: manifests and data
	// objects.
	Objects int
	// Unreadable holds the keys of the corrupt manifests deleted, older
	// than the grace period (their snapshots, if any, were unusable).
	Unreadable []string
}

// PruneReport is Prune, reporting what it deleted; on an error, what it
// deleted before it.
func (s *Store) PruneReport(ctx context.Context, tp store.TopicPartition, keep int, grace time.Duration) (Pruned, error) {
	return s.PruneOf(ctx, tp, store.Origin{}, keep, grace)
}

// PruneOf is PruneReport for a writer whose state is of origin cur: the
// highest offset it keeps is that of the snapshots of cur (or, while
// there is none, of those that record no origin), never one of another
// topic ID or cluster, which ages out like any other. With the zero cur
// every snapshot counts.
func (s *Store) PruneOf(ctx context.Context, tp store.TopicPartition, cur store.Origin, keep int, grace time.Duration) (Pruned, error) {
	var p Pruned
	ms, bad, err := s.manifests(ctx, tp)
	if err != nil {
		return p, err
	}
	del := func(key string) error {
		if err := s.b.Delete(ctx, key); err != nil && gcerrors.Code(err) != gcerrors.NotFound {
			return fmt.Errorf("snapshot: deleting %s from %s: %w", key, s.where, err)
		}
		p.Objects++
		return nil
	}
	var highest string
	if cur.IsZero() {
		if len(ms) > 0 {
			highest = ms[0].key
		}
	} else {
		// ms is newest first: the first of cur, else the first recording
		// no origin.
		for _, m := range ms {
			if m.Origin() == cur {
				highest = m.key
				break
			}
		}
		if highest == "" {
			for _, m := range ms {
				if m.Origin().IsZero() {
					highest = m.key
					break
				}
			}
		}
	}
	// The newest by the store's clock, not by offset (after the group's
	// offsets were reset backwards, snapshots of higher offsets must age
	// out rather than crowd out every new one) nor by the writer's clock
	// (one worker's clock ahead would make its snapshots outlive all);
	// but the highest offset's stays, so that a late upload of a lower
	// offset never leaves only older states.
	slices.SortStableFunc(ms, func(a, b Manifest) int { return b.stored.Compare(a.stored) })
	named := map[string]bool{}
	for i, m := range ms {
		if i < keep || m.key == highest {
			named[m.Object] = true
			continue
		}
		// The manifest first: a snapshot without its manifest does not
		// exist, and then nothing names its object.
		for _, key := range []string{m.key, m.Object} {
			if err := del(key); err != nil {
				return p, err
			}
		}
	}
	mayNameAny := false
	for _, b := range bad {
		switch {
		case b.newer != "":
			named[b.newer] = true
		case b.corrupt && time.Since(b.stored) >= grace:
			if err := del(b.key); err != nil {
				return p, err
			}
			p.Unreadable = append(p.Unreadable, b.key)
		default:
			mayNameAny = true
		}
	}
	if mayNameAny {
		return p, nil
	}
	objs, err := s.list(ctx, dir(tp)+"data/")
	if err != nil {
		return p, fmt.Errorf("snapshot: listing the snapshots of %s in %s: %w", tp, s.where, err)
	}
	for _, obj := range objs {
		if named[obj.Key] || obj.IsDir || time.Since(obj.ModTime) < grace || path.Ext(obj.Key) != ".kds" {
			continue
		}
		if err := del(obj.Key); err != nil {
			return p, err
		}
	}
	return p, nil
}

// list returns the objects under prefix. Another worker may delete one
// while it lists (a directory store then reports it NotFound): the
// listing starts again, up to 5 times.
func (s *Store) list(ctx context.Context, prefix string) ([]*blob.ListObject, error) {
	for attempt := 1; ; attempt++ {
		var objs []*blob.ListObject
		it := s.b.List(&blob.ListOptions{Prefix: prefix})
		for {
			obj, err := it.Next(ctx)
			if err == io.EOF {
				return objs, nil
			}
			if err != nil {
				if gcerrors.Code(err) == gcerrors.NotFound && attempt < 5 {
					break
				}
				return nil, err
			}
			objs = append(objs, obj)
		}
	}
}

// Probe lists one key of the store: an error means it does not answer or
// refuses this worker's credentials.
func (s *Store) Probe(ctx context.Context) error {
	_, _, err := s.b.ListPage(ctx, blob.FirstPageToken, 1, nil)
	if err != nil {
		return fmt.Errorf("snapshot: listing %s: %w", s.where, err)
	}
	return nil
}

// Partitions lists the topic-partitions that have objects in the store,
// sorted by topic, then partition.
func (s *Store) Partitions(ctx context.Context) ([]store.TopicPartition, error) {
	var tps []store.TopicPartition
	topics := s.b.List(&blob.ListOptions{Delimiter: "/"})
	for {
		t, err := topics.Next(ctx)
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("snapshot: listing %s: %w", s.where, err)
		}
		if !t.IsDir {
			continue
		}
		parts := s.b.List(&blob.ListOptions{Prefix: t.Key, Delimiter: "/"})
		for {
			p, err := parts.Next(ctx)
			if err == io.EOF {
				break
			}
			if err != nil {
				return nil, fmt.Errorf("snapshot: listing %s: %w", s.where, err)
			}
			n, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimPrefix(p.Key, t.Key), "/"), 10, 32)
			if !p.IsDir || err != nil {
				continue // not a partition's directory
			}
			tps = append(tps, store.TopicPartition{Topic: strings.TrimSuffix(t.Key, "/"), Partition: int32(n)})
		}
	}
	slices.SortFunc(tps, func(a, b store.TopicPartition) int {
		if c := strings.Compare(a.Topic, b.Topic); c != 0 {
			return c
		}
		return int(a.Partition) - int(b.Partition)
	})
	return tps, nil
}

// Verify reads the whole snapshot m names and checks it against its
// manifest (size and SHA-256 before decoding anything, then structure, as
// Load does), returning the image's metadata and checkpoint; ErrCorrupt
// (wrapped) when it is not exactly the manifest's.
func (s *Store) Verify(ctx context.Context, m Manifest) (store.Image, error) {
	var img store.Image
	err := s.Load(ctx, m, func(i store.Image, pages func(put func(filter.PageID, []byte) error) error) error {
		img = i
		return pages(func(filter.PageID, []byte) error { return nil })
	})
	return img, err
}
