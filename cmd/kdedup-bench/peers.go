package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kdedup/kdedup/config"
	"github.com/kdedup/kdedup/consumer"
	"github.com/kdedup/kdedup/internal/app"
	"github.com/kdedup/kdedup/internal/benchenv"
	"github.com/kdedup/kdedup/internal/embedded"
	"github.com/kdedup/kdedup/internal/harness"
	"github.com/kdedup/kdedup/internal/scenario"
)

// peersCmd measures the worker's throughput against a stateless passthrough
// on one in-process broker (franz-go's kfake): it produces a generated
// stream once, then, for each round, runs the real worker and a franz-go
// consumer that forwards every record at least once with the worker's client
// settings (in alternating order), each in its own consumer group and to its
// own output topic, and prints records/s for both and their ratio. A run's
// time is from its group join to the group's commit of the end of the
// input, so it includes up to two commit intervals (1s each) of waiting.
// With -broker apache it compares kdedup, the passthrough and a Kafka
// Streams deduplicator as processes on Apache Kafka instead (benchPeers).
func peersCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("peers", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o benchOptions
	fs.IntVar(&o.records, "records", 1_000_000, "records produced to the input topic")
	fs.IntVar(&o.partitions, "partitions", 4, "partitions of the input and output topics")
	fs.IntVar(&o.rounds, "rounds", 1, "rounds of worker then passthrough; the summary takes the median")
	fs.IntVar(&o.bits, "fingerprint-bits", 0, "KDEDUP_FINGERPRINT_BITS of the worker (0: the default)")
	fs.BoolVar(&o.process, "worker-process", false, "run the worker as a child process (kdedup run) and report its peak resident memory")
	fs.StringVar(&o.cacheBytes, "cache-bytes", "", "KDEDUP_CACHE_BYTES of the worker (empty: the default)")
	o.workerVars = map[string]string{}
	fs.Func("env", "`KDEDUP_NAME=value` set for the worker, such as KDEDUP_MEMORY_BYTES=1843MiB or KDEDUP_CAPACITY=50000000; repeatable", func(kv string) error {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || !strings.HasPrefix(k, config.Prefix) {
			return fmt.Errorf("-env %q: want %sNAME=value", kv, config.Prefix)
		}
		o.workerVars[k] = v
		return nil
	})
	fs.StringVar(&o.cpuProfile, "cpu-profile", "", "write a CPU profile to `file` while the worker runs: of this process with the in-process worker (the broker's work is in it too), or of the worker process alone with -worker-process or -broker apache (KDEDUP_PPROF, for -profile-time from its group join; with -broker apache one file per run of kdedup, file-kdedup-<alo|eos>-<round>)")
	fs.DurationVar(&o.profileTime, "profile-time", 5*time.Second, "with -worker-process and -cpu-profile: how long the worker process's CPU profile runs, from its group join (at most 29s; keep it under the run)")
	fs.StringVar(&o.heapProfile, "heap-profile", "", "write a heap profile of this process to `file` once the (in-process) worker has caught up; the broker's records are in it too")
	fs.StringVar(&o.broker, "broker", "kfake", "kfake: worker and passthrough on an in-process broker; apache: kdedup, the passthrough and a Kafka Streams deduplicator, each as its own process, on one Apache Kafka broker (needs Java 17 and Maven; see BENCHMARKS.md)")
	peers := fs.String("peers", "kdedup,passthrough,kstreams", "with -broker apache: the systems to run, in the first step's order (kdedup, passthrough, kstreams)")
	deliveries := fs.String("delivery", "at-least-once,exactly-once", "with -broker apache: the delivery modes to run each system in")
	fs.BoolVar(&o.repartition, "repartition", false, "with -broker apache: the spread stream (events keyed by a JSON field, sent by producers that partition them apart), deduplicated across partitions: kdedup through KDEDUP_REPARTITION_TOPIC, Kafka Streams with selectKey on the field, repartition() and its dedup processor; add kdedup-local to -peers for kdedup without the hop (within each partition)")
	fs.DurationVar(&o.window, "window", 0, "with -broker apache: KDEDUP_WINDOW of kdedup and the Kafka Streams window store's retention (0: a key-value store, no window)")
	fs.StringVar(&o.kstreamsDir, "kstreams-dir", "bench/kstreams-peer", "with -broker apache: the Maven module of the Kafka Streams deduplicator, built with mvn -q -B package")
	fs.StringVar(&o.kstreamsHeap, "kstreams-heap", "512m", "with -broker apache: the Kafka Streams JVM's -Xmx")
	fs.IntVar(&o.kstreamsThreads, "kstreams-threads", 1, "with -broker apache: num.stream.threads of the Kafka Streams deduplicator")
	fs.StringVar(&o.kdedupBin, "kdedup", "", "with -worker-process or -broker apache: the kdedup `binary` the worker processes run (empty: built from ./cmd/kdedup with go build into a temporary directory)")
	child := fs.Bool("passthrough-child", false, "internal: run the passthrough in this process for -broker apache (with -brokers, -group, -out, -delivery)")
	childBrokers := fs.String("brokers", "", "internal: -passthrough-child's seed brokers")
	childGroup := fs.String("group", "", "internal: -passthrough-child's consumer group")
	childOut := fs.String("out", "", "internal: -passthrough-child's output topic")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	if o.records < 1 || o.partitions < 1 || o.rounds < 1 {
		return fmt.Errorf("%w: -records, -partitions and -rounds must be at least 1", errUsage)
	}
	if *child {
		return passthroughChild(ctx, strings.Split(*childBrokers, ","), *childGroup, *childOut, *deliveries)
	}
	if o.broker != "kfake" && o.broker != "apache" {
		return fmt.Errorf("%w: -broker must be kfake or apache, not %q", errUsage, o.broker)
	}
	if o.broker == "apache" {
		o.peers, o.deliveries = strings.Split(*peers, ","), strings.Split(*deliveries, ",")
		if err := checkPeers(o); err != nil {
			return err
		}
	}
	if o.broker == "apache" || o.process {
		bin, cleanup, err := kdedupBinary(ctx, o.kdedupBin, stdout)
		if err != nil {
			return err
		}
		defer cleanup()
		o.kdedupBin = bin
	}
	if o.broker == "apache" {
		return benchPeers(ctx, o, stdout)
	}
	const in = "events"
	cluster, err := embedded.NewCluster(o.partitions, in)
	if err != nil {
		return err
	}
	defer cluster.Close()
	o.brokers, o.adm = cluster.Brokers, cluster.Admin

	_, keys, err := produceBench(ctx, o, in, stdout)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "stream: %d records, %d distinct keys, %d partitions; GOMAXPROCS %d\n", o.records, keys, o.partitions, runtime.GOMAXPROCS(0))

	type runner struct {
		name          string
		rates, steady *[]float64
		fn            func(context.Context, benchOptions, string, string, io.Writer) (runResult, error)
	}
	var worker, pass, workerSteady, passSteady []float64
	for round := 1; round <= o.rounds; round++ {
		runs := []runner{{"worker", &worker, &workerSteady, runWorker}, {"passthrough", &pass, &passSteady, runPassthrough}}
		if round%2 == 0 { // alternate the order, so that neither always runs on a fresher broker
			runs[0], runs[1] = runs[1], runs[0]
		}
		for _, run := range runs {
			group := fmt.Sprintf("%s-%d", run.name, round)
			if _, err := o.adm.CreateTopic(ctx, int32(o.partitions), 1, nil, group+"-out"); err != nil {
				return fmt.Errorf("creating %s-out: %w", group, err)
			}
			fmt.Fprintf(stdout, "round %d: %s (group %s) ...\n", round, run.name, group)
			res, err := run.fn(ctx, o, group, group+"-out", stdout)
			if err != nil {
				return fmt.Errorf("%s: %w", run.name, err)
			}
			rate := float64(o.records) / res.elapsed.Seconds()
			*run.rates = append(*run.rates, rate)
			*run.steady = append(*run.steady, res.steady)
			fmt.Fprintf(stdout, "round %d: %s: %d records in %s: %.0f records/s\n", round, run.name, o.records, res.elapsed.Round(time.Millisecond), rate)
			fmt.Fprintf(stdout, "  steady state (committed offsets from 10%% to 90%% of the input): %.0f records/s\n", res.steady)
			if ends, err := o.adm.ListEndOffsets(ctx, group+"-out"); err == nil {
				var n int64
				ends.Each(func(e kadm.ListedOffset) { n += e.Offset })
				fmt.Fprintf(stdout, "  %s-out holds %d records\n", group, n)
			}
			// The broker keeps records in memory: drop the output.
			if _, err := o.adm.DeleteTopic(ctx, group+"-out"); err != nil {
				return fmt.Errorf("deleting %s-out: %w", group, err)
			}
		}
	}
	w, p := median(worker), median(pass)
	ws, ps := median(workerSteady), median(passSteady)
	fmt.Fprintf(stdout, "\nmedian of %d rounds:\n", o.rounds)
	fmt.Fprintf(stdout, "  join to last commit: worker %.0f records/s, passthrough %.0f records/s: worker/passthrough %.2f\n", w, p, w/p)
	fmt.Fprintf(stdout, "  steady state:        worker %.0f records/s, passthrough %.0f records/s: worker/passthrough %.2f\n", ws, ps, ws/ps)
	return nil
}

