package consumer

import (
	"context"
	"log/slog"
	"testing"

	"go.uber.org/goleak"

	"github.com/kdedup/kdedup/snapshot"
	"github.com/kdedup/kdedup/store"
)

// The workers, partitions, replays, snapshot loops, Kafka clients and
// stores the tests start must all be gone once each test has stopped
// them.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// fileSnapshots is a snapshot store in a directory of the test's, closed
// when the test ends.
func fileSnapshots(t *testing.T) *snapshot.Store {
	t.Helper()
	snaps, err := snapshot.Open(context.Background(), "file://"+t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { snaps.Close() })
	return snaps
}

// diskStore is a store in a directory of the test's, at the default
// options, closed when the test ends.
func diskStore(t *testing.T) *store.DB {
	t.Helper()
	db, err := store.Open(store.Options{Dir: t.TempDir(), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}
