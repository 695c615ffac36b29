package tests

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"regexp"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kdedup/kdedup/internal/scenario"
)

// TestCrashLoop runs three worker processes in one group over 6 partitions
// while input keeps arriving, and for 12 rounds SIGKILLs one of them (no
// final write batch, no commit, no leave), deleting its data directory in
// about a third of the rounds, and restarts it. Exactly once, the
// read_committed output must equal the exact model; at least once nothing
// may be missing, and the extra records stay within the README's bound per
// kill.
func TestCrashLoop(t *testing.T) {
	deliveries(t, func(t *testing.T, delivery string) {
		p := newPipeline(t, 6)
		p.delivery = delivery
		p.extraEnv = map[string]string{"KDEDUP_LOG_LEVEL": "info"}
		// ~13,000 records: at the feeder's rate they arrive for longer
		// than the rounds take on a loaded machine (the rest comes
		// without pause after them), so that every kill falls while
		// input arrives.
		recs := scenario.Generate(scenario.Options{Keys: 10000, Seed: 6})
		budget := p.crashLoop(t, recs, 12, rand.New(rand.NewPCG(uint64(len(delivery)), 9)))
		want, got := p.output(t, recs)
		if delivery == "exactly-once" {
			requireExact(t, want, got)
			return
		}
		extra := requireNothingMissing(t, want, got)
		t.Logf("at-least-once: %d records expected, %d read: nothing missing, %d extra", want.Stats.Forwarded, got.Stats.Forwarded, extra)
		budget.require(t, extra)
	})
}

// crashLoop runs three worker processes in the pipeline's group while recs
// arrive (10 records every 60 ms), and for the given rounds SIGKILLs one of
// them at a moment rng draws, deleting its data directory in about a
// third of the rounds, and restarts it; then it produces the rest of recs
// without pause. It returns the repeat budget of the kills (at least
// once).
func (p *pipeline) crashLoop(t *testing.T, recs []*kgo.Record, rounds int, rng *rand.Rand) *repeatBudget {
	t.Helper()
	dirs := []string{t.TempDir(), t.TempDir(), t.TempDir()}
	procs := make([]*process, len(dirs))
	for i, d := range dirs {
		procs[i] = p.startProcess(t, d)
	}
	const chunk, pause = 10, 60 * time.Millisecond
	budget := p.newRepeatBudget(t, chunk)
	f := p.feed(t, recs, chunk, pause)
	kills, wipes := 0, 0
	for range rounds {
		// Kill only once the group is stable with all three members
		// owning partitions: kfake never expires a member that dies
		// between its JoinGroup and SyncGroup, which would stall the
		// group for the client's rebalance timeout (60s); a real broker
		// expires it after the session timeout.
		for _, pr := range procs {
			pr.waitReady(t)
		}
		p.waitMembers(t, len(procs))
		i := rng.IntN(len(procs))
		time.Sleep(time.Duration(50+rng.IntN(400)) * time.Millisecond)
		kills++
		budget.lose(t, fmt.Sprintf("kill %d", kills), time.Now())
		procs[i].kill()
		if rng.IntN(3) == 0 {
			if err := os.RemoveAll(dirs[i]); err != nil {
				t.Fatal(err)
			}
			wipes++
		}
		procs[i] = p.startProcess(t, dirs[i])
	}
	f.hurry()
	f.wait(t)
	t.Logf("%s: %d rounds: %d kills, %d restarts, %d data directories wiped", p.delivery, rounds, kills, kills, wipes)
	return budget
}

// TestZombieFencing freezes a worker process (SIGSTOP) past its session
// timeout while input keeps arriving, so that the other worker takes its
// partitions, then lets it run again (SIGCONT) three times. The frozen
// worker may hold an open transaction with produced records; it must not be
// able to commit them: the read_committed output equals the exact model.
func TestZombieFencing(t *testing.T) {
	p := newPipeline(t, 4)
	p.delivery = "exactly-once"
	p.extraEnv = map[string]string{"KDEDUP_LOG_LEVEL": "info"}
	recs := stream(7)
	zombie := p.startProcess(t, t.TempDir())
	other := p.startProcess(t, t.TempDir())
	zombie.waitReady(t)
	other.waitReady(t)
	f := p.feed(t, recs, 20, 10*time.Millisecond)
	for range 3 {
		p.waitMembers(t, 2) // the zombie owns partitions when it freezes
		time.Sleep(300 * time.Millisecond)
		if err := zombie.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * 3 * time.Second) // two session timeouts
		if err := zombie.cmd.Process.Signal(syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
	}
	f.hurry()
	f.wait(t)
	want, got := p.output(t, recs)
	requireExact(t, want, got)
	// The zombie must have learnt it was fenced: its partitions lost, its
	// membership or producer rejected.
	fenced := regexp.MustCompile(`lost=true|UNKNOWN_MEMBER_ID|ILLEGAL_GENERATION|PRODUCER_FENCED|restarting the Kafka session`)
	n := len(fenced.FindAllString(zombie.logText(t), -1))
	if n == 0 {
		t.Fatal("the frozen worker never saw itself fenced; the test did not exercise fencing")
	}
	t.Logf("the frozen worker logged %d fencing events", n)
}

