// Package embedded runs kdedup in process against an in-process
// Kafka-protocol broker (franz-go's kfake): it starts the broker, produces a
// stream with progress, runs the real worker (internal/app.Run) until it is
// ready, and waits for a consumer group to commit the end of the input,
// measuring the committed offsets' rate. It is what `kdedup demo` runs on,
// so it is part of the product binary and imports no test or benchmark
// rig (cmd/kdedup's TestProductDependencies); the end-to-end tests and the
// benchmarks (internal/harness, cmd/kdedup-bench) build on it too. It is
// apart from internal/scenario, the exact model the worker is checked
// against, so that the model never depends on the code it checks.
//
// The package's functions may run concurrently; a Worker's Stop is called
// once.
package embedded

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kdedup/kdedup/config"
	"github.com/kdedup/kdedup/internal/app"
	"github.com/kdedup/kdedup/internal/scenario"
)

// progressEvery is how often Produce and WaitCommitted print progress.
const progressEvery = 2 * time.Second

// Cluster is an in-process single-broker cluster with an admin client.
// Close it when done.
type Cluster struct {
	// Brokers are the broker's listen addresses (host:port).
	Brokers []string
	// Admin is an admin client of the cluster.
	Admin *kadm.Client

	fake *kfake.Cluster
	cl   *kgo.Client
}

// NewCluster starts one broker holding topics, each of partitions
// partitions, on a random local port.
func NewCluster(partitions int, topics ...string) (*Cluster, error) {
	fake, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(int32(partitions), topics...))
	if err != nil {
		return nil, fmt.Errorf("starting in-process broker: %w", err)
	}
	brokers := fake.ListenAddrs()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		fake.Close()
		return nil, fmt.Errorf("creating admin client: %w", err)
	}
	return &Cluster{Brokers: brokers, Admin: kadm.NewClient(cl), fake: fake, cl: cl}, nil
}

// Close closes the admin client and stops the broker.
func (c *Cluster) Close() {
	c.cl.Close()
	c.fake.Close()
}

// Produce writes recs to topic of c (Produce).
func (c *Cluster) Produce(ctx context.Context, topic string, recs []*kgo.Record, progress io.Writer) error {
	return Produce(ctx, c.Brokers, topic, recs, progress)
}

// Produce writes recs to topic on the cluster at brokers (in process or
// not) in order (scenario.Produce, which sets each record's topic,
// partition and offset) and, while it runs, prints to progress every two
// seconds how many it has written.
func Produce(ctx context.Context, brokers []string, topic string, recs []*kgo.Record, progress io.Writer) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		return fmt.Errorf("creating producer: %w", err)
	}
	defer cl.Close()
	const chunk = 50_000
	last := time.Now()
	for i := 0; i < len(recs); i += chunk {
		done := min(i+chunk, len(recs))
		if err := scenario.Produce(ctx, cl, topic, recs[i:done]); err != nil {
			return err
		}
		if time.Since(last) >= progressEvery && done < len(recs) {
			last = time.Now()
			fmt.Fprintf(progress, "  produced %d/%d records (%.0f%%)\n", done, len(recs), 100*float64(done)/float64(len(recs)))
		}
	}
	return nil
}

// WaitCommitted waits until group has committed the end of topic on the
// cluster adm administers (in process or not), printing
// to progress every two seconds how many of its total records the group has
// committed (offsets are record counts: the input is produced without
// transactions) and the rate since since. It returns the steady-state
// rate in records/s: the slope of the committed offsets, sampled every
// 250ms, between the first sample past 10% of total and the last one short
// of 90%, which leaves out the group join and the final commit intervals
// (0 when there are not two such samples).
func WaitCommitted(ctx context.Context, adm *kadm.Client, group, topic string, total int, since time.Time, progress io.Writer) (float64, error) {
	caught := make(chan error, 1)
	go func() { caught <- scenario.WaitCaughtUp(ctx, adm, group, topic) }()
	type sample struct {
		at time.Time
		n  int64
	}
	var samples []sample
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	lastPrint := time.Now()
	for {
		select {
		case err := <-caught:
			if err != nil {
				return 0, err
			}
			lo, hi := -1, -1
			for i, s := range samples {
				if lo < 0 && s.n >= int64(total)/10 {
					lo = i
				}
				if s.n <= int64(total)*9/10 {
					hi = i
				}
			}
			if lo < 0 || hi <= lo || samples[hi].n == samples[lo].n {
				return 0, nil
			}
			return float64(samples[hi].n-samples[lo].n) / samples[hi].at.Sub(samples[lo].at).Seconds(), nil
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
			samples = append(samples, sample{time.Now(), n})
			if time.Since(lastPrint) >= progressEvery {
				lastPrint = time.Now()
				fmt.Fprintf(progress, "  %s: %d/%d records committed (%.0f%%), %.0f records/s so far\n",
					group, n, total, 100*float64(n)/float64(total), float64(n)/time.Since(since).Seconds())
			}
		}
	}
}

// Worker is the real worker running in this process (app.Run).
type Worker struct {
	// Started is when StartWorker was called, ReadyAt when /readyz first
	// answered 200: the group was joined and the partitions' state opened.
	Started, ReadyAt time.Time
	// Registry holds the worker's metrics.
	Registry *prometheus.Registry

	stop context.CancelFunc
	done chan error
}

// StartWorker runs the worker with cfg until Stop or ctx ends, and returns
// once it is ready. An error is returned, and nothing left running, when
// the worker stops before it is ready.
func StartWorker(ctx context.Context, cfg config.Config, log *slog.Logger) (*Worker, error) {
	wctx, stop := context.WithCancel(ctx)
	w := &Worker{Started: time.Now(), Registry: prometheus.NewRegistry(), stop: stop, done: make(chan error, 1)}
	addr := make(chan string, 1)
	go func() { w.done <- app.Run(wctx, cfg, log, w.Registry, func(a string) { addr <- a }) }()
	select {
	case a := <-addr:
		readyAt, err := WaitReady(ctx, a, w.done)
		if err != nil {
			stop()
			return nil, err
		}
		w.ReadyAt = readyAt
		return w, nil
	case err := <-w.done:
		stop()
		return nil, fmt.Errorf("worker stopped before listening: %w", err)
	}
}

// Stop stops the worker and returns what app.Run returned.
func (w *Worker) Stop() error {
	w.stop()
	if err := <-w.done; err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	return nil
}

// WaitReady polls http://addr/readyz every 20ms until it answers 200 and
// returns when it did; it returns an error when done delivers first (the
// worker stopped) or ctx ends.
func WaitReady(ctx context.Context, addr string, done <-chan error) (time.Time, error) {
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
			if err == nil {
				err = errors.New("stopped without an error")
			}
			return time.Time{}, fmt.Errorf("worker stopped before it was ready: %w", err)
		case <-ctx.Done():
			return time.Time{}, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// CloneRecords copies recs (key, value, headers, timestamp, and the
// partition a manual partitioner reads) so that producing the copies,
// which sets topic, partition and offset, leaves the originals reusable.
func CloneRecords(recs []*kgo.Record) []*kgo.Record {
	out := make([]*kgo.Record, len(recs))
	for i, r := range recs {
		out[i] = &kgo.Record{Key: r.Key, Value: r.Value, Headers: r.Headers, Timestamp: r.Timestamp, Partition: r.Partition}
	}
	return out
}
