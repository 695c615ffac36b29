package consumer

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// transactLoop is the exactly-once loop. Each poll is one Kafka transaction:
// decide the polled records (filter changes staged in an overlay), produce
// the forwarded ones (and, with DuplicatesTopic, the dropped ones) in the
// transaction, and end it, which commits the
// consumed offsets with the output. Only if it committed do the staged
// changes become part of the filter; on abort they are dropped and franz-go
// rewinds the input to the committed offsets, so the same records are
// decided again. Write batches go to Badger between transactions, so a
// checkpoint never covers an uncommitted transaction; a crash after a Kafka
// commit and before the write batch leaves Badger behind, which recovery
// replays.
//
// Rebalance callbacks run between iterations (BlockRebalanceOnPoll); a
// member fenced mid-transaction (session expired, KIP-447 generation check)
// fails the offset commit, and End aborts.
//
// It returns nil when ctx ends, and an error when the transactional
// producer is unusable and the session must be restarted; a partition's
// storage failure stops the worker through fail.
func (w *Worker) transactLoop(ctx context.Context) error {
	// One transaction's dirtied pages must fit in half a write batch
	// (flushDue cuts one at the other half). The bound per record is
	// static (dedup.Options.MaxDirtyBytesPerRecord), so the first
	// transaction after a start or a rebalance is sized like every other.
	maxRecords := int(max(1, min(pollRecords, w.opts.FlushBytes/2/w.opts.Dedup.Options().MaxDirtyBytesPerRecord())))
	for ctx.Err() == nil {
		w.live.stamp("polling and running a transaction")
		pctx, cancel := context.WithTimeout(ctx, w.opts.FlushInterval)
		fetches := w.sess.PollRecords(pctx, maxRecords)
		cancel()
		if fetches.IsClientClosed() || ctx.Err() != nil {
			return nil
		}
		w.logFetchErrors(fetches)
		fetches.EachPartition(w.observeHighWatermark)
		if fetches = w.skipRecords(fetches); w.fatal.Load() {
			return nil // fail has stopped polling
		}
		if fetches.NumRecords() > 0 {
			if err := w.transact(ctx, fetches); err != nil {
				if errors.Is(err, errPartitionFailed) {
					return nil // fail has stopped polling
				}
				return err
			}
		} else if w.revokedSinceEnd.Swap(false) {
			// Nothing polled, no transaction: end the empty one, or the
			// session would skip the callbacks of the next revocation
			// and the revoked partitions would stay open here.
			endCtx, cancel := context.WithTimeout(ctx, max(30*time.Second, 2*w.opts.SessionTimeout))
			_, err := w.sess.End(endCtx, kgo.TryAbort)
			cancel()
			if err != nil && ctx.Err() == nil {
				return fmt.Errorf("ending an empty transaction after a revocation: %w", err)
			}
		}
		w.flushDue()
		w.sess.AllowRebalance()
	}
	return nil
}

// errPartitionFailed marks a transaction aborted because a partition failed
// (it has called fail already).
var errPartitionFailed = errors.New("consumer: partition failed")

// transact runs one transaction over the polled records.
func (w *Worker) transact(ctx context.Context, fetches kgo.Fetches) error {
	w.revokedSinceEnd.Store(false) // End below clears the session's own mark
	if err := w.sess.Begin(); err != nil {
		return fmt.Errorf("beginning a transaction: %w", err)
	}
	var (
		mu      sync.Mutex
		prodErr error // the first produce error
		nFailed int   // records that failed
		touched []*partitionWorker
		failed  error
	)
	produce := w.boundBatches(func(in, out *kgo.Record) {
		w.sess.Produce(ctx, out, func(_ *kgo.Record, err error) {
			w.countDeadLetter(out, err)
			if err != nil {
				w.m.produceErrors.Inc()
				w.txnProduceFailed(in, out, err)
				mu.Lock()
				if prodErr == nil {
					prodErr = w.produceError(in, out, err)
				}
				nFailed++
				mu.Unlock()
			}
		})
	})
	fetches.EachPartition(func(p kgo.FetchTopicPartition) {
		if len(p.Records) == 0 || failed != nil {
			return
		}
		pw := w.partition(p.Topic, p.Partition)
		if pw == nil {
			return // not ours any more; the transaction carries no output for it
		}
		touched = append(touched, pw)
		pw.process(p.Records, produce)
		if pw.failed.Load() {
			failed = fmt.Errorf("%w: %s/%d", errPartitionFailed, p.Topic, p.Partition)
		}
	})

	// Every produced record must be acknowledged or failed before the
	// transaction ends: a record that failed (too large, not authorized)
	// must abort the transaction, or its offset would commit without it.
	// The deadline only bounds a broker that stays unreachable; cancelling
	// a transaction leaves the client unusable, so it stops the worker.
	endStart := time.Now()
	endCtx, cancel := context.WithTimeout(context.Background(), max(30*time.Second, 2*w.opts.SessionTimeout))
	defer cancel()
	if err := w.cl.Flush(endCtx); err != nil {
		for _, pw := range touched {
			_ = pw.abortTxn() // the worker stops; what matters is that nothing staged is written
		}
		return fmt.Errorf("flushing the transaction's records: %w", err)
	}
	try := kgo.TryCommit
	mu.Lock()
	if prodErr != nil {
		w.log.Warn("producing in a transaction failed; aborting it, the input will be decided again", "err", prodErr, "failed_records", nFailed)
		try = kgo.TryAbort
	}
	txnProdErr := prodErr
	mu.Unlock()
	if failed != nil {
		try = kgo.TryAbort
	}
	committed, endErr := w.sess.End(endCtx, try)
	outcome := "aborted"
	if committed && endErr == nil {
		outcome = "committed"
		w.m.txnSeconds.Observe(time.Since(endStart).Seconds())
	}
	w.m.txns.WithLabelValues(outcome).Inc()
	for _, pw := range touched {
		end := pw.abortTxn
		if committed && endErr == nil {
			end = pw.commitTxn
		}
		if err := end(); err != nil {
			pw.fail(err)
		}
	}
	w.endTxnSkips(committed && endErr == nil)
	if err := w.endTxnRejections(committed && endErr == nil, txnProdErr); err != nil && failed == nil {
		// A refused record without a dead-letter topic, a missing topic,
		// or produce errors that aborting does not cure: stop once
		// instead of aborting in a loop.
		w.fail(err)
		failed = fmt.Errorf("%w: %v", errPartitionFailed, err)
	}
	if endErr != nil {
		// franz-go: no error End returns is retryable; the transactional
		// id may be fenced. The staged changes are dropped above; restart.
		if failed != nil {
			return failed
		}
		return fmt.Errorf("ending a transaction: %w", endErr)
	}
	return failed
}

// flushDue cuts the write batches that are due: after FlushInterval, or when
// the dirty pages reach half of FlushBytes (a transaction adds at most the
// other half).
func (w *Worker) flushDue() {
	w.mu.Lock()
	parts := make([]*partitionWorker, 0, len(w.parts))
	for _, pw := range w.parts {
		parts = append(parts, pw)
	}
	w.mu.Unlock()
	for _, pw := range parts {
		if !pw.planned.Load() || pw.restoring.Load() {
			continue // its restore goroutine owns (or may be about to own) the deduplicator
		}
		if time.Since(pw.lastFlush) >= w.opts.FlushInterval || pw.dedup.DirtyBytes() >= w.opts.FlushBytes/2 {
			pw.flush()
		}
		pw.consolidateIdle()
	}
}
