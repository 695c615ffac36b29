package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kdedup/kdedup/internal/embedded"
	"github.com/kdedup/kdedup/internal/harness"
	"github.com/kdedup/kdedup/internal/kafkatest"
	"github.com/kdedup/kdedup/internal/scenario"
)

// The systems benchPeers compares.
const (
	peerKdedup      = "kdedup"
	peerPassthrough = "passthrough"
	peerKStreams    = "kstreams"
	// peerKdedupLocal is kdedup without the repartition topic, with
	// -repartition: the same key, deduplicated within each partition
	// (the cost of a record without the hop).
	peerKdedupLocal = "kdedup-local"
)

// spreadField is the JSON field the -repartition stream is keyed by
// (scenario.SpreadKey).
const spreadField = "event_id"

// peerResult is what one system did with the input in one delivery mode.
type peerResult struct {
	round            int
	delivery, system string
	elapsed          time.Duration // process start to the group's commit of the end of the input
	steady           float64       // records/s, see waitGroup
	cpu              time.Duration // user + system of the process, shutdown included
	peakRSS          int64         // VmHWM, shutdown included
	written          int64         // bytes the process sent to the block layer (rusage oublock)
	state, changelog int64         // local state directory at exit; changelog topics on the broker
	output           string        // "exact", or how the output differs from its model
	load             string        // /proc/loadavg before the run
	outputRecords    int
}

// checkPeers returns a usage error when o.peers or o.deliveries names a
// system or a delivery mode benchPeers does not know.
func checkPeers(o benchOptions) error {
	for _, p := range o.peers {
		switch {
		case p == peerKdedupLocal && !o.repartition:
			return fmt.Errorf("%w: -peers: %s runs with -repartition only", errUsage, p)
		case p != peerKdedup && p != peerPassthrough && p != peerKStreams && p != peerKdedupLocal:
			return fmt.Errorf("%w: -peers: unknown system %q (kdedup, passthrough, kstreams or, with -repartition, kdedup-local)", errUsage, p)
		}
	}
	if o.repartition && o.window != 0 {
		return fmt.Errorf("%w: -repartition and -window cannot be combined", errUsage)
	}
	for _, d := range o.deliveries {
		if d != "at-least-once" && d != "exactly-once" {
			return fmt.Errorf("%w: -delivery: %q is neither at-least-once nor exactly-once", errUsage, d)
		}
	}
	return nil
}

// benchPeers runs the comparison on one Apache Kafka broker started by
// internal/kafkatest: it produces the generated stream once, then, for each
// round and delivery mode, runs each system of o.peers as its own process
// (o.kdedupBin run; this binary's stateless passthrough; the Kafka Streams
// deduplicator of bench/kstreams-peer in its own JVM), each in its own
// group and to its own output topic, rotating their order at every step.
// Each run is measured from the process's start to its group's commit of
// the end of the input; the process is then stopped with SIGTERM and its
// CPU time, peak resident memory and disk writes (shutdown included) are
// read, its output is read with read_committed and compared with its exact
// model (internal/scenario: the deduplicated stream, or every record for
// the passthrough), and its output and changelog topics are deleted.
func benchPeers(ctx context.Context, o benchOptions, stdout io.Writer) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	var jar string
	if slices.Contains(o.peers, peerKStreams) {
		if jar, err = buildKStreamsPeer(ctx, o.kstreamsDir, stdout); err != nil {
			return err
		}
	}
	started := time.Now()
	cluster, err := kafkatest.Start(ctx, 1, kafkatest.Options{})
	if err != nil {
		return fmt.Errorf("starting Apache Kafka: %w", err)
	}
	defer cluster.Close()
	fmt.Fprintf(stdout, "Apache Kafka %s: one broker at %s, up in %s\n", kafkatest.DefaultVersion, cluster.Addrs()[0], time.Since(started).Round(time.Millisecond))
	o.brokers = cluster.Addrs()
	adm, err := kgo.NewClient(kgo.SeedBrokers(o.brokers...))
	if err != nil {
		return err
	}
	defer adm.Close()
	o.adm = kadm.NewClient(adm)
	const in = "events"
	if _, err := o.adm.CreateTopic(ctx, int32(o.partitions), 1, nil, in); err != nil {
		return fmt.Errorf("creating %s: %w", in, err)
	}
	var checks map[string]func([]*kgo.Record) string
	if o.repartition {
		if checks, err = produceSpread(ctx, &o, in, stdout); err != nil {
			return err
		}
	} else {
		recs, keys, err := produceBench(ctx, o, in, stdout)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "stream: %d records, %d distinct keys, %d partitions\n", o.records, keys, o.partitions)
		want, _ := scenario.ExpectWith(recs, scenario.ExpectOptions{Window: o.window, Generations: 8})
		every := scenario.Observe(recs)
		check := func(model scenario.Model) func([]*kgo.Record) string {
			return func(got []*kgo.Record) string { return modelCheck(model, got, stdout) }
		}
		checks = map[string]func([]*kgo.Record) string{peerKdedup: check(want), peerKStreams: check(want), peerPassthrough: check(every)}
	}

	var results []peerResult
	step := 0
	for round := 1; round <= o.rounds; round++ {
		for _, delivery := range o.deliveries {
			order := append(append([]string(nil), o.peers[step%len(o.peers):]...), o.peers[:step%len(o.peers)]...)
			step++
			for _, system := range order {
				res, err := runPeer(ctx, o, exe, jar, system, delivery, round, checks[system], stdout)
				if err != nil {
					return fmt.Errorf("%s (%s): %w", system, delivery, err)
				}
				results = append(results, res)
			}
		}
	}
	printPeerTable(stdout, o, results)
	return nil
}

