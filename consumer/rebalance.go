package consumer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kdedup/kdedup/dedup"
	"github.com/kdedup/kdedup/store"
)

func (w *Worker) assigned(_ context.Context, cl *kgo.Client, assigned map[string][]int32) {
	w.mu.Lock()
	closing := w.mu.closing || w.mu.plansStopped
	w.mu.Unlock()
	if closing {
		return
	}
	// A partition paused for a replay that a revocation interrupted stays
	// paused in the client; adjustOffsets pauses again what must replay.
	cl.ResumeFetchPartitions(assigned)
	for topic, partitions := range assigned {
		for _, p := range partitions {
			var (
				d   *dedup.Deduplicator
				err error
			)
			switch {
			case w.opts.routes(topic): // the repartition stage keeps no state
			case topic == w.opts.RepartitionTopic: // keyed by the repartition stage
				d, err = w.opts.Dedup.OpenRouted(topic, p)
			default:
				d, err = w.opts.Dedup.Open(topic, p)
			}
			if err != nil {
				w.fail(err)
				continue
			}
			pw := newPartition(w, cl, topic, p, d)
			pw.plan.awaiting.Store(true)
			w.unplanned.Add(1)
			w.mu.Lock()
			w.mu.parts[store.TopicPartition{Topic: topic, Partition: p}] = pw
			w.mu.Unlock()
			w.mode.opened(pw)
			w.m.assigned.Inc()
			w.log.Info("partition assigned", "topic", topic, "partition", p, "stage", pw.stage())
		}
	}
	w.awaitCompleteAssignment(cl)
}

// adjustOffsets chooses where each newly assigned partition starts, from
// its Badger checkpoint and the group's committed offset, once the state is
// known to be this topic's (origin.go: a state of another topic ID or
// cluster is moved aside first, and the partition has no local state):
//
//   - equal: resume;
//   - checkpoint ahead (a crash between the Badger and the group commit, at
//     least once): resume from the checkpoint, the records in between were
//     forwarded and acknowledged;
//   - checkpoint behind (the partition was processed elsewhere meanwhile, an
//     exactly-once crash after the Kafka commit, or a replay interrupted by
//     a stop, a crash or a rebalance): replay the gap into the filter
//     without forwarding, then resume at the group's offset;
//   - no local state and a committed offset: rebuild by replaying from the
//     earliest retained offset (with a window, from the window's start, see
//     windowStart), or with RebuildEmpty start empty at the group's offset.
//
// A replay never goes through the group client: the partition stays
// paused there at the group's offset while a restore client of its own
// reads the gap (restore.go). Its progress is the Badger checkpoint only,
// so the group's committed offset never moves backwards, and a replay cut
// short resumes from its checkpoint on whichever worker owns the
// partition next.
//
// A replay that starts before the earliest retained offset is partial: it
// starts there, logs the offsets lost and counts a partial rebuild.
func (w *Worker) adjustOffsets(ctx context.Context, offsets map[string]map[int32]kgo.Offset) (map[string]map[int32]kgo.Offset, error) {
	ctx, end, ok := w.beginPlan(ctx)
	if !ok {
		return nil, errPlansStopped
	}
	defer end()
	var (
		starts kadm.ListedOffsets
		seen   groupOffsets
		info   planInfo
		cl     = w.client()
		adm    = kadm.NewClient(cl)
	)
	if err := w.checkGroupParams(ctx, cl, adm); err != nil {
		w.fail(err)
		return nil, err
	}
	for topic, ps := range offsets {
		for p, o := range ps {
			pw := w.partition(topic, p)
			if pw == nil {
				continue
			}
			if pw.plan.hasStart {
				// franz-go asks again when a rebalance interrupted its
				// offset fetch after this partition was planned: its
				// replay (if any) runs already, and planning twice would
				// start a second one.
				ps[p] = pw.plan.start
				continue
			}
			start, err := w.plan(ctx, cl, adm, &starts, &seen, &info, pw, o)
			if err != nil {
				// Planned again in the next session (or released): until
				// then nobody but the plan owns it, so that a plan's
				// changes to its state (moving a foreign state aside)
				// never meet the loop's.
				return nil, err
			}
			pw.owned.Or(ownedPlanned)
			pw.settlePlan() // after a replay began: readiness never sees a gap
			pw.plan.start, pw.plan.hasStart = start, true
			ps[p] = start
		}
	}
	return offsets, nil
}

