package store

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/kdedup/kdedup/filter"
)

// The crash workload: one partition whose write batch k changes a set of
// pages chosen by k alone, each page either rewritten whole stamped with k
// or changed in a few 8-byte words stamped with k (crashApply; the store
// logs those and writes pages back whole as the log grows), with
// metadata naming k and checkpoint offset k. Its pages lie in the
// crashSubFilters sub-filters from crashFirstSub(k), a window that moves by
// one every crashBatchesPerSub batches; the batch that moves it drops the
// sub-filter left behind (crashDropped), as an expiring dedup window does,
// so that the store deletes its pages after the write batch. The state
// after batch k is therefore a function of k, computed by crashModel.
const (
	crashChildEnv       = "KDEDUP_STORE_CRASH_CHILD"
	crashAtEnv          = "KDEDUP_STORE_CRASH_AT"
	crashPageBytes      = 4096
	crashSubFilters     = 2
	crashBatchesPerSub  = 3
	crashPagesPerFilter = 256
	crashMaxBatchPages  = 300 // up to 1.2 MiB per write batch
	crashTopic          = "crash"
	crashPartition      = 3
)

// crashOptions bound the logged changes held to a few write batches'
// worth, so that write batches write back the oldest pending pages and
// trim the log (the write-back by its memory bound, not its interval,
// which a test does not wait for): a crash falls in every step of it.
func crashOptions(dir string) Options {
	return Options{Dir: dir, PageBytes: crashPageBytes, CacheBytes: 64 * crashPageBytes, WriteBackBytes: 8 << 10, Logger: quiet}
}

func crashBatch(k int64) []filter.PageID {
	rng := rand.New(rand.NewPCG(uint64(k), 0x5eed))
	ids := make([]filter.PageID, 1+rng.IntN(crashMaxBatchPages))
	for i := range ids {
		ids[i] = filter.PageID{SubFilter: crashFirstSub(k) + rng.Uint32N(crashSubFilters), Page: rng.Uint32N(crashPagesPerFilter)}
	}
	return ids
}

// crashFirstSub returns the first sub-filter write batch k writes to.
func crashFirstSub(k int64) uint32 { return uint32(k / crashBatchesPerSub) }

// crashDropped returns the sub-filter write batch k drops, if any.
func crashDropped(k int64) (uint32, bool) {
	if k < 1 || crashFirstSub(k) == crashFirstSub(k-1) {
		return 0, false
	}
	return crashFirstSub(k) - 1, true
}

