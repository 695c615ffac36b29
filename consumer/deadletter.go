package consumer

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"

	"github.com/twmb/franz-go/pkg/kbin"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kdedup/kdedup/store"
)

// A record that cannot be forwarded because of the record itself is a dead
// letter: it is too large for its target topic even compressed as the
// worker's producer compresses it (checked before producing, see
// recordBatchBytes and compressedBatchBytes), the broker rejects it as
// invalid, or its input
// batch decompresses past Options.MaxDecompressBytes. With
// Options.DeadLetterTopic it is produced there, exactly like a forwarded
// record (at least once before the write batch covering it, exactly once in
// its transaction), and processing goes on; without, the worker stops with
// a *RecordError naming it.

// Headers of the records produced to Options.DeadLetterTopic, after the
// headers of the input record (HeaderSource names the input record).
const (
	// HeaderDeadLetterReason says why the record was not forwarded: one of
	// the Reason* values below.
	HeaderDeadLetterReason = "kdedup-dead-letter-reason"
	// HeaderTarget is the topic the record was meant for (the output or
	// the duplicates topic); absent for ReasonDecompressTooLarge.
	HeaderTarget = "kdedup-target"
	// HeaderDetail is a human-readable explanation: the sizes compared or
	// the broker's error.
	HeaderDetail = "kdedup-detail"
	// HeaderTruncated, present only when the input record itself does not
	// fit the dead-letter topic, lists what was left out: "value", or
	// "key,value,headers" when the value alone was not enough.
	HeaderTruncated = "kdedup-truncated"
	// HeaderSourceEnd, with ReasonDecompressTooLarge only, is the offset
	// after the skipped batch: HeaderSource names its first offset.
	HeaderSourceEnd = "kdedup-source-end"
)

