package app

import (
	"log/slog"
	"math"
	"os"
	"runtime/debug"
	"testing"

	"github.com/kdedup/kdedup/config"
)

// workerConfig is a valid configuration with the cache set by the
// environment's KDEDUP_CACHE_BYTES, cache ("" for the default).
func workerConfig(t *testing.T, cache string) config.Config {
	t.Helper()
	env := map[string]string{
		"KDEDUP_BROKERS": "127.0.0.1:9092", "KDEDUP_INPUT_TOPICS": "in", "KDEDUP_OUTPUT_TOPIC": "out",
		"KDEDUP_GROUP": "g", "KDEDUP_DATA_DIR": t.TempDir(),
	}
	if cache != "" {
		env["KDEDUP_CACHE_BYTES"] = cache
	}
	cfg, err := config.LoadFrom(env)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// TestMemoryLimit: the soft memory limit is the page cache plus 640 MiB
// (docs/operations.md), 896 MiB at the default cache, unless GOMEMLIMIT
// is in the environment, whatever its value.
func TestMemoryLimit(t *testing.T) {
	const overhead = 640 << 20 // docs/operations.md: KDEDUP_CACHE_BYTES + 640 MiB
	for _, tc := range []struct {
		name      string
		cache     string
		gomemlim  *string
		wantLimit int64
		wantSet   bool
	}{
		{name: "default cache", wantLimit: 896 << 20, wantSet: true},
		{name: "1GiB cache", cache: "1GiB", wantLimit: 1<<30 + overhead, wantSet: true},
		{name: "smallest cache", cache: "64KiB", wantLimit: 64<<10 + overhead, wantSet: true},
		{name: "GOMEMLIMIT set", gomemlim: ptr("2GiB")},
		{name: "GOMEMLIMIT off", gomemlim: ptr("off")},
		{name: "GOMEMLIMIT empty", gomemlim: ptr("")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := func(k string) (string, bool) {
				if k == "GOMEMLIMIT" && tc.gomemlim != nil {
					return *tc.gomemlim, true
				}
				return "", false
			}
			limit, set := memoryLimit(workerConfig(t, tc.cache), env)
			if set != tc.wantSet || limit != tc.wantLimit {
				t.Errorf("memoryLimit = %d, %v; want %d, %v", limit, set, tc.wantLimit, tc.wantSet)
			}
		})
	}
}

// TestSetMemoryLimit: SetMemoryLimit applies memoryLimit's value to the
// Go runtime, and leaves the runtime's limit as it was when the process's
// environment sets GOMEMLIMIT. Not parallel: the limit is the process's.
func TestSetMemoryLimit(t *testing.T) {
	prev := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(prev) })
	log := slog.New(slog.DiscardHandler)
	cfg := workerConfig(t, "512MiB")

	t.Run("applied", func(t *testing.T) {
		t.Setenv("GOMEMLIMIT", "") // restored after the test
		if err := os.Unsetenv("GOMEMLIMIT"); err != nil {
			t.Fatal(err)
		}
		debug.SetMemoryLimit(math.MaxInt64)
		SetMemoryLimit(cfg, log)
		if got, want := debug.SetMemoryLimit(-1), int64(512<<20+640<<20); got != want {
			t.Errorf("runtime memory limit %d after SetMemoryLimit, want %d (cache + 640 MiB)", got, want)
		}
	})
	t.Run("GOMEMLIMIT", func(t *testing.T) {
		t.Setenv("GOMEMLIMIT", "off")
		const chosen = 3 << 30
		debug.SetMemoryLimit(chosen)
		SetMemoryLimit(cfg, log)
		if got := debug.SetMemoryLimit(-1); got != chosen {
			t.Errorf("runtime memory limit %d with GOMEMLIMIT set, want it left at %d", got, int64(chosen))
		}
	})
}

func ptr[T any](v T) *T { return &v }
