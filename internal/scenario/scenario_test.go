package scenario

import (
	"slices"
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
