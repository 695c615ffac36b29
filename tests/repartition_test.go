package tests

import (
	"context"
	"encoding/base64"
	"errors"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kdedup/kdedup/config"
	"github.com/kdedup/kdedup/consumer"
	"github.com/kdedup/kdedup/internal/app"
	"github.com/kdedup/kdedup/internal/scenario"
)

// withRepartitionTopic creates a repartition topic of the given partitions
// and has the workers deduplicate through it (KDEDUP_REPARTITION_TOPIC).
func (p *pipeline) withRepartitionTopic(t *testing.T, partitions int32) {
	t.Helper()
	p.repart = p.b.name("repartition")
	p.b.createTopics(t, partitions, p.repart)
}

// waitRepartitioned waits until the group has decided every record of
// the repartition topic (scenario.WaitDecided).
func (p *pipeline) waitRepartitioned(t *testing.T, ctx context.Context) {
	t.Helper()
	if err := scenario.WaitDecided(ctx, p.b.addrs, p.group, p.repart, p.b.conn...); err != nil {
		t.Fatal(err)
	}
}

// requireSpreadDeduplicated checks the output against the exact model of
// a deduplication of in by event id across partitions
// (scenario.SpreadCheck): exactly, or at least once with repeats counted.
func requireSpreadDeduplicated(t *testing.T, in, out []*kgo.Record, exact bool) int {
	t.Helper()
	problems, extra := scenario.SpreadCheck(in, out, exact, 10)
	for _, pr := range problems {
		t.Error(pr)
	}
	if len(problems) > 0 {
		t.FailNow()
	}
	return extra
}

// TestRepartitionByDedupKey: events keyed by a JSON field are sent by four
// producers that partition them apart (two record keys with murmur2,
// unkeyed, CRC32), so most events have copies in two or more partitions.
// Through the repartition topic, in both delivery modes, each event is
// forwarded once, as one of its copies (key, value, headers and timestamp
// unchanged), and each record without an event id is forwarded unchanged.
func TestRepartitionByDedupKey(t *testing.T) {
	deliveries(t, func(t *testing.T, delivery string) {
		p := newPipeline(t, 4)
		p.delivery = delivery
		p.withRepartitionTopic(t, 3)
		p.extraEnv = map[string]string{"KDEDUP_KEY": scenario.SpreadKey}
		recs := scenario.GenerateSpread(scenario.SpreadOptions{Events: 3000, Seed: 21, Partitions: p.partitions})
		if n := scenario.SpreadPartitions(recs); n < 1000 {
			t.Fatalf("only %d events have copies in more than one partition: the stream does not test repartitioning", n)
		}
		p.produceManual(t, recs)
		w := p.startWorker(t, t.TempDir())
		_, _, out := p.outputRecords(t, recs)
		requireSpreadDeduplicated(t, recs, out, true)
		if got := w.metric(t, "kdedup_records_repartitioned_total"); got != float64(len(recs)) {
			t.Errorf("kdedup_records_repartitioned_total = %v, want %d (every input record once)", got, len(recs))
		}
		w.stop(t)
		t.Logf("%d input records, %d events with copies in more than one partition, %d forwarded", len(recs), scenario.SpreadPartitions(recs), len(out))
	})
}

