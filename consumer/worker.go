package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/plugin/kslog"

	"github.com/kdedup/kdedup/dedup"
)

// Options configure a Worker. Fields without a stated default are required.
type Options struct {
	// Brokers are the seed brokers, host:port.
	Brokers []string
	// InputTopics are consumed as one consumer group.
	InputTopics []string
	// OutputTopic receives forwarded records, partitioned by record key.
	OutputTopic string
	// Group is the consumer group id (default "kdedup").
	Group string
	// StartAtLatest makes a group with no committed offset begin at the end
	// of each partition instead of the start (default: start, as Kafka
	// Streams' auto.offset.reset=earliest).
	StartAtLatest bool
	// SessionTimeout is the group session timeout (default 45s).
	SessionTimeout time.Duration
	// FlushInterval is the longest time between write batches of a
	// partition, and the group commit interval (default 1s). It bounds what a
	// crash can forward twice.
	FlushInterval time.Duration
	// FlushBytes cuts a write batch early when a partition's dirty pages
	// reach it (default 8 MiB). It must fit in one Badger transaction.
	FlushBytes int64
	// Open opens the deduplicator of an assigned topic-partition. It is
	// called from the group's callbacks, one partition at a time.
	Open func(topic string, partition int32) (*dedup.Partition, error)
	// Forwards reports whether a decision's record goes to the output topic
	// (dedup.Options.Forwards).
	Forwards func(dedup.Decision) bool
	// Logger receives the worker's and franz-go's logs (default
	// slog.Default()).
	Logger *slog.Logger
	// Registerer receives the worker's metrics (nil: none).
	Registerer prometheus.Registerer
	// ClientOpts are appended to the franz-go client options (hooks such as
	// plugin/kprom, TLS and SASL, test settings).
	ClientOpts []kgo.Opt
}

