package tests

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"regexp"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kdedup/kdedup/config"
	"github.com/kdedup/kdedup/internal/app"
	"github.com/kdedup/kdedup/internal/scenario"
)

// syncBuffer is a log sink read while the worker writes to it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// startLoggedWorker runs a worker in this process whose log (text, at the
// pipeline's KDEDUP_LOG_LEVEL) is kept for the test to read; a failing test
// prints it.
func (p *pipeline) startLoggedWorker(t *testing.T, dataDir string) (*worker, *syncBuffer) {
	t.Helper()
	cfg, err := config.LoadFrom(p.env(dataDir))
	if err != nil {
		t.Fatal(err)
	}
	logs := &syncBuffer{}
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: cfg.SlogLevel()}))
	ctx, cancel := context.WithCancel(context.Background())
	w := &worker{cancel: cancel, done: make(chan error, 1), reg: prometheus.NewRegistry()}
	go func() { w.done <- app.Run(ctx, cfg, log, w.reg, nil) }()
	t.Cleanup(func() {
		w.cancel()
		<-w.done
		if t.Failed() {
			t.Logf("worker log:\n%s", logs)
		}
	})
	return w, logs
}

// gaugeWith is the value of a gauge whose label has value.
func (w *worker) gaugeWith(t *testing.T, name, label, value string) (float64, bool) {
	t.Helper()
	mfs, err := w.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					return m.GetGauge().GetValue(), true
				}
			}
		}
	}
	return 0, false
}

var (
	lostRE     = regexp.MustCompile(`(?m)^.* level=WARN msg="replay is partial[^"]*" topic=\S+ partition=(\d+) lost_from=(\d+) lost_to=(\d+)$`)
	finishedRE = regexp.MustCompile(`(?m)^.* level=INFO msg="replay finished" topic=\S+ partition=(\d+) records=(\d+) `)
)

// lostStretch is what a WARN `replay is partial` names: the offsets
// [from, to) of a partition that a replay could not read.
type lostStretch struct {
	partition int32
	from, to  int64
}

// lostStretches returns the stretches the worker's log names lost, in the
// order logged.
func lostStretches(t *testing.T, logs string) []lostStretch {
	t.Helper()
	var out []lostStretch
	for _, m := range lostRE.FindAllStringSubmatch(logs, -1) {
		p, err1 := strconv.ParseInt(m[1], 10, 32)
		from, err2 := strconv.ParseInt(m[2], 10, 64)
		to, err3 := strconv.ParseInt(m[3], 10, 64)
		if err1 != nil || err2 != nil || err3 != nil {
			t.Fatalf("unreadable WARN %q", m[0])
		}
		out = append(out, lostStretch{int32(p), from, to})
	}
	return out
}

// retentionInput is the first part of TestRetentionDuringReplay's stream,
// on partition 0 and 1 by hand: partition 0 holds n0 records, the first
// n0-tail with distinct keys, the last tail repeating every 7th of those
// keys (duplicates to the worker that first decides them); partition 1
// holds n1 distinct keys. Values are padded to 1 KiB so that a restore
// client's fetches (1 MiB a partition) run only about a thousand records
// ahead of the replay.
func retentionInput(n0, n1, tail int) []*kgo.Record {
	pad := bytes.Repeat([]byte{'.'}, 1000)
	rec := func(part int32, key string, i int) *kgo.Record {
		return &kgo.Record{Partition: part, Key: []byte(key), Value: fmt.Appendf(nil, "v1-%d-%s", i, pad), Timestamp: scenario.Base}
	}
	var recs []*kgo.Record
	for i := range n0 - tail {
		recs = append(recs, rec(0, fmt.Sprintf("a%d", i), i))
	}
	for i := range tail {
		recs = append(recs, rec(0, fmt.Sprintf("a%d", 7*i), n0-tail+i))
	}
	for i := range n1 {
		recs = append(recs, rec(1, fmt.Sprintf("b%d", i), i))
	}
	return recs
}

// produceManual produces recs to the pipeline's input, each to the
// partition it names, uncompressed (so that a fetch's bytes bound its
// records).
func (p *pipeline) produceManual(t *testing.T, recs []*kgo.Record) {
	t.Helper()
	cl := p.b.client(t, kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.ProducerBatchCompression(kgo.NoCompression()))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := scenario.Produce(ctx, cl, p.in, recs); err != nil {
		t.Fatal(err)
	}
}

