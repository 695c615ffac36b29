package consumer

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/plugin/kslog"

	"github.com/kdedup/kdedup/store"
)

// Worker is one member of the dedup consumer group. Create it with New and
// call Run once. Ready, Progress and Stopping are safe for concurrent use.
//
// Its fields fall in four groups by who may touch them: set by New and
// read-only after; atomics, for any goroutine; guarded by mu; and owned by
// the goroutine running Run (the poll or transaction loop, and shutdown).
type Worker struct {
	// Set by New, read-only after.
	opts Options
	mode mode // what the delivery mode does differently (delivery.go)
	log  *slog.Logger
	m    metrics
	live *liveness // its own lock

	// cl and sess are the Kafka session of the current connect: publish
	// writes them under mu, from the goroutine running Run, before that
	// goroutine polls. That goroutine then reads them without the lock,
	// and so do the partitions for records it handed them (ordered by the
	// hand-over); group callbacks, which franz-go may start before the
	// constructor returns, read them only through client(), which waits
	// for connected.
	cl   *kgo.Client
	sess *kgo.GroupTransactSession // ExactlyOnce only

	// ready: the group's assignment was complete once since this
	// session joined (ready.go); joining: the client whose group
	// awaitCompleteAssignment watches.
	ready   atomic.Bool
	joining atomic.Pointer[kgo.Client]
	// checkedParams: the client whose group checkGroupParams has asked.
	checkedParams atomic.Pointer[kgo.Client]
	// unplanned counts assigned partitions whose start adjustOffsets has
	// not decided yet (partitionWorker.settlePlan).
	unplanned atomic.Int64
	restoring atomic.Int64 // partitions replaying input into their filter
	// restoreSlots holds a token per restore or replay running
	// (Options.MaxRestores).
	restoreSlots chan struct{}
	// hooks are set by tests only, before the worker runs.
	hooks struct {
		// beforeImport runs on a restore goroutine once a snapshot is
		// downloaded, before its import; importing once its import has
		// handed over its first page.
		beforeImport, importing func(*partitionWorker)
	}
	fatal atomic.Bool // fail was called: never ready again
	// revokedSinceEnd (exactly once): a revocation or a loss reached the
	// callbacks since the session's last End. GroupTransactSession calls
	// them only once until End, so an idle session must End to hear of
	// the next one (transactLoop).
	revokedSinceEnd atomic.Bool
	// consolidating is held by the one partition whose idle consolidation
	// step runs (partitionWorker.consolidateIdle): background work, one
	// at a time.
	consolidating atomic.Bool

	// mu guards the fields inside it, and the writes of cl and sess
	// (publish). It is held only to read and write these (and, in
	// assignedGauges, to read the partitions' atomics), never across a
	// partition stop, a Kafka request or a send on a channel.
	mu struct {
		sync.Mutex
		connected  chan struct{} // closed once cl and sess are set; a new one each connect
		parts      map[store.TopicPartition]*partitionWorker
		closing    bool // shutdown began: assigned opens no more partitions
		fatalErr   error
		cancelPoll context.CancelFunc
		// plansStopped: release has begun in this session, so
		// adjustOffsets plans no partition and assigned opens none until
		// the next connect; cancelPlans cancels the plan running
		// (adjustOffsets).
		plansStopped bool
		cancelPlans  context.CancelFunc
	}
	// planning counts the running plans (at most one: franz-go's group
	// goroutine).
	planning sync.WaitGroup

	fatalOnce sync.Once // fail records the first error and cancels polling once

	// Exactly once, the transaction loop's (the goroutine running Run):
	// the batches skipped in the current transaction (skipRecords,
	// endTxnSkips); the records refused by the broker, across
	// transactions (its own lock: produce callbacks add to it); and the
	// bytes produced to each topic since the client's buffer was last
	// empty (boundBatches).
	txn struct {
		skipped    []store.TopicPartition
		rejections txnRejections
		batchBytes map[string]int
	}

	// How the client of the current connect compresses (nil: it does
	// not), written by connect (setCompressor) before the partitions see
	// records; batchesRaised tells franz-go's goroutines whether its batch
	// bound is raised (exactly once with compression, compressed.go).
	compressor    kgo.Compressor
	batchesRaised atomic.Bool
	// At least once: the producer of records that fit only compressed.
	large largeProducer
	// snaps uploads and restores snapshots (nil: Options.Snapshots is
	// nil); stopSnaps ends its loop and snapsDone is closed when it has.
	snaps     *snapshotter
	stopSnaps context.CancelFunc
	snapsDone chan struct{}
	// released (owned by the goroutine running Run) are the partitions
	// release stopped, whose last snapshots shutdown uploads after the
	// group commit.
	released []*partitionWorker
}

