package tests

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kdedup/kdedup/internal/s3test"
	"github.com/kdedup/kdedup/internal/scenario"
)

// storeProxy is a reverse proxy in front of an S3-compatible server on
// loopback that delays every request by latency, answers the next
// failLeft requests 503, and, while hang is set, holds every request that
// writes (PUT, POST, DELETE) until the client gives up on it: a slow
// store, one that is down for a while, and one that stops answering
// writes.
type storeProxy struct {
	addr     string
	latency  atomic.Int64 // nanoseconds
	hang     atomic.Bool
	failLeft atomic.Int64 // the next requests answered 503, while positive
	requests atomic.Int64
	hung     atomic.Int64
}

func newStoreProxy(t *testing.T, target string) *storeProxy {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(u)
	sp := &storeProxy{}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	sp.addr = ln.Addr().String()
	// closed ends the requests the proxy holds when the test ends: closing
	// the server ends a held request's context only once the server reads
	// from its connection again, which it may never do for a PUT whose
	// body the handler has not read.
	closed := make(chan struct{})
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sp.requests.Add(1)
		select {
		case <-time.After(time.Duration(sp.latency.Load())):
		case <-r.Context().Done():
			return
		case <-closed:
			return
		}
		if sp.failLeft.Add(-1) >= 0 {
			w.Header().Set("Content-Type", "application/xml")
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte(`<?xml version="1.0" encoding="UTF-8"?><Error><Code>ServiceUnavailable</Code><Message>test outage</Message></Error>`))
			return
		}
		if sp.hang.Load() && r.Method != http.MethodGet && r.Method != http.MethodHead {
			sp.hung.Add(1)
			select {
			case <-r.Context().Done():
			case <-closed:
			}
			return
		}
		rp.ServeHTTP(w, r)
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { close(closed); _ = srv.Close() })
	return sp
}

// url is the KDEDUP_SNAPSHOT_URL of prefix through the proxy.
func (sp *storeProxy) url(prefix string) string {
	return "s3://" + s3test.Bucket + "/" + prefix + "?region=" + s3test.Region + "&endpoint=http://" + sp.addr + "&use_path_style=true"
}

// needsS3 skips a test that needs the S3-compatible server: the CI run
// (.ci/run) sets KDEDUP_TEST_S3=versitygw for this package.
func needsS3(t *testing.T) *s3test.Server {
	t.Helper()
	if !s3test.Enabled() {
		t.Skip("needs an S3-compatible server behind a proxy: set KDEDUP_TEST_S3=versitygw (as .ci/run does)")
	}
	for k, v := range s3test.Env() {
		t.Setenv(k, v)
	}
	return s3test.New(t)
}

// TestSnapshotRestoresOverSlowStore moves 120 partitions, each with a
// snapshot at its group offset, to a worker with an empty disk whose
// snapshot store answers every request 100 ms late. Every partition must be
// restored from its snapshot and none replayed, and the first record of the
// input after the move must be decided within 20 s of the worker's start:
// a restore of one partition is a listing, one manifest read and one
// download (3 requests, 0.3 s here) after the group's join, and partitions
// restore 8 listings at a time, outside the group's callback. Planning
// partition after partition inside the callback, a listing and every
// manifest each, held every fetch for 120 x (1 + KEEP) x 100 ms, 48 s.
func TestSnapshotRestoresOverSlowStore(t *testing.T) {
	srv := needsS3(t)
	const partitions = 120
	p := newPipeline(t, partitions)
	proxy := newStoreProxy(t, srv.Endpoint())
	p.extraEnv = map[string]string{"KDEDUP_SNAPSHOT_INTERVAL": "1s", "KDEDUP_SNAPSHOT_URL": srv.URL(p.group)}
	prod := p.b.client(t, kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.DefaultProduceTopic(p.in))
	produce := func(tag string, n int) []*kgo.Record {
		var recs []*kgo.Record
		for part := range int32(partitions) {
			for i := range n {
				recs = append(recs, &kgo.Record{Partition: part, Key: fmt.Appendf(nil, "p%d-k%d", part, i), Value: fmt.Appendf(nil, "%s-%d", tag, i), Timestamp: scenario.Base})
			}
		}
		if err := prod.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
			t.Fatal(err)
		}
		return recs
	}
	produce("v1", 5)
	w := p.startWorker(t, t.TempDir())
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := scenario.WaitCaughtUp(ctx, p.b.admin(t), p.group, p.in); err != nil {
		t.Fatal(err)
	}
	w.stop(t) // the last snapshots, at the group's offsets
	if n := manifestsAt(t, filepath.Join(srv.Dir(), p.group), 5); n != partitions {
		t.Fatalf("%d partitions have a snapshot at their group offset after a graceful stop, want %d", n, partitions)
	}

	produce("v2", 2) // repeats of part one's keys: dropped only if restored
	fresh := []*kgo.Record{{Partition: 7, Key: []byte("new"), Value: []byte("v3"), Timestamp: scenario.Base}}
	if err := prod.ProduceSync(context.Background(), fresh...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	p.out = p.b.name("out-moved")
	p.b.createTopics(t, partitions, p.out)
	proxy.latency.Store(int64(100 * time.Millisecond))
	p.extraEnv["KDEDUP_SNAPSHOT_URL"] = proxy.url(p.group)
	start := time.Now()
	w = p.startWorker(t, t.TempDir())
	var firstAt time.Duration
	for firstAt == 0 {
		if w.metric(t, "kdedup_consumed_records_total") > 0 {
			firstAt = time.Since(start)
			break
		}
		w.running(t)
		if ctx.Err() != nil {
			t.Fatal("nothing decided within 2 minutes of the move")
		}
		time.Sleep(20 * time.Millisecond)
	}
	w.waitReplayed(t)
	want, got := p.output(t, fresh) // part two's repeats dropped: the snapshots' keys
	requireExact(t, want, got)
	if n := w.metricWith(t, "kdedup_partition_restores_total", "source", "snapshot"); n != partitions {
		t.Errorf("%.0f partitions restored from a snapshot, want all %d", n, partitions)
	}
	if n := w.metric(t, "kdedup_replayed_records_total"); n != 0 {
		t.Errorf("%.0f records replayed, want none: every snapshot was at the group's offset", n)
	}
	t.Logf("first record decided %s after the start; %d store requests through the proxy", firstAt.Round(time.Millisecond), proxy.requests.Load())
	if firstAt > 20*time.Second {
		t.Errorf("the first record was decided %s after the worker started, want within 20s", firstAt.Round(time.Millisecond))
	}
	w.stop(t)
}

