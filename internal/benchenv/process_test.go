package benchenv

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"testing"
	"time"
)

func TestMemoryCgroupDir(t *testing.T) {
	for _, tc := range []struct {
		name, self, dir string
		v2              bool
	}{
		{"v1", "4:memory:/a/b\n3:cpu,cpuacct:/c\n", "/cg/memory/a/b", false},
		{"v1 with other controllers on the line", "7:cpuset,memory:/x\n", "/cg/memory/x", false},
		{"hybrid: the v1 memory hierarchy wins", "0::/\n4:memory:/p\n1:name=systemd:/\n", "/cg/memory/p", false},
		{"v2", "0::/user.slice/u.scope\n", "/cg/user.slice/u.scope", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir, v2, err := memoryCgroupDir(tc.self, "/cg")
			if err != nil || dir != tc.dir || v2 != tc.v2 {
				t.Fatalf("memoryCgroupDir(%q) = %q, %v, %v; want %q, %v", tc.self, dir, v2, err, tc.dir, tc.v2)
			}
		})
	}
	if _, _, err := memoryCgroupDir("3:cpu:/c\n", "/cg"); err == nil {
		t.Fatal("no memory cgroup named, and no error")
	}
}

func TestProcessCPUAndMemory(t *testing.T) {
	pid := os.Getpid()
	before, err := ProcessCPU(pid)
	if err != nil {
		t.Fatal(err)
	}
	start := CPU(t)
	for CPU(t)-start < 300*time.Millisecond { // burn 300ms of CPU
	}
	after, err := ProcessCPU(pid)
	if err != nil {
		t.Fatal(err)
	}
	// Both count the same CPU time, /proc in 10ms ticks; other goroutines
	// of the test binary may add a little.
	if d := after - before; d < 250*time.Millisecond || d > 600*time.Millisecond {
		t.Fatalf("ProcessCPU advanced %s while this process used 300ms", d)
	}
	mem, err := ProcessMemory(pid)
	if err != nil {
		t.Fatal(err)
	}
	if mem["VmHWM"] <= 0 || mem["VmHWM"] < mem["VmRSS"] {
		t.Fatalf("VmHWM %d, VmRSS %d", mem["VmHWM"], mem["VmRSS"])
	}
	if peak := PeakRSS(); peak < mem["VmHWM"] {
		t.Fatalf("PeakRSS %d is below the VmHWM read before it, %d", peak, mem["VmHWM"])
	}
	if _, err := ProcessCPU(1 << 30); err == nil {
		t.Fatal("no error for a process that does not exist")
	}
}

// TestMemoryCgroupHoldsTheLimit runs a process that touches 512 MiB in a
// cgroup of 128 MiB and expects the kernel to have killed it, counted, and
// a process that stays under it to exit normally. It needs a writable
// cgroup file system (root), else it skips saying so.
func TestMemoryCgroupHoldsTheLimit(t *testing.T) {
	const limit = 128 << 20
	c, err := NewMemoryCgroup(fmt.Sprintf("benchenv-test-%d", os.Getpid()), limit)
	if errors.Is(err, ErrNoMemoryCgroup) {
		t.Skipf("%v", err)
	}
	if err != nil {
		t.Fatal(err) // the cgroup was made but its limits could not be set
	}
	t.Cleanup(func() {
		if err := c.Remove(); err != nil {
			t.Error(err)
		}
	})
	small := c.Command("/bin/sh", "-c", "exit 0")
	if out, err := small.CombinedOutput(); err != nil {
		t.Fatalf("a process within the limit failed: %v\n%s", err, out)
	}
	if kills, err := c.OOMKills(); err != nil || kills != 0 {
		t.Fatalf("after a process within the limit: %d OOM kills, %v; want none", kills, err)
	}
	big := c.Command(os.Args[0], "-test.run=^TestMemoryCgroupHoldsTheLimit$")
	big.Env = append(os.Environ(), "BENCHENV_TOUCH_MIB=512")
	out, err := big.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) {
		t.Fatalf("a process touching 512 MiB in a %d MiB cgroup: %v, want it killed\n%s", limit>>20, err, out)
	}
	if ws, ok := exit.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("a process touching 512 MiB in a %d MiB cgroup ended with %v, want SIGKILL\n%s", limit>>20, err, out)
	}
	if kills, err := c.OOMKills(); err != nil || kills != 1 {
		t.Fatalf("%d OOM kills, %v; want 1", kills, err)
	}
	// The kernel charges a task that is being OOM-killed past the limit
	// (try_charge's forced charge, so the dying task can exit), so the peak
	// may pass the limit by a few pages: a CI run saw one page over. A
	// sixteenth of the limit allows for that and is still far below the
	// 512 MiB the process touches when the limit is not held.
	if peak, err := c.Peak(); err != nil || peak > limit+limit/16 || peak < limit/2 {
		t.Fatalf("peak %d, %v; want between half the limit and the limit plus a sixteenth, %d", peak, err, limit)
	}
}

func TestMain(m *testing.M) {
	if v := os.Getenv("BENCHENV_TOUCH_MIB"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			panic(err)
		}
		keep := make([][]byte, 0, n)
		for range n {
			b := make([]byte, 1<<20)
			for i := 0; i < len(b); i += 4096 {
				b[i] = 1
			}
			keep = append(keep, b)
		}
		fmt.Println("touched", len(keep), "MiB")
		os.Exit(0)
	}
	os.Exit(m.Run())
}
