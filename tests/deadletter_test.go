package tests

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kdedup/kdedup/config"
	"github.com/kdedup/kdedup/internal/app"
	"github.com/kdedup/kdedup/internal/harness"
	"github.com/kdedup/kdedup/internal/scenario"
)

// kafkaMaxMessageBytes is Kafka's default max.message.bytes, which kfake
// applies to topics that do not set their own.
const kafkaMaxMessageBytes = 1_048_588

// setTopicConfig sets a topic config such as max.message.bytes.
func (b *broker) setTopicConfig(t *testing.T, topic, key, value string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := b.admin(t).AlterTopicConfigs(ctx, []kadm.AlterConfig{{Op: kadm.SetConfig, Name: key, Value: &value}}, topic)
	if err == nil {
		for _, r := range resp {
			err = errors.Join(err, r.Err)
		}
	}
	if err != nil {
		t.Fatalf("setting %s=%s on %s: %v", key, value, topic, err)
	}
	// A real broker applies the change a moment after answering: wait
	// until it describes the new value, then a little more for the log.
	for {
		rcs, err := b.admin(t).DescribeTopicConfigs(ctx, topic)
		if err == nil {
			if rc, err := rcs.On(topic, nil); err == nil {
				for _, c := range rc.Configs {
					if c.Key == key && c.Value != nil && *c.Value == value {
						time.Sleep(200 * time.Millisecond)
						return
					}
				}
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s=%s on %s not applied within 30s", key, value, topic)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// withDeadLetterTopic creates a dead-letter topic (max.message.bytes
// maxBytes, 0 for the default) and has the workers use it.
func (p *pipeline) withDeadLetterTopic(t *testing.T, maxBytes int) string {
	t.Helper()
	dead := p.b.name("dead")
	p.b.createTopics(t, 2, dead)
	if maxBytes > 0 {
		p.b.setTopicConfig(t, dead, "max.message.bytes", strconv.Itoa(maxBytes))
	}
	if p.extraEnv == nil {
		p.extraEnv = map[string]string{}
	}
	p.extraEnv["KDEDUP_DEAD_LETTER_TOPIC"] = dead
	return dead
}

// readTopic reads everything topic holds (the dead-letter topic, once the
// group has committed the whole input).
func (p *pipeline) readTopic(t *testing.T, topic string) []*kgo.Record {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	recs, err := scenario.ReadAll(ctx, p.b.addrs, topic, p.b.conn...)
	if err != nil {
		t.Fatal(err)
	}
	return recs
}

// produceBig produces recs to the input with bigClient.
func (p *pipeline) produceBig(t *testing.T, recs []*kgo.Record) {
	t.Helper()
	if err := scenario.Produce(context.Background(), p.b.bigClient(t), p.in, recs); err != nil {
		t.Fatal(err)
	}
}

// bigClient produces records up to 8 MiB, uncompressed unless opts say
// otherwise.
func (b *broker) bigClient(t *testing.T, opts ...kgo.Opt) *kgo.Client {
	return b.client(t, append([]kgo.Opt{kgo.ProducerBatchMaxBytes(8 << 20), kgo.BrokerMaxWriteBytes(64 << 20), kgo.ProducerBatchCompression(kgo.NoCompression())}, opts...)...)
}

// singleBatchBytes is the size of a record batch holding r alone, as a
// broker compares it with max.message.bytes (Kafka's record batch v2
// format: a 61-byte header, then the record's varint length and body).
func singleBatchBytes(r *kgo.Record) int {
	vl := func(n int) int { return len(appendVarint(nil, int64(n))) }
	l := 3 + vl(len(r.Key)) + len(r.Key) + vl(len(r.Value)) + len(r.Value) + vl(len(r.Headers))
	for _, h := range r.Headers {
		l += vl(len(h.Key)) + len(h.Key) + vl(len(h.Value)) + len(h.Value)
	}
	return 61 + vl(l) + l
}

func appendVarint(b []byte, v int64) []byte {
	u := uint64(v<<1) ^ uint64(v>>63)
	for u >= 0x80 {
		b = append(b, byte(u)|0x80)
		u >>= 7
	}
	return append(b, byte(u))
}

// sized is a record with key k and an incompressible value (seeded by k)
// that makes its batch of its own exactly n bytes, compressed or not: the
// worker's producer compresses, and a record over the limit that fits
// compressed is forwarded (TestCompressibleRecordForwarded).
func sized(k string, n int, ts time.Time) *kgo.Record {
	r := &kgo.Record{Key: []byte(k), Timestamp: ts}
	r.Value = noise(k, n-61-10-len(k))
	for singleBatchBytes(r) > n {
		r.Value = r.Value[1:]
	}
	for singleBatchBytes(r) < n {
		r.Value = append(r.Value, 'v')
	}
	return r
}

// noise is n pseudo-random bytes seeded by seed: no codec shrinks them.
func noise(seed string, n int) []byte {
	var s uint64
	for _, c := range []byte(seed) {
		s = s*131 + uint64(c)
	}
	rnd := rand.New(rand.NewPCG(s, 5))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(rnd.Uint32())
	}
	return b
}

// metricWith sums the samples of a counter whose label has value.
func (w *worker) metricWith(t *testing.T, name, label, value string) float64 {
	t.Helper()
	mfs, err := w.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	total := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					total += m.GetCounter().GetValue()
				}
			}
		}
	}
	return total
}

func header(r *kgo.Record, key string) (string, bool) {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value), true
		}
	}
	return "", false
}

func source(r *kgo.Record) string { return fmt.Sprintf("%s/%d/%d", r.Topic, r.Partition, r.Offset) }

