package consumer

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kdedup/kdedup/dedup"
	"github.com/kdedup/kdedup/store"
)

// partitionWorker owns one assigned topic-partition. Its fields fall in
// groups by who may touch them. The deduplicator and the decision fields
// belong to one owner at a time, which owned says (read through owner, the
// one guard): until adjustOffsets has planned the start, nobody decides;
// while a replay runs, its restore goroutine; then the loop (at least
// once, the partition's own goroutine, run; exactly once, the transaction
// loop, which also ends its part of each transaction).
type partitionWorker struct {
	// Set by newPartition, read-only after. dedup is nil for a
	// partition of the repartition stage (stateless).
	w         *Worker
	cl        *kgo.Client // the group client it was assigned by
	prod      producer    // cl, producing at least once (produce)
	topic     string
	partition int32
	// sourcePrefix is "topic/partition/" of HeaderOriginalSource, made
	// by rekeyed at its first record (the repartition stage only, on the
	// loop's goroutine).
	sourcePrefix []byte

	// owned says who owns dedup and the decision fields below now: read
	// it through owner. Bits ownedPlanned and ownedReplaying.
	owned atomic.Uint32

	// The owner's: the deduplicator and where the partition stands.
	dedup      *dedup.Deduplicator
	next       store.Checkpoint // offset after the last decided record
	stableNext store.Checkpoint // exactly once: next as of the last committed transaction
	flushed    store.Checkpoint // checkpoint of the last write batch
	lastFlush  time.Time
	// lastActive is when the partition last decided records, and
	// lastConsolidate when it last consolidated pages (consolidateIdle).
	lastActive, lastConsolidate time.Time
	// Records decided or replayed: in all, as of the last committed
	// transaction (exactly once) and as of the last write batch; their
	// differences size write batches (metrics only).
	decided, stableDecided, flushedDecided int64
	// Set by startAt before the start is planned; read at least once
	// only: the next write batch commits its checkpoint to the group
	// itself (atLeastOnce.committed).
	commitStart bool

	// At least once, the partition's goroutine: its queue and how it is
	// told to end (mode.stop); done is closed once it has ended.
	queue struct {
		in    chan []*kgo.Record
		quit  chan struct{} // finish queued records, commit, exit
		abort chan struct{} // drop uncommitted state, exit
		done  chan struct{}
	}

	// At least once, shared with produce callbacks: forwarded records not
	// yet acknowledged, the first produce error, and, under mu, the
	// records the broker refused, to retry alone at the next write batch
	// (retryRejected).
	produced struct {
		inflight sync.WaitGroup
		err      atomic.Pointer[error]
		mu       struct {
			sync.Mutex
			rejected []rejected
		}
	}

	// Any goroutine: the partition failed (fail); nothing more is decided
	// or committed.
	failed atomic.Bool

	// The plan's (adjustOffsets, on the group client's goroutine): where
	// it started the partition (hasStart: it has), and whether the
	// partition is still counted in Worker.unplanned (settlePlan).
	plan struct {
		start    kgo.Offset
		hasStart bool
		awaiting atomic.Bool
	}

	// The restore goroutine's (restore.go): under mu, the replay of
	// records [replay.from, replay.until), forwarded by an earlier owner,
	// that a restore client replays into the filter before the group
	// client resumes the partition at until. startReplay runs on the
	// client's goroutine (adjustOffsets); stop cancels the replay and
	// waits for done; abort (stop(abort)): the replay commits nothing
	// more.
	restoreCtl struct {
		mu struct {
			sync.Mutex
			replay replayState
		}
		abort  atomic.Bool
		cancel context.CancelFunc
		done   chan struct{}
	}

	// Snapshots (snapshot.go): the restore the plan chose (set before the
	// restore goroutine starts, read by it only); the checkpoint offset of
	// the last write batch (-1: none), and the offset and time (Unix
	// nanoseconds) of the last snapshot uploaded or restored (-1: none
	// since the assignment), read by the snapshotter.
	snap struct {
		plan      *snapshotPlan
		committed atomic.Int64
		offset    atomic.Int64
		at        atomic.Int64
	}

	// For the lag and replay metrics, read at scrape time: the high
	// watermark of the latest fetch and the next offset to decide (-1:
	// unknown), and the offsets left to replay.
	gauges struct {
		highWatermark, nextOffset, replayLeft atomic.Int64
	}
}

