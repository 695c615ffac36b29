package config

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kdedup/kdedup/consumer"
	"github.com/kdedup/kdedup/dedup"
	"github.com/kdedup/kdedup/filter"
	"github.com/kdedup/kdedup/store"
)

// The defaults config declares in its envDefault tags are the owners'
// defaults: the filter's for the filter parameters and the page size, the
// store's for the cache, the write batch and the write-back, the
// consumer's for the snapshot schedule and the transaction interval, and
// its zero Delivery.
func TestDefaultsAreTheOwners(t *testing.T) {
	c, err := LoadFrom(required())
	if err != nil {
		t.Fatal(err)
	}
	got := c.FilterParams()
	want := filter.Params{}.WithDefaults()
	// The window is off by default, so the filter's defaults leave
	// Generations 0; config's WINDOW_GENERATIONS default is the filter's
	// default for a window.
	if got.WithDefaults() != want || c.WindowGenerations != filter.DefaultGenerations {
		t.Errorf("config's filter defaults %v (generations %d), the filter's %v (generations %d)",
			got.WithDefaults(), c.WindowGenerations, want, filter.DefaultGenerations)
	}
	for _, tc := range []struct {
		name      string
		got, want int64
	}{
		{"KDEDUP_PAGE_BYTES, filter", int64(c.PageBytes), filter.DefaultPageBytes},
		{"KDEDUP_PAGE_BYTES, store", int64(c.PageBytes), store.DefaultPageBytes},
		// 0: the cache's share of the memory budget (internal/budget);
		// store.DefaultCacheBytes is for a store opened without one.
		{"KDEDUP_CACHE_BYTES", int64(c.CacheBytes), 0},
		{"KDEDUP_MEMORY_BYTES", int64(c.MemoryBytes), 0},
		{"KDEDUP_FLUSH_BYTES", int64(c.FlushBytes), store.DefaultFlushBytes},
	} {
		if tc.got != tc.want {
			t.Errorf("%s default %d, its owner's %d", tc.name, tc.got, tc.want)
		}
	}
	// The consumer's defaults it names as constants.
	for _, tc := range []struct {
		name      string
		got, want any
	}{
		{"KDEDUP_SNAPSHOT_INTERVAL", c.SnapshotInterval, consumer.DefaultSnapshotInterval},
		{"KDEDUP_SNAPSHOT_KEEP", c.SnapshotKeep, consumer.DefaultSnapshotKeep},
		{"KDEDUP_TRANSACTION_INTERVAL", c.TransactionInterval, consumer.DefaultTransactionInterval},
		{"KDEDUP_WRITE_BACK_INTERVAL", c.WriteBackInterval, store.DefaultWriteBackInterval},
	} {
		if tc.got != tc.want {
			t.Errorf("%s default %v, the owner's %v", tc.name, tc.got, tc.want)
		}
	}
	var zero consumer.Delivery
	if c.Delivery != zero {
		t.Errorf("KDEDUP_DELIVERY default %v, the consumer's zero value %v", c.Delivery, zero)
	}

	// The consumer's defaults, read back from the client it configures.
	cl, err := kgo.NewClient(consumer.Options{Brokers: []string{"127.0.0.1:1"}}.GroupClientOpts()...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	for _, tc := range []struct {
		name      string
		got, want any
	}{
		{"KDEDUP_GROUP", c.Group, cl.OptValue(kgo.ConsumerGroup)},
		{"KDEDUP_SESSION_TIMEOUT", c.SessionTimeout, cl.OptValue(kgo.SessionTimeout)},
		{"KDEDUP_METADATA_MAX_AGE", c.MetadataMaxAge, cl.OptValue(kgo.MetadataMaxAge)},
		{"KDEDUP_FLUSH_INTERVAL", c.FlushInterval, cl.OptValue(kgo.AutoCommitInterval)},
		{"KDEDUP_MAX_DECOMPRESS_BYTES", int(c.MaxDecompressBytes), cl.OptValue(kgo.MaxDecompressBatchBytes)},
	} {
		if tc.got != tc.want {
			t.Errorf("%s default %v, the consumer's %v", tc.name, tc.got, tc.want)
		}
	}
}

// The page sizes config accepts are accepted by the filter with every
// bucket size and fingerprint width, and by the store with the largest
// FLUSH_BYTES config accepts beside them; the supported range sits inside
// the owners' ranges.
func TestPageLimitsWithinOwners(t *testing.T) {
	if maxPageBytes > store.MaxPageBytes || store.MaxPageBytes > filter.MaxPageBytes {
		t.Fatalf("page limits out of order: config %d, store %d, filter %d", int64(maxPageBytes), store.MaxPageBytes, filter.MaxPageBytes)
	}
	for _, page := range []ByteSize{minPageBytes, maxPageBytes} {
		flush := min(ByteSize(store.MaxFlushBytes(int(page))).FloorMiB(), maxFlushBytes)
		for _, bucket := range []int{2, 4, 8} {
			for _, bits := range []int{0, filter.MinFingerprintBits, filter.MaxFingerprintBits} {
				c, err := LoadFrom(with("KDEDUP_PAGE_BYTES", page.String(), "KDEDUP_BUCKET_SIZE", strconv.Itoa(bucket),
					"KDEDUP_FINGERPRINT_BITS", strconv.Itoa(bits), "KDEDUP_FLUSH_BYTES", strconv.FormatInt(int64(flush), 10),
					"KDEDUP_CAPACITY", "1000"))
				if err != nil {
					t.Fatalf("page %v bucket %d bits %d: config refuses: %v", page, bucket, bits, err)
				}
				if _, err := filter.New(stateParams(c), filter.NewMemPager(int(c.PageBytes))); err != nil {
					t.Errorf("page %v bucket %d bits %d: config accepts, the filter refuses: %v", page, bucket, bits, err)
				}
			}
		}
		// The store's limits do not depend on the filter's parameters.
		c, err := LoadFrom(with("KDEDUP_PAGE_BYTES", page.String(), "KDEDUP_FLUSH_BYTES", strconv.FormatInt(int64(flush), 10)))
		if err != nil {
			t.Fatalf("page %v flush %v: config refuses: %v", page, flush, err)
		}
		db, err := store.Open(store.Options{Dir: t.TempDir(), PageBytes: int(c.PageBytes), CacheBytes: int64(c.CacheBytes), FlushBytes: int64(c.FlushBytes)})
		if err != nil {
			t.Fatalf("page %v flush %v: config accepts, store.Open refuses: %v", page, flush, err)
		}
		if err := db.Close(); err != nil {
			t.Fatal(err)
		}
	}
	for _, page := range []ByteSize{minPageBytes / 2, maxPageBytes * 2} {
		if _, err := LoadFrom(with("KDEDUP_PAGE_BYTES", page.String())); err == nil {
			t.Errorf("config accepts KDEDUP_PAGE_BYTES=%v, outside %v to %v", page, ByteSize(minPageBytes), maxPageBytes)
		}
	}
}

// The limits config shares with the filter are the filter's: the first
// value past each is refused by both, the last value before it accepted by
// both.
func TestFilterLimitsAreTheFilters(t *testing.T) {
	for _, tc := range []struct {
		env       string
		ok, bad   int
		setFilter func(p *filter.Params, v int)
	}{
		{"KDEDUP_MAX_KICKS", filter.MaxMaxKicks, filter.MaxMaxKicks + 1, func(p *filter.Params, v int) { p.MaxKicks = v }},
		{"KDEDUP_EXPANSION", filter.MaxExpansion, filter.MaxExpansion + 1, func(p *filter.Params, v int) { p.Expansion = v }},
		{"KDEDUP_FINGERPRINT_BITS", filter.MaxFingerprintBits, filter.MaxFingerprintBits + 1, func(p *filter.Params, v int) { p.FingerprintBits = v }},
		{"KDEDUP_FINGERPRINT_BITS", filter.MinFingerprintBits, filter.MinFingerprintBits - 1, func(p *filter.Params, v int) { p.FingerprintBits = v }},
		{"KDEDUP_BUCKET_SIZE", 8, 16, func(p *filter.Params, v int) { p.BucketSize = v }},
		{"KDEDUP_BUCKET_SIZE", 2, 3, func(p *filter.Params, v int) { p.BucketSize = v }},
	} {
		t.Run(fmt.Sprintf("%s %d/%d", tc.env, tc.ok, tc.bad), func(t *testing.T) {
			c, err := LoadFrom(with(tc.env, strconv.Itoa(tc.ok)))
			if err != nil {
				t.Fatalf("config refuses %s=%d: %v", tc.env, tc.ok, err)
			}
			if err := stateParams(c).Validate(); err != nil {
				t.Errorf("the filter refuses what config accepts: %v", err)
			}
			if _, err := LoadFrom(with(tc.env, strconv.Itoa(tc.bad))); err == nil {
				t.Errorf("config accepts %s=%d", tc.env, tc.bad)
			}
			p := stateParams(c)
			tc.setFilter(&p, tc.bad)
			if err := p.Validate(); err == nil {
				t.Errorf("the filter accepts %s=%d, which config refuses", tc.env, tc.bad)
			}
		})
	}
	if _, err := LoadFrom(with("KDEDUP_WINDOW", "1h", "KDEDUP_WINDOW_GENERATIONS", strconv.Itoa(filter.MaxGenerations+1))); err == nil {
		t.Errorf("config accepts WINDOW_GENERATIONS=%d, above filter.MaxGenerations", filter.MaxGenerations+1)
	}
}

// KEY is parsed by dedup.ParseKey: config accepts exactly the specs dedup
// parses, and names the variable when it does not.
func TestKeyParsedByDedup(t *testing.T) {
	for _, spec := range []string{"", "key", "header:id", "header:", "json:order.id", "json:", "value", "header", "json", "KEY", " key"} {
		_, derr := dedup.ParseKey(spec)
		_, cerr := LoadFrom(with("KDEDUP_KEY", spec))
		if (derr == nil) != (cerr == nil) {
			t.Errorf("KDEDUP_KEY=%q: dedup.ParseKey error %v, config error %v", spec, derr, cerr)
			continue
		}
		if cerr == nil {
			continue
		}
		want := Problem{Var: "KDEDUP_KEY", Value: spec, Reason: `must be empty, "key", "header:NAME" or "json:PATH", with NAME and PATH not empty`}
		if ps := problemsOf(t, cerr); len(ps) != 1 || ps[0] != want {
			t.Errorf("KDEDUP_KEY=%q: problems %v, want %v", spec, ps, want)
		}
	}
}

// DELIVERY, START_OFFSET and REBUILD are parsed once, into typed values
// whose names are the variables' values; a name they do not know is one
// problem naming the variable, with the reason users have always read.
func TestChoices(t *testing.T) {
	for _, tc := range []struct {
		env, value string
		get        func(Config) fmt.Stringer
		want       fmt.Stringer
	}{
		{"KDEDUP_DELIVERY", "at-least-once", func(c Config) fmt.Stringer { return c.Delivery }, consumer.AtLeastOnce},
		{"KDEDUP_DELIVERY", "exactly-once", func(c Config) fmt.Stringer { return c.Delivery }, consumer.ExactlyOnce},
		{"KDEDUP_START_OFFSET", "earliest", func(c Config) fmt.Stringer { return c.StartOffset }, StartEarliest},
		{"KDEDUP_START_OFFSET", "latest", func(c Config) fmt.Stringer { return c.StartOffset }, StartLatest},
		{"KDEDUP_REBUILD", "replay", func(c Config) fmt.Stringer { return c.Rebuild }, RebuildReplay},
		{"KDEDUP_REBUILD", "empty", func(c Config) fmt.Stringer { return c.Rebuild }, RebuildEmpty},
	} {
		c, err := LoadFrom(with(tc.env, tc.value))
		if err != nil {
			t.Fatalf("%s=%s: %v", tc.env, tc.value, err)
		}
		if got := tc.get(c); got != tc.want || got.String() != tc.value {
			t.Errorf("%s=%s: got %v (%s), want %v", tc.env, tc.value, got, got, tc.want)
		}
	}
	for _, tc := range []struct{ env, value, reason string }{
		{"KDEDUP_DELIVERY", "exactly-twice", "must be at-least-once or exactly-once"},
		{"KDEDUP_DELIVERY", "Exactly-Once", "must be at-least-once or exactly-once"},
		{"KDEDUP_START_OFFSET", "newest", "must be earliest or latest"},
		{"KDEDUP_REBUILD", "full", "must be replay or empty"},
	} {
		_, err := LoadFrom(with(tc.env, tc.value))
		want := Problem{Var: tc.env, Value: tc.value, Reason: tc.reason}
		if ps := problemsOf(t, err); len(ps) != 1 || ps[0] != want {
			t.Errorf("%s=%s: problems %v, want %v", tc.env, tc.value, ps, want)
		}
	}

	// A hand-built Config holding a value outside the names.
	valid, err := LoadFrom(required())
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		mutate func(*Config)
		want   Problem
	}{
		{func(c *Config) { c.Delivery = 7 }, Problem{"KDEDUP_DELIVERY", "Delivery(7)", "must be at-least-once or exactly-once"}},
		{func(c *Config) { c.StartOffset = 2 }, Problem{"KDEDUP_START_OFFSET", "StartOffset(2)", "must be earliest or latest"}},
		{func(c *Config) { c.Rebuild = 9 }, Problem{"KDEDUP_REBUILD", "Rebuild(9)", "must be replay or empty"}},
	} {
		c := valid
		tc.mutate(&c)
		if ps := problemsOf(t, c.Validate()); len(ps) != 1 || ps[0] != tc.want {
			t.Errorf("problems %v, want %v", ps, tc.want)
		}
	}
}

