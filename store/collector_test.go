package store

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/kdedup/kdedup/filter"
)

// TestCollector reads the Badger size and cache metrics of a DB on disk
// from its handle: after a reopen (Badger scans sizes at open) the LSM and
// value log have a size, the levels hold the flushed table, a page read
// goes through the block cache; after Close nothing is reported.
func TestCollector(t *testing.T) {
	dir := t.TempDir()
	const pb = 4096
	db := openT(t, Options{Dir: dir, PageBytes: pb})
	p := partitionT(t, db, "orders", 0)
	id := filter.PageID{Page: 3}
	write(t, p, id, pageBytes(pb, id, 1))
	if err := p.Commit([]byte("meta"), Checkpoint{Offset: 1}); err != nil {
		t.Fatal(err)
	}
	p.Close()
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}

	reg := prometheus.NewRegistry()
	db = openT(t, Options{Dir: dir, PageBytes: pb, Registerer: reg})
	mustPage(t, partitionT(t, db, "orders", 0), id) // a miss of the page cache: read from Badger
	values := gatherBadger(t, reg)
	for _, name := range []string{"kdedup_badger_lsm_size_bytes", "kdedup_badger_vlog_size_bytes", "kdedup_badger_level_tables", "kdedup_badger_level_size_bytes"} {
		if values[name] <= 0 {
			t.Errorf("%s = %v, want > 0", name, values[name])
		}
	}
	if n := values["kdedup_badger_cache_hits_total"] + values["kdedup_badger_cache_misses_total"]; n == 0 {
		t.Error("the block cache saw no lookup after a page read from Badger")
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if values := gatherBadger(t, reg); len(values) != 0 {
		t.Errorf("after Close: %v, want nothing", values)
	}
}

// gatherBadger sums the samples of each kdedup_badger_ family in reg.
func gatherBadger(t *testing.T, reg prometheus.Gatherer) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	values := map[string]float64{}
	for _, mf := range mfs {
		if !strings.HasPrefix(mf.GetName(), "kdedup_badger_") {
			continue
		}
		for _, m := range mf.GetMetric() {
			values[mf.GetName()] += sample(m)
		}
	}
	return values
}

func sample(m *dto.Metric) float64 { return m.GetGauge().GetValue() + m.GetCounter().GetValue() }
