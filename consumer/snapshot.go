package consumer

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kdedup/kdedup/dedup"
	"github.com/kdedup/kdedup/filter"
	"github.com/kdedup/kdedup/snapshot"
	"github.com/kdedup/kdedup/store"
)

// Snapshots in object storage (Options.Snapshots).
//
// Uploads: a partition's state is snapshotted every SnapshotInterval while
// its checkpoint moves (never twice at one checkpoint), and once more when
// it is revoked or the worker stops, after its last write batch, so that
// a planned move restores with nothing to replay. A snapshot is read from
// Badger at one read timestamp (store.DB.Export), so it is one whole write
// batch, and runs in the background: the partition goes on deciding and
// committing while it uploads. One upload at a time per worker.
//
// Restores: where the plan would replay (no local state, or local state
// behind the group's offset by more than snapshotMinSkip offsets), it
// starts the partition's restore goroutine with a snapshot plan instead,
// without asking the store inside the group's callback. The restore
// goroutine lists the partition's snapshots (at most
// snapshotListParallelism partitions at once) and takes the newest of the
// topic's origin at or below the group's committed offset (and past the
// local checkpoint), loads it (dedup.Deduplicator.Restore: parameters
// checked, SHA-256 checked before the state is committed) and replays only
// [snapshot offset, group offset). A store that fails a listing or a
// download is asked again after a growing wait, the partition waiting
// (not ready) meanwhile, until it answers or the partition is revoked: a
// transient error never turns a restore into a replay or an empty filter.
// A snapshot that cannot be used (damaged, missing, other parameters) is
// logged at WARN and counted, and the next older is tried, then the replay
// the plan would have run without snapshots. The group's offset never
// moves.

// DefaultSnapshotInterval is Options.SnapshotInterval's default.
const DefaultSnapshotInterval = 2 * time.Minute

// snapshotMinSkip is the fewest offsets a snapshot must skip past a
// partition's local checkpoint to be restored instead of replaying from
// the checkpoint: below it a replay reads less than the download.
const snapshotMinSkip = 100_000

// snapshotFinalBudget bounds the uploads of a revocation or a shutdown
// together: a rebalance waits for them. A partition not uploaded by then
// is restored by its next owner from its previous snapshot and a replay.
const snapshotFinalBudget = 30 * time.Second

// snapshotUploadTimeout bounds one interval's upload, and with it the
// Badger read transaction it holds open (which keeps old versions from
// being discarded).
const snapshotUploadTimeout = 10 * time.Minute

// snapshotter uploads snapshots of the worker's partitions. Safe for
// concurrent use.
type snapshotter struct {
	w  *Worker
	st *snapshot.Store
	m  snapshotMetrics
	// uploading holds a token while an upload runs: one at a time per
	// worker, and a wait for it ends with its context.
	uploading chan struct{}
	// listing holds a token per listing of a partition's snapshots
	// running (candidates): snapshotListParallelism at once.
	listing chan struct{}
	// uploadDownUntil (Unix nanoseconds): the store failed an upload;
	// uploads skip it until then instead of each waiting for the SDK's
	// retries. Restores do not: they retry per partition (candidates).
	uploadDownUntil atomic.Int64
}

// snapshotListTimeout bounds one listing of a partition's snapshots, and
// snapshotDownFor is how long uploads skip a store that failed one.
const (
	snapshotListTimeout = 10 * time.Second
	snapshotDownFor     = 30 * time.Second
)

type snapshotMetrics struct {
	uploads        *prometheus.CounterVec
	uploadBytes    prometheus.Counter
	uploadSeconds  prometheus.Histogram
	restores       *prometheus.CounterVec
	restoreSeconds prometheus.Histogram
	restoreFailed  prometheus.Counter
	restoreNoSpace prometheus.Counter
	storeErrors    *prometheus.CounterVec
}

