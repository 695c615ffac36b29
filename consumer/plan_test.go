package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kdedup/kdedup/dedup"
	"github.com/kdedup/kdedup/filter"
	"github.com/kdedup/kdedup/snapshot"
	"github.com/kdedup/kdedup/store"
)

// errFakeAdmin is the error of a request fakeAdmin is told to fail.
var errFakeAdmin = errors.New("fake admin: request failed")

// fakeAdminPartitions is how many partitions of topic "in" fakeAdmin
// answers for, each with the same log.
const fakeAdminPartitions = 64

// fakeAdmin is an offsetAdmin for topic "in" whose partitions each hold
// the log [logStart, logEnd), as a broker would answer for it, with the
// group's committed offsets in committed (by topic) and the leader's end
// offset of every leader epoch in epochEnd (-1: epoch unknown). The
// requests named in fail fail ("TopicID": the metadata answers an error
// for the topic); calls counts the requests made, by name.
type fakeAdmin struct {
	cluster          string
	topicID          kadm.TopicID
	topicErr         error // the topic's error in the metadata answer
	logStart, logEnd int64
	committed        map[string]int64
	epochEnd         int64
	epochErr         error // the partition's error in the leader epoch answer
	fail             map[string]bool
	calls            map[string]int
}

func (f *fakeAdmin) call(name string) error {
	if f.calls == nil {
		f.calls = map[string]int{}
	}
	f.calls[name]++
	if f.fail[name] {
		return errFakeAdmin
	}
	return nil
}

// listed answers off for every partition of "in".
func (f *fakeAdmin) listed(off func(p int32) int64) kadm.ListedOffsets {
	ps := map[int32]kadm.ListedOffset{}
	for p := range int32(fakeAdminPartitions) {
		ps[p] = kadm.ListedOffset{Topic: "in", Partition: p, Offset: off(p), Timestamp: -1, LeaderEpoch: -1}
	}
	return kadm.ListedOffsets{"in": ps}
}

func (f *fakeAdmin) Metadata(context.Context, ...string) (kadm.Metadata, error) {
	if err := f.call("Metadata"); err != nil {
		return kadm.Metadata{}, err
	}
	d := kadm.TopicDetail{Topic: "in", ID: f.topicID, Err: f.topicErr}
	if f.fail["TopicID"] { // a topic being created again
		d = kadm.TopicDetail{Topic: "in", Err: errFakeAdmin}
	}
	return kadm.Metadata{Cluster: f.cluster, Topics: kadm.TopicDetails{"in": d}}, nil
}

func (f *fakeAdmin) ListStartOffsets(context.Context, ...string) (kadm.ListedOffsets, error) {
	if err := f.call("ListStartOffsets"); err != nil {
		return nil, err
	}
	return f.listed(func(int32) int64 { return f.logStart }), nil
}

func (f *fakeAdmin) ListEndOffsets(context.Context, ...string) (kadm.ListedOffsets, error) {
	if err := f.call("ListEndOffsets"); err != nil {
		return nil, err
	}
	return f.listed(func(int32) int64 { return f.logEnd }), nil
}

// ListOffsetsAfterMilli answers the first retained offset whose record
// (timestamped recordTime) is at or after millis, or the log end.
func (f *fakeAdmin) ListOffsetsAfterMilli(_ context.Context, millis int64, _ ...string) (kadm.ListedOffsets, error) {
	if err := f.call("ListOffsetsAfterMilli"); err != nil {
		return nil, err
	}
	return f.listed(func(int32) int64 {
		for o := f.logStart; o < f.logEnd; o++ {
			if recordTime(o) >= millis {
				return o
			}
		}
		return f.logEnd
	}), nil
}

func (f *fakeAdmin) FetchOffsets(context.Context, string) (kadm.OffsetResponses, error) {
	if err := f.call("FetchOffsets"); err != nil {
		return nil, err
	}
	resp := kadm.OffsetResponses{}
	for topic, at := range f.committed {
		resp[topic] = map[int32]kadm.OffsetResponse{0: {Offset: kadm.Offset{Topic: topic, At: at, LeaderEpoch: -1}}}
	}
	return resp, nil
}

