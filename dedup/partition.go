package dedup

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kdedup/kdedup/filter"
	"github.com/kdedup/kdedup/internal/optcheck"
	"github.com/kdedup/kdedup/store"
)

// Decision is what happens to one input record.
type Decision uint8

const (
	// Forward: the key was not seen before; it is now remembered and the
	// record goes to the output topic.
	Forward Decision = iota
	// Duplicate: the key was seen before (or, rarely, is a false positive of
	// the filter); the record is dropped.
	Duplicate
	// Delete: a tombstone (null value) or a record marked by the delete
	// header; its key is removed and the record is forwarded unless
	// Options.DropTombstones is set.
	Delete
	// Unkeyed: no dedup key could be derived; the record is forwarded
	// unchanged and counted.
	Unkeyed
	// OverLimit: with Options.MaxOccurrences above 1, the key was forwarded
	// MaxOccurrences times since it was last deleted (or, rarely, other keys
	// sharing its fingerprint make it look so); the record is dropped. With
	// MaxOccurrences 1 a repeat is a Duplicate instead.
	OverLimit
)

func (d Decision) String() string {
	switch d {
	case Forward:
		return "forward"
	case Duplicate:
		return "duplicate"
	case Delete:
		return "delete"
	case Unkeyed:
		return "unkeyed"
	case OverLimit:
		return "over-limit"
	}
	return "decision(" + strconv.Itoa(int(d)) + ")"
}

// Options configure a Deduplicator. The zero value deduplicates by record key
// with the default filter parameters and forwards tombstones.
type Options struct {
	// Key derives the dedup key (default: the record key).
	Key Key
	// DeleteHeader and DeleteValue mark deletes besides tombstones: a record
	// with a header DeleteHeader whose value is DeleteValue removes its key.
	// Empty DeleteHeader disables it.
	DeleteHeader, DeleteValue string
	// DropTombstones drops deletes instead of forwarding them (default:
	// forward, so downstream compacted topics see them). With a json:PATH
	// Key a tombstone has no value to read its key from: it is Unkeyed,
	// forwarded, and deletes nothing; use DeleteHeader to delete there.
	DropTombstones bool
	// Filter are the parameters of each partition's chained cuckoo filter.
	// Its PageBytes is the store's: 0 takes the store's page size, and
	// another one is refused (ErrOptions) by Open and NewOpener.
	Filter filter.Params
	// Staged keeps every filter change in an overlay until CommitStaged
	// (or drops it on DiscardStaged), for exactly-once delivery, where a
	// Kafka transaction may abort and rewind the input. The state it
	// commits is the one an unstaged Deduplicator commits for the same
	// records, so Staged may change between runs over one state.
	Staged bool
	// MaxOccurrences is how many records of one key are forwarded before
	// the rest are dropped, counted since the key was last deleted: 1
	// (default; 0 means 1) is deduplication, repeats are Duplicate; above 1
	// the filter keeps one fingerprint copy per forwarded record (Chain.Add,
	// CF.ADD) and a record whose key already has MaxOccurrences copies
	// (Chain.Count, CF.COUNT) is OverLimit. At most 2*BucketSize, the
	// copies one bucket pair holds: more would spill into a new sub-filter
	// on every occurrence of a hot key. Open returns ErrOptions otherwise.
	//
	// Count also counts the copies of other keys that share the key's
	// fingerprint and buckets, so a key can be throttled before its
	// MaxOccurrences-th record, with probability about the filter's
	// estimated false-positive rate per record; it is never forwarded more
	// than MaxOccurrences times. The limit may change between runs over
	// the same state: deletes remove every copy whatever the limit was.
	MaxOccurrences int
	// HashSeed, when not zero, is the filter's hash seed for a partition
	// whose state is created by Open (none stored): for tests and
	// benchmarks that compare state bytes across runs. The zero value
	// (default) draws a secret seed per topic-partition from crypto/rand
	// (filter.New), so that keys colliding in the filter cannot be computed
	// from outside; stored state keeps the seed it was created with.
	HashSeed filter.Seed
	// ParamNames are the names the operator sets each filter parameter by
	// (Filter's fields, and Key as filter.ParamKeySpec), for the error
	// Open returns when a state was written with other values; internal/app
	// passes the KDEDUP_* variables. A parameter without a name (default:
	// all) is named as package filter names it ("capacity").
	ParamNames map[filter.Param]string
	// Refresh, with a dedup window (Filter.Window), re-remembers a key each
	// time one of its records is dropped (sliding expiry, like Flink's
	// state TTL updated on read and write, or Vector's dedupe refresh): the
	// oldest copy of its fingerprint moves to the generation of the dropped
	// record's timestamp (filter.Chain.Refresh), so a key seen at least
	// once a window stays a duplicate for as long as it keeps coming. The
	// number of copies never grows. Without a window it does nothing.
	Refresh bool
}