func newSnapshotter(w *Worker, reg prometheus.Registerer) *snapshotter {
	f := promauto.With(reg)
	s := &snapshotter{w: w, st: w.opts.Snapshots, uploading: make(chan struct{}, 1), listing: make(chan struct{}, snapshotListParallelism), m: snapshotMetrics{
		uploads: f.NewCounterVec(prometheus.CounterOpts{Name: "kdedup_snapshot_uploads_total",
			Help: "Partition snapshots uploaded to the snapshot store, by result (ok, error)."}, []string{"result"}),
		uploadBytes: f.NewCounter(prometheus.CounterOpts{Name: "kdedup_snapshot_upload_bytes_total",
			Help: "Bytes of snapshot objects uploaded (compressed)."}),
		uploadSeconds: f.NewHistogram(prometheus.HistogramOpts{Name: "kdedup_snapshot_upload_seconds",
			Help: "Time to read a partition's state and upload it as a snapshot.", Buckets: prometheus.ExponentialBuckets(0.01, 3, 10)}),
		restores: f.NewCounterVec(prometheus.CounterOpts{Name: "kdedup_partition_restores_total",
			Help: "Partitions assigned, by where their state came from: local (the local state was used), snapshot (restored from a snapshot, then the gap replayed), replay (rebuilt or caught up by replaying input alone)."}, []string{"source"}),
		restoreSeconds: f.NewHistogram(prometheus.HistogramOpts{Name: "kdedup_snapshot_restore_seconds",
			Help: "Time to download and load a snapshot into the local state (the gap replay after it not included).", Buckets: prometheus.ExponentialBuckets(0.01, 3, 10)}),
		restoreFailed: f.NewCounter(prometheus.CounterOpts{Name: "kdedup_snapshot_restore_failures_total",
			Help: "Snapshots that could not be restored (damaged, missing, or written with other parameters); an older snapshot or a replay was used instead."}),
		restoreNoSpace: f.NewCounter(prometheus.CounterOpts{Name: "kdedup_snapshot_restore_no_space_total",
			Help: "Snapshots not restored because their download and state did not fit on the data volume beside the write batches' reserve and the other restores running; an older snapshot or a replay was used instead."}),
		storeErrors: f.NewCounterVec(prometheus.CounterOpts{Name: "kdedup_snapshot_store_errors_total",
			Help: "Requests of a restore that the snapshot store failed, by operation (list: a partition's snapshots; fetch: a download); each is asked again after a growing wait while the partition waits."}, []string{"op"}),
	}}
	for _, r := range []string{"ok", "error"} {
		s.m.uploads.WithLabelValues(r)
	}
	for _, op := range []string{"list", "fetch"} {
		s.m.storeErrors.WithLabelValues(op)
	}
	snapshot.RemoveStaleFetches(w.opts.Dedup.StateDir())
	for _, r := range []string{"local", "snapshot", "replay"} {
		s.m.restores.WithLabelValues(r)
	}
	return s
}

// loop uploads snapshots of the partitions that are due until ctx ends.
func (s *snapshotter) loop(ctx context.Context) {
	interval := s.w.opts.SnapshotInterval
	t := time.NewTicker(min(max(interval/4, 10*time.Millisecond), 5*time.Second))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for _, pw := range s.w.assignedPartitions() {
			if ctx.Err() != nil {
				return
			}
			if s.due(pw, interval) {
				uctx, cancel := context.WithTimeout(ctx, snapshotUploadTimeout)
				s.upload(uctx, pw, "interval")
				cancel()
			}
		}
	}
}

// due reports whether pw's state changed since its last snapshot and that
// was at least interval ago (or it has none since its assignment, an
// interval ago).
func (s *snapshotter) due(pw *partitionWorker, interval time.Duration) bool {
	if pw.failed.Load() || pw.stateless() || pw.owner() != ownerLoop || time.Now().UnixNano() < s.uploadDownUntil.Load() {
		return false
	}
	off := pw.snap.committed.Load()
	return off >= 0 && off != pw.snap.offset.Load() && time.Since(time.Unix(0, pw.snap.at.Load())) >= interval
}

