package tests

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kdedup/kdedup/filter"
	"github.com/kdedup/kdedup/internal/scenario"
	"github.com/kdedup/kdedup/store"
)

// inspectDoc is the documented JSON of `kdedup inspect -json` (version 2),
// as a script reads it.
type inspectDoc struct {
	Version    int    `json:"version"`
	DataDir    string `json:"data_dir"`
	Partitions []struct {
		Topic      string `json:"topic"`
		Partition  int32  `json:"partition"`
		Checkpoint struct {
			Offset      int64 `json:"offset"`
			LeaderEpoch int32 `json:"leader_epoch"`
		} `json:"checkpoint"`
		FormatVersion int `json:"format_version"`
		Params        struct {
			TargetFPR        float64 `json:"target_fpr"`
			FingerprintBits  int     `json:"fingerprint_bits"`
			BucketSize       int     `json:"bucket_size"`
			Capacity         uint64  `json:"capacity"`
			MaxKicks         int     `json:"max_kicks"`
			Expansion        int     `json:"expansion"`
			PageBytes        int     `json:"page_bytes"`
			WindowMillis     int64   `json:"window_ms"`
			Generations      int     `json:"generations"`
			GenerationSpanMs int64   `json:"generation_span_ms"`
			GenerationBits   int     `json:"generation_bits"`
		} `json:"params"`
		WatermarkMillis *int64  `json:"watermark_ms"`
		Watermark       *string `json:"watermark"`
		SubFilters      []struct {
			ID              uint32  `json:"id"`
			Pages           uint64  `json:"pages"`
			Buckets         uint64  `json:"buckets"`
			Slots           uint64  `json:"slots"`
			FingerprintBits int     `json:"fingerprint_bits"`
			Items           uint64  `json:"items"`
			LoadFactor      float64 `json:"load_factor"`
			EstimatedFPR    float64 `json:"estimated_fpr"`
			Bytes           uint64  `json:"bytes"`
		} `json:"sub_filters"`
		Generations []struct {
			generationDoc
			Items uint64 `json:"items"`
		} `json:"generations"`
		Totals struct {
			SubFilters            int     `json:"sub_filters"`
			Generations           int     `json:"generations"`
			Items                 uint64  `json:"items"`
			Slots                 uint64  `json:"slots"`
			LoadFactor            float64 `json:"load_factor"`
			NewestLoadFactor      float64 `json:"newest_load_factor"`
			EstimatedFPR          float64 `json:"estimated_fpr"`
			Bytes                 uint64  `json:"bytes"`
			NewestFingerprintBits int     `json:"newest_fingerprint_bits"`
			NearFull              bool    `json:"near_full"`
		} `json:"totals"`
	} `json:"partitions"`
}

// checkDoc is the documented JSON of `kdedup check -json` (version 2).
type checkDoc struct {
	Version      int     `json:"version"`
	Key          string  `json:"key"`
	Present      bool    `json:"present"`
	Count        int     `json:"count"`
	Duplicate    bool    `json:"duplicate"`
	EstimatedFPR float64 `json:"estimated_fpr"`
	Locations    []struct {
		SubFilter   uint32          `json:"sub_filter"`
		Copies      int             `json:"copies"`
		Generations []generationDoc `json:"generations"`
	} `json:"locations"`
}

// generationDoc is a generation of a window in both documents.
type generationDoc struct {
	Generation int64   `json:"generation"`
	Start      *string `json:"generation_start"`
	End        *string `json:"generation_end"`
}

// kdedup runs the built binary and returns its stdout, stderr and exit code.
func kdedup(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	cmd := exec.Command(binary, args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		code = exit.ExitCode()
	case err != nil:
		t.Fatalf("running kdedup %v: %v", args, err)
	}
	return out.String(), errb.String(), code
}

