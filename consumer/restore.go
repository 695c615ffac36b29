package consumer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/plugin/kslog"

	"github.com/kdedup/kdedup/store"
)

// A replay (a rebuild of a partition without local state, or the catch-up
// of a local state behind the group's offset) reads the input that an
// earlier owner already decided, to put its keys into the filter without
// forwarding anything. It is done the way Kafka Streams restores a state
// store from its changelog: by a client of its own (the restore client: a
// direct consumer of the one partition, outside the group), while the
// group client holds the partition paused at the group's committed offset.
//
// Replaying through the group client instead makes the replay's start the
// group client's committed baseline, and every offset it then commits (at
// least once, the marked checkpoints; exactly once, each transaction's
// consumed offsets) moves the group's offset backwards: a stop, a crash or
// a rebalance in the middle of a replay then hands the next owner a group
// offset far behind what was forwarded, and it forwards the gap again.
// Here the replay's progress is the Badger checkpoint only; the group's
// offset stays where it was until the partition decides records again.
//
// Input that retention (or DeleteRecords) removes before the replay reads
// it makes the rebuild partial, whether the plan saw it gone (rebalance.go
// plan) or the restore client meets it (skipLost): the lost offsets are
// logged at WARN and the replay counts once in kdedup_partial_rebuilds_total.

// restoreIdle is how long a restore poll waits for records before the
// restore asks whether it has reached the end of the partition's log.
const restoreIdle = time.Second

// DefaultMaxRestores is Options.MaxRestores's default.
const DefaultMaxRestores = 4

// restoreFetchBytes bounds what a restore client fetches at once
// (FetchMaxBytes and FetchMaxPartitionBytes, franz-go's default for one
// partition): one partition, read in order, needs no more to keep a replay
// busy, and a replay reads little ahead of where retention may delete.
// The client holds up to two fetches: one buffered, one in flight.
const restoreFetchBytes = 1 << 20

// restoreRecordsBytes is what one poll of pollRecords records holds
// besides the batches they were decoded from (kgo.Record structs and
// their slices).
const restoreRecordsBytes = 4 << 20

// ReplayMemoryBytes is the most memory one partition's replay holds: its
// restore client's fetch buffers (two of restoreFetchBytes), one batch
// decompressed to at most maxDecompressBytes (Options.MaxDecompressBytes),
// and a poll of decoded records. The worker's memory budget counts
// Options.MaxRestores of it (or of a snapshot import, if larger).
func ReplayMemoryBytes(maxDecompressBytes int64) int64 {
	return 2*restoreFetchBytes + maxDecompressBytes + restoreRecordsBytes
}

// startReplay makes the partition replay [from, until) with a restore
// client, then resume in the group client cl, where adjustOffsets has paused
// it. partial tells that the plan already found input before from deleted
// and counted the replay as a partial rebuild: input found deleted while
// the replay runs is then logged but not counted again. It runs on the
// group client's goroutine (adjustOffsets), before any record of the
// partition is fetched. resume, when set, is where the partition starts
// once the replay has ended (startAt: the plan found the records from
// until to it deleted before anyone decided them, and counted them); the
// restore goroutine moves it there, since it owns the partition until then.
func (pw *partitionWorker) startReplay(cl *kgo.Client, from, until int64, partial bool, resume *store.Checkpoint) {
	pw.restoreCtl.mu.Lock()
	pw.restoreCtl.mu.replay = replayState{from: from, until: until, start: time.Now(), logged: time.Now()}
	pw.restoreCtl.mu.Unlock()
	pw.gauges.replayLeft.Store(max(0, until-from))
	pw.owned.Or(ownedReplaying)
	pw.w.restoring.Add(1)
	pw.w.m.restoring.Inc()
	pw.w.log.Info("replaying input into the filter, forwarding nothing", "topic", pw.topic, "partition", pw.partition, "from", from, "until", until)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	pw.restoreCtl.mu.Lock()
	pw.restoreCtl.cancel, pw.restoreCtl.done = cancel, done
	pw.restoreCtl.mu.Unlock()
	go pw.restore(ctx, cancel, done, cl, from, until, partial, resume)
}

