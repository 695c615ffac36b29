package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/plugin/kslog"

	"github.com/kdedup/kdedup/dedup"
	"github.com/kdedup/kdedup/store"
)

// Delivery is the delivery guarantee of forwarded records.
type Delivery uint8

const (
	// AtLeastOnce produces forwarded records, and commits the filter state
	// and offsets after their acks: a crash forwards again at most the
	// records of one flush interval.
	AtLeastOnce Delivery = iota
	// ExactlyOnce produces forwarded records and commits input offsets in
	// one Kafka transaction (franz-go GroupTransactSession, KIP-447
	// fencing); filter changes are staged until the transaction commits and
	// reach Badger after it.
	ExactlyOnce
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
	// MaxRecordBytes returns the max.message.bytes of a topic the worker
	// produces to (OutputTopic, DuplicatesTopic, DeadLetterTopic), in
	// bytes: a record whose batch of its own (recordBatchBytes, before
	// compression) is larger is a dead letter instead of a produce error,
	// and the producer's batches to the topic are bounded by it. It is
	// called with "" too, for the client's default. Nil: 1,048,588 bytes
	// (DefaultMaxRecordBytes) for every topic.
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
	// reach it (default 8 MiB). It must fit in one Badger transaction.
	FlushBytes int64
	// Dedup opens the deduplicator of each assigned topic-partition, from
	// the group's callbacks, one partition at a time. The worker asks it,
	// and the deduplicators it opens, which decisions forward
	// (dedup.Partition.Forwards), where a rebuild may start
	// (dedup.Options.RebuildFrom: from the start of the dedup window when
	// the state depends on it alone, else from the earliest retained
	// offset) and how many records one transaction may hold: with
	// ExactlyOnce at most FlushBytes/2 divided by the bytes one record can
	// dirty (dedup.Options.MaxDirtyBytesPerRecord), so that the pages a
	// transaction dirties fit in half a write batch whatever the partitions
	// it touches. Its deduplicators must stage their changes
	// (dedup.Options.Staged) with ExactlyOnce and must not without: New
	// returns ErrStaging otherwise.
	Dedup *dedup.Opener
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
	}
	if o.MaxDecompressBytes == 0 {
		o.MaxDecompressBytes = 64 << 20
	}
	if o.TransactionalID == "" {
		host, _ := os.Hostname()
		o.TransactionalID = fmt.Sprintf("kdedup-%s-%d-%08x", host, os.Getpid(), time.Now().UnixNano()&0xffffffff)
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o
}

// pollRecords bounds one poll at least once; the partition goroutines take
// batches of it.
const pollRecords = 10_000

// Worker is one member of the dedup consumer group. Create it with New and
// call Run once. Ready is safe for concurrent use.
type Worker struct {
	opts Options
	log  *slog.Logger
	m    metrics

	// cl and sess are the Kafka session of the current connect. They are
	// written by connect while no group callback can run yet, and read by
	// the poll loop; callbacks, which franz-go may start before the
	// constructor returns, read them through client() once published.
	cl        *kgo.Client
	sess      *kgo.GroupTransactSession // ExactlyOnce only
	connected chan struct{}             // closed once cl and sess are set
	ready     atomic.Bool
	restoring atomic.Int64 // partitions replaying input into their filter
	fatal     atomic.Bool  // fail was called: never ready again
	// revokedSinceEnd (exactly once): a revocation or a loss reached the
	// callbacks since the session's last End. GroupTransactSession calls
	// them only once until End, so an idle session must End to hear of
	// the next one (transactLoop).
	revokedSinceEnd atomic.Bool

	// mu guards parts, closing, fatalErr, cancelPoll and connected.
	mu      sync.Mutex
	parts   map[topicPartition]*partition
	closing bool

	rejections   txnRejections    // exactly once: records refused by the broker
	skippedInTxn []topicPartition // exactly once: batches skipped in the current transaction

	fatalOnce  sync.Once
	fatalErr   error
	cancelPoll context.CancelFunc

	live *liveness
}

