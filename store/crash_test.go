package store

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/kdedup/kdedup/filter"
)

// The crash workload: one partition whose write batch k changes a set of
// pages chosen by k alone, each page either rewritten whole stamped with k
// or changed in a few 8-byte words stamped with k (crashApply; the store
// writes those as deltas and consolidates pages as their deltas grow), with
// metadata naming k and checkpoint offset k. The state after batch k is
// therefore a function of k, computed by crashModel.
const (
	crashChildEnv       = "KDEDUP_STORE_CRASH_CHILD"
	crashPageBytes      = 4096
	crashSubFilters     = 2
	crashPagesPerFilter = 256
	crashMaxBatchPages  = 300 // up to 1.2 MiB per write batch
	crashTopic          = "crash"
	crashPartition      = 3
)

func crashOptions(dir string) Options {
	return Options{Dir: dir, PageBytes: crashPageBytes, CacheBytes: 64 * crashPageBytes, Logger: quiet}
}

func crashBatch(k int64) []filter.PageID {
	rng := rand.New(rand.NewPCG(uint64(k), 0x5eed))
	ids := make([]filter.PageID, 1+rng.IntN(crashMaxBatchPages))
	for i := range ids {
		ids[i] = filter.PageID{SubFilter: rng.Uint32N(crashSubFilters), Page: rng.Uint32N(crashPagesPerFilter)}
	}
	return ids
}

func crashMeta(k int64) []byte {
	return append([]byte(fmt.Sprintf("meta of batch %d:", k)), bytes.Repeat([]byte{byte(k)}, int(k%97))...)
}

// crashApply applies to page the change write batch k makes to its i-th
// page id and returns the offsets of the 8-byte words it changed, or nil
// when it rewrote the whole page.
func crashApply(k int64, i int, id filter.PageID, page []byte) []int {
	rng := rand.New(rand.NewPCG(uint64(k), uint64(i)<<32|0xde17a))
	if rng.IntN(4) == 0 {
		copy(page, pageBytes(crashPageBytes, id, uint64(k)))
		return nil
	}
	stamp := pageBytes(8, id, uint64(k))
	offs := make([]int, 1+rng.IntN(8))
	for j := range offs {
		offs[j] = 8 * rng.IntN(crashPageBytes/8)
		copy(page[offs[j]:], stamp)
	}
	return offs
}

// crashModel returns every page written by batches 1..k as batch k left it.
func crashModel(k int64) map[filter.PageID][]byte {
	pages := make(map[filter.PageID][]byte)
	for b := int64(1); b <= k; b++ {
		for i, id := range crashBatch(b) {
			if pages[id] == nil {
				pages[id] = make([]byte, crashPageBytes)
			}
			crashApply(b, i, id, pages[id])
		}
	}
	return pages
}

// runCrashChild is the process TestCrashConsistency kills: it resumes after
// the stored checkpoint and commits write batch after write batch until it
// is killed, printing "begin k" before Commit and "done k micros" once
// Commit returned. It also checks every page it reads against the model.
func runCrashChild(dir string) int {
	fail := func(err error) int {
		fmt.Fprintln(os.Stderr, "crash child:", err)
		return 2
	}
	db, err := Open(crashOptions(dir))
	if err != nil {
		return fail(err)
	}
	p, err := db.Partition(crashTopic, crashPartition)
	if err != nil {
		return fail(err)
	}
	cp, _ := p.Checkpoint()
	model := crashModel(cp.Offset)
	for k := cp.Offset + 1; ; k++ {
		for i, id := range crashBatch(k) {
			page, err := p.Page(id)
			if err != nil {
				return fail(err)
			}
			want := model[id]
			if want == nil {
				want = make([]byte, crashPageBytes)
				model[id] = want
			}
			if !bytes.Equal(page, want) {
				return fail(fmt.Errorf("batch %d: page %v is not what the batches before wrote", k, id))
			}
			crashApply(k, i, id, want)
			if offs := crashApply(k, i, id, page); offs == nil {
				p.MarkDirty(id, page)
			} else {
				for _, off := range offs {
					p.MarkChanged(id, page, off, 8)
				}
			}
		}
		if _, err := fmt.Fprintln(os.Stdout, "begin", k); err != nil {
			return fail(err)
		}
		start := time.Now()
		if err := p.Commit(crashMeta(k), Checkpoint{Offset: k, LeaderEpoch: int32(k % 1000)}); err != nil {
			return fail(err)
		}
		if _, err := fmt.Fprintln(os.Stdout, "done", k, time.Since(start).Microseconds()); err != nil {
			return fail(err)
		}
	}
}