func newPartition(w *Worker, cl *kgo.Client, topic string, p int32, d *dedup.Deduplicator) *partitionWorker {
	pw := &partitionWorker{w: w, cl: cl, prod: cl, topic: topic, partition: p, dedup: d, lastFlush: time.Now()}
	pw.queue.in = make(chan []*kgo.Record, 4)
	pw.queue.quit, pw.queue.abort, pw.queue.done = make(chan struct{}), make(chan struct{}), make(chan struct{})
	pw.lastActive = pw.lastFlush
	pw.gauges.highWatermark.Store(-1)
	pw.gauges.nextOffset.Store(-1)
	pw.snap.committed.Store(-1)
	pw.snap.offset.Store(-1)
	pw.snap.at.Store(pw.lastFlush.UnixNano()) // the first snapshot an interval after the assignment
	if d == nil {
		return pw // a partition of the repartition stage: no state
	}
	if cp, ok := d.Checkpoint(); ok {
		pw.setCheckpoint(cp)
	}
	return pw
}

// setCheckpoint makes cp, just committed to Badger or read from it, where
// the partition stands: nothing decided past it.
func (pw *partitionWorker) setCheckpoint(cp store.Checkpoint) {
	pw.next, pw.stableNext, pw.flushed = cp, cp, cp
	pw.stableDecided, pw.flushedDecided = pw.decided, pw.decided
	pw.gauges.nextOffset.Store(cp.Offset)
	pw.snap.committed.Store(cp.Offset)
}

// groupBehind records that the group's committed offset, group, is behind
// the partition's checkpoint (at least once: a crash between the Badger and
// the group commit), so that its first write batch marks the checkpoint for
// the group even if no record follows: flush commits only a checkpoint that
// differs from the last one flushed.
func (pw *partitionWorker) groupBehind(group int64) {
	pw.flushed = store.Checkpoint{Offset: group, LeaderEpoch: -1}
}

// settlePlan takes the partition out of Worker.unplanned, once: its start
// is planned, or it was released before.
func (pw *partitionWorker) settlePlan() {
	if pw.plan.awaiting.CompareAndSwap(true, false) {
		pw.w.unplanned.Add(-1)
	}
}

// startAt makes the partition start at cp, with nothing to decide before
// it, and its first write batch commit cp even if no record follows (flush
// commits only a checkpoint that differs from the last one flushed, and -1
// is none).
//
// At least once that write batch also commits cp to the group, by a commit
// of its own: franz-go takes an offset the plan starts at for committed
// already, so a mark of it would never be committed.
func (pw *partitionWorker) startAt(cp store.Checkpoint) {
	pw.next, pw.stableNext = cp, cp
	pw.flushed = store.Checkpoint{Offset: -1, LeaderEpoch: -1}
	pw.gauges.nextOffset.Store(cp.Offset)
	pw.commitStart = true
}

// replayState is a partition's replay: [from, until) state-only; start is
// zero when no replay is running.
type replayState struct {
	from, until   int64
	start, logged time.Time
}

// dedupOwner is who may use a partition's deduplicator and decision
// fields at a moment (partitionWorker.owner).
type dedupOwner uint8

const (
	// ownerPlan: assigned, and adjustOffsets has not planned its start
	// yet; a replay may be about to begin, and nothing may decide or
	// commit (the restore goroutine's writes would not be ordered after
	// them).
	ownerPlan dedupOwner = iota
	// ownerRestore: its restore goroutine replays input into the filter
	// (restore.go); the group client fetches nothing for it.
	ownerRestore
	// ownerLoop: the loop decides its records (at least once, the
	// partition's goroutine; exactly once, the transaction loop) and
	// cuts its write batches.
	ownerLoop
)