// upload snapshots pw's committed state, then deletes the partition's
// snapshots beyond SnapshotKeep. A failure is logged and counted, and no
// upload is tried for snapshotDownFor; the next interval after that tries
// again.
func (s *snapshotter) upload(ctx context.Context, pw *partitionWorker, why string) {
	select {
	case s.uploading <- struct{}{}:
		defer func() { <-s.uploading }()
	case <-ctx.Done():
		return
	}
	if pw.snap.committed.Load() == pw.snap.offset.Load() {
		return // uploaded meanwhile
	}
	if why == "interval" && s.w.partition(pw.topic, pw.partition) != pw {
		// Revoked since the tick: its last state was uploaded at the
		// revocation (or will be, by final), and an upload now would
		// prune the new owner's newer snapshots by store time.
		return
	}
	tp := store.TopicPartition{Topic: pw.topic, Partition: pw.partition}
	start := time.Now()
	m, err := s.st.Put(ctx, tp, func(header func(store.Image) error, page func(filter.PageID, []byte) error) (bool, error) {
		return s.w.opts.Dedup.Export(tp, header, page)
	})
	switch {
	case errors.Is(err, snapshot.ErrNoState):
		return
	case err != nil:
		if ctx.Err() == nil {
			s.uploadDownUntil.Store(time.Now().Add(snapshotDownFor).UnixNano())
			s.m.uploads.WithLabelValues("error").Inc()
			s.w.log.Warn("snapshot upload failed; the next one is tried in a snapshot interval", "topic", pw.topic, "partition", pw.partition, "reason", why, "err", err)
		}
		pw.snap.at.Store(time.Now().UnixNano())
		return
	}
	d := time.Since(start)
	pw.snap.offset.Store(m.Offset)
	pw.snap.at.Store(start.UnixNano())
	s.m.uploads.WithLabelValues("ok").Inc()
	s.m.uploadBytes.Add(float64(m.Bytes))
	s.m.uploadSeconds.Observe(d.Seconds())
	s.w.log.Info("snapshot uploaded", "topic", pw.topic, "partition", pw.partition, "offset", m.Offset, "reason", why,
		"bytes", m.Bytes, "state_bytes", m.StateBytes(), "duration", d.Round(time.Millisecond))
	// Objects no manifest names are left an hour, or ten intervals: an
	// upload in progress, maybe another worker's during a rebalance.
	grace := max(time.Hour, 10*s.w.opts.SnapshotInterval)
	pr, err := s.st.PruneOf(ctx, tp, m.Origin(), s.w.opts.SnapshotKeep, grace)
	if err != nil {
		s.w.log.Warn("deleting old snapshots failed; retried after the next upload", "topic", pw.topic, "partition", pw.partition, "err", err)
	}
	for _, key := range pr.Unreadable {
		s.w.log.Warn("deleted a damaged snapshot manifest older than the grace period", "topic", pw.topic, "partition", pw.partition, "manifest", key, "grace", grace)
	}
	if pr.Objects > 0 {
		s.w.log.Debug("old snapshots deleted", "topic", pw.topic, "partition", pw.partition, "objects", pr.Objects)
	}
}

// finalSnapshots uploads the last state of partitions released by a
// revocation or a shutdown (snapshotter.final), with snapshots configured,
// within snapshotFinalBudget.
func (w *Worker) finalSnapshots(stopped []*partitionWorker) {
	w.finalSnapshotsWithin(stopped, snapshotFinalBudget)
}

// finalSnapshotsWithin is finalSnapshots within budget.
func (w *Worker) finalSnapshotsWithin(stopped []*partitionWorker, budget time.Duration) {
	if w.snaps != nil && len(stopped) > 0 {
		w.snaps.final(stopped, budget)
	}
}