// takeRestoreSlot waits for one of Options.MaxRestores slots of restores
// (a snapshot's download and import) and replays running at once: each
// holds fetch buffers, a decompressed batch or an import, counted in the
// memory budget that many times. Listing snapshots and waiting for a
// failing store take none. ok is false when ctx ended first.
func (pw *partitionWorker) takeRestoreSlot(ctx context.Context) (release func(), ok bool) {
	select {
	case pw.w.restoreSlots <- struct{}{}:
		return func() { <-pw.w.restoreSlots }, true
	case <-ctx.Done():
		return nil, false
	}
}

// cancelReplay tells a running replay to stop, as stopReplay does, without
// waiting for it.
func (pw *partitionWorker) cancelReplay(abort bool) {
	pw.restoreCtl.mu.Lock()
	cancel, done := pw.restoreCtl.cancel, pw.restoreCtl.done
	pw.restoreCtl.mu.Unlock()
	if done == nil {
		return
	}
	pw.restoreCtl.abort.Store(abort)
	cancel()
}

// stopReplay stops a running replay and waits for it. abort (the partition
// was lost) commits nothing more; otherwise the replay commits its progress
// as a write batch, so that the next owner of this directory goes on from
// there.
func (pw *partitionWorker) stopReplay(abort bool) {
	pw.restoreCtl.mu.Lock()
	cancel, done := pw.restoreCtl.cancel, pw.restoreCtl.done
	pw.restoreCtl.mu.Unlock()
	if done == nil {
		return
	}
	pw.restoreCtl.abort.Store(abort)
	cancel()
	<-done
}

// restore runs a replay to its end, then resumes the partition in the group
// client. A stopped replay leaves the partition paused: the client resumes
// it when the partition is assigned again.
func (pw *partitionWorker) restore(ctx context.Context, cancel context.CancelFunc, done chan struct{}, group *kgo.Client, from, until int64, partial bool, resume *store.Checkpoint) {
	defer close(done)
	defer cancel()
	if plan := pw.snap.plan; plan != nil {
		pw.snap.plan = nil
		var stopped bool
		var err error
		if from, partial, stopped, err = pw.restoreSnapshot(ctx, group, plan, until, partial); err != nil || stopped {
			pw.endReplay(false, 0)
			if stopped {
				pw.w.log.Info("restore from a snapshot stopped", "topic", pw.topic, "partition", pw.partition)
			} else {
				pw.fail(err)
			}
			return
		}
		pw.restoreCtl.mu.Lock()
		pw.restoreCtl.mu.replay.from = from
		pw.restoreCtl.mu.Unlock()
		pw.gauges.replayLeft.Store(max(0, until-from))
	}
	var (
		replayed int64
		stopped  bool
		err      error
	)
	if from < until {
		if pw.dedup.Presize(until - from) {
			// A partition without keys (no local state, no snapshot
			// restored): its filter is sized for the replay, which
			// bounds its keys, instead of growing to it.
			pw.w.log.Info("filter sized for the replay", "topic", pw.topic, "partition", pw.partition, "records", until-from, "slots", pw.dedup.Stats().Slots)
		}
		if release, ok := pw.takeRestoreSlot(ctx); ok {
			replayed, stopped, err = pw.replayRange(ctx, from, until, partial, resume != nil)
			release()
		} else {
			stopped = true
		}
	}
	if !stopped && err == nil && resume != nil {
		pw.startAt(*resume)
	}
	pw.endReplay(!stopped && err == nil, replayed)
	switch {
	case err != nil:
		pw.fail(err)
	case stopped:
		pw.w.log.Info("replay stopped; its progress is the local checkpoint", "topic", pw.topic, "partition", pw.partition, "offset", pw.flushed.Offset, "until", until, "records", replayed)
	default:
		group.ResumeFetchPartitions(map[string][]int32{pw.topic: {pw.partition}})
	}
}