func (f *fakeAdmin) OffsetForLeaderEpoch(_ context.Context, req kadm.OffsetForLeaderEpochRequest) (kadm.OffsetsForLeaderEpochs, error) {
	if err := f.call("OffsetForLeaderEpoch"); err != nil {
		return nil, err
	}
	resp := kadm.OffsetsForLeaderEpochs{}
	for topic, ps := range req {
		resp[topic] = map[int32]kadm.OffsetForLeaderEpoch{}
		for p, epoch := range ps {
			resp[topic][p] = kadm.OffsetForLeaderEpoch{Topic: topic, Partition: p, LeaderEpoch: epoch, EndOffset: f.epochEnd, Err: f.epochErr}
		}
	}
	return resp, nil
}

// recordTime is the timestamp (Unix milliseconds) of the record at offset
// o of fakeAdmin's log: a second apart, out of order by up to 3 s.
func recordTime(o int64) int64 {
	return 1_700_000_000_000 + o*1000 + (o*7%5-2)*1500
}

// windowOpts are the dedup options of the plan cases with a window: a
// rebuild may start at the window's start (RebuildsFromWindow).
var windowOpts = dedup.Options{Filter: filter.Params{Window: time.Minute}, Refresh: true}

// The leader epochs of the plan cases' local checkpoints and group
// offsets: different, so that a start shows which one it came from.
const (
	localEpoch = 4
	groupEpoch = 3
)

// planCase is one partition's situation when its start is planned.
type planCase struct {
	name     string
	delivery Delivery
	// local is the local checkpoint (-1: no local state); group the
	// group's committed offset (-1: none, franz-go hands the reset
	// offset, the log start).
	local, group int64
	// The partition's log: [logStart, logEnd), logEnd 1000 when 0.
	logStart, logEnd int64
	snapshots        bool // Options.Snapshots set
	rebuildEmpty     bool
	startAtLatest    bool
	window           bool // the deduplicator rebuilds from the window's start
	// committedIn is a topic the group has a committed offset in ("":
	// none), committedAt that offset.
	committedIn string
	committedAt int64
	epochEnd    int64    // the leader's end offset of the checkpoint's epoch (-1: unknown)
	fail        []string // the admin requests that fail (fakeAdmin)
}

func (c planCase) failed(req string) bool { return slices.Contains(c.fail, req) }

func (c planCase) end() int64 {
	if c.logEnd == 0 {
		return 1000
	}
	return c.logEnd
}

// offset is what franz-go hands the plan: the committed offset with its
// epoch, or the reset offset.
func (c planCase) offset() kgo.Offset {
	if c.group < 0 {
		return kgo.NewOffset().AtStart()
	}
	return kgo.NewOffset().At(c.group).WithEpoch(groupEpoch)
}

// planOutcome is what a plan decides for one partition.
type planOutcome struct {
	err    bool
	start  kgo.EpochOffset
	replay *replayPlan
	snap   *snapshotPlan
	// next and flushed are where the partition stands and what it last
	// flushed: its first write batch commits next when they differ;
	// commitStart says it commits it to the group too (startAt).
	next, flushed store.Checkpoint
	commitStart   bool
	// Counted: offsets skipped for retention, partial rebuilds, local
	// states beyond the log end, restores by source (with snapshots).
	skipped, partial, beyond float64
	restores                 map[string]float64
}