// requireDeadLetter checks that dl is the dead letter of input record in:
// its key, value and timestamp, then the reason, source and target headers.
func requireDeadLetter(t *testing.T, dl, in *kgo.Record, reason, target string) {
	t.Helper()
	if !bytes.Equal(dl.Key, in.Key) || !bytes.Equal(dl.Value, in.Value) || !dl.Timestamp.Equal(in.Timestamp) {
		t.Errorf("dead letter %q (%d value bytes, %v): not the input record %q (%d value bytes, %v)", dl.Key, len(dl.Value), dl.Timestamp, in.Key, len(in.Value), in.Timestamp)
	}
	for k, want := range map[string]string{"kdedup-dead-letter-reason": reason, "kdedup-source": source(in), "kdedup-target": target} {
		if got, _ := header(dl, k); got != want {
			t.Errorf("dead letter %q: header %s = %q, want %q", dl.Key, k, got, want)
		}
	}
}

// TestDeadLetterTopic (both modes): a 1,010,000-byte record is forwarded
// (franz-go's default batch limit, 1,000,012 bytes, refused it), and so is
// one whose batch is exactly the output topic's max.message.bytes; a record
// larger than that goes to KDEDUP_DEAD_LETTER_TOPIC instead, and so does
// the duplicate of the exact-fit record, which the two headers of the
// duplicates topic push over its limit; a later small record with the
// dead-lettered key is a duplicate (the key stays remembered). Output and
// duplicates topic are exactly the model's without those two; the dead-letter topic holds
// exactly them, with reason, source and target; exactly once, no
// transaction aborts.
func TestDeadLetterTopic(t *testing.T) {
	deliveries(t, func(t *testing.T, delivery string) {
		p := newPipeline(t, 3)
		p.delivery = delivery
		p.withDuplicatesTopic(t, 2)
		p.b.setTopicConfig(t, p.in, "max.message.bytes", strconv.Itoa(4<<20))
		dead := p.withDeadLetterTopic(t, 4<<20)

		recs := scenario.Generate(scenario.Options{Keys: 500, Seed: 11})
		ts := scenario.Base.Add(time.Hour)
		fits := &kgo.Record{Key: []byte("fits-1010000"), Value: bytes.Repeat([]byte{'f'}, 1_010_000), Timestamp: ts}
		tooLarge := sized("too-large", kafkaMaxMessageBytes+1, ts)
		exact := sized("exact-fit", kafkaMaxMessageBytes, ts)
		again := &kgo.Record{Key: exact.Key, Value: exact.Value, Timestamp: ts}
		// A dead-lettered record's key stays remembered: a later record
		// with it is a duplicate (the model takes the dead letter for
		// forwarded, then leaves it out of the output).
		later := &kgo.Record{Key: tooLarge.Key, Value: []byte("small"), Timestamp: ts}
		recs = slices.Insert(recs, 450, later)
		recs = slices.Insert(recs, 400, again)
		recs = slices.Insert(recs, 300, exact)
		recs = slices.Insert(recs, 200, tooLarge)
		recs = slices.Insert(recs, 100, fits)
		p.produceBig(t, recs)

		w := p.startWorker(t, t.TempDir())
		want, got := p.output(t, recs)
		wantDropped, gotDropped, read := p.dropped(t, recs)
		deadRead := p.readTopic(t, dead)
		w.running(t)
		aborted := w.metricWith(t, "kdedup_transactions_total", "outcome", "aborted")
		counted := w.metricWith(t, "kdedup_dead_letter_records_total", "reason", "too-large")
		w.stop(t)

		if len(got.PerKey["fits-1010000"]) != 1 || len(got.PerKey["exact-fit"]) != 1 {
			t.Errorf("the 1,010,000-byte record and the exact fit: forwarded %d and %d times, want once each", len(got.PerKey["fits-1010000"]), len(got.PerKey["exact-fit"]))
		}
		delete(want.PerKey, "too-large")
		requireExact(t, want, got)
		delete(wantDropped.PerKey, "exact-fit")
		if len(wantDropped.PerKey["too-large"]) != 1 || len(gotDropped.PerKey["too-large"]) != 1 {
			t.Errorf("the later record with the dead-lettered key: dropped %d times, the model %d, want once",
				len(gotDropped.PerKey["too-large"]), len(wantDropped.PerKey["too-large"]))
		}
		requireDropped(t, recs, wantDropped, gotDropped, read, "duplicate")

		if len(deadRead) != 2 {
			t.Fatalf("dead-letter topic holds %d records, want 2 (too-large, then the duplicate of exact-fit)", len(deadRead))
		}
		byKey := map[string]*kgo.Record{}
		for _, r := range deadRead {
			byKey[string(r.Key)] = r
		}
		requireDeadLetter(t, byKey["too-large"], tooLarge, "too-large", p.out)
		requireDeadLetter(t, byKey["exact-fit"], again, "too-large", p.dups)
		if counted != 2 {
			t.Errorf("kdedup_dead_letter_records_total{reason=too-large} = %v, want 2", counted)
		}
		if aborted != 0 {
			t.Errorf("%v transactions aborted: the size check must route records before producing", aborted)
		}
	})
}