// replayRange replays the records [from, until) of the partition into its
// filter, committing a write batch every FlushInterval and when one is due
// (batchDue, leaving txnReserve), and a last one with checkpoint until. Control
// records (transaction markers) are read too, so that a stretch ending in
// a marker is seen to end; a stretch whose end is past the log's end (a
// truncated log) ends at the log's end. Input deleted before the replay
// read it (retention, DeleteRecords) is skipped as lost (skipLost); partial
// tells that the replay was already counted as a partial rebuild. replayed
// is the records replayed into the filter (control records and skipped
// batches not counted, as kdedup_replayed_records_total); stopped reports a
// replay ended by ctx (stopReplay) before its end.
func (pw *partitionWorker) replayRange(ctx context.Context, from, until int64, partial, pastUntilCounted bool) (replayed int64, stopped bool, err error) {
	w := pw.w
	cl, err := kgo.NewClient(append([]kgo.Opt{
		kgo.SeedBrokers(w.opts.Brokers...),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{pw.topic: {pw.partition: kgo.NewOffset().At(from)}}),
		// An out-of-range offset is reported in the fetches, not reset
		// from: a reset would jump over input deleted under the replay
		// without a word (skipLost). Offset gaps alone prove nothing:
		// compaction and aborted transactions leave them too.
		kgo.ConsumeResetOffset(kgo.NoResetOffset()),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.KeepControlRecords(),
		kgo.FetchMaxWait(restoreIdle / 2),
		kgo.FetchMaxBytes(restoreFetchBytes),
		kgo.FetchMaxPartitionBytes(restoreFetchBytes),
		kgo.MaxDecompressBatchBytes(w.opts.MaxDecompressBytes),
		kgo.WithLogger(kslog.New(w.log.With("client", "restore", "topic", pw.topic, "partition", pw.partition))),
	}, w.opts.ConnOpts...)...)
	if err != nil {
		return 0, false, fmt.Errorf("creating the restore client of %s/%d: %w", pw.topic, pw.partition, err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)

	cp := store.Checkpoint{Offset: from, LeaderEpoch: -1}
	batchStart := time.Now()
	for {
		pctx, cancel := context.WithTimeout(ctx, restoreIdle)
		fetches := cl.PollRecords(pctx, pollRecords)
		cancel()
		if ctx.Err() != nil {
			if pw.restoreCtl.abort.Load() {
				return replayed, true, nil
			}
			return replayed, true, pw.commitReplay(cp)
		}
		var (
			got        int
			done       bool
			outOfRange bool
			rerr       error
		)
		fetches.EachError(func(_ string, _ int32, err error) {
			var bomb *kgo.ErrDecompressTooLarge
			switch {
			case errors.As(err, &bomb):
				// A batch over MaxDecompressBytes: decided as a skipped
				// batch (a dead letter, see skipRecords), it changed
				// nothing in the filter. One that straddles the replay's
				// end is the group client's to meet again.
				cl.SetOffsets(map[string]map[int32]kgo.EpochOffset{pw.topic: {pw.partition: {Epoch: bomb.Epoch, Offset: bomb.NextOffset}}})
				cp = store.Checkpoint{Offset: min(bomb.NextOffset, until), LeaderEpoch: bomb.Epoch}
				done = cp.Offset >= until
				got++
			case errors.Is(err, kerr.OffsetOutOfRange):
				outOfRange = true // handled after the records polled with it
			case !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled):
				w.log.Warn("restore fetch error", "topic", pw.topic, "partition", pw.partition, "err", err)
			}
		})
		rerr = pw.dedup.Prefetch(fetches.Records())
		fetches.EachRecord(func(r *kgo.Record) {
			if done || rerr != nil || r.Offset < cp.Offset {
				return
			}
			got++
			if r.Offset >= until {
				done = true
				return
			}
			if !r.Attrs.IsControl() {
				if rerr = pw.dedup.Replay(r); rerr != nil {
					return
				}
				pw.decided++
				replayed++
			}
			cp = store.Checkpoint{Offset: r.Offset + 1, LeaderEpoch: r.LeaderEpoch}
			done = cp.Offset >= until
			if !done && pw.batchDue(w.txnReserve()) {
				rerr = pw.commitReplay(cp) // a poll can dirty more pages than a write batch holds
			}
		})
		if rerr != nil {
			return replayed, false, rerr
		}
		if outOfRange && !done {
			var skipped bool
			if cp, done, skipped = pw.skipLost(ctx, cl, adm, cp, until, partial, pastUntilCounted); skipped {
				partial = true
				got++
			}
		}
		if got > 0 {
			pw.replayProgress(cp.Offset, until)
		} else if !done {
			// Nothing for a while: either the log ends before until (it
			// was truncated) or the brokers are slow; only the first ends
			// the replay.
			ends, err := adm.ListEndOffsets(ctx, pw.topic)
			if err == nil {
				if e, ok := ends.Lookup(pw.topic, pw.partition); ok && e.Err == nil && e.Offset <= cp.Offset {
					w.log.Warn("the input ends before the group's offset; replay ends at the end of the log", "topic", pw.topic, "partition", pw.partition, "log_end", e.Offset, "group_offset", until)
					done = true
				}
			}
		}
		if done {
			return replayed, false, pw.commitReplay(store.Checkpoint{Offset: until, LeaderEpoch: cp.LeaderEpoch})
		}
		if time.Since(batchStart) >= w.opts.FlushInterval {
			if err := pw.commitReplay(cp); err != nil {
				return replayed, false, err
			}
			batchStart = time.Now()
		}
	}
}