// TestRepartitionPartitionsAdded: partitions added to the input topic
// while the worker runs move records of one user id to another partition;
// through the repartition topic no decision changes: every event is still
// forwarded once.
func TestRepartitionPartitionsAdded(t *testing.T) {
	p := newPipeline(t, 2)
	p.delivery = "exactly-once"
	p.withRepartitionTopic(t, 3)
	p.extraEnv = map[string]string{"KDEDUP_KEY": scenario.SpreadKey, "KDEDUP_METADATA_MAX_AGE": "1s"}
	all := scenario.GenerateSpread(scenario.SpreadOptions{Events: 2000, Seed: 22, Partitions: 2})
	half := len(all) / 2
	p.produceManual(t, all[:half])
	w := p.startWorker(t, t.TempDir())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := scenario.WaitCaughtUp(ctx, p.b.admin(t), p.group, p.in); err != nil {
		t.Fatal(err)
	}
	resp, err := p.b.admin(t).CreatePartitions(ctx, 2, p.in)
	if err == nil {
		err = resp.Error()
	}
	if err != nil {
		t.Fatal(err)
	}
	p.partitions = 4
	// The rest as producers that see four partitions place it: the
	// copies of an event sent before and after may now differ in
	// partition even for one producer.
	rest := scenario.GenerateSpread(scenario.SpreadOptions{Events: 2000, Seed: 22, Partitions: 4})[half:]
	moved := 0
	for i, r := range rest {
		if r.Partition != all[half+i].Partition {
			moved++
		}
	}
	if moved == 0 {
		t.Fatal("no record placed apart by the added partitions")
	}
	p.waitInputPartitions(t, ctx, 4)
	p.produceManual(t, rest)
	in := append(append([]*kgo.Record{}, all[:half]...), rest...)
	_, _, out := p.outputRecords(t, in)
	w.stop(t)
	requireSpreadDeduplicated(t, in, out, true)
	t.Logf("%d of the second half's records placed apart by the added partitions", moved)
}