// TestDeadLetterTruncated: a record too large for the output and for the
// dead-letter topic reaches the latter without its value, saying so in
// kdedup-truncated, and the rest of the stream is exactly the model's.
func TestDeadLetterTruncated(t *testing.T) {
	p := newPipeline(t, 2)
	p.b.setTopicConfig(t, p.in, "max.message.bytes", strconv.Itoa(4<<20))
	dead := p.withDeadLetterTopic(t, 0)
	recs := scenario.Generate(scenario.Options{Keys: 200, Seed: 12})
	huge := sized("huge", 2<<20, scenario.Base.Add(time.Hour))
	recs = slices.Insert(recs, 50, huge)
	p.produceBig(t, recs)
	w := p.startWorker(t, t.TempDir())
	want, got := p.output(t, recs)
	deadRead := p.readTopic(t, dead)
	w.stop(t)
	delete(want.PerKey, "huge")
	requireExact(t, want, got)
	if len(deadRead) != 1 {
		t.Fatalf("dead-letter topic holds %d records, want 1", len(deadRead))
	}
	dl := deadRead[0]
	if tr, _ := header(dl, "kdedup-truncated"); tr != "value" || dl.Value != nil || string(dl.Key) != "huge" {
		t.Errorf("dead letter: key %q, %d value bytes, kdedup-truncated %q; want key huge, no value, truncated value", dl.Key, len(dl.Value), tr)
	}
	if s, _ := header(dl, "kdedup-source"); s != source(huge) {
		t.Errorf("kdedup-source %q, want %q", s, source(huge))
	}
}

// TestCompressibleRecordForwarded (both modes): every topic at Kafka's
// default max.message.bytes, a 1,500,000-byte record that the worker's
// producer (snappy, franz-go's default) compresses below it is a legal
// record: it is forwarded, byte for byte with its headers, and so is its
// repeat to the duplicates topic (two headers more); an incompressible
// record over the limit still goes to the dead-letter topic. Output and
// duplicates topic are exactly the model's without the incompressible
// record, the dead-letter topic holds exactly it, exactly once no
// transaction aborts. Without a dead-letter topic the compressible record
// does not stop the worker and the output is exactly the model's.
func TestCompressibleRecordForwarded(t *testing.T) {
	ts := scenario.Base.Add(time.Hour)
	compressible := func() *kgo.Record {
		v := bytes.Repeat([]byte(`{"order":12345,"state":"shipped","items":["a","b"]} `), 30_000)[:1_500_000]
		return &kgo.Record{Key: []byte("compressible"), Value: v, Headers: []kgo.RecordHeader{{Key: "trace", Value: []byte("t-1")}}, Timestamp: ts}
	}
	requireIntact := func(t *testing.T, read []*kgo.Record, in *kgo.Record, topic string) {
		t.Helper()
		var found []*kgo.Record
		for _, r := range read {
			if string(r.Key) == string(in.Key) {
				found = append(found, r)
			}
		}
		if len(found) != 1 {
			t.Fatalf("%s holds %d records of key %q, want 1", topic, len(found), in.Key)
		}
		r := found[0]
		if !bytes.Equal(r.Value, in.Value) || len(r.Headers) < 1 || r.Headers[0].Key != "trace" || string(r.Headers[0].Value) != "t-1" || !r.Timestamp.Equal(in.Timestamp) {
			t.Errorf("%s: record %q has %d value bytes (equal %v), headers %v, timestamp %v; want the input's %d bytes, its header first, %v",
				topic, r.Key, len(r.Value), bytes.Equal(r.Value, in.Value), r.Headers, r.Timestamp, len(in.Value), in.Timestamp)
		}
	}
	deliveries(t, func(t *testing.T, delivery string) {
		p := newPipeline(t, 2)
		p.delivery = delivery
		p.withDuplicatesTopic(t, 2)
		p.b.setTopicConfig(t, p.in, "max.message.bytes", strconv.Itoa(4<<20))
		dead := p.withDeadLetterTopic(t, 4<<20)

		recs := scenario.Generate(scenario.Options{Keys: 300, Seed: 18})
		big := compressible()
		if n := singleBatchBytes(big); n <= kafkaMaxMessageBytes {
			t.Fatalf("the compressible record's batch is %d bytes, want above %d before compression", n, kafkaMaxMessageBytes)
		}
		again := compressible()
		tooLarge := sized("incompressible", kafkaMaxMessageBytes+1, ts)
		recs = slices.Insert(recs, 250, again)
		recs = slices.Insert(recs, 150, tooLarge)
		recs = slices.Insert(recs, 100, big)
		p.produceBig(t, recs)

		w := p.startWorker(t, t.TempDir())
		want, got := p.output(t, recs)
		wantDropped, gotDropped, read := p.dropped(t, recs)
		outRead := p.readTopic(t, p.out)
		deadRead := p.readTopic(t, dead)
		w.running(t)
		aborted := w.metricWith(t, "kdedup_transactions_total", "outcome", "aborted")
		counted := w.metricWith(t, "kdedup_dead_letter_records_total", "reason", "too-large")
		w.stop(t)

		delete(want.PerKey, "incompressible")
		requireExact(t, want, got)
		requireIntact(t, outRead, big, "output")
		requireDropped(t, recs, wantDropped, gotDropped, read, "duplicate")
		requireIntact(t, read, again, "duplicates topic")
		if len(deadRead) != 1 {
			t.Fatalf("dead-letter topic holds %d records, want 1 (the incompressible record)", len(deadRead))
		}
		requireDeadLetter(t, deadRead[0], tooLarge, "too-large", p.out)
		if counted != 1 {
			t.Errorf("kdedup_dead_letter_records_total{reason=too-large} = %v, want 1", counted)
		}
		if aborted != 0 {
			t.Errorf("%v transactions aborted, want none", aborted)
		}
	})
	t.Run("no dead-letter topic", func(t *testing.T) {
		deliveries(t, func(t *testing.T, delivery string) {
			p := newPipeline(t, 2)
			p.delivery = delivery
			p.b.setTopicConfig(t, p.in, "max.message.bytes", strconv.Itoa(4<<20))
			recs := scenario.Generate(scenario.Options{Keys: 200, Seed: 19})
			big := compressible()
			recs = slices.Insert(recs, 100, big)
			p.produceBig(t, recs)
			w := p.startWorker(t, t.TempDir())
			want, got := p.output(t, recs)
			outRead := p.readTopic(t, p.out)
			w.running(t)
			w.stop(t)
			requireExact(t, want, got)
			requireIntact(t, outRead, big, "output")
		})
	})
}