type topicPartition struct {
	topic     string
	partition int32
}

// New checks opts and returns a Worker; it does not connect yet.
func New(opts Options) (*Worker, error) {
	opts = opts.withDefaults()
	var errs []error
	if len(opts.Brokers) == 0 {
		errs = append(errs, errors.New("consumer: no brokers"))
	}
	if len(opts.InputTopics) == 0 {
		errs = append(errs, errors.New("consumer: no input topics"))
	}
	if opts.OutputTopic == "" {
		errs = append(errs, errors.New("consumer: no output topic"))
	}
	if d := opts.DuplicatesTopic; d != "" && (d == opts.OutputTopic || slices.Contains(opts.InputTopics, d)) {
		errs = append(errs, fmt.Errorf("consumer: duplicates topic %q is also the output topic or an input topic", d))
	}
	if d := opts.DeadLetterTopic; d != "" && (d == opts.OutputTopic || d == opts.DuplicatesTopic || slices.Contains(opts.InputTopics, d)) {
		errs = append(errs, fmt.Errorf("consumer: dead-letter topic %q is also the output, the duplicates or an input topic", d))
	}
	switch {
	case opts.Dedup == nil:
		errs = append(errs, errors.New("consumer: Dedup is required"))
	case opts.Dedup.Options().Staged != (opts.Delivery == ExactlyOnce):
		// Exactly once, changes applied before their transaction commits
		// would outlive an abort; at least once, staged changes would
		// never reach the write batches.
		errs = append(errs, fmt.Errorf("%w: exactly once %t, staged %t", ErrStaging, opts.Delivery == ExactlyOnce, opts.Dedup.Options().Staged))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	w := &Worker{
		opts:  opts,
		log:   opts.Logger,
		parts: map[topicPartition]*partition{},
		live:  newLiveness(),
	}
	w.rejections.known = map[recordTarget]rejection{}
	w.rejections.isolated = map[recordTarget]bool{}
	w.m = newMetrics(opts.Registerer, w)
	return w, nil
}

// Ready reports whether the worker has joined its group, opened the state of
// every partition assigned to it and finished replaying their input (a
// rebuild or a catch-up is not ready, so that a rolling update waits for
// it); false again once shutdown begins or a fatal error stops it.
func (w *Worker) Ready() bool {
	if !w.ready.Load() || w.fatal.Load() || w.restoring.Load() != 0 {
		return false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, pw := range w.parts {
		if !pw.planned.Load() { // assigned, and not yet known whether it must replay
			return false
		}
	}
	return true
}

// client returns the group client of the current connect, waiting until
// connect has published it: franz-go may run group callbacks before
// kgo.NewClient returns.
func (w *Worker) client() *kgo.Client {
	w.mu.Lock()
	c := w.connected
	w.mu.Unlock()
	<-c
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.cl
}

// Run consumes until ctx is canceled or a partition fails. On cancellation
// it stops polling, lets every partition finish its write batch, commits the
// group offsets, leaves the group and returns nil. On a partition failure it
// does the same for the healthy partitions and returns the failure.
func (w *Worker) Run(ctx context.Context) error {
	pollCtx, cancel := context.WithCancel(ctx)
	w.mu.Lock()
	w.cancelPoll = cancel
	w.mu.Unlock()
	defer cancel()
	for {
		if err := w.connect(); err != nil {
			return err
		}
		if w.sess == nil {
			w.pollLoop(pollCtx)
		} else if err := w.transactLoop(pollCtx); err != nil && pollCtx.Err() == nil {
			// The transactional producer is unusable (fenced, or an
			// unconfirmed end): commit what the committed transactions
			// changed, leave, and start a new session, as a restarted
			// process would.
			w.log.Warn("restarting the Kafka session", "err", err)
			w.m.sessionRestarts.Inc()
			w.cl.AllowRebalance()
			w.release()
			w.cl.Close()
			select {
			case <-pollCtx.Done():
				return w.shutdown()
			case <-time.After(time.Second):
			}
			continue
		}
		w.cl.AllowRebalance()
		return w.shutdown()
	}
}

// connect creates the Kafka client (a GroupTransactSession exactly once).
func (w *Worker) connect() error {
	connected := make(chan struct{})
	w.mu.Lock()
	w.connected = connected
	w.mu.Unlock()
	opts := append(w.opts.GroupClientOpts(),
		kgo.OnPartitionsAssigned(w.assigned),
		kgo.OnPartitionsRevoked(w.revoked),
		kgo.OnPartitionsLost(w.lost),
		kgo.AdjustFetchOffsetsFn(w.adjustOffsets),
		kgo.ProducerBatchMaxBytesFn(func(topic string) int32 { return producerBatchMaxBytes(w.maxRecordBytes(topic)) }),
		kgo.WithLogger(kslog.New(w.log)),
	)
	if w.opts.Delivery == ExactlyOnce {
		sess, err := kgo.NewGroupTransactSession(w.clientOpts(opts)...)
		if err != nil {
			return fmt.Errorf("creating kafka transactional client: %w", err)
		}
		w.publish(sess, sess.Client())
		return nil
	}
	cl, err := kgo.NewClient(w.clientOpts(opts)...)
	if err != nil {
		return fmt.Errorf("creating kafka client: %w", err)
	}
	w.publish(nil, cl)
	return nil
}

func (w *Worker) clientOpts(opts []kgo.Opt) []kgo.Opt {
	return append(append(opts, w.opts.ConnOpts...), w.opts.ClientOpts...)
}

// publish makes the session of a connect visible to group callbacks.
func (w *Worker) publish(sess *kgo.GroupTransactSession, cl *kgo.Client) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.sess, w.cl = sess, cl
	close(w.connected)
}

// pollLoop is the at-least-once loop: poll and hand records to the
// partition goroutines, which produce, flush and mark offsets themselves.
func (w *Worker) pollLoop(ctx context.Context) {
	for {
		fetches := w.poll(ctx)
		if fetches.IsClientClosed() || ctx.Err() != nil {
			return
		}
		w.logFetchErrors(fetches)
		fetches.EachPartition(w.observeHighWatermark)
		fetches = w.skipRecords(fetches)
		fetches.EachPartition(w.dispatch)
		w.cl.AllowRebalance()
	}
}

func (w *Worker) logFetchErrors(fetches kgo.Fetches) {
	fetches.EachError(func(topic string, partition int32, err error) {
		if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
			w.log.Warn("fetch error", "topic", topic, "partition", partition, "err", err)
		}
	})
}

