package store

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dgraph-io/badger/v4"
	"github.com/dgraph-io/badger/v4/options"
	"github.com/dgraph-io/badger/v4/skl"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kdedup/kdedup/filter"
	"github.com/kdedup/kdedup/internal/optcheck"
)

// Errors returned by the store. Errors from Badger are wrapped with what was
// being attempted; test them with errors.Is.
var (
	// ErrCorrupt reports state that cannot be right: a page of the wrong
	// length, an undecodable checkpoint or key, an unknown layout version,
	// or a damaged directory (a table failing its checksum or cut short, a
	// value-log file cut short, tables without the MANIFEST that lists
	// them). The state is never used; the error says how to recover.
	ErrCorrupt = errors.New("store: corrupt state")
	// ErrDiskFull is returned by Open and Commit, before Badger writes
	// anything, when the filesystem of Options.Dir has less free space than
	// the next write batch, the memtables' flushes and a level-0 compaction
	// need (kdedup_store_required_free_bytes; see the package comment).
	ErrDiskFull = errors.New("store: not enough free disk space")
	// ErrClosed is returned by a DB or PartitionState used after Close.
	ErrClosed = errors.New("store: closed")
	// ErrLocked is returned by Open when another process holds the directory.
	ErrLocked = errors.New("store: directory in use by another process")
	// ErrLayoutVersion is returned (wrapped, with ErrCorrupt) by Open for
	// a store of another layout version: undamaged state this build cannot
	// read (a binary rolled back or forward).
	ErrLayoutVersion = errors.New("store: another layout version")
	// ErrReadOnly is returned by Commit on a DB opened with ReadOnly.
	ErrReadOnly = errors.New("store: read-only")
	// ErrInvalidOptions is returned by Open for Options it cannot honour.
	ErrInvalidOptions = errors.New("store: invalid options")
	// ErrInvalidTopic is returned by DB.Partition for a topic name Kafka would
	// refuse (empty or longer than 249 bytes).
	ErrInvalidTopic = errors.New("store: invalid topic name")
	// ErrPartitionOpen is returned by DB.Partition when the topic-partition
	// already has an open PartitionState on this DB.
	ErrPartitionOpen = errors.New("store: partition already open")
	// ErrDirty is returned by PartitionState.Consolidate when the partition has
	// uncommitted changes.
	ErrDirty = errors.New("store: uncommitted changes")
	// ErrBatchTooBig is returned by Commit when the write batch exceeds
	// Badger's transaction limit (see Options.FlushBytes).
	ErrBatchTooBig = errors.New("store: write batch exceeds the transaction limit")
)

// Defaults and limits of Options.
const (
	// DefaultPageBytes is the page size (the filter's default); the store
	// owns it: a filter over the store's pages takes the store's
	// (dedup.Open), and the layout of a page is the filter's.
	DefaultPageBytes  = filter.DefaultPageBytes
	DefaultCacheBytes = 256 << 20
	DefaultFlushBytes = 8 << 20

	// DefaultWriteBackInterval is Options.WriteBackInterval's default,
	// DefaultWriteBackBytes Options.WriteBackBytes'.
	DefaultWriteBackInterval = time.Minute
	DefaultWriteBackBytes    = 64 << 20

	// MaxPageBytes is the largest page the filter allows (filter.MaxPageBytes),
	// at most half Badger's largest ValueThreshold (512 KiB).
	MaxPageBytes = min(filter.MaxPageBytes, valueThresholdBytes/2)
	// valueThresholdBytes is Badger's largest ValueThreshold (1 MiB), kept
	// for an InMemory store, which has no value log: Open sets
	// ValueThreshold to PageBytes otherwise, so that whole pages and
	// large log entries go to the value log and the LSM tree holds their
	// pointers.
	valueThresholdBytes = 1 << 20
	// valuePointerBytes is what Badger's transaction size estimate counts
	// for a value in the value log (its pointer).
	valuePointerBytes = 12

	// batchReserveBytes is the room a write batch keeps beside its pages for
	// the chain metadata, the checkpoint and Badger's transaction marker.
	batchReserveBytes = 64 << 10
	// entryOverheadBytes is what Badger's Txn.checkSize adds to key and value
	// length for each entry: 2 meta bytes and 10 for the version suffix.
	entryOverheadBytes = 12
	// Badger's MemTableSize: the least Open gives it (a fourth of Badger's
	// default, so that a small FlushBytes makes a small memtable, and with
	// it small level-0 tables and table builders: MemoryBytes), and the
	// most Open raises it to. Badger allocates a memtable arena of about
	// 1.3x this size and keeps up to NumMemtables (numMemtables) of them.
	minMemTableBytes = 16 << 20
	maxMemTableBytes = 1 << 30

	// numMemtables is Badger's NumMemtables: the memtable being written and
	// one being flushed. Badger's default of 5 lets up to four full
	// memtables (about 1.3x MemTableSize each) wait for level 0 when the
	// flushes fall behind; with two, writes wait instead.
	numMemtables = 2
	// baseTableBytes is Badger's BaseTableSize (default 2 MiB, kept). Badger
	// builds every table in an allocator from a pool that keeps up to 8 of
	// them at the size they grew to while the database is busy. A builder
	// starts at 2 x BaseTableSize rounded up to a power of two and doubles,
	// and a level-0 table is a whole memtable: with whole pages in the
	// value log, the memtable holds keys, pointers and small values, and
	// stays at its least (16 MiB) at the default FlushBytes.
	baseTableBytes = 2 << 20
	// numCompactors is Badger's NumCompactors (default 4; Badger refuses
	// 1): two, on a worker of a few cores.
	numCompactors = 2
	// valueLogFileBytes is Badger's ValueLogFileSize (default 1 GiB): the
	// value log holds whole pages and log entries, rewritten every
	// write-back interval, and value-log GC rewrites or deletes whole
	// files, so smaller files return their space sooner.
	valueLogFileBytes = 256 << 20

	blockCacheBytes = 8 << 20
	gcInterval      = time.Minute
	gcDiscardRatio  = 0.5
)