// waitExit waits for the worker process to exit and returns its exit code.
func (p *process) waitExit(t *testing.T, within time.Duration) int {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- p.cmd.Wait() }()
	select {
	case err := <-done:
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return ee.ExitCode()
		}
		if err != nil {
			t.Fatal(err)
		}
		return 0
	case <-time.After(within):
		_ = p.cmd.Process.Kill()
		<-done
		t.Fatalf("worker still running after %v:\n%s", within, p.logText(t))
		return -1
	}
}

// TestNoDeadLetterTopic (both modes): without KDEDUP_DEAD_LETTER_TOPIC a
// record larger than the output topic allows stops the worker with exit
// code 1 and one error naming that record's topic, partition and offset
// (not a neighbour in its batch); exactly once it aborts at most once,
// never in a loop, and commits nothing of the record.
func TestNoDeadLetterTopic(t *testing.T) {
	deliveries(t, func(t *testing.T, delivery string) {
		p := newPipeline(t, 2)
		p.delivery = delivery
		p.b.setTopicConfig(t, p.in, "max.message.bytes", strconv.Itoa(4<<20))
		recs := scenario.Generate(scenario.Options{Keys: 300, Seed: 13})
		tooLarge := sized("too-large", kafkaMaxMessageBytes+1, scenario.Base.Add(time.Hour))
		recs = slices.Insert(recs, 150, tooLarge)
		p.produceBig(t, recs)
		proc := p.startProcess(t, t.TempDir())
		if code := proc.waitExit(t, 60*time.Second); code != 1 {
			t.Fatalf("exit code %d, want 1:\n%s", code, proc.logText(t))
		}
		log := proc.logText(t)
		name := fmt.Sprintf("record %s/%d offset %d cannot be forwarded to %s: too-large", p.in, tooLarge.Partition, tooLarge.Offset, p.out)
		if !strings.Contains(log, name) {
			t.Fatalf("the log does not name the record (%q):\n%s", name, log)
		}
		if n := strings.Count(log, "aborting it"); n > 1 {
			t.Errorf("%d aborted transactions, want at most 1", n)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		committed, err := p.b.admin(t).FetchOffsets(ctx, p.group)
		if err != nil {
			t.Fatal(err)
		}
		if o, ok := committed.Lookup(p.in, tooLarge.Partition); ok && o.At > tooLarge.Offset {
			t.Errorf("group offset %d of partition %d passes the record at %d that was not forwarded", o.At, tooLarge.Partition, tooLarge.Offset)
		}
	})
}

// TestRefusedByBroker (both modes): the output topic's max.message.bytes
// is lowered while the worker runs, so the size check (made with the value
// read at start-up) passes and the broker refuses the batch holding a
// large record and its small neighbours. The worker tells the culprit from
// its neighbours by producing them alone, sends it to the dead-letter
// topic, forwards the neighbours, and goes on; exactly once with at most
// three aborted transactions (one to learn the refused batch, two with the
// culprit alone, which tells it from a transient fault), never in a loop.
func TestRefusedByBroker(t *testing.T) {
	deliveries(t, func(t *testing.T, delivery string) {
		p := newPipeline(t, 1)
		p.delivery = delivery
		dead := p.withDeadLetterTopic(t, 0)
		first := scenario.Generate(scenario.Options{Keys: 100, Seed: 14})
		cl := p.b.client(t)
		if err := scenario.Produce(context.Background(), cl, p.in, first); err != nil {
			t.Fatal(err)
		}
		w := p.startWorker(t, t.TempDir())
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := scenario.WaitCaughtUp(ctx, p.b.admin(t), p.group, p.in); err != nil {
			t.Fatal(err)
		}
		p.b.setTopicConfig(t, p.out, "max.message.bytes", "4000")
		ts := scenario.Base.Add(time.Hour)
		var second []*kgo.Record
		for i := range 6 {
			second = append(second, &kgo.Record{Key: fmt.Appendf(nil, "small-%d", i), Value: []byte("v"), Timestamp: ts})
		}
		large := sized("large", 6000, ts) // incompressible: the worker's producer compresses
		second = slices.Insert(second, 3, large)
		// One produce request, so that the worker polls them together.
		if err := scenario.Produce(context.Background(), cl, p.in, second); err != nil {
			t.Fatal(err)
		}
		recs := append(slices.Clone(first), second...)
		want, got := p.output(t, recs)
		deadRead, err := scenario.ReadAll(ctx, p.b.addrs, dead)
		if err != nil {
			t.Fatal(err)
		}
		w.running(t)
		aborted := w.metricWith(t, "kdedup_transactions_total", "outcome", "aborted")
		w.stop(t)
		delete(want.PerKey, "large")
		if delivery == "exactly-once" {
			requireExact(t, want, got)
		} else if extra := requireNothingMissing(t, want, got); extra > 0 {
			t.Logf("%d records forwarded again (at least once, a retry after the refusal)", extra)
		}
		if len(deadRead) != 1 {
			t.Fatalf("dead-letter topic holds %d records, want 1", len(deadRead))
		}
		requireDeadLetter(t, deadRead[0], large, "too-large", p.out)
		if aborted > 3 {
			t.Errorf("%v transactions aborted, want at most 3", aborted)
		}
	})
}

// TestTopicMissingAtStartup: a missing output, duplicates or dead-letter
// topic stops start-up at once with an error naming the variable and the
// topic, as a runtime failure (exit code 1), not a configuration error.
func TestTopicMissingAtStartup(t *testing.T) {
	for _, variable := range []string{"KDEDUP_OUTPUT_TOPIC", "KDEDUP_DUPLICATES_TOPIC", "KDEDUP_DEAD_LETTER_TOPIC"} {
		t.Run(variable, func(t *testing.T) {
			p := newPipeline(t, 1)
			p.dups = p.b.name("dups")
			p.b.createTopics(t, 1, p.dups)
			p.withDeadLetterTopic(t, 0)
			env := p.env(t.TempDir())
			env[variable] = p.b.name("missing")
			cfg, err := config.LoadFrom(env)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			err = app.Run(ctx, cfg, slog.New(slog.DiscardHandler), prometheus.NewRegistry(), nil)
			want := variable + "=" + p.b.name("missing") + ": the topic does not exist"
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Fatalf("Run = %v, want an error containing %q", err, want)
			}
			if errors.Is(err, app.ErrConfig) {
				t.Errorf("a missing topic is reported as a configuration error (exit 2): %v", err)
			}
		})
	}
}

