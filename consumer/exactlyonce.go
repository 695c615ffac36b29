package consumer

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kdedup/kdedup/store"
)

// exactlyOnce is the mode of ExactlyOnce delivery: the transaction loop
// (transactLoop) drives every partition, rebalances run between its
// transactions, and records the broker refused are remembered across
// aborted transactions (txnRejections).
type exactlyOnce struct{ w *Worker }

func newExactlyOnce(w *Worker) exactlyOnce {
	// Both outcomes from the start, so that an increase from 0 shows.
	w.m.txns.WithLabelValues("committed")
	w.m.txns.WithLabelValues("aborted")
	return exactlyOnce{w}
}

func (m exactlyOnce) connect(opts []kgo.Opt) error {
	sess, err := kgo.NewGroupTransactSession(m.w.clientOpts(opts)...)
	if err != nil {
		return fmt.Errorf("creating kafka transactional client: %w", err)
	}
	m.w.setCompressor(sess.Client(), true)
	m.w.publish(sess, sess.Client())
	return nil
}

func (m exactlyOnce) loop(ctx context.Context) error { return m.w.transactLoop(ctx) }

// opened does nothing: the transaction loop drives the partition.
func (exactlyOnce) opened(*partitionWorker) {}

// release tells the transaction loop that the session heard of a
// revocation or a loss (revokedSinceEnd) and stops the partitions.
func (m exactlyOnce) release(_ context.Context, _ *kgo.Client, tps map[string][]int32, lost bool) int {
	m.w.revokedSinceEnd.Store(true)
	stopped := m.w.stopPartitions(tps, lost)
	if !lost {
		m.w.finalSnapshots(stopped)
	}
	return len(stopped)
}

// stop ends the partition here: the transaction loop that drives it is
// not running during a group callback or at shutdown.
func (exactlyOnce) stop(pw *partitionWorker, abort bool) {
	if !abort {
		pw.flush()
	}
	pw.close()
}

// closing does nothing: each transaction committed its offsets.
func (exactlyOnce) closing(context.Context) {}

// batchEnd is the end of the last committed transaction: never a
// checkpoint past it.
func (exactlyOnce) batchEnd(pw *partitionWorker) (store.Checkpoint, int64, error) {
	return pw.stableNext, pw.stableDecided, nil
}

func (exactlyOnce) committed(*partitionWorker, store.Checkpoint) {}

func (exactlyOnce) cutsPerRecord() bool { return false }

func (exactlyOnce) refused(pw *partitionWorker, in, out *kgo.Record, produce func(in, out *kgo.Record)) (bool, bool) {
	return pw.sendTxn(in, out, produce)
}

// produceCompressed produces out in the transaction: boundBatches sends it
// alone in its batch.
func (exactlyOnce) produceCompressed(_ *partitionWorker, in, out *kgo.Record, produce func(in, out *kgo.Record)) {
	produce(in, out)
}

func (m exactlyOnce) skipped(tp store.TopicPartition) {
	m.w.txn.skipped = append(m.w.txn.skipped, tp)
}

func (exactlyOnce) offsetsApart() bool { return false }