// manifestsAt counts the partitions of a directory store with a manifest
// of offset off.
func manifestsAt(t *testing.T, dir string, off int64) int {
	t.Helper()
	n := 0
	name := fmt.Sprintf("%020d-", off)
	err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.Contains(path, string(filepath.Separator)+"manifest"+string(filepath.Separator)) && strings.HasPrefix(d.Name(), name) {
			n++
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestStopWithHangingStore stops a worker whose snapshot store stops
// answering writes (each PUT held until the client gives up) while it has
// new state to upload, with KDEDUP_SHUTDOWN_TIMEOUT=10s, in both delivery
// modes. The stop must return within the timeout without an error, having
// finished its write batches and committed the group's offsets (the output
// is exactly the model's), and leave the uploads to the time left: waiting
// the final snapshots' 30 s for the store made the stop overrun the
// timeout and exit 1.
func TestStopWithHangingStore(t *testing.T) {
	srv := needsS3(t)
	deliveries(t, func(t *testing.T, delivery string) {
		p := newPipeline(t, 2)
		p.delivery = delivery
		proxy := newStoreProxy(t, srv.Endpoint())
		p.extraEnv = map[string]string{"KDEDUP_SNAPSHOT_INTERVAL": "1s", "KDEDUP_SNAPSHOT_URL": proxy.url(p.group), "KDEDUP_SHUTDOWN_TIMEOUT": "10s"}
		part1, part2 := twoParts()
		p.feed(t, part1, len(part1), 0).wait(t)
		w := p.startWorker(t, t.TempDir())
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := scenario.WaitCaughtUp(ctx, p.b.admin(t), p.group, p.in); err != nil {
			t.Fatal(err)
		}
		proxy.hang.Store(true)
		p.feed(t, part2, len(part2), 0).wait(t)
		if err := scenario.WaitCaughtUp(ctx, p.b.admin(t), p.group, p.in); err != nil {
			t.Fatal(err)
		}
		for proxy.hung.Load() == 0 { // an interval upload of part two's state is held
			if ctx.Err() != nil {
				t.Fatal("no upload reached the hanging store within a minute")
			}
			time.Sleep(20 * time.Millisecond)
		}
		begun := time.Now()
		w.stop(t) // fails on the worker's error, ErrShutdownTimeout among them
		took := time.Since(begun)
		t.Logf("stopped in %s with the store hanging", took.Round(time.Millisecond))
		if took > 10*time.Second {
			t.Errorf("the stop took %s, over KDEDUP_SHUTDOWN_TIMEOUT=10s", took.Round(time.Millisecond))
		}
		want, got := p.output(t, append(append([]*kgo.Record{}, part1...), part2...))
		requireExact(t, want, got)
	})
}

// TestSnapshotStoreDownDuringRestore: with KDEDUP_REBUILD=empty, a worker
// with an empty disk takes two partitions while their snapshot store
// answers its next 15 requests 503 (the start-up probe's and the first
// listings', however long the group's join takes). The partitions wait
// for the store (the failures counted) and restore their snapshots once
// it answers: repeats of part one's keys are dropped, as the exact model
// of the whole input says. Before, one failed listing marked the store
// down for 30 s and the partitions started with an empty filter,
// forwarding every repeat.
func TestSnapshotStoreDownDuringRestore(t *testing.T) {
	srv := needsS3(t)
	p := newPipeline(t, 2)
	proxy := newStoreProxy(t, srv.Endpoint())
	p.extraEnv = map[string]string{"KDEDUP_SNAPSHOT_INTERVAL": "1s", "KDEDUP_SNAPSHOT_URL": proxy.url(p.group), "KDEDUP_REBUILD": "empty"}
	part1, part2 := twoParts()
	p.runPart(t, t.TempDir(), part1)
	p.feed(t, part2, len(part2), 0).wait(t)
	// The next 15 requests fail: the start-up probe's and the first
	// listings', each tried 3 times by the SDK, whenever they come.
	proxy.failLeft.Store(15)
	w := p.startWorker(t, t.TempDir())
	w.waitReplayed(t)
	want, got := p.output(t, append(append([]*kgo.Record{}, part1...), part2...))
	requireExact(t, want, got)
	if n := w.metricWith(t, "kdedup_partition_restores_total", "source", "snapshot"); n != 2 {
		t.Errorf("%.0f partitions restored from a snapshot, want 2", n)
	}
	if n := w.metricWith(t, "kdedup_snapshot_store_errors_total", "op", "list"); n < 1 {
		t.Errorf("%.0f failed listings counted, want the outage's", n)
	}
	w.stop(t)
}