// ErrOptions is returned (wrapped) by Open for Options out of range.
var ErrOptions = errors.New("dedup: invalid options")

func (o Options) maxOccurrences() int { return max(1, o.MaxOccurrences) }

// over returns o for the pages of db: the store owns the page size, so
// Filter.PageBytes 0 takes db's, and another one is ErrOptions naming
// both (the chain would ask for pages the store does not have).
func (o Options) over(db *store.DB) (Options, error) {
	switch pb := db.PageBytes(); o.Filter.PageBytes {
	case 0:
		o.Filter.PageBytes = pb
	case pb:
	default:
		return o, fmt.Errorf("%w: the filter's PageBytes %d differs from the store's %d", ErrOptions, o.Filter.PageBytes, pb)
	}
	return o, nil
}

// Validate reports every field of o, as given, that Open cannot honour,
// in one *optcheck.Error wrapping ErrOptions, each problem naming the
// field (its Go name): MaxOccurrences from 1 to twice the filter's bucket
// size (a bucket pair holds that many copies of a key's fingerprint; a
// higher limit would add a sub-filter on every occurrence of a hot key),
// and a DeleteValue without a DeleteHeader. The filter's parameters are the filter's to
// validate (filter.Params.Validate; NewOpener and Open ask it). It does
// not apply defaults: Open treats MaxOccurrences 0 as 1 first.
func (o Options) Validate() error {
	l := optcheck.New(ErrOptions)
	b := o.Filter.WithDefaults().BucketSize
	if o.MaxOccurrences < 1 {
		l.Add("MaxOccurrences", o.MaxOccurrences, "must be at least 1")
	} else if filter.ValidBucketSize(b) && o.MaxOccurrences > 2*b {
		l.Add("MaxOccurrences", o.MaxOccurrences, fmt.Sprintf("must be at most twice the bucket size, %d: a bucket pair holds that many copies of a key's fingerprint", 2*b))
	}
	if o.DeleteValue != "" && o.DeleteHeader == "" {
		l.Add("DeleteHeader", o.DeleteHeader, "must name the header that DeleteValue marks deletes with")
	}
	return l.Err()
}

// withDefaults returns o with MaxOccurrences 0 as 1.
func (o Options) withDefaults() Options {
	if o.MaxOccurrences == 0 {
		o.MaxOccurrences = 1
	}
	return o
}

// Forwards reports whether a record decided d goes to the output topic.
func (o Options) Forwards(d Decision) bool {
	switch d {
	case Forward, Unkeyed:
		return true
	case Delete:
		return !o.DropTombstones
	}
	return false
}

// Deduplicator deduplicates one topic-partition. It is not safe for concurrent
// use: one goroutine owns it, which is what keeps decisions in offset order.
type Deduplicator struct {
	topic      string
	partition  int32
	opts       Options
	state      *store.PartitionState
	chain      *filter.Chain
	m          partitionMetrics
	lastKeyErr error

	// With Options.Staged: the overlay holding uncommitted page changes,
	// the chain metadata as of the last CommitStaged, and the decisions
	// counted since (metrics only count decisions that took effect).
	overlay    *filter.Overlay
	stableMeta []byte
	tally      tally

	// ahead is the poll Prefetch reads ahead of its decisions, and
	// buckets the poll whose buckets decide prefetches.
	ahead   readAhead
	buckets bucketAhead
	// hashed holds the keys and hashes of the records whose buckets were
	// prefetched, by offset, so that deciding them derives and hashes
	// each key once.
	hashed [2 * bucketsAhead]hashedKey
}

// tally counts decisions not yet added to the metrics.
type tally struct {
	consumed, forwarded, duplicates, overLimit, deletes, deletesMissing, unkeyed, replayed, expired, full int
}

