package consumer

import (
	"bytes"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kdedup/kdedup/dedup"
	"github.com/kdedup/kdedup/filter"
	"github.com/kdedup/kdedup/store"
)

// recordingMode is a mode whose write batches are recorded instead of
// marked for a group commit (there is no Kafka client in these tests).
type recordingMode struct {
	mode
	commits []store.Checkpoint
}

func (m *recordingMode) committed(_ *partitionWorker, cp store.Checkpoint) {
	m.commits = append(m.commits, cp)
}

// produced is what a fake producer was handed: the output record and the
// input record it was decided from.
type produced struct{ in, out *kgo.Record }

// partitionRig is one partition of a Worker over an in-memory store, with a
// fake producer, for testing the per-partition path without Kafka.
type partitionRig struct {
	w    *Worker
	pw   *partitionWorker
	mode *recordingMode
	db   *store.DB
	open func() *dedup.Deduplicator
	out  []produced
}

func newPartitionRig(t *testing.T, delivery Delivery, opts Options) *partitionRig {
	t.Helper()
	db, err := store.Open(store.Options{InMemory: true, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	opener, err := dedup.NewOpener(db, dedup.Options{Staged: delivery == ExactlyOnce, HashSeed: filter.Seed{K0: 3, K1: 4}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	opts.Delivery, opts.Dedup, opts.Logger = delivery, opener, slog.New(slog.DiscardHandler)
	opts = opts.withDefaults()
	w := &Worker{opts: opts, log: opts.Logger}
	w.m = newMetrics(prometheus.NewRegistry(), w)
	m := &recordingMode{mode: newMode(w, delivery)}
	w.mode = m
	r := &partitionRig{w: w, mode: m, db: db}
	r.open = func() *dedup.Deduplicator {
		d, err := opener.Open("in", 0)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	r.pw = newPartition(w, nil, "in", 0, r.open())
	r.pw.owned.Or(ownedPlanned)
	return r
}

// produce is the fake producer: every record is acknowledged at once.
func (r *partitionRig) produce(in, out *kgo.Record) { r.out = append(r.out, produced{in, out}) }

// TestProcessAgainstModel feeds one partition, at least once, records one
// at a time through process (decide, send, cut write batches) with a fake
// producer and an in-memory store, and checks it against an exact model,
// a set of keys:
//   - each record's output is the model's: a key not in the set to the
//     output topic, a repeat to the duplicates topic with its reason, a
//     tombstone (which removes its key) and a record without a key to the
//     output, and a record too large for its topic (output or duplicates)
//     to the dead-letter topic, its key decided all the same;
//   - a write batch is cut as soon as the dirty pages reach FlushBytes, so
//     they never stay at or above it after a record, and every cut
//     commits a later checkpoint than the one before, once;
//   - after a last flush the store holds the checkpoint after the last
//     record and, reopened, the model's keys.
func TestProcessAgainstModel(t *testing.T) {
	const flushBytes = 64 << 10 // 16 whole pages, or 64 delta pages
	r := newPartitionRig(t, AtLeastOnce, Options{
		OutputTopic: "out", DuplicatesTopic: "dups", DeadLetterTopic: "dead",
		FlushBytes: flushBytes, MaxRecordBytes: func(string) int { return 400 },
	})
	pw := r.pw
	rng := rand.New(rand.NewPCG(5, 6))
	model := map[string]bool{}
	var want []string // "topic key [reason]" per record, in order
	const records = 20_000
	for off := range int64(records) {
		key := fmt.Sprint("k", rng.IntN(3_000))
		rec := &kgo.Record{Topic: "in", Offset: off, LeaderEpoch: 2, Key: []byte(key), Value: []byte("v")}
		switch n := rng.IntN(100); {
		case n < 3:
			rec.Key = nil
			want = append(want, "out ")
		case n < 6 && model[key]:
			rec.Value = nil // a tombstone
			delete(model, key)
			want = append(want, "out "+key)
		case n < 7:
			rec.Value = bytes.Repeat([]byte{'x'}, 500)          // over the topic's 400 bytes
			want = append(want, "dead "+key+" "+ReasonTooLarge) // forwarded or dropped, too large for either topic
			model[key] = true
		case model[key]:
			want = append(want, "dups "+key+" "+ReasonDuplicate)
		default:
			model[key] = true
			want = append(want, "out "+key)
		}
		pw.process([]*kgo.Record{rec}, r.produce)
		if pw.failed.Load() {
			t.Fatalf("offset %d: the partition failed", off)
		}
		if d := pw.dedup.DirtyBytes(); d >= flushBytes {
			t.Fatalf("offset %d: %d dirty bytes after the record, at or above FlushBytes %d: the batch was not cut", off, d, flushBytes)
		}
	}
	pw.flush()
	pw.flush() // nothing new: no second batch at the same checkpoint

	if len(r.out) != records {
		t.Fatalf("%d records produced for %d input records", len(r.out), records)
	}
	for i, p := range r.out {
		got := p.out.Topic + " " + string(p.in.Key)
		for _, h := range p.out.Headers {
			if h.Key == HeaderReason || h.Key == HeaderDeadLetterReason {
				got += " " + string(h.Value)
			}
		}
		if got != want[i] {
			t.Fatalf("offset %d: produced %q, want %q", i, got, want[i])
		}
		if p.in.Offset != int64(i) {
			t.Fatalf("output %d decided from offset %d", i, p.in.Offset)
		}
	}
	commits := r.mode.commits
	if len(commits) < 5 {
		t.Fatalf("%d write batches for %d records with FlushBytes %d: the rule never cut one", len(commits), records, flushBytes)
	}
	for i := 1; i < len(commits); i++ {
		if commits[i].Offset <= commits[i-1].Offset {
			t.Fatalf("write batch %d at %d after one at %d", i, commits[i].Offset, commits[i-1].Offset)
		}
	}
	if last := commits[len(commits)-1]; last != (store.Checkpoint{Offset: records, LeaderEpoch: 2}) {
		t.Fatalf("last write batch at %+v, want offset %d epoch 2", last, records)
	}
	pw.close()
	d := r.open()
	defer d.Close()
	if cp, ok := d.Checkpoint(); !ok || cp.Offset != records {
		t.Fatalf("reopened at %+v (%v), want offset %d", cp, ok, records)
	}
	keys := slices.Sorted(func(yield func(string) bool) {
		for k := range model {
			if !yield(k) {
				return
			}
		}
	})
	for i, k := range keys {
		got, err := d.Decide(&kgo.Record{Topic: "in", Offset: records + int64(i), Key: []byte(k), Value: []byte("v")})
		if err != nil {
			t.Fatal(err)
		}
		if got != dedup.Duplicate {
			t.Fatalf("key %s of the model decided %v after a reopen, want duplicate", k, got)
		}
	}
}

// TestOwnerGuard checks that a write batch is cut only where the loop owns
// the deduplicator: not before adjustOffsets has planned the start, not
// while a replay runs, whichever of the two ends first; then flush commits.
func TestOwnerGuard(t *testing.T) {
	for _, order := range []string{"plan first", "replay first"} {
		t.Run(order, func(t *testing.T) {
			r := newPartitionRig(t, AtLeastOnce, Options{OutputTopic: "out"})
			pw := r.pw
			defer pw.close()
			pw.owned.Store(0)
			pw.process([]*kgo.Record{{Topic: "in", Offset: 0, Key: []byte("a"), Value: []byte("v")}}, r.produce)
			check := func(step string, want dedupOwner, commits int) {
				t.Helper()
				if got := pw.owner(); got != want {
					t.Fatalf("%s: owner %d, want %d", step, got, want)
				}
				pw.flush()
				if len(r.mode.commits) != commits {
					t.Fatalf("%s: %d write batches after flush, want %d", step, len(r.mode.commits), commits)
				}
			}
			check("assigned", ownerPlan, 0)
			pw.owned.Or(ownedReplaying)
			check("replaying, unplanned", ownerRestore, 0)
			if order == "plan first" {
				pw.owned.Or(ownedPlanned)
				check("replaying, planned", ownerRestore, 0)
				pw.owned.And(^uint32(ownedReplaying))
			} else {
				pw.owned.And(^uint32(ownedReplaying))
				check("replayed, unplanned", ownerPlan, 0)
				pw.owned.Or(ownedPlanned)
			}
			check("planned and replayed", ownerLoop, 1)
		})
	}
}

// TestExactlyOnceBatchEnd checks where an exactly-once write batch ends:
// at the last committed transaction, never past it, whatever was decided
// since; an aborted transaction's records are decided again.
func TestExactlyOnceBatchEnd(t *testing.T) {
	r := newPartitionRig(t, ExactlyOnce, Options{OutputTopic: "out"})
	pw := r.pw
	defer pw.close()
	recs := func(from, n int64) []*kgo.Record {
		var rs []*kgo.Record
		for o := from; o < from+n; o++ {
			rs = append(rs, &kgo.Record{Topic: "in", Offset: o, LeaderEpoch: 1, Key: fmt.Append(nil, "k", o), Value: []byte("v")})
		}
		return rs
	}
	pw.process(recs(0, 10), r.produce)
	if err := pw.commitTxn(); err != nil {
		t.Fatal(err)
	}
	pw.process(recs(10, 5), r.produce) // a transaction still open
	pw.flush()
	if want := []store.Checkpoint{{Offset: 10, LeaderEpoch: 1}}; !slices.Equal(r.mode.commits, want) {
		t.Fatalf("write batches %v with a transaction open, want %v", r.mode.commits, want)
	}
	if err := pw.abortTxn(); err != nil {
		t.Fatal(err)
	}
	pw.process(recs(10, 5), r.produce) // franz-go rewinds the input
	if err := pw.commitTxn(); err != nil {
		t.Fatal(err)
	}
	pw.flush()
	if want := []store.Checkpoint{{Offset: 10, LeaderEpoch: 1}, {Offset: 15, LeaderEpoch: 1}}; !slices.Equal(r.mode.commits, want) {
		t.Fatalf("write batches %v, want %v", r.mode.commits, want)
	}
	if len(r.out) != 20 {
		t.Fatalf("%d records produced, want 20 (5 of them twice: an aborted transaction's)", len(r.out))
	}
	for _, p := range r.out {
		if p.out.Topic != "out" {
			t.Fatalf("offset %d produced to %s: an aborted transaction's key was remembered", p.in.Offset, p.out.Topic)
		}
	}
}