// errPlansStopped is adjustOffsets' error once release has begun: the
// partitions are being stopped, and none may start a replay.
var errPlansStopped = errors.New("consumer: stopping: not planning where partitions start")

// plan returns where pw starts in the group client, given the group's
// committed offset o, and starts its replay when it needs one (see
// adjustOffsets). starts caches the input's start offsets, seen the topics
// the group has committed offsets for, info the topics' origins and end
// offsets.
//
// Records below the log start were deleted by retention. A replay that
// should have read them is partial (counted, logged); records the group
// client should have decided are gone too: the partition resumes at the
// log start, never at its end, logs the offsets lost and counts them
// (kdedup_retention_skipped_offsets_total).
func (w *Worker) plan(ctx context.Context, cl *kgo.Client, adm offsetAdmin, starts *kadm.ListedOffsets, seen *groupOffsets, info *planInfo, pw *partitionWorker, o kgo.Offset) (kgo.Offset, error) {
	start, r, err := w.planStart(ctx, adm, starts, seen, info, pw, o)
	if err != nil || r == nil {
		return start, err
	}
	// The group client starts at start but fetches nothing until the
	// replay (after the snapshot's restore, if any) has caught up.
	cl.PauseFetchPartitions(map[string][]int32{pw.topic: {pw.partition}})
	pw.startReplay(cl, r.from, r.until, r.partial, r.resume)
	return start, nil
}

// offsetAdmin is what the plan asks the cluster (a *kadm.Client): the
// input topics' IDs, their start, end and timestamp offsets, the group's
// committed offsets and the end offsets of leader epochs.
type offsetAdmin interface {
	Metadata(ctx context.Context, topics ...string) (kadm.Metadata, error)
	ListStartOffsets(ctx context.Context, topics ...string) (kadm.ListedOffsets, error)
	ListEndOffsets(ctx context.Context, topics ...string) (kadm.ListedOffsets, error)
	ListOffsetsAfterMilli(ctx context.Context, millis int64, topics ...string) (kadm.ListedOffsets, error)
	FetchOffsets(ctx context.Context, group string) (kadm.OffsetResponses, error)
	OffsetForLeaderEpoch(ctx context.Context, r kadm.OffsetForLeaderEpochRequest) (kadm.OffsetsForLeaderEpochs, error)
}

// replayPlan is a replay planStart decided: [from, until), partial (see
// startReplay), then the start moved to resume if set.
type replayPlan struct {
	from, until int64
	partial     bool
	resume      *store.Checkpoint
}