// TestCrashConsistency SIGKILLs a process that commits write batches in a
// loop, in several rounds on one directory, each time while a Commit is in
// flight (at a random point of its expected duration, or just after it),
// and checks after each kill that the stored state is exactly that of one
// whole write batch: the one named by the checkpoint, which is the last one
// the child acknowledged or the one in flight.
func TestCrashConsistency(t *testing.T) {
	if testing.Short() {
		t.Skip("re-executes the test binary")
	}
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	dir := t.TempDir()
	var acked int64 // the last write batch any child acknowledged
	landed := 0     // kills after which the batch in flight was durable
	const rounds = 8
	for round := range rounds {
		a, inFlight := killChild(t, dir, 1+rng.IntN(20), rng.Float64()*1.5)
		acked = max(acked, a)

		db, err := Open(crashOptions(dir))
		if err != nil {
			t.Fatalf("round %d: reopening after the kill: %v", round, err)
		}
		p, err := db.Partition(crashTopic, crashPartition)
		if err != nil {
			t.Fatal(err)
		}
		cp, ok := p.Checkpoint()
		k := cp.Offset
		if k < acked || k > acked+1 || ok != (k > 0) {
			t.Fatalf("round %d: checkpoint %+v (%t) after batch %d was acknowledged", round, cp, ok, acked)
		}
		m := newModel(crashPageBytes)
		for id, page := range crashModel(k) {
			m.committed[id] = page
		}
		if ok {
			m.meta, m.cp, m.hasCP = crashMeta(k), Checkpoint{Offset: k, LeaderEpoch: int32(k % 1000)}, true
		}
		if err := m.diff(p, universe(crashSubFilters, crashPagesPerFilter)); err != nil {
			t.Fatalf("round %d: state is not that of batch %d: %v", round, k, err)
		}
		if k == inFlight {
			landed++
		}
		t.Logf("round %d: killed in the Commit of batch %d; batch %d acknowledged, state is batch %d", round, inFlight, acked, k)
		acked = k
		p.Close()
		if err := db.Close(); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("%d of %d kills left the batch whose Commit was in flight durable, the others the batch before", landed, rounds)
}

// killChild starts the crash child on dir and lets it acknowledge batches
// write batches. When it begins the next Commit, killChild waits for
// fraction of the mean Commit duration seen so far, SIGKILLs it and returns
// the last write batch it acknowledged and the one whose Commit it began.
func killChild(t *testing.T, dir string, batches int, fraction float64) (acked, inFlight int64) {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), crashChildEnv+"="+dir)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	type line struct {
		begin  bool
		k      int64
		micros int64
	}
	lines := make(chan line)
	go func() {
		defer close(lines)
		s := bufio.NewScanner(out)
		for s.Scan() {
			var l line
			if _, err := fmt.Sscanf(s.Text(), "begin %d", &l.k); err == nil {
				l.begin = true
			} else if _, err := fmt.Sscanf(s.Text(), "done %d %d", &l.k, &l.micros); err != nil {
				l.k = -1
			}
			lines <- l
		}
	}()

	var commits, micros int64
	timeout := time.NewTimer(30 * time.Second)
	defer timeout.Stop()
	for {
		select {
		case l, ok := <-lines:
			if !ok || l.k < 0 {
				_ = cmd.Wait()
				t.Fatalf("crash child stopped after %d batches: %s", commits, stderr.String())
			}
			if !l.begin {
				acked = l.k
				commits++
				micros += l.micros
				continue
			}
			if commits < int64(batches) {
				continue
			}
			inFlight = l.k
		case <-timeout.C:
			_ = cmd.Process.Kill()
			for range lines {
			}
			_ = cmd.Wait()
			t.Fatalf("crash child acknowledged %d of %d batches in 30s: %s", commits, batches, stderr.String())
		}
		break
	}
	// The child is inside Commit. Not a synchronization: the sleep only
	// varies where in the Commit the kill lands.
	time.Sleep(time.Duration(fraction * float64(micros/commits) * float64(time.Microsecond)))
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for l := range lines { // a Commit may have returned before the kill
		if !l.begin {
			acked = max(acked, l.k)
		}
	}
	err = cmd.Wait()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("crash child did not die of SIGKILL: %v: %s", err, stderr.String())
	}
	return acked, inFlight
}