// TestOutputTopicDeleted (both modes): the output topic deleted while the
// worker runs stops it with one error naming KDEDUP_OUTPUT_TOPIC, never an
// abort loop, and it is not ready meanwhile.
func TestOutputTopicDeleted(t *testing.T) {
	deliveries(t, func(t *testing.T, delivery string) {
		p := newPipeline(t, 2)
		p.delivery = delivery
		recs := scenario.Generate(scenario.Options{Keys: 200, Seed: 15})
		cl := p.b.client(t)
		if err := scenario.Produce(context.Background(), cl, p.in, recs[:100]); err != nil {
			t.Fatal(err)
		}
		w := p.startWorker(t, t.TempDir())
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := scenario.WaitCaughtUp(ctx, p.b.admin(t), p.group, p.in); err != nil {
			t.Fatal(err)
		}
		if _, err := p.b.admin(t).DeleteTopics(ctx, p.out); err != nil {
			t.Fatal(err)
		}
		if err := scenario.Produce(context.Background(), cl, p.in, recs[100:]); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-w.done:
			w.done <- nil
			want := "KDEDUP_OUTPUT_TOPIC=" + p.out
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Fatalf("worker stopped with %v, want an error naming %s", err, want)
			}
		case <-time.After(60 * time.Second):
			t.Fatalf("worker still running 60s after its output topic was deleted (ready %v, aborted transactions %v)",
				w.metric(t, "kdedup_worker_ready"), w.metricWith(t, "kdedup_transactions_total", "outcome", "aborted"))
		}
		if aborted := w.metricWith(t, "kdedup_transactions_total", "outcome", "aborted"); aborted > 1 {
			t.Errorf("%v transactions aborted, want at most 1", aborted)
		}
		if r := w.metric(t, "kdedup_worker_ready"); r != 0 {
			t.Errorf("kdedup_worker_ready = %v after the fatal error, want 0", r)
		}
	})
}

