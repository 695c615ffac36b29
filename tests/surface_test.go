package tests

import (
	"bufio"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kdedup/kdedup/config"
	"github.com/kdedup/kdedup/internal/app"
	"github.com/kdedup/kdedup/internal/scenario"
)

// startWorkerWith runs a worker in this process with Run options, and
// returns it with its HTTP address.
func (p *pipeline) startWorkerWith(t *testing.T, dataDir string, opts ...app.Option) (*worker, string) {
	t.Helper()
	cfg, err := config.LoadFrom(p.env(dataDir))
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: cfg.SlogLevel()}))
	ctx, cancel := context.WithCancel(context.Background())
	w := &worker{cancel: cancel, done: make(chan error, 1), reg: prometheus.NewRegistry()}
	addr := make(chan string, 1)
	go func() { w.done <- app.Run(ctx, cfg, log, w.reg, func(a string) { addr <- a }, opts...) }()
	t.Cleanup(func() { w.cancel(); <-w.done })
	select {
	case a := <-addr:
		return w, a
	case err := <-w.done:
		w.done <- err
		t.Fatalf("worker stopped before serving HTTP: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("worker not serving HTTP after 30s")
	}
	return nil, ""
}

// pollBlocker is a franz-go hook that, once armed, blocks the goroutine
// that polls the next record until released: a worker's loop stuck.
type pollBlocker struct {
	armed   atomic.Bool
	release chan struct{}
	once    sync.Once
}

func (b *pollBlocker) OnFetchRecordUnbuffered(_ *kgo.Record, polled bool) {
	if polled && b.armed.Load() {
		<-b.release
	}
}

func (b *pollBlocker) unblock() { b.once.Do(func() { close(b.release) }) }

