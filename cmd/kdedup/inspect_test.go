package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kdedup/kdedup/dedup"
	"github.com/kdedup/kdedup/filter"
	"github.com/kdedup/kdedup/store"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// testPageBytes is not the default, so that the commands must take the page
// size from the state.
const testPageBytes = 512

// Two filters of one data directory: a fixed width that expands past its
// first sub-filter, and a window over target-rate widths.
var (
	fixedParams  = filter.Params{FingerprintBits: 32, Capacity: 300, PageBytes: testPageBytes}
	windowParams = filter.Params{TargetFPR: 1e-3, Capacity: 500, PageBytes: testPageBytes, Window: 8 * time.Second, Generations: 4}
)

// base is the timestamp of the first record of the test state.
var base = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// partitionState is what buildState writes to one topic-partition: records
// in offset order, and the exact set of keys it holds afterwards.
type partitionState struct {
	tp     store.TopicPartition
	params filter.Params
	maxOcc int
	recs   []*kgo.Record
	held   map[string]int // key -> copies, the exact model
	// gens is, with a window, the generation of each copy of each held
	// key, oldest first (len held[key]); nil without a window.
	gens map[string][]int64
	// genBits is the generation tag width the state must have: the least
	// t with 2^t >= Generations+2, 0 without a window.
	genBits int
	epoch   int32
}

// modelGenerations is the exact model of filter.Chain.Generations: the
// live copies of s's held keys by generation, oldest first.
func (s *partitionState) modelGenerations() []filter.GenerationItems {
	byGen := map[int64]uint64{}
	for _, gs := range s.gens {
		for _, g := range gs {
			byGen[g]++
		}
	}
	out := []filter.GenerationItems{}
	for g, n := range byGen {
		out = append(out, filter.GenerationItems{Generation: g, Items: n})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Generation < out[j].Generation })
	return out
}

// testState returns the records of the test state: orders/0 has 1,000 keys
// (some sent twice, 100 deleted) on fixedParams; orders/1 has 400 keys over
// 10 s of record time on windowParams, 2 records each for keys kept with
// up to 2 copies (MaxOccurrences 2), then a second copy of w-0003 late but
// in the window (its copies are of two generations) and a key more than a
// window late (kept in the oldest live generation).
func testState() []*partitionState {
	fixed := &partitionState{tp: store.TopicPartition{Topic: "orders", Partition: 0}, params: fixedParams, held: map[string]int{}, epoch: 3}
	for i := range 1000 {
		k := fmt.Sprintf("key-%04d", i)
		fixed.recs = append(fixed.recs, &kgo.Record{Key: []byte(k), Value: []byte("v"), Timestamp: base})
		if i%3 == 0 { // a retry: a duplicate
			fixed.recs = append(fixed.recs, &kgo.Record{Key: []byte(k), Value: []byte("v"), Timestamp: base})
		}
		fixed.held[k] = 1
	}
	for i := 0; i < 1000; i += 10 {
		k := fmt.Sprintf("key-%04d", i)
		fixed.recs = append(fixed.recs, &kgo.Record{Key: []byte(k), Timestamp: base}) // tombstone
		delete(fixed.held, k)
	}

	win := &partitionState{tp: store.TopicPartition{Topic: "orders", Partition: 1}, params: windowParams, maxOcc: 2,
		held: map[string]int{}, gens: map[string][]int64{}, genBits: 3, epoch: 7}
	wp := windowParams.WithDefaults()
	watermark := int64(math.MinInt64)
	send := func(k string, ts time.Time) {
		win.recs = append(win.recs, &kgo.Record{Key: []byte(k), Value: []byte("v"), Timestamp: ts})
		watermark = max(watermark, ts.UnixMilli())
		if win.held[k] < win.maxOcc { // no refresh: a copy over the limit changes nothing
			win.held[k]++
			win.gens[k] = append(win.gens[k], max(wp.Generation(ts.UnixMilli()), wp.OldestLive(watermark)))
		}
	}
	for i := range 400 {
		k := fmt.Sprintf("w-%04d", i)
		ts := base.Add(time.Duration(i) * 25 * time.Millisecond) // 10 s: 5 generations of 2 s, all live
		send(k, ts)
		if i%2 == 0 {
			send(k, ts)
		}
	}
	send("w-0003", base.Add(5*time.Second))   // late, in the window: its own generation
	send("late-0000", base.Add(-time.Minute)) // a window late: the oldest live generation
	for k, gs := range win.gens {
		sort.Slice(gs, func(i, j int) bool { return gs[i] < gs[j] })
		if gs[0] < wp.OldestLive(watermark) {
			panic(fmt.Sprintf("test state: a copy of %s expired; the model keeps none", k))
		}
	}
	return []*partitionState{fixed, win}
}

