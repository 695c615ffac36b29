package tests

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"regexp"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

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
	p.produceManual(t, part1)
	dir := t.TempDir()
	a := p.startWorker(t, dir)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := scenario.WaitCaughtUp(ctx, p.b.admin(t), p.group, p.in); err != nil {
		t.Fatal(err)
	}
	a.stop(t)
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}

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
	resp, err := p.b.admin(t).DeleteRecords(ctx, kadm.Offsets{p.in: {0: {Topic: p.in, Partition: 0, At: d}}})
	if err != nil || resp.Error() != nil {
		t.Fatalf("deleting records of partition 0 up to %d: %v %v", d, err, resp.Error())
	}
	t.Logf("deleted partition 0 up to offset %d while its replay was at %d", d, at)

	for b.metric(t, "kdedup_partitions_restoring") > 0 || b.metric(t, "kdedup_worker_ready") != 1 {
		b.running(t)
		if ctx.Err() != nil {
			t.Fatal("the replay did not end within 2 minutes")
		}
		time.Sleep(10 * time.Millisecond)
	}

	var part2 []*kgo.Record
	for _, r := range part1[:n0-tail] {
		part2 = append(part2, &kgo.Record{Partition: 0, Key: r.Key, Value: fmt.Appendf(nil, "v2-%s", r.Key), Timestamp: scenario.Base})
	}
	for _, r := range part1[n0:] {
		part2 = append(part2, &kgo.Record{Partition: 1, Key: r.Key, Value: fmt.Appendf(nil, "v2-%s", r.Key), Timestamp: scenario.Base})
	}
	for i := range 100 {
		part2 = append(part2, &kgo.Record{Partition: int32(i % 2), Key: fmt.Appendf(nil, "new%d", i), Value: []byte("v2"), Timestamp: scenario.Base})
	}
	p.produceManual(t, part2)
	if err := scenario.WaitCaughtUp(ctx, p.b.admin(t), p.group, p.in); err != nil {
		t.Fatal(err)
	}
	b.stop(t)
	text := logs.String()

	lost := lostRE.FindAllStringSubmatch(text, -1)
	if len(lost) != 1 || lost[0][1] != "0" {
		t.Fatalf("want one WARN `replay is partial` with lost offsets of partition 0, got %d: %q", len(lost), lost)
	}
	lostFrom, _ := strconv.ParseInt(lost[0][2], 10, 64)
	lostTo, _ := strconv.ParseInt(lost[0][3], 10, 64)
	if lostTo != d || lostFrom < at || lostFrom >= d {
		t.Fatalf("lost offsets [%d, %d), want [x, %d) with %d <= x < %d (the replay's position then)", lostFrom, lostTo, d, at, d)
	}
	if n := b.metric(t, "kdedup_partial_rebuilds_total"); n != 1 {
		t.Errorf("%.0f partial rebuilds counted, want 1", n)
	}

	// The model: what the rebuilt filter holds decides part two.
	held := map[string]bool{}
	stretch, repeatedAfter := 0, 0
	for _, r := range part1 {
		if r.Partition == 0 && r.Offset >= lostFrom && r.Offset < d {
			stretch++
			continue
		}
		held[string(r.Key)] = true
	}
	want := scenario.Expect(part1, true)
	forwardedAgain := 0
	for _, r := range part2 { // in offset order per partition, keys apart by partition
		want.Stats.Consumed++
		k := string(r.Key)
		if held[k] {
			want.Stats.Duplicates++
			continue
		}
		held[k] = true
		want.Stats.Forwarded++
		want.PerKey[k] = append(want.PerKey[k], scenario.Signature(r))
		if k[0] != 'n' {
			forwardedAgain++
		}
	}
	for _, r := range part1[n0-tail : n0] {
		if i, _ := strconv.ParseInt(string(r.Key[1:]), 10, 64); i >= lostFrom && i < d { // key a<i> was first at offset i
			repeatedAfter++
		}
	}
	if forwardedAgain == 0 || repeatedAfter == 0 {
		t.Fatalf("the lost stretch [%d, %d) must hold keys seen only there (%d) and keys repeated after it (%d)", lostFrom, d, forwardedAgain, repeatedAfter)
	}
	out, err := scenario.ReadAll(ctx, p.b.addrs, p.out, p.b.conn...)
	if err != nil {
		t.Fatal(err)
	}
	requireExact(t, want, scenario.Observe(out))
	t.Logf("lost offsets [%d, %d) of partition 0 (%d records): %d keys seen only there forwarded again, %d repeated after it still duplicates",
		lostFrom, d, stretch, forwardedAgain, repeatedAfter)

	replayed := map[string]int64{"0": lostFrom + (n0 - d), "1": n1}
	if n := b.metric(t, "kdedup_replayed_records_total"); n != float64(replayed["0"]+replayed["1"]) {
		t.Errorf("kdedup_replayed_records_total %.0f, want %d", n, replayed["0"]+replayed["1"])
	}
	finished := finishedRE.FindAllStringSubmatch(text, -1)
	if len(finished) != 2 {
		t.Fatalf("want a `replay finished` line per partition, got %q", finished)
	}
	for _, f := range finished {
		if f[2] != strconv.FormatInt(replayed[f[1]], 10) {
			t.Errorf("partition %s: replay finished with records=%s, want %d", f[1], f[2], replayed[f[1]])
		}
	}
}
