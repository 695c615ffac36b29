package consumer

import (
	"fmt"
	"log/slog"
	"math/rand/v2"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kdedup/kdedup/dedup"
	"github.com/kdedup/kdedup/filter"
	"github.com/kdedup/kdedup/store"
)

// TestTxnEndRandomized cross-checks a partition's transaction ends
// (commitTxn, abortTxn) against an exact model: a map of the keys of the
// committed transactions. Each transaction decides a few records, as the
// transaction loop does, and ends committed or aborted at random.
// Invariants:
//   - every decision is the model's: Forward for a key that no committed
//     transaction and no earlier record of this one holds, else Duplicate
//     (an aborted transaction's keys are forgotten, a committed one's kept);
//   - after either end, next, decided and the lag metric's next offset are
//     those of the last committed transaction, and so are stableNext and
//     stableDecided;
//   - an abort rewinds the input to the last committed transaction, so the
//     next transaction decides the same offsets again.
func TestTxnEndRandomized(t *testing.T) {
	db, err := store.Open(store.Options{InMemory: true, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	opener, err := dedup.NewOpener(db, dedup.Options{Staged: true, HashSeed: filter.Seed{K0: 1, K1: 2}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	d, err := opener.Open("in", 0)
	if err != nil {
		t.Fatal(err)
	}
	w := &Worker{opts: Options{Delivery: ExactlyOnce}}
	pw := newPartition(w, nil, "in", 0, d)
	t.Cleanup(pw.close)

	rng := rand.New(rand.NewPCG(7, 11))
	committed := map[string]bool{} // the model: keys of committed transactions
	var stableOffset, stableDecided int64
	for txn := range 300 {
		staged := map[string]bool{}
		offset := stableOffset // franz-go rewinds an aborted transaction's input
		for range 1 + rng.IntN(8) {
			key := fmt.Sprint("k", rng.IntN(400))
			r := &kgo.Record{Topic: "in", Key: []byte(key), Value: []byte("v"), Offset: offset, LeaderEpoch: 3}
			got, err := pw.dedup.Decide(r)
			if err != nil {
				t.Fatal(err)
			}
			want := dedup.Forward
			if committed[key] || staged[key] {
				want = dedup.Duplicate
			}
			if got != want {
				t.Fatalf("transaction %d, offset %d, key %s: decided %v, want %v", txn, offset, key, got, want)
			}
			staged[key] = true
			// What process records of a decided record.
			pw.next = store.Checkpoint{Offset: offset + 1, LeaderEpoch: r.LeaderEpoch}
			pw.decided++
			pw.nextOffset.Store(pw.next.Offset)
			offset++
		}
		commit := rng.IntN(3) > 0
		end := pw.abortTxn
		if commit {
			end = pw.commitTxn
			for k := range staged {
				committed[k] = true
			}
			stableOffset, stableDecided = offset, pw.decided
		}
		if err := end(); err != nil {
			t.Fatalf("transaction %d, commit %t: %v", txn, commit, err)
		}
		want := store.Checkpoint{Offset: stableOffset, LeaderEpoch: 3}
		if stableOffset == 0 {
			want = store.Checkpoint{}
		}
		if pw.next != want || pw.stableNext != want || pw.decided != stableDecided || pw.stableDecided != stableDecided {
			t.Fatalf("transaction %d, commit %t: next %+v stable %+v, decided %d stable %d; want %+v and %d",
				txn, commit, pw.next, pw.stableNext, pw.decided, pw.stableDecided, want, stableDecided)
		}
		if got := pw.nextOffset.Load(); got != stableOffset {
			t.Fatalf("transaction %d, commit %t: lag metric's next offset %d, want %d", txn, commit, got, stableOffset)
		}
		if d.StagedBytes() != 0 {
			t.Fatalf("transaction %d, commit %t: %d staged bytes left", txn, commit, d.StagedBytes())
		}
	}
}