// modelCheck is "exact" when got is the model's output, else how it
// differs (the differences printed to stdout).
func modelCheck(model scenario.Model, got []*kgo.Record, stdout io.Writer) string {
	observed := scenario.Observe(got)
	d := scenario.Diff(model, observed, 3)
	if len(d) == 0 {
		return "exact"
	}
	missing, extra := scenario.Missing(model, observed, 1<<30)
	for _, line := range d {
		fmt.Fprintf(stdout, "  %s\n", line)
	}
	// kdedup's filter is probabilistic: a false positive drops a record
	// whose key is new, so a few missing records are expected (about the
	// false-positive rate times the keys it has seen).
	return fmt.Sprintf("differs: %d missing (%.1e of %d), %d extra", len(missing), float64(len(missing))/float64(model.Stats.Forwarded), model.Stats.Forwarded, extra)
}

// produceSpread produces, for -repartition, the spread stream of about
// o.records records (scenario.GenerateSpread: events keyed by a JSON field,
// sent by producers that partition them apart), sets o.records to its
// length, and returns each system's check of its output: each event once
// (kdedup, kstreams), once per partition holding a copy (kdedup-local),
// every record (passthrough).
func produceSpread(ctx context.Context, o *benchOptions, topic string, stdout io.Writer) (map[string]func([]*kgo.Record) string, error) {
	recs := scenario.GenerateSpread(scenario.SpreadOptions{Events: max(1, o.records*100/221), Partitions: int32(o.partitions)})
	o.records = len(recs)
	cl, err := kgo.NewClient(kgo.SeedBrokers(o.brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		return nil, err
	}
	start := time.Now()
	err = scenario.Produce(ctx, cl, topic, recs)
	cl.Close()
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(stdout, "produced %d records to %s in %s\n", len(recs), topic, time.Since(start).Round(time.Millisecond))
	fmt.Fprintf(stdout, "stream: %d records of events keyed by %s, %d of them with copies in more than one of %d partitions\n",
		len(recs), scenario.SpreadKey, scenario.SpreadPartitions(recs), o.partitions)
	verdict := func(problems []string, extra int) string {
		if len(problems) == 0 && extra == 0 {
			return "exact"
		}
		for _, p := range problems[:min(3, len(problems))] {
			fmt.Fprintf(stdout, "  %s\n", p)
		}
		// A false positive of kdedup's filter drops an event whose id is
		// new: expected, about the false-positive rate times the events.
		missing := 0
		for _, p := range problems {
			if strings.HasSuffix(p, "(missing)") {
				missing++
			}
		}
		return fmt.Sprintf("differs: %d events missing, %d other problems, %d extra", missing, len(problems)-missing, extra)
	}
	every := map[string]int{}
	for _, r := range recs {
		every[scenario.WholeSignature(r)]++
	}
	return map[string]func([]*kgo.Record) string{
		peerKdedup:      func(got []*kgo.Record) string { return verdict(scenario.SpreadCheck(recs, got, true, 1<<30)) },
		peerKStreams:    func(got []*kgo.Record) string { return verdict(scenario.SpreadCheck(recs, got, true, 1<<30)) },
		peerKdedupLocal: func(got []*kgo.Record) string { return verdict(scenario.SpreadCheckWithin(recs, got, true, 1<<30)) },
		peerPassthrough: func(got []*kgo.Record) string {
			left := maps.Clone(every)
			extra := 0
			for _, r := range got {
				if s := scenario.WholeSignature(r); left[s] > 0 {
					left[s]--
				} else {
					extra++
				}
			}
			missing := 0
			for _, n := range left {
				missing += n
			}
			if missing == 0 && extra == 0 {
				return "exact"
			}
			return fmt.Sprintf("differs: %d missing, %d extra", missing, extra)
		},
	}, nil
}

// repartitionTopic is the repartition topic a system's run writes with
// -repartition ("" for none): kdedup's KDEDUP_REPARTITION_TOPIC, Kafka
// Streams' internal topic of its repartition() step.
func repartitionTopic(o benchOptions, system, group string) string {
	switch {
	case !o.repartition:
		return ""
	case system == peerKdedup:
		return group + "-repartition"
	case system == peerKStreams:
		return group + "-by-dedup-key-repartition"
	}
	return ""
}

// runPeer runs one system once, measures it and checks its output.
func runPeer(ctx context.Context, o benchOptions, exe, jar, system, delivery string, round int, check func([]*kgo.Record) string, stdout io.Writer) (peerResult, error) {
	short := map[string]string{"at-least-once": "alo", "exactly-once": "eos"}[delivery]
	group := fmt.Sprintf("%s-%s-%d", system, short, round)
	out := group + "-out"
	if _, err := o.adm.CreateTopic(ctx, int32(o.partitions), 1, nil, out); err != nil {
		return peerResult{}, fmt.Errorf("creating %s: %w", out, err)
	}
	repart := repartitionTopic(o, system, group)
	if system == peerKdedup && repart != "" {
		if _, err := o.adm.CreateTopic(ctx, int32(o.partitions), 1, nil, repart); err != nil {
			return peerResult{}, fmt.Errorf("creating %s: %w", repart, err)
		}
	}
	dir, err := os.MkdirTemp("", "kdedup-bench-"+system+"-")
	if err != nil {
		return peerResult{}, err
	}
	defer os.RemoveAll(dir)
	var (
		cmd      *exec.Cmd
		httpAddr = "127.0.0.1:0"
		profile  string // with -cpu-profile, kdedup's: file-<system>-<delivery>-<round>
	)
	switch system {
	case peerKdedup, peerKdedupLocal:
		if o.cpuProfile != "" {
			if httpAddr, err = harness.FreeAddr(); err != nil {
				return peerResult{}, err
			}
			profile = fmt.Sprintf("%s-%s-%s-%d", o.cpuProfile, system, short, round)
		}
		cmd = exec.Command(o.kdedupBin, "run")
		cmd.Env = harness.WorkerEnv("KDEDUP_BROKERS="+o.brokers[0], "KDEDUP_INPUT_TOPICS=events", "KDEDUP_OUTPUT_TOPIC="+out,
			"KDEDUP_GROUP="+group, "KDEDUP_DATA_DIR="+dir, "KDEDUP_HTTP_ADDR="+httpAddr, "KDEDUP_LOG_FORMAT=text",
			"KDEDUP_LOG_LEVEL=warn", "KDEDUP_DELIVERY="+delivery, "KDEDUP_WINDOW="+o.window.String(),
			fmt.Sprintf("KDEDUP_PPROF=%t", profile != ""))
		if o.repartition {
			cmd.Env = append(cmd.Env, "KDEDUP_KEY="+scenario.SpreadKey)
		}
		if repart != "" {
			cmd.Env = append(cmd.Env, "KDEDUP_REPARTITION_TOPIC="+repart)
		}
	case peerPassthrough:
		cmd = exec.Command(exe, "peers", "-passthrough-child", "-brokers", o.brokers[0], "-group", group, "-out", out, "-delivery", delivery)
	case peerKStreams:
		guarantee := map[string]string{"at-least-once": "at_least_once", "exactly-once": "exactly_once_v2"}[delivery]
		cmd = exec.Command(javaBin(), "-Xmx"+o.kstreamsHeap, "-jar", jar, "--bootstrap="+o.brokers[0], "--input=events",
			"--output="+out, "--application-id="+group, "--state-dir="+dir, "--guarantee="+guarantee,
			fmt.Sprintf("--window-ms=%d", o.window.Milliseconds()), fmt.Sprintf("--threads=%d", o.kstreamsThreads))
		if o.repartition {
			cmd.Args = append(cmd.Args, "--repartition-json-field="+spreadField)
		}
	}
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	res := peerResult{round: round, delivery: delivery, system: system, load: loadAvg()}
	fmt.Fprintf(stdout, "round %d, %s: %s (group %s), load average %s ...\n", round, delivery, system, group, res.load)

	start := time.Now()
	if err := cmd.Start(); err != nil {
		return peerResult{}, fmt.Errorf("starting %s: %w", cmd.Path, err)
	}
	exited := make(chan struct{})
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(exited) }()
	hwm := startHWMSampler(cmd.Process.Pid)
	defer hwm.stop()
	wctx, cancel := context.WithCancel(ctx)
	go func() {
		select {
		case <-exited:
			cancel()
		case <-wctx.Done():
		}
	}()
	var profiled chan error
	if profile != "" {
		profiled = make(chan error, 1)
		go func() {
			if _, err := embedded.WaitReady(wctx, httpAddr, nil); err != nil {
				profiled <- err
				return
			}
			profiled <- harness.FetchCPUProfile(wctx, httpAddr, o.profileTime, profile)
		}()
	}
	res.steady, err = waitGroup(wctx, o, group, start, stdout)
	if err == nil && repart != "" {
		// Decided once the second stage has read the whole hop too.
		err = scenario.WaitDecided(wctx, o.brokers, group, repart)
	}
	if err == nil && profiled != nil {
		if err = <-profiled; err == nil {
			fmt.Fprintf(stdout, "  %s: CPU profile of its first %s after its group join in %s\n", system, o.profileTime, profile)
		}
	}
	cancel()
	if err != nil {
		_ = cmd.Process.Kill()
		<-exited
		return peerResult{}, errors.Join(err, waitErr)
	}
	res.elapsed = time.Since(start)
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		return peerResult{}, err
	}
	select {
	case <-exited:
	case <-time.After(2 * time.Minute):
		_ = cmd.Process.Kill()
		<-exited
		return peerResult{}, fmt.Errorf("%s did not exit within 2m of SIGTERM", system)
	}
	res.peakRSS = hwm.stop()
	// A JVM ends with 143 when its shutdown hooks have run on SIGTERM.
	if waitErr != nil && cmd.ProcessState.ExitCode() != 128+int(syscall.SIGTERM) {
		return peerResult{}, fmt.Errorf("%s: %w", system, waitErr)
	}
	if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		res.cpu = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
		res.written = ru.Oublock * 512 // Linux counts write_bytes (/proc/pid/io) in 512-byte blocks
	}
	res.state = dirBytes(dir)
	if res.changelog, err = changelogBytes(ctx, o.adm, group); err != nil {
		return peerResult{}, err
	}
	got, err := scenario.ReadAll(ctx, o.brokers, out)
	if err != nil {
		return peerResult{}, err
	}
	res.outputRecords = len(got)
	res.output = check(got)
	fmt.Fprintf(stdout, "  %s: %d records in %s: %.0f records/s (steady %.0f); CPU %s; peak RSS %d MiB; wrote %d MiB to disk; state %d MiB, changelog %d MiB at the end; output %d records: %s\n",
		system, o.records, res.elapsed.Round(time.Millisecond), float64(o.records)/res.elapsed.Seconds(), res.steady,
		res.cpu.Round(time.Millisecond), res.peakRSS>>20, res.written>>20, res.state>>20, res.changelog>>20, res.outputRecords, res.output)

	topics := []string{out}
	if repart != "" {
		topics = append(topics, repart)
	}
	if lc, err := o.adm.ListTopics(ctx); err == nil {
		for _, t := range lc.Names() {
			if strings.HasPrefix(t, group+"-") && strings.HasSuffix(t, "-changelog") {
				topics = append(topics, t)
			}
		}
	}
	if _, err := o.adm.DeleteTopics(ctx, topics...); err != nil {
		return peerResult{}, fmt.Errorf("deleting %v: %w", topics, err)
	}
	return res, nil
}

