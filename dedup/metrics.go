package dedup

import (
	"math"
	"strconv"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"

	"github.com/kdedup/kdedup/filter"
)

// Metrics are the per-topic-partition decision counters and filter gauges.
// Create one per process with NewMetrics and share it between Deduplicators;
// safe for concurrent use.
type Metrics struct {
	consumed, forwarded, duplicates, overLimit, deletes, deletesMissing, unkeyed, replayed, expired, full, operations, pageReads, swept *prometheus.CounterVec

	commitSeconds prometheus.Histogram

	load, newestLoad, subFilters, generations, watermark, items, fpr, targetFPR, bytes, bits, nearFull, splits *prometheus.GaugeVec
	// entries is labelled by fingerprint length too.
	entries *prometheus.GaugeVec

	// stateBytes is the sum of kdedup_filter_bytes over the open
	// partitions (StateBytes).
	stateBytes atomic.Int64
}

// StateBytes is the size of the pages of every open partition's chain,
// allocated or not (the sum of kdedup_filter_bytes, exported as
// kdedup_state_bytes): what the page cache must hold for no lookup to
// read Badger. Safe for concurrent use.
func (m *Metrics) StateBytes() int64 { return m.stateBytes.Load() }

// NewMetrics registers the metrics with reg (nil: not registered).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	f := promauto.With(reg)
	tp := []string{"topic", "partition"}
	counter := func(name, help string) *prometheus.CounterVec {
		return f.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, tp)
	}
	gauge := func(name, help string) *prometheus.GaugeVec {
		return f.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, tp)
	}
	m := &Metrics{
		consumed:       counter("kdedup_consumed_records_total", "Input records decided."),
		forwarded:      counter("kdedup_forwarded_records_total", "Records decided to go to the output topic (new keys, unkeyed records, forwarded tombstones)."),
		duplicates:     counter("kdedup_duplicate_records_total", "Records dropped because their key was seen before."),
		overLimit:      counter("kdedup_over_limit_records_total", "Records dropped because their key was forwarded MAX_OCCURRENCES times since its last delete (only with MAX_OCCURRENCES above 1)."),
		deletes:        counter("kdedup_delete_records_total", "Tombstones and delete-marked records applied to the filter."),
		deletesMissing: counter("kdedup_delete_missing_total", "Deletes whose key was not in the filter."),
		unkeyed:        counter("kdedup_unkeyed_records_total", "Records without a usable dedup key, forwarded unchanged."),
		replayed:       counter("kdedup_replayed_records_total", "Records applied to the filter without forwarding, to rebuild or catch up state from the input topic."),
		expired:        counter("kdedup_filter_generations_expired_total", "Generations that expired holding keys because the dedup window passed them (only with WINDOW set)."),
		swept:          counter("kdedup_filter_pages_swept_total", "Pages the dedup window's sweep read to clear expired entries: every page once every 2^t-1-G generations (7 at the defaults); not in kdedup_filter_page_reads_total (only with WINDOW set)."),
		full:           counter("kdedup_filter_full_records_total", "Records whose key the chain could not remember because it holds the maximum of 64 sub-filters; new keys are forwarded and their repeats will be too."),
		operations:     counter("kdedup_filter_operations_total", "Filter operations (lookups, inserts, adds, counts, deletes, refreshes) deciding records."),
		pageReads:      counter("kdedup_filter_page_reads_total", "Pages the filter operations read: one per sub-filter an operation looks in, two more per page split; over kdedup_filter_operations_total, the pages touched per operation (1 until a chain appends a second sub-filter, at 256 times CAPACITY)."),
		commitSeconds: f.NewHistogram(prometheus.HistogramOpts{
			Name:    "kdedup_batch_commit_seconds",
			Help:    "Latency of one write batch (dirty pages, metadata and checkpoint in one Badger transaction).",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
		}),
		load:        gauge("kdedup_filter_load_factor", "Items over slots across the partition's chain."),
		newestLoad:  gauge("kdedup_filter_newest_load_factor", "Load factor of the newest sub-filter, the one inserts go to first (older ones take keys it has no room for)."),
		subFilters:  gauge("kdedup_filter_sub_filters", "Sub-filters in the partition's chain."),
		generations: gauge("kdedup_filter_generations", "Live generations holding keys in the partition's chain, whose entries carry their generation tag (1 without a dedup window; at most WINDOW_GENERATIONS+1 with one)."),
		watermark:   gauge("kdedup_filter_watermark_timestamp_seconds", "Highest record timestamp the partition's chain has seen, which drives window expiry (only with WINDOW set)."),
		items:       gauge("kdedup_filter_items", "Fingerprints stored in the partition's chain."),
		fpr:         gauge("kdedup_filter_estimated_fpr", "Estimated false-positive rate of the chain: over its entries, the chance a key never inserted lands in an entry's buckets times 2^-(its fingerprint length) (filter.SubFilter.EstimatedFPR)."),
		targetFPR:   gauge("kdedup_filter_target_fpr", "False-positive rate the chain is configured to stay under (TARGET_FPR); not exported when FINGERPRINT_BITS fixes the width instead."),
		bytes:       gauge("kdedup_filter_bytes", "Size of the chain's pages, in bytes, allocated or not."),
		bits:        gauge("kdedup_filter_fingerprint_width", "Fingerprint width in bits of the newest sub-filter (widths grow by one bit per sub-filter to keep the target false-positive rate)."),
		nearFull:    gauge("kdedup_filter_near_full", "1 when the chain can add at most one more sub-filter before inserts fail or the target false-positive rate can no longer be kept."),
		splits:      gauge("kdedup_filter_splits", "Page splits of the partition's chain: its sub-filters grow in place, a page splitting in two when a key does not fit, up to 256 times their first pages."),
	}
	m.entries = f.NewGaugeVec(prometheus.GaugeOpts{Name: "kdedup_filter_entries",
		Help: "Entries of the partition's chain by fingerprint length in bits (length): an entry inserted before its page split holds one bit less per split, and the estimated false-positive rate sums 2^-length over entries."},
		[]string{"topic", "partition", "length"})
	// An atomic read: a scrape never waits for a partition.
	f.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "kdedup_state_bytes",
		Help: "Size of the pages of every partition this worker owns (the sum of kdedup_filter_bytes): above kdedup_store_page_cache_capacity_bytes, lookups read pages from Badger.",
	}, func() float64 { return float64(m.stateBytes.Load()) })
	return m
}