// final uploads the stopped partitions' last state (revocation or
// shutdown), within budget in all, waiting for an interval's upload in
// flight within it too.
func (s *snapshotter) final(stopped []*partitionWorker, budget time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), max(budget, 0))
	defer cancel()
	for _, pw := range stopped {
		if pw.failed.Load() || pw.stateless() || pw.owner() == ownerPlan {
			continue // failed, without state, or released before its start was planned: nothing changed
		}
		if ctx.Err() != nil || time.Now().UnixNano() < s.uploadDownUntil.Load() {
			s.w.log.Warn("no time left, or the store failed within 30s: not snapshotting a released partition; its next owner restores an older snapshot and replays after it", "topic", pw.topic, "partition", pw.partition, "budget", budget.Round(time.Millisecond))
			continue
		}
		s.upload(ctx, pw, "released")
	}
}

// snapshotPlan is a partition's restore from a snapshot, planned by plan
// and carried out by the restore goroutine (restoreSnapshot).
type snapshotPlan struct {
	// hasLocal: the partition had local state when planned.
	hasLocal bool
	// rebuildEmpty: without a snapshot the partition starts empty at
	// the group's offset (Options.RebuildEmpty).
	rebuildEmpty bool
	// origin is the topic's current origin, recorded with the state
	// restored (snapshots of another origin are never restored).
	origin store.Origin
}

// snapshotMayHelp reports whether a snapshot could spare the partition a
// replay: snapshots are configured, the group has a committed offset, and
// the partition has no local state (hasLocal false) or local state at
// checkpoint more than snapshotMinSkip behind it.
func (w *Worker) snapshotMayHelp(hasLocal bool, checkpoint, group int64) bool {
	return w.snaps != nil && group >= 0 && (!hasLocal || group-checkpoint > snapshotMinSkip)
}

// snapshotRetryMin and snapshotRetryMax bound the wait between two
// attempts to list a partition's snapshots, or to download one, while the
// store fails: doubling from the first to the second.
const (
	snapshotRetryMin = 500 * time.Millisecond
	snapshotRetryMax = 30 * time.Second
)

// snapshotListParallelism bounds the listings of partitions' snapshots
// running at once (each a LIST and a GET per manifest read).
const snapshotListParallelism = 8

// retryWait waits before attempt (0 the first retry) of a failed store
// request, as long as ctx lets it; false when ctx ended.
func retryWait(ctx context.Context, attempt int) bool {
	wait := min(snapshotRetryMax, snapshotRetryMin<<min(attempt, 16))
	select {
	case <-ctx.Done():
		return false
	case <-time.After(wait):
		return true
	}
}

// storeGivesUp decides whether a restore gives up on a store that failed
// a request (attempt counts from 0) and logs either way: after
// snapshotQuickAttempts failures it gives up when what the partition does
// without a snapshot loses nothing (a replay whose whole input is
// retained); otherwise (the replay would be partial, or
// KDEDUP_REBUILD=empty would start empty) it waits for the store until it
// answers or the partition is revoked: a transient error never costs the
// filter keys. what names the request in the log.
func (pw *partitionWorker) storeGivesUp(ctx context.Context, group *kgo.Client, plan *snapshotPlan, local, until int64, attempt int, what string, err error) bool {
	if attempt+1 >= snapshotQuickAttempts && pw.replayLosesNothing(ctx, group, plan, local, until) {
		pw.w.snaps.m.restoreFailed.Inc()
		pw.w.log.Warn("the snapshot store fails to "+what+"; replaying instead (the partition's whole input is retained)", "topic", pw.topic, "partition", pw.partition,
			"attempts", attempt+1, "err", err)
		return true
	}
	pw.w.log.Warn("the snapshot store fails to "+what+"; asking again, the partition waits", "topic", pw.topic, "partition", pw.partition,
		"attempt", attempt+1, "err", err)
	return false
}

