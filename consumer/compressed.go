package consumer

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kbin"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/plugin/kslog"
)

// A record whose batch of its own is larger than its target topic's
// max.message.bytes before compression may still fit after it: the broker
// compares the batch as it receives it, compressed by the producer. Such a
// record, a large record here, is compressed as the worker's producer
// compresses it (the client's own kgo.Compressor, snappy by default) to
// decide whether it fits; only records over the limit uncompressed are
// compressed for the check.
//
// franz-go bounds every batch by its uncompressed size
// (ProducerBatchMaxBytes, checked as a record is buffered, before
// compression) and fails a larger record with MESSAGE_TOO_LARGE before
// sending it. One bound serves a record alone and a batch of many, so
// raising it for the first would let the second grow past what the broker
// takes. A large record therefore travels alone in its batch through a
// producer whose bound is raised to largeBatchMaxBytes: at least once a
// second client that produces nothing else, one record at a time, after the
// partition's earlier records were acknowledged (produceLarge); exactly
// once the transaction's client, whose bound is raised for every topic and
// which the transaction loop holds to max.message.bytes itself
// (boundBatches).

// largeBatchMaxBytes is the largest uncompressed batch of a large record
// (64 MiB, KDEDUP_MAX_DECOMPRESS_BYTES' default): a record larger than that
// before compression is too large whatever it compresses to.
const largeBatchMaxBytes = 64 << 20

// batchedRecordSlack bounds how many bytes a record grows by in a batch
// after the first: recordBatchBytes counts its timestamp and offset deltas
// as one byte each, and they take up to ten and five (the record's length
// varint then one more).
const batchedRecordSlack = 14

// codecNames name franz-go's codecs in details.
var codecNames = map[kgo.CompressionCodecType]string{
	kgo.CodecNone: "none", kgo.CodecGzip: "gzip", kgo.CodecSnappy: "snappy", kgo.CodecLz4: "lz4", kgo.CodecZstd: "zstd",
}

// compressedBatchBytes is the size of a record batch holding r alone as the
// broker receives it from a producer compressing with c, and the codec it
// carries: the records compressed behind the 61-byte header, or left
// uncompressed (kgo.CodecNone) when compressing does not shrink them, as
// franz-go then sends them. It assumes a broker that takes produce
// requests v7 or later (Kafka 2.1), where franz-go may pick zstd.
func compressedBatchBytes(r *kgo.Record, c kgo.Compressor) (int, kgo.CompressionCodecType) {
	l := recordBodyBytes(r)
	raw := make([]byte, 0, kbin.VarintLen(int32(l))+l)
	raw = kbin.AppendVarint(raw, int32(l))
	raw = kbin.AppendInt8(raw, 0)    // attributes
	raw = kbin.AppendVarlong(raw, 0) // timestamp delta: first in its batch
	raw = kbin.AppendVarint(raw, 0)  // offset delta
	raw = kbin.AppendVarintBytes(raw, r.Key)
	raw = kbin.AppendVarintBytes(raw, r.Value)
	raw = kbin.AppendVarint(raw, int32(len(r.Headers)))
	for _, h := range r.Headers {
		raw = kbin.AppendVarintString(raw, h.Key)
		raw = kbin.AppendVarintBytes(raw, h.Value)
	}
	out, codec := c.Compress(new(bytes.Buffer), raw)
	if out == nil || codec == kgo.CodecError || len(out) >= len(raw) {
		return recordBatchOverhead + len(raw), kgo.CodecNone
	}
	return recordBatchOverhead + len(out), codec
}

// fitsCompressed reports whether out, whose batch of its own is size bytes
// before compression, above limit, fits limit once the worker's producer
// compresses it; otherwise detail says why not.
func (w *Worker) fitsCompressed(out *kgo.Record, size, limit int) (fits bool, detail string) {
	detail = fmt.Sprintf("%d bytes in a record batch of its own, above the topic's max.message.bytes %d", size, limit)
	switch {
	case w.compressor == nil:
		return false, detail + "; the producer does not compress"
	case size > largeBatchMaxBytes:
		return false, fmt.Sprintf("%s, and above %d bytes before compression, the most the worker produces", detail, largeBatchMaxBytes)
	}
	wire, codec := compressedBatchBytes(out, w.compressor)
	if wire <= limit {
		return true, ""
	}
	return false, fmt.Sprintf("%d bytes in a record batch of its own, %d compressed (%s), above the topic's max.message.bytes %d", size, wire, codecNames[codec], limit)
}

// producerBatchMaxBytes is franz-go's ProducerBatchMaxBytes for topic: the
// topic's max.message.bytes, or exactly once with a compressing producer
// largeBatchMaxBytes, which boundBatches makes safe ("" is the client's
// default, which franz-go only checks against BrokerMaxWriteBytes). It is
// called by franz-go's goroutines, once per partition.
func (w *Worker) producerBatchMaxBytes(topic string) int32 {
	limit := producerBatchMaxBytes(w.maxRecordBytes(topic))
	if topic != "" && w.batchesRaised.Load() {
		limit = max(limit, producerBatchMaxBytes(largeBatchMaxBytes))
	}
	if topic != "" && topic == w.opts.RepartitionTopic {
		// Never a batch the dedup stage may not decompress.
		limit = min(limit, producerBatchMaxBytes(w.opts.MaxDecompressBytes))
	}
	return limit
}