// want is the model: the outcome of c by the rules of adjustOffsets and
// plan, for a topic whose current origin is cur.
func (c planCase) want(cur store.Origin) planOutcome {
	out := planOutcome{start: c.offset().EpochOffset(), restores: map[string]float64{}}
	if c.local >= 0 {
		out.next = store.Checkpoint{Offset: c.local, LeaderEpoch: localEpoch}
		out.flushed = out.next
	}
	// A log start that cannot be listed is taken as nothing deleted.
	logStart := c.logStart
	if c.failed("ListStartOffsets") {
		logStart = 0
	}
	count := func(source string) {
		if c.snapshots {
			out.restores[source]++
		}
	}
	startAt := func(off int64) {
		out.start = kgo.EpochOffset{Epoch: -1, Offset: off}
		out.next, out.flushed, out.commitStart = store.Checkpoint{Offset: off, LeaderEpoch: -1}, store.Checkpoint{Offset: -1, LeaderEpoch: -1}, true
	}
	skipTo := func(from, to int64) {
		startAt(to)
		out.skipped += float64(to - from)
	}
	switch {
	case c.failed("Metadata") || c.failed("TopicID"):
		out.err = true
		return out
	case c.local > c.end() && !c.failed("ListEndOffsets"):
		// The log was truncated under the checkpoint: decide again from
		// where it diverged, keeping the keys.
		out.beyond = 1
		count("local")
		div := logStart
		if !c.failed("OffsetForLeaderEpoch") && c.epochEnd >= 0 {
			div = min(c.epochEnd, c.end())
		}
		startAt(div)
		return out
	case c.local < 0 && c.group < 0:
		// Nothing to rebuild: the reset offset, or the log end of a
		// topic the group has never committed in.
		switch {
		case !c.startAtLatest:
		case c.committedIn == "in" && c.committedAt >= 0 && !c.failed("FetchOffsets"):
			out.start = kgo.NewOffset().AtStart().EpochOffset()
		case c.failed("ListEndOffsets"):
			out.err = true
		default:
			startAt(c.end())
		}
		return out
	case c.local >= 0 && c.local >= c.group:
		// Resume the local state; retention may have deleted what it
		// had to decide next.
		count("local")
		switch {
		case c.local < logStart:
			skipTo(c.local, logStart)
		case c.group >= 0 && c.local > c.group && c.delivery == AtLeastOnce:
			out.flushed = store.Checkpoint{Offset: c.group, LeaderEpoch: -1} // the first write batch brings the group up
		default:
			out.start = kgo.EpochOffset{Epoch: localEpoch, Offset: c.local}
		}
		return out
	}

	// The records before the group's offset must reach the filter: a
	// snapshot and the gap after it, a replay, or nothing (empty).
	snap := c.snapshots && (c.local < 0 || c.group-c.local > snapshotMinSkip)
	var from int64
	switch {
	case snap:
		out.snap = &snapshotPlan{hasLocal: c.local >= 0, rebuildEmpty: c.local < 0 && c.rebuildEmpty, origin: cur}
		from = max(c.local, 0)
	case c.local >= 0:
		from = c.local
	case c.rebuildEmpty:
		count("replay")
		if c.group < logStart {
			skipTo(c.group, logStart)
		}
		return out
	default:
		from = c.windowFrom()
	}
	// Counted before the log start is known to be listed: a plan that
	// fails for want of it has counted its replay all the same.
	if !snap && from < c.group {
		count("replay")
	}
	if c.failed("ListStartOffsets") {
		out.err, out.snap = true, nil
		return out
	}
	partial := !snap && logStart > from
	if partial {
		out.partial = 1
		from = logStart
	}
	if from < c.group || snap {
		out.replay = &replayPlan{from: from, until: c.group, partial: partial}
		if c.group < logStart {
			out.replay.resume = &store.Checkpoint{Offset: logStart, LeaderEpoch: -1}
			out.skipped += float64(logStart - c.group)
			out.start = kgo.EpochOffset{Epoch: -1, Offset: logStart}
		}
		return out
	}
	if c.group < logStart {
		skipTo(c.group, logStart)
	}
	return out
}

// windowFrom is where a rebuild up to the group's offset starts: with a
// window, the first retained record at or after the window's start
// (RebuildFrom) of the watermark, the highest timestamp of the retained
// records before the group's offset; otherwise, or when the timestamps
// cannot be looked up, 0.
func (c planCase) windowFrom() int64 {
	if !c.window || c.failed("ListOffsetsAfterMilli") {
		return 0
	}
	watermark := int64(math.MinInt64)
	for o := c.logStart; o < min(c.group, c.end()); o++ {
		watermark = max(watermark, recordTime(o))
	}
	startMillis, _ := windowOpts.RebuildFrom(watermark)
	for o := c.logStart; o < c.end(); o++ {
		if recordTime(o) >= startMillis {
			return o
		}
	}
	return c.end()
}