// planStart is plan without its effects on the group client: it returns
// where pw starts and the replay to start (nil: none), having set pw's
// snapshot plan (snapPlan) when the replay restores a snapshot first.
func (w *Worker) planStart(ctx context.Context, adm offsetAdmin, starts *kadm.ListedOffsets, seen *groupOffsets, info *planInfo, pw *partitionWorker, o kgo.Offset) (kgo.Offset, *replayPlan, error) {
	topic, p := pw.topic, pw.partition
	group := o.EpochOffset().Offset // negative: no committed offset
	if pw.stateless() {
		// The repartition stage: no state to resume or rebuild, only
		// the group's offset (or, for a partition it never committed,
		// where the group starts).
		if group < 0 {
			start, err := w.startEmpty(ctx, adm, seen, pw, o)
			return start, nil, err
		}
		// Where it stands, exactly once also where an aborted first
		// transaction rewinds it (endTxnSkips): never before the
		// group's offset.
		pw.setCheckpoint(store.Checkpoint{Offset: group, LeaderEpoch: o.EpochOffset().Epoch})
		logStart, err := w.logStart(ctx, adm, starts, topic, p)
		if err != nil {
			w.log.Warn("cannot tell whether retention deleted records this partition has to repartition", "topic", topic, "partition", p, "err", err)
			return o, nil, nil
		}
		return w.clampGroup(pw, o, logStart), nil, nil
	}
	cur, err := w.origin(ctx, adm, info, topic)
	if err != nil {
		return o, nil, err
	}
	if at, resume, err := w.checkOrigin(ctx, adm, info, pw, cur); err != nil {
		if ctx.Err() == nil {
			pw.fail(fmt.Errorf("checking that the state of %s/%d is this topic's: %w", topic, p, err))
		}
		return o, nil, err
	} else if resume {
		w.countRestore("local")
		return at, nil, nil
	}
	cp, ok := pw.dedup.Checkpoint()
	if !ok && group < 0 { // nothing committed, no state: start empty
		start, err := w.startEmpty(ctx, adm, seen, pw, o)
		return start, nil, err
	}
	// A replay needs the log start; resuming only checks it, and where it
	// cannot be listed the group client's reset offset, the log start,
	// still resumes there (uncounted).
	logStart, lsErr := w.logStart(ctx, adm, starts, topic, p)
	if lsErr != nil {
		w.log.Warn("cannot tell whether retention deleted records this partition has to decide", "topic", topic, "partition", p, "err", lsErr)
	}
	from := int64(-1)
	switch {
	case ok && (group < 0 || cp.Offset >= group):
		w.countRestore("local")
		if cp.Offset != group {
			w.log.Info("resuming from the local checkpoint", "topic", topic, "partition", p, "offset", cp.Offset, "group_offset", group)
		}
		if cp.Offset < logStart {
			return w.skipToLogStart(pw, cp.Offset, logStart), nil, nil
		}
		if group >= 0 && cp.Offset > group && w.mode.offsetsApart() {
			// Fetch from the group's offset, which franz-go takes as
			// committed, and skip what the checkpoint covers (process):
			// the first write batch then commits the checkpoint to the
			// group, even if no record follows. Starting at the
			// checkpoint instead made franz-go take it as committed, and
			// the group's offset stayed behind until the next record.
			// (A group offset below the log start resets to it, which
			// is at or below the checkpoint.)
			pw.groupBehind(group)
			return o, nil, nil
		}
		return kgo.NewOffset().At(cp.Offset).WithEpoch(cp.LeaderEpoch), nil, nil
	case w.snapshotMayHelp(ok, cp.Offset, group):
		// The restore goroutine lists the snapshots and falls back to what
		// the plan would do without them (restoreSnapshot): the store is
		// not asked here, inside the group's callback, where a slow
		// listing held every partition and a rebalance cancelled it.
		pw.snap.plan = &snapshotPlan{hasLocal: ok, rebuildEmpty: !ok && w.opts.RebuildEmpty, origin: cur}
		from = 0
		if ok {
			from = cp.Offset
		}
	case ok:
		from = cp.Offset
	case w.opts.RebuildEmpty:
		w.countRestore("replay")
		w.log.Info("no local state: starting with an empty filter (KDEDUP_REBUILD=empty)", "topic", topic, "partition", p, "group_offset", group)
		return w.clampGroup(pw, o, logStart), nil, nil
	default:
		var err error
		if from, err = w.windowStart(ctx, adm, topic, p, group); err != nil {
			return o, nil, err
		}
	}
	if pw.snap.plan == nil && from < group {
		w.countRestore("replay")
	}
	if lsErr != nil {
		pw.snap.plan = nil
		return o, nil, lsErr // the replay's start is unknown
	}
	partial := false
	if pw.snap.plan == nil && logStart > from {
		partial = true
		w.m.partialRebuilds.Inc()
		w.log.Warn("replay is partial: the input before the earliest retained offset is gone, so keys first seen there are not in the filter and deletes there are not applied",
			"topic", topic, "partition", p, "lost_from", from, "lost_to", min(logStart, group))
		from = logStart
	}
	if from < group || pw.snap.plan != nil {
		// The group client starts at the group's offset (o, unchanged)
		// and is paused there (plan).
		r := &replayPlan{from: from, until: group, partial: partial}
		if group >= 0 && group < logStart {
			// Only with a snapshot: records past the group's offset were
			// deleted before anyone decided them. The restore goroutine
			// owns the partition until its replay ends, so it is the one
			// that moves the start to the log start (startAt), after its
			// last write batch; counted here, once.
			r.resume = &store.Checkpoint{Offset: logStart, LeaderEpoch: -1}
			w.countRetentionSkipped(pw, group, logStart)
			o = kgo.NewOffset().At(logStart)
		}
		return o, r, nil
	}
	return w.clampGroup(pw, o, logStart), nil, nil
}

// logStart returns the earliest retained offset of topic/partition, from
// starts, listing the input's start offsets the first time it is asked.
func (w *Worker) logStart(ctx context.Context, adm offsetAdmin, starts *kadm.ListedOffsets, topic string, p int32) (int64, error) {
	if *starts == nil {
		l, err := adm.ListStartOffsets(ctx, w.opts.consumedTopics()...)
		if err != nil {
			return 0, fmt.Errorf("listing start offsets to plan where partitions resume: %w", err)
		}
		*starts = l
	}
	s, found := starts.Lookup(topic, p)
	if !found || s.Err != nil {
		return 0, nil // unknown: the group client's reset offset, the log start, covers it
	}
	return s.Offset, nil
}

