package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"sort"
	"strings"
	"testing"
)

func checkJSON(t *testing.T, args ...string) checkReport {
	t.Helper()
	out, err := run(t, append([]string{"check", "-json"}, args...)...)
	if err != nil {
		t.Fatalf("check %v: %v", args, err)
	}
	var rep checkReport
	dec := json.NewDecoder(strings.NewReader(out))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&rep); err != nil {
		t.Fatalf("decoding %s: %v", out, err)
	}
	return rep
}

// TestCheck asks about keys the exact model holds and keys it does not, in
// both partitions of the test state (32-bit fingerprints in orders/0; in
// orders/1, target-rate widths of at least 16 bits over 600 items make a
// false positive about 1e-3 per key): present keys are found, with their
// copies, each copy in the generation the model gives it (its timestamp's,
// or the oldest live one for a key a window late), and with no generation
// without a window; absent keys (deleted or never sent) are not; the
// estimated FPR is the chain's.
func TestCheck(t *testing.T) {
	states := testState()
	dir := buildState(t, states)
	ref := readChains(t, dir)
	fixed, win := states[0], states[1]
	span := windowParams.Window.Milliseconds() / int64(windowParams.Generations)
	if len(win.gens["w-0003"]) != 2 || win.gens["w-0003"][0] == win.gens["w-0003"][1] || win.gens["late-0000"][0] != base.UnixMilli()/span {
		t.Fatalf("the test state does not have the keys this test relies on: %v", win.gens)
	}

	for _, k := range []string{"key-0001", "key-0999", "key-0010", "key-0000", "never-sent"} {
		rep := checkJSON(t, k, "-data-dir", dir, "-topic", "orders", "-partition", "0")
		n := fixed.held[k]
		want := checkReport{Version: 2, Topic: "orders", Partition: 0, Key: k, KeySpec: "key",
			Checkpoint: checkpointReport{Offset: int64(len(fixed.recs)), LeaderEpoch: fixed.epoch},
			Present:    n > 0, Count: n, MaxOccurrences: 1, Duplicate: n > 0, EstimatedFPR: ref[fixed.tp].stats.EstimatedFPR}
		locs := rep.Locations
		rep.Locations = nil
		if !reflect.DeepEqual(rep, want) {
			t.Errorf("check %s:\n got %+v\nwant %+v", k, rep, want)
		}
		if (n > 0) != (len(locs) == 1) || (n > 0 && (locs[0].Copies != 1 || locs[0].Generations == nil || len(locs[0].Generations) != 0)) {
			t.Errorf("check %s: locations %+v, want one copy and an empty list of generations", k, locs)
		}
	}

	for _, k := range []string{"w-0000", "w-0001", "w-0003", "w-0399", "w-0400", "late-0000"} {
		n := win.held[k]
		for _, limit := range []int{1, 2} {
			rep := checkJSON(t, "-data-dir", dir, k, "-topic", "orders", "-partition", "1", "-max-occurrences", fmt.Sprint(limit))
			if rep.Present != (n > 0) || rep.Count != n || rep.Duplicate != (n >= limit) || rep.MaxOccurrences != limit ||
				rep.EstimatedFPR != ref[win.tp].stats.EstimatedFPR || rep.Checkpoint.LeaderEpoch != win.epoch {
				t.Errorf("check %s -max-occurrences %d: %+v, model holds %d copies", k, limit, rep, n)
			}
			if n == 0 {
				if len(rep.Locations) != 0 {
					t.Errorf("check %s: locations %+v for an absent key", k, rep.Locations)
				}
				continue
			}
			// Each location lists the generation of each of its copies,
			// oldest first, with its bounds; all of them are the model's.
			copies := 0
			var gens []int64
			for _, l := range rep.Locations {
				copies += l.Copies
				if len(l.Generations) != l.Copies {
					t.Errorf("check %s: sub-filter %d: %d copies, %d generations", k, l.SubFilter, l.Copies, len(l.Generations))
				}
				for j, g := range l.Generations {
					if !reflect.DeepEqual(g, wantRef(g.Generation, span)) || (j > 0 && g.Generation < l.Generations[j-1].Generation) {
						t.Errorf("check %s: sub-filter %d: copy %d of generation %s, want bounds %s, oldest first", k, l.SubFilter, j,
							describeGeneration(g), describeGeneration(wantRef(g.Generation, span)))
					}
					gens = append(gens, g.Generation)
				}
			}
			sort.Slice(gens, func(i, j int) bool { return gens[i] < gens[j] })
			if copies != n || !reflect.DeepEqual(gens, win.gens[k]) {
				t.Errorf("check %s: %d copies located, of generations %v; the model holds %d, of generations %v", k, copies, gens, n, win.gens[k])
			}
		}
	}
}