// Options configure Open. The zero value of a field means its default.
type Options struct {
	// Dir is the Badger directory; created if missing. Required unless
	// InMemory.
	Dir string
	// InMemory keeps everything in memory (Badger's WithInMemory); for tests.
	InMemory bool
	// PageBytes is the size of every page (default 4096, at most
	// MaxPageBytes). It must stay the same for the life of a directory.
	PageBytes int
	// CacheBytes bounds the clean pages kept in memory, shared by every
	// PartitionState of the DB (default 256 MiB); the cache holds
	// CacheBytes/PageBytes pages (at least one), evicted by CLOCK (an
	// approximation of least recently used first; see the package
	// comment). Dirty pages are not counted: they are bounded by FlushBytes.
	CacheBytes int64
	// FlushBytes is the largest write batch, as PartitionState.DirtyBytes counts
	// it, that one Badger transaction must hold (default 8 MiB); the caller
	// commits once DirtyBytes exceeds it, so a batch holds up to FlushBytes
	// plus one page. A page written whole counts PageBytes, a logged one a
	// quarter of a page or its log record if larger, so a batch holds
	// dirty pages of at most four times FlushBytes. Badger refuses a
	// transaction of 15% of its memtable or more, so Open raises MemTableSize
	// above its least, 16 MiB, when FlushBytes needs it, and returns
	// ErrInvalidOptions when that would exceed 1 GiB (MaxFlushBytes: about
	// 1 GiB with 4 KiB pages, less with small pages, and with InMemory,
	// whose pages count whole). Keys count at their longest (a 249-byte
	// topic).
	FlushBytes int64
	// Logger receives the store's logs and Badger's (default slog.Default()).
	// Badger's info messages are logged at debug level, its debug messages
	// four levels below.
	Logger *slog.Logger
	// Registerer registers the kdedup_store_* metrics and the Badger size
	// and cache metrics (kdedup_badger_*); nil registers none.
	Registerer prometheus.Registerer
	// WriteBackInterval is how long a page's changes stay in the log
	// before a write batch writes the page whole (default 1 minute): the
	// log a partition's open applies after a crash holds about this much
	// of its write batches, and a page is written whole at most once per
	// interval by the write-back (see the package comment).
	WriteBackInterval time.Duration
	// WriteBackBytes bounds the logged changes every PartitionState of the
	// DB holds in memory for its pending pages (default 64 MiB): a
	// partition whose patches pass its share (WriteBackBytes over the
	// open partitions) writes its oldest pending pages whole before the
	// interval.
	WriteBackBytes int64
	// ReadOnly opens an existing store without writing to it (Commit
	// returns ErrReadOnly). Read-only processes share the directory with each
	// other but not with a writer (ErrLocked); Badger refuses a directory it
	// never wrote.
	ReadOnly bool
}

