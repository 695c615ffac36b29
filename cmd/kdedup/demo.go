package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kdedup/kdedup/config"
	"github.com/kdedup/kdedup/internal/app"
	"github.com/kdedup/kdedup/internal/scenario"
)

// demoCmd starts an in-process Kafka-protocol broker (franz-go's kfake),
// produces a realistic stream, runs the real worker against it, and checks
// the output against the exact model; with -delivery both it does so for
// each delivery mode on the same stream and compares their throughput.
func demoCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o demoOptions
	fs.IntVar(&o.keys, "keys", 50_000, "distinct keys in the generated stream")
	fs.IntVar(&o.partitions, "partitions", 4, "partitions of the input and output topics")
	fs.IntVar(&o.bits, "fingerprint-bits", 32, "fingerprint width; 32 makes a false drop in the demo improbable (about 1e-9 per lookup), so the output can be checked exactly")
	delivery := fs.String("delivery", "at-least-once", "at-least-once, exactly-once, or both (runs each on the same stream and compares records/s)")
	fs.BoolVar(&o.verbose, "v", false, "show the worker's info logs")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	modes := []string{*delivery}
	switch *delivery {
	case "at-least-once", "exactly-once":
	case "both":
		modes = []string{"at-least-once", "exactly-once"}
	default:
		return fmt.Errorf("%w: -delivery %q: want at-least-once, exactly-once or both", errUsage, *delivery)
	}
	recs := scenario.Generate(scenario.Options{Keys: o.keys})
	rates := map[string]float64{}
	for _, mode := range modes {
		o.delivery = mode
		rate, err := runDemo(ctx, o, recs, stdout, stderr)
		if err != nil {
			return err
		}
		rates[mode] = rate
	}
	if len(modes) == 2 {
		alo, eos := rates["at-least-once"], rates["exactly-once"]
		fmt.Fprintf(stdout, "\nsame stream, same machine: at-least-once %.0f records/s, exactly-once %.0f records/s (%.2fx)\n", alo, eos, eos/alo)
	}
	return nil
}

type demoOptions struct {
	keys, partitions, bits int
	delivery               string
	verbose                bool
}