// New checks opts and returns a Worker; it does not connect yet.
func New(opts Options) (*Worker, error) {
	opts = opts.withDefaults()
	if err := opts.validate(); err != nil {
		return nil, err
	}
	w := &Worker{
		opts: opts,
		log:  opts.Logger,
		live: newLiveness(),

		restoreSlots: make(chan struct{}, opts.MaxRestores),
	}
	w.mu.parts = map[store.TopicPartition]*partitionWorker{}
	w.txn.rejections.known = map[recordTarget]rejection{}
	w.txn.rejections.isolated = map[recordTarget]bool{}
	w.txn.batchBytes = map[string]int{}
	w.m = newMetrics(opts.Registerer, w)
	w.mode = newMode(w, opts.Delivery)
	if opts.Snapshots != nil {
		w.snaps = newSnapshotter(w, opts.Registerer)
	}
	return w, nil
}

// Ready reports whether the worker has joined its group, opened the state of
// every partition assigned to it and finished replaying their input (a
// rebuild or a catch-up is not ready, so that a rolling update waits for
// it); false again once shutdown begins or a fatal error stops it. It
// reads atomics only, never a lock: the kdedup_worker_ready gauge calls it
// while the registry gathers the other collectors.
func (w *Worker) Ready() bool {
	return w.ready.Load() && !w.fatal.Load() && w.restoring.Load() == 0 && w.unplanned.Load() == 0
}