// clampGroup returns o, the group's committed offset, or the log start if
// that is past o (the records in between were deleted before anyone
// decided them: skipToLogStart).
func (w *Worker) clampGroup(pw *partitionWorker, o kgo.Offset, logStart int64) kgo.Offset {
	group := o.EpochOffset().Offset
	if group < 0 || group >= logStart {
		return o
	}
	return w.skipToLogStart(pw, group, logStart)
}

// skipToLogStart logs and counts the offsets [from, logStart) that pw had
// to decide but retention deleted first, and makes pw start at logStart.
// Its first write batch commits logStart even if no record follows, so
// that the loss is counted once.
func (w *Worker) skipToLogStart(pw *partitionWorker, from, logStart int64) kgo.Offset {
	pw.startAt(store.Checkpoint{Offset: logStart, LeaderEpoch: -1})
	w.countRetentionSkipped(pw, from, logStart)
	return kgo.NewOffset().At(logStart)
}

// countRetentionSkipped logs and counts the offsets [from, logStart) that
// pw had to decide but retention deleted first.
func (w *Worker) countRetentionSkipped(pw *partitionWorker, from, logStart int64) {
	w.m.retentionSkipped.Add(float64(logStart - from))
	w.log.Warn("records deleted by retention before they were decided: resuming at the earliest retained offset; these records were neither forwarded nor remembered",
		"topic", pw.topic, "partition", pw.partition, "lost_from", from, "lost_to", logStart, "lost_offsets", logStart-from)
}

// startEmpty returns where a partition with neither a committed offset nor
// local state starts: the log start, or with StartAtLatest the log end
// unless the group has committed offsets in its topic (startoffset.go).
// A partition that starts at the end starts at the offset listed now, and
// its first write batch commits that offset (at least once, to the group
// too), so that records written after the group began are never skipped,
// even by a member that restarts before deciding any (once that first
// write batch is in, one flush interval after the assignment).
func (w *Worker) startEmpty(ctx context.Context, adm offsetAdmin, seen *groupOffsets, pw *partitionWorker, o kgo.Offset) (kgo.Offset, error) {
	topic, p := pw.topic, pw.partition
	if !w.opts.StartAtLatest || topic == w.opts.RepartitionTopic {
		// The repartition topic holds only what the repartition stage
		// chose to read: all of it is deduplicated.
		return o, nil
	}
	if seen.topicCommitted(ctx, w, adm, topic) {
		w.log.Info("partition added since the group started: reading it from the start, not KDEDUP_START_OFFSET=latest", "topic", topic, "partition", p)
		return kgo.NewOffset().AtStart(), nil
	}
	if seen.ends == nil {
		ends, err := adm.ListEndOffsets(ctx, w.opts.consumedTopics()...)
		if err != nil {
			return o, fmt.Errorf("listing end offsets for KDEDUP_START_OFFSET=latest: %w", err)
		}
		seen.ends = ends
	}
	e, found := seen.ends.Lookup(topic, p)
	if !found || e.Err != nil {
		return o, fmt.Errorf("listing the end offset of %s/%d for KDEDUP_START_OFFSET=latest: %v", topic, p, e.Err)
	}
	pw.startAt(store.Checkpoint{Offset: e.Offset, LeaderEpoch: -1})
	return kgo.NewOffset().At(e.Offset), nil
}

