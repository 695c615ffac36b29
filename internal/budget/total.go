package budget

import (
	"errors"
	"fmt"

	"github.com/KimMachineGun/automemlimit/memlimit"
)

const (
	// ContainerRatio is the share of the container's memory limit a worker
	// takes as its budget when KDEDUP_MEMORY_BYTES is not set: the rest is
	// for the kernel's page cache of the data directory and what the
	// budget does not see, so that the container is not OOM-killed.
	ContainerRatio = 0.9
	// DefaultTotalBytes is the budget when neither KDEDUP_MEMORY_BYTES nor
	// a container memory limit sets one: the chart's container less its
	// 10%, rounded up, which leaves the page cache about 1.7 GiB at the
	// default FLUSH_BYTES (the store's share is about 440 MiB, see
	// store.Options.MemoryBytes).
	DefaultTotalBytes = 3 << 30
)

// CgroupLimit reads the memory limit of the process's cgroup (v2
// memory.max, v1 memory.limit_in_bytes, the closest limited ancestor) with
// github.com/KimMachineGun/automemlimit. It returns an error when there is
// none (no cgroup, no limit, not Linux).
func CgroupLimit() (uint64, error) { return memlimit.FromCgroup() }

// Total is the budget in bytes and where it comes from: configured when
// it is above 0 (KDEDUP_MEMORY_BYTES), else ContainerRatio of the limit
// limit reports, else DefaultTotalBytes.
func Total(configured int64, limit func() (uint64, error)) (int64, string) {
	if configured > 0 {
		return configured, "KDEDUP_MEMORY_BYTES"
	}
	n, err := limit()
	if err == nil && n > 0 {
		return int64(float64(n) * ContainerRatio), fmt.Sprintf("%.0f%% of the container's memory limit of %d bytes", ContainerRatio*100, n)
	}
	why := "no container memory limit"
	if err != nil && !errors.Is(err, memlimit.ErrNoLimit) && !errors.Is(err, memlimit.ErrNoCgroup) && !errors.Is(err, memlimit.ErrCgroupsNotSupported) {
		why = "the container memory limit could not be read (" + err.Error() + ")"
	}
	return DefaultTotalBytes, "default (" + why + ")"
}
