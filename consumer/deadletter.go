package consumer

import (
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
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
	return fmt.Sprintf("%s cannot be forwarded%s: %s (%s); no dead-letter topic is set, so the worker stops without committing it",
		what, target, e.Reason, e.Detail)
}

func (e *RecordError) Unwrap() error { return e.Err }

// TopicRole is what the worker produces to a topic for. The worker names
// topics by role in its errors (TopicError); its caller maps a role to the
// setting that chose the topic.
type TopicRole uint8

const (
	// RoleOutput is Options.OutputTopic: the forwarded records.
	RoleOutput TopicRole = iota
	// RoleDuplicates is Options.DuplicatesTopic: the dropped records.
	RoleDuplicates
	// RoleDeadLetter is Options.DeadLetterTopic: the dead letters.
	RoleDeadLetter
	// RoleRepartition is Options.RepartitionTopic: the input records
	// keyed by their dedup key.
	RoleRepartition
)

// String returns "output", "duplicates", "dead-letter" or "repartition".
func (r TopicRole) String() string {
	switch r {
	case RoleOutput:
		return "output"
	case RoleDuplicates:
		return "duplicates"
	case RoleDeadLetter:
		return "dead-letter"
	case RoleRepartition:
		return "repartition"
	}
	return fmt.Sprintf("TopicRole(%d)", uint8(r))
}

// TargetTopic is a topic the worker produces to, with its role.
type TargetTopic struct {
	Role  TopicRole
	Topic string
}

// TargetTopics returns the topics a worker with o produces to: the output
// topic, then the duplicates, the dead-letter and the repartition topic
// when set.
func (o Options) TargetTopics() []TargetTopic {
	ts := []TargetTopic{{RoleOutput, o.OutputTopic}}
	if o.DuplicatesTopic != "" {
		ts = append(ts, TargetTopic{RoleDuplicates, o.DuplicatesTopic})
	}
	if o.DeadLetterTopic != "" {
		ts = append(ts, TargetTopic{RoleDeadLetter, o.DeadLetterTopic})
	}
	if o.RepartitionTopic != "" {
		ts = append(ts, TargetTopic{RoleRepartition, o.RepartitionTopic})
	}
	return ts
}

// roleOf returns the role of topic, one the worker produces to.
func (w *Worker) roleOf(topic string) TopicRole {
	switch topic {
	case w.opts.DuplicatesTopic:
		return RoleDuplicates
	case w.opts.DeadLetterTopic:
		return RoleDeadLetter
	case w.opts.RepartitionTopic:
		return RoleRepartition
	}
	return RoleOutput
}

// ErrTopic is matched (errors.Is) by every *TopicError.
var ErrTopic = errors.New("topic missing or not writable")

// TopicError is the error that stops the worker when a topic it produces to
// does not exist or may not be written: every record to it would fail.
// It matches ErrTopic.
type TopicError struct {
	Role  TopicRole
	Topic string
	// Err is the broker's error, or what a check found.
	Err error
}

func (e *TopicError) Error() string {
	return fmt.Sprintf("%v (the %s topic %s: kdedup does not create topics, and its principal needs Describe and Write on them)", e.Err, e.Role, e.Topic)
}

func (e *TopicError) Unwrap() error { return e.Err }

// Is reports whether target is ErrTopic.
func (e *TopicError) Is(target error) bool { return target == ErrTopic }

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
		return &TopicError{Role: w.roleOf(out.Topic), Topic: out.Topic, Err: err}
	}
	if reason := recordReason(err); reason != "" {
		return fmt.Errorf("producing record %s/%d offset %d to %s: refused by the broker (%s): %w", in.Topic, in.Partition, in.Offset, out.Topic, reason, err)
	}
	return fmt.Errorf("producing record of %s/%d offset %d to %s: %w", in.Topic, in.Partition, in.Offset, out.Topic, err)
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

// countAcknowledged wraps a produce promise (and follows a synchronous
// produce): a dead letter, and a record of the repartition topic, is
// counted once acknowledged.
func (w *Worker) countAcknowledged(out *kgo.Record, err error) {
	if err == nil && out.Topic == w.opts.RepartitionTopic && w.opts.RepartitionTopic != "" {
		w.m.repartitioned.Inc()
		return
	}
	if err != nil || out.Topic != w.opts.DeadLetterTopic || w.opts.DeadLetterTopic == "" {
		return
	}
	for _, h := range out.Headers {
		if h.Key == HeaderDeadLetterReason {
			w.m.deadLetters.WithLabelValues(string(h.Value)).Inc()
		}
	}
}
