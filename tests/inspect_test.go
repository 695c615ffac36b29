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

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kdedup/kdedup/filter"
	"github.com/kdedup/kdedup/store"
)

// inspectDoc is the documented JSON of `kdedup inspect -json` (version 1),
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
		} `json:"params"`
		WatermarkMillis *int64  `json:"watermark_ms"`
		Watermark       *string `json:"watermark"`
		SubFilters      []struct {
			ID              uint32  `json:"id"`
			Generation      int64   `json:"generation"`
			GenerationStart *string `json:"generation_start"`
			GenerationEnd   *string `json:"generation_end"`
			Pages           uint64  `json:"pages"`
			Buckets         uint64  `json:"buckets"`
			Slots           uint64  `json:"slots"`
			FingerprintBits int     `json:"fingerprint_bits"`
			Items           uint64  `json:"items"`
			LoadFactor      float64 `json:"load_factor"`
			EstimatedFPR    float64 `json:"estimated_fpr"`
			Bytes           uint64  `json:"bytes"`
		} `json:"sub_filters"`
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

// checkDoc is the documented JSON of `kdedup check -json` (version 1).
type checkDoc struct {
	Version      int     `json:"version"`
	Key          string  `json:"key"`
	Present      bool    `json:"present"`
	Count        int     `json:"count"`
	Duplicate    bool    `json:"duplicate"`
	EstimatedFPR float64 `json:"estimated_fpr"`
	Locations    []struct {
		SubFilter  uint32 `json:"sub_filter"`
		Generation int64  `json:"generation"`
		Copies     int    `json:"copies"`
	} `json:"locations"`
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
	if doc.Version != 1 || doc.DataDir != dir || len(doc.Partitions) != int(p.partitions) {
		t.Fatalf("inspect: version %d, data_dir %q, %d partitions, want 1, %q, %d", doc.Version, doc.DataDir, len(doc.Partitions), dir, p.partitions)
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
			pr.Params.WindowMillis != 0 || pr.Params.Generations != 0 || pr.Params.GenerationSpanMs != 0 {
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
			if got.ID != sf.ID || got.Generation != sf.Generation || got.GenerationStart != nil || got.GenerationEnd != nil ||
				got.Pages != sf.Pages || got.Buckets != sf.Buckets() || got.Slots != slots || got.FingerprintBits != sf.FingerprintBits ||
				got.Items != sf.Items || got.LoadFactor != load || got.EstimatedFPR != sf.EstimatedFPR() ||
				got.Bytes != sf.Pages*uint64(mp.PageBytes) {
				t.Errorf("%s sub-filter %d: %+v, stored %+v", tp, j, got, sf)
			}
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
			if c.Version != 1 || c.Key != k || c.Present != want || c.Duplicate != want || c.EstimatedFPR != st.EstimatedFPR {
				t.Errorf("%s: check %s: %+v, model holds it: %t", tp, k, c, want)
			}
			switch {
			case want && (c.Count != 1 || len(c.Locations) != 1 || c.Locations[0].SubFilter != locs[0].SubFilter.ID || c.Locations[0].Copies != 1):
				t.Errorf("%s: check %s: count %d, locations %+v, want one copy in sub-filter %d", tp, k, c.Count, c.Locations, locs[0].SubFilter.ID)
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