// storeAttempt is storeGivesUp followed, unless it gives up, by the wait
// before the next attempt (snapshotRetryMin doubling to
// snapshotRetryMax): stopped when ctx ended first.
func (pw *partitionWorker) storeAttempt(ctx context.Context, group *kgo.Client, plan *snapshotPlan, local, until int64, attempt int, what string, err error) (giveUp, stopped bool) {
	if pw.storeGivesUp(ctx, group, plan, local, until, attempt, what, err) {
		return true, false
	}
	return false, !retryWait(ctx, attempt)
}

// newest lists pw's snapshots (snapshot.Store.Newest; at most
// snapshotListParallelism listings at once), asking again while the store
// fails (storeAttempt): nil when the partition gives up on snapshots.
func (pw *partitionWorker) newest(ctx context.Context, group *kgo.Client, plan *snapshotPlan, local, until int64) (l *snapshot.Listing, stopped bool) {
	s := pw.w.snaps
	tp := store.TopicPartition{Topic: pw.topic, Partition: pw.partition}
	for attempt := 0; ; attempt++ {
		select {
		case s.listing <- struct{}{}:
		case <-ctx.Done():
			return nil, true
		}
		lctx, cancel := context.WithTimeout(ctx, snapshotListTimeout)
		l, err := s.st.Newest(lctx, tp)
		cancel()
		<-s.listing
		if ctx.Err() != nil {
			return nil, true
		}
		if err == nil {
			return l, false
		}
		s.m.storeErrors.WithLabelValues("list").Inc()
		if giveUp, stopped := pw.storeAttempt(ctx, group, plan, local, until, attempt, "list the partition's snapshots", err); giveUp || stopped {
			return nil, stopped
		}
	}
}

// snapshotQuickAttempts is how many failed requests a partition whose
// replay would lose nothing tries before it replays (storeAttempt).
const snapshotQuickAttempts = 3

// replayLosesNothing reports whether the partition, without a snapshot,
// would rebuild exactly: it replays (not KDEDUP_REBUILD=empty) from a start
// (the local checkpoint from, or windowStart) that retention has not
// passed. Any listing that fails answers false.
func (pw *partitionWorker) replayLosesNothing(ctx context.Context, group *kgo.Client, plan *snapshotPlan, from, until int64) bool {
	if plan.rebuildEmpty {
		return false
	}
	adm := kadm.NewClient(group)
	if !plan.hasLocal {
		var err error
		if from, err = pw.w.windowStart(ctx, adm, pw.topic, pw.partition, until); err != nil {
			return false
		}
	}
	logStart, err := pw.listedOffset(ctx, adm.ListStartOffsets)
	return err == nil && logStart <= from
}

// usable reports whether pw may restore m instead of replaying from local
// (its checkpoint, -1 without local state) up to until: m is of the plan's
// origin (or records none), at or below until and past local, by more
// than snapshotMinSkip with local state. A snapshot of another topic ID or
// cluster is logged at ERROR and counted
// (kdedup_foreign_states_total{source="snapshot"}).
func (s *snapshotter) usable(pw *partitionWorker, plan *snapshotPlan, m snapshot.Manifest, local, until int64) bool {
	if m.Origin().Differs(plan.origin) {
		s.w.m.foreignStates.WithLabelValues("snapshot").Inc()
		s.w.log.Error("not restoring a snapshot of another topic ID or cluster: the topic was deleted and created again, or the snapshot store and group name are shared with another cluster",
			"topic", pw.topic, "partition", pw.partition, "snapshot", m.Key(), "offset", m.Offset,
			"snapshot_topic_id", m.TopicID, "snapshot_cluster_id", m.ClusterID, "topic_id", plan.origin.TopicID, "cluster_id", plan.origin.ClusterID)
		return false
	}
	return m.Offset <= until && m.Offset > local && (!plan.hasLocal || m.Offset > local+snapshotMinSkip)
}

