package app

import (
	"log/slog"
	"math"
	"os"
	"runtime/debug"
	"sync"

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

var memLimit struct {
	sync.Mutex
	workers int   // Runs holding a share of the limit
	sum     int64 // their shares
	prev    int64 // the limit before the first of them
}

// limitMemory sets the Go runtime's soft memory limit (debug.SetMemoryLimit)
// to the page cache plus memoryOverheadBytes, so that the collector returns
// Badger's discarded table buffers before the heap doubles. Workers running
// in one process add up their shares; the limit in force before the first
// of them is restored when the last one returns. A limit the user chose
// (GOMEMLIMIT, even "off", or one set through runtime/debug) is left alone.
// It returns the function that gives the share back.
func limitMemory(cfg config.Config, log *slog.Logger) (release func()) {
	if _, set := os.LookupEnv("GOMEMLIMIT"); set {
		return func() {}
	}
	share := int64(cfg.CacheBytes) + memoryOverheadBytes
	memLimit.Lock()
	defer memLimit.Unlock()
	if memLimit.workers == 0 {
		prev := debug.SetMemoryLimit(-1)
		if prev != math.MaxInt64 {
			return func() {}
		}
		memLimit.prev = prev
	}
	memLimit.workers++
	memLimit.sum += share
	debug.SetMemoryLimit(memLimit.sum)
	log.Debug("go soft memory limit", "bytes", memLimit.sum)
	return func() {
		memLimit.Lock()
		defer memLimit.Unlock()
		memLimit.workers--
		memLimit.sum -= share
		if memLimit.workers == 0 {
			debug.SetMemoryLimit(memLimit.prev)
			return
		}
		debug.SetMemoryLimit(memLimit.sum)
	}
}
