package dedup

import (
	"log/slog"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/goleak"

	"github.com/kdedup/kdedup/store"
)

// Badger starts goroutines for every DB a test opens; each must be gone
// once the test has closed its DB.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// quiet drops Badger's and the store's log lines.
var quiet = slog.New(slog.DiscardHandler)

// openDB opens a store, in memory when dir is empty, and closes it when the
// test ends (a test may close it earlier; Close is idempotent).
func openDB(t testing.TB, dir string, opts store.Options) *store.DB {
	t.Helper()
	opts.Dir, opts.InMemory, opts.Logger = dir, dir == "", quiet
	db, err := store.Open(opts)
	if err != nil {
		t.Fatalf("store.Open(%q): %v", dir, err)
	}
	t.Cleanup(func() {
		if err := db.Close(); err != nil {
			t.Errorf("closing the store: %v", err)
		}
	})
	return db
}

// openPartition opens topic/partition; the caller closes it.
func openPartition(t testing.TB, db *store.DB, topic string, partition int32, opts Options, m *Metrics) *Deduplicator {
	t.Helper()
	p, err := Open(db, topic, partition, opts, m)
	if err != nil {
		t.Fatalf("Open(%s/%d): %v", topic, partition, err)
	}
	return p
}

// metric returns the series name{topic, partition} gathered from reg.
func metric(t testing.TB, reg prometheus.Gatherer, name, topic, partition string) (*dto.Metric, bool) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("gathering metrics: %v", err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if len(labels) == 2 && labels["topic"] == topic && labels["partition"] == partition {
				return m, true
			}
		}
	}
	return nil, false
}

// counterValue returns the value of counter name{topic, partition}; the
// series must exist.
func counterValue(t testing.TB, reg prometheus.Gatherer, name, topic, partition string) float64 {
	t.Helper()
	m, ok := metric(t, reg, name, topic, partition)
	if !ok || m.GetCounter() == nil {
		t.Fatalf("no counter %s{topic=%q,partition=%q}", name, topic, partition)
	}
	return m.GetCounter().GetValue()
}

// seriesCount returns how many series the family name has in reg.
func seriesCount(t testing.TB, reg prometheus.Gatherer, name string) int {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("gathering metrics: %v", err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return len(mf.GetMetric())
		}
	}
	return 0
}
