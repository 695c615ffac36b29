package snapshot

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// TestNewestReadsByOffsetInName lists a partition's manifests once and
// reads them one at a time, highest offset (by name) first: a damaged
// manifest named with the highest offset comes first and is reported
// skipped, then the snapshots newest first, and the end.
func TestNewestReadsByOffsetInName(t *testing.T) {
	st, dir := openStore(t)
	ctx := context.Background()
	for i, off := range []int64{500, 100, 900} {
		if _, err := st.Put(ctx, tp, newSource(uint64(i), 5, off).export); err != nil {
			t.Fatal(err)
		}
	}
	bad := filepath.Join(dir, "events", "2", "manifest", "00000000000000001000-x.json")
	if err := os.WriteFile(bad, []byte("{not json"), 0o644); err != nil {
		t.Fatal(err)
	}
	l, err := st.Newest(ctx, tp)
	if err != nil {
		t.Fatal(err)
	}
	_, ok, skipped, err := l.Next(ctx, 0)
	if ok || err != nil || !errors.Is(skipped, ErrCorrupt) {
		t.Fatalf("first Next = ok %t, skipped %v, err %v; want the damaged manifest of offset 1000 skipped as corrupt", ok, skipped, err)
	}
	for _, want := range []int64{900, 500, 100} {
		m, ok, skipped, err := l.Next(ctx, 0)
		if !ok || skipped != nil || err != nil || m.Offset != want {
			t.Fatalf("Next = %d (ok %t, skipped %v, err %v), want offset %d", m.Offset, ok, skipped, err, want)
		}
	}
	if _, ok, skipped, err := l.Next(ctx, 0); ok || skipped != nil || err != nil {
		t.Fatalf("Next past the last = ok %t, skipped %v, err %v; want the end", ok, skipped, err)
	}
}
