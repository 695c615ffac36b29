package store

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/kdedup/kdedup/filter"
)

// The crash workload: one partition whose write batch k rewrites a set of
// pages chosen by k alone, each page stamped with k, with metadata naming k
// and checkpoint offset k. The state after batch k is therefore a function
// of k, computed by crashModel.
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

// crashModel returns, for every page written by batches 1..k, the batch
// that wrote it last.
func crashModel(k int64) map[filter.PageID]int64 {
	last := make(map[filter.PageID]int64)
	for b := int64(1); b <= k; b++ {
		for _, id := range crashBatch(b) {
			last[id] = b
		}
	}
	return last
}

// runCrashChild is the process TestCrashConsistency kills: it resumes after
// the stored checkpoint and commits write batch after write batch, printing
// each k once Commit returned, until it is killed. It also checks every
// page it reads against the model.
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
	last := crashModel(cp.Offset)
	for k := cp.Offset + 1; ; k++ {
		for _, id := range crashBatch(k) {
			page, err := p.Page(id)
			if err != nil {
				return fail(err)
			}
			want := make([]byte, crashPageBytes)
			if b, ok := last[id]; ok {
				want = pageBytes(crashPageBytes, id, uint64(b))
			}
			if !bytes.Equal(page, want) {
				return fail(fmt.Errorf("batch %d: page %v is not what batch %d wrote", k, id, last[id]))
			}
			copy(page, pageBytes(crashPageBytes, id, uint64(k)))
			p.MarkDirty(id, page)
			last[id] = k
		}
		if err := p.Commit(crashMeta(k), Checkpoint{Offset: k, LeaderEpoch: int32(k % 1000)}); err != nil {
			return fail(err)
		}
		if _, err := fmt.Fprintln(os.Stdout, k); err != nil {
			return fail(err)
		}
	}
}

// TestCrashConsistency SIGKILLs a process that commits write batches in a
// loop, at a random moment, in several rounds on one directory, and checks
// after each that the stored state is exactly that of one whole write
// batch: the one named by the checkpoint, which is the last one the child
// acknowledged or the one in flight.
func TestCrashConsistency(t *testing.T) {
	if testing.Short() {
		t.Skip("re-executes the test binary")
	}
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	dir := t.TempDir()
	var acked int64 // the last write batch any child acknowledged
	for round := range 8 {
		a := killChild(t, dir, 1+rng.IntN(25), time.Duration(rng.IntN(3000))*time.Microsecond)
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
		for id, b := range crashModel(k) {
			m.committed[id] = pageBytes(crashPageBytes, id, uint64(b))
		}
		if ok {
			m.meta, m.cp, m.hasCP = crashMeta(k), Checkpoint{Offset: k, LeaderEpoch: int32(k % 1000)}, true
		}
		if err := m.diff(p, universe(crashSubFilters, crashPagesPerFilter)); err != nil {
			t.Fatalf("round %d: state is not that of batch %d: %v", round, k, err)
		}
		t.Logf("round %d: batch %d acknowledged, state is batch %d", round, acked, k)
		p.Close()
		if err := db.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// killChild starts the crash child on dir, waits until it acknowledged
// batches more write batches, lets it run on for delay (so that the kill
// lands at a random point of the next write batch), SIGKILLs it and returns
// the last write batch it acknowledged.
func killChild(t *testing.T, dir string, batches int, delay time.Duration) int64 {
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
	lines := make(chan int64)
	go func() {
		defer close(lines)
		s := bufio.NewScanner(out)
		for s.Scan() {
			k, err := strconv.ParseInt(s.Text(), 10, 64)
			if err != nil {
				k = -1
			}
			lines <- k
		}
	}()

	var acked int64
	timeout := time.NewTimer(30 * time.Second)
	defer timeout.Stop()
	for seen := 0; seen < batches; seen++ {
		select {
		case k, ok := <-lines:
			if !ok || k < 0 {
				_ = cmd.Wait()
				t.Fatalf("crash child stopped after %d batches: %s", seen, stderr.String())
			}
			acked = k
		case <-timeout.C:
			_ = cmd.Process.Kill()
			for range lines {
			}
			_ = cmd.Wait()
			t.Fatalf("crash child acknowledged %d of %d batches in 30s: %s", seen, batches, stderr.String())
		}
	}
	// Not a synchronization: the sleep only varies where the kill lands.
	time.Sleep(delay)
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for k := range lines { // batches acknowledged before the kill
		acked = max(acked, k)
	}
	err = cmd.Wait()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("crash child did not die of SIGKILL: %v: %s", err, stderr.String())
	}
	return acked
}
