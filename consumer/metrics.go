package consumer

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"

	"github.com/kdedup/kdedup/store"
)

type metrics struct {
	assigned         prometheus.Gauge
	restoring        prometheus.Gauge
	replaySeconds    prometheus.Histogram
	partialRebuilds  prometheus.Counter
	retentionSkipped prometheus.Counter
	produceErrors    prometheus.Counter
	batches          prometheus.Counter
	batchRecords     prometheus.Histogram
	batchBytes       prometheus.Histogram
	txns             *prometheus.CounterVec
	txnSeconds       prometheus.Histogram
	txnRecords       prometheus.Histogram
	sessionRestarts  prometheus.Counter
	partitionsLost   prometheus.Counter
	deadLetters      *prometheus.CounterVec
	foreignStates    *prometheus.CounterVec
	beyondLogEnd     prometheus.Counter
	repartitioned    prometheus.Counter
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
			Help: "Replays that could not read all the input they needed because it was no longer retained (deleted before the replay started or while it ran), once per replay."}),
		retentionSkipped: f.NewCounter(prometheus.CounterOpts{Name: "kdedup_retention_skipped_offsets_total",
			Help: "Input offsets a partition had to decide but retention deleted first (its committed offset or checkpoint was below the log start): it resumed at the log start; those records were neither forwarded nor remembered."}),
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
		txnRecords: f.NewHistogram(prometheus.HistogramOpts{Name: "kdedup_transaction_records",
			Help:    "Input records decided in one Kafka transaction (committed or aborted); exactly-once only.",
			Buckets: prometheus.ExponentialBuckets(1, 4, 11)}),
		partitionsLost: f.NewCounter(prometheus.CounterOpts{Name: "kdedup_partitions_lost_total",
			Help: "Partitions lost with their group session (expired during a broker outage, or fenced) instead of revoked by a rebalance."}),
		sessionRestarts: f.NewCounter(prometheus.CounterOpts{Name: "kdedup_session_restarts_total",
			Help: "Kafka client sessions restarted after the transactional producer became unusable (fenced); exactly-once only."}),
		deadLetters: f.NewCounterVec(prometheus.CounterOpts{Name: "kdedup_dead_letter_records_total",
			Help: "Records acknowledged by the dead-letter topic, by reason (too-large, invalid, decompress-too-large); exactly once, those of an aborted transaction are counted again when decided again."}, []string{"reason"}),
		foreignStates: f.NewCounterVec(prometheus.CounterOpts{Name: "kdedup_foreign_states_total",
			Help: "Partition states found to belong to another topic ID or Kafka cluster than the partition's (a topic deleted and created again, another cluster or environment), by source: local (the data directory's state, moved aside into foreign-states/ and rebuilt) or snapshot (a snapshot not restored)."}, []string{"source"}),
		repartitioned: f.NewCounter(prometheus.CounterOpts{Name: "kdedup_records_repartitioned_total",
			Help: "Records the repartition topic acknowledged: input records the repartition stage produced to it keyed by their dedup key (with a repartition topic; not the dead letters; exactly once, those of an aborted transaction are counted again when read again)."}),
		beyondLogEnd: f.NewCounter(prometheus.CounterOpts{Name: "kdedup_checkpoints_beyond_log_end_total",
			Help: "Partitions whose state of this topic had a checkpoint beyond the log end (the log was truncated): they kept their keys and resumed at the log end."}),
	}
	for _, s := range []string{"local", "snapshot"} {
		m.foreignStates.WithLabelValues(s)
	}
	if w.opts.DeadLetterTopic != "" {
		for _, r := range []string{ReasonTooLarge, ReasonInvalid, ReasonDecompressTooLarge} {
			m.deadLetters.WithLabelValues(r)
		}
	}
	return m
}

// partitionCollector reports the lag and replay progress of the worker's
// partitions as they are at scrape time, so that a partition released
// leaves no stale series and a stalled one keeps reporting its lag.
type partitionCollector struct {
	w                                *Worker
	lag, replayLeft, snapshot, stage *prometheus.Desc
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
		snapshot: prometheus.NewDesc("kdedup_snapshot_age_seconds",
			"With snapshots: seconds since the partition's newest snapshot (or its assignment, if none since) while its state has changed after it; 0 when the newest snapshot holds its last write batch.",
			tp, nil),
		stage: prometheus.NewDesc("kdedup_partition_stage",
			"1 for each assigned partition, labelled with its stage: dedup (it holds a filter's state: an input partition, or with a repartition topic a partition of it) or repartition (an input partition whose records are keyed into the repartition topic, without state).",
			[]string{"topic", "partition", "stage"}, nil),
	}
}

func (c partitionCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.lag
	ch <- c.replayLeft
	ch <- c.snapshot
	ch <- c.stage
}

func (c partitionCollector) Collect(ch chan<- prometheus.Metric) {
	// Copy under the lock, send after: a send blocks until the registry
	// takes the metric, and the registry meanwhile evaluates other
	// collectors' metrics, which must never wait for Worker.mu held here.
	for _, s := range c.w.assignedGauges() {
		p := strconv.Itoa(int(s.tp.Partition))
		ch <- prometheus.MustNewConstMetric(c.stage, prometheus.GaugeValue, 1, s.tp.Topic, p, s.stage)
		ch <- prometheus.MustNewConstMetric(c.replayLeft, prometheus.GaugeValue, float64(s.replayLeft), s.tp.Topic, p)
		if s.highWatermark >= 0 && s.next >= 0 {
			ch <- prometheus.MustNewConstMetric(c.lag, prometheus.GaugeValue, float64(max(0, s.highWatermark-s.next)), s.tp.Topic, p)
		}
		if c.w.snaps != nil && s.stage == stageDedup {
			age := 0.0
			if s.committed != s.snapOffset {
				age = time.Since(time.Unix(0, s.snapAt)).Seconds()
			}
			ch <- prometheus.MustNewConstMetric(c.snapshot, prometheus.GaugeValue, age, s.tp.Topic, p)
		}
	}
}

// partitionGauges is what the collector reports of one partition, read at
// one scrape.
type partitionGauges struct {
	tp                                                             store.TopicPartition
	stage                                                          string
	replayLeft, highWatermark, next, committed, snapOffset, snapAt int64
}

// assignedGauges returns the gauges of every assigned partition, read
// under mu, which it releases before returning.
func (w *Worker) assignedGauges() []partitionGauges {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]partitionGauges, 0, len(w.mu.parts))
	for tp, pw := range w.mu.parts {
		out = append(out, partitionGauges{tp: tp, stage: pw.stage(), replayLeft: pw.gauges.replayLeft.Load(), highWatermark: pw.gauges.highWatermark.Load(), next: pw.gauges.nextOffset.Load(),
			committed: pw.snap.committed.Load(), snapOffset: pw.snap.offset.Load(), snapAt: pw.snap.at.Load()})
	}
	return out
}