// Values of HeaderDeadLetterReason and of the reason label of
// kdedup_dead_letter_records_total.
const (
	// ReasonTooLarge: the record, alone in a record batch, is larger than
	// the target topic's max.message.bytes (Options.MaxRecordBytes) before
	// compression and after the producer's compression, or the broker
	// answered MESSAGE_TOO_LARGE or RECORD_LIST_TOO_LARGE.
	ReasonTooLarge = "too-large"
	// ReasonInvalid: the broker rejected the record as invalid
	// (INVALID_RECORD, CORRUPT_MESSAGE, INVALID_TIMESTAMP).
	ReasonInvalid = "invalid"
	// ReasonDecompressTooLarge: an input batch decompresses to more than
	// Options.MaxDecompressBytes; its records are skipped undecided and one
	// dead letter without key or value stands for the whole batch.
	ReasonDecompressTooLarge = "decompress-too-large"
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

// RecordError is the error that stops the worker when an input record
// cannot be forwarded because of the record itself and no dead-letter
// topic is set.
type RecordError struct {
	// Topic, Partition and Offset locate the input record (with
	// ReasonDecompressTooLarge: the first offset of its batch).
	Topic     string
	Partition int32
	Offset    int64
	// Target is the topic it was meant for ("" with
	// ReasonDecompressTooLarge).
	Target string
	// Reason is one of the Reason* values.
	Reason string
	// Detail explains the reason: the sizes compared or the broker's
	// error text.
	Detail string
	// Err is the broker's or the client's error, if any.
	Err error
}

func (e *RecordError) Error() string {
	what := fmt.Sprintf("record %s/%d offset %d", e.Topic, e.Partition, e.Offset)
	if e.Reason == ReasonDecompressTooLarge {
		what = fmt.Sprintf("record batch %s/%d at offset %d", e.Topic, e.Partition, e.Offset)
	}
	target := ""
	if e.Target != "" {
		target = " to " + e.Target
	}
	return fmt.Sprintf("%s cannot be forwarded%s: %s (%s); no dead-letter topic is set (KDEDUP_DEAD_LETTER_TOPIC), so the worker stops without committing it",
		what, target, e.Reason, e.Detail)
}

func (e *RecordError) Unwrap() error { return e.Err }

// TopicError is the error that stops the worker when a topic it produces to
// does not exist or may not be written: every record to it would fail.
type TopicError struct {
	// Variable names the setting that chose the topic
	// (KDEDUP_OUTPUT_TOPIC, KDEDUP_DUPLICATES_TOPIC or
	// KDEDUP_DEAD_LETTER_TOPIC).
	Variable string
	Topic    string
	Err      error
}

func (e *TopicError) Error() string {
	return fmt.Sprintf("%s=%s: producing to the topic: %v (create the topic, or grant the worker's principal Write on it)", e.Variable, e.Topic, e.Err)
}

func (e *TopicError) Unwrap() error { return e.Err }

// topicVariable names the setting that chose topic.
func (w *Worker) topicVariable(topic string) string {
	switch topic {
	case w.opts.DuplicatesTopic:
		return "KDEDUP_DUPLICATES_TOPIC"
	case w.opts.DeadLetterTopic:
		return "KDEDUP_DEAD_LETTER_TOPIC"
	}
	return "KDEDUP_OUTPUT_TOPIC"
}

// recordReason is the dead-letter reason of a produce error caused by the
// record itself, "" for any other error.
func recordReason(err error) string {
	switch {
	case errors.Is(err, kerr.MessageTooLarge), errors.Is(err, kerr.RecordListTooLarge):
		return ReasonTooLarge
	case errors.Is(err, kerr.InvalidRecord), errors.Is(err, kerr.CorruptMessage), errors.Is(err, kerr.InvalidTimestamp):
		return ReasonInvalid
	}
	return ""
}

// isTopicError reports whether a produce error means that the topic is
// missing, was deleted or may not be written.
func isTopicError(err error) bool {
	return errors.Is(err, kerr.UnknownTopicOrPartition) || errors.Is(err, kerr.TopicAuthorizationFailed) ||
		errors.Is(err, kerr.UnknownTopicID) || errors.Is(err, kerr.InconsistentTopicID)
}

// produceError turns the error of producing out, decided from in, into the
// error that stops the worker.
func (w *Worker) produceError(in, out *kgo.Record, err error) error {
	if isTopicError(err) {
		return &TopicError{Variable: w.topicVariable(out.Topic), Topic: out.Topic, Err: err}
	}
	if reason := recordReason(err); reason != "" {
		return fmt.Errorf("producing record %s/%d offset %d to %s: refused by the broker (%s): %w", in.Topic, in.Partition, in.Offset, out.Topic, reason, err)
	}
	return fmt.Errorf("producing record of %s/%d offset %d to %s: %w", in.Topic, in.Partition, in.Offset, out.Topic, err)
}

// send hands produce out, decided from input record in, unless out cannot
// fit its topic: then in is a dead letter. It reports false when the
// partition failed (no dead-letter topic), and must then stop deciding.
func (pw *partitionWorker) send(in, out *kgo.Record, produce func(in, out *kgo.Record)) bool {
	if handled, sent := pw.sendTxn(in, out, produce); handled {
		return sent
	}
	size, limit := recordBatchBytes(out), pw.w.maxRecordBytes(out.Topic)
	if size <= limit {
		produce(in, out)
		return true
	}
	fits, detail := pw.w.fitsCompressed(out, size, limit)
	switch {
	case !fits:
		return pw.deadLetter(in, out.Topic, ReasonTooLarge, detail, nil, produce)
	case pw.w.sess == nil:
		pw.produceLarge(in, out)
	default:
		produce(in, out) // exactly once, boundBatches sends it alone
	}
	return true
}

// deadLetter produces in to the dead-letter topic, or without one fails
// the partition with a *RecordError and reports false.
func (pw *partitionWorker) deadLetter(in *kgo.Record, target, reason, detail string, cause error, produce func(in, out *kgo.Record)) bool {
	if pw.w.opts.DeadLetterTopic == "" {
		pw.fail(&RecordError{Topic: in.Topic, Partition: in.Partition, Offset: in.Offset, Target: target, Reason: reason, Detail: detail, Err: cause})
		return false
	}
	pw.w.log.Warn("record not forwarded; sent to the dead-letter topic", "topic", in.Topic, "partition", in.Partition, "offset", in.Offset,
		"target", target, "reason", reason, "detail", detail, "dead_letter_topic", pw.w.opts.DeadLetterTopic)
	produce(in, pw.w.deadLetterRecord(in, target, reason, detail))
	return true
}

// deadLetterRecord is the record produced to the dead-letter topic for in:
// in's key, value, headers and timestamp, then HeaderDeadLetterReason,
// HeaderSource, HeaderTarget and HeaderDetail. When that does not fit the
// dead-letter topic the value is left out, then the key and in's headers
// too, and HeaderTruncated says so.
func (w *Worker) deadLetterRecord(in *kgo.Record, target, reason, detail string) *kgo.Record {
	own := []kgo.RecordHeader{
		{Key: HeaderDeadLetterReason, Value: []byte(reason)},
		{Key: HeaderSource, Value: fmt.Appendf(nil, "%s/%d/%d", in.Topic, in.Partition, in.Offset)},
	}
	if target != "" {
		own = append(own, kgo.RecordHeader{Key: HeaderTarget, Value: []byte(target)})
	}
	own = append(own, kgo.RecordHeader{Key: HeaderDetail, Value: []byte(detail)})
	build := func(key, value []byte, headers []kgo.RecordHeader, truncated string) *kgo.Record {
		h := make([]kgo.RecordHeader, 0, len(headers)+len(own)+1)
		h = append(append(h, headers...), own...)
		if truncated != "" {
			h = append(h, kgo.RecordHeader{Key: HeaderTruncated, Value: []byte(truncated)})
		}
		return &kgo.Record{Topic: w.opts.DeadLetterTopic, Key: key, Value: value, Headers: h, Timestamp: in.Timestamp}
	}
	limit := w.maxRecordBytes(w.opts.DeadLetterTopic)
	if r := build(in.Key, in.Value, in.Headers, ""); recordBatchBytes(r) <= limit {
		return r
	}
	if r := build(in.Key, nil, in.Headers, "value"); recordBatchBytes(r) <= limit {
		return r
	}
	return build(nil, nil, nil, "key,value,headers")
}

// countDeadLetter wraps a produce promise: a dead letter is counted once
// acknowledged.
func (w *Worker) countDeadLetter(out *kgo.Record, err error) {
	if err != nil || out.Topic != w.opts.DeadLetterTopic || w.opts.DeadLetterTopic == "" {
		return
	}
	for _, h := range out.Headers {
		if h.Key == HeaderDeadLetterReason {
			w.m.deadLetters.WithLabelValues(string(h.Value)).Inc()
		}
	}
}

// decompressSkip is carried in the Context of a placeholder record that
// stands for an input batch over Options.MaxDecompressBytes, so that the
// partition handles the batch in offset order with its records.
type decompressSkip struct{ err *kgo.ErrDecompressTooLarge }

type decompressSkipKey struct{}

// skipRecords turns each partition error of fetches that is a batch over
// Options.MaxDecompressBytes into a placeholder record in fetches (and
// moves the client past the batch), when a dead-letter topic is set. Without
// one it fails the worker with a *RecordError naming the batch's offsets:
// franz-go stops fetching the partition until its offset is set past the
// batch, so nothing loops and nothing is decompressed. It runs on the
// polling goroutine with rebalances blocked.
func (w *Worker) skipRecords(fetches kgo.Fetches) kgo.Fetches {
	var skips []*kgo.ErrDecompressTooLarge
	fetches.EachError(func(_ string, _ int32, err error) {
		var e *kgo.ErrDecompressTooLarge
		if errors.As(err, &e) {
			skips = append(skips, e)
		}
	})
	for _, e := range skips {
		detail := fmt.Sprintf("offsets %d to %d decompress to more than %d bytes (KDEDUP_MAX_DECOMPRESS_BYTES)", e.Offset, e.NextOffset-1, w.opts.MaxDecompressBytes)
		if w.opts.DeadLetterTopic == "" {
			w.fail(&RecordError{Topic: e.Topic, Partition: e.Partition, Offset: e.Offset, Reason: ReasonDecompressTooLarge, Detail: detail, Err: e})
			return fetches
		}
		if w.partition(e.Topic, e.Partition) == nil {
			continue
		}
		r := &kgo.Record{Topic: e.Topic, Partition: e.Partition, Offset: e.Offset, LeaderEpoch: e.Epoch,
			Context: context.WithValue(context.Background(), decompressSkipKey{}, decompressSkip{e})}
		fetches = append(fetches, kgo.Fetch{Topics: []kgo.FetchTopic{{Topic: e.Topic, Partitions: []kgo.FetchPartition{{Partition: e.Partition, Records: []*kgo.Record{r}}}}}})
		w.cl.SetOffsets(map[string]map[int32]kgo.EpochOffset{e.Topic: {e.Partition: {Epoch: e.Epoch, Offset: e.NextOffset}}})
		if w.sess != nil {
			w.skippedInTxn = append(w.skippedInTxn, store.TopicPartition{Topic: e.Topic, Partition: e.Partition})
		}
	}
	return fetches
}

// endTxnSkips runs after a transaction ends. SetOffsets past a skipped
// batch also moved franz-go's notion of the committed offset, which an
// aborted transaction rewinds to: rewind such partitions to their last
// committed transaction instead, so that the batch is met (and its dead
// letter produced) again.
func (w *Worker) endTxnSkips(committed bool) {
	skipped := w.skippedInTxn
	w.skippedInTxn = nil
	if committed {
		return
	}
	for _, tp := range skipped {
		if pw := w.partition(tp.Topic, tp.Partition); pw != nil {
			w.cl.SetOffsets(map[string]map[int32]kgo.EpochOffset{tp.Topic: {tp.Partition: {Epoch: pw.stableNext.LeaderEpoch, Offset: pw.stableNext.Offset}}})
		}
	}
}

// skipped returns the batch a placeholder record of skipRecords stands for.
func skipped(r *kgo.Record) (*kgo.ErrDecompressTooLarge, bool) {
	if r.Context == nil {
		return nil, false
	}
	s, ok := r.Context.Value(decompressSkipKey{}).(decompressSkip)
	return s.err, ok
}

// skip handles the placeholder of a skipped batch e: one dead letter
// without key or value, then the partition resumes after the batch.
func (pw *partitionWorker) skip(e *kgo.ErrDecompressTooLarge, produce func(in, out *kgo.Record)) {
	in := &kgo.Record{Topic: e.Topic, Partition: e.Partition, Offset: e.Offset}
	detail := fmt.Sprintf("offsets %d to %d decompress to more than %d bytes (KDEDUP_MAX_DECOMPRESS_BYTES)", e.Offset, e.NextOffset-1, pw.w.opts.MaxDecompressBytes)
	pw.w.log.Warn("input batch not decompressed; skipped and sent to the dead-letter topic as a record without value", "topic", e.Topic, "partition", e.Partition,
		"offset", e.Offset, "next_offset", e.NextOffset, "max_decompress_bytes", pw.w.opts.MaxDecompressBytes, "dead_letter_topic", pw.w.opts.DeadLetterTopic)
	out := pw.w.deadLetterRecord(in, "", ReasonDecompressTooLarge, detail)
	out.Headers = append(out.Headers, kgo.RecordHeader{Key: HeaderSourceEnd, Value: []byte(strconv.FormatInt(e.NextOffset, 10))})
	produce(in, out)
}

// rejected is a record the broker refused after it was produced.
type rejected struct {
	in, out *kgo.Record
	err     error
}

// produceFailed records the failure of producing out, decided from in, at
// least once: a record-tied rejection is retried alone at the next write
// batch (retryRejected), any other error stops the worker then.
func (pw *partitionWorker) produceFailed(in, out *kgo.Record, err error) {
	if recordReason(err) != "" && out.Topic != pw.w.opts.DeadLetterTopic {
		pw.rejectedMu.Lock()
		pw.rejected = append(pw.rejected, rejected{in, out, err})
		pw.rejectedMu.Unlock()
		return
	}
	err = pw.w.produceError(in, out, err)
	pw.prodErr.CompareAndSwap(nil, &err)
}

// retryRejected produces again, one at a time, the records the broker
// refused as a batch (at least once): the broker rejects a whole batch, so
// all but one may be innocent neighbours. Each waits for the previous one's
// ack, so it travels alone in its batch unless another partition produces
// to the same output partition at that moment.
// Those refused again are dead letters. It runs in flush, after every
// produced record was acknowledged; a record forwarded by a retry may land
// after later records of the same output partition.
func (pw *partitionWorker) retryRejected() error {
	pw.rejectedMu.Lock()
	rej := pw.rejected
	pw.rejected = nil
	pw.rejectedMu.Unlock()
	slices.SortStableFunc(rej, func(a, b rejected) int { return cmp.Compare(a.in.Offset, b.in.Offset) })
	ctx := context.Background() // decided records must be delivered before the write batch, even at shutdown
	for _, x := range rej {
		var err error
		for range refusalsAlone { // refused alone twice: not a transient broker fault
			if err = pw.w.produceAlone(ctx, x.out); err == nil || recordReason(err) == "" {
				break
			}
		}
		if err == nil {
			continue
		}
		pw.w.m.produceErrors.Inc()
		reason := recordReason(err)
		if reason == "" {
			return pw.w.produceError(x.in, x.out, err)
		}
		if pw.w.opts.DeadLetterTopic == "" {
			return &RecordError{Topic: x.in.Topic, Partition: x.in.Partition, Offset: x.in.Offset, Target: x.out.Topic, Reason: reason, Detail: err.Error(), Err: err}
		}
		pw.w.log.Warn("record refused by the broker; sent to the dead-letter topic", "topic", x.in.Topic, "partition", x.in.Partition, "offset", x.in.Offset,
			"target", x.out.Topic, "reason", reason, "err", err, "dead_letter_topic", pw.w.opts.DeadLetterTopic)
		dl := pw.w.deadLetterRecord(x.in, x.out.Topic, reason, err.Error())
		err = pw.w.cl.ProduceSync(ctx, dl).FirstErr()
		pw.w.countDeadLetter(dl, err)
		if err != nil {
			return pw.w.produceError(x.in, dl, err)
		}
	}
	return nil
}

// recordTarget is an input record and the topic it is produced to.
type recordTarget struct {
	topic     string
	partition int32
	offset    int64
	target    string
}

func targetOf(in, out *kgo.Record) recordTarget {
	return recordTarget{in.Topic, in.Partition, in.Offset, out.Topic}
}

// txnRejections remembers, exactly once, the records the broker refused in
// an aborted transaction, so that deciding them again does not abort again
// and again. A batch is refused as a whole, so a refused record is first a
// suspect: when decided again it is produced alone in its batch. A record
// refused alone twice (once could be a transient broker fault) is the
// culprit: decided again, it is a dead letter, or without a dead-letter
// topic the worker stops. A record is thus in at most three aborted
// transactions: refused in a batch, then alone twice. It is used by the
// transaction loop's goroutine, and by produce promises under mu.
type txnRejections struct {
	mu        sync.Mutex
	known     map[recordTarget]rejection
	isolated  map[recordTarget]bool // produced alone in the current transaction
	refused   []rejected            // record-tied failures of the current transaction
	abortsRun int                   // consecutive transactions aborted by other produce errors
}

type rejection struct {
	reason, detail string
	err            error
	alone          int // times refused while produced alone
}

// refusalsAlone is how many times a record must be refused alone in its
// batch to be taken for the culprit.
const refusalsAlone = 2

// maxProduceAborts bounds consecutive transactions aborted by produce
// errors not tied to a record (those are bounded per record, above): the
// abort that reaches it stops the worker instead of aborting in a loop, so
// that at most this many transactions abort in a row.
const maxProduceAborts = 3

// sendTxn is send's exactly-once part for a record refused in an earlier
// transaction. It reports whether it handled out (and sent), false when
// out is produced as usual.
func (pw *partitionWorker) sendTxn(in, out *kgo.Record, produce func(in, out *kgo.Record)) (handled, sent bool) {
	w := pw.w
	if w.sess == nil {
		return false, true
	}
	key := targetOf(in, out)
	t := &w.rejections
	t.mu.Lock()
	rj, ok := t.known[key]
	if ok && rj.alone >= refusalsAlone {
		delete(t.known, key)
	}
	t.mu.Unlock()
	switch {
	case !ok:
		return false, true
	case rj.alone >= refusalsAlone:
		return true, pw.deadLetter(in, out.Topic, rj.reason, rj.detail, rj.err, produce)
	}
	// A suspect: alone in its batch, so that a refusal names it.
	ctx := context.Background()
	_ = w.cl.Flush(ctx)
	t.mu.Lock()
	t.isolated[key] = true
	t.mu.Unlock()
	produce(in, out)
	_ = w.cl.Flush(ctx)
	return true, true
}

// txnProduceFailed records a failure of the current transaction's produce.
func (w *Worker) txnProduceFailed(in, out *kgo.Record, err error) {
	if recordReason(err) == "" || out.Topic == w.opts.DeadLetterTopic {
		return
	}
	w.rejections.mu.Lock()
	w.rejections.refused = append(w.rejections.refused, rejected{in, out, err})
	w.rejections.mu.Unlock()
}

// endTxnRejections learns from the transaction that just ended which
// records were refused and returns the error that must stop the worker, if
// any: a culprit without a dead-letter topic, a topic error, or too many
// aborts in a row caused by other produce errors (prodErr is the first).
func (w *Worker) endTxnRejections(committed bool, prodErr error) error {
	t := &w.rejections
	t.mu.Lock()
	defer t.mu.Unlock()
	refused, isolated := t.refused, t.isolated
	t.refused, t.isolated = nil, map[recordTarget]bool{}
	if committed || prodErr == nil {
		// Committed: every record produced alone was accepted. Aborted
		// for another reason (rebalance, fencing): decide again as
		// usual, the suspects staying suspects.
		if committed {
			for key := range isolated {
				delete(t.known, key)
			}
			t.abortsRun = 0
		}
		return nil
	}
	var te *TopicError
	if errors.As(prodErr, &te) {
		return te
	}
	refusedNow := map[recordTarget]bool{}
	for _, x := range refused {
		key := targetOf(x.in, x.out)
		refusedNow[key] = true
		rj := t.known[key]
		rj.reason, rj.detail, rj.err = recordReason(x.err), x.err.Error(), x.err
		if isolated[key] {
			rj.alone++
		}
		t.known[key] = rj
		if rj.alone >= refusalsAlone && w.opts.DeadLetterTopic == "" {
			return &RecordError{Topic: x.in.Topic, Partition: x.in.Partition, Offset: x.in.Offset, Target: x.out.Topic, Reason: rj.reason, Detail: rj.detail, Err: x.err}
		}
	}
	for key := range isolated {
		if !refusedNow[key] {
			delete(t.known, key) // accepted alone: a neighbour of the culprit
		}
	}
	if len(refused) > 0 {
		t.abortsRun = 0
		return nil
	}
	if t.abortsRun++; t.abortsRun >= maxProduceAborts {
		return fmt.Errorf("producing in a transaction failed %d times in a row; stopping instead of aborting again: %w", t.abortsRun, prodErr)
	}
	return nil
}
