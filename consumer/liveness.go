package consumer

import (
	"sync"
	"time"
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