// TestCompressionBomb (both modes): a zstd batch of 6 MiB of zeros (a few
// hundred bytes on the wire) with KDEDUP_MAX_DECOMPRESS_BYTES=1MiB is not
// decompressed: one dead letter without value names its offsets, its
// records are skipped, and the rest of the stream is exactly the model's.
// Without a dead-letter topic the worker stops naming the batch's offset.
// Memory (both modes): a batch of 64 MiB of zeros in each partition, read
// by worker processes that are running already (so that start-up is not
// counted), makes each allocate (go_memstats_alloc_bytes_total) less than
// half the bomb, 32 times the limit: the one deciding past both bombs
// until the group has committed past them (1.1 MiB seen), and a second
// one, without state, replaying past a bomb with its restore client once
// the first stops (6 to 10 MiB seen, most of it the restore client). Raising
// the limit of the worker's client or of the restore client makes that
// 200 or 71 MiB: nothing decompressed the bomb, nothing grew.
func TestCompressionBomb(t *testing.T) {
	// bomb produces records 0-99 of a stream, then n records of 2 MiB of
	// zeros in one zstd batch to partition 0, then records 100-199, and
	// returns the first offset of the batch and the stream.
	bomb := func(t *testing.T, p *pipeline, n int) (first int64, recs []*kgo.Record) {
		recs = scenario.Generate(scenario.Options{Keys: 200, Seed: 16})
		cl := p.b.client(t)
		if err := scenario.Produce(context.Background(), cl, p.in, recs[:100]); err != nil {
			t.Fatal(err)
		}
		return bombAfter(t, p, n, recs)
	}
	deliveries(t, func(t *testing.T, delivery string) {
		p := newPipeline(t, 2)
		p.delivery = delivery
		dead := p.withDeadLetterTopic(t, 0)
		p.extraEnv["KDEDUP_MAX_DECOMPRESS_BYTES"] = "1MiB"
		first, recs := bomb(t, p, 3)
		dir := t.TempDir()
		w := p.startWorker(t, dir)
		want, got := p.output(t, recs)
		deadRead := p.readTopic(t, dead)
		w.running(t)
		w.stop(t)
		requireExact(t, want, got)
		if len(deadRead) != 1 {
			t.Fatalf("dead-letter topic holds %d records, want 1", len(deadRead))
		}

		// A rebuild replays through the batch: its restore client steps
		// over it (the batch changed nothing in the filter) instead of
		// stalling, and forwards and dead-letters nothing again.
		if err := os.RemoveAll(dir); err != nil {
			t.Fatal(err)
		}
		w = p.startWorker(t, dir)
		deadline := time.Now().Add(60 * time.Second)
		for w.metric(t, "kdedup_replayed_records_total") < float64(len(recs)) || w.metric(t, "kdedup_partitions_restoring") > 0 {
			if time.Now().After(deadline) {
				t.Fatalf("rebuild replayed %.0f of %d records within 60s", w.metric(t, "kdedup_replayed_records_total"), len(recs))
			}
			w.running(t)
			time.Sleep(20 * time.Millisecond)
		}
		w.stop(t)
		want, got = p.output(t, recs)
		requireExact(t, want, got)
		if n := len(p.readTopic(t, dead)); n != 1 {
			t.Fatalf("after the rebuild the dead-letter topic holds %d records, want 1", n)
		}
		dl := deadRead[0]
		wantHeaders := map[string]string{
			"kdedup-dead-letter-reason": "decompress-too-large",
			"kdedup-source":             fmt.Sprintf("%s/0/%d", p.in, first),
			"kdedup-source-end":         strconv.FormatInt(first+3, 10),
		}
		for k, v := range wantHeaders {
			if got, _ := header(dl, k); got != v {
				t.Errorf("dead letter header %s = %q, want %q", k, got, v)
			}
		}
		if dl.Value != nil {
			t.Errorf("dead letter of a skipped batch carries %d value bytes, want none", len(dl.Value))
		}
	})
	t.Run("no dead-letter topic", func(t *testing.T) {
		p := newPipeline(t, 2)
		p.extraEnv = map[string]string{"KDEDUP_MAX_DECOMPRESS_BYTES": "1MiB"}
		first, _ := bomb(t, p, 3)
		w := p.startWorker(t, t.TempDir())
		select {
		case err := <-w.done:
			w.done <- nil
			want := fmt.Sprintf("record batch %s/0 at offset %d cannot be forwarded: decompress-too-large", p.in, first)
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Fatalf("worker stopped with %v, want an error containing %q", err, want)
			}
		case <-time.After(60 * time.Second):
			t.Fatal("worker still running 60s after a batch over KDEDUP_MAX_DECOMPRESS_BYTES")
		}
	})
	t.Run("memory", func(t *testing.T) {
		deliveries(t, func(t *testing.T, delivery string) {
			const limit = 1 << 20    // KDEDUP_MAX_DECOMPRESS_BYTES
			const n = 32             // records of 2 MiB: a 64 MiB bomb
			const bound = 32 * limit // half the bomb
			p := newPipeline(t, 2)
			p.delivery = delivery
			dead := p.withDeadLetterTopic(t, 0)
			p.extraEnv["KDEDUP_MAX_DECOMPRESS_BYTES"] = "1MiB"
			recs := scenario.Generate(scenario.Options{Keys: 200, Seed: 16})
			cl := p.b.client(t)
			if err := scenario.Produce(context.Background(), cl, p.in, recs[:100]); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			adm := p.b.admin(t)
			requireSmall := func(what string, grown float64) {
				t.Helper()
				t.Logf("%s: the worker allocated %.1f MiB", what, grown/(1<<20))
				if grown >= bound {
					t.Errorf("%s: the worker allocated %.1f MiB, want less than %d MiB: a bomb of %d MiB of zeros was decompressed",
						what, grown/(1<<20), bound>>20, 2*n)
				}
			}

			// The decision path: a worker that is running reads a bomb in
			// each partition. The producer's 64 MiB are allocated in the
			// test's process; the worker's allocations are its own.
			a := p.startProcess(t, t.TempDir(), "KDEDUP_LOG_LEVEL=info")
			if err := scenario.WaitCaughtUp(ctx, adm, p.group, p.in); err != nil {
				t.Fatal(err)
			}
			before := a.metricValue(t, "go_memstats_alloc_bytes_total")
			first := []int64{bombTo(t, p, 0, n), bombTo(t, p, 1, n)}
			if err := scenario.Produce(context.Background(), cl, p.in, recs[100:]); err != nil {
				t.Fatal(err)
			}
			if err := scenario.WaitCaughtUp(ctx, adm, p.group, p.in); err != nil {
				t.Fatal(err)
			}
			requireSmall("deciding past two bombs", a.metricValue(t, "go_memstats_alloc_bytes_total")-before)

			// The replay path: a second worker without state takes the
			// first's partitions, one when it joins, the other once the
			// first stops, when it is running already; its restore client
			// replays through that partition's bomb.
			b := p.startProcess(t, t.TempDir(), "KDEDUP_LOG_LEVEL=info")
			p.waitMembers(t, 2)
			b.waitReady(t)
			replayedJoining := b.metricValue(t, "kdedup_replayed_records_total")
			before = b.metricValue(t, "go_memstats_alloc_bytes_total")
			if err := a.cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			if code := a.waitExit(t, 30*time.Second); code != 0 {
				t.Fatalf("the first worker exited with %d, want 0", code)
			}
			deadline := time.Now().Add(60 * time.Second)
			for b.metricValue(t, "kdedup_replayed_records_total") < float64(len(recs)) || b.metricValue(t, "kdedup_partitions_restoring") > 0 {
				if time.Now().After(deadline) {
					t.Fatalf("the second worker replayed %v of %d records within 60s (%v when it had joined)",
						b.metricValue(t, "kdedup_replayed_records_total"), len(recs), replayedJoining)
				}
				time.Sleep(20 * time.Millisecond)
			}
			requireSmall("replaying past a bomb", b.metricValue(t, "go_memstats_alloc_bytes_total")-before)

			want, got := p.output(t, recs)
			requireExact(t, want, got)
			deadRead := p.readTopic(t, dead)
			if len(deadRead) != 2 {
				t.Fatalf("dead-letter topic holds %d records, want 2 (one per bomb)", len(deadRead))
			}
			wantBatches := map[string]string{} // kdedup-source to kdedup-source-end
			for part, f := range first {
				wantBatches[fmt.Sprintf("%s/%d/%d", p.in, part, f)] = strconv.FormatInt(f+n, 10)
			}
			gotBatches := map[string]string{}
			for _, dl := range deadRead {
				src, _ := header(dl, "kdedup-source")
				gotBatches[src], _ = header(dl, "kdedup-source-end")
			}
			if !maps.Equal(gotBatches, wantBatches) {
				t.Errorf("dead letters name the batches %v (source: end), want %v", gotBatches, wantBatches)
			}
		})
	})
}

