package snapshot

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// age sets the store time (modification time) of the object at key.
func age(t *testing.T, dir, key string, ago time.Duration) {
	t.Helper()
	at := time.Now().Add(-ago)
	if err := os.Chtimes(filepath.Join(dir, filepath.FromSlash(key)), at, at); err != nil {
		t.Fatal(err)
	}
}

func exists(dir, key string) bool {
	_, err := os.Stat(filepath.Join(dir, filepath.FromSlash(key)))
	return err == nil
}

// TestPruneKeepsHighestOffset stores the snapshot of the highest offset
// first and three of lower offsets after it (a revoked worker's late
// uploads): pruning to the two newest by store time keeps those two and
// the highest offset's, and deletes the rest.
func TestPruneKeepsHighestOffset(t *testing.T) {
	st, dir := openStore(t)
	ctx := context.Background()
	var ms []Manifest
	for i, off := range []int64{900, 100, 200, 300} {
		m, err := st.Put(ctx, tp, newSource(uint64(i), 3, off).export)
		if err != nil {
			t.Fatal(err)
		}
		age(t, dir, m.Key(), time.Duration(10-i)*time.Minute) // stored in this order
		ms = append(ms, m)
	}
	n, err := st.Prune(ctx, tp, 2, time.Hour)
	if err != nil || n != 2 {
		t.Fatalf("Prune = %d, %v; want the snapshot of offset 100 and its object deleted", n, err)
	}
	left, _, err := st.List(ctx, tp)
	if err != nil {
		t.Fatal(err)
	}
	var offsets []int64
	for _, m := range left {
		offsets = append(offsets, m.Offset)
		if !exists(dir, m.Object) {
			t.Errorf("object of the kept snapshot at %d deleted", m.Offset)
		}
	}
	if !slices.Equal(offsets, []int64{900, 300, 200}) {
		t.Fatalf("left offsets %v, want 900 (highest), 300 and 200 (newest)", offsets)
	}
	if exists(dir, ms[1].Object) {
		t.Fatal("object of the pruned snapshot at 100 kept")
	}
}

// TestPruneUnreadableManifests: a corrupt manifest stops orphan pruning
// only while younger than the grace period; older, it is deleted (and
// reported), and so are the objects no manifest names. A manifest of a
// newer format is never deleted, nor the object it names, and does not
// stop orphan pruning.
func TestPruneUnreadableManifests(t *testing.T) {
	st, dir := openStore(t)
	ctx := context.Background()
	m, err := st.Put(ctx, tp, newSource(1, 3, 50).export)
	if err != nil {
		t.Fatal(err)
	}
	write := func(key, body string, ago time.Duration) {
		t.Helper()
		p := filepath.Join(dir, filepath.FromSlash(key))
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		age(t, dir, key, ago)
	}
	const (
		orphan   = "events/2/data/00000000000000000010-orphan.kds"
		newerObj = "events/2/data/00000000000000000020-newer.kds"
		newer    = "events/2/manifest/00000000000000000020-newer.json"
		corrupt  = "events/2/manifest/00000000000000000030-bad.json"
		grace    = time.Hour
		longAgo  = 2 * grace
		young    = time.Minute
	)
	write(orphan, "no manifest names me", longAgo)
	write(newerObj, "a newer build's", longAgo)
	write(newer, `{"format":99,"topic":"events","partition":2,"offset":20,"object":"`+newerObj+`"}`, longAgo)
	write(corrupt, "{not json", young)

	p, err := st.PruneReport(ctx, tp, 1, grace)
	if err != nil || p.Objects != 0 || len(p.Unreadable) != 0 {
		t.Fatalf("PruneReport with a young corrupt manifest = %+v, %v; want nothing deleted", p, err)
	}
	if !exists(dir, orphan) || !exists(dir, corrupt) {
		t.Fatal("an object deleted while a young corrupt manifest might name it")
	}

	age(t, dir, corrupt, longAgo)
	p, err = st.PruneReport(ctx, tp, 1, grace)
	if err != nil || p.Objects != 2 || !slices.Equal(p.Unreadable, []string{corrupt}) {
		t.Fatalf("PruneReport with an old corrupt manifest = %+v, %v; want it and the orphan deleted, it reported", p, err)
	}
	for key, want := range map[string]bool{orphan: false, corrupt: false, newer: true, newerObj: true, m.Key(): true, m.Object: true} {
		if exists(dir, key) != want {
			t.Errorf("%s exists %t, want %t", key, !want, want)
		}
	}
}