type partitionMetrics struct {
	m      *Metrics
	labels []string
	// bytes is the partition's share of m.stateBytes.
	bytes *int64

	consumed, forwarded, duplicates, overLimit, deletes, deletesMissing, unkeyed, replayed, expired, full, operations, pageReads, swept prometheus.Counter
	commitSeconds                                                                                                                       prometheus.Observer
	// counted is the chain's Stats().Operations, PageReads and SweptPages
	// last added to the counters (a chain opened again counts from 0).
	counted *[3]uint64
	// lengths are the fingerprint lengths exported in kdedup_filter_entries.
	lengths *[]int
}

// forPartition returns the metrics of topic/partition. targetFPR is the
// chain's configured target (filter.Params.TargetFPR); 0 exports none.
func (m *Metrics) forPartition(topic string, partition int32, targetFPR float64) partitionMetrics {
	l := []string{topic, strconv.Itoa(int(partition))}
	if targetFPR > 0 {
		m.targetFPR.WithLabelValues(l...).Set(targetFPR)
	}
	return partitionMetrics{
		m:              m,
		labels:         l,
		bytes:          new(int64),
		consumed:       m.consumed.WithLabelValues(l...),
		forwarded:      m.forwarded.WithLabelValues(l...),
		duplicates:     m.duplicates.WithLabelValues(l...),
		overLimit:      m.overLimit.WithLabelValues(l...),
		deletes:        m.deletes.WithLabelValues(l...),
		deletesMissing: m.deletesMissing.WithLabelValues(l...),
		unkeyed:        m.unkeyed.WithLabelValues(l...),
		replayed:       m.replayed.WithLabelValues(l...),
		expired:        m.expired.WithLabelValues(l...),
		full:           m.full.WithLabelValues(l...),
		operations:     m.operations.WithLabelValues(l...),
		pageReads:      m.pageReads.WithLabelValues(l...),
		swept:          m.swept.WithLabelValues(l...),
		commitSeconds:  m.commitSeconds,
		counted:        new([3]uint64),
		lengths:        new([]int),
	}
}

func (pm partitionMetrics) observe(s filter.Stats) {
	m, l := pm.m, pm.labels
	m.load.WithLabelValues(l...).Set(s.LoadFactor)
	m.newestLoad.WithLabelValues(l...).Set(s.NewestLoadFactor)
	m.subFilters.WithLabelValues(l...).Set(float64(s.SubFilters))
	m.generations.WithLabelValues(l...).Set(float64(s.Generations))
	if s.Watermark != math.MinInt64 {
		m.watermark.WithLabelValues(l...).Set(float64(s.Watermark) / 1e3)
	}
	m.items.WithLabelValues(l...).Set(float64(s.Items))
	m.fpr.WithLabelValues(l...).Set(s.EstimatedFPR)
	m.bytes.WithLabelValues(l...).Set(float64(s.Bytes))
	m.stateBytes.Add(int64(s.Bytes) - *pm.bytes)
	*pm.bytes = int64(s.Bytes)
	m.bits.WithLabelValues(l...).Set(float64(s.NewestFingerprintBits))
	nearFull := 0.0
	if s.NearFull {
		nearFull = 1
	}
	m.nearFull.WithLabelValues(l...).Set(nearFull)
	m.splits.WithLabelValues(l...).Set(float64(s.Splits))
	for i, now := range [3]uint64{s.Operations, s.PageReads, s.SweptPages} {
		if now < pm.counted[i] {
			pm.counted[i] = 0 // the chain was opened again
		}
		[3]prometheus.Counter{pm.operations, pm.pageReads, pm.swept}[i].Add(float64(now - pm.counted[i]))
		pm.counted[i] = now
	}
	for _, l := range *pm.lengths {
		if s.Entries[l] == 0 {
			m.entries.DeleteLabelValues(pm.labels[0], pm.labels[1], strconv.Itoa(l))
		}
	}
	*pm.lengths = (*pm.lengths)[:0]
	for l, n := range s.Entries {
		if n > 0 {
			m.entries.WithLabelValues(pm.labels[0], pm.labels[1], strconv.Itoa(l)).Set(float64(n))
			*pm.lengths = append(*pm.lengths, l)
		}
	}
}

// forget drops the gauges of a partition this worker no longer owns;
// counters stay so that rates survive a partition moving away and back.
func (pm partitionMetrics) forget() {
	pm.m.stateBytes.Add(-*pm.bytes)
	*pm.bytes = 0
	for _, g := range []*prometheus.GaugeVec{pm.m.load, pm.m.newestLoad, pm.m.subFilters, pm.m.generations, pm.m.watermark, pm.m.items, pm.m.fpr, pm.m.targetFPR, pm.m.bytes, pm.m.bits, pm.m.nearFull, pm.m.splits} {
		g.DeleteLabelValues(pm.labels...)
	}
	pm.m.entries.DeletePartialMatch(prometheus.Labels{"topic": pm.labels[0], "partition": pm.labels[1]})
}