// Bits of partitionWorker.owned.
const (
	ownedPlanned   = 1 << iota // adjustOffsets has planned the start
	ownedReplaying             // a replay runs: from startReplay to endReplay
)

// owner returns who owns the deduplicator now: ownerRestore while a replay
// runs, else ownerPlan until the start is planned, else ownerLoop. The
// replay and the plan end in either order (a short replay can end before
// adjustOffsets returns); only both make the loop the owner. Safe for
// concurrent use.
func (pw *partitionWorker) owner() dedupOwner {
	s := pw.owned.Load()
	switch {
	case s&ownedReplaying != 0:
		return ownerRestore
	case s&ownedPlanned == 0:
		return ownerPlan
	}
	return ownerLoop
}

func (pw *partitionWorker) stop(abort bool) {
	pw.stopReplay(abort)
	pw.w.mode.stop(pw, abort)
}

func (pw *partitionWorker) close() {
	if !pw.stateless() {
		pw.dedup.Close()
	}
	close(pw.queue.done)
}

// process decides recs in order, handing produce the output record of each
// forwarded one and, with DuplicatesTopic, of each dropped one. At least
// once it also cuts a write batch when the dirty pages reach FlushBytes.
func (pw *partitionWorker) process(recs []*kgo.Record, produce func(in, out *kgo.Record)) {
	if pw.failed.Load() {
		return
	}
	if len(recs) > 0 {
		pw.lastActive = time.Now()
	}
	if pw.stateless() {
		pw.route(recs, produce)
		return
	}
	restore := pw.restoresOriginals()
	dups := pw.w.opts.DuplicatesTopic
	if err := pw.dedup.Prefetch(recs); err != nil {
		pw.fail(err)
		return
	}
	for _, r := range recs {
		if r.Offset < pw.next.Offset {
			continue // decided before a restart: the checkpoint covers it (see plan)
		}
		if e, ok := skipped(r); ok { // a batch over MaxDecompressBytes
			pw.skip(e, produce)
			pw.next = store.Checkpoint{Offset: e.NextOffset, LeaderEpoch: e.Epoch}
			pw.decided++
			continue
		}
		d, err := pw.dedup.Decide(r)
		if err != nil {
			pw.fail(err)
			return
		}
		if restore {
			restoreOriginal(r) // keyed by its record key (OpenRouted), forwarded as it was read
		}
		if d == dedup.Unkeyed {
			pw.w.log.Debug("record cannot be keyed; forwarded unchanged", "topic", pw.topic, "partition", pw.partition, "offset", r.Offset, "reason", pw.dedup.LastKeyError())
		}
		sent := true
		if pw.dedup.Forwards(d) {
			sent = pw.send(r, pw.output(r), produce)
		} else if reason := dropReason(d); reason != "" && dups != "" {
			sent = pw.send(r, pw.dropped(r, reason), produce)
		}
		if !sent {
			return // failed: nothing from r on is committed
		}
		pw.next = store.Checkpoint{Offset: r.Offset + 1, LeaderEpoch: r.LeaderEpoch}
		pw.decided++
		if pw.w.mode.cutsPerRecord() && pw.batchDue(0) {
			pw.flush()
			if pw.failed.Load() {
				return
			}
		}
	}
	pw.gauges.nextOffset.Store(pw.next.Offset)
}

// output is the record forwarded for r: key, value, headers and timestamp
// kept; the default partitioner places it by key. It comes from outputs,
// and goes back there once produced (delivery.delivered).
func (pw *partitionWorker) output(r *kgo.Record) *kgo.Record {
	out := outputs.Get().(*kgo.Record)
	out.Topic, out.Key, out.Value, out.Headers, out.Timestamp = pw.w.opts.OutputTopic, r.Key, r.Value, r.Headers, r.Timestamp
	return out
}

// Headers of the records produced to Options.DuplicatesTopic, after the
// headers of the dropped record.
const (
	// HeaderReason says why the record was dropped: ReasonDuplicate or
	// ReasonLimit.
	HeaderReason = "kdedup-reason"
	// HeaderSource is where the dropped record was read: topic/partition/offset.
	HeaderSource = "kdedup-source"
)

