package consumer

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kdedup/kdedup/filter"
	"github.com/kdedup/kdedup/snapshot"
	"github.com/kdedup/kdedup/store"
)

// A partition's state belongs to one topic incarnation in one cluster
// (store.Origin): a topic deleted and created again under its name starts
// its offsets at 0 again with a new topic ID, and another cluster (a
// migration, another environment sharing a bucket and a group name) has
// another cluster ID. Offsets alone cannot tell them apart, so the plan
// checks each partition's origin before it trusts a checkpoint or a
// snapshot:
//
//   - local state of another origin is foreign: logged at ERROR with both
//     origins, counted (kdedup_foreign_states_total{source="local"}),
//     moved aside into ForeignStatesDir (a snapshot store on the data
//     volume, never deleted by the worker but for older foreign states of
//     the same partition) and cleared; the partition then starts as one
//     with no local state: from a snapshot of its own origin, by replay,
//     or from the start of the new topic;
//   - a snapshot of another origin is never restored (planSnapshot;
//     kdedup_foreign_states_total{source="snapshot"});
//   - a checkpoint beyond the partition's log end cannot be a checkpoint of
//     this log: with the same origin (an unclean leader election truncated
//     the log) the partition keeps its keys and resumes at the log end
//     (ERROR, kdedup_checkpoints_beyond_log_end_total), so that the records
//     written again at those offsets are decided; without a recorded
//     origin it is foreign;
//   - state recorded before origins were (no origin) is adopted once with
//     the topic's current IDs, as is a snapshot without one.

// ForeignStatesDir is the directory, under the data directory, into which
// a partition's local state of another topic ID or cluster is moved aside:
// a file:// snapshot store (kdedup inspect -snapshots file://...), the
// newest foreign state of each topic-partition kept.
const ForeignStatesDir = "foreign-states"

// planInfo is what one adjustOffsets call lists once for every partition it
// plans: the input topics' origins and end offsets.
type planInfo struct {
	origins map[string]store.Origin
	ends    kadm.ListedOffsets
}

// origin returns the current origin of topic, asking the cluster's
// metadata the first time. A topic the metadata does not describe has the
// zero origin for its topic ID (unknown: nothing is refused for it).
func (w *Worker) origin(ctx context.Context, adm offsetAdmin, info *planInfo, topic string) (store.Origin, error) {
	if info.origins == nil {
		md, err := adm.Metadata(ctx, w.opts.consumedTopics()...)
		if err != nil {
			return store.Origin{}, fmt.Errorf("reading the input topics' IDs to check each partition's state belongs to them: %w", err)
		}
		info.origins = make(map[string]store.Origin, len(w.opts.consumedTopics()))
		for _, t := range w.opts.consumedTopics() {
			o := store.Origin{ClusterID: md.Cluster}
			d, ok := md.Topics[t]
			if ok && d.Err != nil {
				// A topic being created again answers
				// UNKNOWN_TOPIC_OR_PARTITION for a moment: never take
				// that for a broker without topic IDs.
				info.origins = nil
				return store.Origin{}, fmt.Errorf("reading the ID of topic %s to check each partition's state belongs to it: %w", t, d.Err)
			}
			if ok && d.ID != (kadm.TopicID{}) {
				o.TopicID = d.ID.String()
			}
			info.origins[t] = o
		}
	}
	return info.origins[topic], nil
}

// logEnd returns the high watermark of topic/partition, listing the input's
// end offsets the first time; ok is false when it cannot be listed.
func (w *Worker) logEnd(ctx context.Context, adm offsetAdmin, info *planInfo, topic string, p int32) (end int64, ok bool, err error) {
	if info.ends == nil {
		l, err := adm.ListEndOffsets(ctx, w.opts.consumedTopics()...)
		if err != nil {
			return 0, false, fmt.Errorf("listing end offsets to check checkpoints: %w", err)
		}
		info.ends = l
	}
	e, found := info.ends.Lookup(topic, p)
	if !found || e.Err != nil {
		return 0, false, nil
	}
	return e.Offset, true, nil
}

