package benchenv

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// clockTicks is the unit of utime and stime in /proc/pid/stat: USER_HZ,
// 100 on every Linux architecture Go supports.
const clockTicks = 100

// ProcessCPU returns the user plus system CPU time process pid has used
// (utime and stime of /proc/pid/stat, all its threads, in 10ms ticks).
func ProcessCPU(pid int) (time.Duration, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name, field 2, is in parentheses and may hold spaces:
	// the fields after its closing parenthesis start at field 3.
	i := strings.LastIndexByte(string(data), ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	fields := strings.Fields(string(data[i+1:]))
	if len(fields) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields after the command name, want at least 13", pid, len(fields))
	}
	var ticks int64
	for _, f := range fields[11:13] { // utime (field 14) and stime (field 15)
		n, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/%d/stat: %w", pid, err)
		}
		ticks += n
	}
	return time.Duration(ticks) * time.Second / clockTicks, nil
}

// ProcessMemory returns the fields of /proc/pid/status that are memory
// sizes (VmHWM, VmRSS, RssAnon, RssFile and the rest), in bytes.
func ProcessMemory(pid int) (map[string]int64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return nil, err
	}
	sizes := map[string]int64{}
	for line := range strings.Lines(string(data)) {
		name, value, _ := strings.Cut(line, ":")
		kb, ok := strings.CutSuffix(strings.TrimSpace(value), " kB")
		if !ok {
			continue
		}
		if n, err := strconv.ParseInt(kb, 10, 64); err == nil {
			sizes[name] = n << 10
		}
	}
	return sizes, nil
}

// ResetProcessPeakRSS resets process pid's peak resident set (VmHWM) to its
// current one (Linux 4.0 and later; needs the right to write the process's
// clear_refs: the same user, or root).
func ResetProcessPeakRSS(pid int) error {
	return os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", pid), []byte("5"), 0)
}

// MemoryCgroup is a memory cgroup with a limit, made below this process's
// own, for the processes a benchmark starts: the kernel holds them to the
// limit as a container's limit would (reclaiming their page cache, then
// OOM-killing), and counts what they used. It works with cgroup v1 (the
// memory controller's hierarchy) and v2 where this process may write the
// cgroup file system (root, or a delegated subtree); on v2 this process's
// own cgroup must allow children with the memory controller. Safe for
// concurrent use: its methods only read and write the cgroup's files.
type MemoryCgroup struct {
	// Dir is the cgroup's directory.
	Dir string
	v2  bool
}

// ErrNoMemoryCgroup is returned (wrapped) by NewMemoryCgroup when this
// process has no memory cgroup it may make a child in: no memory
// controller, or a cgroup file system it may not write.
var ErrNoMemoryCgroup = errors.New("no memory cgroup can be made here")

// NewMemoryCgroup makes the memory cgroup name below this process's
// memory cgroup with a limit of limit bytes, swap included where the
// kernel accounts swap (so that the limit cannot be passed by swapping).
// Errors: ErrNoMemoryCgroup (wrapped) when the cgroup cannot be made; an
// error naming the file and value when a limit cannot be written to the
// cgroup made (which is then removed).
func NewMemoryCgroup(name string, limit int64) (*MemoryCgroup, error) {
	self, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return nil, fmt.Errorf("memory cgroup: %w: %w", ErrNoMemoryCgroup, err)
	}
	parent, v2, err := memoryCgroupDir(string(self), "/sys/fs/cgroup")
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNoMemoryCgroup, err)
	}
	c := &MemoryCgroup{Dir: filepath.Join(parent, name), v2: v2}
	if err := os.Mkdir(c.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("memory cgroup: %w: %w (a writable cgroup file system is needed: root, or a delegated cgroup)", ErrNoMemoryCgroup, err)
	}
	limitFile, swapFile, swap := "memory.limit_in_bytes", "memory.memsw.limit_in_bytes", strconv.FormatInt(limit, 10)
	if v2 {
		limitFile, swapFile, swap = "memory.max", "memory.swap.max", "0"
	}
	if err := c.write(limitFile, strconv.FormatInt(limit, 10)); err != nil {
		_ = os.Remove(c.Dir)
		return nil, err
	}
	if _, err := os.Stat(filepath.Join(c.Dir, swapFile)); err == nil {
		if err := c.write(swapFile, swap); err != nil {
			_ = os.Remove(c.Dir)
			return nil, err
		}
	}
	return c, nil
}

