// Package harness holds what the benchmarks need of a worker run as a
// child process (`kdedup run`): a free address for its HTTP server, its
// environment, and its metrics and CPU profile read over that server; and
// the worker-level benchmarks themselves (BenchmarkReplay,
// BenchmarkRestoreMemory). The in-process broker and worker are in
// internal/embedded. It is a benchmark rig: the product binary must not
// import it.
package harness

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/kdedup/kdedup/config"
	"github.com/kdedup/kdedup/internal/benchenv"
)

// What a benchmark or test needs of a worker it runs as a child process
// (`kdedup run`): an address for its HTTP server, its environment, its
// metrics and its CPU profile, read over that server. They live here, not
// in benchenv, because WorkerEnv needs config, whose imports (the
// consumer, franz-go) would add about 25 MiB of resident memory to every
// store and filter benchmark binary that imports benchenv, and so to the
// peaks those benchmarks report.

// FreeAddr returns a loopback address (host:port) whose port was free at
// the moment, for a worker's KDEDUP_HTTP_ADDR.
func FreeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// WorkerEnv is the environment of a worker process: this process's without
// its KDEDUP_* variables (a test's KDEDUP_TEST_KAFKA, say, which the worker
// would refuse as unknown), with vars (NAME=value) added.
func WorkerEnv(vars ...string) []string {
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, config.Prefix) })
	return append(env, vars...)
}

// Scrape reads the metrics the worker serving HTTP at addr exports on
// /metrics (Prometheus text format, parsed by prometheus/common's expfmt)
// and returns, for each metric family, the sum of its samples over their
// labels: counters', gauges' and untyped metrics' values (a histogram or
// summary sums to 0; a histogram's sum and count are also under its name
// with _sum and _count, as the text format names them). A family the
// worker does not export is absent from the map. Errors: the request's, a
// status other than 200, a body that is not the text format.
func Scrape(ctx context.Context, addr string) (map[string]float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("reading the worker's metrics: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("reading the worker's metrics: %s", resp.Status)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("reading the worker's metrics: %w", err)
	}
	sums := make(map[string]float64, len(mfs))
	for name, mf := range mfs {
		sums[name] = benchenv.FamilySum(mf)
		if mf.GetType() == dto.MetricType_HISTOGRAM {
			for _, m := range mf.GetMetric() {
				sums[name+"_sum"] += m.GetHistogram().GetSampleSum()
				sums[name+"_count"] += float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return sums, nil
}

// FetchCPUProfile writes to file the CPU profile of the worker serving HTTP
// at addr with KDEDUP_PPROF=true, taken over the next d (whole seconds, at
// least one; the worker's HTTP server ends a response after 30 s, so d
// should be shorter). It returns when the profile is written.
func FetchCPUProfile(ctx context.Context, addr string, d time.Duration, file string) error {
	url := fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", addr, max(1, int(d.Seconds())))
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("profiling the worker process: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("profiling the worker process: %s: %s", resp.Status, msg)
	}
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	_, err = io.Copy(f, resp.Body)
	return errors.Join(err, f.Close())
}