// paramsError is the error Open returns for a state written with other
// filter parameters: each that differs by its name in ParamNames, with the
// stored and the configured value, and the two ways out.
func (o Options) paramsError(perr *filter.ParamsError) error {
	diffs := make([]string, len(perr.Diffs))
	for i, d := range perr.Diffs {
		name, ok := o.ParamNames[d.Param]
		if !ok {
			name = string(d.Param)
		}
		diffs[i] = fmt.Sprintf("%s stored %s, configured %s", name, d.Stored, d.Configured)
	}
	values := "value"
	if len(diffs) > 1 {
		values = "values"
	}
	return fmt.Errorf("%w: %s (restore the stored %s, or move the data directory aside to rebuild the state by replay under the configured %s)",
		filter.ErrParams, strings.Join(diffs, "; "), values, values)
}

// Open opens the state of topic/partition in db, or starts an empty filter
// when there is none. It returns filter.ErrParams (wrapped) when the stored
// state was written with other filter parameters or another dedup key spec
// (opts.Key, stored in the chain metadata: the fingerprints of keys derived
// one way match nothing derived another), naming each that differs by
// opts.ParamNames with its stored and configured values, or with another
// format version, and store or filter corruption errors as they are: state
// is never wiped. Every partition state a Deduplicator uses is opened here,
// so no state decides records under parameters it was not written with.
// It returns ErrOptions (wrapped) when opts are out of range.
// m may be shared by every Deduplicator of the process; nil means unregistered
// metrics.
func Open(db *store.DB, topic string, partition int32, opts Options, m *Metrics) (*Deduplicator, error) {
	opts, err := opts.withDefaults().over(db)
	if err != nil {
		return nil, fmt.Errorf("opening %s/%d: %w", topic, partition, err)
	}
	if err := opts.Validate(); err != nil {
		return nil, fmt.Errorf("opening %s/%d: %w", topic, partition, err)
	}
	st, err := db.Partition(topic, partition)
	if err != nil {
		return nil, fmt.Errorf("opening state of %s/%d: %w", topic, partition, err)
	}
	var pager filter.Pager = st
	var overlay *filter.Overlay
	if opts.Staged {
		overlay = filter.NewOverlay(st)
		pager = overlay
	}
	opts.Filter.KeySpec = opts.Key.String()
	var chain *filter.Chain
	switch meta := st.Meta(); {
	case len(meta) == 0 && opts.HashSeed != (filter.Seed{}):
		chain, err = filter.NewWithSeed(opts.Filter, opts.HashSeed, pager)
	case len(meta) == 0:
		chain, err = filter.New(opts.Filter, pager)
	default:
		chain, err = filter.Open(meta, opts.Filter, pager)
		var perr *filter.ParamsError
		if errors.As(err, &perr) {
			err = opts.paramsError(perr)
		}
	}
	if err != nil {
		st.Close()
		return nil, fmt.Errorf("opening filter of %s/%d: %w", topic, partition, err)
	}
	if m == nil {
		m = NewMetrics(nil)
	}
	p := &Deduplicator{topic: topic, partition: partition, opts: opts, state: st, chain: chain, m: m.forPartition(topic, partition, chain.Params().TargetFPR),
		overlay: overlay, stableMeta: chain.MarshalMeta()}
	p.m.observe(chain.Stats())
	return p, nil
}

// Decide decides record r (which must be the next record of the partition in
// offset order) and applies it to the filter. The error is non-nil only when
// the state cannot be read or written (storage errors): the partition must
// then stop without committing, since the decision is unknown.
//
// A full chain is not an error: when the generation a key goes to already
// has filter.MaxSubFilters sub-filters and none can take it (reachable with
// Filter.Expansion 1), the record is decided as if the key were not
// remembered, a new key is forwarded and its repeats will be forwarded
// too, and it is counted in kdedup_filter_full_records_total. A record is
// never lost and the partition never stops on one; kdedup_filter_near_full
// warns a sub-filter before. A failed refresh of a dropped record's key
// counts the same and leaves the key where it was.
func (p *Deduplicator) Decide(r *kgo.Record) (Decision, error) {
	d, err := p.decide(r)
	if err == nil {
		p.count(d)
	}
	p.syncStaged()
	return d, err
}

