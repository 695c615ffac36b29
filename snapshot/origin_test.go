package snapshot

import (
	"context"
	"testing"

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