// TestFilterVariablesNameTheParams: FilterVariables names, for each filter
// parameter, the variable that sets it: changing that variable alone
// changes that parameter alone (filter.Params.Diff, with the key spec as
// dedup stores it), and the stored value the difference prints, set back
// into the variable, restores the parameters. Every filter parameter has a
// variable.
func TestFilterVariablesNameTheParams(t *testing.T) {
	params := func(env map[string]string) filter.Params {
		t.Helper()
		c, err := LoadFrom(env)
		if err != nil {
			t.Fatal(err)
		}
		key, err := dedup.ParseKey(c.Key)
		if err != nil {
			t.Fatal(err)
		}
		p := stateParams(c)
		p.KeySpec = key.String()
		return p
	}
	base := []string{"KDEDUP_WINDOW", "1h"} // generations need a window
	stored := params(with(base...))
	names := FilterVariables()
	covered := map[filter.Param]bool{}
	for _, tc := range []struct{ variable, value string }{
		{"KDEDUP_TARGET_FPR", "0.001"},
		{"KDEDUP_FINGERPRINT_BITS", "16"},
		{"KDEDUP_BUCKET_SIZE", "8"},
		{"KDEDUP_CAPACITY", "5000"},
		{"KDEDUP_MAX_KICKS", "100"},
		{"KDEDUP_EXPANSION", "4"},
		{"KDEDUP_PAGE_BYTES", "8KiB"},
		{"KDEDUP_WINDOW", "2h"},
		{"KDEDUP_WINDOW_GENERATIONS", "4"},
		{"KDEDUP_KEY", "header:id"},
	} {
		changed := append(slices.Clone(base), tc.variable, tc.value)
		diffs := stored.Diff(params(with(changed...)))
		if len(diffs) != 1 || names[diffs[0].Param] != tc.variable {
			t.Errorf("%s=%s: differences %v; want one, of the parameter FilterVariables names %s", tc.variable, tc.value, diffs, tc.variable)
			continue
		}
		covered[diffs[0].Param] = true
		restore := diffs[0].Stored
		if diffs[0].Param == filter.ParamKeySpec {
			var err error
			if restore, err = strconv.Unquote(restore); err != nil {
				t.Fatal(err)
			}
		}
		if d := stored.Diff(params(with(append(changed, tc.variable, restore)...))); len(d) != 0 {
			t.Errorf("%s=%s, the stored value printed: differences %v remain", tc.variable, restore, d)
		}
	}
	for _, p := range filter.AllParams() {
		if !covered[p] || !strings.HasPrefix(names[p], Prefix) {
			t.Errorf("filter parameter %s: variable %q, changed by the test: %v", p, names[p], covered[p])
		}
	}
}

// stateParams are the filter parameters a state is written with under c:
// FilterParams with the store's page size, as the deduplicators take it.
func stateParams(c Config) filter.Params {
	p := c.FilterParams()
	p.PageBytes = int(c.PageBytes)
	return p
}