// setCompressor learns how the client of a new connect compresses: a
// large record is checked with its compressor, and with raise (exactly
// once) the client's batch bound is raised (producerBatchMaxBytes) when it
// compresses.
func (w *Worker) setCompressor(cl *kgo.Client, raise bool) {
	w.compressor, _ = cl.OptValue(kgo.WithCompressor).(kgo.Compressor)
	w.batchesRaised.Store(raise && w.compressor != nil)
}

// boundBatches wraps the produce of one transaction (exactly once) when the
// client's batch bound is raised: it flushes the client before a record
// that would make the records produced to its topic in the transaction
// since the client's buffer was last empty, taken as one batch, larger than
// the topic's max.message.bytes. A large record thus travels alone in its
// batch, and every other batch stays within the limit before compression,
// where franz-go's own bound would have kept it. It runs on the transaction
// loop's goroutine, which owns txn.batchBytes; the transaction begins with
// the client's buffer empty (the previous one was flushed).
func (w *Worker) boundBatches(produce func(in, out *kgo.Record)) func(in, out *kgo.Record) {
	if !w.batchesRaised.Load() {
		return produce
	}
	clear(w.txn.batchBytes)
	return func(in, out *kgo.Record) {
		body := recordBatchBytes(out) - recordBatchOverhead + batchedRecordSlack
		if n := w.txn.batchBytes[out.Topic]; n > 0 && recordBatchOverhead+n+body > w.maxRecordBytes(out.Topic) {
			// A failed flush leaves the records buffered: the
			// transaction's own flush then fails and stops the worker.
			ctx, cancel := context.WithTimeout(context.Background(), max(30*time.Second, 2*w.opts.SessionTimeout))
			_ = w.cl.Flush(ctx)
			cancel()
			clear(w.txn.batchBytes)
		}
		w.txn.batchBytes[out.Topic] += body
		produce(in, out)
	}
}

// largeProducer is the client that produces large records at least once,
// created at the first one and closed at shutdown. Its mu is held while it
// produces one record and waits for the ack, so that each record is alone
// in its batch; the client has no hooks, so nothing it calls waits on mu.
type largeProducer struct {
	mu sync.Mutex
	cl *kgo.Client
}

// produceLarge produces a large record at least once, alone in its batch,
// after every record the partition produced before it was acknowledged, so
// that the output keeps the input's order. A failure is handled as one of
// the group client's (produceFailed).
func (pw *partitionWorker) produceLarge(in, out *kgo.Record) {
	pw.produced.inflight.Wait()
	pw.w.log.Debug("record larger than its topic's max.message.bytes before compression fits after it; produced alone",
		"topic", in.Topic, "partition", in.Partition, "offset", in.Offset, "target", out.Topic)
	// Not the worker's context: a decided record must be delivered (or
	// fail) before the write batch that covers it, even at shutdown.
	err := pw.w.produceAlone(context.Background(), out)
	pw.w.countAcknowledged(out, err)
	if err != nil {
		pw.w.m.produceErrors.Inc()
		pw.produceFailed(in, out, err)
	}
}

// produceAlone produces out synchronously (at least once): a large record
// through the large-record producer, any other through the group client.
func (w *Worker) produceAlone(ctx context.Context, out *kgo.Record) error {
	if recordBatchBytes(out) <= w.maxRecordBytes(out.Topic) || w.compressor == nil {
		return w.cl.ProduceSync(ctx, out).FirstErr()
	}
	lp := &w.large
	lp.mu.Lock()
	defer lp.mu.Unlock()
	if lp.cl == nil {
		opts := []kgo.Opt{
			kgo.SeedBrokers(w.opts.Brokers...),
			kgo.ProducerBatchMaxBytes(producerBatchMaxBytes(largeBatchMaxBytes)),
			kgo.WithCompressor(w.compressor),
			kgo.ProducerLinger(0),
			kgo.MetadataMinAge(time.Second),
			kgo.AlwaysRetryEOF(), // as the group client's (GroupClientOpts)
			kgo.WithLogger(kslog.New(w.log)),
		}
		// The group client's partitioner, so that a record lands where
		// that client would have put it.
		if p, ok := w.cl.OptValue(kgo.RecordPartitioner).(kgo.Partitioner); ok && p != nil {
			opts = append(opts, kgo.RecordPartitioner(p))
		}
		cl, err := kgo.NewClient(append(opts, w.opts.ConnOpts...)...)
		if err != nil {
			return fmt.Errorf("creating the kafka client for records that fit only compressed: %w", err)
		}
		lp.cl = cl
	}
	return lp.cl.ProduceSync(ctx, out).FirstErr()
}

// closeLarge closes the large-record producer, if one was created.
func (w *Worker) closeLarge() {
	w.large.mu.Lock()
	cl := w.large.cl
	w.large.cl = nil
	w.large.mu.Unlock()
	if cl != nil {
		cl.Close()
	}
}