// syncStaged tells the store how many pages the overlay holds staged, so
// that the worker's bound on changed pages counts them
// (store.PartitionState.SetStagedPages).
func (p *Deduplicator) syncStaged() {
	if p.overlay != nil {
		p.state.SetStagedPages(p.overlay.Staged())
	}
}

// Presize sizes the filter of a partition that has no keys yet for a
// replay of records records (filter.Chain.Presize: for about records/2
// keys, within 16 times the configured capacity; nothing with a window),
// and reports whether it did. A rebuild calls it before its replay: the
// replay's length bounds the keys it inserts. It writes nothing; the next
// write batch stores the new size with the filter's metadata.
func (p *Deduplicator) Presize(records int64) bool {
	if records <= 0 {
		return false
	}
	return p.chain.Presize(uint64(records))
}

// Replay applies record r to the filter exactly as Decide would, for a
// record whose output another owner already produced: it counts as replayed,
// not as consumed or forwarded.
func (p *Deduplicator) Replay(r *kgo.Record) error {
	_, err := p.decide(r)
	if err == nil {
		p.tally.replayed++
		p.publish(false)
	}
	p.syncStaged()
	return err
}

func (p *Deduplicator) decide(r *kgo.Record) (Decision, error) {
	if p.ahead.recs != nil {
		if err := p.readAheadOf(r); err != nil {
			return Forward, p.wrap(r, err)
		}
	}
	if p.buckets.recs != nil {
		p.prefetchBuckets(r)
	}
	// Every record moves the window's watermark, keyed or not: time is the
	// input's, whatever the record holds.
	ts := r.Timestamp.UnixMilli()
	expired, err := p.chain.Advance(ts)
	p.tally.expired += expired
	if err != nil {
		return Forward, p.wrap(r, err)
	}
	h, err := p.hashOf(r)
	if err != nil {
		p.lastKeyErr = err
		return Unkeyed, nil
	}
	if r.Value == nil || p.isDeleteMarker(r) {
		found, err := p.deleteAll(h)
		if err != nil {
			return Delete, p.wrap(r, err)
		}
		if found == 0 {
			p.tally.deletesMissing++
		}
		return Delete, nil
	}
	if limit := p.opts.maxOccurrences(); limit > 1 {
		n, err := p.chain.CountHash(h)
		if err != nil {
			return Forward, p.wrap(r, err)
		}
		if n >= limit {
			// No copy beyond the limit: a hot key never grows the chain.
			return OverLimit, p.refresh(r, h, ts)
		}
		if err := p.chain.AddHashAt(h, ts); err != nil {
			return Forward, p.full(r, err)
		}
		return Forward, nil
	}
	added, err := p.chain.InsertHashAt(h, ts)
	if err != nil {
		return Forward, p.full(r, err)
	}
	if !added {
		return Duplicate, p.refresh(r, h, ts)
	}
	return Forward, nil
}

// refresh re-remembers the key of a dropped record when Options.Refresh is
// set.
func (p *Deduplicator) refresh(r *kgo.Record, h filter.Hash, ts int64) error {
	if !p.opts.Refresh {
		return nil
	}
	if _, err := p.chain.RefreshHash(h, ts); err != nil {
		return p.full(r, err)
	}
	return nil
}

// full absorbs filter.ErrFull, which left the filter as it was: the key is
// not (re)remembered and the record counts in
// kdedup_filter_full_records_total. Other errors are wrapped for Decide.
func (p *Deduplicator) full(r *kgo.Record, err error) error {
	if errors.Is(err, filter.ErrFull) {
		p.tally.full++
		return nil
	}
	return p.wrap(r, err)
}

// deleteAll removes every copy of key's fingerprint and returns how many it
// removed (filter.Chain.DeleteAll: one page of each sub-filter). The key
// holds at most MaxOccurrences of them (a limit lowered since may have left
// more); removing all is what makes the key's next record a Forward
// whatever the limit. Copies of other keys sharing the fingerprint and
// buckets go too: each lets one more record of that key through later, it
// never drops one.
func (p *Deduplicator) deleteAll(h filter.Hash) (int, error) {
	return p.chain.DeleteAllHash(h)
}