// bombAfter produces n records of 2 MiB of zeros in one zstd batch (a few
// KiB on the wire) to partition 0 of the input, then records 100-199 of
// recs, and returns the first offset of the batch and recs.
func bombAfter(t *testing.T, p *pipeline, n int, recs []*kgo.Record) (first int64, _ []*kgo.Record) {
	t.Helper()
	first = bombTo(t, p, 0, n)
	if err := scenario.Produce(context.Background(), p.b.client(t), p.in, recs[100:]); err != nil {
		t.Fatal(err)
	}
	return first, recs
}

// bombTo produces n records of 2 MiB of zeros in one zstd batch (a few KiB
// on the wire) to the input's partition, and returns the batch's first
// offset.
func bombTo(t *testing.T, p *pipeline, partition int32, n int) int64 {
	t.Helper()
	zcl := p.b.client(t, kgo.ProducerBatchMaxBytes(int32(n+1)<<21), kgo.BrokerMaxWriteBytes(int32(n+2)<<21),
		kgo.ProducerBatchCompression(kgo.ZstdCompression()), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	defer zcl.Close()
	var bombs []*kgo.Record
	for i := range n {
		bombs = append(bombs, &kgo.Record{Topic: p.in, Partition: partition, Key: fmt.Appendf(nil, "bomb-%d-%d", partition, i), Value: make([]byte, 2<<20)})
	}
	if err := zcl.ProduceSync(context.Background(), bombs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	return bombs[0].Offset
}

// metricValue sums the worker process's samples of the metric named name
// over their labels.
func (p *process) metricValue(t *testing.T, name string) float64 {
	t.Helper()
	metrics, err := harness.Scrape(context.Background(), p.httpAddr(t))
	if err != nil {
		t.Fatal(err)
	}
	v, ok := metrics[name]
	if !ok {
		t.Fatalf("the worker exports no %s", name)
	}
	return v
}

// TestTopicNotWritable: with ACLs, a worker whose principal may describe
// the output topic but not write it stops at start-up with an error naming
// KDEDUP_OUTPUT_TOPIC and the missing permission, before joining the group.
func TestTopicNotWritable(t *testing.T) {
	in, out := "acl-in", "acl-out"
	allow := func(res kmsg.ACLResourceType, name string, op kmsg.ACLOperation) kfake.ACL {
		return kfake.ACL{Resource: res, Name: name, Pattern: kmsg.ACLResourcePatternTypeLiteral, Operation: op, Allow: true}
	}
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.EnableSASL(), kfake.EnableACLs(),
		kfake.Superuser("PLAIN", "admin", "admin-pw"),
		kfake.User("PLAIN", "worker", "worker-pw",
			allow(kmsg.ACLResourceTypeTopic, in, kmsg.ACLOperationRead),
			allow(kmsg.ACLResourceTypeTopic, in, kmsg.ACLOperationDescribe),
			allow(kmsg.ACLResourceTypeTopic, out, kmsg.ACLOperationDescribe),
			allow(kmsg.ACLResourceTypeGroup, "acl-group", kmsg.ACLOperationRead)),
		kfake.SeedTopics(1, in, out))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	cfg, err := config.LoadFrom(map[string]string{
		"KDEDUP_BROKERS": strings.Join(c.ListenAddrs(), ","), "KDEDUP_INPUT_TOPICS": in, "KDEDUP_OUTPUT_TOPIC": out, "KDEDUP_GROUP": "acl-group",
		"KDEDUP_DATA_DIR": t.TempDir(), "KDEDUP_HTTP_ADDR": "127.0.0.1:0",
		"KDEDUP_SASL_MECHANISM": "PLAIN", "KDEDUP_SASL_USERNAME": "worker", "KDEDUP_SASL_PASSWORD": "worker-pw",
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err = app.Run(ctx, cfg, slog.New(slog.DiscardHandler), prometheus.NewRegistry(), nil)
	want := "KDEDUP_OUTPUT_TOPIC=" + out + ": not authorized to write to the topic"
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("Run = %v, want an error containing %q", err, want)
	}
	if errors.Is(err, app.ErrConfig) {
		t.Errorf("a topic not writable is reported as a configuration error (exit 2): %v", err)
	}
}

// TestMaxRecordBytesFromBroker: the output topic's own max.message.bytes
// (2 MiB, above Kafka's default) is read from the broker at start-up, so a
// 1.5 MiB record is forwarded, not dead-lettered; KDEDUP_MAX_RECORD_BYTES
// overrides it.
func TestMaxRecordBytesFromBroker(t *testing.T) {
	for name, override := range map[string]string{"topic": "", "override": "1MiB"} {
		t.Run(name, func(t *testing.T) {
			p := newPipeline(t, 1)
			p.b.setTopicConfig(t, p.in, "max.message.bytes", strconv.Itoa(4<<20))
			p.b.setTopicConfig(t, p.out, "max.message.bytes", strconv.Itoa(2<<20))
			dead := p.withDeadLetterTopic(t, 4<<20)
			if override != "" {
				p.extraEnv["KDEDUP_MAX_RECORD_BYTES"] = override
			}
			recs := scenario.Generate(scenario.Options{Keys: 50, Seed: 17})
			big := sized("big", 1536<<10, scenario.Base.Add(time.Hour))
			recs = slices.Insert(recs, 20, big)
			p.produceBig(t, recs)
			w := p.startWorker(t, t.TempDir())
			want, got := p.output(t, recs)
			deadRead := p.readTopic(t, dead)
			w.stop(t)
			if override == "" {
				requireExact(t, want, got)
				if len(deadRead) != 0 {
					t.Errorf("%d dead letters, want none: the topic's max.message.bytes allows the record", len(deadRead))
				}
				return
			}
			delete(want.PerKey, "big")
			requireExact(t, want, got)
			if len(deadRead) != 1 || string(deadRead[0].Key) != "big" {
				t.Fatalf("dead letters %d, want the record above KDEDUP_MAX_RECORD_BYTES", len(deadRead))
			}
		})
	}
}

// abortedTxns is the worker's kdedup_transactions_total{outcome="aborted"},
// gathered without a *testing.T so that a kfake fault can ask for it.
func abortedTxns(reg *prometheus.Registry) float64 {
	mfs, err := reg.Gather()
	if err != nil {
		return 0
	}
	for _, mf := range mfs {
		if mf.GetName() != "kdedup_transactions_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "outcome" && l.GetValue() == "aborted" {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// TestProduceErrorAborts (exactly once; kfake only, for its fault
// injection): the broker answers the worker's produce requests to the
// output with POLICY_VIOLATION, a produce error tied neither to a record
// (too large, invalid: bounded per record) nor to the topic (missing, not
// writable: stops at once). docs/semantics.md promises that such errors
// abort at most three transactions in a row, then stop the worker:
//   - on every produce: the worker stops with an error saying it failed 3
//     times in a row and naming the cause, after exactly 3 aborted
//     transactions and none committed; the output holds nothing and the
//     group has committed nothing;
//   - until 2 transactions have aborted (the fault asks the worker's
//     metrics, so the third transaction's produce is the first answered):
//     the worker keeps running, exactly 2 transactions aborted, and the
//     output is exactly the model's.
func TestProduceErrorAborts(t *testing.T) {
	for _, tc := range []struct {
		name   string
		aborts float64 // transactions aborted while the fault lasts; 0: it never ends
	}{
		{"every produce", 0},
		{"two aborts", 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPipeline(t, 1)
			p.delivery = "exactly-once"
			c := p.b.fake(t)
			recs := scenario.Generate(scenario.Options{Keys: 100, Seed: 18})
			if err := scenario.Produce(context.Background(), p.b.client(t), p.in, recs); err != nil {
				t.Fatal(err)
			}
			var reg atomic.Pointer[prometheus.Registry]
			fault := c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: p.out, Err: kerr.PolicyViolation, Count: -1,
				When: func(kmsg.Request) bool {
					r := reg.Load()
					return tc.aborts == 0 || r == nil || abortedTxns(r) < tc.aborts
				}})
			defer fault.Remove()
			w := p.startWorker(t, t.TempDir())
			reg.Store(w.reg)

			if tc.aborts != 0 {
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				caughtUp := make(chan error, 1)
				go func() { caughtUp <- scenario.WaitCaughtUp(ctx, p.b.admin(t), p.group, p.in) }()
				select {
				case err := <-w.done:
					w.done <- nil
					t.Fatalf("worker stopped with %v after %v aborted transactions, want it running", err, abortedTxns(w.reg))
				case err := <-caughtUp:
					if err != nil {
						t.Fatal(err)
					}
				}
				want, got := p.output(t, recs)
				w.running(t)
				aborted := w.metricWith(t, "kdedup_transactions_total", "outcome", "aborted")
				w.stop(t)
				requireExact(t, want, got)
				if aborted != tc.aborts {
					t.Errorf("%v transactions aborted, want exactly %v (the fault's)", aborted, tc.aborts)
				}
				return
			}
			select {
			case err := <-w.done:
				w.done <- nil
				for _, want := range []string{"failed 3 times in a row", kerr.PolicyViolation.Message} {
					if err == nil || !strings.Contains(err.Error(), want) {
						t.Fatalf("worker stopped with %v, want an error containing %q", err, want)
					}
				}
			case <-time.After(60 * time.Second):
				t.Fatalf("worker still running 60s after its produce requests began to fail (aborted transactions %v)",
					w.metricWith(t, "kdedup_transactions_total", "outcome", "aborted"))
			}
			if aborted := w.metricWith(t, "kdedup_transactions_total", "outcome", "aborted"); aborted != 3 {
				t.Errorf("%v transactions aborted, want exactly 3", aborted)
			}
			if committed := w.metricWith(t, "kdedup_transactions_total", "outcome", "committed"); committed != 0 {
				t.Errorf("%v transactions committed, want none", committed)
			}
			if got := p.groupOffsets(t); len(got) != 0 {
				t.Errorf("group offsets %v, want none committed", got)
			}
			fault.Remove() // ReadAll produces end markers to the output
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			out, err := scenario.ReadAll(ctx, p.b.addrs, p.out, p.b.conn...)
			if err != nil {
				t.Fatal(err)
			}
			if len(out) != 0 {
				t.Errorf("output holds %d records, want none", len(out))
			}
		})
	}
}