// runDemo runs one demo on a fresh in-process broker and returns the
// worker's records/s.
func runDemo(ctx context.Context, o demoOptions, recs []*kgo.Record, stdout, stderr io.Writer) (float64, error) {
	const in, out, group = "events", "events-dedup", "kdedup-demo"
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(int32(o.partitions), in, out))
	if err != nil {
		return 0, fmt.Errorf("starting in-process broker: %w", err)
	}
	defer cluster.Close()
	brokers := cluster.ListenAddrs()

	recs = cloneRecords(recs)
	prod, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		return 0, err
	}
	err = produceDemo(ctx, prod, in, recs, stdout)
	prod.Close()
	if err != nil {
		return 0, err
	}
	want := scenario.Expect(recs, true)
	fmt.Fprintf(stdout, "== %s: produced %d records to %s (%d partitions): %d distinct keys with producer retries, replays, hot keys, tombstones and unkeyed records\n",
		o.delivery, len(recs), in, o.partitions, o.keys)

	dir, err := os.MkdirTemp("", "kdedup-demo-")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir)
	cfg, err := config.LoadFrom(map[string]string{
		"KDEDUP_BROKERS": brokers[0], "KDEDUP_INPUT_TOPICS": in, "KDEDUP_OUTPUT_TOPIC": out, "KDEDUP_GROUP": group,
		"KDEDUP_DATA_DIR": dir, "KDEDUP_HTTP_ADDR": "127.0.0.1:0", "KDEDUP_FINGERPRINT_BITS": strconv.Itoa(o.bits),
		"KDEDUP_DELIVERY":   o.delivery,
		"KDEDUP_LOG_FORMAT": "text", "KDEDUP_LOG_LEVEL": map[bool]string{true: "info", false: "warn"}[o.verbose],
	})
	if err != nil {
		return 0, fmt.Errorf("%w: %v", errUsage, err)
	}

	reg := prometheus.NewRegistry()
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	addr := make(chan string, 1)
	done := make(chan error, 1)
	start := time.Now()
	go func() {
		done <- app.Run(wctx, cfg, newLogger(stderr, cfg.SlogLevel(), cfg.LogFormat), reg, func(a string) { addr <- a })
	}()
	var readyAt time.Time
	select {
	case a := <-addr:
		if readyAt, err = waitReady(ctx, a, done); err != nil {
			return 0, err
		}
	case err := <-done:
		return 0, fmt.Errorf("worker stopped before listening: %w", err)
	}

	adm, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		return 0, err
	}
	defer adm.Close()
	wait, cancel := context.WithTimeout(ctx, 5*time.Minute)
	err = waitCommitted(wait, kadm.NewClient(adm), group, in, len(recs), readyAt, stdout)
	cancel()
	if err != nil {
		return 0, err
	}
	caughtUp := time.Now()
	metrics, err := reg.Gather()
	if err != nil {
		return 0, err
	}
	stop()
	if err := <-done; err != nil {
		return 0, fmt.Errorf("worker: %w", err)
	}

	outRecs, err := scenario.ReadAll(ctx, brokers, out)
	if err != nil {
		return 0, err
	}
	got := scenario.Observe(outRecs)
	sum := func(name string) float64 { return sumMetric(metrics, name) }

	tw := tabwriter.NewWriter(stdout, 2, 8, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "\tworker\texact model\t")
	row := func(name string, worker float64, model int) { fmt.Fprintf(tw, "%s\t%.0f\t%d\t\n", name, worker, model) }
	row("consumed", sum("kdedup_consumed_records_total"), want.Stats.Consumed)
	row("forwarded", sum("kdedup_forwarded_records_total"), want.Stats.Forwarded)
	row("duplicates dropped", sum("kdedup_duplicate_records_total"), want.Stats.Duplicates)
	row("deletes (tombstones)", sum("kdedup_delete_records_total"), want.Stats.Deletes)
	row("unkeyed (forwarded)", sum("kdedup_unkeyed_records_total"), want.Stats.Unkeyed)
	row("records in output topic", float64(len(outRecs)), want.Stats.Forwarded)
	tw.Flush()
	elapsed := caughtUp.Sub(readyAt)
	rate := float64(len(recs)) / elapsed.Seconds()
	fmt.Fprintf(stdout, "\nfilter (%d partitions, f=%d, b=4): %.0f keys held, sub-filters per partition up to %.0f, load factor up to %.4f, estimated FPR up to %.3g\n",
		o.partitions, o.bits, sum("kdedup_filter_items"), maxMetric(metrics, "kdedup_filter_sub_filters"),
		maxMetric(metrics, "kdedup_filter_load_factor"), maxMetric(metrics, "kdedup_filter_estimated_fpr"))
	if o.delivery == "exactly-once" {
		fmt.Fprintf(stdout, "transactions: %.0f committed, %.0f aborted\n",
			sumMetricLabel(metrics, "kdedup_transactions_total", "outcome", "committed"), sumMetricLabel(metrics, "kdedup_transactions_total", "outcome", "aborted"))
	}
	fmt.Fprintf(stdout, "time: group joined after %s; all %d records decided and committed %s later: %.0f records/s\n",
		readyAt.Sub(start).Round(time.Millisecond), len(recs), elapsed.Round(time.Millisecond), rate)

	if diffs := scenario.Diff(want, got, 10); len(diffs) > 0 {
		for _, d := range diffs {
			fmt.Fprintln(stdout, "  differs:", d)
		}
		return 0, errors.New("demo: output differs from the exact model")
	}
	if sum("kdedup_consumed_records_total") != float64(want.Stats.Consumed) {
		return 0, errors.New("demo: worker consumed a different number of records than were produced")
	}
	fmt.Fprintln(stdout, "output matches the exact model: every key's records in order, nothing missing, nothing extra")
	return rate, nil
}