// TestBrokerFaults injects broker errors with kfake while an exactly-once
// worker runs: retriable and fatal produce errors, coordinator errors on the
// transactional offset commit and on coordinator lookups, aborted
// transactions (EndTxn answered TRANSACTION_ABORTABLE) and fetch errors. The
// worker keeps running and the output stays exactly the model's (at least
// once: nothing missing, and repeats within the README's bound, counting
// each fault as one lost session); aborted transactions are counted.
func TestBrokerFaults(t *testing.T) {
	deliveries(t, func(t *testing.T, delivery string) {
		p := newPipeline(t, 4)
		p.delivery = delivery
		// Long enough sessions that a produce stalled by NOT_LEADER (a
		// metadata refresh away) does not outlive the transaction timeout.
		p.extraEnv = map[string]string{"KDEDUP_SESSION_TIMEOUT": "10s", "KDEDUP_LOG_LEVEL": os.Getenv("KDEDUP_TEST_LOG_LEVEL")}
		c := p.b.fake(t)
		recs := stream(8)
		w := p.startWorker(t, t.TempDir())
		const chunk, pause = 50, 10 * time.Millisecond
		budget := p.newRepeatBudget(t, chunk)
		f := p.feed(t, recs, chunk, pause)
		faults := []kfake.Fault{
			{Keys: []kmsg.Key{kmsg.Produce}, Topic: p.out, Err: kerr.NotLeaderForPartition, Count: 5},
			{Keys: []kmsg.Key{kmsg.Fetch}, Topic: p.in, Err: kerr.NotLeaderForPartition, Count: 5},
			{Keys: []kmsg.Key{kmsg.Fetch}, Topic: p.in, Err: kerr.UnknownServerError, Count: 3},
			{Keys: []kmsg.Key{kmsg.FindCoordinator}, Err: kerr.CoordinatorNotAvailable, Count: 3, TopLevel: true},
		}
		if delivery == "exactly-once" {
			faults = append(faults,
				kfake.Fault{Keys: []kmsg.Key{kmsg.TxnOffsetCommit}, Err: kerr.NotCoordinator, Count: 3},
				kfake.Fault{Keys: []kmsg.Key{kmsg.EndTxn}, Err: kerr.TransactionAbortable, Count: 3, TopLevel: true},
				kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: p.out, Err: kerr.MessageTooLarge, Count: 2},
			)
		} else {
			faults = append(faults, kfake.Fault{Keys: []kmsg.Key{kmsg.OffsetCommit}, Err: kerr.NotCoordinator, Count: 3})
		}
		var handles []*kfake.FaultHandle
		for i, fault := range faults {
			f.until((i + 1) * len(recs) / (len(faults) + 2))
			budget.lose(t, fmt.Sprintf("fault %d", i+1), time.Now())
			handles = append(handles, c.Fault(fault))
		}
		f.wait(t)
		want, got := p.output(t, recs)
		w.running(t)
		for i, h := range handles {
			if h.Hits() == 0 {
				t.Errorf("fault %d (%v on %v) never hit", i, faults[i].Err, faults[i].Keys)
			}
		}
		aborted := 0.0
		if delivery == "exactly-once" {
			mfs, _ := w.reg.Gather()
			for _, mf := range mfs {
				if mf.GetName() == "kdedup_transactions_total" {
					for _, m := range mf.GetMetric() {
						if m.GetLabel()[0].GetValue() == "aborted" {
							aborted = m.GetCounter().GetValue()
						}
					}
				}
			}
			if aborted == 0 {
				t.Error("no transaction was aborted: the faults did not reach the transactional path")
			}
		}
		w.stop(t)
		if delivery == "exactly-once" {
			requireExact(t, want, got)
			t.Logf("%.0f transactions aborted by the faults", aborted)
			return
		}
		extra := requireNothingMissing(t, want, got)
		t.Logf("at-least-once under faults: nothing missing, %d extra", extra)
		budget.require(t, extra)
	})
}