// countRestore counts a partition's assignment by where its state comes
// from (kdedup_partition_restores_total), with snapshots configured.
func (w *Worker) countRestore(source string) {
	if w.snaps != nil {
		w.snaps.m.restores.WithLabelValues(source).Inc()
	}
}

// restoreFrom restores the snapshot m into pw's state: restored, or not
// (m unusable: damaged, other parameters, no room for it on the data
// volume, an object the store keeps failing to serve; logged and counted,
// the caller tries an older one), or giveUp (the store fails the download
// and the partition replays instead, storeGivesUp), stopped (ctx ended),
// or the local store's error. Each attempt holds a restore slot
// (takeRestoreSlot); the waits between them hold none.
func (pw *partitionWorker) restoreFrom(ctx context.Context, group *kgo.Client, plan *snapshotPlan, m snapshot.Manifest, local, until int64) (restored, giveUp, stopped bool, err error) {
	for attempt := 0; ; attempt++ {
		release, ok := pw.takeRestoreSlot(ctx)
		if !ok {
			return false, false, true, nil
		}
		restored, retry, giveUp, stopped, err := pw.restoreOnce(ctx, group, plan, m, local, until, attempt)
		release()
		if !retry {
			return restored, giveUp, stopped, err
		}
		if !retryWait(ctx, attempt) {
			return false, false, true, nil
		}
	}
}