// commitReplay commits what the replay changed as a write batch with
// checkpoint cp: local progress only, never offered to the group.
func (pw *partitionWorker) commitReplay(cp store.Checkpoint) error {
	if cp == pw.flushed {
		return nil
	}
	if err := pw.dedup.CommitStaged(); err != nil { // exactly once, replayed changes are staged like decided ones
		return err
	}
	if err := pw.commitBatch(cp, pw.decided); err != nil {
		return err
	}
	pw.setCheckpoint(cp)
	return nil
}

// skipLost handles the restore client's fetch at cp answered
// OFFSET_OUT_OF_RANGE (reported, not reset from: NoResetOffset). The
// partition's log now starts past cp when the input was deleted before the
// replay read it (retention or DeleteRecords, between the plan and the
// first fetch or while the replay ran): the offsets [cp, log start) are
// lost, which makes the replay partial. It logs them at WARN, counts a
// partial rebuild unless partial (the replay was counted already: once per
// replay), and moves the restore client to the log start; skipped reports
// that. Offsets past until that were deleted too are counted in
// kdedup_retention_skipped_offsets_total unless pastUntilCounted (the plan
// counted them). A log that now ends at or before cp (truncated) ends the replay:
// done. Otherwise (a broker behind, or a listing that failed) it waits a
// little and the restore client fetches again at cp.
func (pw *partitionWorker) skipLost(ctx context.Context, cl *kgo.Client, adm *kadm.Client, cp store.Checkpoint, until int64, partial, pastUntilCounted bool) (next store.Checkpoint, done, skipped bool) {
	w := pw.w
	start, err := pw.listedOffset(ctx, adm.ListStartOffsets)
	if err == nil && start > cp.Offset {
		lostTo := min(start, until)
		if !partial {
			w.m.partialRebuilds.Inc()
		}
		w.log.Warn("replay is partial: input was deleted before the replay read it (retention or DeleteRecords), so keys first seen there are not in the filter and deletes there are not applied",
			"topic", pw.topic, "partition", pw.partition, "lost_from", cp.Offset, "lost_to", lostTo)
		if start > until && !pastUntilCounted {
			// Past the replay's end too: records no owner decided, which
			// the group client skips when it resumes (its reset offset is
			// the log start), as the plan's skipToLogStart counts them.
			w.m.retentionSkipped.Add(float64(start - until))
			w.log.Warn("records deleted by retention before they were decided: resuming at the earliest retained offset; these records were neither forwarded nor remembered",
				"topic", pw.topic, "partition", pw.partition, "lost_from", until, "lost_to", start, "lost_offsets", start-until)
		}
		next = store.Checkpoint{Offset: lostTo, LeaderEpoch: cp.LeaderEpoch}
		if lostTo < until {
			cl.SetOffsets(map[string]map[int32]kgo.EpochOffset{pw.topic: {pw.partition: {Epoch: -1, Offset: lostTo}}})
		}
		return next, lostTo >= until, true
	}
	var end int64
	if err == nil {
		end, err = pw.listedOffset(ctx, adm.ListEndOffsets)
	}
	wait := restoreIdle / 10 // not a busy loop of fetches answered out of range
	switch {
	case err == nil && end <= cp.Offset:
		w.log.Warn("the input ends before the group's offset; replay ends at the end of the log", "topic", pw.topic, "partition", pw.partition, "log_end", end, "group_offset", until)
		return cp, true, false
	case err != nil && ctx.Err() == nil:
		w.log.Warn("restore fetch out of range, and the partition's offsets could not be listed; retrying", "topic", pw.topic, "partition", pw.partition, "offset", cp.Offset, "err", err)
		wait = restoreIdle
	}
	select {
	case <-ctx.Done():
	case <-time.After(wait):
	}
	// The client's position can be past cp, over the records an aborted
	// transaction left (read_committed skips them): go on from cp.
	cl.SetOffsets(map[string]map[int32]kgo.EpochOffset{pw.topic: {pw.partition: {Epoch: -1, Offset: cp.Offset}}})
	return cp, false, false
}

