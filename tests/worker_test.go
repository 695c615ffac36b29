package tests

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kdedup/kdedup/config"
	"github.com/kdedup/kdedup/filter"
	"github.com/kdedup/kdedup/internal/app"
	"github.com/kdedup/kdedup/internal/benchenv"
	"github.com/kdedup/kdedup/internal/scenario"
)

// pipeline names one dedup job: its topics, group and worker settings.
type pipeline struct {
	b          *broker
	in, out    string
	group      string
	partitions int32
	delivery   string                 // KDEDUP_DELIVERY, default at-least-once
	maxOcc     int                    // KDEDUP_MAX_OCCURRENCES, 0 for the default
	dups       string                 // KDEDUP_DUPLICATES_TOPIC, "" for none
	repart     string                 // KDEDUP_REPARTITION_TOPIC, "" for none
	manual     bool                   // feed produces each record to the partition it names
	window     scenario.ExpectOptions // KDEDUP_WINDOW, _GENERATIONS, _REFRESH (only those fields)
	extraEnv   map[string]string      // overrides of env
	appOpts    []app.Option           // options of in-process workers
}

func newPipeline(t *testing.T, partitions int32) *pipeline {
	b := newBroker(t)
	p := &pipeline{b: b, in: b.name("in"), out: b.name("out"), group: b.name("group"), partitions: partitions, delivery: "at-least-once"}
	b.createTopics(t, partitions, p.in, p.out)
	return p
}

// withDuplicatesTopic creates a duplicates topic of the given partitions
// and has the workers send dropped records to it.
func (p *pipeline) withDuplicatesTopic(t *testing.T, partitions int32) {
	t.Helper()
	p.dups = p.b.name("dups")
	p.b.createTopics(t, partitions, p.dups)
}

// deliveries runs fn as a subtest for each delivery mode.
func deliveries(t *testing.T, fn func(t *testing.T, delivery string)) {
	for _, d := range []string{"at-least-once", "exactly-once"} {
		t.Run(d, func(t *testing.T) { fn(t, d) })
	}
}

// env is the worker configuration the suites use: 32-bit fingerprints (29
// beside a window's 3-bit generation tag) so a false drop is improbable
// (the model is exact), a small capacity so that
// chains expand, a short flush interval and session timeout.
func (p *pipeline) env(dataDir string) map[string]string {
	env := map[string]string{
		"KDEDUP_BROKERS":          strings.Join(p.b.addrs, ","),
		"KDEDUP_INPUT_TOPICS":     p.in,
		"KDEDUP_OUTPUT_TOPIC":     p.out,
		"KDEDUP_GROUP":            p.group,
		"KDEDUP_DATA_DIR":         dataDir,
		"KDEDUP_HTTP_ADDR":        "127.0.0.1:0",
		"KDEDUP_FINGERPRINT_BITS": "32",
		"KDEDUP_CAPACITY":         "2000",
		"KDEDUP_FLUSH_INTERVAL":   "100ms",
		"KDEDUP_SESSION_TIMEOUT":  "3s",
		"KDEDUP_DELIVERY":         p.delivery,
		"KDEDUP_LOG_LEVEL":        "warn",
		"KDEDUP_LOG_FORMAT":       "text",
	}
	if p.maxOcc != 0 {
		env["KDEDUP_MAX_OCCURRENCES"] = strconv.Itoa(p.maxOcc)
	}
	if p.dups != "" {
		env["KDEDUP_DUPLICATES_TOPIC"] = p.dups
	}
	if p.repart != "" {
		env["KDEDUP_REPARTITION_TOPIC"] = p.repart
	}
	if p.window.Window != 0 {
		env["KDEDUP_WINDOW"] = p.window.Window.String()
		env["KDEDUP_WINDOW_GENERATIONS"] = strconv.Itoa(p.window.Generations)
		env["KDEDUP_WINDOW_REFRESH"] = strconv.FormatBool(p.window.Refresh)
		// The widest fingerprints beside the generation tag a slot holds.
		tag := filter.Params{Window: p.window.Window, Generations: p.window.Generations}.GenerationBits()
		env["KDEDUP_FINGERPRINT_BITS"] = strconv.Itoa(filter.MaxFingerprintBits - tag)
	}
	for k, v := range p.extraEnv {
		env[k] = v
	}
	return env
}

