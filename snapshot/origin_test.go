package snapshot

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/kdedup/kdedup/store"
)

// TestManifestCarriesOrigin: a snapshot's manifest holds the origin of
// the state it was exported from, as stored and as listed, and none for a
// state without one.
func TestManifestCarriesOrigin(t *testing.T) {
	st, _ := openStore(t)
	ctx := context.Background()
	origin := store.Origin{TopicID: "AAAAAAAAAAAAAAAAAAAAAA", ClusterID: "cluster-1"}
	src := newSource(1, 10, 100)
	src.img.Origin = origin
	m, err := st.Put(ctx, tp, src.export)
	if err != nil {
		t.Fatal(err)
	}
	if m.Origin() != origin {
		t.Fatalf("Put's manifest has origin %v, want %v", m.Origin(), origin)
	}
	if _, err := st.Put(ctx, tp, newSource(2, 10, 50).export); err != nil {
		t.Fatal(err)
	}
	ms, skipped, err := st.List(ctx, tp)
	if err != nil || len(skipped) != 0 || len(ms) != 2 {
		t.Fatalf("List = %v, %v, %v; want two manifests", ms, skipped, err)
	}
	if ms[0].Origin() != origin || !ms[1].Origin().IsZero() {
		t.Fatalf("listed origins %v and %v, want %v and none", ms[0].Origin(), ms[1].Origin(), origin)
	}
}

// TestPruneOfKeepsOnlyItsOwnHighest: after a topic is created again, the
// old topic's snapshot has the highest offset; a writer of the new topic
// prunes by store time and keeps the highest offset of its own origin,
// never the old topic's, which ages out. Prune without an origin keeps
// the highest offset whatever its origin.
func TestPruneOfKeepsOnlyItsOwnHighest(t *testing.T) {
	ctx := context.Background()
	old := store.Origin{TopicID: "AAAAAAAAAAAAAAAAAAAAAA", ClusterID: "c"}
	cur := store.Origin{TopicID: "BBBBBBBBBBBBBBBBBBBBBB", ClusterID: "c"}
	offsets := func(st *Store) []int64 {
		ms, _, err := st.List(ctx, tp)
		if err != nil {
			t.Fatal(err)
		}
		var offs []int64
		for _, m := range ms {
			offs = append(offs, m.Offset)
		}
		return offs
	}
	for _, tc := range []struct {
		name   string
		origin store.Origin
		want   []int64
	}{
		{"of the new topic", cur, []int64{30, 20}},
		{"without an origin", store.Origin{}, []int64{1000, 30, 20}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, _ := openStore(t)
			for i, s := range []struct {
				off    int64
				origin store.Origin
			}{{1000, old}, {10, cur}, {20, cur}, {30, cur}} {
				src := newSource(uint64(i), 3, s.off)
				src.img.Origin = s.origin
				if _, err := st.Put(ctx, tp, src.export); err != nil {
					t.Fatal(err)
				}
				time.Sleep(10 * time.Millisecond) // distinct store times
			}
			if _, err := st.PruneOf(ctx, tp, tc.origin, 2, time.Hour); err != nil {
				t.Fatal(err)
			}
			if got := offsets(st); !slices.Equal(got, tc.want) {
				t.Fatalf("snapshots left at offsets %v, want %v", got, tc.want)
			}
		})
	}
}