// dispatch hands a polled batch to its partition's goroutine. It runs with
// rebalances blocked (BlockRebalanceOnPoll), so no partition is revoked while
// its records are handed over.
func (w *Worker) dispatch(p kgo.FetchTopicPartition) {
	if len(p.Records) == 0 {
		return
	}
	pw := w.partition(p.Topic, p.Partition)
	if pw == nil {
		w.log.Error("records for a partition without state; they will be consumed again by its owner", "topic", p.Topic, "partition", p.Partition)
		return
	}
	select {
	case pw.in <- p.Records:
	case <-pw.done:
	}
}

// observeHighWatermark records the partition's high watermark for the
// lag metric, also from fetches that carry no records.
func (w *Worker) observeHighWatermark(p kgo.FetchTopicPartition) {
	if p.HighWatermark < 0 {
		return
	}
	if pw := w.partition(p.Topic, p.Partition); pw != nil {
		pw.highWatermark.Store(p.HighWatermark)
	}
}

func (w *Worker) partition(topic string, p int32) *partition {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.parts[topicPartition{topic, p}]
}

// fail records the first fatal error and stops polling.
func (w *Worker) fail(err error) {
	w.fatal.Store(true)
	w.fatalOnce.Do(func() {
		w.log.Error("stopping the worker", "err", err)
		w.mu.Lock()
		w.fatalErr = err
		cancel := w.cancelPoll
		w.mu.Unlock()
		if cancel != nil {
			cancel()
		}
	})
}

