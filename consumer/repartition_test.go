package consumer

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kdedup/kdedup/store"
)

// TestRekeyedRestoresTheOriginal: a record the repartition stage produces
// (rekeyed) comes back as the record it read (restoreOriginal), whatever
// its key (null, empty, set) and headers (none, some, some named like the
// appended ones); a record the repartition stage did not produce is left
// as it is.
func TestRekeyedRestoresTheOriginal(t *testing.T) {
	w := &Worker{opts: Options{RepartitionTopic: "repartition"}}
	pw := &partitionWorker{w: w, topic: "in", partition: 3}
	ts := time.UnixMilli(1_767_225_600_123)
	for _, key := range [][]byte{nil, {}, []byte("user-7")} {
		for _, hdrs := range [][]kgo.RecordHeader{
			nil,
			{{Key: "trace", Value: []byte("t-1")}},
			{{Key: HeaderOriginalSource, Value: []byte("x/0/1")}, {Key: HeaderOriginalKey, Value: nil}},
		} {
			for _, value := range [][]byte{nil, []byte(`{"event_id":"e-1"}`)} {
				in := &kgo.Record{Topic: "in", Partition: 3, Offset: 41, Key: key, Value: value, Headers: hdrs, Timestamp: ts}
				name := fmt.Sprintf("key %q (nil %v) headers %d value %q", key, key == nil, len(hdrs), value)
				dk := []byte("e-1")
				out := pw.rekeyed(in, dk)
				if out.Topic != "repartition" || string(out.Key) != "e-1" || !out.Timestamp.Equal(ts) || string(out.Value) != string(value) || (out.Value == nil) != (value == nil) {
					t.Fatalf("%s: rekeyed %+v", name, out)
				}
				if last := out.Headers[len(out.Headers)-1]; last.Key != HeaderOriginalSource || string(last.Value) != "in/3/41" {
					t.Fatalf("%s: last header %+v, want %s=in/3/41", name, last, HeaderOriginalSource)
				}
				// As the dedup stage reads it: a record of the repartition
				// topic, the headers decoded (a null value may come back
				// empty).
				back := &kgo.Record{Topic: "repartition", Partition: 1, Offset: 9, Key: out.Key, Value: out.Value, Timestamp: out.Timestamp}
				for _, h := range out.Headers {
					back.Headers = append(back.Headers, kgo.RecordHeader{Key: h.Key, Value: append([]byte(nil), h.Value...)})
				}
				if !restoreOriginal(back) {
					t.Fatalf("%s: not restored", name)
				}
				if (back.Key == nil) != (key == nil) || string(back.Key) != string(key) {
					t.Errorf("%s: key restored as %q (nil %v)", name, back.Key, back.Key == nil)
				}
				if !slices.EqualFunc(back.Headers, hdrs, func(a, b kgo.RecordHeader) bool { return a.Key == b.Key && string(a.Value) == string(b.Value) }) {
					t.Errorf("%s: headers restored as %+v, want %+v", name, back.Headers, hdrs)
				}
				if back.Topic != "repartition" || back.Partition != 1 || back.Offset != 9 {
					t.Errorf("%s: restoring moved the record to %s/%d/%d", name, back.Topic, back.Partition, back.Offset)
				}
				// Produced: back to the pool, and the next record rekeyed
				// reuses its header slice, emptied.
				w.releaseOutput(out)
				if out.Topic != "" || len(out.Headers) != 0 || slices.ContainsFunc(out.Headers[:cap(out.Headers)], func(h kgo.RecordHeader) bool { return h.Value != nil }) {
					t.Fatalf("%s: a released record keeps %+v", name, out)
				}
			}
		}
	}
	foreign := &kgo.Record{Key: []byte("k"), Headers: []kgo.RecordHeader{{Key: "trace", Value: []byte("x")}, {Key: HeaderOriginalSource, Value: []byte("x/0/1")}}}
	if restoreOriginal(foreign) || string(foreign.Key) != "k" || len(foreign.Headers) != 2 {
		t.Errorf("a record without the two appended headers was changed: %+v", foreign)
	}
}

