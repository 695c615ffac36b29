package consumer

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// TestRecordBatchBytes checks recordBatchBytes against the Kafka wire
// encoding of a batch holding the record alone (kmsg), across the varint
// length boundaries of key, value, headers and the record length.
func TestRecordBatchBytes(t *testing.T) {
	var cases []*kgo.Record
	for _, n := range []int{0, 1, 63, 64, 65, 8191, 8192, 1 << 20, 1_010_000} {
		cases = append(cases,
			&kgo.Record{Value: bytes.Repeat([]byte{'v'}, n)},
			&kgo.Record{Key: bytes.Repeat([]byte{'k'}, n), Value: []byte("v")},
			&kgo.Record{Key: []byte("k"), Value: bytes.Repeat([]byte{'v'}, n),
				Headers: []kgo.RecordHeader{{Key: "h", Value: bytes.Repeat([]byte{'h'}, n%300)}, {Key: "kdedup-reason", Value: []byte("duplicate")}}})
	}
	cases = append(cases, &kgo.Record{}) // null key and value
	many := &kgo.Record{Key: []byte("k")}
	for i := range 70 {
		many.Headers = append(many.Headers, kgo.RecordHeader{Key: fmt.Sprint("h", i), Value: []byte("x")})
	}
	cases = append(cases, many)
	for i, r := range cases {
		r.Timestamp = time.UnixMilli(1_700_000_000_000)
		if got, want := recordBatchBytes(r), encodedBatchBytes(r); got != want {
			t.Errorf("case %d (key %d, value %d, headers %d bytes): recordBatchBytes = %d, Kafka encoding = %d",
				i, len(r.Key), len(r.Value), len(r.Headers), got, want)
		}
	}
}

// encodedBatchBytes is the size of the Kafka v2 record batch holding r
// alone: what a broker compares with max.message.bytes.
func encodedBatchBytes(r *kgo.Record) int {
	rec := kmsg.Record{Key: r.Key, Value: r.Value}
	if r.Key == nil {
		rec.Key = nil
	}
	for _, h := range r.Headers {
		rec.Headers = append(rec.Headers, kmsg.Header{Key: h.Key, Value: h.Value})
	}
	body := len(rec.AppendTo(nil)) - 1 // Length 0 encodes in one byte
	rec.Length = int32(body)
	records := rec.AppendTo(nil)
	b := kmsg.RecordBatch{Magic: 2, NumRecords: 1, Records: records}
	return len(b.AppendTo(nil))
}

// TestDeadLetterRecord checks what the dead-letter topic receives: the
// input record with the headers appended, and when that does not fit the
// topic, the value left out, then the key and headers too, said in
// kdedup-truncated.
func TestDeadLetterRecord(t *testing.T) {
	for _, tc := range []struct {
		name      string
		limit     int
		value     int
		key       int
		truncated string
	}{
		{"fits", 10_000, 5_000, 10, ""},
		{"value dropped", 10_000, 20_000, 10, "value"},
		{"key dropped too", 10_000, 20_000, 20_000, "key,value,headers"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := &Worker{opts: Options{DeadLetterTopic: "dead", MaxRecordBytes: func(string) int { return tc.limit }}}
			in := &kgo.Record{Topic: "in", Partition: 3, Offset: 42, Key: bytes.Repeat([]byte{'k'}, tc.key), Value: bytes.Repeat([]byte{'v'}, tc.value),
				Headers: []kgo.RecordHeader{{Key: "trace", Value: []byte("t1")}}, Timestamp: time.UnixMilli(5)}
			dl := w.deadLetterRecord(in, "out", ReasonTooLarge, "detail")
			if n := recordBatchBytes(dl); n > tc.limit {
				t.Fatalf("dead letter of %d bytes above the topic's limit %d", n, tc.limit)
			}
			want := map[string]string{HeaderDeadLetterReason: ReasonTooLarge, HeaderSource: "in/3/42", HeaderTarget: "out", HeaderDetail: "detail"}
			if tc.truncated != "" {
				want[HeaderTruncated] = tc.truncated
			}
			got := map[string]string{}
			for _, h := range dl.Headers {
				got[h.Key] = string(h.Value)
			}
			for k, v := range want {
				if got[k] != v {
					t.Errorf("header %s = %q, want %q (headers %v)", k, got[k], v, got)
				}
			}
			if _, ok := got[HeaderTruncated]; ok != (tc.truncated != "") {
				t.Errorf("kdedup-truncated present %v, want %v", ok, tc.truncated != "")
			}
			keepValue, keepKey := tc.truncated == "", tc.truncated != "key,value,headers"
			if !bytes.Equal(dl.Value, in.Value) != !keepValue || !bytes.Equal(dl.Key, in.Key) != !keepKey {
				t.Errorf("key kept %v value kept %v, want %v %v", bytes.Equal(dl.Key, in.Key), bytes.Equal(dl.Value, in.Value), keepKey, keepValue)
			}
			if (got["trace"] == "t1") != keepKey {
				t.Errorf("input header kept %v, want %v", got["trace"] == "t1", keepKey)
			}
			if dl.Topic != "dead" || !dl.Timestamp.Equal(in.Timestamp) {
				t.Errorf("topic %q timestamp %v, want dead and the input's %v", dl.Topic, dl.Timestamp, in.Timestamp)
			}
		})
	}
}