// client returns the group client of the current connect, waiting until
// connect has published it: franz-go may run group callbacks before
// kgo.NewClient returns.
func (w *Worker) client() *kgo.Client {
	w.mu.Lock()
	c := w.mu.connected
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
	w.mu.cancelPoll = cancel
	w.mu.Unlock()
	defer cancel()
	if w.snaps != nil {
		sctx, stop := context.WithCancel(ctx)
		w.stopSnaps, w.snapsDone = stop, make(chan struct{})
		go func() {
			defer close(w.snapsDone)
			w.snaps.loop(sctx)
		}()
		defer w.stopSnapshots()
	}
	for {
		if err := w.connect(); err != nil {
			return err
		}
		if err := w.mode.loop(pollCtx); err != nil && pollCtx.Err() == nil {
			// The transactional producer is unusable (fenced, or an
			// unconfirmed end): commit what the committed transactions
			// changed, leave, and start a new session, as a restarted
			// process would.
			w.log.Warn("restarting the Kafka session", "err", err)
			w.m.sessionRestarts.Inc()
			w.cl.AllowRebalance()
			w.release()
			w.finalSnapshots(w.released)
			w.released = nil
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
	w.mu.connected = connected
	w.mu.plansStopped = false // the previous client is closed: its plans have ended
	w.mu.Unlock()
	opts := append(w.opts.GroupClientOpts(),
		kgo.OnPartitionsAssigned(w.assigned),
		kgo.OnPartitionsRevoked(w.revoked),
		kgo.OnPartitionsLost(w.lost),
		kgo.AdjustFetchOffsetsFn(w.adjustOffsets),
		kgo.ProducerBatchMaxBytesFn(w.producerBatchMaxBytes),
		kgo.WithLogger(kslog.New(w.log)),
		kgo.ClientID(clientID(w.groupParams())),
	)
	return w.mode.connect(opts)
}

func (w *Worker) clientOpts(opts []kgo.Opt) []kgo.Opt {
	return append(append(opts, w.opts.ConnOpts...), w.opts.ClientOpts...)
}

// publish makes the session of a connect visible to group callbacks.
func (w *Worker) publish(sess *kgo.GroupTransactSession, cl *kgo.Client) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.sess, w.cl = sess, cl
	close(w.mu.connected)
}

func (w *Worker) partition(topic string, p int32) *partitionWorker {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.mu.parts[store.TopicPartition{Topic: topic, Partition: p}]
}

// fail records the first fatal error and stops polling.
func (w *Worker) fail(err error) {
	w.fatal.Store(true)
	w.fatalOnce.Do(func() {
		w.log.Error("stopping the worker", "err", err)
		w.mu.Lock()
		w.mu.fatalErr = err
		cancel := w.mu.cancelPoll
		w.mu.Unlock()
		if cancel != nil {
			cancel()
		}
	})
}

// release stops every partition, each finishing its write batch. A plan
// running on the group client's goroutine (adjustOffsets) is cancelled and
// waited for first: it owns the partitions it plans, and one that went on
// after their stop would start a replay on a closed state. franz-go's own
// revocations wait for it the same way (they cancel its offset fetch and
// wait); a shutdown or a session restart does not pass through them.
func (w *Worker) release() {
	w.joining.Store(nil) // a readiness watcher of this session sets ready no more
	w.ready.Store(false)
	w.stopPlans()
	w.mu.Lock()
	all := make(map[string][]int32)
	for tp := range w.mu.parts {
		all[tp.Topic] = append(all[tp.Topic], tp.Partition)
	}
	w.mu.Unlock()
	w.released = append(w.released, w.stopPartitions(all, false)...)
}

// stopPlans makes adjustOffsets plan nothing more until the next connect,
// cancels the plan running, and waits for it to return.
func (w *Worker) stopPlans() {
	w.mu.Lock()
	w.mu.plansStopped = true
	cancel := w.mu.cancelPlans
	w.mu.Unlock()
	if cancel != nil {
		cancel()
	}
	w.planning.Wait()
}

// beginPlan registers a plan (adjustOffsets) under ctx: it returns the
// plan's context, cancelled by stopPlans, and the func that ends it; ok is
// false once stopPlans has run in this session.
func (w *Worker) beginPlan(ctx context.Context) (planCtx context.Context, end func(), ok bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.mu.plansStopped {
		return ctx, nil, false
	}
	planCtx, cancel := context.WithCancel(ctx)
	w.mu.cancelPlans = cancel
	w.planning.Add(1)
	return planCtx, func() {
		cancel()
		w.planning.Done()
	}, true
}

func (w *Worker) shutdown() error {
	begun := time.Now()
	w.live.stop("stopping partitions (finishing their write batches)")
	w.mu.Lock()
	w.mu.closing = true
	w.mu.Unlock()

	// Finish every partition's write batch and commit the group offsets
	// before leaving: leaving hands the partitions to other members. An
	// interval's upload in flight is cancelled first but not waited for:
	// on a slow store it held the write batches and the group commit
	// past the shutdown timeout. The last snapshots come after the
	// commit, within what is left of the timeout.
	ctx, cancel := context.WithTimeout(context.Background(), w.opts.SessionTimeout)
	defer cancel()
	if w.stopSnaps != nil {
		w.stopSnaps()
	}
	w.release()
	w.mode.closing(ctx)
	w.stopSnapshots()
	w.finalSnapshotsWithin(w.released, w.shutdownLeft(begun)) // after the group commit
	w.released = nil
	w.live.stamp("closing the Kafka client (leaving the group)")
	w.closeClient()
	w.closeLarge()
	if w.opts.InstanceID != "" {
		w.log.Info("closed; as a static member the worker stays in the group until the session timeout, so a restart with the same instance id resumes its partitions without a rebalance",
			"instance_id", w.opts.InstanceID, "session_timeout", w.opts.SessionTimeout)
	} else {
		w.log.Info("left the group")
	}

	w.mu.Lock()
	defer w.mu.Unlock()
	return w.mu.fatalErr
}

// shutdownLeft is how long the last snapshots of a stop that began at
// begun may take: snapshotFinalBudget, within what Options.ShutdownTimeout
// leaves after closeWait and a second's margin for the rest of the stop.
func (w *Worker) shutdownLeft(begun time.Time) time.Duration {
	if w.opts.ShutdownTimeout <= 0 {
		return snapshotFinalBudget
	}
	return min(snapshotFinalBudget, w.opts.ShutdownTimeout-time.Since(begun)-closeWait-time.Second)
}

// stopSnapshots ends the snapshotter's loop and waits for it, once.
func (w *Worker) stopSnapshots() {
	if w.stopSnaps != nil {
		w.stopSnaps()
		<-w.snapsDone
	}
}

// closeWait bounds how long shutdown waits for the Kafka client to close.
// Closing waits for a group join in flight, which the coordinator answers
// only when the rebalance completes: after every member rejoined or, for a
// static member that has stopped, its session timeout. A worker stopping by
// then has released its partitions; not waiting only delays, by at most a
// session timeout, the group's noticing it left.
const closeWait = 5 * time.Second

// closeClient closes the Kafka client, waiting for it at most closeWait.
func (w *Worker) closeClient() {
	closed := make(chan struct{})
	go func() {
		defer close(closed)
		w.cl.Close()
	}()
	select {
	case <-closed:
	case <-time.After(closeWait):
		w.log.Warn("the Kafka client did not close in time (a group join in flight, or the brokers unreachable); not waiting for it: the group notices the departure within the session timeout",
			"waited", closeWait, "session_timeout", w.opts.SessionTimeout)
	}
}

// pollRecords bounds one poll at least once; the partition goroutines take
// batches of it.
const pollRecords = 10_000

// assignedPartitions returns the assigned partitions, read under mu.
func (w *Worker) assignedPartitions() []*partitionWorker {
	w.mu.Lock()
	defer w.mu.Unlock()
	parts := make([]*partitionWorker, 0, len(w.mu.parts))
	for _, pw := range w.mu.parts {
		parts = append(parts, pw)
	}
	return parts
}

func (w *Worker) logFetchErrors(fetches kgo.Fetches) {
	fetches.EachError(func(topic string, partition int32, err error) {
		if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
			w.log.Warn("fetch error", "topic", topic, "partition", partition, "err", err)
		}
	})
}

// observeHighWatermark records the partition's high watermark for the
// lag metric, also from fetches that carry no records.
func (w *Worker) observeHighWatermark(p kgo.FetchTopicPartition) {
	if p.HighWatermark < 0 {
		return
	}
	if pw := w.partition(p.Topic, p.Partition); pw != nil {
		pw.gauges.highWatermark.Store(p.HighWatermark)
	}
}

// polled does what every poll's fetches need before their records are
// decided: fetch errors logged, high watermarks noted, batches over
// MaxDecompressBytes turned into skips (skipRecords, which calls fail when
// it cannot).
func (w *Worker) polled(fetches kgo.Fetches) kgo.Fetches {
	w.logFetchErrors(fetches)
	fetches.EachPartition(w.observeHighWatermark)
	return w.skipRecords(fetches)
}