// checkOrigin checks pw's local state against the topic's current origin
// cur before plan trusts its checkpoint (see the comment at the top of
// this file): a foreign state is moved aside and cleared, a state without
// origin adopted. resume is set, with at, when the state is kept but its
// checkpoint is beyond the log end: the partition starts at the log end.
// A storage error, or one moving the state aside, is returned: nothing is
// cleared then.
func (w *Worker) checkOrigin(ctx context.Context, adm offsetAdmin, info *planInfo, pw *partitionWorker, cur store.Origin) (at kgo.Offset, resume bool, err error) {
	stored := pw.dedup.Origin()
	cp, ok := pw.dedup.Checkpoint()
	if !ok { // no state: whatever it starts from is this topic's
		target := stored.Adopted(cur)
		if stored.Differs(cur) {
			target = cur
		}
		if target != stored {
			err = pw.dedup.SetOrigin(target)
		}
		return at, false, err
	}
	end, known, lerr := w.logEnd(ctx, adm, info, pw.topic, pw.partition)
	if lerr != nil {
		if ctx.Err() != nil {
			return at, false, ctx.Err()
		}
		w.log.Warn("cannot tell whether the partition's checkpoint is within its log", "topic", pw.topic, "partition", pw.partition, "err", lerr)
	}
	beyond := known && cp.Offset > end
	switch {
	case stored.Differs(cur):
		return at, false, w.foreignLocal(ctx, pw, cur, cp, end, known, "the local state was built from another topic ID or cluster")
	case beyond && (stored.TopicID == "" || cur.TopicID == ""):
		// Only a topic ID known on both sides proves the state is this
		// log's; a checkpoint past the end of the log says it is not.
		return at, false, w.foreignLocal(ctx, pw, cur, cp, end, known, "the local state's checkpoint is beyond the partition's log end and no topic ID shows it is this topic's")
	case beyond:
		// The same topic, its log truncated (an unclean leader
		// election): the records from where the log diverged were
		// decided before, and records written since at those offsets are
		// new. Resume where the checkpoint's leader epoch ended on the
		// current leader (OffsetForLeaderEpoch), or without an epoch at
		// the log start, keeping the keys: records decided before are
		// dropped as the repeats they are, none skipped.
		from, ferr := w.divergence(ctx, adm, pw, cp, end)
		w.m.beyondLogEnd.Inc()
		w.log.Error("the partition's checkpoint is beyond its log end although its state is of this topic: the log was truncated (an unclean leader election); keeping the keys and deciding again from where the log diverged",
			"topic", pw.topic, "partition", pw.partition, "checkpoint", cp.Offset, "log_end", end, "from", from, "origin", cur.String(), "divergence_err", ferr)
		if adopted := stored.Adopted(cur); adopted != stored {
			if err := pw.dedup.SetOrigin(adopted); err != nil {
				return at, false, err
			}
		}
		pw.startAt(store.Checkpoint{Offset: from, LeaderEpoch: -1})
		return kgo.NewOffset().At(from), true, nil
	}
	if adopted := stored.Adopted(cur); adopted != stored {
		if stored.IsZero() {
			w.log.Info("adopting local state written before topic IDs were recorded", "topic", pw.topic, "partition", pw.partition, "checkpoint", cp.Offset, "origin", adopted.String())
		}
		if err := pw.dedup.SetOrigin(adopted); err != nil {
			return at, false, err
		}
	}
	return at, false, nil
}

// divergence returns where pw's log diverged from the one its checkpoint
// cp was decided on, at most end: the end offset of cp's leader epoch on
// the current leader; the log start when the epoch is unknown or the
// request fails (err says why).
func (w *Worker) divergence(ctx context.Context, adm offsetAdmin, pw *partitionWorker, cp store.Checkpoint, end int64) (int64, error) {
	err := errors.New("the checkpoint records no leader epoch")
	if cp.LeaderEpoch >= 0 {
		var req kadm.OffsetForLeaderEpochRequest
		req.Add(pw.topic, pw.partition, cp.LeaderEpoch)
		var res kadm.OffsetsForLeaderEpochs
		if res, err = adm.OffsetForLeaderEpoch(ctx, req); err == nil {
			r, ok := res[pw.topic][pw.partition]
			switch {
			case !ok:
				err = fmt.Errorf("no answer for %s/%d", pw.topic, pw.partition)
			case r.Err != nil:
				err = r.Err
			case r.EndOffset >= 0:
				return min(r.EndOffset, end), nil
			default:
				err = fmt.Errorf("leader epoch %d unknown to the leader", cp.LeaderEpoch)
			}
		}
	}
	start, lerr := pw.listedOffset(ctx, adm.ListStartOffsets)
	if lerr != nil {
		return 0, errors.Join(err, lerr)
	}
	return start, err
}