func (o Options) withDefaults() Options {
	if o.Group == "" {
		o.Group = "kdedup"
	}
	if o.SessionTimeout == 0 {
		o.SessionTimeout = 45 * time.Second
	}
	if o.FlushInterval == 0 {
		o.FlushInterval = time.Second
	}
	if o.FlushBytes == 0 {
		o.FlushBytes = 8 << 20
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o
}

// pollRecords bounds one poll; the partition goroutines take batches of it.
const pollRecords = 10_000

// Worker is one member of the dedup consumer group. Create it with New and
// call Run once. Ready is safe for concurrent use.
type Worker struct {
	opts Options
	log  *slog.Logger
	m    metrics

	cl    *kgo.Client
	ready atomic.Bool

	mu      sync.Mutex
	parts   map[topicPartition]*partition
	closing bool

	fatalOnce  sync.Once
	fatalErr   error
	cancelPoll context.CancelFunc
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
	if opts.Open == nil || opts.Forwards == nil {
		errs = append(errs, errors.New("consumer: Open and Forwards are required"))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return &Worker{
		opts:  opts,
		log:   opts.Logger,
		m:     newMetrics(opts.Registerer),
		parts: map[topicPartition]*partition{},
	}, nil
}

// Ready reports whether the worker has joined its group and opened the state
// of every partition assigned to it; false again once shutdown begins.
func (w *Worker) Ready() bool { return w.ready.Load() }

// Run consumes until ctx is canceled or a partition fails. On cancellation
// it stops polling, lets every partition finish its write batch, commits the
// group offsets, leaves the group and returns nil. On a partition failure it
// does the same for the healthy partitions and returns the failure.
func (w *Worker) Run(ctx context.Context) error {
	start := kgo.NewOffset().AtStart()
	if w.opts.StartAtLatest {
		start = kgo.NewOffset().AtEnd()
	}
	opts := []kgo.Opt{
		kgo.SeedBrokers(w.opts.Brokers...),
		kgo.ConsumerGroup(w.opts.Group),
		kgo.ConsumeTopics(w.opts.InputTopics...),
		kgo.Balancers(kgo.CooperativeStickyBalancer()),
		kgo.ConsumeResetOffset(start),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.SessionTimeout(w.opts.SessionTimeout),
		kgo.BlockRebalanceOnPoll(),
		kgo.AutoCommitMarks(),
		kgo.AutoCommitInterval(w.opts.FlushInterval),
		kgo.OnPartitionsAssigned(w.assigned),
		kgo.OnPartitionsRevoked(w.revoked),
		kgo.OnPartitionsLost(w.lost),
		kgo.AdjustFetchOffsetsFn(w.adjustOffsets),
		kgo.DefaultProduceTopic(w.opts.OutputTopic),
		kgo.WithLogger(kslog.New(w.log)),
	}
	cl, err := kgo.NewClient(append(opts, w.opts.ClientOpts...)...)
	if err != nil {
		return fmt.Errorf("creating kafka client: %w", err)
	}
	w.cl = cl

	pollCtx, cancel := context.WithCancel(ctx)
	w.mu.Lock()
	w.cancelPoll = cancel
	w.mu.Unlock()
	defer cancel()

	for {
		fetches := cl.PollRecords(pollCtx, pollRecords)
		if fetches.IsClientClosed() || pollCtx.Err() != nil {
			break
		}
		fetches.EachError(func(topic string, partition int32, err error) {
			w.log.Warn("fetch error", "topic", topic, "partition", partition, "err", err)
		})
		fetches.EachPartition(w.dispatch)
		cl.AllowRebalance()
	}
	cl.AllowRebalance()
	return w.shutdown()
}

// dispatch hands a polled batch to its partition's goroutine. It runs with
// rebalances blocked (BlockRebalanceOnPoll), so no partition is revoked while
// its records are handed over.
func (w *Worker) dispatch(p kgo.FetchTopicPartition) {
	if len(p.Records) == 0 {
		return
	}
	w.mu.Lock()
	pw := w.parts[topicPartition{p.Topic, p.Partition}]
	w.mu.Unlock()
	if pw == nil {
		w.log.Error("records for a partition without state; they will be consumed again by its owner", "topic", p.Topic, "partition", p.Partition)
		return
	}
	select {
	case pw.in <- p.Records:
	case <-pw.done:
	}
}

// fail records the first fatal error and stops polling.
func (w *Worker) fail(err error) {
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

func (w *Worker) shutdown() error {
	w.ready.Store(false)
	w.mu.Lock()
	w.closing = true
	all := make(map[string][]int32)
	for tp := range w.parts {
		all[tp.topic] = append(all[tp.topic], tp.partition)
	}
	w.mu.Unlock()

	// Finish every partition's write batch and commit the group offsets
	// before leaving: leaving hands the partitions to other members.
	ctx, cancel := context.WithTimeout(context.Background(), w.opts.SessionTimeout)
	defer cancel()
	w.stopPartitions(all, false)
	if err := w.cl.CommitMarkedOffsets(ctx); err != nil {
		w.log.Warn("committing group offsets at shutdown; the next owner resumes from the Badger checkpoint", "err", err)
	}
	w.cl.Close()
	w.log.Info("left the group")

	w.mu.Lock()
	defer w.mu.Unlock()
	return w.fatalErr
}

func (w *Worker) assigned(_ context.Context, _ *kgo.Client, assigned map[string][]int32) {
	w.mu.Lock()
	closing := w.closing
	w.mu.Unlock()
	if closing {
		return
	}
	for topic, partitions := range assigned {
		for _, p := range partitions {
			d, err := w.opts.Open(topic, p)
			if err != nil {
				w.fail(err)
				continue
			}
			pw := newPartition(w, topic, p, d)
			w.mu.Lock()
			w.parts[topicPartition{topic, p}] = pw
			w.mu.Unlock()
			go pw.run()
			w.m.assigned.Inc()
			w.log.Info("partition assigned", "topic", topic, "partition", p)
		}
	}
	w.ready.Store(true)
}

// adjustOffsets resumes each newly assigned partition from its Badger
// checkpoint when it has one that differs from the group's committed offset.
// Ahead: the records in between were forwarded and acknowledged, and the
// worker stopped before the group commit. Behind: they were processed by
// another member; they are replayed into the filter without being forwarded.
// A partition without local state starts at the group's offset with an empty
// filter: it may forward repeats of keys seen before that offset, never
// drop a record.
func (w *Worker) adjustOffsets(_ context.Context, offsets map[string]map[int32]kgo.Offset) (map[string]map[int32]kgo.Offset, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for topic, ps := range offsets {
		for p, o := range ps {
			pw := w.parts[topicPartition{topic, p}]
			if pw == nil {
				continue
			}
			cp, ok := pw.d.Checkpoint()
			if !ok {
				continue
			}
			group := o.EpochOffset().Offset // negative: no committed offset
			switch {
			case group < 0 || cp.Offset > group:
				ps[p] = kgo.NewOffset().At(cp.Offset).WithEpoch(cp.LeaderEpoch)
				w.log.Info("resuming from the local checkpoint", "topic", topic, "partition", p, "offset", cp.Offset, "group_offset", group)
			case cp.Offset < group:
				// Another member processed [cp, group) meanwhile. Resuming
				// at group with this state could drop a key deleted in the
				// gap; replaying the gap without forwarding makes the state
				// what it would be had this worker never stopped.
				ps[p] = kgo.NewOffset().At(cp.Offset).WithEpoch(cp.LeaderEpoch)
				pw.replayUntil = group
				w.log.Info("replaying the records processed elsewhere since the local checkpoint (state only, nothing forwarded)",
					"topic", topic, "partition", p, "offset", cp.Offset, "group_offset", group)
			}
		}
	}
	return offsets, nil
}

// revoked finishes and commits the revoked partitions' write batches, then
// commits their group offsets before the partitions move.
func (w *Worker) revoked(ctx context.Context, cl *kgo.Client, revoked map[string][]int32) {
	if n := w.stopPartitions(revoked, false); n == 0 {
		return
	}
	if err := cl.CommitMarkedOffsets(ctx); err != nil {
		w.log.Warn("committing group offsets on revocation; the next owner may repeat up to one flush interval", "err", err)
	}
}

// lost drops the lost partitions' uncommitted state: another member may
// already own them, so nothing of theirs may be committed.
func (w *Worker) lost(_ context.Context, _ *kgo.Client, lost map[string][]int32) {
	w.stopPartitions(lost, true)
}

// stopPartitions stops the goroutines of the given partitions and waits for
// them: abort drops uncommitted state, otherwise each finishes its queued
// records and commits a last write batch. It returns how many it stopped.
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
	assigned      prometheus.Gauge
	produceErrors prometheus.Counter
	batches       prometheus.Counter
	replayed      prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) metrics {
	f := promauto.With(reg)
	return metrics{
		assigned: f.NewGauge(prometheus.GaugeOpts{Name: "kdedup_partitions_assigned", Help: "Topic-partitions this worker owns."}),
		produceErrors: f.NewCounter(prometheus.CounterOpts{Name: "kdedup_produce_errors_total",
			Help: "Forwarded records the output topic did not acknowledge (each stops the worker without committing)."}),
		batches: f.NewCounter(prometheus.CounterOpts{Name: "kdedup_write_batches_total", Help: "Write batches committed to Badger."}),
		replayed: f.NewCounter(prometheus.CounterOpts{Name: "kdedup_replayed_records_total",
			Help: "Records applied to the filter without forwarding, to catch up with offsets another member processed."}),
	}
}
