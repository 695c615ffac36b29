package consumer

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kdedup/kdedup/dedup"
	"github.com/kdedup/kdedup/internal/optcheck"
	"github.com/kdedup/kdedup/snapshot"
	"github.com/kdedup/kdedup/store"
)

// ErrStaging is returned by New when the deduplicators of Options.Dedup
// stage their changes (dedup.Options.Staged) and the delivery is not
// ExactlyOnce, or the other way round: exactly once needs the changes of a
// transaction held back until it commits, and at least once needs them in
// the write batches.
var ErrStaging = errors.New("consumer: the deduplicator stages its changes if and only if delivery is exactly once")

// Options configure a Worker. Fields without a stated default are required.
type Options struct {
	// Brokers are the seed brokers, host:port.
	Brokers []string
	// InputTopics are consumed as one consumer group.
	InputTopics []string
	// OutputTopic receives forwarded records, partitioned by record key.
	OutputTopic string
	// DuplicatesTopic, if set, receives every record decided
	// dedup.Duplicate or dedup.OverLimit, unchanged but for the headers
	// HeaderReason and HeaderSource appended, partitioned by record key, so
	// that a false drop can be found and replayed. It is produced like
	// OutputTopic: at least once before the write batch covering the
	// record, exactly once in the record's transaction; records replayed
	// into the filter produce nothing. It must differ from OutputTopic and
	// from every input topic (default: none).
	DuplicatesTopic string
	// DeadLetterTopic, if set, receives each input record that cannot be
	// forwarded (or sent to DuplicatesTopic) because of the record itself:
	// larger than MaxRecordBytes of its target topic, rejected by the
	// broker as invalid, or in a batch over MaxDecompressBytes. It carries
	// the input record with the headers HeaderDeadLetterReason,
	// HeaderSource, HeaderTarget and HeaderDetail appended, is produced
	// like OutputTopic, and processing goes on. Empty: such a record stops
	// the worker with a *RecordError naming it. It must differ from
	// OutputTopic, DuplicatesTopic and every input topic (default: none).
	DeadLetterTopic string
	// RepartitionTopic, if set, makes the worker run two stages in its
	// consumer group (repartition.go): the records of InputTopics are
	// produced to it keyed by their dedup key (murmur2, as Kafka's Java
	// client partitions), with their original key, headers and timestamp;
	// its records are deduplicated and forwarded to OutputTopic in their
	// original form. Every record of one dedup key then meets the others in
	// one partition of it, whatever partition its producer chose. The
	// state is kept per partition of this topic, and its partition count
	// must never change (a key would move to another partition and be new
	// there). It is produced like OutputTopic and read read_committed. It
	// must differ from every other topic of the worker (default: none,
	// each input partition is deduplicated on its own).
	RepartitionTopic string
	// MaxRecordBytes returns the max.message.bytes of a topic the worker
	// produces to (OutputTopic, DuplicatesTopic, DeadLetterTopic,
	// RepartitionTopic), in
	// bytes: a record whose batch of its own is larger, before compression
	// (recordBatchBytes) and once compressed as the worker's producer
	// compresses it (compressedBatchBytes), is a dead letter instead of a
	// produce error; one larger only before compression is forwarded alone
	// in its batch. The producer's other batches to the topic are bounded
	// by it before compression. It is called with "" too, for the client's
	// default. Nil: 1,048,588 bytes (DefaultMaxRecordBytes) for every topic.
	MaxRecordBytes func(topic string) int
	// MaxDecompressBytes bounds what one input record batch may
	// decompress to, in bytes (default 64 MiB). A larger batch is not
	// decompressed; its records are skipped as one dead letter (without
	// key or value) or, without DeadLetterTopic, the worker stops with a
	// *RecordError naming the batch's offsets.
	MaxDecompressBytes int
	// Group is the consumer group id (default "kdedup").
	Group string
	// InstanceID, when set, makes the worker a static group member
	// (KIP-345, group.instance.id): it does not leave the group when it
	// stops, and a worker restarting with the same InstanceID within
	// SessionTimeout gets its partitions back without a rebalance, so
	// their local state is reused at once. Each member of the group needs
	// its own (a pod name). Empty: a dynamic member that leaves on stop.
	InstanceID string
	// StartAtLatest makes a group with no committed offset begin at the end
	// of each partition instead of the start (default: start, as Kafka
	// Streams' auto.offset.reset=earliest).
	StartAtLatest bool
	// SessionTimeout is the group session timeout (default 45s). With
	// ExactlyOnce the transaction timeout is kept below it.
	SessionTimeout time.Duration
	// MaxRestores is how many partitions may restore (from a snapshot) or
	// replay at once (default DefaultMaxRestores; the worker's memory
	// budget sets it, internal/budget): each holds ReplayMemoryBytes or a
	// snapshot import's memory. Others wait, paused and not ready.
	MaxRestores int
	// ShutdownTimeout is the longest a stop may take
	// (KDEDUP_SHUTDOWN_TIMEOUT): a stop first finishes every partition's
	// write batch and commits the group's offsets, then uploads the last
	// snapshots within what is left of it (less the client's close
	// wait), and within 30s. 0: the 30s alone.
	ShutdownTimeout time.Duration
	// MetadataMaxAge is the longest time between metadata refreshes
	// (default 30s, kgo.MetadataMaxAge): partitions added to an input topic
	// are assigned within about this long.
	MetadataMaxAge time.Duration
	// Delivery is the delivery guarantee (default AtLeastOnce).
	Delivery Delivery
	// TransactionalID is the transactional id with ExactlyOnce (default:
	// unique to this process: host name, process id and a random suffix).
	TransactionalID string
	// RebuildEmpty starts a partition that has no local state with an empty
	// filter at the group's offset, accepting repeats of keys seen before.
	// By default its filter is rebuilt by replaying the input from the
	// earliest retained offset up to the group's offset, forwarding nothing.
	RebuildEmpty bool
	// FlushInterval is the longest time between write batches of a
	// partition, and the group commit interval (default 1s). It bounds what a
	// crash can forward twice at least once, and what recovery replays.
	FlushInterval time.Duration
	// FlushBytes cuts a write batch early when a partition's dirty pages
	// reach it (default: the store's, dedup.Opener.FlushBytes, what one
	// Badger transaction holds). A larger one is refused by New.
	FlushBytes int64
	// FetchMaxBytes bounds one fetch response of the group client (kgo
	// FetchMaxBytes, Kafka's fetch.max.bytes; default franz-go's 50 MiB):
	// the client buffers up to this much per broker, more only for a
	// record batch larger than it. A memory budget sets it.
	FetchMaxBytes int32
	// MaxDirtyPageBytes bounds the memory the dirty pages of all assigned
	// partitions hold together, outside the page cache (default 8 x
	// FlushBytes; a memory budget sets it, see internal/budget): once
	// they reach it, a partition holding at least half its fair share cuts
	// its write batch at its next record
	// (store.PartitionState.OverDirtyShare), so they stay under 1.5 x
	// this, or store.MinCutPages pages a partition when the partitions
	// are so many that this is less, plus a record's pages per partition.
	// FlushBytes still bounds each partition's write batch.
	MaxDirtyPageBytes int64
	// TransactionInterval (ExactlyOnce) is the longest time a Kafka
	// transaction stays open deciding polled records (default 100ms, as
	// Kafka Streams' commit.interval.ms under exactly-once); it ends
	// earlier when a partition's dirty and staged pages would otherwise
	// pass FlushBytes (txnBudget). FlushInterval if that is shorter.
	TransactionInterval time.Duration
	// Dedup opens the deduplicator of each assigned topic-partition, from
	// the group's callbacks, one partition at a time. The worker asks it,
	// and the deduplicators it opens, which decisions forward
	// (dedup.Deduplicator.Forwards), where a rebuild may start
	// (dedup.Options.RebuildFrom: from the start of the dedup window when
	// the state depends on it alone, else from the earliest retained
	// offset) and how many records one poll of a transaction may add: with
	// ExactlyOnce the bytes left before a partition's dirty and staged
	// pages reach FlushBytes, measured before the poll, divided by the
	// bytes one record can dirty (dedup.Options.MaxDirtyBytesPerRecord),
	// so that a write batch never passes FlushBytes whatever the
	// partitions a poll touches. Its deduplicators must stage their changes
	// (dedup.Options.Staged) with ExactlyOnce and must not without: New
	// returns ErrStaging otherwise.
	Dedup *dedup.Opener
	// Snapshots, when not nil, is where the worker keeps snapshots of its
	// partitions' state, and where a partition without usable local state
	// restores from before replaying only the input after the snapshot
	// (snapshot.go). Nil: state is only local, and a partition moved to a
	// worker without it replays its input from the start of retention.
	Snapshots *snapshot.Store
	// SnapshotInterval is how often each partition's state is snapshotted
	// while it changes (default DefaultSnapshotInterval); it is also
	// snapshotted when revoked and at shutdown.
	SnapshotInterval time.Duration
	// SnapshotKeep is how many snapshots of each partition the store
	// keeps, newest first (default DefaultSnapshotKeep, 3); older ones are
	// deleted.
	SnapshotKeep int
	// Logger receives the worker's and franz-go's logs (default
	// slog.Default()).
	Logger *slog.Logger
	// Registerer receives the worker's metrics (nil: none).
	Registerer prometheus.Registerer
	// ConnOpts are the connection options (TLS, SASL) of every Kafka
	// client the worker creates: the group client and the restore clients
	// that replay a partition's input into its filter.
	ConnOpts []kgo.Opt
	// ClientOpts are appended to the group client's options only (hooks
	// such as plugin/kprom, which registers its metrics once per hook and
	// so cannot be shared with a second client, test settings).
	ClientOpts []kgo.Opt
}