// transactLoop is the exactly-once loop. Each Kafka transaction decides
// the records of one or more polls (filter changes staged in an overlay),
// produces the forwarded ones (and, with DuplicatesTopic, the dropped ones)
// in the transaction, and ends, which commits the consumed offsets with the
// output. Only if it committed do the staged changes become part of the
// filter; on abort they are dropped and franz-go rewinds the input to the
// committed offsets, so the same records are decided again. Write batches
// go to Badger between transactions, so a checkpoint never covers an
// uncommitted transaction; a crash after a Kafka commit and before the
// write batch leaves Badger behind, which recovery replays.
//
// A transaction is sized by time and by the bytes it stages: it polls
// again until TransactionInterval has passed since it began, each poll
// bounded by txnBudget, and ends when the budget is spent. Every record a
// poll returns is decided in the transaction that polled it: End commits
// the offsets of all polled records.
//
// Rebalance callbacks run between transactions (BlockRebalanceOnPoll); a
// member fenced mid-transaction (session expired, KIP-447 generation check)
// fails the offset commit, and End aborts.
//
// It returns nil when ctx ends, and an error when the transactional
// producer is unusable and the session must be restarted; a partition's
// storage failure stops the worker through fail.
func (w *Worker) transactLoop(ctx context.Context) error {
	// The budget of each transaction's first poll is taken while
	// rebalances are still blocked by the previous poll: once
	// AllowRebalance returns, a revocation may close any partition.
	budget := w.txnBudgetOf(nil)
	for ctx.Err() == nil {
		w.live.stamp("polling and running a transaction")
		pctx, cancel := context.WithTimeout(ctx, w.opts.FlushInterval)
		fetches := w.sess.PollRecords(pctx, max(1, budget)) // 0 would be no bound
		cancel()
		if fetches.IsClientClosed() || ctx.Err() != nil {
			return nil
		}
		if fetches = w.polled(fetches); w.fatal.Load() {
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
		budget = w.txnBudget()
		w.sess.AllowRebalance()
	}
	return nil
}

// txnBudget is how many records the next poll of a transaction may add:
// for each partition the transaction loop drives, the bytes left before
// its dirty and staged pages reach FlushBytes, over the bytes one record
// can dirty (dedup.Options.MaxDirtyBytesPerRecord, a bound that holds for
// any record); the least of them, and at most pollRecords and
// FlushBytes over that bound (a partition yet to be assigned), and no more
// than keeps the dirty and staged pages of all partitions under 1.5 x
// MaxDirtyPageBytes. flushDue cuts a
// write batch once the dirty pages reach half of FlushBytes (batchDue,
// txnReserve), so a
// transaction's first poll may add at least FlushBytes/2 of pages, and a
// write batch never passes FlushBytes, one Badger transaction.
//
// It reads the partitions' deduplicators, so it runs only where the
// transaction loop owns them: with rebalances blocked (between a poll and
// AllowRebalance), when no revocation can close one.
func (w *Worker) txnBudget() int { return w.txnBudgetOf(w.assignedPartitions()) }

// txnBudgetOf is txnBudget over parts.
func (w *Worker) txnBudgetOf(parts []*partitionWorker) int {
	per := w.opts.Dedup.Options().MaxDirtyBytesPerRecord()
	// A partition assigned while the poll waits has nothing dirty or
	// staged yet (a write batch ends every replay): it bounds the poll
	// like an idle one.
	n := min(pollRecords, w.opts.FlushBytes/per)
	pageBytes := int64(w.opts.Dedup.PageBytes())
	perStaged := per // a partition assigned while the poll waits is not known here
	stateful := 0    // partitions holding pages (the repartition stage's hold none)
	for _, pw := range parts {
		if pw.stateless() {
			continue
		}
		stateful++
		if pw.owner() != ownerLoop {
			continue // its restore goroutine owns the deduplicator; the group client fetches nothing for it
		}
		n = min(n, (w.opts.FlushBytes-pw.dedup.DirtyBytes()-pw.dedup.StagedBytes())/per)
		perStaged = max(perStaged, int64(pw.dedup.MaxPagesPerRecord())*pageBytes)
	}
	// The pages of all partitions, dirty and staged, stay under the
	// ceiling OverDirtyShare keeps them under at least once, 1.5 x
	// MaxDirtyPageBytes or store.MinCutPages a partition, whichever is
	// more (below MinCutPages no partition is asked to cut, so a lower
	// ceiling could leave every transaction one record long until the
	// flush interval): a record stages at most perStaged bytes of pages (it
	// reads one page of each sub-filter), and flushDue cuts the batches of
	// the partitions holding their share once the transaction's changes
	// are applied.
	if bound := w.opts.MaxDirtyPageBytes; bound > 0 {
		ceiling := max(bound*3/2, int64(stateful)*store.MinCutPages*pageBytes)
		held := w.opts.Dedup.DirtyPageBytes() // dirty and staged, every partition's, replays included
		n = min(n, (ceiling-held)/perStaged)
	}
	return int(max(0, n))
}

// errPartitionFailed marks a transaction aborted because a partition failed
// (it has called fail already).
var errPartitionFailed = errors.New("consumer: partition failed")

// transact runs one transaction over the polled records and those of the
// polls it makes until TransactionInterval ends or txnBudget is spent.
func (w *Worker) transact(ctx context.Context, fetches kgo.Fetches) error {
	w.revokedSinceEnd.Store(false) // End below clears the session's own mark
	began := time.Now()
	if err := w.sess.Begin(); err != nil {
		return fmt.Errorf("beginning a transaction: %w", err)
	}
	var (
		touched []*partitionWorker
		failed  error
	)
	txn := &txnProduce{w: w, prod: w.sess}
	produce := w.boundBatches(txn.produce)
	records := 0
	inTxn := map[*partitionWorker]bool{}
	decide := func(fetches kgo.Fetches) {
		fetches.EachPartition(func(p kgo.FetchTopicPartition) {
			if len(p.Records) == 0 || failed != nil {
				return
			}
			pw := w.partition(p.Topic, p.Partition)
			if pw == nil {
				return // not ours any more; the transaction carries no output for it
			}
			if !inTxn[pw] {
				inTxn[pw] = true
				touched = append(touched, pw)
			}
			records += len(p.Records)
			pw.process(p.Records, produce)
			if pw.failed.Load() {
				failed = fmt.Errorf("%w: %s/%d", errPartitionFailed, p.Topic, p.Partition)
			}
		})
	}
	decide(fetches)
	// Poll again until the interval has passed or the budget is spent.
	// These polls do not end with ctx: what they return must be decided
	// here, and a stop waits at most one interval.
	for failed == nil && ctx.Err() == nil { // a stop ends the transaction now
		left := w.opts.TransactionInterval - time.Since(began)
		budget := w.txnBudget()
		if left <= 0 || budget < 1 {
			break
		}
		w.live.stamp("polling within a transaction")
		pctx, cancel := context.WithTimeout(context.Background(), left)
		more := w.sess.PollRecords(pctx, budget)
		cancel()
		if more.IsClientClosed() {
			break // End fails, and the session restarts
		}
		if more = w.polled(more); w.fatal.Load() {
			failed = fmt.Errorf("%w: a batch cannot be skipped", errPartitionFailed) // its offsets were polled: abort
			break
		}
		decide(more)
	}
	w.m.txnRecords.Observe(float64(records))

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
	txn.mu.Lock()
	prodErr := txn.err
	if prodErr != nil {
		w.log.Warn("producing in a transaction failed; aborting it, the input will be decided again", "err", prodErr, "failed_records", txn.nFailed)
		try = kgo.TryAbort
	}
	txnProdErr := prodErr
	txn.mu.Unlock()
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

// flushDue cuts the write batches that are due between transactions:
// after FlushInterval, or by batchDue with room for the next transaction
// (txnReserve: a transaction adds at most what txnBudget leaves).
func (w *Worker) flushDue() {
	consolidated := false
	for _, pw := range w.assignedPartitions() {
		if pw.owner() != ownerLoop {
			continue // its restore goroutine owns (or may be about to own) the deduplicator
		}
		if time.Since(pw.lastFlush) >= w.opts.FlushInterval || pw.batchDue(w.txnReserve()) {
			pw.flush()
		}
		// One consolidation step a call, as at least once one a worker at
		// a time: rebalances and a stop wait for this loop. The
		// snapshot's order is the map's, so every idle partition gets
		// its turn.
		if !consolidated {
			consolidated = pw.consolidateIdle()
		}
	}
}

// commitTxn ends, for this partition, a transaction that Kafka committed
// (exactly once): what it decided becomes its stable state, the point an
// abort returns to and the checkpoint of its next write batch, and the
// deduplicator's staged changes join that batch. An error is the
// deduplicator's, and the caller fails the partition.
func (pw *partitionWorker) commitTxn() error {
	pw.stableNext, pw.stableDecided = pw.next, pw.decided
	if pw.stateless() {
		return nil
	}
	return pw.dedup.CommitStaged()
}

// abortTxn ends, for this partition, a transaction that was aborted or
// could not end (exactly once): the partition returns to its last committed
// transaction, as franz-go rewinds the input there, so that the same records
// are decided again, and the deduplicator drops its staged changes, which no
// write batch may ever hold. An error is the deduplicator's.
func (pw *partitionWorker) abortTxn() error {
	pw.next, pw.decided = pw.stableNext, pw.stableDecided
	pw.gauges.nextOffset.Store(pw.next.Offset)
	if pw.stateless() {
		return nil
	}
	return pw.dedup.DiscardStaged()
}

// endTxnSkips runs after a transaction ends. SetOffsets past a skipped
// batch also moved franz-go's notion of the committed offset, which an
// aborted transaction rewinds to: rewind such partitions to their last
// committed transaction instead, so that the batch is met (and its dead
// letter produced) again.
func (w *Worker) endTxnSkips(committed bool) {
	skipped := w.txn.skipped
	w.txn.skipped = nil
	if committed {
		return
	}
	for _, tp := range skipped {
		if pw := w.partition(tp.Topic, tp.Partition); pw != nil {
			w.cl.SetOffsets(map[string]map[int32]kgo.EpochOffset{tp.Topic: {tp.Partition: {Epoch: pw.stableNext.LeaderEpoch, Offset: pw.stableNext.Offset}}})
		}
	}
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
	key := targetOf(in, out)
	t := &w.txn.rejections
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
	w.txn.rejections.mu.Lock()
	w.txn.rejections.refused = append(w.txn.rejections.refused, rejected{in, out, err})
	w.txn.rejections.mu.Unlock()
}

// endTxnRejections learns from the transaction that just ended which
// records were refused and returns the error that must stop the worker, if
// any: a culprit without a dead-letter topic, a topic error, or too many
// aborts in a row caused by other produce errors (prodErr is the first).
func (w *Worker) endTxnRejections(committed bool, prodErr error) error {
	t := &w.txn.rejections
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
