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

// partition owns one assigned topic-partition. At least once it runs its own
// goroutine (run); exactly once the transaction loop drives it.
type partition struct {
	w         *Worker
	topic     string
	partition int32
	d         *dedup.Partition

	in    chan []*kgo.Record
	quit  chan struct{} // finish queued records, commit, exit
	abort chan struct{} // drop uncommitted state, exit
	done  chan struct{}

	next       store.Checkpoint // offset after the last decided record
	stableNext store.Checkpoint // exactly once: next as of the last committed transaction
	flushed    store.Checkpoint // checkpoint of the last write batch
	lastFlush  time.Time

	// Records decided or replayed: in all, as of the last committed
	// transaction (exactly once) and as of the last write batch; their
	// differences size write batches (metrics only).
	decided, stableDecided, flushedDecided int64

	// For the lag and replay metrics, read at scrape time: the high
	// watermark of the latest fetch and the next offset to decide (-1:
	// unknown), and the offsets left to replay.
	highWatermark, nextOffset, replayLeft atomic.Int64

	// Replay: records before replay.until were forwarded by an earlier
	// owner; they update the filter without being forwarded again.
	// startReplay runs on the client's goroutine (adjustOffsets) while the
	// partition's own goroutine may already be stopping, hence the lock.
	replayMu sync.Mutex
	replay   replayState

	// At least once: forwarded records not yet acknowledged.
	inflight sync.WaitGroup
	prodErr  atomic.Pointer[error]
	failed   bool
	// At least once: records the broker refused, to retry alone at the
	// next write batch (retryRejected).
	rejectedMu sync.Mutex
	rejected   []rejected
}

func newPartition(w *Worker, topic string, p int32, d *dedup.Partition) *partition {
	pw := &partition{
		w: w, topic: topic, partition: p, d: d,
		in:        make(chan []*kgo.Record, 4),
		quit:      make(chan struct{}),
		abort:     make(chan struct{}),
		done:      make(chan struct{}),
		lastFlush: time.Now(),
	}
	pw.highWatermark.Store(-1)
	pw.nextOffset.Store(-1)
	if cp, ok := d.Checkpoint(); ok {
		pw.next, pw.stableNext, pw.flushed = cp, cp, cp
		pw.nextOffset.Store(cp.Offset)
	}
	return pw
}

// replayState is a partition's replay: [from, until) state-only; start is
// zero when no replay is running.
type replayState struct {
	from, until   int64
	start, logged time.Time
}

// startReplay makes records [from, until) state-only. Called from
// adjustOffsets before any record of the partition is fetched.
func (pw *partition) startReplay(from, until int64) {
	pw.replayMu.Lock()
	pw.replay = replayState{from: from, until: until, start: time.Now(), logged: time.Now()}
	pw.replayMu.Unlock()
	pw.replayLeft.Store(until - from)
	pw.w.m.restoring.Inc()
	pw.w.log.Info("replaying input into the filter, forwarding nothing", "topic", pw.topic, "partition", pw.partition, "from", from, "until", until)
}

// replaySnapshot returns the replay as it stands.
func (pw *partition) replaySnapshot() replayState {
	pw.replayMu.Lock()
	defer pw.replayMu.Unlock()
	return pw.replay
}

func (pw *partition) replaying() bool { return !pw.replaySnapshot().start.IsZero() }

func (pw *partition) endReplay(completed bool) {
	pw.replayMu.Lock()
	r := pw.replay
	pw.replay.start = time.Time{}
	pw.replayMu.Unlock()
	if r.start.IsZero() {
		return
	}
	pw.w.m.restoring.Dec()
	pw.replayLeft.Store(0)
	if completed {
		d := time.Since(r.start)
		pw.w.m.replaySeconds.Observe(d.Seconds())
		pw.w.log.Info("replay finished", "topic", pw.topic, "partition", pw.partition, "records", r.until-r.from, "duration", d.Round(time.Millisecond))
	}
}