// produceDemo produces recs to topic in chunks, printing every two seconds
// how many it has produced.
func produceDemo(ctx context.Context, cl *kgo.Client, topic string, recs []*kgo.Record, stdout io.Writer) error {
	const chunk = 50_000
	last := time.Now()
	for i := 0; i < len(recs); i += chunk {
		if err := scenario.Produce(ctx, cl, topic, recs[i:min(i+chunk, len(recs))]); err != nil {
			return err
		}
		if done := min(i+chunk, len(recs)); time.Since(last) >= 2*time.Second && done < len(recs) {
			last = time.Now()
			fmt.Fprintf(stdout, "  produced %d/%d records (%.0f%%)\n", done, len(recs), 100*float64(done)/float64(len(recs)))
		}
	}
	return nil
}

// waitCommitted waits until group has committed the end of topic, and
// prints every two seconds how many of its total records the group has
// committed (offsets are record counts: the input is produced without
// transactions).
func waitCommitted(ctx context.Context, adm *kadm.Client, group, topic string, total int, since time.Time, stdout io.Writer) error {
	caught := make(chan error, 1)
	go func() { caught <- scenario.WaitCaughtUp(ctx, adm, group, topic) }()
	tick := time.NewTicker(2 * time.Second)
	defer tick.Stop()
	for {
		select {
		case err := <-caught:
			return err
		case <-tick.C:
			committed, err := adm.FetchOffsets(ctx, group)
			if err != nil {
				continue // the next tick or WaitCaughtUp tells
			}
			var n int64
			committed.Each(func(r kadm.OffsetResponse) {
				if r.Topic == topic && r.At > 0 {
					n += r.At
				}
			})
			fmt.Fprintf(stdout, "  %d/%d records committed (%.0f%%), %.0f records/s so far\n",
				n, total, 100*float64(n)/float64(total), float64(n)/time.Since(since).Seconds())
		}
	}
}

// cloneRecords copies recs so that producing them (which sets topic,
// partition and offset) leaves the originals reusable.
func cloneRecords(recs []*kgo.Record) []*kgo.Record {
	out := make([]*kgo.Record, len(recs))
	for i, r := range recs {
		out[i] = &kgo.Record{Key: r.Key, Value: r.Value, Headers: r.Headers, Timestamp: r.Timestamp}
	}
	return out
}

// waitReady polls /readyz until it answers 200 and returns when it did.
func waitReady(ctx context.Context, addr string, done <-chan error) (time.Time, error) {
	for {
		resp, err := http.Get("http://" + addr + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return time.Now(), nil
			}
		}
		select {
		case err := <-done:
			return time.Time{}, fmt.Errorf("worker stopped before it was ready: %w", err)
		case <-ctx.Done():
			return time.Time{}, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func sumMetric(mfs []*dto.MetricFamily, name string) float64 {
	total := 0.0
	for _, v := range metricValues(mfs, name) {
		total += v
	}
	return total
}

func maxMetric(mfs []*dto.MetricFamily, name string) float64 {
	m := 0.0
	for _, v := range metricValues(mfs, name) {
		m = max(m, v)
	}
	return m
}

func sumMetricLabel(mfs []*dto.MetricFamily, name, label, value string) float64 {
	total := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == label && lp.GetValue() == value {
					total += m.GetCounter().GetValue()
				}
			}
		}
	}
	return total
}

func metricValues(mfs []*dto.MetricFamily, name string) []float64 {
	var vs []float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			switch {
			case m.Counter != nil:
				vs = append(vs, m.GetCounter().GetValue())
			case m.Gauge != nil:
				vs = append(vs, m.GetGauge().GetValue())
			}
		}
	}
	return vs
}
