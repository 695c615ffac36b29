package tests

import (
	"context"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/kdedup/kdedup/internal/scenario"
)

// assignment returns, per group.instance.id, the partitions the group
// assigns to that member (members without an instance id are left out).
func (p *pipeline) assignment(t *testing.T) map[string][]int32 {
	t.Helper()
	groups, err := p.b.admin(t).DescribeGroups(context.Background(), p.group)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]int32{}
	for _, m := range groups[p.group].Members {
		if m.InstanceID == nil {
			continue
		}
		if a, ok := m.Assigned.AsConsumer(); ok {
			for _, tp := range a.Topics {
				out[*m.InstanceID] = append(out[*m.InstanceID], tp.Partitions...)
			}
		}
		slices.Sort(out[*m.InstanceID])
	}
	return out
}

// TestStaticMembership runs two workers with KDEDUP_INSTANCE_ID. Worker a
// stops (gracefully, as a pod does on a rolling restart) and comes back
// with the same instance id and data directory within the session timeout:
// while it is away the group keeps its partitions assigned to it instead of
// moving them to b, and after it returns it owns the same partitions again
// and resumes from its local checkpoints, replaying nothing. The output
// equals the exact model.
func TestStaticMembership(t *testing.T) {
	deliveries(t, func(t *testing.T, delivery string) {
		p := newPipeline(t, 4)
		p.delivery = delivery
		p.extraEnv = map[string]string{"KDEDUP_SESSION_TIMEOUT": "20s"}
		recs := stream(13)
		part1, part2 := recs[:len(recs)/2], recs[len(recs)/2:]
		dirA := t.TempDir()
		start := func(id, dir string) *worker {
			env := maps.Clone(p.extraEnv)
			p.extraEnv["KDEDUP_INSTANCE_ID"] = id
			w := p.startWorker(t, dir)
			p.extraEnv = env
			return w
		}
		a := start("kdedup-a", dirA)
		b := start("kdedup-b", t.TempDir())
		p.waitMembers(t, 2)
		p.feed(t, part1, len(part1), 0).wait(t)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := scenario.WaitCaughtUp(ctx, p.b.admin(t), p.group, p.in); err != nil {
			t.Fatal(err)
		}
		before := p.assignment(t)
		if len(before["kdedup-a"]) == 0 || len(before["kdedup-b"]) == 0 {
			t.Fatalf("assignment %v: each worker should own partitions", before)
		}

		a.stop(t)
		p.feed(t, part2, len(part2), 0).wait(t)
		time.Sleep(3 * time.Second) // well past a rebalance, well before the session timeout
		if away := p.assignment(t); !maps.EqualFunc(away, before, slices.Equal) {
			t.Fatalf("while a was away the assignment became %v, was %v: its partitions moved", away, before)
		}

		a = start("kdedup-a", dirA)
		want, got := p.output(t, recs)
		if after := p.assignment(t); !maps.EqualFunc(after, before, slices.Equal) {
			t.Fatalf("after a returned the assignment is %v, was %v", after, before)
		}
		if n := a.metric(t, "kdedup_replayed_records_total"); n != 0 {
			t.Fatalf("the returning worker replayed %.0f records; its local state should have been current", n)
		}
		a.stop(t)
		b.stop(t)
		requireExact(t, want, got)
	})
}