// waitStatus polls path until it answers want, for up to limit.
func waitStatus(t *testing.T, addr, path string, want int, limit time.Duration) string {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		code, body := get(t, addr, path)
		if code == want {
			return body
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s answered %d (%q) for %s, want %d", path, code, body, limit, want)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestLivenessIdleAndStuck: /healthz stays 200 while the input is idle for
// longer than KDEDUP_LIVENESS_TIMEOUT, and turns 503, naming the stage,
// once the poll loop is stuck for longer than it.
func TestLivenessIdleAndStuck(t *testing.T) {
	deliveries(t, func(t *testing.T, delivery string) {
		t.Parallel()
		const bound = 10 * time.Second
		p := newPipeline(t, 2)
		p.delivery = delivery
		p.extraEnv = map[string]string{"KDEDUP_LIVENESS_TIMEOUT": bound.String()}
		block := &pollBlocker{release: make(chan struct{})}
		recs := stream(11)[:200]
		p.feed(t, recs, len(recs), 0).wait(t)
		_, addr := p.startWorkerWith(t, t.TempDir(), app.WithClientOpts(kgo.WithHooks(block)))
		t.Cleanup(block.unblock) // runs before the worker's cleanup, which waits for the loop
		waitStatus(t, addr, "/readyz", 200, 30*time.Second)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := scenario.WaitCaughtUp(ctx, p.b.admin(t), p.group, p.in); err != nil {
			t.Fatal(err)
		}

		// Idle input: longer than the bound, and always alive.
		for idleUntil := time.Now().Add(bound + 2*time.Second); time.Now().Before(idleUntil); time.Sleep(250 * time.Millisecond) {
			if code, body := get(t, addr, "/healthz"); code != 200 {
				t.Fatalf("/healthz answered %d (%q) while the input was idle", code, body)
			}
		}

		// The loop stuck on the next record: not alive within the bound
		// and a little more.
		block.armed.Store(true)
		stuckAt := time.Now()
		p.feed(t, stream(12)[:1], 1, 0).wait(t)
		body := waitStatus(t, addr, "/healthz", 503, bound+15*time.Second)
		// The bound runs from the loop's last report, at most one idle poll
		// (a second) before the record that blocks it arrived.
		if d := time.Since(stuckAt); d < bound-2*time.Second {
			t.Errorf("/healthz failed %s after the loop stuck, before KDEDUP_LIVENESS_TIMEOUT=%s", d, bound)
		}
		if !strings.Contains(body, "stuck") || !strings.Contains(body, "KDEDUP_LIVENESS_TIMEOUT") {
			t.Errorf("/healthz body %q does not say what is stuck", body)
		}
	})
}

// TestHTTPClosesIdleConnections: a keep-alive connection left idle is
// closed by the server after the idle timeout.
func TestHTTPClosesIdleConnections(t *testing.T) {
	p := newPipeline(t, 1)
	_, addr := p.startWorkerWith(t, t.TempDir(), app.WithHTTPIdleTimeout(time.Second))
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, "GET /healthz HTTP/1.1\r\nHost: kdedup\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(conn)
	status, err := r.ReadString('\n')
	if err != nil || !strings.HasPrefix(status, "HTTP/1.1 ") {
		t.Fatalf("response %q, %v", status, err)
	}
	// Read the rest of the response, then wait for the server to close.
	start := time.Now()
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err = io.Copy(io.Discard, r)
	var ne net.Error
	switch {
	case errors.As(err, &ne) && ne.Timeout():
		t.Fatalf("idle connection still open after %s", time.Since(start).Round(time.Millisecond))
	case err != nil && !errors.Is(err, syscall.ECONNRESET):
		t.Fatalf("reading until the server closes: %v", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("idle connection closed after %s, want about the 1s idle timeout", d)
	}
}

// TestShutdownBoundedWhenDataDirRemoved: the data directory removed under
// a running worker makes Badger retry its memtable flush for ever; after
// SIGTERM the worker logs the signal, and exits 1 within
// KDEDUP_SHUTDOWN_TIMEOUT with a structured error naming what was still
// running. At LOG_LEVEL=info the Kafka client's own informational lines
// are not logged.
func TestShutdownBoundedWhenDataDirRemoved(t *testing.T) {
	const timeout = 3 * time.Second
	p := newPipeline(t, 2)
	recs := stream(13)[:500]
	p.feed(t, recs, len(recs), 0).wait(t)
	dataDir := t.TempDir()
	pr := p.startProcess(t, dataDir, "KDEDUP_LOG_LEVEL=info", "KDEDUP_SHUTDOWN_TIMEOUT="+timeout.String())
	pr.waitReady(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := scenario.WaitCaughtUp(ctx, p.b.admin(t), p.group, p.in); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(dataDir); err != nil {
		t.Fatal(err)
	}
	p.feed(t, stream(14)[:500], 500, 0).wait(t) // changes that Badger must flush
	time.Sleep(500 * time.Millisecond)

	if err := pr.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	signaled := time.Now()
	exited := make(chan error, 1)
	go func() { exited <- pr.cmd.Wait() }()
	var err error
	select {
	case err = <-exited:
	case <-time.After(timeout + 20*time.Second):
		t.Fatalf("worker still running %s after SIGTERM with KDEDUP_SHUTDOWN_TIMEOUT=%s", time.Since(signaled).Round(time.Second), timeout)
	}
	took := time.Since(signaled)
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("worker exited with %v, want exit code 1", err)
	}
	if took > timeout+5*time.Second {
		t.Errorf("worker exited %s after SIGTERM, want about KDEDUP_SHUTDOWN_TIMEOUT=%s", took.Round(time.Millisecond), timeout)
	}
	log := pr.logText(t)
	for _, re := range []string{
		// The signal, or the worker itself failing its next write batch
		// into the missing directory first (whichever comes first).
		`level=INFO msg="(received signal, shutting down" signal=terminated|shutting down")`,
		`level=ERROR msg="kdedup stopped on an error" err="shutdown timed out: not stopped within KDEDUP_SHUTDOWN_TIMEOUT=3s; still running: [^"]+" exit_code=1`,
	} {
		if !regexp.MustCompile(re).MatchString(log) {
			t.Errorf("log has no line matching %s", re)
		}
	}
	for _, chatter := range []string{"beginning to manage the group lifecycle", "assigning partitions"} {
		if strings.Contains(log, chatter) {
			t.Errorf("the Kafka client's %q is logged at LOG_LEVEL=info", chatter)
		}
	}
	if t.Failed() {
		t.Logf("worker log:\n%s", log)
	} else if m := regexp.MustCompile(`still running: [^"]+`).FindString(log); m != "" {
		t.Logf("exited %s after SIGTERM: %s", took.Round(time.Millisecond), m)
	}
}

// TestSIGTERMDuringJoin: a worker whose JoinGroup waits for a static member
// that has stopped (the coordinator holds the join until that member's
// session expires) stops promptly and cleanly on SIGTERM.
func TestSIGTERMDuringJoin(t *testing.T) {
	const session = 30 * time.Second
	p := newPipeline(t, 2)
	gone := p.startProcess(t, t.TempDir(), "KDEDUP_LOG_LEVEL=info", "KDEDUP_INSTANCE_ID=gone", "KDEDUP_SESSION_TIMEOUT="+session.String())
	gone.waitReady(t)
	if err := gone.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := gone.cmd.Wait(); err != nil {
		t.Fatalf("first member: %v", err)
	}
	// A static member that stops stays in the group for its session.
	joiner := p.startProcess(t, t.TempDir(), "KDEDUP_INSTANCE_ID=joiner", "KDEDUP_SESSION_TIMEOUT="+session.String(), "KDEDUP_LOG_LEVEL=debug")
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(joiner.logText(t), "wrote JoinGroup") {
		if time.Now().After(deadline) {
			t.Fatal("the second member sent no JoinGroup within 10s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(500 * time.Millisecond)
	if strings.Contains(joiner.logText(t), "read JoinGroup") {
		t.Fatal("the join completed at once: the coordinator did not wait for the stopped static member, nothing to test")
	}
	if err := joiner.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	signaled := time.Now()
	exited := make(chan error, 1)
	go func() { exited <- joiner.cmd.Wait() }()
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("worker stopped during its join with %v, want exit 0", err)
		}
	case <-time.After(session):
		t.Fatalf("worker still running %s after SIGTERM during its join", session)
	}
	if d := time.Since(signaled); d > 10*time.Second {
		t.Errorf("worker took %s to stop during its join", d.Round(time.Millisecond))
	}
}