func TestCheckText(t *testing.T) {
	states := testState()
	dir := buildState(t, states)
	ref := readChains(t, dir)
	held := checkJSON(t, "key-0001", "-data-dir", dir, "-topic", "orders", "-partition", "0")
	if len(held.Locations) != 1 {
		t.Fatalf("check key-0001: locations %+v, want one", held.Locations)
	}
	for _, tt := range []struct {
		args []string
		want []string
	}{
		{[]string{"key-0001", "-topic", "orders", "-partition", "0"}, []string{
			`orders/0, key "key-0001", state as of checkpoint offset ` + fmt.Sprint(len(states[0].recs)) + " (keys derived as KDEDUP_KEY=key)",
			"present: the next record with this key would be dropped as a duplicate",
			fmt.Sprintf("copies of its fingerprint: 1\n  in sub-filter %d: 1 copy\n", held.Locations[0].SubFilter),
			fmt.Sprintf("is reported present): %.3g", ref[states[0].tp].stats.EstimatedFPR),
		}},
		{[]string{"key-0010", "-topic", "orders", "-partition", "0"}, []string{"absent: the next record with this key would be forwarded"}},
		{[]string{"w-0001", "-topic", "orders", "-partition", "1", "-max-occurrences", "2"}, []string{
			"present, 1 copy: the next record with this key would be forwarded (limit 2)",
			": 1 copy, of generation 883612800 (record time 2026-01-01T00:00:00.000Z .. 2026-01-01T00:00:02.000Z)\n",
		}},
		{[]string{"w-0000", "-topic", "orders", "-partition", "1", "-max-occurrences", "2"}, []string{
			"present, 2 copies: the next record with this key would be dropped as over the limit of 2",
			": 2 copies, of generation 883612800 (record time 2026-01-01T00:00:00.000Z .. 2026-01-01T00:00:02.000Z)\n",
		}},
		{[]string{"w-0003", "-topic", "orders", "-partition", "1", "-max-occurrences", "2"}, []string{
			": 2 copies, of generations 883612800 (record time 2026-01-01T00:00:00.000Z .. 2026-01-01T00:00:02.000Z), " +
				"883612802 (record time 2026-01-01T00:00:04.000Z .. 2026-01-01T00:00:06.000Z)\n",
		}},
		{[]string{"late-0000", "-topic", "orders", "-partition", "1"}, []string{
			": 1 copy, of generation 883612800 (record time 2026-01-01T00:00:00.000Z .. 2026-01-01T00:00:02.000Z)\n",
		}},
	} {
		out, err := run(t, append(append([]string{"check"}, tt.args...), "-data-dir", dir)...)
		if err != nil {
			t.Fatalf("check %v: %v", tt.args, err)
		}
		for _, w := range tt.want {
			if !strings.Contains(out, w) {
				t.Errorf("check %v: output lacks %q:\n%s", tt.args, w, out)
			}
		}
	}
}

func TestCheckUsage(t *testing.T) {
	dir := buildState(t, testState())
	for _, args := range [][]string{
		{"check", "-data-dir", dir, "-topic", "orders", "-partition", "0"},           // no key
		{"check", "a", "b", "-data-dir", dir, "-topic", "orders", "-partition", "0"}, // two keys
		{"check", "a", "-data-dir", dir, "-partition", "0"},                          // no topic
		{"check", "a", "-data-dir", dir, "-topic", "orders"},                         // no partition
		{"check", "a", "-data-dir", dir, "-topic", "orders", "-partition", "0", "-max-occurrences", "0"},
	} {
		if _, err := run(t, args...); !errors.Is(err, errUsage) {
			t.Errorf("%v: %v, want a usage error", args, err)
		}
	}
	// A key that looks like a flag, after "--".
	rep := checkJSON(t, "-data-dir", dir, "-topic", "orders", "-partition", "0", "--", "-key")
	if rep.Key != "-key" || rep.Present {
		t.Errorf("check -- -key: %+v", rep)
	}
	// A topic-partition without state names those with some.
	_, err := run(t, "check", "k", "-data-dir", dir, "-topic", "order", "-partition", "0")
	if err == nil || errors.Is(err, errUsage) || !strings.Contains(err.Error(), "orders/0, orders/1") {
		t.Errorf("check on a topic without state: %v", err)
	}
}

// TestCheckDefaultMaxOccurrences: KDEDUP_MAX_OCCURRENCES is the default of
// -max-occurrences, as the worker reads it.
func TestCheckDefaultMaxOccurrences(t *testing.T) {
	dir := buildState(t, testState())
	t.Setenv("KDEDUP_MAX_OCCURRENCES", "2")
	if rep := checkJSON(t, "w-0001", "-data-dir", dir, "-topic", "orders", "-partition", "1"); rep.MaxOccurrences != 2 || rep.Duplicate {
		t.Errorf("check with KDEDUP_MAX_OCCURRENCES=2: %+v", rep)
	}
}