// runResult is one run's time from group join to the commit of the end of
// the input, and its steady-state rate (see waitGroup).
type runResult struct {
	elapsed time.Duration
	steady  float64
}

type benchOptions struct {
	records, partitions, rounds, bits   int
	process                             bool
	cacheBytes, heapProfile, cpuProfile string
	profileTime                         time.Duration     // -profile-time
	workerVars                          map[string]string // -env: more KDEDUP_ variables of the worker
	brokers                             []string
	adm                                 *kadm.Client
	kdedupBin                           string // -kdedup, or the binary kdedupBinary built

	// -broker apache (apache.go)
	broker, kstreamsDir, kstreamsHeap string
	peers, deliveries                 []string
	window                            time.Duration
	kstreamsThreads                   int
	repartition                       bool // -repartition
}

// kdedupBinary returns the kdedup binary the worker processes run: path
// when it is set, or one built from ./cmd/kdedup with go build into a
// temporary directory, which cleanup removes. Errors: path does not exist,
// or the build failed (its output is in the error).
func kdedupBinary(ctx context.Context, path string, stdout io.Writer) (bin string, cleanup func(), err error) {
	if path != "" {
		if _, err := os.Stat(path); err != nil {
			return "", nil, fmt.Errorf("%w: -kdedup: %v", errUsage, err)
		}
		return path, func() {}, nil
	}
	dir, err := os.MkdirTemp("", "kdedup-bench-bin-")
	if err != nil {
		return "", nil, err
	}
	bin = filepath.Join(dir, "kdedup")
	fmt.Fprintln(stdout, "building ./cmd/kdedup for the worker processes (-kdedup to give a binary) ...")
	if out, err := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/kdedup").CombinedOutput(); err != nil {
		os.RemoveAll(dir)
		return "", nil, fmt.Errorf("go build ./cmd/kdedup (run kdedup-bench from the repository's root, or give -kdedup): %v\n%s", err, out)
	}
	return bin, func() { os.RemoveAll(dir) }, nil
}