// planCases are the situations TestPlanAgainstModel plans.
func planCases() []planCase {
	const far = snapshotMinSkip + 50_000 // a gap a snapshot may shorten
	return []planCase{
		// Local state at or ahead of the group's offset: resume.
		{name: "local at the group's offset", local: 500, group: 500},
		{name: "local at the group's offset, snapshots", local: 500, group: 500, snapshots: true},
		{name: "local ahead, at least once", local: 600, group: 500},
		{name: "local ahead, exactly once", delivery: ExactlyOnce, local: 600, group: 500},
		{name: "local, no group offset", local: 300, group: -1, snapshots: true},
		{name: "local below the log start", local: 300, group: 300, logStart: 400, snapshots: true},
		{name: "local below the log start, no group offset", local: 100, group: -1, logStart: 200},
		{name: "local ahead, group below the log start", local: 450, group: 300, logStart: 400},
		{name: "local ahead, group below the log start, exactly once", delivery: ExactlyOnce, local: 450, group: 300, logStart: 400},
		{name: "local resumes, log start unlisted", local: 500, group: 500, fail: []string{"ListStartOffsets"}},
		{name: "local resumes, log end unlisted", local: 500, group: 400, fail: []string{"ListEndOffsets"}},

		// Local state behind the group's offset: replay the gap.
		{name: "local behind", local: 200, group: 500},
		{name: "local behind, snapshots", local: 200, group: 500, snapshots: true},
		{name: "local behind, exactly once", delivery: ExactlyOnce, local: 200, group: 500},
		{name: "local behind, log start inside the gap", local: 200, group: 500, logStart: 300, snapshots: true},
		{name: "local behind, log start past the group", local: 200, group: 500, logStart: 600, logEnd: 900},
		{name: "local behind, log start unlisted", local: 200, group: 500, snapshots: true, fail: []string{"ListStartOffsets"}},
		{name: "local behind, window ignored", local: 200, group: 500, window: true},
		{name: "local far behind, snapshots", local: 1000, group: far, logEnd: far + 10},
		{name: "local far behind, no snapshots", local: 1000, group: far, logEnd: far + 10},
		{name: "local far behind, snapshots, log start inside the gap", local: 1000, group: far, logStart: 50_000, logEnd: far + 10, snapshots: true},
		{name: "local far behind, snapshots, log start past the group", local: 1000, group: far, logStart: far + 5, logEnd: far + 10, snapshots: true},
		{name: "local far behind, snapshots, log start unlisted", local: 1000, group: far, logEnd: far + 10, snapshots: true, fail: []string{"ListStartOffsets"}},

		// No local state, a group offset: rebuild.
		{name: "rebuild", local: -1, group: 500},
		{name: "rebuild, exactly once", delivery: ExactlyOnce, local: -1, group: 500},
		{name: "rebuild, partial", local: -1, group: 500, logStart: 200},
		{name: "rebuild, log start past the group", local: -1, group: 500, logStart: 700},
		{name: "rebuild, log start unlisted", local: -1, group: 500, fail: []string{"ListStartOffsets"}},
		{name: "rebuild, nothing before the group", local: -1, group: 0},
		{name: "rebuild from the window", local: -1, group: 500, window: true},
		{name: "rebuild from the window, log start inside it", local: -1, group: 500, logStart: 480, window: true},
		{name: "rebuild from the window, log start before it", local: -1, group: 500, logStart: 100, window: true},
		// The record at the group's offset is the newest yet, in the
		// next generation: the watermark is the one before it.
		{name: "rebuild from the window, newest record at the group's offset", local: -1, group: 502, window: true},
		{name: "rebuild from the window, lookups fail", local: -1, group: 500, logStart: 100, window: true, fail: []string{"ListOffsetsAfterMilli"}},
		{name: "rebuild empty", local: -1, group: 500, rebuildEmpty: true},
		{name: "rebuild empty, log start past the group", local: -1, group: 500, logStart: 700, rebuildEmpty: true},
		{name: "rebuild empty, log start unlisted", local: -1, group: 500, rebuildEmpty: true, fail: []string{"ListStartOffsets"}},
		{name: "snapshot", local: -1, group: 500, snapshots: true},
		{name: "snapshot, exactly once", delivery: ExactlyOnce, local: -1, group: 500, snapshots: true},
		{name: "snapshot, rebuild empty", local: -1, group: 500, snapshots: true, rebuildEmpty: true},
		{name: "snapshot, log start inside the gap", local: -1, group: 500, logStart: 200, snapshots: true},
		{name: "snapshot, log start past the group", local: -1, group: 500, logStart: 700, snapshots: true},
		{name: "snapshot, log start unlisted", local: -1, group: 500, snapshots: true, fail: []string{"ListStartOffsets"}},
		{name: "snapshot, nothing before the group", local: -1, group: 0, snapshots: true},

		// Neither local state nor a group offset: start empty.
		{name: "new", local: -1, group: -1},
		{name: "new, snapshots", local: -1, group: -1, snapshots: true, logStart: 300},
		{name: "new, at the latest", local: -1, group: -1, startAtLatest: true},
		{name: "new, at the latest, another topic committed", local: -1, group: -1, startAtLatest: true, committedIn: "other", committedAt: 5},
		{name: "new, at the latest, topic committed", local: -1, group: -1, startAtLatest: true, committedIn: "in", committedAt: 5},
		{name: "new, at the latest, topic listed without offset", local: -1, group: -1, startAtLatest: true, committedIn: "in", committedAt: -1},
		{name: "new, at the latest, group offsets unfetched", local: -1, group: -1, startAtLatest: true, committedIn: "in", committedAt: 5, fail: []string{"FetchOffsets"}},
		{name: "new, at the latest, log end unlisted", local: -1, group: -1, startAtLatest: true, fail: []string{"ListEndOffsets"}},
		{name: "rebuild, at the latest", local: -1, group: 500, startAtLatest: true},

		// The topic's origin.
		{name: "topic IDs unreadable", local: 500, group: 500, fail: []string{"Metadata"}},
		{name: "topic being created again", local: -1, group: 500, fail: []string{"TopicID"}},
		{name: "local beyond the log end, epoch known", local: 1500, group: 1500, epochEnd: 900, snapshots: true},
		{name: "local beyond the log end, epoch past the end", local: 1500, group: 1200, epochEnd: 1100},
		{name: "local beyond the log end, epoch unknown", local: 1500, group: 1500, logStart: 100, epochEnd: -1},
		{name: "local beyond the log end, epoch request fails", local: 1500, group: 1500, logStart: 100, epochEnd: 900, fail: []string{"OffsetForLeaderEpoch"}},
	}
}

