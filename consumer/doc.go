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
// # Files
//
//   - worker.go: the Worker, New, Run, connecting, readiness and shutdown;
//     which goroutine owns which of its fields.
//   - options.go: Options, their defaults and their validation (New).
//   - delivery.go: Delivery, AtLeastOnce and ExactlyOnce, and their names.
//   - clientopts.go: the group client's franz-go settings.
//   - rebalance.go: the group callbacks (assigned, revoked, lost) and where
//     each assigned partition starts: at its checkpoint or the group's
//     offset, after replaying the gap, or after a rebuild (from the dedup
//     window's start when that suffices).
//   - startoffset.go: new partitions told from old ones for StartAtLatest.
//   - poll.go: the at-least-once poll loop, handing records to partitions.
//   - txn.go: the exactly-once loop, one Kafka transaction per poll.
//   - partition.go: one topic-partition: its decisions, its output, its
//     write batches and the ends of its part of a transaction.
//   - restore.go: replaying input into a partition's filter with a restore
//     client of its own.
//   - deadletter.go: records that cannot be forwarded (dead letters,
//     refused records, batches too large to decompress).
//   - liveness.go: the Progress a liveness check reads.
//   - metrics.go: the worker's metrics and its per-partition collector.
package consumer
