package consumer

// Repartitioning by the dedup key (Options.RepartitionTopic): the worker
// runs two stages in its one consumer group, as Kafka Streams runs the
// sub-topologies on either side of a repartition topic.
//
//   - The repartition stage owns the partitions of the input topics. It
//     keeps no state: each record is produced to the repartition topic
//     keyed by its dedup key (rekeyed), so that franz-go's default
//     partitioner, murmur2 of the key as Kafka's Java client computes it,
//     places every record of one key in one partition, whatever
//     partitioner, key or partition count its producer used. The record
//     carries its value, headers and timestamp unchanged, and two headers
//     appended: its original key (HeaderOriginalKey, or
//     HeaderOriginalNullKey for a null key) and where it was read
//     (HeaderOriginalSource). Its input offset
//     is committed like a deduplicated partition's: at least once after
//     the produce is acknowledged (the write batch of a partition without
//     state commits nothing to Badger), exactly once in the transaction
//     that produced it.
//   - The dedup stage owns the partitions of the repartition topic, and
//     deduplicates them exactly as it does input partitions without a
//     repartition topic (their state, checkpoints, replays and snapshots
//     are the repartition topic's partitions'), keying each record by its
//     record key, the dedup key the repartition stage derived
//     (dedup.Opener.OpenRouted: the JSON or header is not read twice).
//     Once decided, each record is restored to its original form
//     (restoreOriginal): the key, the headers without the two appended,
//     the timestamp, so that what it forwards, drops to the duplicates
//     topic or dead-letters is the record its producer wrote. A record of
//     the repartition topic that no repartition stage produced is keyed
//     by its record key and forwarded as it is.
//
// A record the repartition stage cannot key (dedup.ErrNoKey) is produced
// with a null key, so franz-go spreads such records over the repartition
// topic's partitions; the dedup stage finds it unkeyed too and treats it as
// without a repartition topic (forwarded and counted). A record the
// repartition topic cannot take (too large, refused) is a dead letter of
// the repartition stage.

import (
	"fmt"
	"strconv"
	"sync"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kdedup/kdedup/store"
)

// Headers the repartition stage appends to a record it produces to the
// repartition topic, after the record's own headers, and the dedup stage
// removes once it has decided the record, before it forwards or drops it.
const (
	// HeaderOriginalKey carries the record's original key (empty when the
	// key is empty): the repartition record's key is its dedup key.
	HeaderOriginalKey = "kdedup-original-key"
	// HeaderOriginalNullKey, with an empty value, takes HeaderOriginalKey's
	// place for a record whose key was null.
	HeaderOriginalNullKey = "kdedup-original-key-null"
	// HeaderOriginalSource says where the record was read, as
	// topic/partition/offset, for tracing. It is the last header of every
	// record the repartition stage produces.
	HeaderOriginalSource = "kdedup-original-source"
)

// routes reports whether the worker's partitions of topic belong to the
// repartition stage: a repartition topic is set and topic is an input
// topic.
func (o Options) routes(topic string) bool {
	return o.RepartitionTopic != "" && topic != o.RepartitionTopic
}

// consumedTopics are the topics the group consumes: the input topics, and
// the repartition topic when set.
func (o Options) consumedTopics() []string {
	if o.RepartitionTopic == "" {
		return o.InputTopics
	}
	return append(append(make([]string, 0, len(o.InputTopics)+1), o.InputTopics...), o.RepartitionTopic)
}

// The stages a partition belongs to (partitionWorker.stage), as the
// kdedup_partition_stage metric and the logs name them.
const (
	stageDedup       = "dedup"
	stageRepartition = "repartition"
)

// stage is the stage pw belongs to.
func (pw *partitionWorker) stage() string {
	if pw.stateless() {
		return stageRepartition
	}
	return stageDedup
}

// stateless reports whether pw belongs to the repartition stage, which
// keeps no state: it has no deduplicator, its write batches commit nothing
// to Badger, it is never replayed or snapshotted.
func (pw *partitionWorker) stateless() bool { return pw.dedup == nil }