func (o Options) withDefaults() Options {
	if o.PageBytes == 0 {
		o.PageBytes = DefaultPageBytes
	}
	if o.CacheBytes == 0 {
		o.CacheBytes = DefaultCacheBytes
	}
	if o.FlushBytes == 0 {
		o.FlushBytes = DefaultFlushBytes
	}
	if o.WriteBackInterval == 0 {
		o.WriteBackInterval = DefaultWriteBackInterval
	}
	if o.WriteBackBytes == 0 {
		o.WriteBackBytes = DefaultWriteBackBytes
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o
}

// Validate reports every field of o, as given, that Open cannot honour, in
// one *optcheck.Error wrapping ErrInvalidOptions, each problem naming the
// field (its Go name: "PageBytes"). It does not apply defaults: Open
// applies them first (a zero field means its default there), and a caller
// that sets every field (kdedup's config) validates its values as they
// are. The limits are the store's own (a caller may support a narrower
// range). Errors: none besides the returned one.
func (o Options) Validate() error {
	l := optcheck.New(ErrInvalidOptions)
	switch {
	case o.InMemory && o.Dir != "":
		l.Add("Dir", o.Dir, "must be empty with InMemory")
	case !o.InMemory && o.Dir == "":
		l.Add("Dir", o.Dir, "must not be empty: the directory of the state")
	}
	if o.InMemory && o.ReadOnly {
		l.Add("ReadOnly", o.ReadOnly, "excludes InMemory")
	}
	if o.PageBytes < 1 || o.PageBytes > MaxPageBytes {
		l.Add("PageBytes", o.PageBytes, fmt.Sprintf("must be from 1 to %d bytes", MaxPageBytes))
	}
	if o.CacheBytes < 0 {
		l.Add("CacheBytes", o.CacheBytes, "must not be negative")
	}
	if o.WriteBackInterval < 0 {
		l.Add("WriteBackInterval", o.WriteBackInterval, "must not be negative")
	}
	if o.WriteBackBytes < 0 {
		l.Add("WriteBackBytes", o.WriteBackBytes, "must not be negative")
	}
	if o.FlushBytes < 0 {
		l.Add("FlushBytes", o.FlushBytes, "must not be negative")
	} else if !l.Has("PageBytes") {
		size, _ := batchLimits(o.PageBytes, o.FlushBytes, o.valueThreshold())
		if most := maxFlushBytes(o.PageBytes, o.valueThreshold()); o.FlushBytes > most {
			l.Add("FlushBytes", o.FlushBytes, fmt.Sprintf(
				"must be at most %d bytes (%d MiB) with %d-byte pages: one write batch is one Badger transaction, and a write batch of up to %d bytes needs a memtable of %d bytes, above the %d-byte limit (smaller pages weigh more per byte: keys)",
				most, most>>20, o.PageBytes, size, memTableBytes(size), int64(maxMemTableBytes)))
		}
	}
	return l.Err()
}

// MaxFlushBytes is the largest Options.FlushBytes that Open accepts with
// pages of pageBytes (1 to MaxPageBytes): the write batch it allows must fit
// in one Badger transaction, which Badger limits to 15% of a memtable, and
// the memtable is at most 1 GiB. About 140 MiB with 4 KiB pages, less with
// smaller pages, whose keys weigh more. It returns 0 for a pageBytes out of
// range.
func MaxFlushBytes(pageBytes int) int64 {
	return maxFlushBytes(pageBytes, int64(pageBytes))
}

func maxFlushBytes(pageBytes int, threshold int64) int64 {
	if pageBytes < 1 || pageBytes > MaxPageBytes {
		return 0
	}
	fits := func(flushBytes int64) bool {
		size, count := batchLimits(pageBytes, flushBytes, threshold)
		mt := memTableBytes(size)
		// Badger's MaxBatchCount is its MaxBatchSize over skl.MaxNodeSize.
		return mt <= maxMemTableBytes && count < 15*mt/100/int64(skl.MaxNodeSize)
	}
	lo, hi := int64(0), int64(maxMemTableBytes) // fits(lo), !fits(hi)
	for hi-lo > 1 {
		mid := lo + (hi-lo)/2
		if fits(mid) {
			lo = mid
		} else {
			hi = mid
		}
	}
	return lo
}

// batchLimits returns the largest Badger transaction, in Badger's own size
// estimate and entry count, that a write batch of FlushBytes plus one page
// (as PartitionState.DirtyBytes counts it) can produce for the longest
// topic name, with values of threshold bytes or more in the value log
// (Badger's ValueThreshold). Its entries are the pages written whole
// (DirtyBytes counts each as PageBytes) and those the write-back takes
// (writeBackPages), each a key and a value or its pointer; one log entry,
// at most the batch's bytes or a pointer; the metadata, checkpoint,
// sequence number and Badger's commit marker.
func batchLimits(pageBytes int, flushBytes, threshold int64) (size, count int64) {
	pb := int64(pageBytes)
	pages := (flushBytes+pb-1)/pb + 1 + writeBackPages(pageBytes, flushBytes)
	value := pb + pageBaseHeader
	if value >= threshold {
		value = valuePointerBytes
	}
	logValue := min(flushBytes+pb, threshold)
	size = pages*(value+maxPageKeyBytes+entryOverheadBytes) + logValue + maxLogKeyBytes + entryOverheadBytes + batchReserveBytes
	return size, pages + 5
}

// writeBackPages is the most pages a write batch writes back: a write
// batch's worth of FlushBytes, at least one and at most
// maxWriteBackPages.
func writeBackPages(pageBytes int, flushBytes int64) int64 {
	return min(max(1, flushBytes/int64(pageBytes)), maxWriteBackPages)
}

// maxWriteBackPages bounds the pages one write batch writes back: 16 MiB
// of 4 KiB pages, 1.2 MB of keys and pointers in its transaction. At 100
// million keys a worker's pages (about 82,000 of 4 KiB) are written back
// once a WriteBackInterval, about 1,400 a second at the default; a replay
// flat out needs more, to keep the patches within WriteBackBytes.
const maxWriteBackPages = 4096

// valueThreshold is Badger's ValueThreshold for o: PageBytes, so that
// whole pages go to the value log, or Badger's largest for an InMemory
// store.
func (o Options) valueThreshold() int64 {
	if o.InMemory {
		return valueThresholdBytes
	}
	return int64(o.PageBytes)
}

// memTableBytes returns the Badger MemTableSize whose transaction limit
// (15*MemTableSize/100, Badger's checkAndSetOptions) exceeds batchSize,
// rounded up to a MiB and never below Badger's default.
func memTableBytes(batchSize int64) int64 {
	mt := (batchSize+1)*100/15 + 1
	mt = (mt + 1<<20 - 1) &^ (1<<20 - 1)
	return max(mt, minMemTableBytes)
}

// tuning holds what tests change; Open uses the production values.
type tuning struct {
	gcInterval time.Duration
	// afterGC, if set, runs after each value-log GC round.
	afterGC func()
	// beforeTxnCommit, if set, runs after a write batch is staged and before
	// Txn.Commit; an error aborts the commit.
	beforeTxnCommit func(TopicPartition) error
	// badgerOpen, if set, replaces badger.Open.
	badgerOpen func(badger.Options) (*badger.DB, error)
	// freeBytes, if set, replaces the statfs of the data directory.
	freeBytes func(dir string) (uint64, error)
	// now, if set, replaces time.Now for the write-back's clock.
	now func() time.Time
	// valueLogFileBytes, if set, replaces valueLogFileBytes.
	valueLogFileBytes int64
}

// DB is the durable state of every topic-partition a worker owns: one Badger
// database plus a page cache shared by its Partitions. Its methods are safe
// for concurrent use; Close must not run concurrently with them or with the
// methods of its Partitions.
type DB struct {
	bdb     *badger.DB
	opts    Options
	where   string // directory or "memory", for errors and logs
	logger  *slog.Logger
	metrics *metrics
	tuning  tuning

	// cache bounds the clean pages of every PartitionState (their page
	// tables hold them).
	cache *pageCache

	// batchSize and batchCount are the transaction a full write batch needs.
	batchSize, batchCount int64
	// writeBackPages is the most pages a write batch writes back;
	// batchDisk the most a write batch writes to the value log.
	writeBackPages int
	batchDisk      int64
	// patchBytes is the patch bytes of every PartitionState's pending
	// pages.
	patchBytes atomic.Int64
	// memTable is Badger's MemTableSize.
	memTable int64

	// dirtyPages counts the dirty pages of every PartitionState
	// (DirtyPageBytes), dirtyPeak the most at once.
	dirtyPages, dirtyPeak atomic.Int64
	// openCount is len(open), read without mu (OverDirtyShare).
	openCount atomic.Int64

	mu   sync.Mutex
	open map[TopicPartition]*PartitionState
	// opening are the topic-partitions being loaded by Partition.
	opening map[TopicPartition]bool
	// closedHits is the page cache hits of the PartitionStates closed
	// since Open (under mu); the open ones count their own
	// (PartitionState.hits), so that a lookup adds to a counter of its
	// partition's, not to one every partition's goroutine writes.
	closedHits uint64
	closed     atomic.Bool

	// space holds the free space reserved for restores (ReserveSpace).
	space struct {
		sync.Mutex
		reserved int64
	}

	stopGC chan struct{}
	gcDone sync.WaitGroup
}

// PageBytes is the page size the DB was opened with (Options.PageBytes
// after defaults): the filters over its pages must use it.
func (db *DB) PageBytes() int { return db.opts.PageBytes }

// Dir is Options.Dir, or the system's temporary directory for a store in
// memory: where files that belong beside the state go.
func (db *DB) Dir() string {
	if db.opts.InMemory || db.opts.Dir == "" {
		return os.TempDir()
	}
	return db.opts.Dir
}

// FlushBytes is the largest write batch one Badger transaction of the DB
// holds (Options.FlushBytes after defaults): callers cut their write
// batches at it or below.
func (db *DB) FlushBytes() int64 { return db.opts.FlushBytes }

// cachePages is the number of pages the page cache holds:
// CacheBytes/PageBytes, at least one.
func (db *DB) cachePages() int {
	return int(max(db.opts.CacheBytes/int64(db.opts.PageBytes), 1))
}

// TopicPartition names one Kafka topic-partition.
type TopicPartition struct {
	Topic     string
	Partition int32
}

// String returns "topic/partition".
func (tp TopicPartition) String() string { return fmt.Sprintf("%s/%d", tp.Topic, tp.Partition) }

// Open opens (creating if needed) the store in opts.Dir, or in memory. It
// writes the layout version into an empty store and refuses a store of
// another version (ErrCorrupt). Before Badger reads the directory it
// verifies every table's checksums and refuses damage (ErrCorrupt, logged
// at ERROR, the files left as they were; see the package comment) and,
// unless ReadOnly, a filesystem with less free space than a write batch
// needs (ErrDiskFull). It returns ErrLocked when another process holds the
// directory and ErrInvalidOptions for bad Options. Unless InMemory or
// ReadOnly, it starts a value-log GC loop (every 5 minutes) that Close
// stops.
func Open(opts Options) (*DB, error) {
	return open(opts, tuning{gcInterval: gcInterval})
}

func open(opts Options, tn tuning) (*DB, error) {
	opts = opts.withDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	if tn.freeBytes == nil {
		tn.freeBytes = statfsFree
	}
	if tn.gcInterval == 0 {
		tn.gcInterval = gcInterval
	}
	db := &DB{
		opts:    opts,
		where:   opts.Dir,
		logger:  opts.Logger,
		tuning:  tn,
		open:    make(map[TopicPartition]*PartitionState),
		opening: make(map[TopicPartition]bool),
		stopGC:  make(chan struct{}),
	}
	if opts.InMemory {
		db.where = "memory"
	}
	db.batchSize, db.batchCount = batchLimits(opts.PageBytes, opts.FlushBytes, opts.valueThreshold())
	db.writeBackPages = int(writeBackPages(opts.PageBytes, opts.FlushBytes))
	if !opts.InMemory {
		db.batchDisk = batchDiskBytes(opts.PageBytes, opts.FlushBytes)
	}
	db.memTable = memTableBytes(db.batchSize)
	db.cache = newPageCache(db.cachePages())

	if !opts.InMemory {
		// A memtable log written with a larger memtable (an older layout,
		// or a larger FlushBytes) must fit the memtable Badger replays it
		// into, or Badger exits the process ("Arena too small") before
		// the layout check can refuse the directory.
		db.memTable = max(db.memTable, memTableOnDisk(opts.Dir))
	}
	bo := badgerOptions(opts, db.memTable)
	if tn.valueLogFileBytes > 0 {
		bo = bo.WithValueLogFileSize(tn.valueLogFileBytes)
	}
	if !opts.InMemory {
		if err := db.checkBeforeOpen(bo); err != nil {
			return nil, db.refused(err)
		}
	}
	bopen := tn.badgerOpen
	if bopen == nil {
		bopen = badger.Open
	}
	var err error
	if db.bdb, err = openBadger(bopen, bo, opts.Logger, db.where); err != nil {
		return nil, db.refused(err)
	}
	if err := db.checkBatchLimit(); err != nil {
		return nil, errors.Join(err, db.bdb.Close())
	}
	if err := db.checkLayout(); err != nil {
		return nil, errors.Join(db.refused(err), db.bdb.Close())
	}
	// Registered last, so that a failed Open leaves the registry as it was.
	db.metrics = newMetrics(opts.Registerer, db)
	if !opts.InMemory && !opts.ReadOnly {
		db.gcDone.Add(1)
		go db.valueLogGC()
	}
	return db, nil
}

// badgerOptions returns the Badger options of a store with opts and a
// memtable of memTable bytes.
func badgerOptions(opts Options, memTable int64) badger.Options {
	return badger.DefaultOptions(opts.Dir).
		WithInMemory(opts.InMemory).
		WithReadOnly(opts.ReadOnly).
		// Pages are fingerprints: random bytes that do not compress.
		WithCompression(options.None).
		WithBlockCacheSize(blockCacheBytes).
		WithMemTableSize(memTable).
		WithNumMemtables(numMemtables).
		WithBaseTableSize(baseTableBytes).
		WithNumCompactors(numCompactors).
		WithValueThreshold(opts.valueThreshold()).
		WithValueLogFileSize(valueLogFileBytes).
		// Open verifies every table in full (checkDir); Badger verifies each
		// block it reads from then on, and each value read from the value log.
		WithChecksumVerificationMode(options.OnBlockRead).
		WithVerifyValueChecksum(true).
		// Each key is written by one PartitionState only and Commit reads nothing,
		// so there is nothing to conflict with.
		WithDetectConflicts(false).
		WithLogger(badgerLogger{opts.Logger.With("component", "badger")})
}

// checkBeforeOpen refuses a damaged directory (checkDir) and, unless
// ReadOnly, one without the free space a write batch needs (ErrDiskFull).
func (db *DB) checkBeforeOpen(bo badger.Options) error {
	release, err := lockDir(db.opts.Dir, db.opts.ReadOnly)
	if err != nil {
		return err
	}
	defer release()
	levels, err := checkDir(db.opts.Dir, bo)
	if err != nil {
		return err
	}
	if db.opts.ReadOnly {
		return nil
	}
	free, err := freeBytesAt(db.opts.Dir, db.tuning.freeBytes)
	if err != nil {
		return fmt.Errorf("store: checking the free space of %s: %w", db.where, err)
	}
	return db.checkSpace(free, db.writeReserve()+compactionBytes(levels))
}

func openBadger(bopen func(badger.Options) (*badger.DB, error), bo badger.Options, logger *slog.Logger, where string) (*badger.DB, error) {
	bdb, err := bopen(bo)
	// After a crash the first Open can fail while replaying the memtable
	// files and the second succeed (badger#2207). Never wipe the directory:
	// the state is worth more than the time to find out why.
	if err != nil && strings.Contains(err.Error(), "while opening memtables") {
		logger.Warn("badger open failed while opening memtables; retrying once",
			"dir", where, "err", err)
		bdb, err = bopen(bo)
	}
	if err != nil {
		return nil, badgerOpenError(where, err)
	}
	return bdb, nil
}

// checkBatchLimit verifies that Badger accepts a full write batch in one
// transaction, in case Badger's limit ever stops being 15% of the memtable.
func (db *DB) checkBatchLimit() error {
	if db.batchSize >= db.bdb.MaxBatchSize() || db.batchCount >= db.bdb.MaxBatchCount() {
		return fmt.Errorf("%w: FlushBytes %d needs transactions of %d bytes and %d entries, Badger allows less than %d bytes and %d entries",
			ErrInvalidOptions, db.opts.FlushBytes, db.batchSize, db.batchCount, db.bdb.MaxBatchSize(), db.bdb.MaxBatchCount())
	}
	return nil
}

// checkLayout refuses a store written with another key layout and stamps an
// empty one with the current version.
func (db *DB) checkLayout() error {
	var (
		found, empty bool
		version      uint32
	)
	err := db.bdb.View(func(txn *badger.Txn) error {
		item, err := txn.Get(layoutKey)
		if errors.Is(err, badger.ErrKeyNotFound) {
			it := txn.NewIterator(badger.IteratorOptions{})
			defer it.Close()
			it.Rewind()
			empty = !it.Valid()
			return nil
		}
		if err != nil {
			return err
		}
		found = true
		return item.Value(func(v []byte) error {
			if len(v) != 4 {
				return fmt.Errorf("layout version is %d bytes, want 4: %w", len(v), ErrCorrupt)
			}
			version = binary.BigEndian.Uint32(v)
			return nil
		})
	})
	switch {
	case err != nil:
		return fmt.Errorf("store: reading the layout version in %s: %w", db.where, err)
	case found && version != layoutVersion:
		return fmt.Errorf("store: opening %s: layout version %d on disk, this build reads version %d: %w: %w",
			db.where, version, layoutVersion, ErrLayoutVersion, ErrCorrupt)
	case found:
		return nil
	case !empty:
		return fmt.Errorf("store: opening %s: state without a layout version: %w", db.where, ErrCorrupt)
	case db.opts.ReadOnly:
		return nil
	}
	v := binary.BigEndian.AppendUint32(nil, layoutVersion)
	if err := db.bdb.Update(func(txn *badger.Txn) error { return txn.Set(layoutKey, v) }); err != nil {
		return fmt.Errorf("store: writing layout version %d in %s: %w", layoutVersion, db.where, err)
	}
	return nil
}

// valueLogGC rewrites value-log files that are at least half garbage: the
// write-back rewrites pages whole into the value log, so its older files
// turn to garbage as it goes. A round is skipped while the free space is
// short of what a write batch needs plus a value-log file, which one GC
// rewrite can write before it deletes the old file.
func (db *DB) valueLogGC() {
	defer db.gcDone.Done()
	t := time.NewTicker(db.tuning.gcInterval)
	defer t.Stop()
	for {
		select {
		case <-db.stopGC:
			return
		case <-t.C:
		}
		for {
			if err := db.checkFreeSpaceBut(-valueLogFileBytes); err != nil {
				db.logger.Warn("value-log GC skipped: too little free space for its rewrite", "dir", db.where, "err", err)
				break
			}
			err := db.bdb.RunValueLogGC(gcDiscardRatio)
			if errors.Is(err, badger.ErrNoRewrite) || errors.Is(err, badger.ErrRejected) {
				break
			}
			if err != nil {
				db.logger.Warn("value-log GC", "dir", db.where, "err", err)
				break
			}
			select {
			case <-db.stopGC:
				return
			default:
			}
		}
		if db.tuning.afterGC != nil {
			db.tuning.afterGC()
		}
	}
}

// Close stops the value-log GC and closes Badger. Later calls return nil.
// Open Partitions become unusable (ErrClosed); their uncommitted pages are
// lost.
func (db *DB) Close() error {
	if db.closed.Swap(true) {
		return nil
	}
	close(db.stopGC)
	db.gcDone.Wait()
	db.cache.purge()
	if err := db.bdb.Close(); err != nil {
		return fmt.Errorf("store: closing badger at %s: %w", db.where, err)
	}
	return nil
}

// Partition opens the state of one topic-partition, loading its chain
// metadata and checkpoint if it has any; a topic-partition without state
// starts empty. A topic-partition has at most one open PartitionState per DB
// (ErrPartitionOpen otherwise): Close it before opening it again. The topic
// must be 1 to 249 bytes (ErrInvalidTopic).
func (db *DB) Partition(topic string, partition int32) (*PartitionState, error) {
	tp := TopicPartition{Topic: topic, Partition: partition}
	if len(topic) == 0 || len(topic) > maxTopicBytes {
		return nil, fmt.Errorf("store: opening %s: %d bytes, want 1..%d: %w", tp, len(topic), maxTopicBytes, ErrInvalidTopic)
	}
	if db.closed.Load() {
		return nil, fmt.Errorf("store: opening %s: %w", tp, ErrClosed)
	}
	db.mu.Lock()
	if _, ok := db.open[tp]; ok || db.opening[tp] {
		db.mu.Unlock()
		return nil, fmt.Errorf("store: opening %s: %w", tp, ErrPartitionOpen)
	}
	// Loaded without the lock: replaying a partition's log takes a
	// point read per page it names, and the lock is on every partition's
	// path (PrefetchLimit, release).
	db.opening[tp] = true
	db.mu.Unlock()
	p := &PartitionState{
		db:           db,
		tp:           tp,
		prefix:       partitionPrefix(topic, partition),
		pending:      make(map[filter.PageID]*pendingPage),
		prefetchSeen: make(map[filter.PageID]struct{}),
	}
	start := time.Now()
	err := p.load()
	took := time.Since(start)
	entries, pending, patch := len(p.logSeqs), len(p.pending), p.patchBytes
	db.mu.Lock()
	delete(db.opening, tp)
	if err == nil {
		db.open[tp] = p
		db.openCount.Store(int64(len(db.open)))
	}
	db.mu.Unlock()
	if err != nil {
		return nil, err
	}
	db.metrics.openSeconds.Observe(took.Seconds())
	if entries > 0 {
		db.logger.Info("partition state opened, its log applied", "partition", tp.String(),
			"log_entries", entries, "pending_pages", pending, "patch_bytes", patch, "seconds", took.Seconds())
	}
	return p, nil
}

// cacheHits is kdedup_store_page_cache_hits_total: the hits of every
// PartitionState, open or closed since Open.
func (db *DB) cacheHits() float64 {
	db.mu.Lock()
	defer db.mu.Unlock()
	n := db.closedHits
	for _, p := range db.open {
		n += p.hits.Load()
	}
	return float64(n)
}

func (db *DB) release(tp TopicPartition) {
	db.mu.Lock()
	if p := db.open[tp]; p != nil {
		db.closedHits += p.hits.Load()
	}
	delete(db.open, tp)
	db.openCount.Store(int64(len(db.open)))
	db.mu.Unlock()
}

// Partitions returns every topic-partition that has state in the store,
// sorted by topic, then partition.
func (db *DB) Partitions() ([]TopicPartition, error) {
	if db.closed.Load() {
		return nil, fmt.Errorf("store: listing partitions: %w", ErrClosed)
	}
	var tps []TopicPartition
	err := db.bdb.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: []byte{tagPartition}})
		defer it.Close()
		for it.Rewind(); it.Valid(); {
			tp, n, err := decodePartitionPrefix(it.Item().Key())
			if err != nil {
				return err
			}
			tps = append(tps, tp)
			// Every key of the partition is prefix|tag with a tag below 0xff.
			it.Seek(append(it.Item().KeyCopy(nil)[:n], 0xff))
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("store: listing partitions in %s: %w", db.where, err)
	}
	sort.Slice(tps, func(i, j int) bool {
		if tps[i].Topic != tps[j].Topic {
			return tps[i].Topic < tps[j].Topic
		}
		return tps[i].Partition < tps[j].Partition
	})
	return tps, nil
}

