package dedup

import (
	"errors"
	"fmt"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kdedup/kdedup/filter"
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
	}
	return "decision(" + strconv.Itoa(int(d)) + ")"
}

// Options configure a Partition. The zero value deduplicates by record key
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
	Filter filter.Params
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

// Partition deduplicates one topic-partition. It is not safe for concurrent
// use: one goroutine owns it, which is what keeps decisions in offset order.
type Partition struct {
	topic      string
	partition  int32
	opts       Options
	state      *store.Partition
	chain      *filter.Chain
	m          partitionMetrics
	lastKeyErr error
}

// Open opens the state of topic/partition in db, or starts an empty filter
// when there is none. It returns filter.ErrParams (wrapped) when the stored
// state was written with other filter parameters or format version, and
// store or filter corruption errors as they are: state is never wiped.
// m may be shared by every Partition of the process; nil means unregistered
// metrics.
func Open(db *store.DB, topic string, partition int32, opts Options, m *Metrics) (*Partition, error) {
	st, err := db.Partition(topic, partition)
	if err != nil {
		return nil, fmt.Errorf("opening state of %s/%d: %w", topic, partition, err)
	}
	chain, err := filter.Open(st.Meta(), opts.Filter, st)
	if err != nil {
		st.Close()
		return nil, fmt.Errorf("opening filter of %s/%d: %w", topic, partition, err)
	}
	if m == nil {
		m = NewMetrics(nil)
	}
	p := &Partition{topic: topic, partition: partition, opts: opts, state: st, chain: chain, m: m.forPartition(topic, partition)}
	p.m.observe(chain.Stats())
	return p, nil
}

// Decide decides record r (which must be the next record of the partition in
// offset order) and applies it to the filter. The error is non-nil only when
// the state cannot be read or grown (storage errors, filter.ErrFull): the
// partition must then stop without committing, since the decision is unknown.
func (p *Partition) Decide(r *kgo.Record) (Decision, error) {
	p.m.consumed.Inc()
	key, err := p.opts.Key.Of(r)
	if err != nil {
		p.lastKeyErr = err
		p.m.unkeyed.Inc()
		p.m.forwarded.Inc()
		return Unkeyed, nil
	}
	if r.Value == nil || p.isDeleteMarker(r) {
		found, err := p.chain.Delete(key)
		if err != nil {
			return Delete, p.wrap(r, err)
		}
		p.m.deletes.Inc()
		if !found {
			p.m.deletesMissing.Inc()
		}
		if !p.opts.DropTombstones {
			p.m.forwarded.Inc()
		}
		return Delete, nil
	}
	added, err := p.chain.Insert(key)
	if err != nil {
		return Forward, p.wrap(r, err)
	}
	if !added {
		p.m.duplicates.Inc()
		return Duplicate, nil
	}
	p.m.forwarded.Inc()
	return Forward, nil
}

// LastKeyError returns why the most recent Unkeyed record had no key.
func (p *Partition) LastKeyError() error { return p.lastKeyErr }

func (p *Partition) isDeleteMarker(r *kgo.Record) bool {
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

func (p *Partition) wrap(r *kgo.Record, err error) error {
	return fmt.Errorf("deciding %s/%d offset %d: %w", p.topic, p.partition, r.Offset, err)
}

// DirtyBytes is the size of the pages changed since the last Commit.
func (p *Partition) DirtyBytes() int64 { return p.state.DirtyBytes() }

// Checkpoint returns the committed checkpoint: the next input offset the
// state reflects. ok is false when the partition has no committed state.
func (p *Partition) Checkpoint() (cp store.Checkpoint, ok bool) { return p.state.Checkpoint() }

// Stats returns the filter's load, sub-filters and estimated false-positive
// rate.
func (p *Partition) Stats() filter.Stats { return p.chain.Stats() }

// Commit writes a write batch: every page changed since the last Commit, the
// chain metadata and cp, in one Badger transaction. cp.Offset must be the
// offset after the last record decided. On error nothing is applied and the
// partition must stop (its in-memory state is ahead of what is durable).
func (p *Partition) Commit(cp store.Checkpoint) error {
	timer := prometheus.NewTimer(p.m.commitSeconds)
	err := p.state.Commit(p.chain.MarshalMeta(), cp)
	timer.ObserveDuration()
	if err != nil {
		return fmt.Errorf("committing %s/%d at offset %d: %w", p.topic, p.partition, cp.Offset, err)
	}
	p.m.observe(p.chain.Stats())
	return nil
}

// Close releases the partition's in-memory state. Changes not committed are
// discarded (the next owner replays from the checkpoint); use Commit first
// to keep them.
func (p *Partition) Close() {
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
