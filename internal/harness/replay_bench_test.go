package harness_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"runtime/pprof"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kdedup/kdedup/config"
	"github.com/kdedup/kdedup/internal/app"
	"github.com/kdedup/kdedup/internal/benchenv"
	"github.com/kdedup/kdedup/internal/embedded"
	"github.com/kdedup/kdedup/internal/harness"
	"github.com/kdedup/kdedup/internal/kafkatest"
	"github.com/kdedup/kdedup/internal/scenario"
)

// BenchmarkReplay measures a rebuild through the whole worker: the input
// topic holds KDEDUP_BENCH_KEYS records (default 1,000,000), one per
// distinct key (benchenv.Key), spread evenly over KDEDUP_BENCH_PARTITIONS
// partitions (default 4); the group's offsets are committed at the end of
// each partition, and the worker starts with an empty data directory and
// the default configuration, so it replays every record into its filters
// (forwarding nothing) through its restore clients before it is ready.
// Each iteration is one such rebuild into a fresh data directory:
// -benchtime 1x.
//
// Metrics: rec/s, the records over the time from start to /readyz (the
// group join included); cpu-us/rec, the worker process's user and system
// CPU over that time per record; peak-RSS-MiB, its peak resident memory
// (VmHWM) from its start, and peak-anon-MiB, the most anonymous memory
// (RssAnon, sampled every 100ms: VmHWM also counts the mapped table files'
// pages, which the kernel reclaims before it kills). With
// KDEDUP_TEST_KAFKA=apache the broker is Apache Kafka in a process of its
// own (internal/kafkatest); by default it is kfake, in this process.
//
// The worker runs in this process by default (its CPU and memory are then
// the process's: kfake's fetch work and the producer's leftovers too).
// KDEDUP_BENCH_WORKER_PROCESS runs it as kdedup run in a child process
// instead: "1" builds cmd/kdedup with go build, any other value is the
// path of a kdedup binary. KDEDUP_BENCH_MEMORY_LIMIT puts that child in a
// memory cgroup of that many bytes, as a container's limit would
// (benchenv.MemoryCgroup: root and a writable cgroup file system needed),
// so that its own default budget (90% of the limit) applies, and adds
// cgroup-peak-MiB (the cgroup's peak, page cache included) and oom-kills.
//
// KDEDUP_BENCH_MEMORY sets the worker's KDEDUP_MEMORY_BYTES and, in this
// process, the Go soft memory limit of that budget as kdedup run does
// (default: the worker's own default budget, from the container's limit,
// and in this process no Go memory limit). KDEDUP_BENCH_WORKER_ENV sets
// more of the worker's variables: KDEDUP_NAME=value, comma-separated.
//
// KDEDUP_BENCH_AFTER_RECORDS (default 0: none) then feeds the ready
// worker that many new keys at KDEDUP_BENCH_RATE records/s (default
// 50,000) and reports the phase with the prefix after- (decideAtRate);
// KDEDUP_BENCH_CPUPROFILE=file profiles that phase. KDEDUP_BENCH_CRASH
// (any value; the worker process only) then kills the worker with
// SIGKILL and starts it again on its data directory, and reports the
// restart with the prefix crash-: its seconds and CPU from start to
// ready (opening the state, the log after each page's floor applied;
// joining the group; replaying the records after its checkpoint),
// crash-open-s (the partitions' opening alone, summed:
// kdedup_store_partition_open_seconds), crash-partitions-opened,
// crash-replayed (the records replayed) and its memory. The worker then
// joins as a static member (KDEDUP_INSTANCE_ID, as the chart deploys it),
// so that the restart gets its partitions back without waiting out the
// killed member's session.
//
//	KDEDUP_TEST_KAFKA=apache KDEDUP_BENCH_KEYS=20000000 go test -run '^$' -bench Replay -benchtime 1x -timeout 60m ./internal/harness
//	KDEDUP_TEST_KAFKA=apache KDEDUP_BENCH_KEYS=100000000 KDEDUP_BENCH_WORKER_PROCESS=1 \
//	  KDEDUP_BENCH_MEMORY_LIMIT=2147483648 KDEDUP_BENCH_AFTER_RECORDS=3000000 \
//	  KDEDUP_BENCH_CRASH=1 go test -run '^$' -bench Replay -benchtime 1x -timeout 90m ./internal/harness
func BenchmarkReplay(b *testing.B) {
	keys := benchenv.Int(b, "KDEDUP_BENCH_KEYS", 1_000_000)
	partitions := max(benchenv.Int(b, "KDEDUP_BENCH_PARTITIONS", 4), 1)
	addrs := benchBroker(b)
	in, out, group := "replay-in", "replay-out", "replay-group"

	cl, err := kgo.NewClient(kgo.SeedBrokers(addrs...), kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.ProducerLinger(5*time.Millisecond), kgo.MaxBufferedRecords(1<<20))
	if err != nil {
		b.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	ctx := context.Background()
	for _, topic := range []string{in, out} {
		if _, err := adm.CreateTopic(ctx, int32(partitions), 1, nil, topic); err != nil {
			b.Fatal(err)
		}
	}
	produceStart := time.Now()
	produceKeys(b, cl, in, partitions, 0, keys, 0)
	b.Logf("produced %d records over %d partitions in %s", keys, partitions, time.Since(produceStart).Round(time.Millisecond))
	ends, err := adm.ListEndOffsets(ctx, in)
	if err != nil {
		b.Fatal(err)
	}
	offsets := kadm.Offsets{}
	ends.Each(func(o kadm.ListedOffset) {
		offsets.Add(kadm.Offset{Topic: o.Topic, Partition: o.Partition, At: o.Offset, LeaderEpoch: -1})
	})
	if err := adm.CommitAllOffsets(ctx, group, offsets); err != nil {
		b.Fatal(err)
	}

	b.ResetTimer()
	for range b.N {
		env := map[string]string{
			"KDEDUP_BROKERS":      addrs[0],
			"KDEDUP_INPUT_TOPICS": in,
			"KDEDUP_OUTPUT_TOPIC": out,
			"KDEDUP_GROUP":        group,
			"KDEDUP_DATA_DIR":     b.TempDir(),
			"KDEDUP_HTTP_ADDR":    "127.0.0.1:0",
		}
		if mem := os.Getenv("KDEDUP_BENCH_MEMORY"); mem != "" {
			env["KDEDUP_MEMORY_BYTES"] = mem
		}
		if os.Getenv("KDEDUP_BENCH_CRASH") != "" {
			// As the chart deploys it (staticMembership): the restarted
			// worker gets its partitions back without waiting out the
			// killed member's session.
			env["KDEDUP_INSTANCE_ID"] = "replay-0"
		}
		for kv := range strings.SplitSeq(os.Getenv("KDEDUP_BENCH_WORKER_ENV"), ",") {
			if kv == "" {
				continue
			}
			k, v, ok := strings.Cut(kv, "=")
			if !ok || !strings.HasPrefix(k, config.Prefix) {
				b.Fatalf("KDEDUP_BENCH_WORKER_ENV: %q, want %sNAME=value", kv, config.Prefix)
			}
			env[k] = v
		}
		var w replayWorker
		if os.Getenv("KDEDUP_BENCH_WORKER_PROCESS") != "" {
			w = startWorkerProcess(b, env)
		} else {
			w = startWorkerInProcess(b, env)
		}
		r := w.ran()
		if got := w.replayed(); got != float64(keys) {
			b.Fatalf("ready after replaying %v records, want %d", got, keys)
		}
		n := float64(keys)
		b.ReportMetric(n/r.readyAt.Sub(r.started).Seconds(), "rec/s")
		b.ReportMetric(float64(r.cpu)/1e3/n, "cpu-us/rec")
		r.mem.report(b, "")
		if after := benchenv.Int(b, "KDEDUP_BENCH_AFTER_RECORDS", 0); after > 0 {
			decideAtRate(b, cl, adm, w, in, out, group, keys, after, partitions)
		}
		if os.Getenv("KDEDUP_BENCH_CRASH") != "" {
			c, ok := w.(*childProcess)
			if !ok {
				b.Fatal("KDEDUP_BENCH_CRASH needs KDEDUP_BENCH_WORKER_PROCESS")
			}
			c = c.crash(env)
			w = c
			r := c.ran()
			b.ReportMetric(r.readyAt.Sub(r.started).Seconds(), "crash-restart-s")
			b.ReportMetric(float64(r.cpu)/1e9, "crash-restart-cpu-s")
			metrics, err := harness.Scrape(context.Background(), c.addr)
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(metrics["kdedup_replayed_records_total"], "crash-replayed")
			b.ReportMetric(metrics["kdedup_store_partition_open_seconds_sum"], "crash-open-s")
			b.ReportMetric(metrics["kdedup_store_partition_open_seconds_count"], "crash-partitions-opened")
			r.mem.report(b, "crash-")
		}
		if err := w.stop(); err != nil {
			b.Fatal(err)
		}
	}
}

// replayWorker is the worker BenchmarkReplay measures: in this process or
// in a child process (kdedup run).
type replayWorker interface {
	// ran is what the worker did from its start to ready.
	ran() replayRun
	// replayed is the worker's kdedup_replayed_records_total.
	replayed() float64
	// pid is the worker's process: this one, or the child.
	pid() int
	// memory is the memory measures, restarted with reset.
	memory() *memoryWatch
	// cpuProfile starts a CPU profile of the worker into file; the
	// function it returns ends it and writes the file.
	cpuProfile(file string) (stop func() error)
	stop() error
}

type replayRun struct {
	started, readyAt time.Time
	cpu              time.Duration
	mem              memorySample
}

// inProcess is the worker in this process (embedded.StartWorker): its CPU
// and memory are this process's, the broker's with kfake.
type inProcess struct {
	w     *embedded.Worker
	b     *testing.B
	run   replayRun
	watch *memoryWatch
}

func startWorkerInProcess(b *testing.B, env map[string]string) *inProcess {
	cfg, err := config.LoadFrom(env)
	if err != nil {
		b.Fatal(err)
	}
	if _, ok := env["KDEDUP_MEMORY_BYTES"]; ok {
		// As kdedup run does: the Go soft memory limit of the budget
		// (the broker runs in another process with apache; with kfake
		// it shares this heap).
		app.SetMemoryLimit(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	}
	debug.FreeOSMemory() // the producer's buffers returned, out of the worker's peak
	watch := watchMemory(b, os.Getpid(), nil)
	cpu := benchenv.CPU(b)
	w, err := embedded.StartWorker(context.Background(), cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		b.Fatal(err)
	}
	p := &inProcess{w: w, b: b, watch: watch}
	p.run = replayRun{started: w.Started, readyAt: w.ReadyAt, cpu: benchenv.CPU(b) - cpu, mem: watch.sample()}
	return p
}

func (p *inProcess) ran() replayRun       { return p.run }
func (p *inProcess) pid() int             { return os.Getpid() }
func (p *inProcess) memory() *memoryWatch { return p.watch }
func (p *inProcess) replayed() float64 {
	return benchenv.Gathered(p.b, p.w.Registry, "kdedup_replayed_records_total")
}
func (p *inProcess) stop() error { p.watch.close(); return p.w.Stop() }

// cpuProfile profiles this process (the producer's work in it too).
func (p *inProcess) cpuProfile(file string) func() error {
	f, err := os.Create(file)
	if err != nil {
		p.b.Fatal(err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		p.b.Fatal(err)
	}
	return func() error {
		pprof.StopCPUProfile()
		return f.Close()
	}
}

// childProcess is the worker as kdedup run in a child process, in a
// memory cgroup of KDEDUP_BENCH_MEMORY_LIMIT bytes when that is set.
type childProcess struct {
	b      *testing.B
	bin    string
	cmd    *exec.Cmd
	done   chan error
	addr   string
	cg     *benchenv.MemoryCgroup
	run    replayRun
	watch  *memoryWatch
	output string
	// stopped tells that stop has waited for the process.
	stopped bool
}

func startWorkerProcess(b *testing.B, env map[string]string) *childProcess {
	bin := os.Getenv("KDEDUP_BENCH_WORKER_PROCESS")
	if bin == "1" {
		bin = filepath.Join(b.TempDir(), "kdedup")
		if out, err := exec.Command("go", "build", "-o", bin, "github.com/kdedup/kdedup/cmd/kdedup").CombinedOutput(); err != nil {
			b.Fatalf("building kdedup: %v\n%s", err, out)
		}
	}
	var cg *benchenv.MemoryCgroup
	if limit := benchenv.Int(b, "KDEDUP_BENCH_MEMORY_LIMIT", 0); limit > 0 {
		var err error
		if cg, err = benchenv.NewMemoryCgroup(fmt.Sprintf("kdedup-bench-%d", os.Getpid()), int64(limit)); err != nil {
			b.Fatalf("KDEDUP_BENCH_MEMORY_LIMIT=%d: %v", limit, err)
		}
		b.Cleanup(func() {
			if err := cg.Remove(); err != nil {
				b.Error(err)
			}
		})
	}
	return launchWorker(b, bin, cg, env)
}

// launchWorker starts bin run with env in cg (none when nil) and returns
// it once ready.
func launchWorker(b *testing.B, bin string, cg *benchenv.MemoryCgroup, env map[string]string) *childProcess {
	addr, err := harness.FreeAddr()
	if err != nil {
		b.Fatal(err)
	}
	c := &childProcess{b: b, bin: bin, cg: cg, addr: addr, done: make(chan error, 1),
		output: filepath.Join(b.TempDir(), "worker.log")}
	env["KDEDUP_HTTP_ADDR"] = c.addr
	if os.Getenv("KDEDUP_BENCH_CPUPROFILE") != "" {
		env["KDEDUP_PPROF"] = "true"
	}
	if cg != nil {
		c.cmd = cg.Command(bin, "run")
	} else {
		c.cmd = exec.Command(bin, "run")
	}
	c.cmd.Env = harness.WorkerEnv()
	for k, v := range env {
		c.cmd.Env = append(c.cmd.Env, k+"="+v)
	}
	log, err := os.Create(c.output)
	if err != nil {
		b.Fatal(err)
	}
	defer log.Close()
	c.cmd.Stdout, c.cmd.Stderr = log, log
	debug.FreeOSMemory()
	started := time.Now()
	if err := c.cmd.Start(); err != nil {
		b.Fatal(err)
	}
	go func() { c.done <- c.cmd.Wait() }()
	// A benchmark that fails before stop leaves no worker running (this
	// runs before the cgroup's removal: cleanups run last first).
	b.Cleanup(func() {
		if !c.stopped {
			_ = c.cmd.Process.Kill()
			<-c.done
		}
	})
	c.watch = watchMemory(b, c.cmd.Process.Pid, c.cg)
	readyAt, err := embedded.WaitReady(context.Background(), c.addr, c.done)
	if err != nil {
		c.stopped = true // WaitReady took its exit from done (its only error here)
		c.fail("before it was ready", err)
	}
	cpu, err := benchenv.ProcessCPU(c.cmd.Process.Pid)
	if err != nil {
		b.Fatal(err)
	}
	c.run = replayRun{started: started, readyAt: readyAt, cpu: cpu, mem: c.watch.sample()}
	return c
}

// crash kills the worker with SIGKILL, as an OOM kill or a lost node
// would, and starts it again with env (its data directory) in the same
// cgroup: the returned worker is ready once it has opened its state (the
// log after each page's floor applied) and replayed the records after
// its checkpoint.
func (c *childProcess) crash(env map[string]string) *childProcess {
	c.watch.close()
	if err := c.cmd.Process.Kill(); err != nil {
		c.b.Fatal(err)
	}
	<-c.done
	c.stopped = true
	if c.cg != nil {
		_ = c.cg.ResetPeak()
	}
	return launchWorker(c.b, c.bin, c.cg, env)
}

// fail ends the benchmark with err, the worker's OOM kills and the end of
// its log.
func (c *childProcess) fail(when string, err error) {
	kills := "no memory cgroup"
	if c.cg != nil {
		n, err := c.cg.OOMKills()
		kills = fmt.Sprintf("%d OOM kills (%v)", n, err)
	}
	log, _ := os.ReadFile(c.output)
	c.b.Fatalf("worker process %s: %v; %s; the end of its log:\n%s", when, err, kills, log[max(len(log)-4096, 0):])
}

func (c *childProcess) ran() replayRun       { return c.run }
func (c *childProcess) pid() int             { return c.cmd.Process.Pid }
func (c *childProcess) memory() *memoryWatch { return c.watch }
func (c *childProcess) replayed() float64 {
	metrics, err := harness.Scrape(context.Background(), c.addr)
	if err != nil {
		c.fail("serving metrics", err)
	}
	return metrics["kdedup_replayed_records_total"]
}

// childProfileTime is how long a child worker's CPU profile runs: its
// HTTP server ends responses after 30 s.
const childProfileTime = 25 * time.Second

// cpuProfile fetches the worker's CPU profile of the next
// childProfileTime from /debug/pprof (KDEDUP_PPROF, set for the worker
// when KDEDUP_BENCH_CPUPROFILE is).
func (c *childProcess) cpuProfile(file string) func() error {
	done := make(chan error, 1)
	go func() { done <- harness.FetchCPUProfile(context.Background(), c.addr, childProfileTime, file) }()
	return func() error { return <-done }
}

// stop stops the worker with SIGTERM and reports its OOM kills (0, or the
// benchmark has failed already: a killed worker is not ready or not
// caught up).
func (c *childProcess) stop() error {
	c.watch.close()
	if err := c.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		return err
	}
	err := <-c.done
	c.stopped = true
	if err != nil {
		log, _ := os.ReadFile(c.output)
		return fmt.Errorf("worker process: %w; the end of its log:\n%s", err, log[max(len(log)-4096, 0):])
	}
	if c.cg != nil {
		n, err := c.cg.OOMKills()
		if err != nil {
			return err
		}
		c.b.ReportMetric(float64(n), "oom-kills")
	}
	return nil
}

// decideAtRate produces records new keys (numbered from first) at
// KDEDUP_BENCH_RATE records/s (default 50,000) in slices of a hundredth
// of a second, waits until the group has committed them all, and reports
// the worker's cost over that phase: after-rec/s (records over the time
// from the first record produced to the group's commit of the last, so
// up to a commit interval more than deciding them took), after-lag-s
// (from the last record acknowledged by the broker to the group's commit
// of it: about the commit interval when the worker keeps up; more is
// backlog), after-cpu-us/rec
// (the worker's CPU; the producer's too with the in-process worker), its
// memory (memoryWatch.report, restarted at the phase's start) and
// after-forwarded, the records it forwarded (the new keys less its false
// positives). With KDEDUP_BENCH_CPUPROFILE set, it writes a CPU profile
// of the phase to that file: of this process over the whole phase with
// the in-process worker, of the child's first 25 s of it otherwise.
func decideAtRate(b *testing.B, cl *kgo.Client, adm *kadm.Client, w replayWorker, in, out, group string, first, records, partitions int) {
	rate := benchenv.Int(b, "KDEDUP_BENCH_RATE", 50_000)
	ctx := context.Background()
	outBefore := endOffsets(b, adm, out)
	w.memory().reset()
	cpu, err := benchenv.ProcessCPU(w.pid())
	if err != nil {
		b.Fatal(err)
	}
	var profiled func() error
	if file := os.Getenv("KDEDUP_BENCH_CPUPROFILE"); file != "" {
		profiled = w.cpuProfile(file)
	}
	start := time.Now()
	produceKeys(b, cl, in, partitions, first, first+records, rate)
	produced := time.Now()
	wctx, cancel := context.WithTimeout(ctx, 30*time.Minute)
	defer cancel()
	if err := scenario.WaitCaughtUp(wctx, adm, group, in); err != nil {
		b.Fatal(err)
	}
	elapsed := time.Since(start)
	used, err := benchenv.ProcessCPU(w.pid())
	if err != nil {
		b.Fatal(err)
	}
	if profiled != nil {
		if err := profiled(); err != nil {
			b.Fatal(err)
		}
	}
	forwarded := endOffsets(b, adm, out) - outBefore
	if forwarded > int64(records) || forwarded < int64(records)*99/100 {
		b.Fatalf("forwarded %d of %d new keys", forwarded, records)
	}
	n := float64(records)
	b.ReportMetric(n/elapsed.Seconds(), "after-rec/s")
	b.ReportMetric(time.Since(produced).Seconds(), "after-lag-s")
	b.ReportMetric(float64(used-cpu)/1e3/n, "after-cpu-us/rec")
	b.ReportMetric(float64(forwarded), "after-forwarded")
	w.memory().sample().report(b, "after-")
}

// produceKeys produces records [from, to) to topic, record i with key
// benchenv.Key(i) to partition i % partitions (cl partitions manually), at
// rate records/s in slices of a hundredth of a second, or flat out when
// rate is 0, and returns once the broker has acknowledged them all.
func produceKeys(b *testing.B, cl *kgo.Client, topic string, partitions, from, to, rate int) {
	ctx := context.Background()
	slice := to - from
	if rate > 0 {
		slice = max(rate/100, 1)
	}
	start := time.Now()
	var once sync.Once
	var prodErr error
	for at := from; at < to; at += slice {
		if rate > 0 {
			if d := time.Until(start.Add(time.Duration(float64(at-from) / float64(rate) * float64(time.Second)))); d > 0 {
				time.Sleep(d)
			}
		}
		for i := at; i < min(at+slice, to); i++ {
			key := make([]byte, 16)
			benchenv.Key(key, uint64(i))
			cl.Produce(ctx, &kgo.Record{Topic: topic, Partition: int32(i % partitions), Key: key, Value: []byte("v")},
				func(_ *kgo.Record, err error) {
					if err != nil {
						once.Do(func() { prodErr = err })
					}
				})
		}
	}
	if err := cl.Flush(ctx); err != nil {
		b.Fatal(err)
	}
	if prodErr != nil {
		b.Fatal(prodErr)
	}
}

func endOffsets(b *testing.B, adm *kadm.Client, topic string) int64 {
	ends, err := adm.ListEndOffsets(context.Background(), topic)
	if err != nil {
		b.Fatal(err)
	}
	var n int64
	ends.Each(func(o kadm.ListedOffset) { n += o.Offset })
	return n
}

// memoryWatch samples a process's memory every 100ms: the most anonymous
// memory it held (RssAnon: what the kernel cannot reclaim but by killing
// it; VmHWM also counts the pages of files it maps, which are reclaimed
// first), beside its VmHWM and, in a memory cgroup, the cgroup's peak.
type memoryWatch struct {
	b            *testing.B
	pid          int
	cg           *benchenv.MemoryCgroup
	mu           sync.Mutex
	anon         int64
	noCgroupPeak bool
	quit         chan struct{}
	done         chan struct{}
}

// memorySample is what a memoryWatch saw since its start or reset, in
// bytes (cgroup -1 without a cgroup).
type memorySample struct{ hwm, anon, cgroup int64 }

func watchMemory(b *testing.B, pid int, cg *benchenv.MemoryCgroup) *memoryWatch {
	m := &memoryWatch{b: b, pid: pid, cg: cg, quit: make(chan struct{}), done: make(chan struct{})}
	if pid == os.Getpid() {
		benchenv.ResetPeakRSS()
	}
	go func() {
		defer close(m.done)
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			if mem, err := benchenv.ProcessMemory(pid); err == nil {
				m.mu.Lock()
				m.anon = max(m.anon, mem["RssAnon"])
				m.mu.Unlock()
			}
			select {
			case <-m.quit:
				return
			case <-t.C:
			}
		}
	}()
	return m
}

// reset restarts the peaks from the current figures.
func (m *memoryWatch) reset() {
	if err := benchenv.ResetProcessPeakRSS(m.pid); err != nil {
		m.b.Fatal(err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cg != nil && m.cg.ResetPeak() != nil {
		m.noCgroupPeak = true // v2: the cgroup's peak of the phase alone is unknown
	}
	m.anon = 0
}

func (m *memoryWatch) sample() memorySample {
	mem, err := benchenv.ProcessMemory(m.pid)
	if err != nil {
		m.b.Fatal(err)
	}
	s := memorySample{hwm: mem["VmHWM"], cgroup: -1}
	m.mu.Lock()
	s.anon = max(m.anon, mem["RssAnon"])
	noCgroupPeak := m.noCgroupPeak
	m.mu.Unlock()
	if m.cg != nil && !noCgroupPeak {
		if s.cgroup, err = m.cg.Peak(); err != nil {
			m.b.Fatal(err)
		}
	}
	return s
}

func (m *memoryWatch) close() { close(m.quit); <-m.done }

// report reports s as prefix+peak-RSS-MiB (VmHWM), prefix+peak-anon-MiB
// and, in a cgroup, prefix+cgroup-peak-MiB.
func (s memorySample) report(b *testing.B, prefix string) {
	b.ReportMetric(float64(s.hwm)/(1<<20), prefix+"peak-RSS-MiB")
	b.ReportMetric(float64(s.anon)/(1<<20), prefix+"peak-anon-MiB")
	if s.cgroup >= 0 {
		b.ReportMetric(float64(s.cgroup)/(1<<20), prefix+"cgroup-peak-MiB")
	}
}

// benchBroker starts the broker KDEDUP_TEST_KAFKA selects: Apache Kafka or
// (default) kfake.
func benchBroker(b *testing.B) []string {
	switch k := os.Getenv("KDEDUP_TEST_KAFKA"); k {
	case "apache":
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		c, err := kafkatest.Start(ctx, 1, kafkatest.Options{})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = c.Close() })
		return c.Addrs()
	case "", "kfake":
		c, err := kfake.NewCluster(kfake.NumBrokers(1))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(c.Close)
		return c.ListenAddrs()
	default:
		b.Fatalf("KDEDUP_TEST_KAFKA=%q: want apache, or kfake (the default)", k)
		return nil
	}
}