func (p *Deduplicator) count(d Decision) {
	t := &p.tally
	t.consumed++
	switch d {
	case Forward:
		t.forwarded++
	case Duplicate:
		t.duplicates++
	case OverLimit:
		t.overLimit++
	case Delete:
		t.deletes++
		if !p.opts.DropTombstones {
			t.forwarded++
		}
	case Unkeyed:
		t.unkeyed++
		t.forwarded++
	}
	p.publish(false)
}

// publishEvery is how many decisions the tally collects before publish
// adds them to the metrics: a counter update per record costs more than
// the rest of a duplicate decision.
const publishEvery = 256

// publish adds the tally to the metrics once it holds publishEvery
// decisions, and always when force is set (Commit, Close). Staged decisions
// are published only by CommitStaged (force).
func (p *Deduplicator) publish(force bool) {
	if !force && (p.opts.Staged || p.tally.consumed+p.tally.replayed < publishEvery) {
		return
	}
	// Touch only the counters that moved.
	t, m := p.tally, p.m
	for _, c := range [...]struct {
		n int
		c prometheus.Counter
	}{
		{t.consumed, m.consumed}, {t.forwarded, m.forwarded}, {t.duplicates, m.duplicates},
		{t.overLimit, m.overLimit}, {t.deletes, m.deletes}, {t.deletesMissing, m.deletesMissing},
		{t.unkeyed, m.unkeyed}, {t.replayed, m.replayed}, {t.expired, m.expired}, {t.full, m.full},
	} {
		if c.n != 0 {
			c.c.Add(float64(c.n))
		}
	}
	p.tally = tally{}
}

// CommitStaged makes the changes decided since the last CommitStaged or
// DiscardStaged part of the partition's state (to be persisted by the next
// Commit), after the Kafka transaction carrying their output committed.
// Without Options.Staged it does nothing.
func (p *Deduplicator) CommitStaged() error {
	if p.overlay == nil {
		return nil
	}
	// The store moves each applied page from the staged count to the
	// dirty one; the copies only read are dropped after.
	err := p.overlay.Commit()
	p.syncStaged()
	if err != nil {
		return fmt.Errorf("applying staged changes of %s/%d: %w", p.topic, p.partition, err)
	}
	p.stableMeta = p.chain.MarshalMeta()
	p.publish(true)
	p.m.observe(p.chain.Stats())
	return nil
}

// DiscardStaged drops the changes decided since the last CommitStaged or
// DiscardStaged, after their Kafka transaction aborted: the filter is as it
// was, and the input is consumed again from the committed offset.
func (p *Deduplicator) DiscardStaged() error {
	if p.overlay == nil {
		return nil
	}
	p.overlay.Discard()
	p.syncStaged()
	p.ahead.recs = nil // the input is read again
	p.buckets, p.hashed = bucketAhead{}, [2 * bucketsAhead]hashedKey{}
	chain, err := filter.Open(p.stableMeta, p.opts.Filter, p.overlay)
	if err != nil {
		return fmt.Errorf("restoring the filter of %s/%d: %w", p.topic, p.partition, err)
	}
	p.chain = chain
	p.tally = tally{}
	return nil
}

// LastKeyError returns why the most recent Unkeyed record had no key.
func (p *Deduplicator) LastKeyError() error { return p.lastKeyErr }

func (p *Deduplicator) isDeleteMarker(r *kgo.Record) bool {
	if p.opts.DeleteHeader == "" {
		return false
	}
	for _, h := range r.Headers {
		if h.Key == p.opts.DeleteHeader && string(h.Value) == p.opts.DeleteValue {
			return true
		}
	}
	return false
}

func (p *Deduplicator) wrap(r *kgo.Record, err error) error {
	return fmt.Errorf("deciding %s/%d offset %d: %w", p.topic, p.partition, r.Offset, err)
}

// DirtyBytes is the size of the write batch the changes since the last
// Commit make (with Options.Staged: of the changes applied by
// CommitStaged), as store.PartitionState.DirtyBytes counts it: at most a page per
// page changed.
func (p *Deduplicator) DirtyBytes() int64 { return p.state.DirtyBytes() }

// OverDirtyShare reports whether the partition must cut its write batch
// (Commit) to keep the dirty pages of every partition of its store near
// bound bytes of memory (store.PartitionState.OverDirtyShare).
func (p *Deduplicator) OverDirtyShare(bound int64) bool { return p.state.OverDirtyShare(bound) }

