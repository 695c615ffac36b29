package tests

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// TestScrapeWhileRunning gathers the metrics of a worker that owns 1,000
// partitions, from four scrapers at once and over and over, while records
// flow: every scrape returns (within 30 s) and the output is exactly the
// model's. A collector that sent its metrics while holding the worker's
// lock deadlocked here: the registry, blocked on its full channel, was
// evaluating the kdedup_worker_ready gauge, which waited for that lock,
// and so did the poll loop.
func TestScrapeWhileRunning(t *testing.T) {
	p := newPipeline(t, 1000)
	recs := stream(16)
	f := p.feed(t, recs, 100, 20*time.Millisecond)
	w := p.startWorker(t, t.TempDir())

	stop := make(chan struct{})
	scrapes := make(chan time.Time, 64)
	scraper := func(reg *prometheus.Registry) {
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := reg.Gather(); err != nil {
				t.Errorf("gathering: %v", err)
			}
			select {
			case scrapes <- time.Now():
			default:
			}
		}
	}
	for range 4 {
		go scraper(w.reg)
	}
	fed := make(chan struct{})
	go func() { f.wait(t); close(fed) }()
	// Scrapes go on until the feed ends and for 50 more: a scrape that
	// does not return within 30 s fails the test.
	n, after := 0, -1
	for after < 50 {
		select {
		case <-scrapes:
			n++
			if after >= 0 {
				after++
			}
		case <-fed:
			after, fed = 0, nil
		case <-time.After(30 * time.Second):
			t.Fatalf("no scrape returned for 30s after %d scrapes: a collector blocks the worker", n)
		}
	}
	want, got := p.output(t, recs)
	close(stop)
	w.stop(t)
	requireExact(t, want, got)
	t.Logf("%d scrapes of a worker with %d partitions while it decided %d records", n, p.partitions, len(recs))
}