// restoreOnce is one attempt of restoreFrom, holding a restore slot:
// retry asks for another after a wait (the store failed the download).
func (pw *partitionWorker) restoreOnce(ctx context.Context, group *kgo.Client, plan *snapshotPlan, m snapshot.Manifest, local, until int64, attempt int) (restored, retry, giveUp, stopped bool, err error) {
	w, s := pw.w, pw.w.snaps
	start := time.Now()
	// The download and the state it imports fit on the data volume beside
	// every other restore's, or this snapshot is not tried: a full volume
	// is a SIGBUS under Badger.
	r, err := pw.dedup.ReserveSpace(m.RestoreBytes())
	if errors.Is(err, store.ErrDiskFull) {
		s.m.restoreNoSpace.Inc()
		w.log.Warn("no room on the data volume to restore a snapshot; trying an older one, then a replay", "topic", pw.topic, "partition", pw.partition,
			"snapshot", m.Key(), "bytes_needed", m.RestoreBytes(), "err", err)
		return false, false, false, false, nil
	}
	if err != nil {
		return false, false, false, false, err
	}
	defer r.Release()
	// Downloaded and checked before anything local changes: a snapshot
	// that fails here leaves the local state as it was.
	f, err := s.st.Fetch(ctx, m, w.opts.Dedup.StateDir())
	if err != nil {
		switch {
		case ctx.Err() != nil:
			return false, false, false, true, nil
		case errors.Is(err, snapshot.ErrCorrupt):
			s.m.restoreFailed.Inc()
			w.log.Warn("snapshot unusable; trying an older one, then a replay", "topic", pw.topic, "partition", pw.partition, "snapshot", m.Key(), "offset", m.Offset, "err", err)
			return false, false, false, false, nil
		}
		// The store failed the download: the same snapshot again after a
		// wait, unless the partition gives up on the store
		// (storeAttempt), or on this snapshot after
		// snapshotKeyAttempts failures of it (an object the store will
		// not serve: an older one may be served).
		s.m.storeErrors.WithLabelValues("fetch").Inc()
		if pw.storeGivesUp(ctx, group, plan, local, until, attempt, "serve a snapshot", err) {
			return false, false, true, false, nil
		}
		if attempt+1 >= snapshotKeyAttempts {
			s.m.restoreFailed.Inc()
			w.log.Warn("the store keeps failing to serve a snapshot; trying an older one, then a replay", "topic", pw.topic, "partition", pw.partition,
				"snapshot", m.Key(), "attempts", attempt+1, "err", err)
			return false, false, false, false, nil
		}
		return false, true, false, false, nil
	}
	defer f.Close()
	r.Consume(m.Bytes) // on the volume now, no longer held apart
	if ctx.Err() != nil {
		return false, false, false, true, nil
	}
	if h := w.hooks.beforeImport; h != nil {
		h(pw)
	}
	// Importing replaces the state: a partition that has local state
	// keeps it unless the import begins, and once it has begun, completes
	// it whatever ctx says (it reads a local file at disk speed), so that
	// a revocation or a stop never leaves it without the state it had.
	// Without local state there is nothing to keep: a stop cuts the
	// import short.
	lctx := ctx
	if plan.hasLocal {
		if ctx.Err() != nil {
			return false, false, false, true, nil
		}
		lctx = context.WithoutCancel(ctx)
	}
	err = f.Load(lctx, func(img store.Image, pages func(put func(filter.PageID, []byte) error) error) error {
		img.Origin = m.Origin().Adopted(plan.origin)
		return pw.dedup.Restore(img, func(put func(filter.PageID, []byte) error) error {
			first := true
			return pages(func(id filter.PageID, b []byte) error {
				if h := w.hooks.importing; h != nil && first {
					first = false
					h(pw)
				}
				return put(id, b)
			})
		})
	})
	switch {
	case err == nil:
		// Restored, even if ctx ended meanwhile: the state is the
		// snapshot's, and the partition stands at its checkpoint.
		d := time.Since(start)
		pw.setCheckpoint(m.Checkpoint())
		pw.snap.offset.Store(m.Offset)
		pw.snap.at.Store(time.Now().UnixNano())
		s.m.restores.WithLabelValues("snapshot").Inc()
		s.m.restoreSeconds.Observe(d.Seconds())
		w.log.Info("restored from a snapshot; replaying the input after it", "topic", pw.topic, "partition", pw.partition,
			"offset", m.Offset, "group_offset", until, "bytes", m.Bytes, "state_bytes", m.StateBytes(), "duration", d.Round(time.Millisecond), "snapshot", m.Key())
		return true, false, false, false, nil
	case errors.Is(err, snapshot.ErrCorrupt) || errors.Is(err, dedup.ErrSnapshotParams):
		s.m.restoreFailed.Inc()
		w.log.Warn("snapshot unusable; trying an older one, then a replay", "topic", pw.topic, "partition", pw.partition, "snapshot", m.Key(), "offset", m.Offset, "err", err)
		return false, false, false, false, nil
	case errors.Is(err, store.ErrDiskFull):
		// The volume filled while it imported (its reservation held, so
		// something else wrote): no state is left of the import; an
		// older snapshot or the replay, whose write batches stop the
		// partition with the disk-full error if the room is not there.
		s.m.restoreNoSpace.Inc()
		w.log.Warn("the data volume filled while a snapshot was imported; trying an older one, then a replay", "topic", pw.topic, "partition", pw.partition,
			"snapshot", m.Key(), "bytes_needed", m.RestoreBytes(), "err", err)
		return false, false, false, false, nil
	case ctx.Err() != nil && errors.Is(err, ctx.Err()):
		return false, false, false, true, nil // a stop cut the import short
	}
	// Fetched and checked, then the local store failed while loading it:
	// a storage error stops the partition.
	return false, false, false, false, err
}

// snapshotKeyAttempts is how many times in a row a restore asks the store
// for one snapshot's object or manifest before it goes on to an older one.
const snapshotKeyAttempts = 5