// heldKeys is the exact model of what each partition's filter holds after
// recs (produced, so Partition and Offset are set) with the pipeline's
// defaults: a keyed record's key is held from its first record until its
// tombstone; records without a key change nothing.
func heldKeys(recs []*kgo.Record) map[int32]map[string]bool {
	byPart := map[int32][]*kgo.Record{}
	for _, r := range recs {
		byPart[r.Partition] = append(byPart[r.Partition], r)
	}
	held := map[int32]map[string]bool{}
	for part, rs := range byPart {
		sort.Slice(rs, func(i, j int) bool { return rs[i].Offset < rs[j].Offset })
		keys := map[string]bool{}
		for _, r := range rs {
			switch {
			case len(r.Key) == 0:
			case r.Value == nil:
				delete(keys, string(r.Key))
			default:
				keys[string(r.Key)] = true
			}
		}
		held[part] = keys
	}
	return held
}

// TestInspectAndCheck runs the worker over a stream, stops it, and runs the
// built binary's inspect -json on its data directory: every figure equals
// the filter's own (the same directory opened read-only here, its metadata
// and Stats), the checkpoints are the end offsets, and the items of each
// partition are the keys the exact model holds (32-bit fingerprints make a
// collision improbable). check finds a held key in the sub-filter inspect
// lists and does not find a deleted or never-sent one, exiting 0 for both.
// While a worker runs, inspect refuses the locked directory.
func TestInspectAndCheck(t *testing.T) {
	p := newPipeline(t, 2) // about 2,500 keys per partition: chains of capacity 2,000 expand
	recs := stream(11)
	dir := t.TempDir()
	p.runPart(t, dir, recs)

	out, stderr, code := kdedup(t, "inspect", "-json", "-data-dir", dir)
	if code != 0 {
		t.Fatalf("inspect exit code %d:\n%s", code, stderr)
	}
	var doc inspectDoc
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("decoding inspect -json: %v\n%s", err, out)
	}
	if doc.Version != 2 || doc.DataDir != dir || len(doc.Partitions) != int(p.partitions) {
		t.Fatalf("inspect: version %d, data_dir %q, %d partitions, want 2, %q, %d", doc.Version, doc.DataDir, len(doc.Partitions), dir, p.partitions)
	}

	ends, err := p.b.admin(t).ListEndOffsets(context.Background(), p.in)
	if err != nil {
		t.Fatal(err)
	}
	held := heldKeys(recs)
	db, err := store.Open(store.Options{Dir: dir, ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	expanded := false
	for i, pr := range doc.Partitions {
		tp := fmt.Sprintf("%s/%d", pr.Topic, pr.Partition)
		if pr.Topic != p.in || pr.Partition != int32(i) {
			t.Fatalf("partition %d of the report is %s", i, tp)
		}
		sp, err := db.Partition(pr.Topic, pr.Partition)
		if err != nil {
			t.Fatal(err)
		}
		meta, err := filter.DecodeMeta(sp.Meta())
		if err != nil {
			t.Fatal(err)
		}
		chain, err := filter.Open(sp.Meta(), meta.Params, sp)
		if err != nil {
			t.Fatal(err)
		}
		st := chain.Stats()
		cp, _ := sp.Checkpoint()
		end, _ := ends.Lookup(pr.Topic, pr.Partition)
		if pr.Checkpoint.Offset != cp.Offset || pr.Checkpoint.LeaderEpoch != cp.LeaderEpoch || cp.Offset != end.Offset {
			t.Errorf("%s: checkpoint %+v, stored %+v, end offset %d", tp, pr.Checkpoint, cp, end.Offset)
		}
		mp := meta.Params
		if pr.FormatVersion != meta.FormatVersion || pr.Params.TargetFPR != mp.TargetFPR || pr.Params.FingerprintBits != 32 ||
			mp.FingerprintBits != 32 || pr.Params.BucketSize != mp.BucketSize || pr.Params.Capacity != 2000 || mp.Capacity != 2000 ||
			pr.Params.MaxKicks != mp.MaxKicks || pr.Params.Expansion != mp.Expansion || pr.Params.PageBytes != mp.PageBytes ||
			pr.Params.WindowMillis != 0 || pr.Params.Generations != 0 || pr.Params.GenerationSpanMs != 0 ||
			pr.Params.GenerationBits != 0 || mp.GenerationBits() != 0 {
			t.Errorf("%s: params %+v (format %d), stored %s (format %d)", tp, pr.Params, pr.FormatVersion, mp, meta.FormatVersion)
		}
		if pr.WatermarkMillis != nil || pr.Watermark != nil || st.Watermark != math.MinInt64 {
			t.Errorf("%s: watermark %v %v without a window", tp, pr.WatermarkMillis, pr.Watermark)
		}
		if len(pr.SubFilters) != len(meta.SubFilters) {
			t.Fatalf("%s: %d sub-filters, stored %d", tp, len(pr.SubFilters), len(meta.SubFilters))
		}
		for j, sf := range meta.SubFilters {
			got := pr.SubFilters[j]
			slots := sf.Slots(mp.BucketSize)
			load := float64(sf.Items) / float64(slots)
			if got.ID != sf.ID || got.Pages != sf.Pages || got.Buckets != sf.Buckets() || got.Slots != slots || got.FingerprintBits != sf.FingerprintBits ||
				got.Items != sf.Items || got.LoadFactor != load || got.EstimatedFPR != sf.EstimatedFPR() ||
				got.Bytes != sf.Pages*uint64(mp.PageBytes) {
				t.Errorf("%s sub-filter %d: %+v, stored %+v", tp, j, got, sf)
			}
		}
		// Without a window no generation is listed: an empty list, as
		// the filter has none.
		if pr.Generations == nil || len(pr.Generations) != 0 || chain.Generations() != nil {
			t.Errorf("%s: generations %+v without a window (filter: %+v)", tp, pr.Generations, chain.Generations())
		}
		tot := pr.Totals
		if tot.SubFilters != st.SubFilters || tot.Generations != st.Generations || tot.Items != st.Items || tot.Slots != st.Slots ||
			tot.LoadFactor != st.LoadFactor || tot.NewestLoadFactor != st.NewestLoadFactor || tot.EstimatedFPR != st.EstimatedFPR ||
			tot.Bytes != st.Bytes || tot.NewestFingerprintBits != st.NewestFingerprintBits || tot.NearFull != st.NearFull {
			t.Errorf("%s: totals %+v, Stats %+v", tp, tot, st)
		}
		if want := len(held[pr.Partition]); tot.Items != uint64(want) {
			t.Errorf("%s: %d items, the exact model holds %d keys", tp, tot.Items, want)
		}
		expanded = expanded || st.Splits > 0
		t.Logf("%s: checkpoint %d, %d items (model %d), %d sub-filters, load %.4f, estimated FPR %.3g",
			tp, cp.Offset, tot.Items, len(held[pr.Partition]), tot.SubFilters, tot.LoadFactor, tot.EstimatedFPR)

		// check: a held key, found where Locate puts it; a deleted key
		// and a key never sent, absent.
		present, deleted := heldAndDeleted(recs, pr.Partition, held[pr.Partition])
		if present == "" || deleted == "" {
			t.Fatalf("%s: the stream has no held key (%q) or no deleted key (%q)", tp, present, deleted)
		}
		locs, err := chain.Locate([]byte(present))
		if err != nil || len(locs) != 1 {
			t.Fatalf("%s: Locate(%s) = %+v, %v", tp, present, locs, err)
		}
		sp.Close()
		for _, k := range []string{present, deleted, "never-sent-" + strconv.Itoa(i)} {
			out, stderr, code := kdedup(t, "check", k, "-topic", pr.Topic, "-partition", strconv.Itoa(int(pr.Partition)), "-data-dir", dir, "-json")
			if code != 0 {
				t.Fatalf("check %s exit code %d:\n%s", k, code, stderr)
			}
			var c checkDoc
			if err := json.Unmarshal([]byte(out), &c); err != nil {
				t.Fatalf("decoding check -json: %v\n%s", err, out)
			}
			want := held[pr.Partition][k]
			if c.Version != 2 || c.Key != k || c.Present != want || c.Duplicate != want || c.EstimatedFPR != st.EstimatedFPR {
				t.Errorf("%s: check %s: %+v, model holds it: %t", tp, k, c, want)
			}
			switch {
			case want && (c.Count != 1 || len(c.Locations) != 1 || c.Locations[0].SubFilter != locs[0].SubFilter.ID || c.Locations[0].Copies != 1 ||
				c.Locations[0].Generations == nil || len(c.Locations[0].Generations) != 0 || locs[0].Generations != nil):
				t.Errorf("%s: check %s: count %d, locations %+v, want one copy in sub-filter %d, of no generation", tp, k, c.Count, c.Locations, locs[0].SubFilter.ID)
			case !want && (c.Count != 0 || len(c.Locations) != 0):
				t.Errorf("%s: check %s (absent): count %d, locations %+v", tp, k, c.Count, c.Locations)
			}
		}
		out, _, code = kdedup(t, "check", present, "-topic", pr.Topic, "-partition", strconv.Itoa(int(pr.Partition)), "-data-dir", dir)
		if code != 0 || !strings.Contains(out, "would be dropped as a duplicate") {
			t.Errorf("%s: check %s (text), exit code %d:\n%s", tp, present, code, out)
		}
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if !expanded {
		t.Error("no chain split a page: the test covers less than it says")
	}

	// A running worker holds the directory: inspect says so, exit code 1.
	// (Wait until it has joined, which is after it opened its store: a
	// worker starting while inspect holds the directory cannot open it.)
	w := p.startWorker(t, dir)
	p.waitMembers(t, 1)
	if _, stderr, code := kdedup(t, "inspect", "-data-dir", dir); code != 1 ||
		!strings.Contains(stderr, "locked by a running worker") || !strings.Contains(stderr, "stop the worker") {
		t.Errorf("inspect on a running worker's directory: exit code %d:\n%s", code, stderr)
	}
	w.stop(t)
}

// heldAndDeleted returns a key partition part holds and, if there is one,
// a key whose last record there is a tombstone.
func heldAndDeleted(recs []*kgo.Record, part int32, held map[string]bool) (present, deleted string) {
	last := map[string]*kgo.Record{}
	for _, r := range recs {
		if r.Partition == part && len(r.Key) > 0 && (last[string(r.Key)] == nil || r.Offset > last[string(r.Key)].Offset) {
			last[string(r.Key)] = r
		}
	}
	keys := make([]string, 0, len(last))
	for k := range last {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		switch {
		case present == "" && held[k]:
			present = k
		case deleted == "" && last[k].Value == nil:
			deleted = k
		}
	}
	return present, deleted
}

// windowHeld is the exact model of what each partition's windowed filter
// holds after recs (produced, so Partition and Offset are set) with one
// occurrence per key and no refresh: every record moves its partition's
// watermark; generations from floor(watermark/span) - gens on are live; a
// keyed record with no live copy leaves one in the generation of its
// timestamp, or the oldest live one when that is older; a tombstone
// removes its key. It returns each held key's generation and, per
// partition, the watermark and the keys once held that expired since.
func windowHeld(recs []*kgo.Record, span int64, gens int64) (held map[int32]map[string]int64, watermarks map[int32]int64, expired map[int32][]string) {
	byPart := map[int32][]*kgo.Record{}
	for _, r := range recs {
		byPart[r.Partition] = append(byPart[r.Partition], r)
	}
	held, watermarks, expired = map[int32]map[string]int64{}, map[int32]int64{}, map[int32][]string{}
	for part, rs := range byPart {
		sort.Slice(rs, func(i, j int) bool { return rs[i].Offset < rs[j].Offset })
		keys := map[string]int64{}
		gone := map[string]bool{}
		wm := int64(math.MinInt64)
		for _, r := range rs {
			ts := r.Timestamp.UnixMilli()
			wm = max(wm, ts)
			oldest := wm/span - gens // timestamps are after the epoch
			for k, g := range keys {
				if g < oldest {
					delete(keys, k)
					gone[k] = true
				}
			}
			k := string(r.Key)
			switch {
			case len(r.Key) == 0:
			case r.Value == nil:
				delete(keys, k)
				delete(gone, k)
			default:
				if _, ok := keys[k]; !ok {
					keys[k] = max(ts/span, oldest)
					delete(gone, k)
				}
			}
		}
		held[part], watermarks[part] = keys, wm
		for k := range gone {
			expired[part] = append(expired[part], k)
		}
		sort.Strings(expired[part])
	}
	return held, watermarks, expired
}

// deref is *s, or "null".
func deref(s *string) string {
	if s == nil {
		return "null"
	}
	return *s
}

// TestInspectWindow runs the worker with KDEDUP_WINDOW=6s over 3
// generations on 30 s of record time (windowStream: out-of-order records,
// tombstones, keys that recur after their generation expired), stops it,
// and runs the built binary: inspect -json lists exactly the live
// generations of the exact model (windowHeld), oldest first, each with its
// record time bounds and as many items as the model holds keys of it, and
// they are the filter's own (filter.Chain.Generations, Stats); the
// generation tag is 3 bits. check finds a held key with its copy in the
// model's generation, and not a key whose generation expired.
func TestInspectWindow(t *testing.T) {
	p := newPipeline(t, 2)
	p.window = scenario.ExpectOptions{Window: 6 * time.Second, Generations: 3}
	// 29-bit fingerprints, the widest beside the 3-bit generation tag (pipeline.env).
	recs := windowStream(5)
	dir := t.TempDir()
	p.runPart(t, dir, recs)

	const span = 2000
	held, watermarks, expired := windowHeld(recs, span, 3)
	bounds := func(gen int64) (string, string) {
		return time.UnixMilli(gen * span).UTC().Format("2006-01-02T15:04:05.000Z07:00"),
			time.UnixMilli((gen + 1) * span).UTC().Format("2006-01-02T15:04:05.000Z07:00")
	}
	out, stderr, code := kdedup(t, "inspect", "-json", "-data-dir", dir)
	if code != 0 {
		t.Fatalf("inspect exit code %d:\n%s", code, stderr)
	}
	var doc inspectDoc
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("decoding inspect -json: %v\n%s", err, out)
	}
	if len(doc.Partitions) != int(p.partitions) {
		t.Fatalf("inspect: %d partitions, want %d", len(doc.Partitions), p.partitions)
	}
	db, err := store.Open(store.Options{Dir: dir, ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	type located struct {
		key  string
		gens []int64
	}
	var checks []located // per partition: a held key, then an expired one
	for i, pr := range doc.Partitions {
		tp := fmt.Sprintf("%s/%d", pr.Topic, pr.Partition)
		if pr.Topic != p.in || pr.Partition != int32(i) {
			t.Fatalf("partition %d of the report is %s", i, tp)
		}
		sp, err := db.Partition(pr.Topic, pr.Partition)
		if err != nil {
			t.Fatal(err)
		}
		meta, err := filter.DecodeMeta(sp.Meta())
		if err != nil {
			t.Fatal(err)
		}
		chain, err := filter.Open(sp.Meta(), meta.Params, sp)
		if err != nil {
			t.Fatal(err)
		}
		st, fgens := chain.Stats(), chain.Generations()
		sp.Close()
		if pr.Params.WindowMillis != 6000 || pr.Params.Generations != 3 || pr.Params.GenerationSpanMs != span ||
			pr.Params.GenerationBits != 3 || meta.Params.GenerationBits() != 3 || pr.Params.FingerprintBits != 29 {
			t.Errorf("%s: params %+v, stored %s", tp, pr.Params, meta.Params)
		}
		if wm := watermarks[pr.Partition]; pr.WatermarkMillis == nil || *pr.WatermarkMillis != wm || st.Watermark != wm {
			t.Errorf("%s: watermark %v (Stats %d), the model's %d", tp, pr.WatermarkMillis, st.Watermark, wm)
		}

		// The model's generations, oldest first, with their keys.
		count := map[int64]uint64{}
		for _, g := range held[pr.Partition] {
			count[g]++
		}
		var want []int64
		for g := range count {
			want = append(want, g)
		}
		sort.Slice(want, func(i, j int) bool { return want[i] < want[j] })
		if len(pr.Generations) != len(want) || len(fgens) != len(want) || pr.Totals.Generations != len(want) || st.Generations != len(want) {
			t.Errorf("%s: %d generations listed (filter %d, totals %d, Stats %d), the model has %d: %v",
				tp, len(pr.Generations), len(fgens), pr.Totals.Generations, st.Generations, len(want), count)
		}
		var items uint64
		for j, g := range pr.Generations {
			items += g.Items
			if j >= len(want) || j >= len(fgens) {
				continue
			}
			start, end := bounds(want[j])
			if g.Generation != want[j] || g.Items != count[want[j]] || g.Start == nil || *g.Start != start || g.End == nil || *g.End != end ||
				fgens[j] != (filter.GenerationItems{Generation: g.Generation, Items: g.Items}) {
				t.Errorf("%s: generation %d listed as %d (%s .. %s) of %d items; the model's is %d (%s .. %s) of %d; the filter's %+v",
					tp, j, g.Generation, deref(g.Start), deref(g.End), g.Items, want[j], start, end, count[want[j]], fgens[j])
			}
		}
		if items != uint64(len(held[pr.Partition])) || pr.Totals.Items != items || st.Items != items {
			t.Errorf("%s: generations sum to %d items (totals %d, Stats %d), the model holds %d keys", tp, items, pr.Totals.Items, st.Items, len(held[pr.Partition]))
		}
		if len(want) < 2 || len(expired[pr.Partition]) == 0 {
			t.Fatalf("%s: the stream does not exercise the window: live generations %v, %d keys expired", tp, want, len(expired[pr.Partition]))
		}
		t.Logf("%s: watermark %d, generations %v (%d items), %d keys expired", tp, watermarks[pr.Partition], count, items, len(expired[pr.Partition]))

		// A held key of the oldest live generation (the one a copy most
		// likely is in wrongly), and an expired key.
		var present string
		for k, g := range held[pr.Partition] {
			if g == want[0] && (present == "" || k < present) {
				present = k
			}
		}
		checks = append(checks, located{present, []int64{want[0]}}, located{expired[pr.Partition][0], nil})
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}

	for i, l := range checks {
		part := strconv.Itoa(i / 2)
		out, stderr, code := kdedup(t, "check", l.key, "-topic", p.in, "-partition", part, "-data-dir", dir, "-json")
		if code != 0 {
			t.Fatalf("check %s exit code %d:\n%s", l.key, code, stderr)
		}
		var c checkDoc
		if err := json.Unmarshal([]byte(out), &c); err != nil {
			t.Fatalf("decoding check -json: %v\n%s", err, out)
		}
		var got []int64
		for _, loc := range c.Locations {
			if len(loc.Generations) != loc.Copies {
				t.Errorf("%s/%s: check %s: sub-filter %d: %d copies, %d generations", p.in, part, l.key, loc.SubFilter, loc.Copies, len(loc.Generations))
			}
			for _, g := range loc.Generations {
				got = append(got, g.Generation)
				if start, end := bounds(g.Generation); g.Start == nil || *g.Start != start || g.End == nil || *g.End != end {
					t.Errorf("%s/%s: check %s: generation %d bounded %s .. %s, want %s .. %s", p.in, part, l.key, g.Generation, deref(g.Start), deref(g.End), start, end)
				}
			}
		}
		if c.Present != (l.gens != nil) || c.Count != len(l.gens) || fmt.Sprint(got) != fmt.Sprint(l.gens) {
			t.Errorf("%s/%s: check %s: present %t, count %d, generations %v; the model holds it in generations %v", p.in, part, l.key, c.Present, c.Count, got, l.gens)
		}
	}
}