// produceBench writes o.records records of a generated stream (producer
// retries, replays, hot keys, tombstones, unkeyed records; see
// internal/scenario) to topic and returns them (partitions and offsets set)
// and their distinct keys.
func produceBench(ctx context.Context, o benchOptions, topic string, stdout io.Writer) ([]*kgo.Record, int, error) {
	// Generate yields about 1.27 records per key; cut the stream at o.records.
	recs := scenario.Generate(scenario.Options{Keys: o.records*4/5 + 1})
	for len(recs) < o.records {
		recs = append(recs, embedded.CloneRecords(recs[:min(len(recs), o.records-len(recs))])...)
	}
	recs = recs[:o.records]
	keys := map[string]struct{}{}
	for _, r := range recs {
		if r.Key != nil {
			keys[string(r.Key)] = struct{}{}
		}
	}
	start := time.Now()
	if err := embedded.Produce(ctx, o.brokers, topic, recs, stdout); err != nil {
		return nil, 0, err
	}
	fmt.Fprintf(stdout, "produced %d records to %s in %s\n", len(recs), topic, time.Since(start).Round(time.Millisecond))
	return recs, len(keys), nil
}

// runWorker runs the real worker (internal/app.Run, at least once, a fresh
// data directory) until its group has committed the end of the input, timed
// from the group join (readiness) to that commit.
func runWorker(ctx context.Context, o benchOptions, group, out string, stdout io.Writer) (runResult, error) {
	dir, err := os.MkdirTemp("", "kdedup-bench-")
	if err != nil {
		return runResult{}, err
	}
	defer os.RemoveAll(dir)
	env := map[string]string{
		"KDEDUP_BROKERS": o.brokers[0], "KDEDUP_INPUT_TOPICS": "events", "KDEDUP_OUTPUT_TOPIC": out, "KDEDUP_GROUP": group,
		"KDEDUP_DATA_DIR": dir, "KDEDUP_HTTP_ADDR": "127.0.0.1:0", "KDEDUP_LOG_FORMAT": "text", "KDEDUP_LOG_LEVEL": "warn",
	}
	if o.bits != 0 {
		env["KDEDUP_FINGERPRINT_BITS"] = strconv.Itoa(o.bits)
	}
	if o.cacheBytes != "" {
		env["KDEDUP_CACHE_BYTES"] = o.cacheBytes
	}
	maps.Copy(env, o.workerVars)
	if o.process {
		return runWorkerProcess(ctx, o, env, group, stdout)
	}
	cfg, err := config.LoadFrom(env)
	if err != nil {
		return runResult{}, fmt.Errorf("%w: %v", errUsage, err)
	}
	if o.cpuProfile != "" {
		f, err := os.Create(o.cpuProfile)
		if err != nil {
			return runResult{}, err
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			f.Close()
			return runResult{}, err
		}
		defer func() { pprof.StopCPUProfile(); f.Close() }()
		o.cpuProfile = "" // one round only
	}
	w, err := embedded.StartWorker(ctx, cfg, app.NewLogger(os.Stderr, cfg.SlogLevel(), cfg.LogFormat))
	if err != nil {
		return runResult{}, err
	}
	steady, err := waitGroup(ctx, o, group, w.ReadyAt, stdout)
	if err != nil {
		_ = w.Stop()
		return runResult{}, err
	}
	res := runResult{elapsed: time.Since(w.ReadyAt), steady: steady}
	if o.heapProfile != "" {
		if err := writeHeapProfile(o.heapProfile); err != nil {
			_ = w.Stop()
			return runResult{}, err
		}
	}
	if err := w.Stop(); err != nil {
		return runResult{}, err
	}
	return res, nil
}

