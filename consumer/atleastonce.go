package consumer

// At least once: the poll loop hands each partition's records to the
// partition's own goroutine (run), which decides them, produces without
// waiting, and cuts write batches (flush: wait for the acks, commit to
// Badger, mark the offset for the group commit). Records the broker
// refused are retried alone at the next write batch.

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kdedup/kdedup/store"
)

// atLeastOnce is the mode of AtLeastOnce delivery.
type atLeastOnce struct{ w *Worker }

func (m atLeastOnce) connect(opts []kgo.Opt) error {
	cl, err := kgo.NewClient(m.w.clientOpts(opts)...)
	if err != nil {
		return fmt.Errorf("creating kafka client: %w", err)
	}
	m.w.setCompressor(cl, false)
	m.w.publish(nil, cl)
	return nil
}

func (m atLeastOnce) loop(ctx context.Context) error {
	m.w.pollLoop(ctx)
	return nil
}

func (atLeastOnce) opened(pw *partitionWorker) { go pw.run() }

// release commits the group offsets the revoked partitions' last write
// batches marked, before the partitions move.
func (m atLeastOnce) release(ctx context.Context, cl *kgo.Client, tps map[string][]int32, lost bool) int {
	stopped := m.w.stopPartitions(tps, lost)
	if len(stopped) == 0 || lost {
		return len(stopped)
	}
	if err := cl.CommitMarkedOffsets(ctx); err != nil {
		m.w.log.Warn("committing group offsets on revocation; the next owner may repeat up to one flush interval", "err", err)
	}
	m.w.finalSnapshots(stopped) // after the commit: the rebalance's deadline is the group's
	return len(stopped)
}

// stop asks the partition's goroutine to end; it closes done.
func (atLeastOnce) stop(pw *partitionWorker, abort bool) {
	if abort {
		close(pw.queue.abort)
	} else {
		close(pw.queue.quit)
	}
}

func (m atLeastOnce) closing(ctx context.Context) {
	m.w.live.stamp("committing group offsets")
	if err := m.w.cl.CommitMarkedOffsets(ctx); err != nil {
		m.w.log.Warn("committing group offsets at shutdown; the next owner resumes from the Badger checkpoint", "err", err)
	}
}

// batchEnd is the last decided record, once every record produced is
// acknowledged and those the broker refused were retried (retryRejected);
// a failed produce is the error.
func (atLeastOnce) batchEnd(pw *partitionWorker) (store.Checkpoint, int64, error) {
	pw.produced.inflight.Wait()
	if err := pw.produced.err.Load(); err != nil {
		return store.Checkpoint{}, 0, *err
	}
	if err := pw.retryRejected(); err != nil {
		return store.Checkpoint{}, 0, err
	}
	return pw.next, pw.decided, nil
}

// committed marks cp for the group commit. The first write batch after
// startAt commits cp itself: franz-go takes an offset the plan starts at
// for committed already, so a mark of it would never be committed.
func (atLeastOnce) committed(pw *partitionWorker, cp store.Checkpoint) {
	offsets := map[string]map[int32]kgo.EpochOffset{pw.topic: {pw.partition: {Epoch: cp.LeaderEpoch, Offset: cp.Offset}}}
	if pw.commitStart {
		pw.commitStart = false
		pw.cl.CommitOffsets(context.Background(), offsets, func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, _ *kmsg.OffsetCommitResponse, err error) {
			if err != nil {
				pw.w.log.Warn("committing where the partition starts; the next owner starts at the group's previous offset", "topic", pw.topic, "partition", pw.partition, "offset", cp.Offset, "err", err)
			}
		})
	}
	pw.cl.MarkCommitOffsets(offsets)
}

func (atLeastOnce) cutsPerRecord() bool { return true }

func (atLeastOnce) refused(*partitionWorker, *kgo.Record, *kgo.Record, func(in, out *kgo.Record)) (bool, bool) {
	return false, true
}

func (atLeastOnce) produceCompressed(pw *partitionWorker, in, out *kgo.Record, _ func(in, out *kgo.Record)) {
	pw.produceLarge(in, out)
}

func (atLeastOnce) skipped(store.TopicPartition) {}

func (atLeastOnce) offsetsApart() bool { return true }

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
		w.polled(fetches).EachPartition(w.dispatch)
		w.cl.AllowRebalance()
	}
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
	case pw.queue.in <- p.Records:
	case <-pw.queue.done:
	}
}

// settle ends a lost partition at least once: it waits for the acks of the
// records it forwarded and commits the filter state up to the last decided
// record to Badger, without marking the offset for the group, whose session
// is gone. The checkpoint then says what was forwarded: a later owner with
// this data directory resumes after it, one without resumes from the group
// offset (forwarding again at most the records since the last group
// commit). If a produce failed nothing is committed, and the next owner
// decides those records again.
func (pw *partitionWorker) settle() {
	pw.produced.inflight.Wait()
	if err := pw.produced.err.Load(); err != nil {
		pw.w.log.Warn("a lost partition's records were not all acknowledged; its next owner decides them again", "topic", pw.topic, "partition", pw.partition, "err", *err)
		return
	}
	if pw.failed.Load() || pw.next == pw.flushed {
		return
	}
	if err := pw.commitBatch(pw.next, pw.decided); err != nil {
		pw.fail(err)
	}
}

func (pw *partitionWorker) run() {
	defer pw.close()
	tick := time.NewTicker(pw.w.opts.FlushInterval)
	defer tick.Stop()
	for {
		select {
		case recs := <-pw.queue.in:
			select {
			case <-pw.queue.abort: // lost: decide nothing more, even with records queued
				pw.settle()
				return
			default:
			}
			pw.process(recs, pw.produce) // dropped once failed: the next owner reads them again from the checkpoint
		case <-tick.C:
			pw.flush()
			pw.consolidateIdle()
		case <-pw.queue.abort:
			pw.settle()
			return
		case <-pw.queue.quit:
			pw.drain()
			pw.flush()
			return
		}
	}
}

// drain processes what is queued. Dispatch never runs during a revocation
// or after polling stopped, so the queue is all this partition will get.
func (pw *partitionWorker) drain() {
	for {
		select {
		case recs := <-pw.queue.in:
			pw.process(recs, pw.produce)
		default:
			return
		}
	}
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
		pw.produced.mu.Lock()
		pw.produced.mu.rejected = append(pw.produced.mu.rejected, rejected{in, out, err})
		pw.produced.mu.Unlock()
		return
	}
	err = pw.w.produceError(in, out, err)
	pw.produced.err.CompareAndSwap(nil, &err)
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
	pw.produced.mu.Lock()
	rej := pw.produced.mu.rejected
	pw.produced.mu.rejected = nil
	pw.produced.mu.Unlock()
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
			pw.w.countAcknowledged(x.out, nil)
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
		pw.w.countAcknowledged(dl, err)
		if err != nil {
			return pw.w.produceError(x.in, dl, err)
		}
	}
	return nil
}
