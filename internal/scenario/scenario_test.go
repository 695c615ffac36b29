package scenario

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

func rec(p int32, off int64, key, value string) *kgo.Record {
	r := &kgo.Record{Topic: "t", Partition: p, Offset: off, Timestamp: Base.Add(time.Duration(off) * time.Millisecond)}
	if key != "" {
		r.Key = []byte(key)
	}
	if value != "-" {
		r.Value = []byte(value)
	}
	return r
}

// TestExpect checks the exact model on a hand-written stream: per
// partition in offset order (records are given out of order), duplicates
// dropped, tombstones delete and are forwarded, a deleted key is forwarded
// again, the same key in another partition is independent, keyless records
// are forwarded.
func TestExpect(t *testing.T) {
	recs := []*kgo.Record{
		rec(0, 1, "a", "a2"), rec(0, 0, "a", "a1"), rec(0, 2, "a", "-"), rec(0, 3, "a", "a3"), rec(0, 4, "a", "a4"),
		rec(1, 0, "a", "b1"), rec(1, 1, "", "n1"), rec(1, 2, "", "n1"),
	}
	m := Expect(recs, true)
	sig := func(off int64, v string) string { return Signature(rec(0, off, "a", v)) }
	want := []string{sig(0, "a1"), sig(2, "-"), sig(3, "a3"), Signature(rec(1, 0, "a", "b1"))}
	got := m.PerKey["a"]
	slices.Sort(want)
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Fatalf("key a: got %v, want %v", got, want)
	}
	if (m.Stats != Stats{Consumed: 8, Forwarded: 6, Duplicates: 2, Deletes: 1, Unkeyed: 2}) {
		t.Fatalf("stats %+v", m.Stats)
	}
	if len(m.Unkeyed) != 2 {
		t.Fatalf("unkeyed %v", m.Unkeyed)
	}
	if m := Expect(recs, false); m.Stats.Forwarded != 5 || slices.Contains(m.PerKey["a"], sig(2, "-")) {
		t.Fatalf("with tombstones dropped: %+v %v", m.Stats, m.PerKey["a"])
	}
}

// TestObserveDiffMissing: an output equal to the model has no diff; a
// missing record is reported by Diff and Missing; an extra copy is reported
// by Diff and counted (not missing) by Missing.
func TestObserveDiffMissing(t *testing.T) {
	in := []*kgo.Record{rec(0, 0, "a", "1"), rec(0, 1, "b", "2"), rec(0, 2, "a", "3")}
	want := Expect(in, true)
	out := []*kgo.Record{rec(5, 0, "a", "1"), rec(6, 0, "b", "2")}
	out[0].Timestamp, out[1].Timestamp = in[0].Timestamp, in[1].Timestamp
	if d := Diff(want, Observe(out), 10); len(d) != 0 {
		t.Fatalf("diff of an exact output: %v", d)
	}
	if d := Diff(want, Observe(out[:1]), 10); len(d) != 1 {
		t.Fatalf("diff with b missing: %v", d)
	}
	if missing, _ := Missing(want, Observe(out[:1]), 10); len(missing) != 1 {
		t.Fatalf("missing: %v", missing)
	}
	dup := append(out, &kgo.Record{Topic: "t", Partition: 5, Offset: 1, Key: []byte("a"), Value: []byte("1"), Timestamp: in[0].Timestamp})
	if d := Diff(want, Observe(dup), 10); len(d) != 1 {
		t.Fatalf("diff with an extra copy: %v", d)
	}
	if missing, extra := Missing(want, Observe(dup), 10); len(missing) != 0 || extra != 1 {
		t.Fatalf("missing %v extra %d", missing, extra)
	}
}

func TestGenerateIsDeterministic(t *testing.T) {
	a, b := Generate(Options{Keys: 3000, Seed: 9}), Generate(Options{Keys: 3000, Seed: 9})
	if len(a) != len(b) {
		t.Fatalf("%d vs %d records", len(a), len(b))
	}
	for i := range a {
		if Signature(a[i]) != Signature(b[i]) || string(a[i].Key) != string(b[i].Key) {
			t.Fatalf("record %d differs", i)
		}
	}
	m := Expect(assignOffsets(a), true)
	if m.Stats.Duplicates == 0 || m.Stats.Deletes == 0 || m.Stats.Unkeyed == 0 {
		t.Fatalf("stream lacks duplicates, deletes or unkeyed records: %+v", m.Stats)
	}
}

func assignOffsets(recs []*kgo.Record) []*kgo.Record {
	for i, r := range recs {
		r.Offset = int64(i)
	}
	return recs
}