// crashUniverse returns every page id batches 1..k may have written.
func crashUniverse(k int64) []filter.PageID {
	return universe(crashFirstSub(k)+crashSubFilters, crashPagesPerFilter)
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

// crashModel returns every page written by batches 1..k as batch k left
// it, without those of dropped sub-filters.
func crashModel(k int64) map[filter.PageID][]byte {
	pages := make(map[filter.PageID][]byte)
	for b := int64(1); b <= k; b++ {
		crashDrop(b, pages)
		for i, id := range crashBatch(b) {
			if pages[id] == nil {
				pages[id] = make([]byte, crashPageBytes)
			}
			crashApply(b, i, id, pages[id])
		}
	}
	return pages
}

// crashDrop removes from pages those of the sub-filter batch k drops, and
// returns it.
func crashDrop(k int64, pages map[filter.PageID][]byte) (uint32, bool) {
	sub, ok := crashDropped(k)
	if ok {
		maps.DeleteFunc(pages, func(id filter.PageID, _ []byte) bool { return id.SubFilter == sub })
	}
	return sub, ok
}

// runCrashChild is the process the crash tests kill: it resumes after the
// stored checkpoint and commits write batch after write batch, printing
// "begin k" before Commit and "done k micros" once Commit returned. It also
// checks every page it reads against the model. Without crashAtEnv it runs
// until it is killed; with crashAtEnv="k p" it stops after batch k, and in
// batch k's Commit SIGKILLs itself at crash point p (see crashPoints).
func runCrashChild(dir string) int {
	fail := func(err error) int {
		fmt.Fprintln(os.Stderr, "crash child:", err)
		return 2
	}
	opts := crashOptions(dir)
	last := int64(math.MaxInt64)
	var points *crashPoints
	if at := os.Getenv(crashAtEnv); at != "" {
		points = &crashPoints{}
		if _, err := fmt.Sscanf(at, "%d %d", &points.batch, &points.at); err != nil {
			return fail(fmt.Errorf("%s=%q: %w", crashAtEnv, at, err))
		}
		opts.Logger = slog.New(points)
		last = points.batch
	}
	db, err := Open(opts)
	if err != nil {
		return fail(err)
	}
	p, err := db.Partition(crashTopic, crashPartition)
	if err != nil {
		return fail(err)
	}
	cp, _ := p.Checkpoint()
	model := crashModel(cp.Offset)
	for k := cp.Offset + 1; k <= last; k++ {
		if sub, ok := crashDrop(k, model); ok {
			p.Drop(sub)
		}
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
		if points != nil && k == points.batch {
			points.armed.Store(true)
		}
		start := time.Now()
		if err := p.Commit(crashMeta(k), Checkpoint{Offset: k, LeaderEpoch: int32(k % 1000)}); err != nil {
			return fail(err)
		}
		if _, err := fmt.Fprintln(os.Stdout, "done", k, time.Since(start).Microseconds()); err != nil {
			return fail(err)
		}
	}
	// Exits without closing: the state of the last batch is durable once
	// its Commit returned.
	return 0
}

// Badger's debug lines that bracket each of its writes (badger v4.9.6
// db.go, DB.writeRequests), logged by its single write goroutine: one write
// is a transaction's commit or a WriteBatch's flush, or several queued
// together. The store logs them to Options.Logger four levels below debug.
const (
	// badgerWriteStart: nothing of the write is in the memtable log yet.
	badgerWriteStart = "writeRequests called. Writing to value log"
	// badgerWriteApplied: every entry of the write is in the memtable and
	// its log (the memory-mapped .mem file, which survives the process),
	// and the committer is still waiting for it.
	badgerWriteApplied = "Sending updates to subscribers"
)

// crashPoints is the crash child's Logger: it SIGKILLs the process at
// crash point at of the write batch's Commit once armed. Crash point 0 is
// the start of Commit's first Badger write; crash point i > 0 is the end
// of its i-th, before its committer returns. A crash between two Badger
// writes is thus a crash point whatever code of the store made them, so
// that a write batch split into several writes is torn at every split.
//
// Handle runs on Badger's write goroutine for the two lines above; armed
// is set by the goroutine calling Commit; mu guards writes.
type crashPoints struct {
	batch  int64 // the write batch whose Commit is crashed
	at     int   // the crash point
	armed  atomic.Bool
	mu     sync.Mutex
	writes int // Badger writes applied since armed
}

func (c *crashPoints) Enabled(context.Context, slog.Level) bool { return true }
func (c *crashPoints) WithAttrs([]slog.Attr) slog.Handler       { return c }
func (c *crashPoints) WithGroup(string) slog.Handler            { return c }

func (c *crashPoints) Handle(_ context.Context, r slog.Record) error {
	if !c.armed.Load() {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	switch r.Message {
	case badgerWriteStart:
		if c.writes == 0 && c.at == 0 {
			c.crash()
		}
	case badgerWriteApplied:
		c.writes++
		if c.writes == c.at {
			c.crash()
		}
	}
	return nil
}

func (c *crashPoints) crash() {
	fmt.Fprintln(os.Stdout, "crash", c.batch, c.at)
	// SIGKILL cannot be blocked: the process dies before Kill returns.
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {}
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

		k, err := crashState(dir)
		if err != nil {
			t.Fatalf("round %d: killed in the Commit of batch %d: %v", round, inFlight, err)
		}
		if k < acked || k > acked+1 {
			t.Fatalf("round %d: the state is that of batch %d after batch %d was acknowledged", round, k, acked)
		}
		if k == inFlight {
			landed++
		}
		t.Logf("round %d: killed in the Commit of batch %d; batch %d acknowledged, state is batch %d", round, inFlight, acked, k)
		acked = k
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

// TestCrashConsistencyAtEveryWrite crashes the Commit of each of the first
// crashPointBatches write batches (the third drops a sub-filter) at every
// crash point (crashPoints): before its first Badger write and after each
// of them, one child process per point on a fresh directory, which commits
// the batches before and SIGKILLs itself at that point. After each crash
// the stored state must be exactly that of the write batch its checkpoint
// names, and that batch must be the previous one before the first write
// and this one after it (the first write is the write batch's
// transaction; the rest delete what it made garbage). The points of a
// batch run out when its Commit returns before reaching one; the state is
// then this batch. Unlike TestCrashConsistency, whose kill falls at a
// random time, every run crashes at the same points.
func TestCrashConsistencyAtEveryWrite(t *testing.T) {
	if testing.Short() {
		t.Skip("re-executes the test binary")
	}
	const crashPointBatches = 4
	if _, ok := crashDropped(3); !ok {
		t.Fatal("the third write batch drops no sub-filter")
	}
	for k := int64(1); k <= crashPointBatches; k++ {
		for point := 0; ; point++ {
			dir := t.TempDir()
			killed := crashAt(t, dir, k, point)
			got, err := crashState(dir)
			switch {
			case err != nil && killed:
				t.Fatalf("crashed at point %d of batch %d's Commit: %v", point, k, err)
			case err != nil:
				t.Fatalf("batch %d committed: %v", k, err)
			}
			want := k
			if killed && point == 0 {
				want = k - 1
			}
			if got != want {
				t.Fatalf("crashed at point %d of batch %d's Commit (killed %t): the state is that of batch %d, want %d", point, k, killed, got, want)
			}
			if err := os.RemoveAll(dir); err != nil {
				t.Fatal(err)
			}
			if killed {
				continue
			}
			if point < 2 {
				t.Fatalf("batch %d's Commit returned before crash point %d: no Badger write seen (do Badger's debug lines %q and %q still bracket its writes?)",
					k, point, badgerWriteStart, badgerWriteApplied)
			}
			t.Logf("batch %d: Commit made %d Badger writes; crashes at %d points left whole batches", k, point-1, point)
			break
		}
	}
}

// crashAt runs the crash child on dir up to write batch k, with crash
// point point in k's Commit, and returns whether it died there (else its
// Commit returned and the child exited 0).
func crashAt(t *testing.T, dir string, k int64, point int) (killed bool) {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), crashChildEnv+"="+dir, fmt.Sprintf("%s=%d %d", crashAtEnv, k, point))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	lastLine := lines[len(lines)-1]
	var exit *exec.ExitError
	switch {
	case err == nil && strings.HasPrefix(lastLine, fmt.Sprintf("done %d ", k)):
		return false
	case errors.As(err, &exit) && exit.Sys().(syscall.WaitStatus).Signal() == syscall.SIGKILL &&
		lastLine == fmt.Sprintf("crash %d %d", k, point):
		return true
	}
	t.Fatalf("crash child for point %d of batch %d: %v, last line %q: %s", point, k, err, lastLine, stderr.String())
	return false
}

// crashState reopens dir and returns the write batch its checkpoint names
// (0 for none), or an error if the stored state is not exactly that
// batch's: every page batches may have written, metadata and checkpoint.
func crashState(dir string) (k int64, err error) {
	db, err := Open(crashOptions(dir))
	if err != nil {
		return 0, fmt.Errorf("reopening: %w", err)
	}
	defer func() {
		if cerr := db.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("closing: %w", cerr)
		}
	}()
	p, err := db.Partition(crashTopic, crashPartition)
	if err != nil {
		return 0, err
	}
	defer p.Close()
	cp, ok := p.Checkpoint()
	k = cp.Offset
	m := newModel(crashPageBytes)
	for id, page := range crashModel(k) {
		m.committed[id] = page
	}
	if ok {
		m.meta, m.cp, m.hasCP = crashMeta(k), Checkpoint{Offset: k, LeaderEpoch: int32(k % 1000)}, true
	}
	if err := m.diff(p, crashUniverse(k)); err != nil {
		return k, fmt.Errorf("the state is not that of batch %d, which its checkpoint names: %w", k, err)
	}
	return k, nil
}