// twoParts returns records that make a lost filter visible: part one
// creates k0..k999; part two deletes k0..k499, repeats k500..k999 (which a
// worker that knows part one drops) and creates k1000..k1499.
func twoParts() (part1, part2 []*kgo.Record) {
	for i := range 1000 {
		part1 = append(part1, &kgo.Record{Key: fmt.Appendf(nil, "k%d", i), Value: fmt.Appendf(nil, "v1-%d", i), Timestamp: scenario.Base})
	}
	for i := range 1500 {
		k := fmt.Appendf(nil, "k%d", i)
		switch {
		case i < 500:
			part2 = append(part2, &kgo.Record{Key: k, Timestamp: scenario.Base})
		default:
			part2 = append(part2, &kgo.Record{Key: k, Value: fmt.Appendf(nil, "v2-%d", i), Timestamp: scenario.Base})
		}
	}
	return part1, part2
}

// runPart feeds recs, runs a worker on dir until the group has committed
// them, and stops it gracefully.
func (p *pipeline) runPart(t *testing.T, dir string, recs []*kgo.Record) *worker {
	t.Helper()
	p.feed(t, recs, len(recs), 0).wait(t)
	w := p.startWorker(t, dir)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := scenario.WaitCaughtUp(ctx, p.b.admin(t), p.group, p.in); err != nil {
		t.Fatal(err)
	}
	w.stop(t)
	return w
}

// TestRebuildAfterWipe deletes a worker's data directory between two parts
// of a stream. With KDEDUP_REBUILD=replay the worker rebuilds its filters
// from the input (forwarding nothing) and decides part two exactly as a
// worker that never stopped: the output equals the model. With
// KDEDUP_REBUILD=empty it starts empty: nothing is missing, and part one's
// keys repeated in part two come out again.
func TestRebuildAfterWipe(t *testing.T) {
	deliveries(t, func(t *testing.T, delivery string) {
		for _, rebuild := range []string{"replay", "empty"} {
			t.Run(rebuild, func(t *testing.T) {
				p := newPipeline(t, 3)
				p.delivery = delivery
				p.extraEnv = map[string]string{"KDEDUP_REBUILD": rebuild}
				part1, part2 := twoParts()
				dir := t.TempDir()
				p.runPart(t, dir, part1)
				if err := os.RemoveAll(dir); err != nil {
					t.Fatal(err)
				}
				w := p.runPart(t, dir, part2)
				want, got := p.output(t, append(append([]*kgo.Record{}, part1...), part2...))
				if rebuild == "replay" {
					requireExact(t, want, got)
					if n := w.metric(t, "kdedup_replayed_records_total"); n != float64(len(part1)) {
						t.Errorf("replayed %.0f records, want %d", n, len(part1))
					}
					return
				}
				if extra := requireNothingMissing(t, want, got); extra != 500 {
					t.Errorf("%d extra records, want the 500 repeats of part one's keys", extra)
				}
			})
		}
	})
}

// TestPartialRebuild deletes the start of the input (as retention would)
// before a wiped worker rebuilds: the replay starts at the earliest retained
// offset, and the worker counts a partial rebuild per affected partition.
func TestPartialRebuild(t *testing.T) {
	p := newPipeline(t, 1)
	part1, part2 := twoParts()
	dir := t.TempDir()
	p.runPart(t, dir, part1)
	ctx := context.Background()
	if _, err := p.b.admin(t).DeleteRecords(ctx, kadm.Offsets{p.in: {0: {Topic: p.in, Partition: 0, At: 100}}}); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	w := p.runPart(t, dir, part2)
	if n := w.metric(t, "kdedup_partial_rebuilds_total"); n != 1 {
		t.Fatalf("%.0f partial rebuilds counted, want 1", n)
	}
	if n := w.metric(t, "kdedup_replayed_records_total"); n != float64(len(part1)-100) {
		t.Fatalf("replayed %.0f records, want %d", n, len(part1)-100)
	}
}
