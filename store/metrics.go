package store

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// metrics are shared by every PartitionState of one DB. With a nil Registerer
// they are created but not registered; otherwise the Badger size and cache
// metrics of db (collector) are registered with them.
type metrics struct {
	commitSeconds     prometheus.Histogram
	openSeconds       prometheus.Histogram
	commitBytes       prometheus.Counter
	commits           prometheus.Counter
	commitErrors      prometheus.Counter
	cacheHits         prometheus.CounterFunc
	cacheMisses       prometheus.Counter
	pageReads         prometheus.Counter
	pagesReclaimed    prometheus.Counter
	consolidatedPages prometheus.Counter
	writtenBack       prometheus.Counter
	corruptions       prometheus.Counter
}

func newMetrics(reg prometheus.Registerer, db *DB) *metrics {
	f := promauto.With(reg)
	if reg != nil {
		reg.MustRegister(newCollector(db))
	}
	f.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "kdedup_store_patch_bytes",
		Help: "Memory held by the logged changes of pending pages (bounded by the write-back's WriteBackBytes).",
	}, func() float64 { return float64(db.PatchBytes()) })
	return &metrics{
		commitSeconds: f.NewHistogram(prometheus.HistogramOpts{
			Name: "kdedup_store_commit_seconds",
			Help: "Duration of one write batch: the Badger transaction holding a partition's dirty pages, chain metadata and checkpoint.",
			// 0.5 ms .. ~8 s.
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 15),
		}),
		openSeconds: f.NewHistogram(prometheus.HistogramOpts{
			Name: "kdedup_store_partition_open_seconds",
			Help: "Duration of opening a topic-partition's state: its metadata and checkpoint read and its log applied to the pages pending since their floor (the store's recovery after a crash).",
			// 1 ms .. ~65 s.
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 17),
		}),
		commitBytes: f.NewCounter(prometheus.CounterOpts{
			Name: "kdedup_store_commit_bytes_total",
			Help: "Key and value bytes written by committed write batches.",
		}),
		commits: f.NewCounter(prometheus.CounterOpts{
			Name: "kdedup_store_commits_total",
			Help: "Write batches committed.",
		}),
		commitErrors: f.NewCounter(prometheus.CounterOpts{
			Name: "kdedup_store_commit_errors_total",
			Help: "Write batches that were not committed because of an error.",
		}),
		cacheHits: f.NewCounterFunc(prometheus.CounterOpts{
			Name: "kdedup_store_page_cache_hits_total",
			Help: "Page lookups served from memory (a dirty page or the clean page cache).",
		}, db.cacheHits),
		cacheMisses: f.NewCounter(prometheus.CounterOpts{
			Name: "kdedup_store_page_cache_misses_total",
			Help: "Page lookups that had to ask Badger.",
		}),
		pageReads: f.NewCounter(prometheus.CounterOpts{
			Name: "kdedup_store_page_reads_total",
			Help: "Pages read from Badger (misses whose page had been written before; the others read as zeros).",
		}),
		pagesReclaimed: f.NewCounter(prometheus.CounterOpts{
			Name: "kdedup_store_pages_reclaimed_total",
			Help: "Stored pages deleted because their sub-filter's generation expired (dedup window).",
		}),
		consolidatedPages: f.NewCounter(prometheus.CounterOpts{
			Name: "kdedup_store_pages_consolidated_total",
			Help: "Pending pages written whole while their partition was idle, emptying its log (PartitionState.ConsolidateStep).",
		}),
		writtenBack: f.NewCounter(prometheus.CounterOpts{
			Name: "kdedup_store_pages_written_back_total",
			Help: "Pages written whole by the write-back, advancing their floor past their logged changes.",
		}),
		corruptions: f.NewCounter(prometheus.CounterOpts{
			Name: "kdedup_store_corruptions_total",
			Help: "Corrupt state found while running (a page or record failing its checksum or length check); it is never used and the partition stops. Open refuses a damaged directory before metrics are served.",
		}),
	}
}