// TestCompressedBatchBytes checks compressedBatchBytes against a broker
// (kfake): for each codec franz-go offers and records compressible or not,
// a producer compressing with that codec gets the record alone into a
// topic whose max.message.bytes is exactly the computed size, and is
// refused MESSAGE_TOO_LARGE by a topic one byte smaller. The compressor is
// read from the producing client, as the worker reads its own.
func TestCompressedBatchBytes(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	rnd := rand.New(rand.NewPCG(3, 4))
	noise := make([]byte, 300_000)
	for i := range noise {
		noise[i] = byte(rnd.Uint32())
	}
	text := bytes.Repeat([]byte(`{"order":12345,"state":"shipped","items":["a","b"]} `), 30_000) // 1.6 MB
	records := map[string]*kgo.Record{
		"text":                  {Key: []byte("k"), Value: text},
		"text, headers, no key": {Value: text, Headers: []kgo.RecordHeader{{Key: "kdedup-reason", Value: []byte("duplicate")}, {Key: "h", Value: nil}}},
		"noise":                 {Key: []byte("k"), Value: noise},
	}
	codecs := map[string]kgo.CompressionCodec{
		"snappy": kgo.SnappyCompression(), "zstd": kgo.ZstdCompression(), "lz4": kgo.Lz4Compression(), "gzip": kgo.GzipCompression(),
	}
	adm := kadm.NewClient(mustClient(t, kgo.SeedBrokers(c.ListenAddrs()...)))
	ctx := context.Background()
	for cname, codec := range codecs {
		cl := mustClient(t, kgo.SeedBrokers(c.ListenAddrs()...), kgo.ProducerBatchCompression(codec), kgo.ProducerLinger(0),
			kgo.ProducerBatchMaxBytes(8<<20), kgo.RecordRetries(0))
		comp, _ := cl.OptValue(kgo.WithCompressor).(kgo.Compressor)
		if comp == nil {
			t.Fatalf("%s: the client has no compressor", cname)
		}
		for rname, r := range records {
			t.Run(cname+"/"+rname, func(t *testing.T) {
				size, used := compressedBatchBytes(r, comp)
				if rname == "noise" {
					if size != recordBatchBytes(r) || used != kgo.CodecNone {
						t.Errorf("incompressible record: %d bytes with codec %v, want %d uncompressed", size, used, recordBatchBytes(r))
					}
				} else if size >= DefaultMaxRecordBytes || used == kgo.CodecNone {
					t.Fatalf("compressible record: %d bytes with codec %v, want below %d compressed", size, used, DefaultMaxRecordBytes)
				}
				for _, limit := range []int{size, size - 1} {
					topic := fmt.Sprintf("t-%s-%d-%d", cname, len(r.Value), limit)
					v := strconv.Itoa(limit)
					if _, err := adm.CreateTopic(ctx, 1, 1, map[string]*string{"max.message.bytes": &v}, topic); err != nil {
						t.Fatal(err)
					}
					rec := &kgo.Record{Topic: topic, Key: r.Key, Value: r.Value, Headers: r.Headers}
					err := cl.ProduceSync(ctx, rec).FirstErr()
					switch {
					case limit == size && err != nil:
						t.Errorf("max.message.bytes %d (the computed size): %v, want accepted", limit, err)
					case limit < size && !errors.Is(err, kerr.MessageTooLarge):
						t.Errorf("max.message.bytes %d (one below the computed size): %v, want MESSAGE_TOO_LARGE", limit, err)
					}
				}
			})
		}
	}
}

func mustClient(t *testing.T, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}