// worker is a kdedup worker running in this process.
type worker struct {
	cancel context.CancelFunc
	done   chan error
	reg    *prometheus.Registry
}

func (p *pipeline) startWorker(t *testing.T, dataDir string) *worker {
	t.Helper()
	cfg, err := config.LoadFrom(p.env(dataDir))
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: cfg.SlogLevel()}))
	ctx, cancel := context.WithCancel(context.Background())
	w := &worker{cancel: cancel, done: make(chan error, 1), reg: prometheus.NewRegistry()}
	go func() { w.done <- app.Run(ctx, cfg, log, w.reg, nil, p.appOpts...) }()
	t.Cleanup(func() { w.cancel(); <-w.done })
	return w
}

// running fails the test if the worker has stopped.
func (w *worker) running(t *testing.T) {
	t.Helper()
	select {
	case err := <-w.done:
		w.done <- err
		t.Fatalf("worker stopped: %v", err)
	default:
	}
}

// metric sums the samples of a counter or gauge of the worker.
func (w *worker) metric(t *testing.T, name string) float64 {
	t.Helper()
	return benchenv.Gathered(t, w.reg, name)
}

// stop shuts the worker down gracefully and fails the test on its error.
func (w *worker) stop(t *testing.T) {
	t.Helper()
	w.cancel()
	select {
	case err := <-w.done:
		w.done <- nil // for the cleanup
		if err != nil {
			t.Fatalf("worker stopped with %v", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("worker did not stop within 60s")
	}
}

// process is a kdedup worker running as a child process, to be killed.
type process struct {
	cmd *exec.Cmd
	log string
}

var httpAddrRE = regexp.MustCompile(`http=(\S+)`)

// logText returns what the process has logged so far.
func (p *process) logText(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(p.log)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// waitReady waits until the worker answers /readyz with 200: it has joined
// the group and opened its partitions' state. (Killing a member in the
// middle of its first join leaves kfake with a member that never expires.)
func (p *process) waitReady(t *testing.T) {
	t.Helper()
	addr := p.httpAddr(t)
	for range 3000 {
		if resp, err := http.Get("http://" + addr + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatal("worker not ready within 60s")
}

// httpAddr waits for the start-up log line (LOG_LEVEL=info) and returns the
// HTTP address the worker listens on.
func (p *process) httpAddr(t *testing.T) string {
	t.Helper()
	for range 500 {
		b, _ := os.ReadFile(p.log)
		if m := httpAddrRE.FindSubmatch(b); m != nil {
			return string(m[1])
		}
		time.Sleep(20 * time.Millisecond)
	}
	b, _ := os.ReadFile(p.log)
	t.Fatalf("no http address in the worker's log:\n%s", b)
	return ""
}

// startProcess starts the binary with the pipeline's environment; extraEnv
// (VAR=value) overrides it. The test's own KDEDUP_* variables
// (KDEDUP_TEST_BROKERS, ...) are not passed: the worker refuses variables
// it does not know.
func (p *pipeline) startProcess(t *testing.T, dataDir string, extraEnv ...string) *process {
	t.Helper()
	cmd := exec.Command(binary, "run")
	cmd.Env = slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, config.Prefix) })
	for k, v := range maps.All(p.env(dataDir)) {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.Env = append(cmd.Env, extraEnv...)
	logf, err := os.Create(filepath.Join(t.TempDir(), "worker.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pr := &process{cmd: cmd, log: logf.Name()}
	t.Cleanup(func() {
		pr.kill()
		logf.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logf.Name())
			t.Logf("log of worker process %d:\n%s", cmd.Process.Pid, b)
		}
	})
	return pr
}

// kill sends SIGKILL: no final write batch, no group commit, no leave.
func (p *process) kill() {
	if p.cmd.ProcessState == nil {
		_ = p.cmd.Process.Kill()
		_ = p.cmd.Wait()
	}
}

// feeder produces a stream in chunks in the background, so that workers
// start, stop and die while input keeps arriving.
type feeder struct {
	wg       sync.WaitGroup
	err      error
	produced chan int // receives the running count after each chunk
	pause    atomic.Int64
}

// hurry makes the feeder produce the rest without pausing.
func (f *feeder) hurry() { f.pause.Store(0) }

func (p *pipeline) feed(t *testing.T, recs []*kgo.Record, chunk int, pause time.Duration) *feeder {
	var opts []kgo.Opt
	if p.manual {
		opts = append(opts, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	}
	cl := p.b.client(t, opts...)
	f := &feeder{produced: make(chan int, len(recs)/chunk+1)}
	f.pause.Store(int64(pause))
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		defer close(f.produced)
		for i := 0; i < len(recs); i += chunk {
			if err := scenario.Produce(context.Background(), cl, p.in, recs[i:min(i+chunk, len(recs))]); err != nil {
				f.err = err
				return
			}
			f.produced <- min(i+chunk, len(recs))
			time.Sleep(time.Duration(f.pause.Load()))
		}
	}()
	return f
}

// until waits until at least n records were produced.
func (f *feeder) until(n int) {
	for c := range f.produced {
		if c >= n {
			return
		}
	}
}

func (f *feeder) wait(t *testing.T) {
	t.Helper()
	for range f.produced {
	}
	f.wg.Wait()
	if f.err != nil {
		t.Fatal(f.err)
	}
}

// output waits until the group has committed the whole input, then reads
// the output topic and returns it with the exact model of the input.
func (p *pipeline) output(t *testing.T, recs []*kgo.Record) (want, got scenario.Model) {
	t.Helper()
	want, got, _ = p.outputRecords(t, recs)
	return want, got
}

// outputRecords is output with the records read from the output topic.
func (p *pipeline) outputRecords(t *testing.T, recs []*kgo.Record) (want, got scenario.Model, out []*kgo.Record) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := scenario.WaitCaughtUp(ctx, p.b.admin(t), p.group, p.in); err != nil {
		t.Fatal(err)
	}
	if p.repart != "" {
		p.waitRepartitioned(t, ctx)
	}
	out, err := scenario.ReadAll(ctx, p.b.addrs, p.out, p.b.conn...)
	if err != nil {
		t.Fatal(err)
	}
	want, _ = p.expect(recs)
	return want, scenario.Observe(out), out
}

// dropped reads the duplicates topic, once output has seen the group
// commit the whole input, and returns it with the model's dropped records.
func (p *pipeline) dropped(t *testing.T, recs []*kgo.Record) (want, got scenario.Model, read []*kgo.Record) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	read, err := scenario.ReadAll(ctx, p.b.addrs, p.dups, p.b.conn...)
	if err != nil {
		t.Fatal(err)
	}
	_, want = p.expect(recs)
	return want, scenario.Observe(read), read
}

// expect is the exact model of recs with the pipeline's settings.
func (p *pipeline) expect(recs []*kgo.Record) (out, dropped scenario.Model) {
	return scenario.ExpectWith(recs, scenario.ExpectOptions{MaxOccurrences: p.maxOcc,
		Window: p.window.Window, Generations: p.window.Generations, Refresh: p.window.Refresh})
}

// waitMembers waits until the group is stable with n members that each own
// at least one partition.
func (p *pipeline) waitMembers(t *testing.T, n int) {
	t.Helper()
	adm := p.b.admin(t)
	deadline := time.Now().Add(60 * time.Second)
	last := "nothing described"
	for time.Now().Before(deadline) {
		groups, err := adm.DescribeGroups(context.Background(), p.group)
		if err == nil {
			g := groups[p.group]
			last = fmt.Sprintf("state %s, %d members", g.State, len(g.Members))
			for _, m := range g.Members {
				if a, ok := m.Assigned.AsConsumer(); ok {
					last += fmt.Sprintf("; %s owns %v", m.MemberID, a.Topics)
				}
			}
			owning := 0
			for _, m := range g.Members {
				if a, ok := m.Assigned.AsConsumer(); ok && len(a.Topics) > 0 && len(a.Topics[0].Partitions) > 0 {
					owning++
				}
			}
			if g.State == "Stable" && owning == n {
				return
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("group %s did not reach %d members owning partitions: %s", p.group, n, last)
}