func (o Options) withDefaults() Options {
	if o.Group == "" {
		o.Group = "kdedup"
	}
	if o.SessionTimeout == 0 {
		o.SessionTimeout = 45 * time.Second
	}
	if o.MetadataMaxAge == 0 {
		o.MetadataMaxAge = 30 * time.Second
	}
	if o.FlushInterval == 0 {
		o.FlushInterval = time.Second
	}
	if o.FlushBytes == 0 {
		o.FlushBytes = store.DefaultFlushBytes
		if o.Dedup != nil {
			o.FlushBytes = o.Dedup.FlushBytes()
		}
	}
	if o.MaxDirtyPageBytes == 0 {
		o.MaxDirtyPageBytes = 8 * o.FlushBytes
	}
	if o.TransactionInterval == 0 {
		o.TransactionInterval = DefaultTransactionInterval
	}
	o.TransactionInterval = min(o.TransactionInterval, o.FlushInterval)
	if o.MaxDecompressBytes == 0 {
		o.MaxDecompressBytes = 64 << 20
	}
	if o.TransactionalID == "" && o.Delivery == ExactlyOnce {
		host, _ := os.Hostname()
		o.TransactionalID = fmt.Sprintf("kdedup-%s-%d-%08x", host, os.Getpid(), time.Now().UnixNano()&0xffffffff)
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.SnapshotInterval == 0 {
		o.SnapshotInterval = DefaultSnapshotInterval
	}
	if o.MaxRestores <= 0 {
		o.MaxRestores = DefaultMaxRestores
	}
	if o.SnapshotKeep == 0 {
		o.SnapshotKeep = DefaultSnapshotKeep
	}
	return o
}

// DefaultSnapshotKeep is SnapshotKeep's default: the newest snapshot and
// two older ones to fall back to should it be refused.
const DefaultSnapshotKeep = 3

// DefaultTransactionInterval is TransactionInterval's default: Kafka
// Streams' commit.interval.ms under exactly-once.
const DefaultTransactionInterval = 100 * time.Millisecond

// ErrInvalidOptions is wrapped by Validate's error, and so by New's for
// Options it cannot honour.
var ErrInvalidOptions = errors.New("consumer: invalid options")

// Validate reports every field of o, as given, that New cannot honour, in
// one *optcheck.Error wrapping ErrInvalidOptions, each problem naming the
// field (its Go name: "InputTopics"): a required field missing, a topic
// used for two purposes (an input topic listed twice, or also the output,
// the duplicates or the dead-letter topic), an unknown Delivery, a
// TransactionalID without ExactlyOnce, a negative duration or size. It
// does not apply defaults (New applies them first, then asks Validate and
// checks Dedup against the delivery: ErrStaging), and it does not look at
// Dedup, Snapshots, Logger, Registerer or the client options.
func (o Options) Validate() error {
	l := optcheck.New(ErrInvalidOptions)
	if len(o.Brokers) == 0 {
		l.Add("Brokers", o.Brokers, "must name at least one seed broker")
	}
	if len(o.InputTopics) == 0 {
		l.Add("InputTopics", o.InputTopics, "must name at least one topic")
	}
	seen := map[string]bool{}
	for _, t := range o.InputTopics {
		switch {
		case seen[t]:
			l.Add("InputTopics", o.InputTopics, fmt.Sprintf("topic %q is listed more than once", t))
		case t != "" && t == o.OutputTopic:
			l.Add("InputTopics", o.InputTopics, fmt.Sprintf("topic %q is also the output topic; the worker would read its own output", t))
		}
		seen[t] = true
	}
	if o.OutputTopic == "" {
		l.Add("OutputTopic", o.OutputTopic, "must not be empty")
	}
	if d := o.DuplicatesTopic; d != "" {
		switch {
		case d == o.OutputTopic:
			l.Add("DuplicatesTopic", d, "must differ from the output topic; dropped records would mix with the output")
		case seen[d]:
			l.Add("DuplicatesTopic", d, "is also an input topic; the worker would read the records it dropped")
		}
	}
	if d := o.DeadLetterTopic; d != "" {
		switch {
		case d == o.OutputTopic:
			l.Add("DeadLetterTopic", d, "must differ from the output topic; dead letters would mix with the output")
		case d == o.DuplicatesTopic:
			l.Add("DeadLetterTopic", d, "must differ from the duplicates topic; dead letters would mix with dropped records")
		case seen[d]:
			l.Add("DeadLetterTopic", d, "is also an input topic; the worker would read its own dead letters")
		}
	}
	if r := o.RepartitionTopic; r != "" {
		switch {
		case r == o.OutputTopic:
			l.Add("RepartitionTopic", r, "must differ from the output topic; the output would be read back and deduplicated again")
		case r == o.DuplicatesTopic:
			l.Add("RepartitionTopic", r, "must differ from the duplicates topic; dropped records would be read back")
		case r == o.DeadLetterTopic:
			l.Add("RepartitionTopic", r, "must differ from the dead-letter topic; dead letters would be read back")
		case seen[r]:
			l.Add("RepartitionTopic", r, "is also an input topic; the worker would repartition its own repartitioned records")
		}
	}
	if !o.Delivery.Valid() {
		l.Add("Delivery", o.Delivery, "must be at-least-once or exactly-once")
	}
	if o.TransactionalID != "" && o.Delivery != ExactlyOnce {
		l.Add("TransactionalID", o.TransactionalID, "is only used with exactly-once delivery")
	}
	for _, d := range []struct {
		field string
		v     time.Duration
	}{
		{"SessionTimeout", o.SessionTimeout}, {"ShutdownTimeout", o.ShutdownTimeout}, {"MetadataMaxAge", o.MetadataMaxAge},
		{"FlushInterval", o.FlushInterval}, {"TransactionInterval", o.TransactionInterval}, {"SnapshotInterval", o.SnapshotInterval},
	} {
		if d.v < 0 {
			l.Add(d.field, d.v, "must not be negative")
		}
	}
	if o.FlushBytes < 0 {
		l.Add("FlushBytes", o.FlushBytes, "must not be negative")
	}
	if o.MaxDecompressBytes < 0 {
		l.Add("MaxDecompressBytes", o.MaxDecompressBytes, "must not be negative")
	}
	if o.SnapshotKeep < 0 {
		l.Add("SnapshotKeep", o.SnapshotKeep, "must not be negative")
	}
	return l.Err()
}

// validate is New's check of o (after defaults): Validate's problems and
// the deduplicators' fit with the delivery and the write batches.
func (o Options) validate() error {
	errs := []error{o.Validate()}
	switch {
	case o.Dedup == nil:
		errs = append(errs, errors.New("consumer: Dedup is required"))
	case o.Dedup.Options().Staged != (o.Delivery == ExactlyOnce):
		// Exactly once, changes applied before their transaction commits
		// would outlive an abort; at least once, staged changes would
		// never reach the write batches.
		errs = append(errs, fmt.Errorf("%w: exactly once %t, staged %t", ErrStaging, o.Delivery == ExactlyOnce, o.Dedup.Options().Staged))
	}
	if o.Dedup != nil && o.FlushBytes > o.Dedup.FlushBytes() {
		// The write batches would not fit in one Badger transaction.
		errs = append(errs, fmt.Errorf("consumer: FlushBytes %d is more than the store's %d (store.Options.FlushBytes)", o.FlushBytes, o.Dedup.FlushBytes()))
	}
	return errors.Join(errs...)
}
