package store

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// collector reports the size and caches of the Badger database of one DB
// and the free space of its directory, read at each scrape (Badger's own
// expvar counters are process-wide; these are the DB's). After Close it
// reports nothing.
type collector struct {
	db *DB

	lsmBytes, vlogBytes, levelBytes, levelTables *prometheus.Desc
	cacheHits, cacheMisses, cacheEvictions       *prometheus.Desc
	freeBytes, requiredFreeBytes                 *prometheus.Desc
	dirtyBytes, dirtyPeakBytes, cacheBytes       *prometheus.Desc
}

func newCollector(db *DB) *collector {
	desc := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc("kdedup_badger_"+name, help, labels, nil)
	}
	return &collector{
		db:          db,
		lsmBytes:    desc("lsm_size_bytes", "Size of Badger's LSM tables on disk (as of Badger's last size scan, once a minute)."),
		vlogBytes:   desc("vlog_size_bytes", "Size of Badger's value log on disk (as of Badger's last size scan, once a minute)."),
		levelBytes:  desc("level_size_bytes", "Size of the tables of one LSM level.", "level"),
		levelTables: desc("level_tables", "Tables in one LSM level.", "level"),
		cacheHits:   desc("cache_hits_total", "Lookups served by a Badger cache (block: table blocks; index: table indexes, when enabled).", "cache"),
		cacheMisses: desc("cache_misses_total", "Lookups a Badger cache could not serve.", "cache"),
		cacheEvictions: desc("cache_evictions_total",
			"Entries a Badger cache evicted to stay under its size.", "cache"),
		freeBytes: prometheus.NewDesc("kdedup_store_free_bytes",
			"Free space the worker may use on the filesystem of the data directory (statfs at scrape).", nil, nil),
		requiredFreeBytes: prometheus.NewDesc("kdedup_store_required_free_bytes",
			"Free space a write batch needs in the data directory (the batch, the memtable flushes and a level-0 compaction); below it write batches fail and the worker stops.", nil, nil),
		dirtyBytes: prometheus.NewDesc("kdedup_store_dirty_page_bytes",
			"Memory held by the dirty pages of every partition (changed since their last write batch), outside the page cache.", nil, nil),
		dirtyPeakBytes: prometheus.NewDesc("kdedup_store_dirty_page_peak_bytes",
			"The most memory dirty pages held at once since the worker started; the worker keeps it near its dirty-page share of KDEDUP_MEMORY_BYTES.", nil, nil),
		cacheBytes: prometheus.NewDesc("kdedup_store_page_cache_capacity_bytes",
			"Pages the page cache holds at most, in bytes (KDEDUP_CACHE_BYTES, or the cache's share of KDEDUP_MEMORY_BYTES).", nil, nil),
	}
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.lsmBytes, c.vlogBytes, c.levelBytes, c.levelTables, c.cacheHits, c.cacheMisses, c.cacheEvictions, c.freeBytes, c.requiredFreeBytes, c.dirtyBytes, c.dirtyPeakBytes, c.cacheBytes} {
		ch <- d
	}
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	if c.db.closed.Load() {
		return
	}
	bdb := c.db.bdb
	ch <- prometheus.MustNewConstMetric(c.dirtyBytes, prometheus.GaugeValue, float64(c.db.DirtyPageBytes()))
	ch <- prometheus.MustNewConstMetric(c.dirtyPeakBytes, prometheus.GaugeValue, float64(c.db.DirtyPageBytesPeak()))
	ch <- prometheus.MustNewConstMetric(c.cacheBytes, prometheus.GaugeValue, float64(c.db.CacheBytes()))
	if !c.db.opts.InMemory {
		if free, err := c.db.tuning.freeBytes(c.db.opts.Dir); err == nil {
			ch <- prometheus.MustNewConstMetric(c.freeBytes, prometheus.GaugeValue, float64(free))
		}
		if !c.db.opts.ReadOnly {
			ch <- prometheus.MustNewConstMetric(c.requiredFreeBytes, prometheus.GaugeValue, float64(c.db.requiredFreeBytes()))
		}
	}
	lsm, vlog := bdb.Size()
	ch <- prometheus.MustNewConstMetric(c.lsmBytes, prometheus.GaugeValue, float64(lsm))
	ch <- prometheus.MustNewConstMetric(c.vlogBytes, prometheus.GaugeValue, float64(vlog))
	for _, l := range bdb.Levels() {
		level := strconv.Itoa(l.Level)
		ch <- prometheus.MustNewConstMetric(c.levelBytes, prometheus.GaugeValue, float64(l.Size), level)
		ch <- prometheus.MustNewConstMetric(c.levelTables, prometheus.GaugeValue, float64(l.NumTables), level)
	}
	cache := func(name string, hits, misses, evictions uint64) {
		ch <- prometheus.MustNewConstMetric(c.cacheHits, prometheus.CounterValue, float64(hits), name)
		ch <- prometheus.MustNewConstMetric(c.cacheMisses, prometheus.CounterValue, float64(misses), name)
		ch <- prometheus.MustNewConstMetric(c.cacheEvictions, prometheus.CounterValue, float64(evictions), name)
	}
	// nil: the cache is disabled (the index cache is, by default).
	if m := bdb.BlockCacheMetrics(); m != nil {
		cache("block", m.Hits(), m.Misses(), m.KeysEvicted())
	}
	if m := bdb.IndexCacheMetrics(); m != nil {
		cache("index", m.Hits(), m.Misses(), m.KeysEvicted())
	}
}
