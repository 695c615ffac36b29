package store

import (
	"encoding/binary"
	"fmt"

	"github.com/dgraph-io/badger/v4"
)

// Origin says which topic and which Kafka cluster a partition's state was
// built from. A topic deleted and created again under the same name keeps
// its name and partitions but gets a new topic ID (Kafka's Metadata v10+,
// KIP-516), and its offsets start again at 0; a cluster migrated with
// MirrorMaker, or another environment sharing a bucket and a group name,
// has another cluster ID. A state of another origin says nothing about
// the records of this one, whatever its checkpoint's offset: the consumer
// never resumes from it, replays onto it or restores it.
//
// The zero Origin is unknown: state written before origins were recorded,
// or a broker that reports no IDs.
type Origin struct {
	// TopicID is the topic's ID as Kafka prints it (base64 of its 16
	// bytes, kadm.TopicID.String); "" when the broker reports none.
	TopicID string
	// ClusterID is the cluster's ID (Metadata's cluster_id); "" when the
	// broker reports none.
	ClusterID string
}

// IsZero reports whether o is unknown.
func (o Origin) IsZero() bool { return o == Origin{} }

// Differs reports whether a state of origin o cannot belong to the topic
// of origin cur: an ID known on both sides and not the same. An ID one
// side does not know (a broker without topic IDs, state written before
// they were recorded) neither proves nor disproves anything.
func (o Origin) Differs(cur Origin) bool {
	return (o.TopicID != "" && cur.TopicID != "" && o.TopicID != cur.TopicID) ||
		(o.ClusterID != "" && cur.ClusterID != "" && o.ClusterID != cur.ClusterID)
}

// String is "topic ID T in cluster C", with "unknown" for an ID not known.
func (o Origin) String() string {
	id, cl := o.TopicID, o.ClusterID
	if id == "" {
		id = "unknown"
	}
	if cl == "" {
		cl = "unknown"
	}
	return "topic ID " + id + " in cluster " + cl
}

// maxOriginIDBytes bounds each ID of a stored origin: Kafka's are 22
// (topic) and 22-ish (cluster) characters; a damaged length is refused
// instead of trusted.
const maxOriginIDBytes = 1024

// encodeOrigin is uint16 len(topic ID) | topic ID | uint16 len(cluster ID) | cluster ID.
func encodeOrigin(o Origin) []byte {
	b := make([]byte, 0, 4+len(o.TopicID)+len(o.ClusterID))
	b = binary.BigEndian.AppendUint16(b, uint16(len(o.TopicID)))
	b = append(b, o.TopicID...)
	b = binary.BigEndian.AppendUint16(b, uint16(len(o.ClusterID)))
	return append(b, o.ClusterID...)
}

func decodeOrigin(b []byte) (Origin, error) {
	var o Origin
	for _, f := range []*string{&o.TopicID, &o.ClusterID} {
		if len(b) < 2 {
			return Origin{}, fmt.Errorf("store: decoding origin: truncated: %w", ErrCorrupt)
		}
		n := int(binary.BigEndian.Uint16(b))
		if n > maxOriginIDBytes || len(b) < 2+n {
			return Origin{}, fmt.Errorf("store: decoding origin: an ID of %d bytes in %d: %w", n, len(b)-2, ErrCorrupt)
		}
		*f, b = string(b[2:2+n]), b[2+n:]
	}
	if len(b) != 0 {
		return Origin{}, fmt.Errorf("store: decoding origin: %d bytes past its end: %w", len(b), ErrCorrupt)
	}
	return o, nil
}

func originKey(prefix []byte) []byte {
	return append(append(make([]byte, 0, len(prefix)+1), prefix...), tagOrigin)
}

// Origin returns the origin recorded with p's state (SetOrigin, Import);
// the zero Origin when none is (no state, or state written before origins
// were recorded).
func (p *PartitionState) Origin() Origin { return p.origin }

// SetOrigin records o as the origin of p's state, durably, in a Badger
// transaction of its own: a state adopted with its topic's current IDs, or
// a partition starting without state. It returns ErrReadOnly on a
// read-only DB, ErrClosed after Close, and Badger's error (wrapped)
// otherwise; p's origin is unchanged then.
func (p *PartitionState) SetOrigin(o Origin) error {
	if p.closed {
		return fmt.Errorf("store: recording the origin of %s: %w", p.tp, ErrClosed)
	}
	if p.db.opts.ReadOnly {
		return fmt.Errorf("store: recording the origin of %s: %w", p.tp, ErrReadOnly)
	}
	if err := p.db.bdb.Update(func(txn *badger.Txn) error {
		if o.IsZero() {
			return txn.Delete(originKey(p.prefix))
		}
		return txn.Set(originKey(p.prefix), encodeOrigin(o))
	}); err != nil {
		return fmt.Errorf("store: recording the origin of %s: %w", p.tp, err)
	}
	p.origin = o
	return nil
}

// Clear deletes p's whole state, committed or not: pages, metadata,
// checkpoint and origin. It is atomic for readers as Import is: the state
// is first marked as being imported, so that a crash in the middle leaves
// a state that the next open deletes. It returns ErrReadOnly on a
// read-only DB, and Badger's error (wrapped) otherwise: if the marker was
// not written p keeps its state, else p has none (the rest is deleted at
// the next open). The consumer clears a partition's state only after
// moving it aside (a state of another topic), never to recover from an
// error.
func (p *PartitionState) Clear() error {
	if p.db.opts.ReadOnly {
		return fmt.Errorf("store: clearing %s: %w", p.tp, ErrReadOnly)
	}
	if err := p.db.bdb.Update(func(txn *badger.Txn) error {
		return txn.Set(importingKey(p.prefix), nil)
	}); err != nil {
		return fmt.Errorf("store: clearing %s: %w", p.tp, err)
	}
	p.Discard()
	p.meta, p.cp, p.hasCP, p.origin = nil, Checkpoint{}, false, Origin{}
	p.forgetLog()
	if err := p.finishInterruptedImport(); err != nil {
		return fmt.Errorf("store: clearing %s: %w", p.tp, err)
	}
	return nil
}

// Adopted is the origin a state of origin o takes when the topic of origin
// cur adopts it (o does not differ from cur): cur's IDs, and o's where cur
// knows none.
func (o Origin) Adopted(cur Origin) Origin {
	if cur.TopicID == "" {
		cur.TopicID = o.TopicID
	}
	if cur.ClusterID == "" {
		cur.ClusterID = o.ClusterID
	}
	return cur
}