// release stops every partition, each finishing its write batch.
func (w *Worker) release() {
	w.ready.Store(false)
	w.mu.Lock()
	all := make(map[string][]int32)
	for tp := range w.parts {
		all[tp.topic] = append(all[tp.topic], tp.partition)
	}
	w.mu.Unlock()
	w.stopPartitions(all, false)
}

func (w *Worker) shutdown() error {
	w.live.stop("stopping partitions (finishing their write batches)")
	w.mu.Lock()
	w.closing = true
	w.mu.Unlock()

	// Finish every partition's write batch and commit the group offsets
	// before leaving: leaving hands the partitions to other members.
	ctx, cancel := context.WithTimeout(context.Background(), w.opts.SessionTimeout)
	defer cancel()
	w.release()
	if w.sess == nil {
		w.live.stamp("committing group offsets")
		if err := w.cl.CommitMarkedOffsets(ctx); err != nil {
			w.log.Warn("committing group offsets at shutdown; the next owner resumes from the Badger checkpoint", "err", err)
		}
	}
	w.live.stamp("closing the Kafka client (leaving the group)")
	w.closeClient()
	if w.opts.InstanceID != "" {
		w.log.Info("closed; as a static member the worker stays in the group until the session timeout, so a restart with the same instance id resumes its partitions without a rebalance",
			"instance_id", w.opts.InstanceID, "session_timeout", w.opts.SessionTimeout)
	} else {
		w.log.Info("left the group")
	}

	w.mu.Lock()
	defer w.mu.Unlock()
	return w.fatalErr
}

func (w *Worker) assigned(_ context.Context, cl *kgo.Client, assigned map[string][]int32) {
	w.mu.Lock()
	closing := w.closing
	w.mu.Unlock()
	if closing {
		return
	}
	// A partition paused for a replay that a revocation interrupted stays
	// paused in the client; adjustOffsets pauses again what must replay.
	cl.ResumeFetchPartitions(assigned)
	for topic, partitions := range assigned {
		for _, p := range partitions {
			d, err := w.opts.Dedup.Open(topic, p)
			if err != nil {
				w.fail(err)
				continue
			}
			pw := newPartition(w, cl, topic, p, d)
			w.mu.Lock()
			w.parts[topicPartition{topic, p}] = pw
			w.mu.Unlock()
			if w.opts.Delivery == AtLeastOnce {
				go pw.run()
			}
			w.m.assigned.Inc()
			w.log.Info("partition assigned", "topic", topic, "partition", p)
		}
	}
	w.ready.Store(true)
}

// adjustOffsets chooses where each newly assigned partition starts, from
// its Badger checkpoint and the group's committed offset:
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
	var (
		starts kadm.ListedOffsets
		seen   groupOffsets
		cl     = w.client()
		adm    = kadm.NewClient(cl)
	)
	for topic, ps := range offsets {
		for p, o := range ps {
			pw := w.partition(topic, p)
			if pw == nil {
				continue
			}
			start, err := w.plan(ctx, cl, adm, &starts, &seen, pw, o)
			pw.planned.Store(true) // after a replay began: readiness never sees a gap
			if err != nil {
				return nil, err
			}
			ps[p] = start
		}
	}
	return offsets, nil
}

