package embedded

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"go.uber.org/goleak"

	"github.com/kdedup/kdedup/config"
	"github.com/kdedup/kdedup/internal/scenario"
)

// The broker, the worker and their clients start goroutines; each must be
// gone once a test has stopped them.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// A stream produced through the harness and deduplicated by the worker it
// starts comes out as the exact model says, and WaitCommitted returns once
// the group has committed every record.
func TestRunWorker(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const in, out, group = "in", "out", "g"
	c, err := NewCluster(3, in, out)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	recs := CloneRecords(scenario.Generate(scenario.Options{Keys: 2000}))
	if err := c.Produce(ctx, in, recs, io.Discard); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.LoadFrom(map[string]string{
		"KDEDUP_BROKERS": c.Brokers[0], "KDEDUP_INPUT_TOPICS": in, "KDEDUP_OUTPUT_TOPIC": out, "KDEDUP_GROUP": group,
		"KDEDUP_DATA_DIR": t.TempDir(), "KDEDUP_HTTP_ADDR": "127.0.0.1:0", "KDEDUP_FINGERPRINT_BITS": "32",
	})
	if err != nil {
		t.Fatal(err)
	}
	w, err := StartWorker(ctx, cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if w.ReadyAt.Before(w.Started) {
		t.Errorf("ready at %v, before the start %v", w.ReadyAt, w.Started)
	}
	if _, err := WaitCommitted(ctx, c.Admin, group, in, len(recs), w.ReadyAt, io.Discard); err != nil {
		_ = w.Stop()
		t.Fatal(err)
	}
	if err := w.Stop(); err != nil {
		t.Fatal(err)
	}
	committed, err := c.Admin.FetchOffsets(ctx, group)
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	committed.Each(func(r kadm.OffsetResponse) { n += r.At })
	if n != int64(len(recs)) {
		t.Errorf("group committed %d records, %d produced", n, len(recs))
	}
	got, err := scenario.ReadAll(ctx, c.Brokers, out)
	if err != nil {
		t.Fatal(err)
	}
	if d := scenario.Diff(scenario.Expect(recs, true), scenario.Observe(got), 5); len(d) > 0 {
		t.Errorf("output differs from the exact model: %v", d)
	}
}

// WaitReady returns the worker's error when the worker stops before it is
// ready, and the context's when that ends first.
func TestWaitReady(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing answers at addr
	stopped := errors.New("stopped")
	done := make(chan error, 1)
	done <- stopped
	if _, err := WaitReady(context.Background(), addr, done); !errors.Is(err, stopped) {
		t.Errorf("WaitReady after the worker stopped: %v, want %v", err, stopped)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := WaitReady(ctx, addr, make(chan error)); !errors.Is(err, context.Canceled) {
		t.Errorf("WaitReady after the context ended: %v, want context.Canceled", err)
	}
}
