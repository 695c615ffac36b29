package app

import (
	"log/slog"
	"os"
	"runtime/debug"

	"github.com/kdedup/kdedup/config"
)

// memoryOverheadBytes is the Go heap a worker is allowed besides its
// clean-page cache before the collector works harder: Badger's two memtable
// arenas (about 83 MiB each) and its pool of table-building buffers (up to
// 8 of up to 96 MiB, see store), the dirty pages of the write batches and
// the Kafka client's buffers. With 10M keys the live heap was 344 MiB and
// the process peaked at 1.3 GiB under a limit of 896 MiB (the default cache
// plus this), without more CPU; see BENCHMARKS.md ("Resident memory with
// 10M keys").
const memoryOverheadBytes = 640 << 20

// SetMemoryLimit sets the Go runtime's soft memory limit
// (debug.SetMemoryLimit) of a process that runs one worker to
// memoryLimit's, so that the collector returns Badger's discarded table
// buffers before the heap doubles. Call it from the process's main, not
// where a worker shares its heap with other work (kdedup demo and bench
// run a broker in the same process): there the limit would make the
// collector run without pause.
func SetMemoryLimit(cfg config.Config, log *slog.Logger) {
	limit, ok := memoryLimit(cfg, os.LookupEnv)
	if !ok {
		return
	}
	debug.SetMemoryLimit(limit)
	log.Debug("go soft memory limit", "bytes", limit)
}

// memoryLimit is the soft memory limit in bytes for a worker configured
// by cfg: the page cache (KDEDUP_CACHE_BYTES) plus memoryOverheadBytes.
// It reports false when the environment, read through lookupEnv, sets
// GOMEMLIMIT (even to "off" or to nothing): a limit the user chose is left
// alone.
func memoryLimit(cfg config.Config, lookupEnv func(string) (string, bool)) (int64, bool) {
	if _, set := lookupEnv("GOMEMLIMIT"); set {
		return 0, false
	}
	return int64(cfg.CacheBytes) + memoryOverheadBytes, true
}
