package app

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"runtime/debug"
	"time"

	"github.com/kdedup/kdedup/config"
	"github.com/kdedup/kdedup/consumer"
	"github.com/kdedup/kdedup/internal/budget"
	"github.com/kdedup/kdedup/snapshot"
	"github.com/kdedup/kdedup/store"
)

// MemoryBudget splits the worker's memory budget (internal/budget) for
// cfg as the worker does at start-up: KDEDUP_MEMORY_BYTES, or a share of the container memory limit that
// limit reports, or the default. It returns where the total came from,
// and an error naming the variable when the budget is too small.
func MemoryBudget(cfg config.Config, limit func() (uint64, error)) (budget.Split, string, error) {
	total, source := budget.Total(int64(cfg.MemoryBytes), limit)
	sopts := store.Options{PageBytes: int(cfg.PageBytes), FlushBytes: int64(cfg.FlushBytes)}
	s, err := budget.Plan(budget.Inputs{
		TotalBytes:      total,
		StoreBytes:      sopts.MemoryBytes(),
		DecompressBytes: int64(cfg.MaxDecompressBytes),
		PageBytes:       int64(cfg.PageBytes),
		CacheBytes:      int64(cfg.CacheBytes),
		// A restore is a snapshot's import, then the replay of the gap
		// after it: one at a time, so the larger of the two.
		RestoreBytes: max(sopts.ImportMemoryBytes()+snapshot.LoadMemoryBytes, consumer.ReplayMemoryBytes(int64(cfg.MaxDecompressBytes))),
	})
	if err != nil {
		what := fmt.Sprintf("KDEDUP_MEMORY_BYTES=%v", cfg.MemoryBytes)
		if cfg.MemoryBytes == 0 {
			what = "KDEDUP_MEMORY_BYTES unset, the memory budget from " + source
		}
		return budget.Split{}, source, fmt.Errorf("%s: %w; raise the container's memory limit or KDEDUP_MEMORY_BYTES, or lower KDEDUP_FLUSH_BYTES or KDEDUP_MAX_DECOMPRESS_BYTES", what, err)
	}
	return s, source, nil
}

// logBudget logs the split at start-up, and a warning when
// KDEDUP_CACHE_BYTES asks for more than the cache's share.
func logBudget(log *slog.Logger, s budget.Split, source string) {
	log.Info("memory budget", "total_bytes", s.Total, "source", source,
		"go_memory_limit_bytes", s.GoLimit, "page_cache_bytes", s.Cache, "dirty_pages_bytes", s.Dirty,
		"store_bytes", s.Store, "fetch_bytes", s.Fetch, "decompress_bytes", s.Decompress,
		"restore_bytes", s.Restore, "restores_at_once", s.MaxRestores,
		"runtime_bytes", s.Runtime, "gc_headroom_bytes", s.Headroom, "outside_go_bytes", s.NonGo)
	if s.Over > 0 {
		log.Warn("KDEDUP_CACHE_BYTES is larger than the page cache's share of the memory budget: resident memory may pass it",
			"cache_bytes", s.Cache, "share_bytes", s.Cache-s.Over, "total_bytes", s.Total)
	}
}

// SetMemoryLimit sets the Go runtime's soft memory limit
// (debug.SetMemoryLimit) of a process that runs one worker to its memory
// budget's GoLimit, so that the collector returns Badger's discarded
// table buffers before the heap passes the budget. It leaves the limit
// alone when the environment sets GOMEMLIMIT (even to "off" or to
// nothing), and when the budget is invalid (Run reports it). Call it
// from the process's main, not where a worker shares its heap with other
// work (kdedup demo and bench run a broker in the same process): there
// the limit would make the collector run without pause.
func SetMemoryLimit(cfg config.Config, log *slog.Logger) {
	limit, ok := memoryLimit(cfg, os.LookupEnv, budget.CgroupLimit)
	if !ok {
		return
	}
	debug.SetMemoryLimit(limit)
	log.Debug("go soft memory limit", "bytes", limit)
}

// memoryLimit is the soft memory limit in bytes for a worker configured
// by cfg, with the container limit read by limit. It reports false when
// the environment, read through lookupEnv, sets GOMEMLIMIT, or when the
// budget is invalid.
func memoryLimit(cfg config.Config, lookupEnv func(string) (string, bool), limit func() (uint64, error)) (int64, bool) {
	if _, set := lookupEnv("GOMEMLIMIT"); set {
		return 0, false
	}
	s, _, err := MemoryBudget(cfg, limit)
	if err != nil {
		return 0, false
	}
	return s.GoLimit, true
}

// cacheWatchInterval is how often watchState compares the owned
// partitions' pages with the page cache.
const cacheWatchInterval = 10 * time.Second

// cacheWatch logs once when the pages of the owned partitions grow past
// the page cache, and once when they fit again.
type cacheWatch struct {
	log  *slog.Logger
	over bool
}

// check compares state (dedup.Metrics.StateBytes) with cache bytes.
func (c *cacheWatch) check(state, cache int64) {
	switch {
	case state > cache && !c.over:
		c.over = true
		c.log.Warn("the pages of the owned partitions exceed the page cache: lookups beyond it read Badger, several times slower (docs/operations.md, \"State larger than the page cache\")",
			"state_bytes", state, "page_cache_bytes", cache, "needed_bytes", state-cache)
	case state <= cache && c.over:
		c.over = false
		c.log.Info("the pages of the owned partitions fit in the page cache again", "state_bytes", state, "page_cache_bytes", cache)
	}
}

// watchState runs c.check every cacheWatchInterval until ctx ends.
func watchState(ctx context.Context, c *cacheWatch, state func() int64, cache int64) {
	t := time.NewTicker(cacheWatchInterval)
	defer t.Stop()
	for {
		c.check(state(), cache)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