// runWorkerProcess runs the worker as `kdedup run` in a child process with
// env, and reports the child's peak resident memory once it has exited on
// SIGTERM: its VmHWM (/proc/pid/status), sampled every 10ms until it exits.
// getrusage's maxrss is no use here: Linux carries the forking process's
// high-water mark into the child across exec, so it would report this
// process's (the broker's) memory whenever that is the larger.
func runWorkerProcess(ctx context.Context, o benchOptions, env map[string]string, group string, stdout io.Writer) (runResult, error) {
	addr, err := harness.FreeAddr()
	if err != nil {
		return runResult{}, err
	}
	env["KDEDUP_HTTP_ADDR"] = addr
	if o.cpuProfile != "" {
		env["KDEDUP_PPROF"] = "true"
	}
	cmd := exec.Command(o.kdedupBin, "run")
	cmd.Env = harness.WorkerEnv()
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		return runResult{}, err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	hwm := startHWMSampler(cmd.Process.Pid)
	defer hwm.stop()
	readyAt, err := embedded.WaitReady(ctx, addr, done)
	if err != nil {
		_ = cmd.Process.Kill()
		return runResult{}, err
	}
	var profiled chan error
	if o.cpuProfile != "" {
		profiled = make(chan error, 1)
		go func() { profiled <- harness.FetchCPUProfile(ctx, addr, o.profileTime, o.cpuProfile) }()
	}
	steady, err := waitGroup(ctx, o, group, readyAt, stdout)
	if err != nil {
		_ = cmd.Process.Kill()
		<-done
		return runResult{}, err
	}
	if profiled != nil {
		if err := <-profiled; err != nil {
			_ = cmd.Process.Kill()
			<-done
			return runResult{}, err
		}
		fmt.Fprintf(stdout, "  worker process: CPU profile of its first %s in %s\n", o.profileTime, o.cpuProfile)
	}
	res := runResult{elapsed: time.Since(readyAt), steady: steady}
	printProcessMemory(stdout, cmd.Process.Pid, addr)
	running := hwm.peak()
	stopAt := time.Now()
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		return runResult{}, err
	}
	err = <-done
	exited := time.Since(stopAt)
	peak := hwm.stop()
	if err != nil {
		return runResult{}, fmt.Errorf("worker process: %w", err)
	}
	fmt.Fprintf(stdout, "  worker process: peak resident memory (VmHWM) %d MiB while running, %d MiB including shutdown (exited %s after SIGTERM)\n",
		running>>20, peak>>20, exited.Round(time.Millisecond))
	if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		fmt.Fprintf(stdout, "  worker process: CPU %s user + %s system\n",
			time.Duration(ru.Utime.Nano()).Round(time.Millisecond), time.Duration(ru.Stime.Nano()).Round(time.Millisecond))
	}
	return res, nil
}