// changelogBytes is the size on the broker of the changelog topics of a
// Kafka Streams application (named <application.id>-<store>-changelog).
func changelogBytes(ctx context.Context, adm *kadm.Client, app string) (int64, error) {
	dirs, err := adm.DescribeAllLogDirs(ctx, nil)
	if err != nil {
		return 0, fmt.Errorf("describing the broker's log directories: %w", err)
	}
	var n int64
	dirs.Each(func(d kadm.DescribedLogDir) {
		d.Topics.Each(func(p kadm.DescribedLogDirPartition) {
			if strings.HasPrefix(p.Topic, app+"-") && strings.HasSuffix(p.Topic, "-changelog") {
				n += p.Size
			}
		})
	})
	return n, nil
}

// dirBytes is the size of the files under dir.
func dirBytes(dir string) int64 {
	var n int64
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				n += fi.Size()
			}
		}
		return nil
	})
	return n
}

func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

func javaBin() string {
	if home := os.Getenv("JAVA_HOME"); home != "" {
		return filepath.Join(home, "bin", "java")
	}
	return "java"
}

// buildKStreamsPeer builds the Kafka Streams deduplicator with Maven in dir
// and returns its jar.
func buildKStreamsPeer(ctx context.Context, dir string, stdout io.Writer) (string, error) {
	if _, err := os.Stat(filepath.Join(dir, "pom.xml")); err != nil {
		return "", fmt.Errorf("%w: -kstreams-dir %s holds no pom.xml (run from the repository root): %v", errUsage, dir, err)
	}
	fmt.Fprintf(stdout, "building the Kafka Streams peer: mvn -q -B package in %s\n", dir)
	cmd := exec.CommandContext(ctx, "mvn", "-q", "-B", "package")
	cmd.Dir = dir
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building the Kafka Streams peer (mvn -q -B package in %s): %w\n%s", dir, err, b)
	}
	return filepath.Abs(filepath.Join(dir, "target", "kstreams-peer.jar"))
}