// memoryCgroupDir returns the directory of the memory cgroup that
// procSelfCgroup (the text of /proc/self/cgroup) names under the cgroup
// file system at root, and whether it is cgroup v2: the v1 memory
// hierarchy's line when there is one (hybrid systems have both), else the
// unified hierarchy's ("0::path").
func memoryCgroupDir(procSelfCgroup, root string) (string, bool, error) {
	unified := ""
	for line := range strings.Lines(procSelfCgroup) {
		id, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok {
			continue
		}
		controllers, path, ok := strings.Cut(rest, ":")
		if !ok {
			continue
		}
		for c := range strings.SplitSeq(controllers, ",") {
			if c == "memory" {
				return filepath.Join(root, "memory", path), false, nil
			}
		}
		if id == "0" && controllers == "" {
			unified = path
		}
	}
	if unified == "" {
		return "", false, errors.New("memory cgroup: /proc/self/cgroup names no memory cgroup")
	}
	return filepath.Join(root, unified), true, nil
}

// Command returns the command name with arg, started inside the cgroup: a
// shell writes its own process ID into the cgroup, then executes name, so
// that all the process's memory is charged to the cgroup from its first
// page.
func (c *MemoryCgroup) Command(name string, arg ...string) *exec.Cmd {
	// sh -c script $0 $1...: $0 is the cgroup's procs file, "$@" the command.
	return exec.Command("/bin/sh", append([]string{"-c", `echo $$ > "$0" && exec "$@"`, filepath.Join(c.Dir, "cgroup.procs"), name}, arg...)...)
}

// Peak returns the most memory charged to the cgroup since it was made or
// since ResetPeak, in bytes: its processes' anonymous memory and the page
// cache of the files they read and wrote (v1 memory.max_usage_in_bytes,
// v2 memory.peak), which the kernel reclaims before it OOM-kills.
func (c *MemoryCgroup) Peak() (int64, error) {
	if c.v2 {
		return c.readInt("memory.peak")
	}
	return c.readInt("memory.max_usage_in_bytes")
}

// ResetPeak restarts Peak from the current usage (v1; on v2 it returns an
// error: memory.peak is reset per open file there, not for all readers).
func (c *MemoryCgroup) ResetPeak() error {
	if c.v2 {
		return errors.New("memory cgroup: v2's memory.peak cannot be reset for later reads")
	}
	return c.write("memory.max_usage_in_bytes", "0")
}

// OOMKills returns how many of the cgroup's processes the kernel
// OOM-killed (v1 memory.oom_control, Linux 4.13 and later; v2
// memory.events).
func (c *MemoryCgroup) OOMKills() (int64, error) {
	file := "memory.oom_control"
	if c.v2 {
		file = "memory.events"
	}
	ev, err := c.readKeyed(file)
	if err != nil {
		return 0, err
	}
	n, ok := ev["oom_kill"]
	if !ok {
		return 0, fmt.Errorf("memory cgroup: %s has no oom_kill count", file)
	}
	return n, nil
}

// Remove removes the cgroup; its processes must have exited. It retries
// for up to a second while the kernel still counts an exited process.
func (c *MemoryCgroup) Remove() error {
	var err error
	for range 50 {
		if err = os.Remove(c.Dir); err == nil || errors.Is(err, os.ErrNotExist) {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("memory cgroup: %w", err)
}

func (c *MemoryCgroup) write(file, value string) error {
	if err := os.WriteFile(filepath.Join(c.Dir, file), []byte(value), 0); err != nil {
		return fmt.Errorf("memory cgroup: writing %q: %w", value, err)
	}
	return nil
}

func (c *MemoryCgroup) readInt(file string) (int64, error) {
	data, err := os.ReadFile(filepath.Join(c.Dir, file))
	if err != nil {
		return 0, fmt.Errorf("memory cgroup: %w", err)
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("memory cgroup: %s: %w", file, err)
	}
	return n, nil
}

// readKeyed reads a file of "key value" lines.
func (c *MemoryCgroup) readKeyed(file string) (map[string]int64, error) {
	data, err := os.ReadFile(filepath.Join(c.Dir, file))
	if err != nil {
		return nil, fmt.Errorf("memory cgroup: %w", err)
	}
	kv := map[string]int64{}
	for line := range strings.Lines(string(data)) {
		k, v, ok := strings.Cut(strings.TrimSpace(line), " ")
		if !ok {
			continue
		}
		if n, err := strconv.ParseInt(v, 10, 64); err == nil {
			kv[k] = n
		}
	}
	return kv, nil
}