// hwmSampler polls a process's VmHWM and keeps the largest value read.
type hwmSampler struct {
	mu   sync.Mutex
	max  int64
	once sync.Once
	quit chan struct{}
	done chan struct{}
}

func startHWMSampler(pid int) *hwmSampler {
	s := &hwmSampler{quit: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		t := time.NewTicker(10 * time.Millisecond)
		defer t.Stop()
		for {
			// An exited process has no VmHWM.
			if sizes, err := benchenv.ProcessMemory(pid); err == nil && sizes["VmHWM"] > 0 {
				s.mu.Lock()
				s.max = max(s.max, sizes["VmHWM"])
				s.mu.Unlock()
			}
			select {
			case <-s.quit:
				return
			case <-t.C:
			}
		}
	}()
	return s
}

func (s *hwmSampler) peak() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.max
}

func (s *hwmSampler) stop() int64 {
	s.once.Do(func() { close(s.quit) })
	<-s.done
	return s.peak()
}

func writeHeapProfile(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	runtime.GC()
	return errors.Join(pprof.WriteHeapProfile(f), f.Close())
}

// printProcessMemory prints what the worker process pid holds once it has
// caught up: its resident memory split by kind (/proc/pid/status) and the Go
// heap figures it exports on /metrics.
func printProcessMemory(stdout io.Writer, pid int, httpAddr string) {
	var parts []string
	if sizes, err := benchenv.ProcessMemory(pid); err == nil {
		for _, name := range []string{"VmHWM", "VmRSS", "RssAnon", "RssFile"} {
			parts = append(parts, fmt.Sprintf("%s %d MiB", name, sizes[name]>>20))
		}
	}
	if metrics, err := harness.Scrape(context.Background(), httpAddr); err == nil {
		for _, m := range []string{"go_memstats_heap_inuse_bytes", "go_memstats_heap_sys_bytes", "go_memstats_sys_bytes"} {
			if v, ok := metrics[m]; ok {
				parts = append(parts, fmt.Sprintf("%s %.0f MiB", strings.TrimPrefix(m, "go_memstats_"), v/(1<<20)))
			}
		}
	}
	fmt.Fprintf(stdout, "  worker process after catching up: %s\n", strings.Join(parts, ", "))
}