// foreignLocal moves pw's local state aside (into ForeignStatesDir),
// clears it and records cur as its origin: the partition then has no local
// state. why says how it was found foreign.
func (w *Worker) foreignLocal(ctx context.Context, pw *partitionWorker, cur store.Origin, cp store.Checkpoint, end int64, endKnown bool, why string) error {
	stored := pw.dedup.Origin()
	w.m.foreignStates.WithLabelValues("local").Inc()
	logEnd := any("unknown")
	if endKnown {
		logEnd = end
	}
	dir := filepath.Join(w.opts.Dedup.StateDir(), ForeignStatesDir)
	w.log.Error(why+": it is not this topic's, so its checkpoint and keys are not trusted; moving it aside and rebuilding the partition from its own input or a snapshot of its own",
		"topic", pw.topic, "partition", pw.partition, "state_topic_id", stored.TopicID, "state_cluster_id", stored.ClusterID,
		"topic_id", cur.TopicID, "cluster_id", cur.ClusterID, "checkpoint", cp.Offset, "log_end", logEnd, "moved_to", dir)
	if err := w.moveAside(ctx, pw, dir); err != nil {
		return err
	}
	if err := pw.dedup.Clear(); err != nil {
		return err
	}
	pw.forgetCheckpoint()
	return pw.dedup.SetOrigin(cur)
}

// moveAside copies pw's committed state into the file:// snapshot store at
// dir, then deletes the older foreign states of its topic-partition there.
func (w *Worker) moveAside(ctx context.Context, pw *partitionWorker, dir string) error {
	st, err := snapshot.Open(ctx, "file://"+dir)
	if err != nil {
		return fmt.Errorf("moving the foreign state of %s/%d aside: %w", pw.topic, pw.partition, err)
	}
	defer st.Close()
	// The copy goes on the data volume: room for it (at most every page
	// of the chain, compressed) beside the write batches' reserve, or the
	// disk-full error, never a full volume under Badger.
	r, err := pw.dedup.ReserveSpace(int64(pw.dedup.Stats().Bytes))
	if err != nil {
		return fmt.Errorf("moving the foreign state of %s/%d aside into %s: %w", pw.topic, pw.partition, dir, err)
	}
	defer r.Release()
	tp := store.TopicPartition{Topic: pw.topic, Partition: pw.partition}
	m, err := st.Put(ctx, tp, func(header func(store.Image) error, page func(filter.PageID, []byte) error) (bool, error) {
		return w.opts.Dedup.Export(tp, header, page)
	})
	if err != nil && !errors.Is(err, snapshot.ErrNoState) {
		return fmt.Errorf("moving the foreign state of %s/%d aside: %w", pw.topic, pw.partition, err)
	}
	if _, err := st.Prune(ctx, tp, 1, 0); err != nil {
		w.log.Warn("deleting older foreign states failed", "topic", pw.topic, "partition", pw.partition, "dir", dir, "err", err)
	}
	w.log.Info("foreign state moved aside", "topic", pw.topic, "partition", pw.partition, "snapshot", filepath.Join(dir, m.Key()), "offset", m.Offset, "bytes", m.Bytes)
	return nil
}

// forgetCheckpoint makes pw a partition without state (its deduplicator's
// state was just cleared), as newPartition leaves one.
func (pw *partitionWorker) forgetCheckpoint() {
	pw.next, pw.stableNext, pw.flushed = store.Checkpoint{}, store.Checkpoint{}, store.Checkpoint{}
	pw.gauges.nextOffset.Store(-1)
	pw.snap.committed.Store(-1)
}
