package dedup

import (
	"fmt"

	"github.com/kdedup/kdedup/filter"
	"github.com/kdedup/kdedup/store"
)

// Opener opens the Deduplicators of one process: every topic-partition of one
// store with the same Options. A consumer holds an Opener and asks it, and
// the Deduplicators it opens, what the Options decide for all of them (which
// decisions forward, whether changes are staged, the pages a record may
// dirty, where a rebuild may start), instead of being handed copies of
// those answers that could disagree with the Deduplicators it runs. Its
// Options are fixed at NewOpener. Safe for concurrent use as far as
// store.DB.Partition is; each Partition it opens is owned by one
// goroutine.
type Opener struct {
	db   *store.DB
	opts Options
	m    *Metrics
}

// NewOpener returns an Opener of the partitions of db with opts, counted
// in m (nil: unregistered metrics). opts.Filter.PageBytes 0 is db's page
// size. It returns ErrOptions (wrapped) for opts out of range or a page
// size other than db's, and the filter's error for invalid opts.Filter,
// which Open would return for every partition.
func NewOpener(db *store.DB, opts Options, m *Metrics) (*Opener, error) {
	opts, err := opts.withDefaults().over(db)
	if err != nil {
		return nil, err
	}
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	f := opts.Filter.WithDefaults()
	f.KeySpec = opts.Key.String() // as Open stores it
	if err := f.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrOptions, err)
	}
	return &Opener{db: db, opts: opts, m: m}, nil
}

// Open opens the state of topic/partition (see Open).
func (o *Opener) Open(topic string, partition int32) (*Deduplicator, error) {
	return Open(o.db, topic, partition, o.opts, o.m)
}

// OpenRouted opens the state of topic/partition as Open does, for records
// whose dedup key Options.Key derived before and carried as their record
// key (Key.Routed): a repartition topic's. The state's parameters, key
// spec included, are those of Open.
func (o *Opener) OpenRouted(topic string, partition int32) (*Deduplicator, error) {
	opts := o.opts
	opts.Key = opts.Key.Routed()
	return Open(o.db, topic, partition, opts, o.m)
}

// StateParams returns the parameters a state under o is written with and
// refused for when they differ (Open): the filter parameters with the key
// spec, after defaults. Workers of one consumer group share partitions and
// so must agree on them.
func (o Options) StateParams() filter.Params {
	p := o.Filter.WithDefaults()
	p.KeySpec = o.Key.String()
	return p
}

// FlushBytes is the largest write batch the store holds in one Badger
// transaction (store.DB.FlushBytes): a worker cuts its write batches at
// it or below.
func (o *Opener) FlushBytes() int64 { return o.db.FlushBytes() }

// PageBytes is the size of a filter page, in bytes: the store's
// (store.DB.PageBytes), which owns it; every deduplicator the Opener
// opens uses pages of this size.
func (o *Opener) PageBytes() int { return o.db.PageBytes() }

// DirtyPageBytes is the memory the dirty pages of every partition of o's
// store hold (store.DB.DirtyPageBytes). Safe for concurrent use.
func (o *Opener) DirtyPageBytes() int64 { return o.db.DirtyPageBytes() }

// Export reads the committed state of topic/partition as of one write
// batch, whether or not it is open (store.DB.Export). Safe for
// concurrent use.
func (o *Opener) Export(tp store.TopicPartition, header func(store.Image) error, page func(filter.PageID, []byte) error) (found bool, err error) {
	return o.db.Export(tp, header, page)
}

// Options returns the Options every Deduplicator of o is opened with.
func (o *Opener) Options() Options { return o.opts }

// Forwards reports whether a record decided d goes to the output topic
// under p's Options (Options.Forwards).
func (p *Deduplicator) Forwards(d Decision) bool { return p.opts.Forwards(d) }

// MaxDirtyBytesPerRecord bounds the size of the write batch deciding one
// record can add, in bytes: MaxDirtyPagesPerRecord pages of
// Filter.PageBytes (after defaults), as Deduplicator.DirtyBytes counts them.
// Static, so that a batch of records can be sized before any partition is
// open: ask it of an Opener's Options (Opener.Options), whose PageBytes is
// the store's; Options not yet given to NewOpener may hold 0, read as the
// default 4 KiB, not the store's page size.
func (o Options) MaxDirtyBytesPerRecord() int64 {
	return int64(o.MaxDirtyPagesPerRecord()) * int64(o.Filter.WithDefaults().PageBytes)
}

// RebuildsFromWindow reports whether the filter state of a partition at
// any offset is a function of the records of the dedup window before it
// alone, so that a rebuild may replay from RebuildFrom instead of the
// earliest retained offset. It holds with a window (Filter.Window),
// Refresh and MaxOccurrences 1: a key is then remembered iff one of its
// records lies in a live generation. Without Refresh a key is forwarded
// again a window after its last forwarded record, which depends on records
// further back (a chain of forwards), and with a higher limit the count of
// copies does too: a rebuild from the window's start would decide
// differently.
func (o Options) RebuildsFromWindow() bool {
	return o.Filter.WithDefaults().Window > 0 && o.Refresh && o.maxOccurrences() == 1
}

// RebuildFrom is the record timestamp (milliseconds since the Unix epoch)
// from which a rebuild must replay a partition's input so that its filter
// decides the records after the rebuild as one that processed the whole
// input would, given the partition's watermark where the rebuild ends (the
// highest timestamp before it): the start of the generation before the
// oldest one live at the watermark (filter.Params.OldestLive). Records
// before it are in generations that the whole-input filter dropped; the
// extra generation absorbs timestamps up to a span out of order (further
// out of order, a key first seen before it can be missed). ok is false
// when RebuildsFromWindow does not hold: a rebuild then replays everything
// retained.
func (o Options) RebuildFrom(watermark int64) (millis int64, ok bool) {
	if !o.RebuildsFromWindow() {
		return 0, false
	}
	return o.Filter.GenerationStart(o.Filter.OldestLive(watermark) - 1), true
}