// waitInputPartitions waits until the group has been assigned n
// partitions of the input topic.
func (p *pipeline) waitInputPartitions(t *testing.T, ctx context.Context, n int) {
	t.Helper()
	for {
		groups, err := p.b.admin(t).DescribeGroups(ctx, p.group)
		if err == nil {
			g := groups[p.group]
			if parts := g.AssignedPartitions()[p.in]; len(parts) == n {
				return
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the group was not assigned %d partitions of %s: %v", n, p.in, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// TestRepartitionTopicChecked: a repartition topic that does not exist,
// or whose broker replaces record timestamps (LogAppendTime), stops
// start-up with an error naming KDEDUP_REPARTITION_TOPIC (a runtime
// failure, exit 1), and one that is also an input topic is a configuration
// error naming it.
func TestRepartitionTopicChecked(t *testing.T) {
	p := newPipeline(t, 2)
	p.repart = p.b.name("no-such-topic")
	cfg, err := config.LoadFrom(p.env(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err = app.Run(ctx, cfg, slog.New(slog.DiscardHandler), prometheus.NewRegistry(), nil)
	if !errors.Is(err, app.ErrTopic) || !strings.Contains(err.Error(), "KDEDUP_REPARTITION_TOPIC="+p.repart) || !strings.Contains(err.Error(), "does not exist") {
		t.Fatalf("start-up with a missing repartition topic: %v, want an error matching app.ErrTopic naming KDEDUP_REPARTITION_TOPIC", err)
	}

	// A topic whose broker stamps its own time on records: refused, as
	// the output and the window keep the producers' timestamps.
	p.withRepartitionTopic(t, 2)
	p.b.setTopicConfig(t, p.repart, "message.timestamp.type", "LogAppendTime")
	cfg, err = config.LoadFrom(p.env(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	err = app.Run(ctx, cfg, slog.New(slog.DiscardHandler), prometheus.NewRegistry(), nil)
	if !errors.Is(err, app.ErrTopic) || !strings.Contains(err.Error(), "KDEDUP_REPARTITION_TOPIC="+p.repart) || !strings.Contains(err.Error(), "LogAppendTime") {
		t.Fatalf("start-up with a LogAppendTime repartition topic: %v, want an error matching app.ErrTopic naming KDEDUP_REPARTITION_TOPIC and LogAppendTime", err)
	}

	env := p.env(t.TempDir())
	env["KDEDUP_REPARTITION_TOPIC"] = p.in
	_, err = config.LoadFrom(env)
	var cerr *config.Error
	if !errors.As(err, &cerr) || len(cerr.Problems) != 1 || cerr.Problems[0].Var != "KDEDUP_REPARTITION_TOPIC" {
		t.Fatalf("a repartition topic that is an input topic: %v, want a configuration error naming KDEDUP_REPARTITION_TOPIC", err)
	}
}

// TestRepartitionTooLargeIsDeadLetter: a record that fits the input topic
// but not the repartition topic (whose max.message.bytes is smaller) goes
// to the dead-letter topic, unchanged, and the others are deduplicated.
func TestRepartitionTooLargeIsDeadLetter(t *testing.T) {
	deliveries(t, func(t *testing.T, delivery string) {
		p := newPipeline(t, 2)
		p.delivery = delivery
		p.withRepartitionTopic(t, 2)
		const limit = 64 << 10
		p.b.setTopicConfig(t, p.repart, "max.message.bytes", strconv.Itoa(limit))
		dead := p.withDeadLetterTopic(t, 0)
		p.extraEnv["KDEDUP_KEY"] = scenario.SpreadKey
		recs := scenario.GenerateSpread(scenario.SpreadOptions{Events: 500, Seed: 23, Partitions: 2})
		big := &kgo.Record{Key: []byte("big"), Value: []byte(`{"event_id":"big","pad":"` + incompressible(4*limit) + `"}`),
			Headers: []kgo.RecordHeader{{Key: "trace", Value: []byte("big")}}, Timestamp: scenario.Base, Partition: 1}
		recs = append(recs[:250:250], append([]*kgo.Record{big}, recs[250:]...)...)
		p.produceManual(t, recs)
		w := p.startWorker(t, t.TempDir())
		_, _, out := p.outputRecords(t, recs)
		w.stop(t)
		var rest []*kgo.Record
		for _, r := range recs {
			if r != big {
				rest = append(rest, r)
			}
		}
		requireSpreadDeduplicated(t, rest, out, true)
		dl := p.readTopic(t, dead)
		if len(dl) != 1 || string(dl[0].Key) != "big" || string(dl[0].Value) != string(big.Value) {
			t.Fatalf("dead-letter topic holds %d records, want the one too large for the repartition topic", len(dl))
		}
		if got, _ := header(dl[0], "kdedup-target"); got != p.repart {
			t.Errorf("dead letter's kdedup-target %q, want the repartition topic %q", got, p.repart)
		}
	})
}

// incompressible returns n characters of base64 that no codec shrinks
// to a quarter: a record that fits a topic only uncompressed or not at all.
func incompressible(n int) string {
	b := make([]byte, n*3/4+3)
	rng := rand.New(rand.NewPCG(uint64(n), 7))
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	return base64.StdEncoding.EncodeToString(b)[:n]
}

// TestRepartitionCrashLoop is TestCrashLoop through a repartition topic:
// three worker processes in one group own partitions of both stages (the
// input and the repartition topic) while events keyed by a JSON field
// arrive spread over the input's partitions, and for 6 rounds one of them
// is SIGKILLed, its data directory deleted in about a third of the
// rounds (the partitions it takes back then restore from snapshots, taken
// every second, and replay after them), and restarted. Exactly once, each
// event is forwarded once as one
// of its copies; at least once nothing is missing, and the repeats stay
// within the README's bound per kill (a repeat of the repartition stage is
// a duplicate the dedup stage drops).
func TestRepartitionCrashLoop(t *testing.T) {
	deliveries(t, func(t *testing.T, delivery string) {
		p := newPipeline(t, 4)
		p.delivery = delivery
		p.withRepartitionTopic(t, 3)
		p.manual = true
		p.extraEnv = map[string]string{"KDEDUP_KEY": scenario.SpreadKey, "KDEDUP_LOG_LEVEL": "info"}
		p.withSnapshots(t) // a wiped worker restores the repartition topic's partitions
		recs := scenario.GenerateSpread(scenario.SpreadOptions{Events: 6000, Seed: 24, Partitions: p.partitions})
		budget := p.crashLoop(t, recs, 6, rand.New(rand.NewPCG(uint64(len(delivery)), 24)))
		_, _, out := p.outputRecords(t, recs)
		t.Logf("%d events with copies in more than one partition", scenario.SpreadPartitions(recs))
		extra := requireSpreadDeduplicated(t, recs, out, delivery == "exactly-once")
		if delivery == "at-least-once" {
			t.Logf("at-least-once: nothing missing, %d extra", extra)
			budget.require(t, extra)
		}
	})
}

// TestRepartitionSemantics: tombstones, the occurrence limit, the dedup
// window with refresh (record time through the hop, records out of order)
// and the duplicates topic behave through a repartition topic as they do
// without one, over the records as the repartition topic holds them. The
// worker stops gracefully halfway and the second half goes to a worker
// whose data directory was wiped, which rebuilds the repartition topic's
// partitions from their window by replay. The repartition topic holds each
// input record once (its original key and headers in the two appended
// headers, its timestamp kept); the output and the duplicates topic are
// exactly the model's (internal/scenario) run over the repartition topic's
// partitions in offset order, each record restored, in both delivery
// modes.
func TestRepartitionSemantics(t *testing.T) {
	deliveries(t, func(t *testing.T, delivery string) {
		p := newPipeline(t, 2)
		p.delivery = delivery
		p.withRepartitionTopic(t, 3)
		p.withDuplicatesTopic(t, 2)
		p.maxOcc = 2
		p.window = scenario.ExpectOptions{Window: 6 * time.Second, Generations: 3, Refresh: true}
		recs := windowStream(31)
		for i, r := range recs {
			r.Headers = []kgo.RecordHeader{{Key: "n", Value: strconv.AppendInt(nil, int64(i), 10)}}
		}
		half := len(recs) / 2
		p.feed(t, recs[:half], half, 0).wait(t)
		w := p.startWorker(t, t.TempDir())
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if err := scenario.WaitCaughtUp(ctx, p.b.admin(t), p.group, p.in); err != nil {
			t.Fatal(err)
		}
		p.waitRepartitioned(t, ctx)
		w.stop(t)
		p.feed(t, recs[half:], len(recs)-half, 0).wait(t)
		w = p.startWorker(t, t.TempDir()) // no local state: rebuilt by replay
		_, _, out := p.outputRecords(t, recs)
		replayed := w.metric(t, "kdedup_replayed_records_total")
		w.stop(t)

		hop, err := scenario.ReadAll(ctx, p.b.addrs, p.repart, p.b.conn...)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range hop {
			if !restoreRepartitioned(r) {
				t.Fatalf("%s/%d/%d lacks the repartition headers: %+v", r.Topic, r.Partition, r.Offset, r.Headers)
			}
		}
		sent := map[string]int{}
		for _, r := range recs {
			sent[scenario.WholeSignature(r)]++
		}
		for _, r := range hop {
			s := scenario.WholeSignature(r)
			if sent[s] == 0 {
				t.Fatalf("the repartition topic holds %s, sent fewer times or never", s)
			}
			sent[s]--
		}
		if len(hop) != len(recs) {
			t.Fatalf("the repartition topic holds %d records, want the %d sent, each once", len(hop), len(recs))
		}
		want, wantDropped := scenario.ExpectWith(hop, scenario.ExpectOptions{MaxOccurrences: p.maxOcc,
			Window: p.window.Window, Generations: p.window.Generations, Refresh: p.window.Refresh})
		requireExact(t, want, scenario.Observe(out))
		_, _, dropped := p.dropped(t, recs)
		if diffs := scenario.Diff(wantDropped, scenario.Observe(dropped), 10); len(diffs) > 0 {
			for _, d := range diffs {
				t.Error("duplicates topic:", d)
			}
			t.Fatalf("the duplicates topic differs from the model (%d records expected, %d read)", wantDropped.Stats.Forwarded, len(dropped))
		}
		if replayed == 0 {
			t.Error("the second worker replayed nothing: the wiped state was not rebuilt")
		}
		t.Logf("%d records through the hop; output %d, dropped %d, as the model says; %.0f replayed by the rebuild", len(hop), len(out), len(dropped), replayed)
	})
}

// restoreRepartitioned gives r, read from a repartition topic, the key and
// headers it had before the hop (consumer.HeaderOriginalKey or
// HeaderOriginalNullKey, then HeaderOriginalSource, removed); it reports
// false for a record without them.
func restoreRepartitioned(r *kgo.Record) bool {
	n := len(r.Headers)
	if n < 2 || r.Headers[n-1].Key != consumer.HeaderOriginalSource {
		return false
	}
	switch h := r.Headers[n-2]; h.Key {
	case consumer.HeaderOriginalKey:
		r.Key = append([]byte{}, h.Value...)
	case consumer.HeaderOriginalNullKey:
		r.Key = nil
	default:
		return false
	}
	r.Headers = r.Headers[:n-2]
	return true
}
