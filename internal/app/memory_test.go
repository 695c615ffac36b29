package app

import (
	"bytes"
	"errors"
	"log/slog"
	"math"
	"os"
	"regexp"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"

	"github.com/KimMachineGun/automemlimit/memlimit"

	"github.com/kdedup/kdedup/config"
	"github.com/kdedup/kdedup/consumer"
	"github.com/kdedup/kdedup/internal/budget"
	"github.com/kdedup/kdedup/snapshot"
	"github.com/kdedup/kdedup/store"
)

// workerConfig is a valid configuration with the extra variables set.
func workerConfig(t *testing.T, extra ...string) config.Config {
	t.Helper()
	env := map[string]string{
		"KDEDUP_BROKERS": "127.0.0.1:9092", "KDEDUP_INPUT_TOPICS": "in", "KDEDUP_OUTPUT_TOPIC": "out",
		"KDEDUP_GROUP": "g", "KDEDUP_DATA_DIR": t.TempDir(),
	}
	for i := 0; i+1 < len(extra); i += 2 {
		env[extra[i]] = extra[i+1]
	}
	cfg, err := config.LoadFrom(env)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func noLimit() (uint64, error) { return 0, memlimit.ErrNoLimit }

func limitOf(n uint64) func() (uint64, error) { return func() (uint64, error) { return n, nil } }

// TestMemoryBudget: the budget's total comes from KDEDUP_MEMORY_BYTES,
// else 90% of the container limit, else 1 GiB; its split is budget.Plan's
// for the store's own memory at the configured FLUSH_BYTES; a budget too
// small is refused naming the variable and the least that works, which
// is then accepted.
func TestMemoryBudget(t *testing.T) {
	for _, tc := range []struct {
		name      string
		env       []string
		limit     func() (uint64, error)
		wantTotal int64
		source    string
	}{
		{"variable", []string{"KDEDUP_MEMORY_BYTES", "3GiB"}, limitOf(8 << 30), 3 << 30, "KDEDUP_MEMORY_BYTES"},
		{"container", nil, limitOf(4 << 30), 4 << 30 * 9 / 10, "90% of the container's memory limit"},
		{"no container limit", nil, noLimit, budget.DefaultTotalBytes, "default (no container memory limit)"},
		{"unreadable limit", nil, func() (uint64, error) { return 0, errors.New("permission denied") }, budget.DefaultTotalBytes, "could not be read (permission denied)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := workerConfig(t, tc.env...)
			s, source, err := MemoryBudget(cfg, tc.limit)
			if err != nil {
				t.Fatal(err)
			}
			if s.Total != tc.wantTotal || !strings.Contains(source, tc.source) {
				t.Errorf("total %d from %q, want %d from %q", s.Total, source, tc.wantTotal, tc.source)
			}
			restore := max(store.Options{}.ImportMemoryBytes()+snapshot.LoadMemoryBytes, consumer.ReplayMemoryBytes(64<<20))
			want, err := budget.Plan(budget.Inputs{TotalBytes: tc.wantTotal, StoreBytes: store.Options{}.MemoryBytes(), DecompressBytes: 64 << 20, PageBytes: 4096, RestoreBytes: restore})
			if err != nil {
				t.Fatal(err)
			}
			if s != want {
				t.Errorf("split %+v, want %+v", s, want)
			}
		})
	}

	t.Run("too small", func(t *testing.T) {
		_, _, err := MemoryBudget(workerConfig(t, "KDEDUP_MEMORY_BYTES", "256MiB"), noLimit)
		if !errors.Is(err, budget.ErrTooSmall) || !strings.Contains(err.Error(), "KDEDUP_MEMORY_BYTES=256MiB") {
			t.Fatalf("err = %v, want ErrTooSmall naming KDEDUP_MEMORY_BYTES", err)
		}
		m := regexp.MustCompile(`at least (\d+) bytes \(\d+ MiB\) are needed`).FindStringSubmatch(err.Error())
		if m == nil {
			t.Fatalf("no least budget in %q", err)
		}
		least, _ := strconv.ParseInt(m[1], 10, 64)
		if least <= 256<<20 {
			t.Fatalf("no least budget above 256MiB in %q", err)
		}
		if _, _, err := MemoryBudget(workerConfig(t, "KDEDUP_MEMORY_BYTES", strconv.FormatInt(least, 10)), noLimit); err != nil {
			t.Errorf("the least budget named, %d, is refused: %v", least, err)
		}
		if _, _, err := MemoryBudget(workerConfig(t, "KDEDUP_MEMORY_BYTES", strconv.FormatInt(least-2<<20, 10)), noLimit); err == nil {
			t.Errorf("2 MiB under the least budget named, %d, is accepted", least)
		}
	})

	t.Run("cache override", func(t *testing.T) {
		s, _, err := MemoryBudget(workerConfig(t, "KDEDUP_MEMORY_BYTES", "4GiB", "KDEDUP_CACHE_BYTES", "6GiB"), noLimit)
		if err != nil {
			t.Fatal(err)
		}
		if s.Cache != 6<<30 || !s.CacheOverride || s.Over <= 0 {
			t.Errorf("cache %d (override %t, over %d), want 6GiB as given, over its share", s.Cache, s.CacheOverride, s.Over)
		}
	})
}