// runPassthrough consumes the input as a consumer group with the worker's
// client settings (consumer.Worker's at-least-once options) and produces
// every record unchanged to out: produce without waiting, and every second
// (the worker's default flush interval) wait for the acks and mark the
// offsets polled so far for the group commit, which franz-go sends every
// second. It returns the time from the group join to the commit of the end
// of the input.
func runPassthrough(ctx context.Context, o benchOptions, group, out string, stdout io.Writer) (runResult, error) {
	const interval = time.Second
	var (
		mu      sync.Mutex
		readyAt time.Time
		joined  = make(chan struct{})
		once    sync.Once
	)
	cl, err := kgo.NewClient(append(passthroughOpts(o.brokers, group, out, interval, false),
		kgo.OnPartitionsAssigned(func(context.Context, *kgo.Client, map[string][]int32) {
			once.Do(func() {
				mu.Lock()
				readyAt = time.Now()
				mu.Unlock()
				close(joined)
			})
		}),
	)...)
	if err != nil {
		return runResult{}, err
	}
	pctx, stop := context.WithCancel(ctx)
	defer stop()
	loopDone := make(chan error, 1)
	go func() { loopDone <- passthroughLoop(pctx, cl, interval) }()

	select {
	case <-joined:
	case err := <-loopDone:
		cl.Close()
		return runResult{}, fmt.Errorf("passthrough stopped before joining: %w", err)
	case <-ctx.Done():
		cl.Close()
		return runResult{}, ctx.Err()
	}
	mu.Lock()
	start := readyAt
	mu.Unlock()
	steady, err := waitGroup(ctx, o, group, start, stdout)
	res := runResult{elapsed: time.Since(start), steady: steady}
	stop()
	lerr := <-loopDone
	cl.Close()
	if err != nil {
		return runResult{}, err
	}
	return res, lerr
}

// passthroughOpts are the passthrough's client options: the worker's own
// group client settings (consumer.Options.GroupClientOpts) for the same
// brokers, input, group and output, at least once committing marked
// offsets every interval, exactly once with a transactional id of its own.
func passthroughOpts(brokers []string, group, out string, interval time.Duration, transactional bool) []kgo.Opt {
	o := consumer.Options{Brokers: brokers, InputTopics: []string{"events"}, OutputTopic: out, Group: group, FlushInterval: interval}
	if transactional {
		o.Delivery, o.TransactionalID = consumer.ExactlyOnce, fmt.Sprintf("%s-%d", group, os.Getpid())
	}
	return o.GroupClientOpts()
}

// passthroughLoop polls, produces every record, and every interval flushes
// the producer and marks the offsets it covered.
func passthroughLoop(ctx context.Context, cl *kgo.Client, interval time.Duration) error {
	var prodErr error
	var errMu sync.Mutex
	pending := map[string]map[int32]kgo.EpochOffset{}
	flush := func() error {
		if err := cl.Flush(context.Background()); err != nil {
			return err
		}
		errMu.Lock()
		err := prodErr
		errMu.Unlock()
		if err != nil {
			return err
		}
		if len(pending) > 0 {
			cl.MarkCommitOffsets(pending)
			pending = map[string]map[int32]kgo.EpochOffset{}
		}
		return nil
	}
	last := time.Now()
	for {
		pctx, cancel := context.WithDeadline(ctx, last.Add(interval))
		fetches := cl.PollRecords(pctx, 10_000)
		cancel()
		if fetches.IsClientClosed() || ctx.Err() != nil {
			cl.AllowRebalance()
			return flush()
		}
		fetches.EachRecord(func(r *kgo.Record) {
			cl.Produce(context.Background(), &kgo.Record{Key: r.Key, Value: r.Value, Headers: r.Headers, Timestamp: r.Timestamp}, func(_ *kgo.Record, err error) {
				if err != nil {
					errMu.Lock()
					prodErr = firstErr(prodErr, err)
					errMu.Unlock()
				}
			})
			ps := pending[r.Topic]
			if ps == nil {
				ps = map[int32]kgo.EpochOffset{}
				pending[r.Topic] = ps
			}
			ps[r.Partition] = kgo.EpochOffset{Epoch: r.LeaderEpoch, Offset: r.Offset + 1}
		})
		cl.AllowRebalance()
		if time.Since(last) >= interval {
			last = time.Now()
			if err := flush(); err != nil {
				return err
			}
		}
	}
}

// firstErr keeps the first non-nil error.
func firstErr(first, next error) error {
	if first != nil {
		return first
	}
	return next
}

// waitGroup waits, at most 30 minutes, until group has committed the end
// of the input, printing progress, and returns the steady-state rate
// (embedded.WaitCommitted).
func waitGroup(ctx context.Context, o benchOptions, group string, start time.Time, stdout io.Writer) (float64, error) {
	wctx, cancel := context.WithTimeout(ctx, 30*time.Minute)
	defer cancel()
	return embedded.WaitCommitted(wctx, o.adm, group, "events", o.records, start, stdout)
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
