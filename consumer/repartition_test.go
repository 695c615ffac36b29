package consumer

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
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