// windowStart is where a rebuild of topic/partition up to offset group
// starts: 0 unless the deduplicator's state depends on the dedup window
// alone (dedup.Options.RebuildsFromWindow); then the first offset whose
// timestamp is at or after dedup.Options.RebuildFrom of the partition's
// watermark at group (the highest timestamp before group).
//
// The watermark is found with timestamp lookups alone (ListOffsets by
// timestamp, as kadm.ListOffsetsAfterMilli): "the first offset with a
// timestamp at or after X is below group" holds exactly for X up to the
// watermark, so a binary search over X finds it in about 40 lookups. When
// a lookup fails the rebuild replays everything retained, which is correct,
// only slower.
func (w *Worker) windowStart(ctx context.Context, adm offsetAdmin, topic string, p int32, group int64) (int64, error) {
	dopts := w.opts.Dedup.Options()
	if !dopts.RebuildsFromWindow() {
		return 0, nil
	}
	offsetAfter := func(millis int64) (int64, error) {
		l, err := adm.ListOffsetsAfterMilli(ctx, millis, topic)
		if err != nil {
			return 0, err
		}
		o, found := l.Lookup(topic, p)
		if !found {
			return 0, fmt.Errorf("no offset listed for %s/%d", topic, p)
		}
		if o.Err != nil {
			return 0, o.Err
		}
		return o.Offset, nil
	}
	before := func(millis int64) (bool, error) { // a record before group has a timestamp >= millis
		o, err := offsetAfter(millis)
		return o >= 0 && o < group, err
	}
	// The watermark lies in [lo, hi): lo qualifies, hi does not.
	lo, hi := int64(-1), int64(1)
	var err error
	for ok := true; ok && err == nil && hi < 1<<50; hi *= 2 {
		ok, err = before(hi)
		if ok {
			lo = hi
		}
	}
	for err == nil && hi-lo > 1 {
		mid := lo + (hi-lo)/2
		var ok bool
		if ok, err = before(mid); ok {
			lo = mid
		} else {
			hi = mid
		}
	}
	if err != nil {
		w.log.Info("cannot locate the dedup window in the input; rebuilding from the earliest retained offset", "topic", topic, "partition", p, "err", err)
		return 0, nil
	}
	startMillis, _ := dopts.RebuildFrom(lo)
	from, err := offsetAfter(startMillis)
	if err != nil || from < 0 {
		w.log.Info("cannot locate the dedup window in the input; rebuilding from the earliest retained offset", "topic", topic, "partition", p, "err", err)
		return 0, nil
	}
	w.log.Info("rebuilding from the start of the dedup window", "topic", topic, "partition", p, "from", from,
		"watermark", time.UnixMilli(lo).UTC().Format(time.RFC3339Nano), "window_start", time.UnixMilli(startMillis).UTC().Format(time.RFC3339Nano), "group_offset", group)
	return from, nil
}

// revoked finishes and commits the revoked partitions' write batches
// (mode.release), and at least once commits their group offsets before the
// partitions move.
func (w *Worker) revoked(ctx context.Context, cl *kgo.Client, revoked map[string][]int32) {
	w.mode.release(ctx, cl, revoked, false)
}

// lost stops the partitions of a group session that ended without a
// revocation (the session expired during a broker outage, or the member was
// fenced): another member may own them already, so they decide nothing
// more and commit nothing to the group. At least once each keeps, in its
// Badger checkpoint, what it forwarded and had acknowledged (settle), so
// that this worker regaining it after an outage resumes there instead of
// forwarding those records again; exactly once the uncommitted transaction
// state is dropped and the gap replayed.
func (w *Worker) lost(ctx context.Context, cl *kgo.Client, lost map[string][]int32) {
	n := w.mode.release(ctx, cl, lost, true)
	w.m.partitionsLost.Add(float64(n))
}

// stopPartitions stops the given partitions and waits for them: abort (a
// lost session) decides nothing more, keeping at least once what was
// forwarded and acknowledged (partition.settle) and dropping exactly once
// the uncommitted state; otherwise each finishes its queued records and
// commits a last write batch. It returns those it stopped, for their last
// snapshots (snapshotter.final) once their offsets are committed.
func (w *Worker) stopPartitions(tps map[string][]int32, abort bool) []*partitionWorker {
	var stopping []*partitionWorker
	w.mu.Lock()
	for topic, ps := range tps {
		for _, p := range ps {
			tp := store.TopicPartition{Topic: topic, Partition: p}
			if pw := w.mu.parts[tp]; pw != nil {
				delete(w.mu.parts, tp)
				stopping = append(stopping, pw)
			}
		}
	}
	w.mu.Unlock()
	for _, pw := range stopping {
		// Every replay told first: stop waits for each in turn, and a
		// local import that completes before it stops must not delay the
		// others' last write batches.
		pw.cancelReplay(abort)
	}
	for _, pw := range stopping {
		pw.settlePlan()
		pw.stop(abort)
	}
	for _, pw := range stopping {
		<-pw.queue.done
		w.m.assigned.Dec()
		w.log.Info("partition released", "topic", pw.topic, "partition", pw.partition, "lost", abort)
	}
	return stopping
}
