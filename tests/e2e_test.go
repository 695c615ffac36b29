package tests

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kdedup/kdedup/internal/scenario"
	"github.com/kdedup/kdedup/store"
)

// stream is the input of the suites: ~6,600 records over 5,000 keys with
// producer retries (adjacent identical records, so duplicates inside one
// polled batch), replays, hot keys, tombstones and keys that reappear after
// their tombstone.
func stream(seed uint64) []*kgo.Record {
	return scenario.Generate(scenario.Options{Keys: 5000, Seed: seed})
}

func requireExact(t *testing.T, want, got scenario.Model) {
	t.Helper()
	if diffs := scenario.Diff(want, got, 10); len(diffs) > 0 {
		for _, d := range diffs {
			t.Error(d)
		}
		t.Fatalf("output differs from the exact model (%d records expected, %d read)", want.Stats.Forwarded, got.Stats.Forwarded)
	}
	t.Logf("output equals the exact model: %d consumed, %d forwarded, %d duplicates, %d over the limit, %d deletes, %d unkeyed",
		want.Stats.Consumed, want.Stats.Forwarded, want.Stats.Duplicates, want.Stats.OverLimit, want.Stats.Deletes, want.Stats.Unkeyed)
}

func requireNothingMissing(t *testing.T, want, got scenario.Model) int {
	t.Helper()
	missing, extra := scenario.Missing(want, got, 10)
	for _, m := range missing {
		t.Error("missing:", m)
	}
	if len(missing) > 0 {
		t.FailNow()
	}
	return extra
}