// plan returns where pw starts in the group client, given the group's
// committed offset o, and starts its replay when it needs one (see
// adjustOffsets). starts caches the input's start offsets, seen the topics
// the group has committed offsets for.
func (w *Worker) plan(ctx context.Context, cl *kgo.Client, adm *kadm.Client, starts *kadm.ListedOffsets, seen *groupOffsets, pw *partition, o kgo.Offset) (kgo.Offset, error) {
	topic, p := pw.topic, pw.partition
	group := o.EpochOffset().Offset // negative: no committed offset
	cp, ok := pw.d.Checkpoint()
	from := int64(-1)
	switch {
	case ok && (group < 0 || cp.Offset >= group):
		if cp.Offset != group {
			w.log.Info("resuming from the local checkpoint", "topic", topic, "partition", p, "offset", cp.Offset, "group_offset", group)
		}
		if group >= 0 && cp.Offset > group && w.opts.Delivery == AtLeastOnce {
			// Fetch from the group's offset, which franz-go takes as
			// committed, and skip what the checkpoint covers (process):
			// the first write batch then commits the checkpoint to the
			// group, even if no record follows. Starting at the
			// checkpoint instead made franz-go take it as committed, and
			// the group's offset stayed behind until the next record.
			pw.flushed = store.Checkpoint{Offset: group, LeaderEpoch: -1}
			return o, nil
		}
		return kgo.NewOffset().At(cp.Offset).WithEpoch(cp.LeaderEpoch), nil
	case group < 0: // nothing committed, no state: start empty
		if w.opts.StartAtLatest && seen.topicCommitted(ctx, w, adm, topic) {
			w.log.Info("partition added since the group started: reading it from the start, not KDEDUP_START_OFFSET=latest", "topic", topic, "partition", p)
			return kgo.NewOffset().AtStart(), nil
		}
		return o, nil
	case ok:
		from = cp.Offset
	case w.opts.RebuildEmpty:
		w.log.Info("no local state: starting with an empty filter (KDEDUP_REBUILD=empty)", "topic", topic, "partition", p, "group_offset", group)
		return o, nil
	default:
		var err error
		if from, err = w.windowStart(ctx, adm, topic, p, group); err != nil {
			return o, err
		}
	}
	if *starts == nil {
		var err error
		if *starts, err = adm.ListStartOffsets(ctx, w.opts.InputTopics...); err != nil {
			return o, fmt.Errorf("listing start offsets to plan a replay: %w", err)
		}
	}
	if s, found := starts.Lookup(topic, p); found && s.Err == nil && s.Offset > from {
		w.m.partialRebuilds.Inc()
		w.log.Warn("replay is partial: the input before the earliest retained offset is gone, so keys first seen there are not in the filter and deletes there are not applied",
			"topic", topic, "partition", p, "lost_from", from, "lost_to", s.Offset)
		from = s.Offset
	}
	if from < group {
		// The group client starts at the group's offset (o, unchanged)
		// but fetches nothing until the replay has caught up.
		cl.PauseFetchPartitions(map[string][]int32{topic: {p}})
		pw.startReplay(cl, from, group)
	}
	return o, nil
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
func (w *Worker) windowStart(ctx context.Context, adm *kadm.Client, topic string, p int32, group int64) (int64, error) {
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

// revoked finishes and commits the revoked partitions' write batches, then
// commits their group offsets before the partitions move.
func (w *Worker) revoked(ctx context.Context, cl *kgo.Client, revoked map[string][]int32) {
	if w.opts.Delivery == ExactlyOnce {
		w.revokedSinceEnd.Store(true)
	}
	if n := w.stopPartitions(revoked, false); n == 0 || w.opts.Delivery == ExactlyOnce {
		return
	}
	if err := cl.CommitMarkedOffsets(ctx); err != nil {
		w.log.Warn("committing group offsets on revocation; the next owner may repeat up to one flush interval", "err", err)
	}
}

// lost stops the partitions of a group session that ended without a
// revocation (the session expired during a broker outage, or the member was
// fenced): another member may own them already, so they decide nothing
// more and commit nothing to the group. At least once each keeps, in its
// Badger checkpoint, what it forwarded and had acknowledged (settle), so
// that this worker regaining it after an outage resumes there instead of
// forwarding those records again; exactly once the uncommitted transaction
// state is dropped and the gap replayed.
func (w *Worker) lost(_ context.Context, _ *kgo.Client, lost map[string][]int32) {
	if w.opts.Delivery == ExactlyOnce {
		w.revokedSinceEnd.Store(true)
	}
	n := w.stopPartitions(lost, true)
	w.m.partitionsLost.Add(float64(n))
}

// stopPartitions stops the given partitions and waits for them: abort (a
// lost session) decides nothing more, keeping at least once what was
// forwarded and acknowledged (partition.settle) and dropping exactly once
// the uncommitted state; otherwise each finishes its queued records and
// commits a last write batch. It returns how many it stopped.
func (w *Worker) stopPartitions(tps map[string][]int32, abort bool) int {
	var stopping []*partition
	w.mu.Lock()
	for topic, ps := range tps {
		for _, p := range ps {
			tp := topicPartition{topic, p}
			if pw := w.parts[tp]; pw != nil {
				delete(w.parts, tp)
				stopping = append(stopping, pw)
			}
		}
	}
	w.mu.Unlock()
	for _, pw := range stopping {
		pw.stop(abort)
	}
	for _, pw := range stopping {
		<-pw.done
		w.m.assigned.Dec()
		w.log.Info("partition released", "topic", pw.topic, "partition", pw.partition, "lost", abort)
	}
	return len(stopping)
}

type metrics struct {
	assigned        prometheus.Gauge
	restoring       prometheus.Gauge
	replaySeconds   prometheus.Histogram
	partialRebuilds prometheus.Counter
	produceErrors   prometheus.Counter
	batches         prometheus.Counter
	batchRecords    prometheus.Histogram
	batchBytes      prometheus.Histogram
	txns            *prometheus.CounterVec
	txnSeconds      prometheus.Histogram
	sessionRestarts prometheus.Counter
	partitionsLost  prometheus.Counter
	deadLetters     *prometheus.CounterVec
}

// newMetrics registers the worker's metrics with reg (nil: none), among
// them the per-partition lag and replay gauges that w's partitions report
// at each scrape.
func newMetrics(reg prometheus.Registerer, w *Worker) metrics {
	f := promauto.With(reg)
	f.NewGaugeFunc(prometheus.GaugeOpts{Name: "kdedup_worker_ready",
		Help: "1 when the worker has joined its group and opened the state of every partition assigned to it (what /readyz answers), 0 otherwise."},
		func() float64 {
			if w.Ready() {
				return 1
			}
			return 0
		})
	if reg != nil {
		reg.MustRegister(newPartitionCollector(w))
	}
	m := metrics{
		assigned:  f.NewGauge(prometheus.GaugeOpts{Name: "kdedup_partitions_assigned", Help: "Topic-partitions this worker owns."}),
		restoring: f.NewGauge(prometheus.GaugeOpts{Name: "kdedup_partitions_restoring", Help: "Partitions replaying input into their filter before forwarding again."}),
		replaySeconds: f.NewHistogram(prometheus.HistogramOpts{Name: "kdedup_replay_duration_seconds",
			Help: "Time from assignment to the end of a partition's replay.", Buckets: prometheus.ExponentialBuckets(0.01, 4, 10)}),
		partialRebuilds: f.NewCounter(prometheus.CounterOpts{Name: "kdedup_partial_rebuilds_total",
			Help: "Replays that could not start where they had to because the input was no longer retained."}),
		produceErrors: f.NewCounter(prometheus.CounterOpts{Name: "kdedup_produce_errors_total",
			Help: "Produce attempts the output, duplicates or dead-letter topic did not acknowledge (a record refused by the broker is produced again alone, then dead-lettered; other errors stop the worker at least once and abort the transaction exactly once)."}),
		batches: f.NewCounter(prometheus.CounterOpts{Name: "kdedup_write_batches_total", Help: "Write batches committed to Badger."}),
		batchRecords: f.NewHistogram(prometheus.HistogramOpts{Name: "kdedup_write_batch_records",
			Help: "Input records (decided or replayed) covered by one committed write batch.", Buckets: prometheus.ExponentialBuckets(1, 4, 11)}),
		batchBytes: f.NewHistogram(prometheus.HistogramOpts{Name: "kdedup_write_batch_bytes",
			Help: "Filter page bytes written by one committed write batch (its dirty pages; chain metadata and checkpoint not included).", Buckets: prometheus.ExponentialBuckets(4096, 4, 9)}),
		txns: f.NewCounterVec(prometheus.CounterOpts{Name: "kdedup_transactions_total",
			Help: "Kafka transactions ended, by outcome (committed, aborted); exactly-once only."}, []string{"outcome"}),
		txnSeconds: f.NewHistogram(prometheus.HistogramOpts{Name: "kdedup_transaction_commit_seconds",
			Help:    "Time from the end of a transaction's decisions to its commit: acks of its produced records, then EndTxn with the input offsets; exactly-once only, aborted transactions not observed.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 15)}),
		partitionsLost: f.NewCounter(prometheus.CounterOpts{Name: "kdedup_partitions_lost_total",
			Help: "Partitions lost with their group session (expired during a broker outage, or fenced) instead of revoked by a rebalance."}),
		sessionRestarts: f.NewCounter(prometheus.CounterOpts{Name: "kdedup_session_restarts_total",
			Help: "Kafka client sessions restarted after the transactional producer became unusable (fenced); exactly-once only."}),
		deadLetters: f.NewCounterVec(prometheus.CounterOpts{Name: "kdedup_dead_letter_records_total",
			Help: "Records acknowledged by the dead-letter topic, by reason (too-large, invalid, decompress-too-large); exactly once, those of an aborted transaction are counted again when decided again."}, []string{"reason"}),
	}
	if w.opts.DeadLetterTopic != "" {
		for _, r := range []string{ReasonTooLarge, ReasonInvalid, ReasonDecompressTooLarge} {
			m.deadLetters.WithLabelValues(r)
		}
	}
	if w.opts.Delivery == ExactlyOnce {
		// Both outcomes from the start, so that an increase from 0 shows.
		m.txns.WithLabelValues("committed")
		m.txns.WithLabelValues("aborted")
	}
	return m
}

// partitionCollector reports the lag and replay progress of the worker's
// partitions as they are at scrape time, so that a partition released
// leaves no stale series and a stalled one keeps reporting its lag.
type partitionCollector struct {
	w               *Worker
	lag, replayLeft *prometheus.Desc
}

func newPartitionCollector(w *Worker) partitionCollector {
	tp := []string{"topic", "partition"}
	return partitionCollector{
		w: w,
		lag: prometheus.NewDesc("kdedup_consumer_lag_records",
			"Records between the partition's high watermark (as of its latest fetch) and the next offset to decide; reported once the partition has decided a record or resumed from a checkpoint.",
			tp, nil),
		replayLeft: prometheus.NewDesc("kdedup_replay_remaining_records",
			"Offsets the partition still has to replay into its filter before forwarding again (0 when not replaying).",
			tp, nil),
	}
}

func (c partitionCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.lag
	ch <- c.replayLeft
}

func (c partitionCollector) Collect(ch chan<- prometheus.Metric) {
	c.w.mu.Lock()
	defer c.w.mu.Unlock()
	for tp, pw := range c.w.parts {
		p := strconv.Itoa(int(tp.partition))
		ch <- prometheus.MustNewConstMetric(c.replayLeft, prometheus.GaugeValue, float64(pw.replayLeft.Load()), tp.topic, p)
		hw, next := pw.highWatermark.Load(), pw.nextOffset.Load()
		if hw >= 0 && next >= 0 {
			ch <- prometheus.MustNewConstMetric(c.lag, prometheus.GaugeValue, float64(max(0, hw-next)), tp.topic, p)
		}
	}
}