// Values of HeaderReason.
const (
	// ReasonDuplicate marks a record decided dedup.Duplicate.
	ReasonDuplicate = "duplicate"
	// ReasonLimit marks a record decided dedup.OverLimit.
	ReasonLimit = "occurrence-limit"
)

// dropReason is the HeaderReason of a dropped decision, "" for the others.
func dropReason(d dedup.Decision) string {
	switch d {
	case dedup.Duplicate:
		return ReasonDuplicate
	case dedup.OverLimit:
		return ReasonLimit
	}
	return ""
}

// dropped is the record sent to the duplicates topic for r: r's key, value,
// headers and timestamp, then HeaderReason and HeaderSource.
func (pw *partitionWorker) dropped(r *kgo.Record, reason string) *kgo.Record {
	h := make([]kgo.RecordHeader, len(r.Headers), len(r.Headers)+2)
	copy(h, r.Headers)
	h = append(h,
		kgo.RecordHeader{Key: HeaderReason, Value: []byte(reason)},
		kgo.RecordHeader{Key: HeaderSource, Value: fmt.Appendf(nil, "%s/%d/%d", pw.topic, pw.partition, r.Offset)})
	return &kgo.Record{Topic: pw.w.opts.DuplicatesTopic, Key: r.Key, Value: r.Value, Headers: h, Timestamp: r.Timestamp}
}

// flush cuts a write batch up to where the mode allows (mode.batchEnd: at
// least once, once every produced record is acknowledged; exactly once,
// the last committed transaction), then lets the mode act on it
// (mode.committed: at least once, the offset is marked for the group
// commit). It runs only where the loop owns the deduplicator (ownerLoop):
// a replaying partition's restore goroutine cuts its own write batches.
func (pw *partitionWorker) flush() {
	if pw.owner() != ownerLoop {
		return
	}
	pw.lastFlush = time.Now()
	if pw.failed.Load() {
		return
	}
	cp, decided, err := pw.w.mode.batchEnd(pw)
	if err != nil {
		pw.fail(err)
		return
	}
	if cp == pw.flushed {
		return
	}
	if err := pw.commitBatch(cp, decided); err != nil {
		pw.fail(err)
		return
	}
	pw.w.mode.committed(pw, cp)
}

// commitBatch commits the partition's write batch with checkpoint cp, the
// offset after the decided-th record: one Badger transaction holding the
// changed pages, the chain metadata and cp (dedup.Deduplicator.Commit),
// counted in the batch metrics. Every write batch of decided or replayed
// records goes through it (flush, commitReplay, settle); consolidation
// steps (consolidateIdle) rewrite pages and commit no checkpoint. On error nothing is counted and
// flushed stays; the caller fails the partition.
func (pw *partitionWorker) commitBatch(cp store.Checkpoint, decided int64) error {
	if pw.stateless() {
		pw.flushed, pw.flushedDecided = cp, decided // nothing to keep: the offset alone moves
		return nil
	}
	dirty := pw.dedup.DirtyBytes()
	if err := pw.dedup.Commit(cp); err != nil {
		return err
	}
	pw.w.m.batches.Inc()
	pw.w.m.batchRecords.Observe(float64(decided - pw.flushedDecided))
	pw.w.m.batchBytes.Observe(float64(dirty))
	pw.flushed, pw.flushedDecided = cp, decided
	pw.snap.committed.Store(cp.Offset)
	return nil
}

// batchDue is the one rule that cuts a write batch before its time
// (FlushInterval): it reports whether the partition must cut it now,
// leaving room for reserve bytes of changes before the next check. That is
// when its dirty and staged pages reach FlushBytes less reserve (a write
// batch is one Badger transaction of at most FlushBytes), or when the dirty
// pages of all partitions reach MaxDirtyPageBytes and this one holds its
// share of them (store.PartitionState.OverDirtyShare). At least once it
// is asked after every record (reserve 0, cutsPerRecord); exactly once
// between transactions, with room for the next one (txnReserve), and so
// does a replay, whose changes are staged exactly once.
func (pw *partitionWorker) batchDue(reserve int64) bool {
	if pw.stateless() {
		return false
	}
	o := pw.w.opts
	return pw.dedup.DirtyBytes()+pw.dedup.StagedBytes() >= o.FlushBytes-reserve || pw.dedup.OverDirtyShare(o.MaxDirtyPageBytes)
}