// TestExactOutput: a stream over 6 partitions comes out exactly as the model
// says, and after a graceful stop every partition's Badger checkpoint equals
// the group's committed offset, which equals the end of the input.
func TestExactOutput(t *testing.T) {
	p := newPipeline(t, 6)
	recs := stream(1)
	p.feed(t, recs, len(recs), 0).wait(t)
	dir := t.TempDir()
	w := p.startWorker(t, dir)
	want, got := p.output(t, recs)
	w.stop(t)
	requireExact(t, want, got)

	ctx := context.Background()
	committed, err := p.b.admin(t).FetchOffsets(ctx, p.group)
	if err != nil {
		t.Fatal(err)
	}
	ends, err := p.b.admin(t).ListEndOffsets(ctx, p.in)
	if err != nil {
		t.Fatal(err)
	}
	db, err := store.Open(store.Options{Dir: dir, ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ends.Each(func(e kadm.ListedOffset) {
		sp, err := db.Partition(e.Topic, e.Partition)
		if err != nil {
			t.Fatal(err)
		}
		defer sp.Close()
		cp, ok := sp.Checkpoint()
		c, _ := committed.Lookup(e.Topic, e.Partition)
		if !ok || cp.Offset != e.Offset || c.At != e.Offset {
			t.Errorf("%s/%d: badger checkpoint %d (present %v), group offset %d, end offset %d", e.Topic, e.Partition, cp.Offset, ok, c.At, e.Offset)
		}
	})
}

// TestGracefulStopMidStream stops the worker gracefully while input keeps
// arriving and restarts it on the same data directory: the output is still
// exactly the model's.
func TestGracefulStopMidStream(t *testing.T) {
	p := newPipeline(t, 4)
	recs := stream(2)
	dir := t.TempDir()
	f := p.feed(t, recs, 200, 5*time.Millisecond)
	w := p.startWorker(t, dir)
	f.until(len(recs) / 2)
	w.stop(t)
	f.until(3 * len(recs) / 4)
	w = p.startWorker(t, dir)
	f.wait(t)
	want, got := p.output(t, recs)
	w.stop(t)
	requireExact(t, want, got)
}

// TestKillLosesNothing SIGKILLs a worker process (no final write batch, no
// group commit) eight times while input keeps arriving, each time at a
// random moment once it has caught up with the input, and restarts it on
// the same data directory: nothing the model forwards is missing, and the
// repeats are at most the README's bound per kill, the records of one
// flush interval at the input rate measured before the kill plus one poll
// per partition.
func TestKillLosesNothing(t *testing.T) {
	p := newPipeline(t, 4)
	recs := scenario.Generate(scenario.Options{Keys: 35000, Seed: 3})
	dir := t.TempDir()
	const chunk, pause, kills = 10, 10 * time.Millisecond, 8
	budget := p.newRepeatBudget(t, chunk)
	seed := uint64(time.Now().UnixNano())
	rng := rand.New(rand.NewPCG(seed, 3))
	t.Logf("kill times drawn with seed %d", seed)
	f := p.feed(t, recs, chunk, pause)
	pr := p.startProcess(t, dir, "KDEDUP_LOG_LEVEL=info")
	var ends []map[int32]int64 // the output's end offsets after each kill
	for i := range kills {
		pr.waitReady(t)
		// Kill only a worker that keeps up: one catching up with what
		// arrived while it was down decides faster than the input rate.
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		err := scenario.WaitCaughtUp(ctx, p.b.admin(t), p.group, p.in)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		// A random moment, so that the kill falls at any phase of the
		// flush ticker.
		time.Sleep(200*time.Millisecond + time.Duration(rng.Int64N(int64(time.Second))))
		if n := budget.meter.latest(); n >= int64(len(recs)) {
			t.Fatalf("the input ended (%d records) before kill %d: the stream is too short for the kills", n, i+1)
		}
		budget.lose(t, fmt.Sprintf("kill %d", i+1), time.Now())
		pr.kill()
		ends = append(ends, p.outputEnds(t))
		pr = p.startProcess(t, dir, "KDEDUP_LOG_LEVEL=info")
	}
	f.hurry()
	f.wait(t)
	want, got, out := p.outputRecords(t, recs)
	pr.kill()
	extra := requireNothingMissing(t, want, got)
	t.Logf("after %d kills: %d records expected, %d read, %d extra (forwarded again after a kill)", kills, want.Stats.Forwarded, got.Stats.Forwarded, extra)
	perKill, before := extrasPerLoss(want, out, ends)
	if len(before) > 0 {
		t.Errorf("%d records forwarded twice before the first kill, such as %s", len(before), before[:min(5, len(before))])
	}
	budget.requireEach(t, perKill)
	budget.require(t, extra)
}

// TestPartitionMovesAwayAndBack: worker A decides keys k0..k999, worker B
// (own data directory) then takes the partitions and applies tombstones for
// k0..k499, and A takes them back while the keys are re-created. A's local
// state is behind the group's offset; it must replay B's stretch into its
// filter (without forwarding) or it would drop the re-created keys as
// duplicates. The output must be exactly the model's.
func TestPartitionMovesAwayAndBack(t *testing.T) {
	deliveries(t, func(t *testing.T, delivery string) {
		p := newPipeline(t, 2)
		p.delivery = delivery
		var part1, part2, part3 []*kgo.Record
		for i := range 1000 {
			k := fmt.Appendf(nil, "k%d", i)
			part1 = append(part1, &kgo.Record{Key: k, Value: fmt.Appendf(nil, "v1-%d", i), Timestamp: scenario.Base})
			if i < 500 {
				part2 = append(part2, &kgo.Record{Key: k, Timestamp: scenario.Base})
			}
			part3 = append(part3, &kgo.Record{Key: k, Value: fmt.Appendf(nil, "v2-%d", i), Timestamp: scenario.Base})
		}
		dirA := t.TempDir()
		p.runPart(t, dirA, part1)
		p.runPart(t, t.TempDir(), part2)
		p.feed(t, part3, len(part3), 0).wait(t)
		w := p.startWorker(t, dirA)
		all := append(append(append([]*kgo.Record{}, part1...), part2...), part3...)
		want, got := p.output(t, all)
		w.stop(t)
		requireExact(t, want, got)
		if want.Stats.Forwarded != 1000+500+500 {
			t.Fatalf("model forwards %d records, want 2000", want.Stats.Forwarded)
		}
		if n := w.metric(t, "kdedup_replayed_records_total"); n != float64(len(part2)) {
			t.Fatalf("worker A replayed %.0f records, want the %d worker B processed", n, len(part2))
		}
	})
}

// TestBinaryServesAndStopsOnSIGTERM runs the kdedup binary against the
// broker with records produced by an independent client: /readyz turns
// ready, /metrics exports the per-partition counters and the write batch
// latency, SIGTERM makes it commit and exit 0, and the output is exactly the
// model's.
func TestBinaryServesAndStopsOnSIGTERM(t *testing.T) {
	p := newPipeline(t, 3)
	recs := stream(5)
	p.feed(t, recs, len(recs), 0).wait(t)
	pr := p.startProcess(t, t.TempDir(), "KDEDUP_LOG_LEVEL=info")
	addr := pr.httpAddr(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := scenario.WaitCaughtUp(ctx, p.b.admin(t), p.group, p.in); err != nil {
		t.Fatal(err)
	}
	if code, _ := get(t, addr, "/readyz"); code != 200 {
		t.Fatalf("/readyz answered %d", code)
	}
	if code, _ := get(t, addr, "/healthz"); code != 200 {
		t.Fatalf("/healthz answered %d", code)
	}
	_, metrics := get(t, addr, "/metrics")
	for _, m := range []string{
		`kdedup_consumed_records_total{partition="0",topic="` + p.in + `"}`,
		`kdedup_forwarded_records_total{partition="1",topic="` + p.in + `"}`,
		`kdedup_duplicate_records_total{partition="2",topic="` + p.in + `"}`,
		`kdedup_delete_records_total{partition="0",topic="` + p.in + `"}`,
		`kdedup_unkeyed_records_total{partition="0",topic="` + p.in + `"}`,
		`kdedup_batch_commit_seconds_count`,
		`kdedup_filter_load_factor{partition="0",topic="` + p.in + `"}`,
	} {
		if !strings.Contains(metrics, m) {
			t.Errorf("/metrics lacks %s", m)
		}
	}
	if err := pr.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := pr.cmd.Wait(); err != nil {
		t.Fatalf("after SIGTERM: %v", err)
	}
	if log := pr.logText(t); !strings.Contains(log, `msg="received signal, shutting down" signal=terminated`) {
		t.Errorf("no log line for the signal:\n%s", log)
	}
	want, got := p.output(t, recs)
	requireExact(t, want, got)
}

func get(t *testing.T, addr, path string) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + addr + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}