// TestMemoryLimit: the soft memory limit is the budget's GoLimit, unless
// GOMEMLIMIT is in the environment, whatever its value, or the budget is
// too small.
func TestMemoryLimit(t *testing.T) {
	cfg := workerConfig(t, "KDEDUP_MEMORY_BYTES", "4GiB")
	s, _, err := MemoryBudget(cfg, noLimit)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name      string
		cfg       config.Config
		gomemlim  *string
		wantLimit int64
		wantSet   bool
	}{
		{name: "budget", cfg: cfg, wantLimit: s.GoLimit, wantSet: true},
		{name: "GOMEMLIMIT set", cfg: cfg, gomemlim: ptr("2GiB")},
		{name: "GOMEMLIMIT off", cfg: cfg, gomemlim: ptr("off")},
		{name: "GOMEMLIMIT empty", cfg: cfg, gomemlim: ptr("")},
		{name: "budget too small", cfg: workerConfig(t, "KDEDUP_MEMORY_BYTES", "100MiB")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := func(k string) (string, bool) {
				if k == "GOMEMLIMIT" && tc.gomemlim != nil {
					return *tc.gomemlim, true
				}
				return "", false
			}
			limit, set := memoryLimit(tc.cfg, env, noLimit)
			if set != tc.wantSet || limit != tc.wantLimit {
				t.Errorf("memoryLimit = %d, %v; want %d, %v", limit, set, tc.wantLimit, tc.wantSet)
			}
		})
	}
	if s.GoLimit != s.Total-s.NonGo || s.GoLimit >= 4<<30 {
		t.Errorf("GoLimit %d of a 4GiB budget (outside Go %d)", s.GoLimit, s.NonGo)
	}
}

// TestSetMemoryLimit: SetMemoryLimit applies memoryLimit's value to the
// Go runtime, and leaves the runtime's limit as it was when the process's
// environment sets GOMEMLIMIT. Not parallel: the limit is the process's.
func TestSetMemoryLimit(t *testing.T) {
	prev := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(prev) })
	log := slog.New(slog.DiscardHandler)
	cfg := workerConfig(t, "KDEDUP_MEMORY_BYTES", "3GiB")

	t.Run("applied", func(t *testing.T) {
		t.Setenv("GOMEMLIMIT", "") // restored after the test
		if err := os.Unsetenv("GOMEMLIMIT"); err != nil {
			t.Fatal(err)
		}
		debug.SetMemoryLimit(math.MaxInt64)
		SetMemoryLimit(cfg, log)
		want, _ := memoryLimit(cfg, func(string) (string, bool) { return "", false }, noLimit)
		if got := debug.SetMemoryLimit(-1); got != want || got >= 3<<30 {
			t.Errorf("runtime memory limit %d after SetMemoryLimit, want %d, under the budget", got, want)
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

// TestCacheWatch: one WARN when the owned partitions' pages pass the page
// cache, naming the bytes needed, nothing more while they stay over, one
// INFO when they fit again.
func TestCacheWatch(t *testing.T) {
	var buf bytes.Buffer
	c := &cacheWatch{log: slog.New(slog.NewTextHandler(&buf, nil))}
	for _, state := range []int64{10, 100, 101, 150, 120, 100, 90, 101} {
		c.check(state, 100)
	}
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	want := []string{
		`level=WARN .* state_bytes=101 page_cache_bytes=100 needed_bytes=1$`,
		`level=INFO .* state_bytes=100 page_cache_bytes=100$`,
		`level=WARN .* state_bytes=101 page_cache_bytes=100 needed_bytes=1$`,
	}
	if len(lines) != len(want) {
		t.Fatalf("%d lines, want %d:\n%s", len(lines), len(want), buf.String())
	}
	for i, w := range want {
		if !regexp.MustCompile(w).MatchString(lines[i]) {
			t.Errorf("line %d %q, want %q", i, lines[i], w)
		}
	}
}

func ptr[T any](v T) *T { return &v }

// TestContainerFigures: the page cache a worker with the default
// configuration gets in the chart's 3Gi container and in a 2Gi one, as
// the budget's package comment, docs/operations.md and the chart's README
// state it, holds to within 2%.
func TestContainerFigures(t *testing.T) {
	for _, tc := range []struct {
		limit    uint64
		cacheMiB int64
	}{
		{3 << 30, 1403},
		{2 << 30, 698},
	} {
		s, _, err := MemoryBudget(workerConfig(t), limitOf(tc.limit))
		if err != nil {
			t.Fatal(err)
		}
		if d := s.Cache>>20 - tc.cacheMiB; d > tc.cacheMiB/50 || -d > tc.cacheMiB/50 {
			t.Errorf("a %d MiB container: page cache %d MiB, the docs say about %d MiB", tc.limit>>20, s.Cache>>20, tc.cacheMiB)
		}
	}
}
