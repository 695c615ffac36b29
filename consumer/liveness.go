package consumer

import (
	"context"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Progress is what a Worker last reported doing, for a liveness check that
// tells a stuck worker from an idle one: its loops report each iteration,
// including those that find no records, and its shutdown each step.
type Progress struct {
	// Stage names what the worker is doing, such as "polling", "handing
	// records to partitions" or "stopping partitions".
	Stage string
	// Since is when the stage began (for a loop, its latest iteration).
	Since time.Time
	// Stopping is true once the worker has begun to shut down.
	Stopping bool
}

// Stalled reports whether p has been in its stage for longer than bound at
// now.
func (p Progress) Stalled(now time.Time, bound time.Duration) bool {
	return now.Sub(p.Since) > bound
}

// pollTick bounds one wait of the at-least-once poll loop for records, so
// that the loop iterates, and reports progress, while the input is idle:
// franz-go's PollRecords otherwise waits for records for ever. An expired
// wait returns no records and loses none.
const pollTick = time.Second

// closeWait bounds how long shutdown waits for the Kafka client to close.
// Closing waits for a group join in flight, which the coordinator answers
// only when the rebalance completes: after every member rejoined or, for a
// static member that has stopped, its session timeout. A worker stopping by
// then has released its partitions; not waiting only delays, by at most a
// session timeout, the group's noticing it left.
const closeWait = 5 * time.Second

// closeClient closes the Kafka client, waiting for it at most closeWait.
func (w *Worker) closeClient() {
	closed := make(chan struct{})
	go func() {
		defer close(closed)
		w.cl.Close()
	}()
	select {
	case <-closed:
	case <-time.After(closeWait):
		w.log.Warn("the Kafka client did not close in time (a group join in flight, or the brokers unreachable); not waiting for it: the group notices the departure within the session timeout",
			"waited", closeWait, "session_timeout", w.opts.SessionTimeout)
	}
}

// liveness holds a Worker's Progress. Its methods are safe for concurrent
// use.
type liveness struct {
	mu       sync.Mutex
	p        Progress
	stopping chan struct{}
}

func newLiveness() *liveness {
	return &liveness{p: Progress{Stage: "starting", Since: time.Now()}, stopping: make(chan struct{})}
}

// stamp reports that stage begins now.
func (l *liveness) stamp(stage string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.p.Stage, l.p.Since = stage, time.Now()
}

// stop reports that shutdown begins, with stage as its first step.
func (l *liveness) stop(stage string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.p.Stage, l.p.Since = stage, time.Now()
	if !l.p.Stopping {
		l.p.Stopping = true
		close(l.stopping)
	}
}

// Progress returns what the worker last reported doing. Safe for concurrent
// use.
func (w *Worker) Progress() Progress {
	w.live.mu.Lock()
	defer w.live.mu.Unlock()
	return w.live.p
}

// Stopping returns a channel that is closed once the worker begins to shut
// down: Run's context ended or a partition failed. Safe for concurrent use.
func (w *Worker) Stopping() <-chan struct{} { return w.live.stopping }

// poll is one at-least-once poll, bounded by pollTick, reporting progress
// before and after it.
func (w *Worker) poll(ctx context.Context) kgo.Fetches {
	w.live.stamp("polling")
	pctx, cancel := context.WithTimeout(ctx, pollTick)
	defer cancel()
	fetches := w.cl.PollRecords(pctx, pollRecords)
	w.live.stamp("handing records to partitions")
	return fetches
}
