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
// (debug.SetMemoryLimit) of a process that runs one worker to the page
// cache plus memoryOverheadBytes, so that the collector returns Badger's
// discarded table buffers before the heap doubles. A limit the user chose
// with GOMEMLIMIT (even "off") is left alone. Call it from the process's
// main, not where a worker shares its heap with other work (kdedup demo and
// bench run a broker in the same process): there the limit would make the
// collector run without pause.
func SetMemoryLimit(cfg config.Config, log *slog.Logger) {
	if _, set := os.LookupEnv("GOMEMLIMIT"); set {
		return
	}
	limit := int64(cfg.CacheBytes) + memoryOverheadBytes
	debug.SetMemoryLimit(limit)
	log.Debug("go soft memory limit", "bytes", limit)
}