// TestRepartitionStageStartsAtTheGroupOffset: a partition of the
// repartition stage, which has no checkpoint of its own, stands at the
// group's offset once planned, so that exactly once an aborted first
// transaction rewinds it there (abortTxn, endTxnSkips), never to offset 0;
// below the log start it starts at the log start.
func TestRepartitionStageStartsAtTheGroupOffset(t *testing.T) {
	for _, c := range []struct {
		name            string
		group, logStart int64
		want            store.Checkpoint
	}{
		{"at the group's offset", 500, 100, store.Checkpoint{Offset: 500, LeaderEpoch: 4}},
		{"below the log start", 50, 100, store.Checkpoint{Offset: 100, LeaderEpoch: -1}},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := newPartitionRig(t, ExactlyOnce, Options{InputTopics: []string{"in"}, OutputTopic: "out", RepartitionTopic: "by-key"})
			pw := newPartition(r.w, nil, "in", 3, nil)
			if !pw.stateless() {
				t.Fatal("an input partition with a repartition topic has state")
			}
			adm := &fakeAdmin{logStart: c.logStart, logEnd: 1000, fail: map[string]bool{}}
			var (
				starts kadm.ListedOffsets
				seen   groupOffsets
				info   planInfo
			)
			o := kgo.NewOffset().At(c.group).WithEpoch(4)
			start, replay, err := r.w.planStart(context.Background(), adm, &starts, &seen, &info, pw, o)
			if err != nil || replay != nil {
				t.Fatalf("planStart: replay %v, err %v", replay, err)
			}
			if got := start.EpochOffset().Offset; got != c.want.Offset {
				t.Errorf("starts at %d, want %d", got, c.want.Offset)
			}
			if err := pw.abortTxn(); err != nil {
				t.Fatal(err)
			}
			if pw.next != c.want || pw.stableNext != c.want {
				t.Errorf("after an aborted first transaction it stands at %+v (stable %+v), want %+v", pw.next, pw.stableNext, c.want)
			}
		})
	}
}

// TestRepartitionRecordOverDecompressLimit: a record the repartition topic
// would take but whose batch the dedup stage could not decompress
// (MaxDecompressBytes) is a dead letter of the repartition stage, and
// franz-go's batches to the repartition topic are bounded by that limit.
func TestRepartitionRecordOverDecompressLimit(t *testing.T) {
	const limit = 1 << 20
	r := newPartitionRig(t, AtLeastOnce, Options{InputTopics: []string{"in"}, OutputTopic: "out", RepartitionTopic: "by-key",
		DeadLetterTopic: "dead", MaxDecompressBytes: limit, MaxRecordBytes: func(string) int { return 8 << 20 }})
	pw := newPartition(r.w, nil, "in", 0, nil)
	pw.owned.Or(ownedPlanned)
	small := &kgo.Record{Topic: "in", Offset: 0, Key: []byte("a"), Value: []byte(`{"id":"a"}`)}
	big := &kgo.Record{Topic: "in", Offset: 1, Key: []byte("b"), Value: make([]byte, limit)}
	pw.process([]*kgo.Record{small, big}, r.produce)
	if pw.failed.Load() || len(r.out) != 2 {
		t.Fatalf("failed %v, %d records produced, want 2", pw.failed.Load(), len(r.out))
	}
	if r.out[0].out.Topic != "by-key" || r.out[1].out.Topic != "dead" || r.out[1].in != big {
		t.Errorf("produced to %s and %s (from offset %d), want the repartition topic, then the dead-letter topic for the record over the limit",
			r.out[0].out.Topic, r.out[1].out.Topic, r.out[1].in.Offset)
	}
	if got := r.w.producerBatchMaxBytes("by-key"); got != producerBatchMaxBytes(limit) {
		t.Errorf("batches to the repartition topic bounded at %d bytes, want %d", got, producerBatchMaxBytes(limit))
	}
	if got := r.w.producerBatchMaxBytes("out"); got != producerBatchMaxBytes(8<<20) {
		t.Errorf("batches to the output topic bounded at %d bytes, want %d", got, producerBatchMaxBytes(8<<20))
	}
}

// TestTxnBudgetIgnoresRepartitionStage: the partitions of the repartition
// stage hold no pages, so they do not raise the ceiling the transaction
// budget keeps all pages under (store.MinCutPages a partition).
func TestTxnBudgetIgnoresRepartitionStage(t *testing.T) {
	r := newPartitionRig(t, ExactlyOnce, Options{InputTopics: []string{"in"}, OutputTopic: "out", RepartitionTopic: "by-key", MaxDirtyPageBytes: 1})
	parts := []*partitionWorker{r.pw}
	alone := r.w.txnBudgetOf(parts)
	for p := range int32(50) {
		parts = append(parts, newPartition(r.w, nil, "in", p+1, nil))
	}
	if got := r.w.txnBudgetOf(parts); got != alone {
		t.Errorf("budget %d with 50 partitions of the repartition stage, %d without", got, alone)
	}
	if alone < 1 || alone >= pollRecords {
		t.Fatalf("budget %d: the page ceiling does not bound it, so the test shows nothing", alone)
	}
}