// planRig is what TestPlanAgainstModel plans on: one store, one snapshot
// store, and per case a worker and a partition of its own.
type planRig struct {
	db    *store.DB
	snaps *snapshot.Store
	cur   store.Origin
	id    kadm.TopicID
}

func newPlanRig(t *testing.T) planRig {
	t.Helper()
	// On disk: a worker with snapshots clears stale downloads in the
	// state directory, which in memory is the system's temporary one.
	db := diskStore(t)
	snaps := fileSnapshots(t)
	id := kadm.TopicID{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}
	return planRig{db: db, snaps: snaps, id: id, cur: store.Origin{TopicID: id.String(), ClusterID: "cluster-a"}}
}

// worker returns a worker for c and its partition p of "in", holding
// c's local state, and the registry of its metrics.
func (r planRig) worker(t *testing.T, c planCase, p int32) (*Worker, *partitionWorker, *prometheus.Registry) {
	t.Helper()
	dopts := dedup.Options{HashSeed: filter.Seed{K0: 1, K1: 2}, Staged: c.delivery == ExactlyOnce}
	if c.window {
		dopts.Filter, dopts.Refresh = windowOpts.Filter, windowOpts.Refresh
	}
	opener, err := dedup.NewOpener(r.db, dopts, nil)
	if err != nil {
		t.Fatal(err)
	}
	opts := Options{Brokers: []string{"127.0.0.1:1"}, Group: "g", InputTopics: []string{"in"}, OutputTopic: "out", Dedup: opener,
		Delivery: c.delivery, RebuildEmpty: c.rebuildEmpty, StartAtLatest: c.startAtLatest, Logger: slog.New(slog.DiscardHandler)}
	if c.snapshots {
		opts.Snapshots = r.snaps
	}
	reg := prometheus.NewRegistry()
	opts.Registerer = reg
	w, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	d, err := opener.Open("in", p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	if c.local >= 0 {
		if err := d.Commit(store.Checkpoint{Offset: c.local, LeaderEpoch: localEpoch}); err != nil {
			t.Fatal(err)
		}
		if err := d.SetOrigin(r.cur); err != nil {
			t.Fatal(err)
		}
	}
	return w, newPartition(w, nil, "in", p, d), reg
}

// admin is the fake cluster of c.
func (r planRig) admin(c planCase) *fakeAdmin {
	f := &fakeAdmin{cluster: r.cur.ClusterID, topicID: r.id, logStart: c.logStart, logEnd: c.end(), epochEnd: c.epochEnd, fail: map[string]bool{}}
	if c.committedIn != "" {
		f.committed = map[string]int64{c.committedIn: c.committedAt}
	}
	for _, req := range c.fail {
		f.fail[req] = true
	}
	return f
}

// gathered returns the value of the counter name{labels} in reg, 0 when
// it is not there; labels are name, value pairs.
func gathered(t *testing.T, reg prometheus.Gatherer, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if hasLabels(m, labels) {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

func hasLabels(m *dto.Metric, labels []string) bool {
	for i := 0; i+1 < len(labels); i += 2 {
		if !slices.ContainsFunc(m.GetLabel(), func(l *dto.LabelPair) bool { return l.GetName() == labels[i] && l.GetValue() == labels[i+1] }) {
			return false
		}
	}
	return true
}

// TestPlanAgainstModel plans one partition in each situation of
// planCases (local checkpoint or none, group offset or none, log start
// and end, snapshots, KDEDUP_REBUILD=empty, KDEDUP_START_OFFSET=latest
// with the topic committed or not, a dedup window, requests failing)
// against a fake cluster, and checks the plan against the model (want):
//   - where the group client starts (offset and leader epoch), or that the
//     plan fails;
//   - the replay it starts, [from, until), partial or not, and where the
//     partition moves after it;
//   - the snapshot restore it plans;
//   - what the partition's first write batch commits;
//   - what is counted: offsets skipped for retention, partial rebuilds,
//     checkpoints beyond the log end, restores by source.
func TestPlanAgainstModel(t *testing.T) {
	r := newPlanRig(t)
	for i, c := range planCases() {
		t.Run(c.name, func(t *testing.T) {
			w, pw, reg := r.worker(t, c, int32(i))
			var (
				starts kadm.ListedOffsets
				seen   groupOffsets
				info   planInfo
			)
			start, replay, err := w.planStart(context.Background(), r.admin(c), &starts, &seen, &info, pw, c.offset())
			want := c.want(r.cur)
			switch {
			case want.err && err == nil:
				t.Fatalf("planned a start at %v, want an error", start)
			case !want.err && err != nil:
				t.Fatalf("plan: %v", err)
			case !want.err:
				if got := start.EpochOffset(); got != want.start {
					t.Errorf("starts at %+v, want %+v", got, want.start)
				}
				if !replaysEqual(replay, want.replay) {
					t.Errorf("replay %s, want %s", replayString(replay), replayString(want.replay))
				}
			}
			if got := pw.snap.plan; (got == nil) != (want.snap == nil) || got != nil && *got != *want.snap {
				t.Errorf("snapshot plan %+v, want %+v", got, want.snap)
			}
			if pw.next != want.next || pw.flushed != want.flushed || pw.commitStart != want.commitStart {
				t.Errorf("stands at %+v, flushed %+v, commits its start %t; want %+v, %+v, %t",
					pw.next, pw.flushed, pw.commitStart, want.next, want.flushed, want.commitStart)
			}
			if pw.failed.Load() {
				t.Errorf("the partition failed")
			}
			for _, m := range []struct {
				name   string
				labels []string
				want   float64
			}{
				{"kdedup_retention_skipped_offsets_total", nil, want.skipped},
				{"kdedup_partial_rebuilds_total", nil, want.partial},
				{"kdedup_checkpoints_beyond_log_end_total", nil, want.beyond},
				{"kdedup_partition_restores_total", []string{"source", "local"}, want.restores["local"]},
				{"kdedup_partition_restores_total", []string{"source", "snapshot"}, want.restores["snapshot"]},
				{"kdedup_partition_restores_total", []string{"source", "replay"}, want.restores["replay"]},
			} {
				if got := gathered(t, reg, m.name, m.labels...); got != m.want {
					t.Errorf("%s%v = %v, want %v", m.name, m.labels, got, m.want)
				}
			}
		})
	}
}

func replaysEqual(a, b *replayPlan) bool {
	if a == nil || b == nil {
		return a == b
	}
	if (a.resume == nil) != (b.resume == nil) || a.resume != nil && *a.resume != *b.resume {
		return false
	}
	return a.from == b.from && a.until == b.until && a.partial == b.partial
}

func replayString(r *replayPlan) string {
	if r == nil {
		return "none"
	}
	s := fmt.Sprintf("[%d, %d) partial %t", r.from, r.until, r.partial)
	if r.resume != nil {
		s += fmt.Sprintf(", then at %d", r.resume.Offset)
	}
	return s
}

// TestPlanListsOncePerAdjustment: one adjustment plans every partition
// assigned with one listing of each kind (topic IDs, start offsets, the
// group's offsets; end offsets once per use), shared through its caches,
// whatever the number of partitions.
func TestPlanListsOncePerAdjustment(t *testing.T) {
	r := newPlanRig(t)
	cases := []planCase{
		{name: "local", local: 500, group: 500},
		{name: "behind", local: 200, group: 500},
		{name: "rebuild", local: -1, group: 500},
		{name: "new", local: -1, group: -1, startAtLatest: true},
		{name: "new again", local: -1, group: -1, startAtLatest: true},
	}
	adm := r.admin(planCase{})
	var (
		starts kadm.ListedOffsets
		seen   groupOffsets
		info   planInfo
	)
	for i, c := range cases {
		c.startAtLatest = true // one worker's options for every partition
		w, pw, _ := r.worker(t, c, int32(i))
		if _, _, err := w.planStart(context.Background(), adm, &starts, &seen, &info, pw, c.offset()); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
	}
	// The end offsets are listed apart for the check of the checkpoints
	// (planInfo) and for the partitions that start at the end
	// (groupOffsets).
	for req, want := range map[string]int{"Metadata": 1, "ListStartOffsets": 1, "ListEndOffsets": 2, "FetchOffsets": 1} {
		if n := adm.calls[req]; n != want {
			t.Errorf("%s asked %d times for %d partitions, want %d", req, n, len(cases), want)
		}
	}
}

// TestDivergence: a checkpoint beyond the log end of its own topic
// resumes where its leader epoch ended on the leader, at most at the log
// end; without an epoch, or when the leader cannot tell, at the log
// start, with the reason; when the log start cannot be listed either, the
// error says both.
func TestDivergence(t *testing.T) {
	const logStart, logEnd = 100, 1000
	for _, tc := range []struct {
		name     string
		epoch    int32 // the checkpoint's
		epochEnd int64
		epochErr error
		fail     []string
		want     int64
		wantErr  bool
		asked    bool // the leader was asked for the epoch's end
	}{
		{name: "epoch ends inside the log", epoch: 2, epochEnd: 700, want: 700, asked: true},
		{name: "epoch ends past the log end", epoch: 2, epochEnd: 1200, want: logEnd, asked: true},
		{name: "epoch unknown to the leader", epoch: 2, epochEnd: -1, want: logStart, wantErr: true, asked: true},
		{name: "leader answers an error", epoch: 2, epochEnd: 700, epochErr: errFakeAdmin, want: logStart, wantErr: true, asked: true},
		{name: "request fails", epoch: 2, epochEnd: 700, fail: []string{"OffsetForLeaderEpoch"}, want: logStart, wantErr: true, asked: true},
		{name: "no epoch recorded", epoch: -1, epochEnd: 700, want: logStart, wantErr: true},
		{name: "no epoch, log start unlisted", epoch: -1, fail: []string{"ListStartOffsets"}, want: 0, wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newPartitionRig(t, AtLeastOnce, Options{OutputTopic: "out"})
			t.Cleanup(r.pw.close)
			adm := &fakeAdmin{logStart: logStart, logEnd: logEnd, epochEnd: tc.epochEnd, epochErr: tc.epochErr, fail: map[string]bool{}}
			for _, req := range tc.fail {
				adm.fail[req] = true
			}
			got, err := r.w.divergence(context.Background(), adm, r.pw, store.Checkpoint{Offset: 1500, LeaderEpoch: tc.epoch}, logEnd)
			if got != tc.want || (err != nil) != tc.wantErr {
				t.Errorf("diverged at %d (err %v), want %d (error %t)", got, err, tc.want, tc.wantErr)
			}
			if asked := adm.calls["OffsetForLeaderEpoch"] > 0; asked != tc.asked {
				t.Errorf("leader asked for the epoch's end: %t, want %t", asked, tc.asked)
			}
		})
	}
}

// TestPlanStartsReplay: a plan that replays pauses the partition in the
// group client and starts its replay of [log start, group offset) on a
// restore client of its own (the partition owned by the restore until it
// ends, the worker restoring); a plan that resumes at once pauses
// nothing and starts no replay.
func TestPlanStartsReplay(t *testing.T) {
	for _, tc := range []struct {
		name   string
		group  int64
		replay bool
	}{
		{"rebuild", 10, true},
		{"nothing to rebuild", 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			keys := make([][]byte, 10)
			for i := range keys {
				keys[i] = fmt.Appendf(nil, "k%d", i)
			}
			// Exactly once: the fixture starts no partition goroutine.
			f := newPlanFixture(t, ExactlyOnce, keys, filter.Params{})
			cl := f.w.client()
			var (
				starts kadm.ListedOffsets
				seen   groupOffsets
				info   planInfo
			)
			start, err := f.w.plan(context.Background(), cl, kadm.NewClient(cl), &starts, &seen, &info, f.pw, kgo.NewOffset().At(tc.group))
			if err != nil {
				t.Fatal(err)
			}
			if got := start.EpochOffset().Offset; got != tc.group {
				t.Errorf("starts at %d, want the group's offset %d", got, tc.group)
			}
			paused := cl.PauseFetchPartitions(nil)
			if got := slices.Contains(paused["in"], 0); got != tc.replay {
				t.Errorf("paused in the group client: %t, want %t (%v)", got, tc.replay, paused)
			}
			f.pw.restoreCtl.mu.Lock()
			replay, done := f.pw.restoreCtl.mu.replay, f.pw.restoreCtl.done
			f.pw.restoreCtl.mu.Unlock()
			if running := done != nil; running != tc.replay {
				t.Fatalf("replay started: %t, want %t", running, tc.replay)
			}
			if !tc.replay {
				return
			}
			if replay.from != 0 || replay.until != tc.group {
				t.Errorf("replays [%d, %d), want [0, %d)", replay.from, replay.until, tc.group)
			}
			if n := f.w.restoring.Load(); n != 1 {
				t.Errorf("%d partitions restoring, want 1", n)
			}
			select {
			case <-done:
			case <-time.After(20 * time.Second):
				t.Fatal("the replay of 10 records did not end within 20s")
			}
			if cp, ok := f.d.Checkpoint(); !ok || cp.Offset != tc.group {
				t.Errorf("checkpoint %+v (%t) after the replay, want %d", cp, ok, tc.group)
			}
			if got := cl.PauseFetchPartitions(nil); slices.Contains(got["in"], 0) {
				t.Errorf("still paused after the replay: %v", got)
			}
		})
	}
}
