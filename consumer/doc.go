// Package consumer runs kdedup's Kafka side: a franz-go consumer-group member
// (cooperative-sticky balancing) that hands each assigned topic-partition's
// records to its own goroutine, produces the records that partition's
// deduplicator forwards (and, to an optional duplicates topic, those it
// drops), and cuts write batches.
//
// # At-least-once ordering
//
// For each partition, in this order:
//
//  1. decide polled records in offset order (package dedup) and produce the
//     forwarded ones (and the dropped ones to the duplicates topic) without
//     waiting;
//  2. every FlushInterval, when the dirty pages reach FlushBytes, on
//     revocation and on shutdown: wait until every produced record is
//     acknowledged, then commit one Badger transaction holding the dirty
//     pages, the chain metadata and the checkpoint (the offset after the
//     last decided record);
//  3. then mark that offset for the group commit, which franz-go sends every
//     FlushInterval and which the worker sends synchronously on revocation
//     and shutdown.
//
// A crash between steps forwards again at most the records decided since the
// last write batch (one flush interval); it never loses a record, because no
// checkpoint or group offset ever passes a record whose output was not
// acknowledged. On assignment a partition resumes from its Badger checkpoint
// when that is ahead of the group's committed offset (a crash between steps 2
// and 3); when it is behind (another member processed the partition
// meanwhile) the gap is replayed into the filter without forwarding. A
// partition that is lost (session expiry, fencing) drops its uncommitted
// state without committing.
//
// A record that cannot be forwarded because of the record itself (too large
// for its target topic, refused by the broker, in a batch over
// MaxDecompressBytes) goes to DeadLetterTopic and processing goes on (see
// deadletter.go). Without one, or on any other storage or produce error,
// the worker stops: Run returns the error after the other partitions finish
// their write batches; the failed partition commits nothing, so its next
// owner resumes from its last good checkpoint. Exactly once, such an error
// aborts one transaction, never a loop of them.
//
// # Layout
//
// The two delivery modes differ in one interface, mode (delivery.go), which
// New picks once from Options.Delivery; besides the options (the
// transactional client settings, GroupClientOpts, and validate's staging
// rule) nothing asks which mode runs.
// Everything a partition does in both modes is in partition.go: process
// decides records in offset order and hands each output to send, flush
// cuts a write batch up to the mode's batchEnd, commitBatch is the one
// place a write batch of decided or replayed records is committed (flush,
// a replay's commitReplay, a lost partition's settle; an idle partition's
// consolidation steps, consolidateIdle, rewrite pages only), batchDue the
// one rule that cuts a batch before its
// time, and owner the one guard that says who may use the deduplicator:
// the plan (adjustOffsets), a replay's restore goroutine, or the loop.
//
//   - worker.go: the Worker, New, Run, connecting, readiness and shutdown;
//     which goroutine owns which of its fields; what every poll's fetches
//     need (polled).
//   - delivery.go: Delivery, its names, and the mode interface.
//   - atleastonce.go: the at-least-once mode: the poll loop, each
//     partition's goroutine, produce with acks, a lost partition's
//     settle, and records the broker refused retried alone.
//   - exactlyonce.go: the exactly-once mode: the transaction loop (its
//     size by time and staged bytes, txnBudget), commit and abort of a
//     partition's part of a transaction, write batches between
//     transactions, and records refused across aborted transactions.
//   - partition.go: the per-partition path shared by both modes (above).
//   - options.go: Options, their defaults and their validation (New).
//   - clientopts.go: the group client's franz-go settings.
//   - rebalance.go: the group callbacks (assigned, revoked, lost) and where
//     each assigned partition starts: at its checkpoint or the group's
//     offset, after replaying the gap, or after a rebuild (from the dedup
//     window's start when that suffices).
//   - startoffset.go: new partitions told from old ones for StartAtLatest.
//   - restore.go: replaying input into a partition's filter with a restore
//     client of its own.
//   - snapshot.go: with Options.Snapshots, uploading each partition's
//     state every SnapshotInterval and when it is released, and restoring
//     a partition from its newest usable snapshot before the replay (the
//     plan chooses, the restore goroutine loads; package snapshot).
//   - deadletter.go: records that cannot be forwarded (dead letters) and
//     the errors that stop the worker (RecordError; TopicError, which
//     names a topic by its role, TopicRole).
//   - recordsize.go: a record's size as the broker counts it against
//     max.message.bytes; compressed.go: the same compressed, and records
//     that fit only compressed.
//   - skipbatch.go: input batches over MaxDecompressBytes, decided as
//     skips.
//   - liveness.go: the Progress a liveness check reads.
//   - ready.go: readiness once the group's assignment is complete (the
//     cooperative-sticky balancer's second round included).
//   - groupparams.go: the state parameters every member of a group must
//     share, named in each member's client id and compared before the
//     first fetch (ErrGroupParams).
//   - origin.go: the topic incarnation and cluster a partition's state
//     belongs to (store.Origin), and what the plan does with local state
//     or a snapshot of another.
//   - forward.go: producing forwarded records without an allocation each
//     (pooled records and delivery promises).
//   - repartition.go: with Options.RepartitionTopic, the two stages of one
//     group: input partitions without state whose records are produced to
//     the repartition topic keyed by their dedup key (route), and the
//     repartition topic's partitions, deduplicated as input partitions are
//     by the key the first stage derived, each record given its original
//     key and headers back once decided.
//   - metrics.go: the worker's metrics and its per-partition collector.
package consumer