// badgerLogger adapts Badger's logger to slog. Badger logs routine progress
// at info, so that becomes debug; Badger's debug lines (one per write) go
// below debug, where handlers drop them unless asked. Badger's warning that
// its block or index cache "might be too small" (two lines a minute while
// the hit ratio is under 0.4) goes to debug too: the store keeps Badger's
// block cache at blockCacheBytes on purpose, since decoded pages are cached
// in the page cache (Options.CacheBytes), so that a state larger than the
// page cache, or a rebuild, which reads each page from Badger once, would
// log it every minute and point the operator at the wrong cache; the
// kdedup_store_page_cache_* metrics and the worker's WARN of a state
// larger than the page cache are what tell that the page cache is too
// small.
type badgerLogger struct{ l *slog.Logger }

// badgerCacheWarnings are the starts of Badger's cache-size warnings
// (badger v4 db.go, monitorCache).
var badgerCacheWarnings = []string{"Block cache might be too small", "Index cache might be too small", "Cache life expectancy"}

func (b badgerLogger) log(level slog.Level, format string, args []any) {
	ctx := context.Background()
	if !b.l.Enabled(ctx, level) {
		return
	}
	b.l.Log(ctx, level, strings.TrimSpace(fmt.Sprintf(format, args...)))
}

func (b badgerLogger) Errorf(f string, a ...any) { b.log(slog.LevelError, f, a) }
func (b badgerLogger) Warningf(f string, a ...any) {
	level := slog.LevelWarn
	for _, w := range badgerCacheWarnings {
		if strings.HasPrefix(fmt.Sprintf(f, a...), w) {
			level = slog.LevelDebug
		}
	}
	b.log(level, f, a)
}
func (b badgerLogger) Infof(f string, a ...any)  { b.log(slog.LevelDebug, f, a) }
func (b badgerLogger) Debugf(f string, a ...any) { b.log(slog.LevelDebug-4, f, a) }

