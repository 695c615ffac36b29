package consumer

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kdedup/kdedup/store"
)

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
		w.mode.skipped(store.TopicPartition{Topic: e.Topic, Partition: e.Partition})
	}
	return fetches
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
