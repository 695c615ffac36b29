package consumer

import (
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kerr"
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
			pw.gauges.nextOffset.Store(pw.next.Offset)
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
		if got := pw.gauges.nextOffset.Load(); got != stableOffset {
			t.Fatalf("transaction %d, commit %t: lag metric's next offset %d, want %d", txn, commit, got, stableOffset)
		}
		if d.StagedBytes() != 0 {
			t.Fatalf("transaction %d, commit %t: %d staged bytes left", txn, commit, d.StagedBytes())
		}
	}
}

// TestProduceAbortsBounded cross-checks endTxnRejections, which decides
// whether the worker stops after a transaction ends, against an exact
// model: a run counter of the transactions aborted in a row by produce
// errors not tied to a record. docs/semantics.md promises that such errors
// abort at most three transactions in a row, then stop the worker, so the
// bound is written here as 3, not as maxProduceAborts. Each case is a
// sequence of transaction ends:
//   - other: aborted by a produce error not tied to a record (the run
//     grows by one; the end whose run reaches 3 returns an error wrapping
//     the produce error and saying how many times, and so does every
//     later one until the run is reset);
//   - committed: the run is reset;
//   - refused: aborted with a record refused by the broker (bounded per
//     record instead): the run is reset;
//   - rebalance: aborted without a produce error (a rebalance or fencing):
//     the run neither grows nor is reset.
//
// A random sequence is checked against the same model as the table.
func TestProduceAbortsBounded(t *testing.T) {
	const bound = 3 // docs/semantics.md: "at most three transactions in a row"
	type end int
	const (
		other end = iota
		committed
		refused
		rebalance
	)
	names := []string{"other", "committed", "refused", "rebalance"}
	run := func(t *testing.T, ends []end) {
		t.Helper()
		w := &Worker{opts: Options{Delivery: ExactlyOnce}}
		w.txn.rejections.known = map[recordTarget]rejection{}
		w.txn.rejections.isolated = map[recordTarget]bool{}
		cause := errors.New("POLICY_VIOLATION")
		model := 0
		for i, e := range ends {
			var err error
			switch e {
			case other:
				err = w.endTxnRejections(false, fmt.Errorf("producing record of in/0 offset %d to out: %w", i, cause))
				model++
			case committed:
				err = w.endTxnRejections(true, nil)
				model = 0
			case refused:
				// A different record each time: a suspect, never the
				// culprit, so no RecordError.
				in := &kgo.Record{Topic: "in", Offset: int64(i)}
				out := &kgo.Record{Topic: "out"}
				w.txnProduceFailed(in, out, kerr.MessageTooLarge)
				err = w.endTxnRejections(false, kerr.MessageTooLarge)
				model = 0
			case rebalance:
				err = w.endTxnRejections(false, nil)
			}
			if stop := model >= bound && e == other; stop != (err != nil) {
				t.Fatalf("end %d (%s), %d in a row aborted by other produce errors: error %v, want an error %v", i, names[e], model, err, stop)
			}
			if err == nil {
				continue
			}
			if !errors.Is(err, cause) {
				t.Errorf("end %d: error %v does not wrap the produce error", i, err)
			}
			if want := fmt.Sprintf("failed %d times in a row", model); !strings.Contains(err.Error(), want) {
				t.Errorf("end %d: error %q, want it to say %q", i, err, want)
			}
		}
	}
	for _, tc := range []struct {
		name string
		ends []end
	}{
		{"three stop", []end{other, other, other}},
		{"two keep running", []end{other, other, committed, other, other, committed}},
		{"commit resets", []end{other, other, committed, other, other, other}},
		{"refusal resets", []end{other, other, refused, other, other, other}},
		{"rebalance does not reset", []end{other, other, rebalance, other}},
		{"rebalance alone", []end{rebalance, rebalance, rebalance, rebalance}},
	} {
		t.Run(tc.name, func(t *testing.T) { run(t, tc.ends) })
	}
	t.Run("random", func(t *testing.T) {
		rng := rand.New(rand.NewPCG(3, 5))
		for range 200 {
			ends := make([]end, 1+rng.IntN(12))
			for i := range ends {
				ends[i] = end(rng.IntN(4))
				if rng.IntN(2) == 0 {
					ends[i] = other // long runs
				}
			}
			run(t, ends)
		}
	})
}
