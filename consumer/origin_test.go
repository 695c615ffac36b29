package consumer

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kdedup/kdedup/dedup"
	"github.com/kdedup/kdedup/filter"
	"github.com/kdedup/kdedup/store"
)

// TestPlanChecksOrigin plans a partition whose log holds 10 records over
// local state of every kind of origin, and checks where it starts, what
// becomes of its state and what is counted, against the rules of
// origin.go:
//
//   - a state of this topic, or one recording no origin (adopted with the
//     current IDs), resumes from its checkpoint;
//   - a state of another topic ID or cluster, or one recording no origin
//     with its checkpoint beyond the log end, is moved aside (one snapshot
//     in foreign-states/), cleared and counted, and the partition starts
//     as one without state (here: no committed offset, so at the group's
//     reset offset);
//   - a state of this topic with its checkpoint beyond the log end keeps
//     its keys and starts where the log diverged (the end of its leader
//     epoch on the leader, or the log start without an epoch), counted;
//     without a topic ID on both sides it is foreign;
//   - no state with another origin recorded takes the current one.
func TestPlanChecksOrigin(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "in"), kfake.ClusterID("cluster-a"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.DefaultProduceTopic("in"), kgo.ClientID("custom")) // a custom id: the params check is skipped
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	const logEnd = 10
	for i := range logEnd {
		if err := cl.ProduceSync(context.Background(), &kgo.Record{Key: []byte{byte(i)}, Value: []byte("v")}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	md, err := kadm.NewClient(cl).Metadata(context.Background(), "in")
	if err != nil {
		t.Fatal(err)
	}
	cur := store.Origin{TopicID: md.Topics["in"].ID.String(), ClusterID: "cluster-a"}
	if md.Topics["in"].ID == (kadm.TopicID{}) || md.Cluster != "cluster-a" {
		t.Fatalf("kfake reports topic ID %v and cluster %q: the test needs both", md.Topics["in"].ID, md.Cluster)
	}
	otherTopic := store.Origin{TopicID: "AAAAAAAAAAAAAAAAAAAAAA", ClusterID: cur.ClusterID}
	otherCluster := store.Origin{TopicID: cur.TopicID, ClusterID: "cluster-b"}

	type want struct {
		start      kgo.Offset
		keptState  bool // the state's checkpoint is still there
		foreign    float64
		beyond     float64
		movedAside int
	}
	group := kgo.NewOffset().AtStart() // no committed offset
	for _, tc := range []struct {
		name       string
		stored     store.Origin
		checkpoint int64 // -1: no state
		want       want
		epoch      int32 // the checkpoint's leader epoch (0: unknown, -1)
	}{
		{"same origin", cur, 5, want{start: kgo.NewOffset().At(5), keptState: true}, 0},
		{"no origin recorded", store.Origin{}, 5, want{start: kgo.NewOffset().At(5), keptState: true}, 0},
		{"no origin recorded, beyond the log end", store.Origin{}, 500, want{start: group, foreign: 1, movedAside: 1}, 0},
		{"another topic ID", otherTopic, 5, want{start: group, foreign: 1, movedAside: 1}, 0},
		{"another cluster", otherCluster, 5, want{start: group, foreign: 1, movedAside: 1}, 0},
		// A truncated log: from where the checkpoint's epoch ended on the
		// leader (the log end here), or without an epoch from the log
		// start, the keys kept.
		{"same origin, beyond the log end", cur, 500, want{start: kgo.NewOffset().At(logEnd), keptState: true, beyond: 1}, 1},
		{"same origin, beyond the log end, no epoch", cur, 500, want{start: kgo.NewOffset().At(0), keptState: true, beyond: 1}, 0},
		{"no topic ID known, beyond the log end", store.Origin{ClusterID: cur.ClusterID}, 500, want{start: group, foreign: 1, movedAside: 1}, 0},
		{"no state, another origin recorded", otherTopic, -1, want{start: group}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			db, err := store.Open(store.Options{Dir: dir, Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = db.Close() })
			opener, err := dedup.NewOpener(db, dedup.Options{HashSeed: filter.Seed{K0: 1, K1: 2}}, nil)
			if err != nil {
				t.Fatal(err)
			}
			d, err := opener.Open("in", 0)
			if err != nil {
				t.Fatal(err)
			}
			if tc.checkpoint >= 0 {
				for i := range 3 {
					if _, err := d.Decide(&kgo.Record{Key: []byte{'k', byte(i)}, Value: []byte("v"), Offset: int64(i)}); err != nil {
						t.Fatal(err)
					}
				}
				if err := d.Commit(store.Checkpoint{Offset: tc.checkpoint, LeaderEpoch: tc.epoch - 1}); err != nil {
					t.Fatal(err)
				}
			}
			if err := d.SetOrigin(tc.stored); err != nil {
				t.Fatal(err)
			}
			reg := prometheus.NewRegistry()
			w, err := New(Options{Brokers: c.ListenAddrs(), InputTopics: []string{"in"}, OutputTopic: "out", Dedup: opener,
				Logger: slog.New(slog.DiscardHandler), FlushInterval: 50 * time.Millisecond, SessionTimeout: 5 * time.Second, Registerer: reg})
			if err != nil {
				t.Fatal(err)
			}
			w.mu.connected = make(chan struct{})
			w.publish(nil, cl)
			pw := assignForPlan(w, cl, "in", 0, d)
			t.Cleanup(func() { pw.stopReplay(true) })

			got, err := w.adjustOffsets(context.Background(), map[string]map[int32]kgo.Offset{"in": {0: group}})
			if err != nil {
				t.Fatal(err)
			}
			if start := got["in"][0]; start.EpochOffset().Offset != tc.want.start.EpochOffset().Offset {
				t.Errorf("starts at %v, want %v", start, tc.want.start)
			}
			cp, kept := d.Checkpoint()
			if kept != tc.want.keptState || (kept && cp.Offset != tc.checkpoint) {
				t.Errorf("state kept %t at %d, want kept %t at %d", kept, cp.Offset, tc.want.keptState, tc.checkpoint)
			}
			if o := d.Origin(); o != cur {
				t.Errorf("origin after the plan %v, want the current %v", o, cur)
			}
			if !kept && pw.next.Offset != 0 {
				t.Errorf("the cleared partition skips records below %d", pw.next.Offset)
			}
			if n := testutil.ToFloat64(w.m.foreignStates.WithLabelValues("local")); n != tc.want.foreign {
				t.Errorf("kdedup_foreign_states_total{source=local} = %v, want %v", n, tc.want.foreign)
			}
			if n := testutil.ToFloat64(w.m.beyondLogEnd); n != tc.want.beyond {
				t.Errorf("kdedup_checkpoints_beyond_log_end_total = %v, want %v", n, tc.want.beyond)
			}
			var moved []string
			_ = filepath.WalkDir(filepath.Join(dir, ForeignStatesDir), func(path string, e os.DirEntry, err error) error {
				if err == nil && strings.HasSuffix(path, ".kds") {
					moved = append(moved, path)
				}
				return nil
			})
			if len(moved) != tc.want.movedAside {
				t.Errorf("%d states moved aside (%v), want %d", len(moved), moved, tc.want.movedAside)
			}
		})
	}
}