// TestExpectWith checks the occurrence limit and the dropped records on a
// hand-written stream: with a limit of 2 a key's third record is dropped
// until its tombstone resets the count; with the default limit the second
// is. Dropped records keep value, timestamp and headers and gain
// kdedup-reason and kdedup-source, in that order.
func TestExpectWith(t *testing.T) {
	recs := []*kgo.Record{
		rec(0, 0, "a", "a1"), rec(0, 1, "a", "a2"), rec(0, 2, "a", "a3"), rec(0, 3, "a", "-"),
		rec(0, 4, "a", "a4"), rec(0, 5, "a", "a5"), rec(0, 6, "a", "a6"), rec(0, 7, "", "n1"),
	}
	recs[2].Headers = []kgo.RecordHeader{{Key: "trace", Value: []byte("x")}}
	sig := func(off int64, v string) string { return Signature(rec(0, off, "a", v)) }
	for _, tc := range []struct {
		name    string
		o       ExpectOptions
		forward []string
		dropped []string
		stats   Stats
	}{
		{
			name:    "limit 2",
			o:       ExpectOptions{MaxOccurrences: 2},
			forward: []string{sig(0, "a1"), sig(1, "a2"), sig(3, "-"), sig(4, "a4"), sig(5, "a5")},
			dropped: []string{
				"a3|1767225600002|trace=x|kdedup-reason=occurrence-limit|kdedup-source=t/0/2",
				"a6|1767225600006|kdedup-reason=occurrence-limit|kdedup-source=t/0/6",
			},
			stats: Stats{Consumed: 8, Forwarded: 6, OverLimit: 2, Deletes: 1, Unkeyed: 1},
		},
		{
			name:    "default limit, tombstones dropped",
			o:       ExpectOptions{DropTombstones: true},
			forward: []string{sig(0, "a1"), sig(4, "a4")},
			dropped: []string{
				"a2|1767225600001|kdedup-reason=duplicate|kdedup-source=t/0/1",
				"a3|1767225600002|trace=x|kdedup-reason=duplicate|kdedup-source=t/0/2",
				"a5|1767225600005|kdedup-reason=duplicate|kdedup-source=t/0/5",
				"a6|1767225600006|kdedup-reason=duplicate|kdedup-source=t/0/6",
			},
			stats: Stats{Consumed: 8, Forwarded: 3, Duplicates: 4, Deletes: 1, Unkeyed: 1},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, dropped := ExpectWith(recs, tc.o)
			if !slices.Equal(out.PerKey["a"], tc.forward) {
				t.Errorf("forwarded %v, want %v", out.PerKey["a"], tc.forward)
			}
			if out.Stats != tc.stats {
				t.Errorf("stats %+v, want %+v", out.Stats, tc.stats)
			}
			if !slices.Equal(dropped.PerKey["a"], tc.dropped) {
				t.Errorf("dropped %q, want %q", dropped.PerKey["a"], tc.dropped)
			}
			if (dropped.Stats != Stats{Forwarded: len(tc.dropped)}) || len(dropped.Unkeyed) != 0 {
				t.Errorf("dropped stats %+v, unkeyed %v", dropped.Stats, dropped.Unkeyed)
			}
			if len(recs[2].Headers) != 1 {
				t.Errorf("the model changed the input record's headers: %v", recs[2].Headers)
			}
		})
	}
}

// TestSpreadCheck: the spread stream's checks accept the exact outputs
// (one copy of each event, or one per partition holding one) and name
// each kind of departure: an event missing or forwarded twice, a record
// that is none of the event's copies, a record without event id missing
// or extra.
func TestSpreadCheck(t *testing.T) {
	in := GenerateSpread(SpreadOptions{Events: 300, Seed: 3, Partitions: 3})
	if SpreadPartitions(in) == 0 {
		t.Fatal("no event has copies in two partitions")
	}
	first := map[string]bool{}
	firstIn := map[string]bool{} // partition/id
	var across, within []*kgo.Record
	for _, r := range in {
		id, ok := SpreadEventID(r)
		if !ok {
			across, within = append(across, r), append(within, r)
			continue
		}
		if !first[id] {
			first[id] = true
			across = append(across, r)
		}
		if k := fmt.Sprintf("%d/%s", r.Partition, id); !firstIn[k] {
			firstIn[k] = true
			within = append(within, r)
		}
	}
	if p, extra := SpreadCheck(in, across, true, 5); len(p) > 0 || extra != 0 {
		t.Fatalf("the exact output across partitions: %v, %d extra", p, extra)
	}
	if p, extra := SpreadCheckWithin(in, within, true, 5); len(p) > 0 || extra != 0 {
		t.Fatalf("the exact output within partitions: %v, %d extra", p, extra)
	}
	if p, _ := SpreadCheck(in, within, true, 5); len(p) == 0 {
		t.Fatal("the output within partitions passes the check across them")
	}
	var keyed, noID *kgo.Record
	for _, r := range across {
		if _, ok := SpreadEventID(r); ok && keyed == nil {
			keyed = r
		} else if !ok && noID == nil {
			noID = r
		}
	}
	if noID == nil {
		t.Fatal("the stream has no record without event id")
	}
	changed := *keyed
	changed.Key = []byte("someone-else")
	without := func(x *kgo.Record) []*kgo.Record {
		var out []*kgo.Record
		for _, r := range across {
			if r != x {
				out = append(out, r)
			}
		}
		return out
	}
	for _, c := range []struct {
		name  string
		out   []*kgo.Record
		want  string
		extra int
	}{
		{"event missing", without(keyed), "forwarded 0 times, want 1", 0},
		{"event twice", append(slices.Clone(across), keyed), "forwarded 2 times, want 1", 1},
		{"not a copy", append(without(keyed), &changed), "none of its copies", 0},
		{"record without id missing", without(noID), "without event id not forwarded", 0},
		{"record without id twice", append(slices.Clone(across), noID), "more often than sent", 1},
	} {
		p, extra := SpreadCheck(in, c.out, true, 5)
		if len(p) == 0 || !strings.Contains(p[0], c.want) || extra != c.extra {
			t.Errorf("%s: problems %v, %d extra; want %q first, %d extra", c.name, p, extra, c.want, c.extra)
		}
		if p, _ := SpreadCheck(in, c.out, false, 5); c.extra > 0 && len(p) > 0 {
			t.Errorf("%s: at least once, a repeat is a problem: %v", c.name, p)
		}
	}
}
