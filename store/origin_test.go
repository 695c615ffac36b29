package store

import (
	"errors"
	"testing"
)

func TestOriginDiffers(t *testing.T) {
	a := Origin{TopicID: "AAAAAAAAAAAAAAAAAAAAAA", ClusterID: "c1"}
	for _, tc := range []struct {
		stored, cur Origin
		want        bool
	}{
		{a, a, false},
		{a, Origin{TopicID: "BBBBBBBBBBBBBBBBBBBBBB", ClusterID: "c1"}, true},
		{a, Origin{TopicID: a.TopicID, ClusterID: "c2"}, true},
		{a, Origin{ClusterID: "c1"}, false},    // a broker without topic IDs
		{a, Origin{TopicID: a.TopicID}, false}, // no cluster ID reported
		{Origin{}, a, false},                   // written before origins were recorded
		{Origin{ClusterID: "c1"}, Origin{TopicID: "X", ClusterID: "c2"}, true},
	} {
		if got := tc.stored.Differs(tc.cur); got != tc.want {
			t.Errorf("%v.Differs(%v) = %t, want %t", tc.stored, tc.cur, got, tc.want)
		}
	}
}

func TestOriginEncoding(t *testing.T) {
	for _, o := range []Origin{{}, {TopicID: "t"}, {ClusterID: "c"}, {TopicID: "AAAAAAAAAAAAAAAAAAAAAA", ClusterID: "MkU3OEVBNTcwNTJENDM2Qk"}} {
		got, err := decodeOrigin(encodeOrigin(o))
		if err != nil || got != o {
			t.Errorf("decode(encode(%+v)) = %+v, %v", o, got, err)
		}
	}
	for _, b := range [][]byte{nil, {0}, {0, 5, 'a'}, {0, 0, 0}, {0, 0, 0, 0, 'x'}, {0xff, 0xff}} {
		if _, err := decodeOrigin(b); !errors.Is(err, ErrCorrupt) {
			t.Errorf("decodeOrigin(%x) = %v, want ErrCorrupt", b, err)
		}
	}
}

// TestOriginTravelsWithState records an origin, reopens the partition,
// exports the state and imports it elsewhere: the origin is the state's
// everywhere; an image without one replaces the old origin with none; and
// Clear removes the state with its origin, leaving other partitions alone.
func TestOriginTravelsWithState(t *testing.T) {
	const pb = 128
	opts := Options{Dir: t.TempDir(), PageBytes: pb, FlushBytes: smallFlush, CacheBytes: 8 * pb}
	db := openT(t, opts)
	ids := universe(2, 4)
	origin := Origin{TopicID: "AAAAAAAAAAAAAAAAAAAAAA", ClusterID: "cluster-1"}
	p, err := db.Partition("events", 0)
	if err != nil {
		t.Fatal(err)
	}
	if o := p.Origin(); !o.IsZero() {
		t.Fatalf("a new partition's origin is %v, want none", o)
	}
	if err := p.SetOrigin(origin); err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		write(t, p, id, pageBytes(pb, id, 1))
	}
	if err := p.Commit(chainMeta(pb, 1, 4, 0, 1), Checkpoint{Offset: 42, LeaderEpoch: 1}); err != nil {
		t.Fatal(err)
	}
	other, err := db.Partition("events", 1)
	if err != nil {
		t.Fatal(err)
	}
	write(t, other, ids[0], pageBytes(pb, ids[0], 2))
	if err := other.Commit([]byte("other"), Checkpoint{Offset: 7}); err != nil {
		t.Fatal(err)
	}
	p.Close()
	if p, err = db.Partition("events", 0); err != nil {
		t.Fatal(err)
	}
	if o := p.Origin(); o != origin {
		t.Fatalf("origin after reopening %v, want %v", o, origin)
	}
	e, found := export(t, db, p.TopicPartition())
	if !found || e.img.Origin != origin {
		t.Fatalf("exported found %t with origin %v, want %v", found, e.img.Origin, origin)
	}

	db2 := openT(t, Options{Dir: t.TempDir(), PageBytes: pb, FlushBytes: smallFlush, CacheBytes: 8 * pb})
	q, err := db2.Partition("events", 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := q.Import(e.img, e.put); err != nil {
		t.Fatal(err)
	}
	q.Close()
	if q, err = db2.Partition("events", 0); err != nil {
		t.Fatal(err)
	}
	if o := q.Origin(); o != origin {
		t.Fatalf("imported origin %v, want %v", o, origin)
	}
	noOrigin := e
	noOrigin.img.Origin = Origin{}
	if err := q.Import(noOrigin.img, noOrigin.put); err != nil {
		t.Fatal(err)
	}
	q.Close()
	if q, err = db2.Partition("events", 0); err != nil {
		t.Fatal(err)
	}
	if o := q.Origin(); !o.IsZero() {
		t.Fatalf("origin after importing an image without one: %v, want none", o)
	}
	q.Close()

	if err := p.Clear(); err != nil {
		t.Fatal(err)
	}
	if _, ok := p.Checkpoint(); ok || !p.Origin().IsZero() || p.Meta() != nil {
		t.Fatalf("after Clear: checkpoint %t, origin %v, meta %q; want none", ok, p.Origin(), p.Meta())
	}
	p.Close()
	if p, err = db.Partition("events", 0); err != nil {
		t.Fatal(err)
	}
	if _, ok := p.Checkpoint(); ok || !p.Origin().IsZero() {
		t.Fatalf("after Clear and reopening: checkpoint %t, origin %v; want none", ok, p.Origin())
	}
	for _, id := range ids {
		if b := mustPage(t, p, id); b[0] != 0 || string(b) != string(make([]byte, pb)) {
			t.Fatalf("%v after Clear is not zero", id)
		}
	}
	if _, found := export(t, db, p.TopicPartition()); found {
		t.Fatal("Export found a cleared state")
	}
	tps, err := db.Partitions()
	if err != nil || len(tps) != 1 || tps[0] != (TopicPartition{Topic: "events", Partition: 1}) {
		t.Fatalf("partitions after Clear: %v, %v; want events/1 alone", tps, err)
	}
	if cp, ok := other.Checkpoint(); !ok || cp.Offset != 7 {
		t.Fatalf("the other partition's checkpoint %v %t after Clear, want 7", cp, ok)
	}
	if got := mustPage(t, other, ids[0]); string(got) != string(pageBytes(pb, ids[0], 2)) {
		t.Fatal("the other partition's page changed after Clear")
	}
}