// StagedBytes is the size of the pages that staged decisions (Options.Staged)
// changed and CommitStaged would add to DirtyBytes; 0 without Staged.
func (p *Deduplicator) StagedBytes() int64 {
	if p.overlay == nil {
		return 0
	}
	return int64(p.overlay.Modified()) * int64(p.chain.Params().PageBytes)
}

// Checkpoint returns the committed checkpoint: the next input offset the
// state reflects. ok is false when the partition has no committed state.
func (p *Deduplicator) Checkpoint() (cp store.Checkpoint, ok bool) { return p.state.Checkpoint() }

// MaxDirtyPagesPerRecord bounds the filter pages deciding one record
// changes, for sizing a batch of records whose changes must fit in one
// write batch: an insert changes at most filter.MaxPagesChangedByInsert
// (its page, the page a split of it makes and one of another
// sub-filter); a refresh one more (the copy leaves one page for another);
// a delete changes one page per sub-filter holding a copy of its key, and
// a key has at most MaxOccurrences copies. Expired
// generations dirty nothing: their pages are deleted after the write batch. (A lowered limit can leave more copies, and other
// keys' copies sharing the fingerprint, with probability about the
// false-positive rate, can add a page; bounds with headroom absorb both.)
// A chain that grows afterwards holds in its new sub-filters only copies
// added after this call, whose pages their adds changed already.
func (p *Deduplicator) MaxDirtyPagesPerRecord() int { return p.opts.MaxDirtyPagesPerRecord() }

// MaxDirtyPagesPerRecord bounds the filter pages deciding one record can
// change under these options, whatever the state (see
// Deduplicator.MaxDirtyPagesPerRecord): MaxOccurrences, and at least 2 with
// Refresh. Static, so that a batch can be sized before any partition is
// open.
func (o Options) MaxDirtyPagesPerRecord() int {
	n := filter.MaxPagesChangedByInsert
	if o.Refresh {
		n++
	}
	return max(n, o.maxOccurrences())
}

// MaxPagesPerRecord bounds the filter pages deciding the next record can
// read or change in the chain as it stands: one page of each sub-filter
// (a lookup probes every sub-filter, both buckets of a key in one page),
// one of a sub-filter the record may add, and the pages it may change
// (MaxDirtyPagesPerRecord). With Options.Staged, each is a page the
// record may stage (filter.Overlay copies every page it reads).
func (p *Deduplicator) MaxPagesPerRecord() int {
	return p.chain.Len() + 1 + p.MaxDirtyPagesPerRecord()
}

// Stats returns the filter's load, sub-filters and estimated false-positive
// rate.
func (p *Deduplicator) Stats() filter.Stats { return p.chain.Stats() }

// Commit writes a write batch: every page changed since the last Commit, the
// chain metadata and cp, in one Badger transaction. cp.Offset must be the
// offset after the last record decided (with Options.Staged: after the last
// record of a committed transaction; staged changes are not written). On
// error nothing is applied and the partition must stop (its in-memory state
// is ahead of what is durable).
func (p *Deduplicator) Commit(cp store.Checkpoint) error {
	timer := prometheus.NewTimer(p.m.commitSeconds)
	err := p.state.Commit(p.stable(), cp)
	timer.ObserveDuration()
	if err != nil {
		return fmt.Errorf("committing %s/%d at offset %d: %w", p.topic, p.partition, cp.Offset, err)
	}
	if !p.opts.Staged {
		p.publish(true)
	}
	p.m.observe(p.chain.Stats())
	return nil
}

// stable is the chain metadata of what Commit may persist.
func (p *Deduplicator) stable() []byte {
	if p.overlay != nil {
		return p.stableMeta
	}
	return p.chain.MarshalMeta()
}

// Close releases the partition's in-memory state. Changes not committed are
// discarded (the next owner replays from the checkpoint); use Commit first
// to keep them.
func (p *Deduplicator) Close() {
	if !p.opts.Staged {
		p.publish(true) // decisions that took effect, committed or not
	}
	p.state.Discard()
	p.state.Close()
	p.m.forget()
}

// IsStateError reports whether err means the partition's state is unusable
// as configured (other parameters, corruption) rather than a transient
// failure.
func IsStateError(err error) bool {
	return errors.Is(err, filter.ErrParams) || errors.Is(err, filter.ErrCorrupt) || errors.Is(err, store.ErrCorrupt)
}
