package tests

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	dto "github.com/prometheus/client_model/go"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kdedup/kdedup/internal/scenario"
)

// metricConfig is a worker configuration and input under which the
// worker exports some of its metrics; metricConfigs together export all
// of them (transactions only exactly once, the window's watermark only
// with a window, the target rate only when widths derive from it).
type metricConfig struct {
	name  string
	setup func(t *testing.T, p *pipeline)
	input func() []*kgo.Record
}

var metricConfigs = []metricConfig{
	{name: "at-least-once", setup: func(*testing.T, *pipeline) {}, input: func() []*kgo.Record { return stream(1) }},
	{name: "exactly-once-window-target-fpr-snapshots", setup: func(t *testing.T, p *pipeline) {
		p.delivery = "exactly-once"
		p.window = scenario.ExpectOptions{Window: 6 * time.Second, Generations: 3, Refresh: true}
		p.extraEnv = map[string]string{"KDEDUP_FINGERPRINT_BITS": "0"} // widths from KDEDUP_TARGET_FPR
		p.withSnapshots(t)
	}, input: func() []*kgo.Record { return windowStream(5)[:3000] }},
}

// gatherRunning runs a worker over recs until the group has committed them
// all and returns what its registry exports while it still runs (a
// partition's gauges go when it is released), with the worker.
func (p *pipeline) gatherRunning(t *testing.T, recs []*kgo.Record) ([]*dto.MetricFamily, *worker) {
	t.Helper()
	p.feed(t, recs, len(recs), 0).wait(t)
	w := p.startWorker(t, t.TempDir())
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := scenario.WaitCaughtUp(ctx, p.b.admin(t), p.group, p.in); err != nil {
		t.Fatal(err)
	}
	w.running(t)
	mfs, err := w.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	return mfs, w
}

func family(mfs []*dto.MetricFamily, name string) *dto.MetricFamily {
	i := slices.IndexFunc(mfs, func(mf *dto.MetricFamily) bool { return mf.GetName() == name })
	if i < 0 {
		return nil
	}
	return mfs[i]
}

// TestMetricsPromlint gathers every metric a running worker exports, in
// each of metricConfigs, and fails on any problem promlint finds (naming,
// units, suffixes, help). It also checks what the new observation points
// report once the input is consumed: every partition's lag is 0 and,
// at least once, the write batches covered every record.
func TestMetricsPromlint(t *testing.T) {
	for _, c := range metricConfigs {
		t.Run(c.name, func(t *testing.T) {
			p := newPipeline(t, 2)
			c.setup(t, p)
			recs := c.input()
			mfs, _ := p.gatherRunning(t, recs)
			problems, err := promlint.NewWithMetricFamilies(mfs).Lint()
			if err != nil {
				t.Fatal(err)
			}
			for _, pr := range problems {
				t.Errorf("promlint: %s: %s", pr.Metric, pr.Text)
			}
			t.Logf("%d metric families, %d promlint problems", len(mfs), len(problems))

			lag := family(mfs, "kdedup_consumer_lag_records")
			if n := len(lag.GetMetric()); n != int(p.partitions) {
				t.Errorf("kdedup_consumer_lag_records has %d series, want one per partition (%d)", n, p.partitions)
			}
			for _, m := range lag.GetMetric() {
				if v := m.GetGauge().GetValue(); v != 0 {
					t.Errorf("kdedup_consumer_lag_records%v = %v once the group committed the whole input, want 0", m.GetLabel(), v)
				}
			}
			if ready := family(mfs, "kdedup_worker_ready"); ready.GetMetric()[0].GetGauge().GetValue() != 1 {
				t.Error("kdedup_worker_ready is not 1 while the worker owns its partitions")
			}
			switch p.delivery {
			case "at-least-once":
				h := family(mfs, "kdedup_write_batch_records").GetMetric()[0].GetHistogram()
				if h.GetSampleSum() != float64(len(recs)) {
					t.Errorf("kdedup_write_batch_records sums to %v over %d batches, want every record (%d)", h.GetSampleSum(), h.GetSampleCount(), len(recs))
				}
			case "exactly-once":
				target := family(mfs, "kdedup_filter_target_fpr")
				if n := len(target.GetMetric()); n != int(p.partitions) || target.GetMetric()[0].GetGauge().GetValue() != 1e-4 {
					t.Errorf("kdedup_filter_target_fpr: %d series (want %d) of %v (want the default 1e-4)", n, p.partitions, target.GetMetric())
				}
				if h := family(mfs, "kdedup_transaction_commit_seconds").GetMetric()[0].GetHistogram(); h.GetSampleCount() == 0 {
					t.Error("kdedup_transaction_commit_seconds observed no commit")
				}
			}
		})
	}
}
