package tests

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/kdedup/kdedup/consumer"
)

// TestGroupParamsRefused: a worker joining a group whose running member
// keys records another way (KDEDUP_KEY=header:id against the record key),
// or deduplicates without the repartition topic the running member
// routes through (KDEDUP_REPARTITION_TOPIC), stops with
// consumer.ErrGroupParams naming the variable before it decides anything
// (no record decided or replayed, while input arrives), and the running
// member keeps the partitions: the output is exactly the model's (keyed by
// record key, which the repartition topic keeps in each key's order).
// Without the check both ran, and a partition moving between them was
// rebuilt under the other key, or deduplicated in both stages' places.
func TestGroupParamsRefused(t *testing.T) {
	for _, c := range []struct {
		name        string
		repartition bool              // the running member routes through a repartition topic
		joining     map[string]string // the joining member's variables
		variable    string
	}{
		{"key", false, map[string]string{"KDEDUP_KEY": "header:id"}, "KDEDUP_KEY"},
		{"repartition topic", true, map[string]string{"KDEDUP_REPARTITION_TOPIC": ""}, "KDEDUP_REPARTITION_TOPIC"},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := newPipeline(t, 2)
			if c.repartition {
				p.withRepartitionTopic(t, 2)
			}
			recs := stream(18)
			half := len(recs) / 2
			p.feed(t, recs[:half], half, 0).wait(t)
			a := p.startWorker(t, t.TempDir())
			waitReadyOwning(t, a, 2)

			f := p.feed(t, recs[half:], 100, 10*time.Millisecond)
			p.extraEnv = c.joining
			b := p.startWorker(t, t.TempDir())
			p.extraEnv = nil
			select {
			case err := <-b.done:
				b.done <- nil // for the cleanup
				if !errors.Is(err, consumer.ErrGroupParams) || !strings.Contains(err.Error(), c.variable) {
					t.Fatalf("the second worker stopped with %v, want %v naming %s", err, consumer.ErrGroupParams, c.variable)
				}
				t.Logf("refused: %v", err)
			case <-time.After(60 * time.Second):
				t.Fatalf("the worker with another %s still runs after 60s (owning %.0f partitions)", c.variable, b.metric(t, "kdedup_partitions_assigned"))
			}
			if n := b.metric(t, "kdedup_consumed_records_total") + b.metric(t, "kdedup_replayed_records_total") + b.metric(t, "kdedup_records_repartitioned_total"); n != 0 {
				t.Errorf("the refused worker decided, replayed or repartitioned %.0f records", n)
			}

			f.wait(t)
			want, got := p.output(t, recs)
			a.running(t)
			requireExact(t, want, got)
		})
	}
}