// restoreSnapshot loads the newest usable snapshot of the plan into the
// partition's state and returns where the replay goes on: the snapshot's
// offset, or, when no snapshot could be loaded, where the plan would have
// replayed from without snapshots (with partial telling whether input
// it needs is gone, counted and logged here if the plan did not). It reads
// the partition's manifests newest first (by the offset in their names),
// each within snapshotListTimeout, and stops at the first it restores. It
// runs on the restore goroutine, which owns the deduplicator. stopped: ctx
// ended first.
func (pw *partitionWorker) restoreSnapshot(ctx context.Context, group *kgo.Client, plan *snapshotPlan, until int64, partial bool) (from int64, nowPartial, stopped bool, err error) {
	w, s := pw.w, pw.w.snaps
	local := int64(-1)
	if cp, ok := pw.dedup.Checkpoint(); ok && plan.hasLocal {
		local = cp.Offset
	}
	l, stopped := pw.newest(ctx, group, plan, local, until)
	if stopped {
		return 0, partial, true, nil
	}
	for attempt := 0; l != nil; {
		m, ok, skipped, err := l.Next(ctx, snapshotListTimeout)
		if ctx.Err() != nil {
			return 0, partial, true, nil
		}
		if err != nil {
			s.m.storeErrors.WithLabelValues("list").Inc()
			if pw.storeGivesUp(ctx, group, plan, local, until, attempt, "read a manifest", err) {
				break
			}
			if attempt+1 >= snapshotKeyAttempts {
				// One manifest the store will not serve: go on to older
				// ones rather than wait for it.
				w.log.Warn("the store keeps failing to serve a snapshot manifest; going on to older ones", "topic", pw.topic, "partition", pw.partition,
					"manifest", l.Skip(), "attempts", attempt+1, "err", err)
				attempt = 0
				continue
			}
			if !retryWait(ctx, attempt) {
				return 0, partial, true, nil
			}
			attempt++
			continue
		}
		attempt = 0
		if skipped != nil {
			w.log.Warn("snapshot manifest skipped", "topic", pw.topic, "partition", pw.partition, "err", skipped)
			continue
		}
		if !ok {
			break
		}
		if !s.usable(pw, plan, m, local, until) {
			continue
		}
		restored, giveUp, stopped, err := pw.restoreFrom(ctx, group, plan, m, local, until)
		switch {
		case stopped:
			return 0, partial, true, nil
		case err != nil:
			return 0, partial, false, err
		case restored:
			return m.Offset, partial, false, nil
		case giveUp:
			l = nil
		}
	}
	w.countRestore("replay")
	if cp, ok := pw.dedup.Checkpoint(); ok && plan.hasLocal {
		pw.setCheckpoint(cp) // refused before the import: the local state is intact
		return cp.Offset, partial, false, nil
	}
	if plan.rebuildEmpty {
		w.log.Info("no usable snapshot: starting with an empty filter (KDEDUP_REBUILD=empty)", "topic", pw.topic, "partition", pw.partition, "group_offset", until)
		return until, partial, false, nil
	}
	adm := kadm.NewClient(group)
	from, err = w.windowStart(ctx, adm, pw.topic, pw.partition, until)
	if ctx.Err() != nil {
		return 0, partial, true, nil
	}
	if err != nil {
		return 0, partial, false, err
	}
	// The log start, asked until the brokers answer (a leader moving
	// during a broker's restart answers NOT_LEADER for a while): the
	// replay cannot begin without it, and one failed listing is no
	// reason to stop the worker.
	var logStart int64
	for attempt := 0; ; attempt++ {
		if logStart, err = pw.listedOffset(ctx, adm.ListStartOffsets); err == nil {
			break
		}
		w.log.Warn("cannot list the partition's log start to begin its replay; asking again", "topic", pw.topic, "partition", pw.partition, "attempt", attempt+1, "err", err)
		if !retryWait(ctx, attempt) {
			return 0, partial, true, nil
		}
	}
	if logStart > from {
		if !partial {
			w.m.partialRebuilds.Inc()
			w.log.Warn("replay is partial: the input before the earliest retained offset is gone, so keys first seen there are not in the filter and deletes there are not applied",
				"topic", pw.topic, "partition", pw.partition, "lost_from", from, "lost_to", min(logStart, until))
		}
		from, partial = logStart, true
	}
	return from, partial, false, nil
}
