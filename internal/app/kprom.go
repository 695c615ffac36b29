package app

import (
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/twmb/franz-go/plugin/kprom"
)

// clientMetrics returns the franz-go client metrics hook (plugin/kprom,
// names prefixed kdedup_), exported through reg. kprom registers them in a
// registry of their own, which reg gathers with two renames: kprom names
// its buffered-records gauges like counters (_total), which promlint and
// the Prometheus naming conventions reject.
func clientMetrics(reg prometheus.Registerer) *kprom.Metrics {
	own := prometheus.NewRegistry()
	reg.MustRegister(renamingCollector{g: own, names: map[string]string{
		"kdedup_buffered_fetch_records_total":   "kdedup_buffered_fetch_records",
		"kdedup_buffered_produce_records_total": "kdedup_buffered_produce_records",
	}})
	return kprom.NewMetrics("kdedup", kprom.Registerer(own), kprom.Gatherer(own))
}

// renamingCollector re-exports what g gathers, with the families in names
// renamed. It is unchecked (describes nothing): the families come and go
// with the Kafka client (kprom unregisters them when a client closes).
type renamingCollector struct {
	g     prometheus.Gatherer
	names map[string]string
}

func (renamingCollector) Describe(chan<- *prometheus.Desc) {}

func (c renamingCollector) Collect(ch chan<- prometheus.Metric) {
	mfs, err := c.g.Gather()
	if err != nil {
		ch <- prometheus.NewInvalidMetric(prometheus.NewDesc("kdedup_client_metrics", "franz-go client metrics", nil, nil), err)
		return
	}
	for _, mf := range mfs {
		name := mf.GetName()
		if n, ok := c.names[name]; ok {
			name = n
		}
		for _, m := range mf.GetMetric() {
			if pm, err := constMetric(name, mf.GetHelp(), mf.GetType(), m); err != nil {
				ch <- prometheus.NewInvalidMetric(prometheus.NewDesc(name, mf.GetHelp(), nil, nil), err)
			} else if pm != nil {
				ch <- pm
			}
		}
	}
}

// constMetric rebuilds m of a family named name as a constant metric; nil
// for types kprom does not export (summaries).
func constMetric(name, help string, typ dto.MetricType, m *dto.Metric) (prometheus.Metric, error) {
	var labels, values []string
	for _, l := range m.GetLabel() {
		labels = append(labels, l.GetName())
		values = append(values, l.GetValue())
	}
	desc := prometheus.NewDesc(name, help, labels, nil)
	switch typ {
	case dto.MetricType_COUNTER:
		return prometheus.NewConstMetric(desc, prometheus.CounterValue, m.GetCounter().GetValue(), values...)
	case dto.MetricType_GAUGE:
		return prometheus.NewConstMetric(desc, prometheus.GaugeValue, m.GetGauge().GetValue(), values...)
	case dto.MetricType_UNTYPED:
		return prometheus.NewConstMetric(desc, prometheus.UntypedValue, m.GetUntyped().GetValue(), values...)
	case dto.MetricType_HISTOGRAM:
		h := m.GetHistogram()
		buckets := make(map[float64]uint64, len(h.GetBucket()))
		for _, b := range h.GetBucket() {
			buckets[b.GetUpperBound()] = b.GetCumulativeCount()
		}
		return prometheus.NewConstHistogram(desc, h.GetSampleCount(), h.GetSampleSum(), buckets, values...)
	}
	return nil, nil
}