// addPatchBytes counts n more patch bytes of pending pages.
func (db *DB) addPatchBytes(n int64) { db.patchBytes.Add(n) }

// patchShare is the patch bytes of pending pages one PartitionState may
// hold before its write-back runs ahead of the interval: WriteBackBytes
// shared equally by the open PartitionStates.
func (db *DB) patchShare() int64 {
	return db.opts.WriteBackBytes / max(1, db.openCount.Load())
}

// PatchBytes is the memory the logged changes of every PartitionState's
// pending pages hold (bounded by Options.WriteBackBytes, which the
// write-back follows). Safe for concurrent use.
func (db *DB) PatchBytes() int64 { return db.patchBytes.Load() }

// now is the time a write batch is committed at, for the write-back.
func (db *DB) now() time.Time {
	if db.tuning.now != nil {
		return db.tuning.now()
	}
	return time.Now()
}

// memTableOnDisk returns the MemTableSize the memtable logs in dir were
// written with, 0 without one: Badger creates a memtable log at twice its
// MemTableSize.
func memTableOnDisk(dir string) int64 {
	logs, _ := filepath.Glob(filepath.Join(dir, "*.mem"))
	var most int64
	for _, path := range logs {
		if info, err := os.Stat(path); err == nil {
			most = max(most, info.Size()/2)
		}
	}
	return (most + 1<<20 - 1) &^ (1<<20 - 1)
}
