package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kdedup/kdedup/internal/embedded"
	"github.com/kdedup/kdedup/internal/scenario"
)

// The passthrough, with the worker's group client settings, forwards every
// input record unchanged: at least once each at least once, exactly once
// each exactly once (read committed) once its group has committed the end
// of the input.
func TestPassthroughChild(t *testing.T) {
	for _, delivery := range []string{"at-least-once", "exactly-once"} {
		t.Run(delivery, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			const group, out = "pass", "pass-out"
			c, err := embedded.NewCluster(2, "events", out)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			var recs []*kgo.Record
			for i := range 2000 {
				recs = append(recs, &kgo.Record{Key: fmt.Appendf(nil, "k%d", i%700), Value: fmt.Appendf(nil, "v%d", i)})
			}
			if err := c.Produce(ctx, "events", recs, io.Discard); err != nil {
				t.Fatal(err)
			}
			pctx, stop := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() { done <- passthroughChild(pctx, c.Brokers, group, out, delivery) }()
			_, err = embedded.WaitCommitted(ctx, c.Admin, group, "events", len(recs), time.Now(), io.Discard)
			stop()
			if perr := <-done; perr != nil {
				t.Fatalf("passthrough: %v", perr)
			}
			if err != nil {
				t.Fatal(err)
			}
			got, err := scenario.ReadAll(ctx, c.Brokers, out)
			if err != nil {
				t.Fatal(err)
			}
			want := values(recs)
			have := values(got)
			if delivery == "at-least-once" {
				have = slices.Compact(have)
			}
			if !slices.Equal(have, want) {
				t.Errorf("output holds %d records (%d distinct), want the %d input records once each", len(got), len(slices.Compact(values(got))), len(recs))
			}
		})
	}
}

// values returns the records' values, sorted.
func values(recs []*kgo.Record) []string {
	vs := make([]string, len(recs))
	for i, r := range recs {
		vs[i] = string(r.Value)
	}
	slices.Sort(vs)
	return vs
}