// txnReserve is the room a write batch keeps for the changes of one
// transaction (and of one replayed poll): txnBudget sizes a transaction's
// polls to what is left of FlushBytes, and a batch cut at half of it
// leaves every transaction at least half.
func (w *Worker) txnReserve() int64 { return w.opts.FlushBytes / 2 }

// consolidateIdleIntervals is how many flush intervals a partition decides
// nothing before consolidateIdle writes its pending pages back whole.
const consolidateIdleIntervals = 10

// consolidateIdle writes the partition's pending pages (those whose
// changes are only in its log) back whole (one write batch of at most half
// of FlushBytes, at most one per flush interval) once the partition has
// decided nothing for consolidateIdleIntervals flush intervals and has
// nothing uncommitted: a write batch logs changes so that its bytes follow
// the records it carries, and an idle partition, whose write batches no
// longer carry the write-back, has the time to finish it, bringing its
// state at rest back to its page bytes and an empty log. It runs where
// flush runs and, like flush, never while a replay owns the deduplicator;
// one partition of the worker at a time. It reports
// whether it took a step. The store remembers that nothing is left, so the
// steps of a partition that stays idle cost nothing.
func (pw *partitionWorker) consolidateIdle() (stepped bool) {
	if pw.owner() != ownerLoop || pw.failed.Load() || pw.stateless() {
		return false
	}
	interval := pw.w.opts.FlushInterval
	now := time.Now()
	if now.Sub(pw.lastActive) < consolidateIdleIntervals*interval || now.Sub(pw.lastConsolidate) < interval {
		return false
	}
	// One partition of the worker consolidates at a time: a thousand
	// partitions falling idle together all read and rewrote their pages at
	// once, and a stop waited 30 s for their steps.
	if !pw.w.consolidating.CompareAndSwap(false, true) {
		return false // another partition's step runs; try again next interval
	}
	defer pw.w.consolidating.Store(false)
	pw.lastConsolidate = now
	if _, err := pw.dedup.ConsolidateStep(pw.w.opts.FlushBytes / 2); err != nil {
		pw.fail(err)
	}
	return true
}

func (pw *partitionWorker) fail(err error) {
	pw.failed.Store(true)
	pw.w.fail(err)
}

// send hands produce out, decided from input record in, unless out cannot
// fit its topic: then in is a dead letter. It reports false when the
// partition failed (no dead-letter topic), and must then stop deciding.
func (pw *partitionWorker) send(in, out *kgo.Record, produce func(in, out *kgo.Record)) bool {
	if handled, sent := pw.w.mode.refused(pw, in, out, produce); handled {
		return sent
	}
	size, limit := recordBatchBytes(out), pw.w.maxRecordBytes(out.Topic)
	if out.Topic == pw.w.opts.RepartitionTopic && size > pw.w.opts.MaxDecompressBytes {
		// The dedup stage would skip its batch unread (MaxDecompressBytes).
		return pw.deadLetter(in, out.Topic, ReasonTooLarge, fmt.Sprintf("%d bytes, more than the %d a batch of the repartition topic may decompress to (KDEDUP_MAX_DECOMPRESS_BYTES)", size, pw.w.opts.MaxDecompressBytes), nil, produce)
	}
	if size <= limit {
		produce(in, out)
		return true
	}
	fits, detail := pw.w.fitsCompressed(out, size, limit)
	switch {
	case !fits:
		return pw.deadLetter(in, out.Topic, ReasonTooLarge, detail, nil, produce)
	default:
		pw.w.mode.produceCompressed(pw, in, out, produce)
	}
	return true
}