// printPeerTable prints the results as a Markdown table.
func printPeerTable(w io.Writer, o benchOptions, rs []peerResult) {
	fmt.Fprintf(w, "\n%d records, %d partitions, window %s; records/s from process start to the group's commit of the end of the input\n\n", o.records, o.partitions, o.window)
	fmt.Fprintln(w, "| round | delivery | system | records/s | steady records/s | CPU s | CPU µs/record | peak RSS MiB | disk written MiB | state at end MiB | changelog MiB | output | load average |")
	fmt.Fprintln(w, "| ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |")
	for _, r := range rs {
		fmt.Fprintf(w, "| %d | %s | %s | %.0f | %.0f | %.1f | %.2f | %d | %.1f | %.1f | %.1f | %s | %s |\n",
			r.round, r.delivery, r.system, float64(o.records)/r.elapsed.Seconds(), r.steady, r.cpu.Seconds(),
			float64(r.cpu.Microseconds())/float64(o.records), r.peakRSS>>20, mib(r.written), mib(r.state), mib(r.changelog), r.output, r.load)
	}
}

func mib(n int64) float64 { return float64(n) / (1 << 20) }

// passthroughChild is the passthrough as its own process (bench
// -passthrough-child), so that its CPU time and memory are measured as the
// other systems' are: at least once as runPassthrough does, exactly once in
// a transaction per second (a group transact session). It runs until ctx
// ends (SIGTERM), then commits what it forwarded.
func passthroughChild(ctx context.Context, brokers []string, group, out, delivery string) error {
	const interval = time.Second
	eos := delivery == "exactly-once"
	opts := passthroughOpts(brokers, group, out, interval, eos)
	if !eos {
		cl, err := kgo.NewClient(opts...)
		if err != nil {
			return err
		}
		defer cl.Close()
		return passthroughLoop(ctx, cl, interval)
	}
	s, err := kgo.NewGroupTransactSession(opts...)
	if err != nil {
		return err
	}
	defer s.Close()
	for ctx.Err() == nil {
		if err := s.Begin(); err != nil {
			return fmt.Errorf("beginning a transaction: %w", err)
		}
		var (
			mu      sync.Mutex
			prodErr error
		)
		deadline := time.Now().Add(interval)
		for ctx.Err() == nil && time.Now().Before(deadline) {
			pctx, cancel := context.WithDeadline(ctx, deadline)
			fetches := s.PollRecords(pctx, 10_000)
			cancel()
			if fetches.IsClientClosed() {
				return nil
			}
			fetches.EachRecord(func(r *kgo.Record) {
				s.Produce(context.Background(), &kgo.Record{Key: r.Key, Value: r.Value, Headers: r.Headers, Timestamp: r.Timestamp}, func(_ *kgo.Record, err error) {
					if err != nil {
						mu.Lock()
						prodErr = firstErr(prodErr, err)
						mu.Unlock()
					}
				})
			})
			s.AllowRebalance() // the worker's settings block rebalances while polled records are handled
		}
		try := kgo.TryCommit
		if err := s.Client().Flush(context.Background()); err != nil {
			try = kgo.TryAbort
		}
		mu.Lock()
		if prodErr != nil {
			try = kgo.TryAbort
		}
		mu.Unlock()
		if _, err := s.End(context.Background(), try); err != nil {
			return fmt.Errorf("ending a transaction: %w", err)
		}
	}
	return nil
}
