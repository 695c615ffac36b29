package consumer

import (
	"github.com/twmb/franz-go/pkg/kbin"
	"github.com/twmb/franz-go/pkg/kgo"
)

// DefaultMaxRecordBytes is Kafka's default max.message.bytes (1,048,588
// bytes): the largest record batch a broker accepts when a topic does not
// set its own.
const DefaultMaxRecordBytes = 1_048_588

// recordBatchOverhead is the size of a record batch with no records as the
// broker counts it against max.message.bytes (Kafka's
// DefaultRecordBatch.RECORD_BATCH_OVERHEAD: base offset, length, leader
// epoch, magic, CRC, attributes, last offset delta, two timestamps,
// producer id and epoch, base sequence, record count).
const recordBatchOverhead = 61

// recordBatchBytes is the exact size, before compression, of a record batch
// holding r alone, as the broker measures it against max.message.bytes. It
// is the smallest batch r can travel in: the first record of a batch has
// offset and timestamp deltas 0. franz-go sizes batches the same way
// (before compression), so a record within the limit is never refused by
// the client, and a batch it builds never exceeds the limit. A record over
// it may still fit compressed (compressed.go).
func recordBatchBytes(r *kgo.Record) int {
	l := recordBodyBytes(r)
	return recordBatchOverhead + kbin.VarintLen(int32(l)) + l
}

// recordBodyBytes is the length of r encoded first in its batch, after its
// length varint.
func recordBodyBytes(r *kgo.Record) int {
	l := 1 + // attributes
		1 + // timestamp delta 0
		1 + // offset delta 0
		kbin.VarintLen(int32(len(r.Key))) + len(r.Key) +
		kbin.VarintLen(int32(len(r.Value))) + len(r.Value) +
		kbin.VarintLen(int32(len(r.Headers)))
	for _, h := range r.Headers {
		l += kbin.VarintLen(int32(len(h.Key))) + len(h.Key) + kbin.VarintLen(int32(len(h.Value))) + len(h.Value)
	}
	return l
}

// producerBatchMaxBytes is franz-go's ProducerBatchMaxBytes for a topic
// whose max.message.bytes is limit: franz-go counts the 4-byte length of
// the records array on top of what the broker counts.
func producerBatchMaxBytes(limit int) int32 {
	return int32(min(limit+4, 1<<30))
}

// maxRecordBytes is the max.message.bytes of topic.
func (w *Worker) maxRecordBytes(topic string) int {
	if w.opts.MaxRecordBytes == nil {
		return DefaultMaxRecordBytes
	}
	return w.opts.MaxRecordBytes(topic)
}
