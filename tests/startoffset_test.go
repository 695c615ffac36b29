package tests

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kdedup/kdedup/internal/scenario"
)

// keyed returns n records with the distinct keys prefix0, prefix1, ...
func keyed(prefix string, n int) []*kgo.Record {
	recs := make([]*kgo.Record, n)
	for i := range recs {
		k := fmt.Sprintf("%s%d", prefix, i)
		recs[i] = &kgo.Record{Key: []byte(k), Value: []byte("v-" + k)}
	}
	return recs
}

// outputKeys reads the output topic once the group has committed the
// whole input, and returns its keys sorted.
func (p *pipeline) outputKeys(t *testing.T) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := scenario.WaitCaughtUp(ctx, p.b.admin(t), p.group, p.in); err != nil {
		t.Fatal(err)
	}
	out, err := scenario.ReadAll(ctx, p.b.addrs, p.out, p.b.conn...)
	if err != nil {
		t.Fatal(err)
	}
	keys := make([]string, 0, len(out))
	for _, r := range out {
		keys = append(keys, string(r.Key))
	}
	slices.Sort(keys)
	return keys
}

func sortedKeys(recs []*kgo.Record) []string {
	keys := make([]string, 0, len(recs))
	for _, r := range recs {
		keys = append(keys, string(r.Key))
	}
	slices.Sort(keys)
	return keys
}

// TestResumeBelowLogStart: with KDEDUP_START_OFFSET=latest, a worker
// decides 10 records and stops; 100 more arrive and retention deletes the
// first 50 of them (up to offset 60, past the group's offset 10, before
// the end). The next worker (with the data directory, or without it: a
// rebuild by replay, partial) resumes at the log start, never at the end:
// the output holds the first 10 records and the 50 retained ones, exactly,
// and kdedup_retention_skipped_offsets_total counts the 50 deleted before
// anyone decided them.
func TestResumeBelowLogStart(t *testing.T) {
	for _, tc := range []struct {
		name    string
		keepDir bool
		partial float64 // partial rebuilds counted by the second worker
	}{{"same data directory", true, 0}, {"new data directory", false, 1}} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPipeline(t, 1)
			p.extraEnv = map[string]string{"KDEDUP_START_OFFSET": "latest"}
			dir := t.TempDir()
			w := p.startWorker(t, dir)
			waitReadyOwning(t, w, 1)
			first, later := keyed("first-", 10), keyed("later-", 100)
			p.feed(t, first, len(first), 0).wait(t)
			if got, want := p.outputKeys(t), sortedKeys(first); !slices.Equal(got, want) {
				t.Fatalf("first run forwarded %v, want %v", got, want)
			}
			w.stop(t)

			p.feed(t, later, len(later), 0).wait(t)
			ctx := context.Background()
			if _, err := p.b.admin(t).DeleteRecords(ctx, kadm.Offsets{p.in: {0: {Topic: p.in, Partition: 0, At: 60}}}); err != nil {
				t.Fatal(err)
			}
			if !tc.keepDir {
				dir = t.TempDir()
			}
			w = p.startWorker(t, dir)
			want := sortedKeys(append(slices.Clone(first), later[50:]...))
			if got := p.outputKeys(t); !slices.Equal(got, want) {
				t.Fatalf("output holds %d records, want the %d of the first run and the retained ones:\n got %v\nwant %v", len(got), len(want), got, want)
			}
			if n := w.metric(t, "kdedup_retention_skipped_offsets_total"); n != 50 {
				t.Errorf("kdedup_retention_skipped_offsets_total = %.0f, want 50", n)
			}
			if n := w.metric(t, "kdedup_partial_rebuilds_total"); n != tc.partial {
				t.Errorf("kdedup_partial_rebuilds_total = %.0f, want %.0f", n, tc.partial)
			}
			w.stop(t)
		})
	}
}

// TestLatestSkipsNothingAfterStart: with KDEDUP_START_OFFSET=latest, a
// worker that joined and decided nothing (idle input) still commits where
// it started, so that records written while it was stopped are forwarded
// by the next worker, even one without its data directory: latest skips
// nothing written after the group began. At least once (exactly once the
// group's offsets move only with transactions: docs/configuration.md).
func TestLatestSkipsNothingAfterStart(t *testing.T) {
	p := newPipeline(t, 2)
	p.extraEnv = map[string]string{"KDEDUP_START_OFFSET": "latest"}
	before := keyed("before-", 20)
	p.feed(t, before, len(before), 0).wait(t)
	w := p.startWorker(t, t.TempDir())
	waitReadyOwning(t, w, 2)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := scenario.WaitCaughtUp(ctx, p.b.admin(t), p.group, p.in); err != nil {
		t.Fatalf("the idle worker did not commit where it started: %v", err)
	}
	w.stop(t)

	after := keyed("after-", 30)
	p.feed(t, after, len(after), 0).wait(t)
	p.startWorker(t, t.TempDir())
	if got, want := p.outputKeys(t), sortedKeys(after); !slices.Equal(got, want) {
		t.Fatalf("output %v, want the records written after the group began %v", got, want)
	}
}
