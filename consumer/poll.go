package consumer

import (
	"context"
	"errors"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// pollRecords bounds one poll at least once; the partition goroutines take
// batches of it.
const pollRecords = 10_000

// pollTick bounds one wait of the at-least-once poll loop for records, so
// that the loop iterates, and reports progress, while the input is idle:
// franz-go's PollRecords otherwise waits for records for ever. An expired
// wait returns no records and loses none.
const pollTick = time.Second

// poll is one at-least-once poll, bounded by pollTick, reporting progress
// before and after it.
func (w *Worker) poll(ctx context.Context) kgo.Fetches {
	w.live.stamp("polling")
	pctx, cancel := context.WithTimeout(ctx, pollTick)
	defer cancel()
	fetches := w.cl.PollRecords(pctx, pollRecords)
	w.live.stamp("handing records to partitions")
	return fetches
}

// pollLoop is the at-least-once loop: poll and hand records to the
// partition goroutines, which produce, flush and mark offsets themselves.
func (w *Worker) pollLoop(ctx context.Context) {
	for {
		fetches := w.poll(ctx)
		if fetches.IsClientClosed() || ctx.Err() != nil {
			return
		}
		w.logFetchErrors(fetches)
		fetches.EachPartition(w.observeHighWatermark)
		fetches = w.skipRecords(fetches)
		fetches.EachPartition(w.dispatch)
		w.cl.AllowRebalance()
	}
}

func (w *Worker) logFetchErrors(fetches kgo.Fetches) {
	fetches.EachError(func(topic string, partition int32, err error) {
		if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
			w.log.Warn("fetch error", "topic", topic, "partition", partition, "err", err)
		}
	})
}

// dispatch hands a polled batch to its partition's goroutine. It runs with
// rebalances blocked (BlockRebalanceOnPoll), so no partition is revoked while
// its records are handed over.
func (w *Worker) dispatch(p kgo.FetchTopicPartition) {
	if len(p.Records) == 0 {
		return
	}
	pw := w.partition(p.Topic, p.Partition)
	if pw == nil {
		w.log.Error("records for a partition without state; they will be consumed again by its owner", "topic", p.Topic, "partition", p.Partition)
		return
	}
	select {
	case pw.in <- p.Records:
	case <-pw.done:
	}
}

// observeHighWatermark records the partition's high watermark for the
// lag metric, also from fetches that carry no records.
func (w *Worker) observeHighWatermark(p kgo.FetchTopicPartition) {
	if p.HighWatermark < 0 {
		return
	}
	if pw := w.partition(p.Topic, p.Partition); pw != nil {
		pw.highWatermark.Store(p.HighWatermark)
	}
}