// rewindIntoReplay restarts the replay after an aborted transaction
// rewound the input to next, when next lies in the replayed stretch.
func (pw *partition) rewindIntoReplay(next int64) {
	pw.replayMu.Lock()
	r := &pw.replay
	restart := r.until > 0 && r.start.IsZero() && next < r.until
	if restart {
		r.start = time.Now()
	}
	until := r.until
	pw.replayMu.Unlock()
	if restart {
		pw.replayLeft.Store(until - next)
		pw.w.m.restoring.Inc()
	}
}

func (pw *partition) stop(abort bool) {
	if pw.w.sess != nil { // driven by the transaction loop, which is not running now
		if !abort {
			pw.flush()
		}
		pw.close()
		return
	}
	if abort {
		close(pw.abort)
	} else {
		close(pw.quit)
	}
}

func (pw *partition) close() {
	pw.endReplay(false)
	pw.d.Close()
	close(pw.done)
}

func (pw *partition) run() {
	defer pw.close()
	tick := time.NewTicker(pw.w.opts.FlushInterval)
	defer tick.Stop()
	for {
		select {
		case recs := <-pw.in:
			pw.process(recs, pw.produce) // dropped once failed: the next owner reads them again from the checkpoint
		case <-tick.C:
			pw.flush()
		case <-pw.abort:
			return
		case <-pw.quit:
			pw.drain()
			pw.flush()
			return
		}
	}
}

// drain processes what is queued. Dispatch never runs during a revocation
// or after polling stopped, so the queue is all this partition will get.
func (pw *partition) drain() {
	for {
		select {
		case recs := <-pw.in:
			pw.process(recs, pw.produce)
		default:
			return
		}
	}
}

// process decides recs in order, handing produce the output record of each
// forwarded one and, with DuplicatesTopic, of each dropped one. At least
// once it also cuts a write batch when the dirty pages reach FlushBytes.
func (pw *partition) process(recs []*kgo.Record, produce func(in, out *kgo.Record)) {
	if pw.failed {
		return
	}
	forwards, dups := pw.w.opts.Forwards, pw.w.opts.DuplicatesTopic
	replay := pw.replaySnapshot() // startReplay precedes the first fetch
	replaying := !replay.start.IsZero()
	for _, r := range recs {
		if e, ok := skipped(r); ok { // a batch over MaxDecompressBytes
			if r.Offset >= replay.until {
				pw.skip(e, produce)
			}
			pw.next = store.Checkpoint{Offset: e.NextOffset, LeaderEpoch: e.Epoch}
			pw.decided++
			continue
		}
		if r.Offset < replay.until {
			if err := pw.d.Replay(r); err != nil {
				pw.fail(err)
				return
			}
			if pw.replayProgress(r.Offset, replay) {
				replaying = false
			}
		} else {
			if replaying {
				pw.endReplay(true)
				replaying = false
			}
			d, err := pw.d.Decide(r)
			if err != nil {
				pw.fail(err)
				return
			}
			if d == dedup.Unkeyed {
				pw.w.log.Debug("record cannot be keyed; forwarded unchanged", "topic", pw.topic, "partition", pw.partition, "offset", r.Offset, "reason", pw.d.LastKeyError())
			}
			sent := true
			if forwards(d) {
				sent = pw.send(r, pw.output(r), produce)
			} else if reason := dropReason(d); reason != "" && dups != "" {
				sent = pw.send(r, pw.dropped(r, reason), produce)
			}
			if !sent {
				return // failed: nothing from r on is committed
			}
		}
		pw.next = store.Checkpoint{Offset: r.Offset + 1, LeaderEpoch: r.LeaderEpoch}
		pw.decided++
		if pw.w.sess == nil && pw.d.DirtyBytes() >= pw.w.opts.FlushBytes {
			pw.flush()
			if pw.failed {
				return
			}
		}
	}
	pw.nextOffset.Store(pw.next.Offset)
}

