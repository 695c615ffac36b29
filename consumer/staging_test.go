package consumer

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/kdedup/kdedup/dedup"
	"github.com/kdedup/kdedup/store"
)

// TestNewRefusesStagingThatDoesNotMatchDelivery: a worker is built only
// with a deduplicator that stages its changes exactly when delivery is
// exactly once. Exactly once without staging would keep the filter
// changes of an aborted transaction (the input is read again and its keys
// are duplicates: records lost); at least once with staging would never
// write the changes of a decided record (its key is forgotten on restart).
func TestNewRefusesStagingThatDoesNotMatchDelivery(t *testing.T) {
	db, err := store.Open(store.Options{InMemory: true, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	for _, delivery := range []Delivery{AtLeastOnce, ExactlyOnce} {
		for _, staged := range []bool{false, true} {
			t.Run(fmt.Sprintf("exactly-once=%t/staged=%t", delivery == ExactlyOnce, staged), func(t *testing.T) {
				opener, err := dedup.NewOpener(db, dedup.Options{Staged: staged}, nil)
				if err != nil {
					t.Fatal(err)
				}
				_, err = New(Options{Brokers: []string{"127.0.0.1:9092"}, InputTopics: []string{"in"}, OutputTopic: "out",
					Delivery: delivery, Dedup: opener})
				if want := staged != (delivery == ExactlyOnce); errors.Is(err, ErrStaging) != want || (!want && err != nil) {
					t.Fatalf("New: %v; want ErrStaging: %t", err, want)
				}
			})
		}
	}
	if _, err := New(Options{Brokers: []string{"127.0.0.1:9092"}, InputTopics: []string{"in"}, OutputTopic: "out"}); err == nil {
		t.Fatal("New without a deduplicator: no error")
	}
}

// TestFlushBytesAskedOfTheStore: the store owns the size of a write batch
// (one Badger transaction): a worker without FlushBytes takes the store's,
// and one whose FlushBytes the store cannot hold in a transaction is
// refused by New rather than by the first write batch that passes it.
func TestFlushBytesAskedOfTheStore(t *testing.T) {
	const storeFlush = 2 << 20
	db, err := store.Open(store.Options{InMemory: true, FlushBytes: storeFlush, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	opener, err := dedup.NewOpener(db, dedup.Options{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	base := Options{Brokers: []string{"127.0.0.1:9092"}, InputTopics: []string{"in"}, OutputTopic: "out", Dedup: opener}
	w, err := New(base)
	if err != nil {
		t.Fatal(err)
	}
	if w.opts.FlushBytes != storeFlush {
		t.Errorf("FlushBytes %d, want the store's %d", w.opts.FlushBytes, storeFlush)
	}
	for _, fb := range []int64{storeFlush / 2, storeFlush, storeFlush + 1, 8 << 20} {
		o := base
		o.FlushBytes = fb
		_, err := New(o)
		if want := fb > storeFlush; (err != nil) != want {
			t.Errorf("FlushBytes %d over a store of %d: New error %v, want one: %t", fb, storeFlush, err, want)
		}
		if err != nil && !strings.Contains(err.Error(), fmt.Sprint(storeFlush)) {
			t.Errorf("error %q does not name the store's %d", err, storeFlush)
		}
	}
}

// TestNewReportsEveryProblem: a FlushBytes the store cannot hold and a
// staging that does not match delivery are both reported.
func TestNewReportsEveryProblem(t *testing.T) {
	db, err := store.Open(store.Options{InMemory: true, FlushBytes: 2 << 20, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	opener, err := dedup.NewOpener(db, dedup.Options{Staged: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, err = New(Options{Brokers: []string{"127.0.0.1:9092"}, InputTopics: []string{"in"}, OutputTopic: "out",
		Dedup: opener, FlushBytes: 4 << 20})
	if !errors.Is(err, ErrStaging) || err == nil || !strings.Contains(err.Error(), "FlushBytes") {
		t.Fatalf("New: %v; want ErrStaging and the FlushBytes problem", err)
	}
}