// route produces each record of recs from pw.next on to the repartition
// topic (rekeyed), handing produce the record; it is process for a
// partition of the repartition stage.
func (pw *partitionWorker) route(recs []*kgo.Record, produce func(in, out *kgo.Record)) {
	key := pw.w.opts.Dedup.Options().Key
	for _, r := range recs {
		if r.Offset < pw.next.Offset {
			continue // produced before a restart: the group's offset is past it
		}
		if e, ok := skipped(r); ok { // a batch over MaxDecompressBytes
			pw.skip(e, produce)
			pw.next = store.Checkpoint{Offset: e.NextOffset, LeaderEpoch: e.Epoch}
			pw.decided++
			continue
		}
		k, err := key.Of(r)
		if err != nil {
			k = nil // unkeyed: the dedup stage finds it so too
		}
		if !pw.send(r, pw.rekeyed(r, k), produce) {
			return // failed: nothing from r on is committed
		}
		pw.next = store.Checkpoint{Offset: r.Offset + 1, LeaderEpoch: r.LeaderEpoch}
		pw.decided++
	}
	pw.gauges.nextOffset.Store(pw.next.Offset)
}

// rekeyed is the record the repartition stage produces for r: keyed by its
// dedup key k (nil: unkeyed), r's value, headers and timestamp, then
// HeaderOriginalKey (HeaderOriginalNullKey for a null key) and
// HeaderOriginalSource. It comes from rekeyedRecords, with the header
// slice it had, and goes back there once produced (releaseOutput).
func (pw *partitionWorker) rekeyed(r *kgo.Record, k []byte) *kgo.Record {
	out := rekeyedRecords.Get().(*kgo.Record)
	h := out.Headers[:0]
	if cap(h) < len(r.Headers)+2 {
		h = make([]kgo.RecordHeader, 0, len(r.Headers)+2)
	}
	h = append(h, r.Headers...)
	if r.Key != nil {
		h = append(h, kgo.RecordHeader{Key: HeaderOriginalKey, Value: r.Key})
	} else {
		h = append(h, kgo.RecordHeader{Key: HeaderOriginalNullKey, Value: []byte{}})
	}
	if pw.sourcePrefix == nil {
		pw.sourcePrefix = fmt.Appendf(nil, "%s/%d/", pw.topic, pw.partition)
	}
	src := append(make([]byte, 0, len(pw.sourcePrefix)+20), pw.sourcePrefix...)
	h = append(h, kgo.RecordHeader{Key: HeaderOriginalSource, Value: strconv.AppendInt(src, r.Offset, 10)})
	out.Topic, out.Key, out.Value, out.Headers, out.Timestamp = pw.w.opts.RepartitionTopic, k, r.Value, h, r.Timestamp
	return out
}

// rekeyedRecords pools the records produced to the repartition topic
// (rekeyed), each with its header slice: at the input's rate their
// allocation and collection were a tenth of the repartition stage's CPU.
var rekeyedRecords = sync.Pool{New: func() any { return new(kgo.Record) }}

// restoresOriginals reports whether pw's records come from the
// repartition topic, and so are restored (restoreOriginal) once decided.
func (pw *partitionWorker) restoresOriginals() bool {
	return pw.topic == pw.w.opts.RepartitionTopic // a topic is never ""
}

// restoreOriginal gives r, a record of the repartition topic, its
// original key and headers back: the value of HeaderOriginalKey (null for
// HeaderOriginalNullKey), the headers before the two the repartition
// stage appended. It reports false, leaving r as it is, for a record that
// does not end with those two (not produced by a repartition stage: it is
// keyed as it stands). Its topic, partition and offset stay the
// repartition topic's: the checkpoints are that topic's offsets.
func restoreOriginal(r *kgo.Record) bool {
	n := len(r.Headers)
	if n < 2 || r.Headers[n-1].Key != HeaderOriginalSource {
		return false
	}
	switch k := r.Headers[n-2]; k.Key {
	case HeaderOriginalKey:
		r.Key = k.Value
		if r.Key == nil {
			r.Key = []byte{} // an empty key, which the header may carry as null
		}
	case HeaderOriginalNullKey:
		r.Key = nil
	default:
		return false
	}
	r.Headers = r.Headers[: n-2 : n-2]
	return true
}