// wipedAfterFirstPart produces part1, runs a worker until the group has
// committed it, stops it and deletes its data directory, which it returns:
// the next worker on it rebuilds by replay.
func (p *pipeline) wipedAfterFirstPart(t *testing.T, part1 []*kgo.Record) string {
	t.Helper()
	p.produceManual(t, part1)
	dir := t.TempDir()
	w := p.startWorker(t, dir)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := scenario.WaitCaughtUp(ctx, p.b.admin(t), p.group, p.in); err != nil {
		t.Fatal(err)
	}
	w.stop(t)
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	return dir
}

// waitReplayed waits until w has no partition replaying and is ready.
func (w *worker) waitReplayed(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for w.metric(t, "kdedup_partitions_restoring") > 0 || w.metric(t, "kdedup_worker_ready") != 1 {
		w.running(t)
		if time.Now().After(deadline) {
			t.Fatal("the replay did not end within 2 minutes")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// againAndNew is the second part of the retention suites: every key of
// part1 once more, on its partition, with a new value, then 100 new keys.
func againAndNew(part1 []*kgo.Record) []*kgo.Record {
	var part2 []*kgo.Record
	seen := map[string]bool{}
	for _, r := range part1 {
		if k := string(r.Key); !seen[k] {
			seen[k] = true
			part2 = append(part2, &kgo.Record{Partition: r.Partition, Key: r.Key, Value: fmt.Appendf(nil, "v2-%s", k), Timestamp: scenario.Base})
		}
	}
	for i := range 100 {
		part2 = append(part2, &kgo.Record{Partition: int32(i % 2), Key: fmt.Appendf(nil, "new%d", i), Value: []byte("v2"), Timestamp: scenario.Base})
	}
	return part2
}

// requireRebuiltModel requires the output topic to be exactly the model of
// a worker that decided part1 and a second one that decided part2 after
// rebuilding a filter holding the keys of part1's records outside the lost
// stretches. It returns how many of part2's records were forwarded because
// their keys were lost, and how many lost records have keys that the
// filter still holds from a later record.
func (p *pipeline) requireRebuiltModel(t *testing.T, part1, part2 []*kgo.Record, lost []lostStretch) (forwardedAgain, heldFromLater int) {
	t.Helper()
	isLost := func(r *kgo.Record) bool {
		for _, l := range lost {
			if r.Partition == l.partition && r.Offset >= l.from && r.Offset < l.to {
				return true
			}
		}
		return false
	}
	held := map[string]bool{} // keys are apart by partition
	for _, r := range part1 {
		if !isLost(r) {
			held[string(r.Key)] = true
		}
	}
	for _, r := range part1 {
		if isLost(r) && held[string(r.Key)] {
			heldFromLater++
		}
	}
	want := scenario.Expect(part1, true)
	for _, r := range part2 { // in offset order per partition
		want.Stats.Consumed++
		k := string(r.Key)
		if held[k] {
			want.Stats.Duplicates++
			continue
		}
		held[k] = true
		want.Stats.Forwarded++
		want.PerKey[k] = append(want.PerKey[k], scenario.Signature(r))
		if !bytes.HasPrefix(r.Key, []byte("new")) {
			forwardedAgain++
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := scenario.ReadAll(ctx, p.b.addrs, p.out, p.b.conn...)
	if err != nil {
		t.Fatal(err)
	}
	requireExact(t, want, scenario.Observe(out))
	return forwardedAgain, heldFromLater
}

// requireReplayed requires the worker to have replayed exactly want[p]
// records of each partition p: kdedup_replayed_records_total is their sum,
// and each partition's `replay finished` line says its own.
func (w *worker) requireReplayed(t *testing.T, logs string, want map[int32]int64) {
	t.Helper()
	var sum int64
	for _, n := range want {
		sum += n
	}
	if n := w.metric(t, "kdedup_replayed_records_total"); n != float64(sum) {
		t.Errorf("kdedup_replayed_records_total %.0f, want %d", n, sum)
	}
	finished := finishedRE.FindAllStringSubmatch(logs, -1)
	if len(finished) != len(want) {
		t.Fatalf("want a `replay finished` line per partition, got %q", finished)
	}
	for _, f := range finished {
		p, _ := strconv.ParseInt(f[1], 10, 32)
		if f[2] != strconv.FormatInt(want[int32(p)], 10) {
			t.Errorf("partition %d: replay finished with records=%s, want %d", p, f[2], want[int32(p)])
		}
	}
}

// TestRetentionDuringReplay: a worker rebuilds a wiped data directory by
// replay (two partitions, write batches of two delta pages) and, once the
// replay of partition 0 has passed offset 1,000, the input of partition 0
// is deleted up to an offset D about 6 MiB ahead of it (DeleteRecords, as
// retention does). The replay must meet the gap (its restore client gets
// OFFSET_OUT_OF_RANGE) and make it a partial rebuild: exactly one WARN
// `replay is partial` with lost_from (the replay's position) and lost_to
// = D, kdedup_partial_rebuilds_total exactly 1; the replay goes on at D.
// Then every key of the first part is produced again with new keys: the
// output is exactly the model's, in which the rebuilt filter holds the keys
// of partition 0's offsets [0, lost_from) and [D, end) and all of
// partition 1 (keys whose only records were in the lost stretch are
// forwarded again; keys of the stretch repeated after it stay duplicates).
// The records replayed are exactly lost_from + (end - D) on partition 0
// and all of partition 1: kdedup_replayed_records_total and each
// partition's `replay finished` log line say so.
func TestRetentionDuringReplay(t *testing.T) {
	const (
		n0, n1, tail = 16_000, 3_000, 1_000
		minProgress  = 1_000 // records partition 0 replays before the deletion
		margin       = 6_000 // records between the replay's position and the deletion: ~6 MiB, more than two fetches
	)
	p := newPipeline(t, 2)
	part1 := retentionInput(n0, n1, tail)
	dir := p.wipedAfterFirstPart(t, part1)

	p.extraEnv = maps.Clone(slowReplay)
	p.extraEnv["KDEDUP_LOG_LEVEL"] = "info" // for "replay finished"
	b, logs := p.startLoggedWorker(t, dir)
	// Delete once partition 0's replay has progressed and is still far
	// from where the deletion ends.
	var at int64
	deadline := time.Now().Add(30 * time.Second)
	for {
		left, _ := b.gaugeWith(t, "kdedup_replay_remaining_records", "partition", "0") // 0 before and after the replay
		if at = n0 - int64(left); left > 0 && at >= minProgress {
			break
		}
		if b.metric(t, "kdedup_worker_ready") == 1 {
			t.Fatalf("the replay ended before it reached offset %d and could be seen there: make it longer", minProgress)
		}
		if time.Now().After(deadline) {
			t.Fatalf("partition 0's replay did not reach offset %d within 30s (remaining %v)", minProgress, left)
		}
		time.Sleep(2 * time.Millisecond)
	}
	d := at + margin
	if d > n0-tail {
		t.Fatalf("partition 0's replay was at offset %d when seen: too fast to delete %d records ahead of it before the last %d", at, margin, tail)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	resp, err := p.b.admin(t).DeleteRecords(ctx, kadm.Offsets{p.in: {0: {Topic: p.in, Partition: 0, At: d}}})
	if err != nil || resp.Error() != nil {
		t.Fatalf("deleting records of partition 0 up to %d: %v %v", d, err, resp.Error())
	}
	t.Logf("deleted partition 0 up to offset %d while its replay was at %d", d, at)
	b.waitReplayed(t)

	part2 := againAndNew(part1)
	p.produceManual(t, part2)
	if err := scenario.WaitCaughtUp(ctx, p.b.admin(t), p.group, p.in); err != nil {
		t.Fatal(err)
	}
	b.stop(t)
	text := logs.String()

	lost := lostStretches(t, text)
	if len(lost) != 1 || lost[0].partition != 0 || lost[0].to != d || lost[0].from < at || lost[0].from >= d {
		t.Fatalf("WARNs `replay is partial` name %+v; want one, of partition 0, [x, %d) with %d <= x < %d (the replay's position then)", lost, d, at, d)
	}
	if n := b.metric(t, "kdedup_partial_rebuilds_total"); n != 1 {
		t.Errorf("%.0f partial rebuilds counted, want 1", n)
	}
	again, later := p.requireRebuiltModel(t, part1, part2, lost)
	if again == 0 || later == 0 {
		t.Fatalf("the lost stretch [%d, %d) must hold keys seen only there (%d forwarded again) and keys seen after it (%d)", lost[0].from, d, again, later)
	}
	t.Logf("lost offsets [%d, %d) of partition 0: %d keys seen only there forwarded again, %d seen after it still duplicates", lost[0].from, d, again, later)
	b.requireReplayed(t, text, map[int32]int64{0: lost[0].from + (n0 - d), 1: n1})
}

// TestRetentionBeforeFirstFetch: the input's log start passes the replay's
// start between the plan and the restore client's first fetch (kfake holds
// that fetch until DeleteRecords up to offset 2,000 of partition 0's 3,000
// has run), with nothing deleted at the plan or with offsets below 1,000
// already deleted then (the plan counts that replay partial and starts it
// at 1,000). The first fetch answers OFFSET_OUT_OF_RANGE: a WARN names
// [start, 2000), and the replay counts once as a partial rebuild, not
// twice: kdedup_partial_rebuilds_total is exactly 1 and the WARNs name
// exactly the offsets lost. Partition 0 replays exactly its last 1,000
// records, partition 1 all of its own, and part two's output is exactly
// the model's with the keys of partition 0's offsets [0, 2000) lost.
// kfake only: it needs kfake's control of requests.
func TestRetentionBeforeFirstFetch(t *testing.T) {
	const n0, n1, tail, deleted = 3_000, 1_000, 300, 2_000
	for _, tc := range []struct {
		name   string
		atPlan int64 // log start of partition 0 when the worker plans its replay
		want   []lostStretch
	}{
		{"nothing deleted at the plan", 0, []lostStretch{{0, 0, deleted}}},
		{"deleted at the plan too", 1_000, []lostStretch{{0, 0, 1_000}, {0, 1_000, deleted}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPipeline(t, 2)
			c := p.b.fake(t)
			part1 := retentionInput(n0, n1, tail)
			dir := p.wipedAfterFirstPart(t, part1)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			adm := p.b.admin(t)
			deleteTo := func(offset int64) {
				resp, err := adm.DeleteRecords(ctx, kadm.Offsets{p.in: {0: {Topic: p.in, Partition: 0, At: offset}}})
				if err != nil || resp.Error() != nil {
					t.Errorf("deleting records of partition 0 up to %d: %v %v", offset, err, resp.Error())
				}
			}
			if tc.atPlan > 0 {
				deleteTo(tc.atPlan)
			}
			topics, err := adm.ListTopics(ctx, p.in)
			if err != nil {
				t.Fatal(err)
			}
			inID := topics[p.in].ID
			var held atomic.Bool
			c.ControlKey(int16(kmsg.Fetch), func(kr kmsg.Request) (kmsg.Response, error, bool) {
				c.KeepControl()
				for _, ft := range kr.(*kmsg.FetchRequest).Topics {
					for _, fp := range ft.Partitions {
						if (ft.Topic == p.in || ft.TopicID == inID) && fp.Partition == 0 && fp.FetchOffset == tc.atPlan && !held.Swap(true) {
							c.SleepControl(func() { deleteTo(deleted) }) // the restore client's first fetch
							c.DropControl()
						}
					}
				}
				return nil, nil, false
			})

			p.extraEnv = map[string]string{"KDEDUP_LOG_LEVEL": "info"}
			b, logs := p.startLoggedWorker(t, dir)
			b.waitReplayed(t)
			if !held.Load() {
				t.Fatal("no fetch of partition 0 at the replay's start was seen")
			}
			part2 := againAndNew(part1)
			p.produceManual(t, part2)
			if err := scenario.WaitCaughtUp(ctx, adm, p.group, p.in); err != nil {
				t.Fatal(err)
			}
			b.stop(t)
			text := logs.String()

			if lost := lostStretches(t, text); !slices.Equal(lost, tc.want) {
				t.Errorf("WARNs `replay is partial` name %+v, want %+v", lost, tc.want)
			}
			if n := b.metric(t, "kdedup_partial_rebuilds_total"); n != 1 {
				t.Errorf("%.0f partial rebuilds counted, want 1", n)
			}
			again, later := p.requireRebuiltModel(t, part1, part2, tc.want)
			t.Logf("%d keys seen only in [0, %d) forwarded again, %d seen after it still duplicates", again, deleted, later)
			b.requireReplayed(t, text, map[int32]int64{0: n0 - deleted, 1: n1})
		})
	}
}
