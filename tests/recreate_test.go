package tests

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kdedup/kdedup/consumer"
	"github.com/kdedup/kdedup/internal/scenario"
)

// recreateInput deletes the input topic and creates it again with the same
// partitions (a new topic ID, offsets from 0, no committed offsets), and
// points the pipeline at a new output topic, so that the output read after
// is the new topic's alone.
func (p *pipeline) recreateInput(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	adm := p.b.admin(t)
	before, err := adm.Metadata(ctx, p.in)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := adm.DeleteTopics(ctx, p.in)
	if err == nil {
		err = resp.Error()
	}
	if err != nil {
		t.Fatalf("deleting %s: %v", p.in, err)
	}
	// A broker still deleting the topic refuses to create it again for a
	// moment (TOPIC_ALREADY_EXISTS): retry until it takes it.
	for {
		r, err := adm.CreateTopics(ctx, p.partitions, 1, nil, p.in)
		if err == nil {
			err = r.Error()
		}
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("creating %s again: %v", p.in, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	for {
		md, err := adm.Metadata(ctx, p.in)
		if err == nil {
			d, ok := md.Topics[p.in]
			if ok && d.Err == nil && len(d.Partitions) == int(p.partitions) && d.ID != before.Topics[p.in].ID {
				ready := true
				for _, pd := range d.Partitions {
					ready = ready && pd.Err == nil && pd.Leader >= 0
				}
				if ready {
					break
				}
			}
		}
		if ctx.Err() != nil {
			t.Fatalf("%s not in the metadata with a new topic ID within a minute (last error %v)", p.in, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	p.out = p.b.name("out-recreated")
	p.b.createTopics(t, p.partitions, p.out)
}

// keyRange returns n records with keys prefix<from>..prefix<from+n-1> and values
// tagged with tag.
func keyRange(prefix string, from, n int, tag string) []*kgo.Record {
	recs := make([]*kgo.Record, 0, n)
	for i := from; i < from+n; i++ {
		recs = append(recs, &kgo.Record{Key: fmt.Appendf(nil, "%s%d", prefix, i), Value: fmt.Appendf(nil, "%s-%d", tag, i), Timestamp: scenario.Base})
	}
	return recs
}

// TestRecreatedInputTopic deletes the input topic after a worker decided
// 1,000 records (keys k0..k999) and creates it again with the same
// partitions: the new topic's offsets start at 0 again, below the state's
// checkpoints and snapshots. The new topic's output must equal the exact
// model of the new topic alone, in both delivery modes:
//
//   - local: a worker on the first worker's data directory finds local
//     state of another topic ID; it moves it aside (into foreign-states/,
//     one snapshot per partition there), counts it, and decides the new
//     topic from its start: none of its records is skipped as below the
//     old checkpoint, and k0..k19, new to this topic, are forwarded;
//   - snapshot: the first worker's last snapshots are in the store; a
//     worker without snapshots decides part of the new topic past their
//     offsets, then a worker with an empty disk takes the partitions: it
//     must not restore the old topic's snapshots (counted as foreign) but
//     replay the new topic, so that repeats of the new topic's keys are
//     dropped and the old topic's keys are forwarded.
func TestRecreatedInputTopic(t *testing.T) {
	deliveries(t, func(t *testing.T, delivery string) {
		for _, tc := range []string{"local", "snapshot"} {
			t.Run(tc, func(t *testing.T) {
				p := newPipeline(t, 2)
				p.delivery = delivery
				if tc == "snapshot" {
					p.withSnapshots(t)
				}
				dirA := t.TempDir()
				p.runPart(t, dirA, keyRange("k", 0, 1000, "old"))
				p.recreateInput(t)
				// The new topic: new keys, the old topic's k0..k19 (new
				// here), and repeats of both.
				part2 := append(keyRange("n", 0, 1500, "v2"), keyRange("k", 0, 20, "v2")...)
				part3 := append(append(keyRange("n", 0, 100, "v3"), keyRange("k", 0, 30, "v3")...), keyRange("n", 1500, 50, "v3")...)
				all := append(append([]*kgo.Record{}, part2...), part3...)
				var w *worker
				switch tc {
				case "local":
					p.feed(t, all, len(all), 0).wait(t)
					w = p.startWorker(t, dirA)
				case "snapshot":
					url := p.extraEnv["KDEDUP_SNAPSHOT_URL"]
					delete(p.extraEnv, "KDEDUP_SNAPSHOT_URL")
					p.runPart(t, t.TempDir(), part2)
					p.extraEnv["KDEDUP_SNAPSHOT_URL"] = url
					p.feed(t, part3, len(part3), 0).wait(t)
					w = p.startWorker(t, t.TempDir())
				}
				w.waitReplayed(t)
				want, got := p.output(t, all)
				requireExact(t, want, got)
				switch tc {
				case "local":
					if n := w.metricWith(t, "kdedup_foreign_states_total", "source", "local"); n != float64(p.partitions) {
						t.Errorf("%.0f local states counted foreign, want %d (every partition's)", n, p.partitions)
					}
					if n := len(snapshotObjects(t, filepath.Join(dirA, consumer.ForeignStatesDir))); n != int(p.partitions) {
						t.Errorf("%d foreign states moved aside, want %d: one per partition, kept", n, p.partitions)
					}
				case "snapshot":
					if n := w.metricWith(t, "kdedup_foreign_states_total", "source", "snapshot"); n < float64(p.partitions) {
						t.Errorf("%.0f snapshots counted foreign, want at least %d (the old topic's last ones)", n, p.partitions)
					}
					if n := w.metricWith(t, "kdedup_partition_restores_total", "source", "snapshot"); n != 0 {
						t.Errorf("%.0f partitions restored from a snapshot, want none: every snapshot is the old topic's", n)
					}
				}
				w.stop(t)
			})
		}
	})
}