// replayProgress accounts for the replayed record at offset and reports
// whether it ended the replay r.
func (pw *partition) replayProgress(offset int64, r replayState) bool {
	pw.replayLeft.Store(max(0, r.until-offset-1))
	if offset+1 >= r.until {
		pw.endReplay(true)
		return true
	}
	pw.replayMu.Lock()
	logNow := time.Since(pw.replay.logged) >= 5*time.Second
	if logNow {
		pw.replay.logged = time.Now()
	}
	pw.replayMu.Unlock()
	if logNow {
		pw.w.log.Info("replaying", "topic", pw.topic, "partition", pw.partition, "offset", offset, "until", r.until,
			"done", fmt.Sprintf("%.1f%%", 100*float64(offset-r.from)/float64(r.until-r.from)))
	}
	return false
}

// output is the record forwarded for r: key, value, headers and timestamp
// kept; the default partitioner places it by key.
func (pw *partition) output(r *kgo.Record) *kgo.Record {
	return &kgo.Record{Topic: pw.w.opts.OutputTopic, Key: r.Key, Value: r.Value, Headers: r.Headers, Timestamp: r.Timestamp}
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
func (pw *partition) dropped(r *kgo.Record, reason string) *kgo.Record {
	h := make([]kgo.RecordHeader, len(r.Headers), len(r.Headers)+2)
	copy(h, r.Headers)
	h = append(h,
		kgo.RecordHeader{Key: HeaderReason, Value: []byte(reason)},
		kgo.RecordHeader{Key: HeaderSource, Value: fmt.Appendf(nil, "%s/%d/%d", pw.topic, pw.partition, r.Offset)})
	return &kgo.Record{Topic: pw.w.opts.DuplicatesTopic, Key: r.Key, Value: r.Value, Headers: h, Timestamp: r.Timestamp}
}

// produce produces out, decided from input record in, at least once.
func (pw *partition) produce(in, out *kgo.Record) {
	pw.inflight.Add(1)
	// Not the worker's context: records already decided must be delivered
	// (or fail) before the write batch that covers them, even at shutdown.
	pw.w.cl.Produce(context.Background(), out, func(_ *kgo.Record, err error) {
		pw.w.countDeadLetter(out, err)
		if err != nil {
			pw.w.m.produceErrors.Inc()
			pw.produceFailed(in, out, err)
		}
		pw.inflight.Done()
	})
}

// flush cuts a write batch: (at least once) wait for every produced
// record's ack, commit pages, metadata and checkpoint in one Badger
// transaction, then (at least once) mark the offset for the group commit.
// Exactly once it runs between transactions, when every decided record
// belongs to a committed one.
func (pw *partition) flush() {
	pw.lastFlush = time.Now()
	cp, decided := pw.next, pw.decided
	if pw.w.sess != nil {
		cp, decided = pw.stableNext, pw.stableDecided // never a checkpoint past the last committed transaction
	}
	if pw.failed || cp == pw.flushed {
		return
	}
	pw.inflight.Wait()
	if err := pw.prodErr.Load(); err != nil {
		pw.fail(*err)
		return
	}
	if err := pw.retryRejected(); err != nil {
		pw.fail(err)
		return
	}
	dirty := pw.d.DirtyBytes()
	if err := pw.d.Commit(cp); err != nil {
		pw.fail(err)
		return
	}
	pw.flushed = cp
	pw.w.m.batches.Inc()
	pw.w.m.batchRecords.Observe(float64(decided - pw.flushedDecided))
	pw.w.m.batchBytes.Observe(float64(dirty))
	pw.flushedDecided = decided
	if pw.w.sess == nil {
		pw.w.cl.MarkCommitOffsets(map[string]map[int32]kgo.EpochOffset{
			pw.topic: {pw.partition: {Epoch: cp.LeaderEpoch, Offset: cp.Offset}},
		})
	}
}

func (pw *partition) fail(err error) {
	pw.failed = true
	pw.w.fail(err)
}