// listedOffset returns the partition's offset as list (a kadm.Client's
// ListStartOffsets or ListEndOffsets) reports it.
func (pw *partitionWorker) listedOffset(ctx context.Context, list func(context.Context, ...string) (kadm.ListedOffsets, error)) (int64, error) {
	l, err := list(ctx, pw.topic)
	if err != nil {
		return 0, fmt.Errorf("listing offsets of %s: %w", pw.topic, err)
	}
	o, ok := l.Lookup(pw.topic, pw.partition)
	switch {
	case !ok:
		return 0, fmt.Errorf("no offset listed for %s/%d", pw.topic, pw.partition)
	case o.Err != nil:
		return 0, fmt.Errorf("listing offsets of %s/%d: %w", pw.topic, pw.partition, o.Err)
	}
	return o.Offset, nil
}

// endReplay ends the replay's accounting; completed replays are timed and
// logged with the records they replayed.
func (pw *partitionWorker) endReplay(completed bool, replayed int64) {
	pw.restoreCtl.mu.Lock()
	r := pw.restoreCtl.mu.replay
	pw.restoreCtl.mu.replay.start = time.Time{}
	pw.restoreCtl.mu.Unlock()
	if r.start.IsZero() {
		return
	}
	pw.owned.And(^uint32(ownedReplaying))
	pw.w.restoring.Add(-1)
	pw.w.m.restoring.Dec()
	pw.gauges.replayLeft.Store(0)
	if completed {
		d := time.Since(r.start)
		pw.w.m.replaySeconds.Observe(d.Seconds())
		pw.w.log.Info("replay finished", "topic", pw.topic, "partition", pw.partition, "records", replayed, "duration", d.Round(time.Millisecond))
	}
}

// replayProgress accounts for a replay that has reached next, logging its
// progress every 5 seconds.
func (pw *partitionWorker) replayProgress(next, until int64) {
	pw.gauges.replayLeft.Store(max(0, until-next))
	pw.restoreCtl.mu.Lock()
	r := pw.restoreCtl.mu.replay
	logNow := time.Since(r.logged) >= 5*time.Second
	if logNow {
		pw.restoreCtl.mu.replay.logged = time.Now()
	}
	pw.restoreCtl.mu.Unlock()
	if logNow {
		pw.w.log.Info("replaying", "topic", pw.topic, "partition", pw.partition, "offset", next, "until", until,
			"done", fmt.Sprintf("%.1f%%", 100*float64(next-r.from)/float64(max(1, r.until-r.from))))
	}
}
