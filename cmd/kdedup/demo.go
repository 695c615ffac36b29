package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"text/tabwriter"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kdedup/kdedup/config"
	"github.com/kdedup/kdedup/internal/app"
	"github.com/kdedup/kdedup/internal/embedded"
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
	fs.IntVar(&o.bucketSize, "bucket-size", 0, "fingerprint slots per bucket, 2, 4 or 8; 0 for the worker's default (KDEDUP_BUCKET_SIZE)")
	delivery := fs.String("delivery", "at-least-once", "at-least-once, exactly-once, or both (runs each on the same stream and compares records/s)")
	fs.BoolVar(&o.verbose, "v", false, "show the worker's info logs")
	move := fs.Bool("move", true, "then move every partition to a second worker with an empty data directory through snapshots (KDEDUP_SNAPSHOT_URL, a directory store) and check the output again")
	scn := fs.String("scenario", "default", "default (records keyed by the dedup key, as the producers agree) or spread (events keyed by a JSON field, sent by producers that partition them apart: run without and with KDEDUP_REPARTITION_TOPIC; -keys is the number of events, -move does not apply)")
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
	switch *scn {
	case "default":
	case "spread":
		for _, mode := range modes {
			o.delivery = mode
			if err := runSpreadDemo(ctx, o, stdout, stderr); err != nil {
				return err
			}
		}
		return nil
	default:
		return fmt.Errorf("%w: -scenario %q: want default or spread", errUsage, *scn)
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
	if *move {
		o.delivery = modes[len(modes)-1]
		return runMoveDemo(ctx, o, recs, stdout, stderr)
	}
	return nil
}

type demoOptions struct {
	keys, partitions, bits int
	bucketSize             int // 0: the configuration's default
	delivery               string
	verbose                bool
}

// runDemo runs one demo on a fresh in-process broker and returns the
// worker's records/s.
func runDemo(ctx context.Context, o demoOptions, recs []*kgo.Record, stdout, stderr io.Writer) (float64, error) {
	const in, out, group = "events", "events-dedup", "kdedup-demo"
	cluster, err := embedded.NewCluster(o.partitions, in, out)
	if err != nil {
		return 0, err
	}
	defer cluster.Close()

	recs = embedded.CloneRecords(recs)
	if err := cluster.Produce(ctx, in, recs, stdout); err != nil {
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
	env := map[string]string{
		"KDEDUP_BROKERS": cluster.Brokers[0], "KDEDUP_INPUT_TOPICS": in, "KDEDUP_OUTPUT_TOPIC": out, "KDEDUP_GROUP": group,
		"KDEDUP_DATA_DIR": dir, "KDEDUP_HTTP_ADDR": "127.0.0.1:0", "KDEDUP_FINGERPRINT_BITS": strconv.Itoa(o.bits),
		"KDEDUP_DELIVERY":   o.delivery,
		"KDEDUP_LOG_FORMAT": "text", "KDEDUP_LOG_LEVEL": map[bool]string{true: "info", false: "warn"}[o.verbose],
	}
	if o.bucketSize != 0 {
		env["KDEDUP_BUCKET_SIZE"] = strconv.Itoa(o.bucketSize)
	}
	cfg, err := config.LoadFrom(env)
	if err != nil {
		return 0, fmt.Errorf("%w: %v", errUsage, err)
	}

	w, err := embedded.StartWorker(ctx, cfg, app.NewLogger(stderr, cfg.SlogLevel(), cfg.LogFormat))
	if err != nil {
		return 0, err
	}
	wait, cancel := context.WithTimeout(ctx, 5*time.Minute)
	_, err = embedded.WaitCommitted(wait, cluster.Admin, group, in, len(recs), w.ReadyAt, stdout)
	cancel()
	if err != nil {
		_ = w.Stop()
		return 0, err
	}
	caughtUp := time.Now()
	metrics, err := w.Registry.Gather()
	if err != nil {
		_ = w.Stop()
		return 0, err
	}
	if err := w.Stop(); err != nil {
		return 0, err
	}

	outRecs, err := scenario.ReadAll(ctx, cluster.Brokers, out)
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
	elapsed := caughtUp.Sub(w.ReadyAt)
	rate := float64(len(recs)) / elapsed.Seconds()
	fmt.Fprintf(stdout, "\nfilter (%d partitions, f=%d, b=%d): %.0f keys held, sub-filters per partition up to %.0f, load factor up to %.4f, estimated FPR up to %.3g\n",
		o.partitions, o.bits, cfg.BucketSize, sum("kdedup_filter_items"), maxMetric(metrics, "kdedup_filter_sub_filters"),
		maxMetric(metrics, "kdedup_filter_load_factor"), maxMetric(metrics, "kdedup_filter_estimated_fpr"))
	if o.delivery == "exactly-once" {
		fmt.Fprintf(stdout, "transactions: %.0f committed, %.0f aborted\n",
			sumMetricLabel(metrics, "kdedup_transactions_total", "outcome", "committed"), sumMetricLabel(metrics, "kdedup_transactions_total", "outcome", "aborted"))
	}
	fmt.Fprintf(stdout, "time: group joined after %s; all %d records decided and committed %s later: %.0f records/s\n",
		w.ReadyAt.Sub(w.Started).Round(time.Millisecond), len(recs), elapsed.Round(time.Millisecond), rate)

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
