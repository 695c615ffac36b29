package harness

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/http/pprof"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// TestScrape: Scrape sums each family's samples over their labels as the
// worker's registry serves them (a histogram's sum and count under _sum
// and _count), leaves out families not exported, and
// fails on a server that does not serve metrics.
func TestScrape(t *testing.T) {
	reg := prometheus.NewRegistry()
	records := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kdedup_records_total"}, []string{"topic", "partition"})
	ready := prometheus.NewGauge(prometheus.GaugeOpts{Name: "kdedup_worker_ready"})
	lat := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "kdedup_commit_seconds"})
	unused := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kdedup_unused_total"}, []string{"topic"})
	reg.MustRegister(records, ready, lat, unused)
	records.WithLabelValues("in", "0").Add(3)
	records.WithLabelValues("in", "1").Add(4.5)
	records.WithLabelValues(`odd "topic" {x}`, "2").Add(0.25)
	ready.Set(1)
	lat.Observe(2)
	lat.Observe(0.5)
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://")

	got, err := Scrape(context.Background(), addr)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]float64{"kdedup_records_total": 7.75, "kdedup_worker_ready": 1, "kdedup_commit_seconds": 0,
		"kdedup_commit_seconds_sum": 2.5, "kdedup_commit_seconds_count": 2}
	for name, v := range want {
		if g, ok := got[name]; !ok || g != v {
			t.Errorf("%s = %v (exported %v), want %v", name, g, ok, v)
		}
	}
	if v, ok := got["kdedup_unused_total"]; ok {
		t.Errorf("a family with no samples scraped as %v", v)
	}
	if len(got) != len(want) {
		t.Errorf("scraped %d families, want %d: %v", len(got), len(want), got)
	}

	notFound := httptest.NewServer(http.NotFoundHandler())
	defer notFound.Close()
	if _, err := Scrape(context.Background(), strings.TrimPrefix(notFound.URL, "http://")); err == nil || !strings.Contains(err.Error(), "404") {
		t.Errorf("a server answering 404: %v, want an error naming the status", err)
	}
	garbage := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("kdedup_records_total{topic=\"in\" 3\n"))
	}))
	defer garbage.Close()
	if _, err := Scrape(context.Background(), strings.TrimPrefix(garbage.URL, "http://")); err == nil {
		t.Error("a body that is not the text format scraped without an error")
	}
}

// TestWorkerEnv: the worker's environment has none of this process's
// KDEDUP_ variables, keeps the others and adds the given ones.
func TestWorkerEnv(t *testing.T) {
	t.Setenv("KDEDUP_TEST_KAFKA", "apache")
	t.Setenv("BENCHENV_KEPT", "yes")
	env := WorkerEnv("KDEDUP_BROKERS=b:9092")
	if slices.Contains(env, "KDEDUP_TEST_KAFKA=apache") {
		t.Error("KDEDUP_TEST_KAFKA passed to the worker")
	}
	if !slices.Contains(env, "BENCHENV_KEPT=yes") || !slices.Contains(env, "KDEDUP_BROKERS=b:9092") {
		t.Errorf("environment %v lacks BENCHENV_KEPT or the added KDEDUP_BROKERS", env)
	}
}

// TestFetchCPUProfile: the profile a pprof server writes lands in the file
// (gzip-compressed protobuf), and an error status is an error.
func TestFetchCPUProfile(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	srv := httptest.NewServer(mux)
	defer srv.Close()
	file := filepath.Join(t.TempDir(), "cpu.prof")
	if err := FetchCPUProfile(context.Background(), strings.TrimPrefix(srv.URL, "http://"), time.Second, file); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) < 2 || b[0] != 0x1f || b[1] != 0x8b {
		t.Fatalf("profile file of %d bytes is not gzip", len(b))
	}
	notFound := httptest.NewServer(http.NotFoundHandler())
	defer notFound.Close()
	if err := FetchCPUProfile(context.Background(), strings.TrimPrefix(notFound.URL, "http://"), time.Second, file); err == nil || !strings.Contains(err.Error(), "404") {
		t.Errorf("a server answering 404: %v, want an error naming the status", err)
	}
}