// buildState decides states' records with the worker's own dedup.Deduplicator
// in a data directory and commits them, as a stopped worker leaves it.
func buildState(t *testing.T, states []*partitionState) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "data")
	db, err := store.Open(store.Options{Dir: dir, PageBytes: testPageBytes, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range states {
		p, err := dedup.Open(db, s.tp.Topic, s.tp.Partition, dedup.Options{Filter: s.params, MaxOccurrences: s.maxOcc}, nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range s.recs {
			if _, err := p.Decide(r); err != nil {
				t.Fatal(err)
			}
		}
		if err := p.Commit(store.Checkpoint{Offset: int64(len(s.recs)), LeaderEpoch: s.epoch}); err != nil {
			t.Fatal(err)
		}
		p.Close()
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	return dir
}

// readChains opens dir read-only as the test's own reference and returns
// each topic-partition's chain metadata and Stats.
func readChains(t *testing.T, dir string) map[store.TopicPartition]struct {
	meta  filter.Meta
	stats filter.Stats
} {
	t.Helper()
	db, err := store.Open(store.Options{Dir: dir, PageBytes: testPageBytes, ReadOnly: true, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	tps, err := db.Partitions()
	if err != nil {
		t.Fatal(err)
	}
	out := map[store.TopicPartition]struct {
		meta  filter.Meta
		stats filter.Stats
	}{}
	for _, tp := range tps {
		sp, err := db.Partition(tp.Topic, tp.Partition)
		if err != nil {
			t.Fatal(err)
		}
		m, err := filter.DecodeMeta(sp.Meta())
		if err != nil {
			t.Fatal(err)
		}
		c, err := filter.Open(sp.Meta(), m.Params, sp)
		if err != nil {
			t.Fatal(err)
		}
		out[tp] = struct {
			meta  filter.Meta
			stats filter.Stats
		}{m, c.Stats()}
		sp.Close()
	}
	return out
}

// wantRef is generation gen of a span of span ms as check and inspect
// must report it: its record time bounds computed here, [gen*span,
// (gen+1)*span).
func wantRef(gen, span int64) generationRef {
	start := time.UnixMilli(gen * span).UTC().Format("2006-01-02T15:04:05.000Z07:00")
	end := time.UnixMilli((gen + 1) * span).UTC().Format("2006-01-02T15:04:05.000Z07:00")
	return generationRef{Generation: gen, Start: &start, End: &end}
}

// fmtGenerations prints generations with their bounds (%+v prints the
// pointers).
func fmtGenerations(gens []generationReport) string {
	parts := []string{}
	for _, g := range gens {
		parts = append(parts, fmt.Sprintf("%s: %d", describeGeneration(g.generationRef), g.Items))
	}
	return "[" + strings.Join(parts, "; ") + "]"
}

func run(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	err := dispatch(t.Context(), args, &stdout, &stderr)
	if stderr.Len() > 0 {
		t.Logf("stderr of %q:\n%s", args, stderr.String())
	}
	return stdout.String(), err
}

// TestInspectJSON checks every figure of inspect -json against the state's
// own metadata and Stats, and the items against the exact model.
func TestInspectJSON(t *testing.T) {
	states := testState()
	dir := buildState(t, states)
	ref := readChains(t, dir)
	out, err := run(t, "inspect", "-json", "-data-dir", dir)
	if err != nil {
		t.Fatal(err)
	}
	var rep inspectReport
	dec := json.NewDecoder(strings.NewReader(out))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&rep); err != nil {
		t.Fatalf("decoding %s: %v", out, err)
	}
	if rep.Version != 2 || rep.DataDir != dir || len(rep.Partitions) != len(states) {
		t.Fatalf("report header: version %d, data_dir %q, %d partitions", rep.Version, rep.DataDir, len(rep.Partitions))
	}
	for i, s := range states {
		pr := rep.Partitions[i]
		want := ref[s.tp]
		if pr.Topic != s.tp.Topic || pr.Partition != s.tp.Partition {
			t.Fatalf("partition %d is %s/%d, want %s", i, pr.Topic, pr.Partition, s.tp)
		}
		checkPartitionReport(t, pr, s, want.meta, want.stats)
	}
	if !strings.Contains(out, `"watermark_ms": null`) || !strings.Contains(out, `"generations": []`) || strings.Contains(out, `"generation_start": null`) {
		t.Errorf("the fixed filter's watermark is not null, or its generations not an empty list, or a generation has null bounds:\n%s", out)
	}
}

func checkPartitionReport(t *testing.T, pr partitionReport, s *partitionState, meta filter.Meta, st filter.Stats) {
	t.Helper()
	if pr.Checkpoint != (checkpointReport{Offset: int64(len(s.recs)), LeaderEpoch: s.epoch}) {
		t.Errorf("%s: checkpoint %+v, want offset %d epoch %d", s.tp, pr.Checkpoint, len(s.recs), s.epoch)
	}
	p := s.params.WithDefaults()
	p.KeySpec = "key" // dedup stores its key spec, the record key here
	span := p.Window.Milliseconds() / int64(max(1, p.Generations))
	wantParams := paramsReport{TargetFPR: p.TargetFPR, FingerprintBits: p.FingerprintBits, BucketSize: p.BucketSize,
		Capacity: p.Capacity, MaxKicks: p.MaxKicks, Expansion: p.Expansion, PageBytes: p.PageBytes,
		WindowMillis: p.Window.Milliseconds(), Generations: p.Generations, GenerationSpanMillis: span, GenerationBits: s.genBits, Key: "key"}
	if pr.Params != wantParams || meta.Params != p || p.GenerationBits() != s.genBits || pr.FormatVersion != meta.FormatVersion {
		t.Errorf("%s: params %+v (format %d), want %+v (stored %s, format %d)", s.tp, pr.Params, pr.FormatVersion, wantParams, meta.Params, meta.FormatVersion)
	}
	switch {
	case st.Watermark == math.MinInt64 && (pr.WatermarkMillis != nil || pr.Watermark != nil):
		t.Errorf("%s: watermark set without one in Stats", s.tp)
	case st.Watermark != math.MinInt64 && (pr.WatermarkMillis == nil || *pr.WatermarkMillis != st.Watermark ||
		*pr.Watermark != time.UnixMilli(st.Watermark).UTC().Format("2006-01-02T15:04:05.000Z07:00")):
		t.Errorf("%s: watermark %v %v, want %d", s.tp, pr.WatermarkMillis, pr.Watermark, st.Watermark)
	}
	if len(pr.SubFilters) != len(meta.SubFilters) {
		t.Fatalf("%s: %d sub-filters, metadata has %d", s.tp, len(pr.SubFilters), len(meta.SubFilters))
	}
	var items uint64
	for i, sf := range meta.SubFilters {
		got := pr.SubFilters[i]
		slots := sf.Slots(p.BucketSize)
		load := float64(sf.Items) / float64(slots)
		want := subFilterReport{ID: sf.ID, Pages: sf.Pages, RootPages: sf.RootPages, Buckets: sf.Buckets(), Slots: slots,
			FingerprintBits: sf.FingerprintBits, Items: sf.Items, LoadFactor: load,
			EstimatedFPR: sf.EstimatedFPR(), Bytes: sf.Pages * uint64(p.PageBytes)}
		var entries uint64
		for l, n := range got.Entries {
			if d := l - (sf.FingerprintBits - 1); d < 0 || d > filter.MaxDepth || sf.Lengths[d] != n {
				t.Errorf("%s sub-filter %d: %d entries of length %d, the metadata counts %v", s.tp, i, n, l, sf.Lengths)
			}
			entries += n
		}
		if entries != sf.Items {
			t.Errorf("%s sub-filter %d: entries by length sum to %d, items %d", s.tp, i, entries, sf.Items)
		}
		got.Entries = nil
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s sub-filter %d:\n got %+v\nwant %+v", s.tp, i, got, want)
		}
		items += sf.Items
	}
	// The generations: exactly the model's, by generation, with bounds
	// from the span (not from the code under test).
	wantGens := []generationReport{}
	var genItems uint64
	for _, g := range s.modelGenerations() {
		wantGens = append(wantGens, generationReport{generationRef: wantRef(g.Generation, span), Items: g.Items})
	}
	for _, g := range pr.Generations {
		genItems += g.Items
	}
	if pr.Generations == nil || !reflect.DeepEqual(pr.Generations, wantGens) {
		t.Errorf("%s: generations\n got %s\nwant %s", s.tp, fmtGenerations(pr.Generations), fmtGenerations(wantGens))
	}
	if span != 0 && (len(pr.Generations) != st.Generations || genItems != st.Items) {
		t.Errorf("%s: %d generations of %d items, Stats has %d generations of %d items", s.tp, len(pr.Generations), genItems, st.Generations, st.Items)
	}
	wantTotals := totalsReport{SubFilters: st.SubFilters, Generations: st.Generations, Items: st.Items, Slots: st.Slots,
		LoadFactor: st.LoadFactor, NewestLoadFactor: st.NewestLoadFactor, EstimatedFPR: st.EstimatedFPR, Bytes: st.Bytes,
		NewestFingerprintBits: st.NewestFingerprintBits, NearFull: st.NearFull}
	if pr.Totals != wantTotals {
		t.Errorf("%s: totals\n got %+v\nwant %+v", s.tp, pr.Totals, wantTotals)
	}
	modelItems := 0
	for _, n := range s.held {
		modelItems += n
	}
	if pr.Totals.Items != uint64(modelItems) || items != uint64(modelItems) {
		t.Errorf("%s: %d items (sub-filters sum to %d), the exact model holds %d", s.tp, pr.Totals.Items, items, modelItems)
	}
}

// TestInspectFixtureShape: the fixture does what the tests rely on.
func TestInspectFixtureShape(t *testing.T) {
	ref := readChains(t, buildState(t, testState()))
	if st := ref[store.TopicPartition{Topic: "orders", Partition: 0}].stats; st.Splits == 0 {
		t.Errorf("orders/0 has %d splits, want a grown chain", st.Splits)
	}
	if st := ref[store.TopicPartition{Topic: "orders", Partition: 1}].stats; st.Generations != 5 {
		t.Errorf("orders/1 has %d generations, want 5", st.Generations)
	}
	if gens := testState()[1].modelGenerations(); len(gens) != 5 || gens[0].Generation != base.UnixMilli()/2000 {
		t.Errorf("the model of orders/1 has generations %+v, want 5 from %d", gens, base.UnixMilli()/2000)
	}
}

// TestInspectText checks that the table carries the same figures.
func TestInspectText(t *testing.T) {
	states := testState()
	dir := buildState(t, states)
	ref := readChains(t, dir)
	out, err := run(t, "inspect", "-data-dir", dir)
	if err != nil {
		t.Fatal(err)
	}
	sections := strings.Split(out, "\n\n")
	if len(sections) != len(states) {
		t.Fatalf("%d sections, want %d:\n%s", len(sections), len(states), out)
	}
	for i, s := range states {
		sec := sections[i]
		meta, st := ref[s.tp].meta, ref[s.tp].stats
		p := meta.Params
		want := []string{
			fmt.Sprintf("%s: checkpoint offset %d (leader epoch %d)", s.tp, len(s.recs), s.epoch),
			fmt.Sprintf("bucket size %d, capacity %d, page bytes %d, expansion %d, max kicks %d", p.BucketSize, p.Capacity, p.PageBytes, p.Expansion, p.MaxKicks),
			"key:       key (KDEDUP_KEY)",
			fmt.Sprintf("total:     %d items in %d slots, load %.4f, estimated FPR %.3g, %d bytes, %d sub-filters in %d %s, near full: no",
				st.Items, st.Slots, st.LoadFactor, st.EstimatedFPR, st.Bytes, st.SubFilters, st.Generations, plural(st.Generations, "generation", "generations")),
		}
		if p.FingerprintBits != 0 {
			want = append(want, "fixed fingerprint width 32 bits", "window:    none", "watermark: none")
		} else {
			want = append(want, "target FPR 0.001", "window:    8s in 4 generations of 2s, a 3-bit generation tag in each slot",
				"watermark: "+time.UnixMilli(st.Watermark).UTC().Format("2006-01-02T15:04:05.000Z07:00"))
		}
		lines := strings.Split(sec, "\n")
		for _, sf := range meta.SubFilters {
			slots := sf.Slots(p.BucketSize)
			load := float64(sf.Items) / float64(slots)
			row := strings.Fields(fmt.Sprintf("%d %d %d %d %d %.4f %.3g %d", sf.ID, sf.Pages, slots, sf.FingerprintBits, sf.Items, load,
				sf.EstimatedFPR(), sf.Pages*uint64(p.PageBytes)))
			found := false
			for _, l := range lines {
				f := strings.Fields(l)
				if strings.Join(f, " ") == strings.Join(row, " ") {
					found = true
				}
			}
			if !found {
				t.Errorf("%s: no row for sub-filter %d (%v):\n%s", s.tp, sf.ID, row, sec)
			}
		}
		// One line per live generation of the model, none without a
		// window.
		var genLines []string
		for _, l := range lines {
			if strings.HasPrefix(l, "  generation ") {
				genLines = append(genLines, l)
			}
		}
		var wantLines []string
		for _, g := range s.modelGenerations() {
			r := wantRef(g.Generation, p.SpanMillis())
			wantLines = append(wantLines, fmt.Sprintf("  generation %d (record time %s .. %s): %d %s", g.Generation, *r.Start, *r.End, g.Items, plural(int(g.Items), "item", "items")))
		}
		if strings.Join(genLines, "\n") != strings.Join(wantLines, "\n") {
			t.Errorf("%s: generation lines\n%s\nwant\n%s", s.tp, strings.Join(genLines, "\n"), strings.Join(wantLines, "\n"))
		}
		for _, w := range want {
			if !strings.Contains(sec, w) {
				t.Errorf("%s: section lacks %q:\n%s", s.tp, w, sec)
			}
		}
	}
}

func TestInspectSelects(t *testing.T) {
	dir := buildState(t, testState())
	for _, tt := range []struct {
		args []string
		want []string
	}{
		{[]string{"-partition", "1"}, []string{"orders/1"}},
		{[]string{"-topic", "orders"}, []string{"orders/0", "orders/1"}},
		{[]string{"-topic", "other"}, nil},
	} {
		out, err := run(t, append([]string{"inspect", "-json", "-data-dir", dir}, tt.args...)...)
		if err != nil {
			t.Fatal(err)
		}
		var rep inspectReport
		if err := json.Unmarshal([]byte(out), &rep); err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, pr := range rep.Partitions {
			got = append(got, fmt.Sprintf("%s/%d", pr.Topic, pr.Partition))
		}
		if strings.Join(got, ",") != strings.Join(tt.want, ",") {
			t.Errorf("inspect %v: %v, want %v", tt.args, got, tt.want)
		}
		if tt.want == nil && rep.Partitions == nil {
			t.Errorf("inspect %v: partitions is null, want []", tt.args)
		}
	}
}

// TestInspectRefuses: a missing directory is a usage error (exit code 2); a
// directory a worker holds says to stop it or inspect a copy.
func TestInspectRefuses(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "nope")
	for _, cmd := range [][]string{{"inspect"}, {"check", "k", "-topic", "orders", "-partition", "0"}} {
		if _, err := run(t, append(cmd, "-data-dir", missing)...); !errors.Is(err, errUsage) || !strings.Contains(err.Error(), "does not exist") {
			t.Errorf("%s on a missing directory: %v, want a usage error saying it does not exist", cmd[0], err)
		}
	}

	dir := buildState(t, testState())
	db, err := store.Open(store.Options{Dir: dir, PageBytes: testPageBytes, Logger: quiet}) // as a running worker
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, cmd := range [][]string{{"inspect"}, {"check", "k", "-topic", "orders", "-partition", "0"}} {
		_, err := run(t, append(cmd, "-data-dir", dir)...)
		if !errors.Is(err, store.ErrLocked) || errors.Is(err, errUsage) || !strings.Contains(err.Error(), "stop the worker") || !strings.Contains(err.Error(), "copy or snapshot") {
			t.Errorf("%s on a locked directory: %v", cmd[0], err)
		}
	}
}

func TestInspectUsage(t *testing.T) {
	if _, err := run(t, "inspect", "extra"); !errors.Is(err, errUsage) {
		t.Errorf("inspect with an argument: %v, want a usage error", err)
	}
	if _, err := run(t, "inspect", "-bogus"); !errors.Is(err, errUsage) {
		t.Errorf("inspect -bogus: %v, want a usage error", err)
	}
	if _, err := run(t, "inspect", "-h"); err != nil {
		t.Errorf("inspect -h: %v", err)
	}
}

// TestInspectDefaultDataDir: without -data-dir, KDEDUP_DATA_DIR is read.
func TestInspectDefaultDataDir(t *testing.T) {
	dir := buildState(t, testState())
	t.Setenv("KDEDUP_DATA_DIR", dir)
	out, err := run(t, "inspect")
	if err != nil || !strings.Contains(out, "orders/1: checkpoint") {
		t.Fatalf("inspect with KDEDUP_DATA_DIR: %v\n%s", err, out)
	}
}
