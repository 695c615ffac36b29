package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kdedup/kdedup/config"
	"github.com/kdedup/kdedup/internal/app"
	"github.com/kdedup/kdedup/internal/embedded"
	"github.com/kdedup/kdedup/internal/scenario"
)

// runSpreadDemo is demo -scenario spread: events keyed by a JSON field
// (scenario.GenerateSpread), each sent by up to four producers that
// partition it apart, deduplicated first within each partition, where the
// copies in other partitions escape, then through a repartition topic
// (KDEDUP_REPARTITION_TOPIC), where the output must equal the exact model:
// each event once, as one of its copies, and each record without an event
// id unchanged.
func runSpreadDemo(ctx context.Context, o demoOptions, stdout, stderr io.Writer) error {
	recs := scenario.GenerateSpread(scenario.SpreadOptions{Events: o.keys, Partitions: int32(o.partitions)})
	fmt.Fprintf(stdout, "== %s, spread: %d records of %d events keyed by %s, sent by four producers that partition them apart (user id with murmur2, device id with murmur2, unkeyed, user id with CRC32): %d events have copies in more than one of %d partitions\n",
		o.delivery, len(recs), o.keys, scenario.SpreadKey, scenario.SpreadPartitions(recs), o.partitions)
	for _, repartition := range []bool{false, true} {
		out, elapsed, err := spreadRun(ctx, o, recs, repartition, stderr)
		if err != nil {
			return err
		}
		problems, extra := scenario.SpreadCheck(recs, out, true, 5)
		if !repartition {
			fmt.Fprintf(stdout, "within each partition: %d records forwarded, %d of them copies of an event forwarded already (escaped duplicates) in %s\n",
				len(out), extra, elapsed.Round(time.Millisecond))
			if within, _ := scenario.SpreadCheckWithin(recs, out, true, 5); len(within) > 0 {
				for _, p := range within {
					fmt.Fprintln(stdout, "  differs:", p)
				}
				return errors.New("demo: output within each partition differs from its exact model")
			}
			continue
		}
		fmt.Fprintf(stdout, "through a repartition topic (%d partitions): %d records forwarded in %s, %.0f records/s\n",
			o.partitions, len(out), elapsed.Round(time.Millisecond), float64(len(recs))/elapsed.Seconds())
		if len(problems) > 0 {
			for _, p := range problems {
				fmt.Fprintln(stdout, "  differs:", p)
			}
			return errors.New("demo: output differs from the exact model")
		}
		fmt.Fprintln(stdout, "output matches the exact model: every event once, as one of its copies (key, value, headers, timestamp), and every record without an event id")
	}
	return nil
}

// spreadRun runs one worker over recs on a fresh in-process broker, with or
// without a repartition topic, and returns the output topic's records and
// the time from the group's join until everything was decided.
func spreadRun(ctx context.Context, o demoOptions, recs []*kgo.Record, repartition bool, stderr io.Writer) ([]*kgo.Record, time.Duration, error) {
	const in, by, out, group = "events", "events-by-event-id", "events-dedup", "kdedup-demo"
	cluster, err := embedded.NewCluster(o.partitions, in, by, out)
	if err != nil {
		return nil, 0, err
	}
	defer cluster.Close()
	recs = embedded.CloneRecords(recs)
	cl, err := kgo.NewClient(kgo.SeedBrokers(cluster.Brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		return nil, 0, err
	}
	err = scenario.Produce(ctx, cl, in, recs)
	cl.Close()
	if err != nil {
		return nil, 0, err
	}
	dir, err := os.MkdirTemp("", "kdedup-demo-")
	if err != nil {
		return nil, 0, err
	}
	defer os.RemoveAll(dir)
	env := map[string]string{
		"KDEDUP_BROKERS": cluster.Brokers[0], "KDEDUP_INPUT_TOPICS": in, "KDEDUP_OUTPUT_TOPIC": out, "KDEDUP_GROUP": group,
		"KDEDUP_DATA_DIR": dir, "KDEDUP_HTTP_ADDR": "127.0.0.1:0", "KDEDUP_FINGERPRINT_BITS": strconv.Itoa(o.bits),
		"KDEDUP_DELIVERY": o.delivery, "KDEDUP_KEY": scenario.SpreadKey,
		"KDEDUP_LOG_FORMAT": "text", "KDEDUP_LOG_LEVEL": map[bool]string{true: "info", false: "warn"}[o.verbose],
	}
	if repartition {
		env["KDEDUP_REPARTITION_TOPIC"] = by
	}
	cfg, err := config.LoadFrom(env)
	if err != nil {
		return nil, 0, fmt.Errorf("%w: %v", errUsage, err)
	}
	w, err := embedded.StartWorker(ctx, cfg, app.NewLogger(stderr, cfg.SlogLevel(), cfg.LogFormat))
	if err != nil {
		return nil, 0, err
	}
	wait, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	err = scenario.WaitCaughtUp(wait, cluster.Admin, group, in)
	if err == nil && repartition {
		err = scenario.WaitDecided(wait, cluster.Brokers, group, by)
	}
	elapsed := time.Since(w.ReadyAt)
	if serr := w.Stop(); err == nil {
		err = serr
	}
	if err != nil {
		return nil, 0, err
	}
	outRecs, err := scenario.ReadAll(ctx, cluster.Brokers, out)
	return outRecs, elapsed, err
}
