// Package benchenv holds what kdedup's benchmarks measure and how they are
// sized, so that every benchmark reads its environment and the process's
// resources the same way: integer settings from environment variables,
// the process's CPU time, its peak resident set and gathered Prometheus
// metrics, and the benchmark keys; and a child process's CPU time, memory
// and memory cgroup (process.go). What a benchmark needs of a worker run
// as a child process over its HTTP server is in internal/harness.
// benchenv imports none of kdedup's packages, so that a benchmark
// binary's own memory stays that of the package it measures. Linux
// figures come from getrusage and /proc/self; elsewhere PeakRSS reports
// -1. Its functions are safe for concurrent use.
package benchenv

import (
	"encoding/binary"
	"encoding/hex"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Int returns the environment variable name as a non-negative integer, or
// def when it is unset; any other value fails tb naming the variable.
func Int(tb testing.TB, name string, def int) int {
	tb.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		tb.Fatalf("%s=%q: want a non-negative integer", name, v)
	}
	return n
}

// CPU returns the user plus system CPU time the process has used
// (getrusage), or fails tb.
func CPU(tb testing.TB) time.Duration {
	tb.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// PeakRSS returns the process's peak resident set in bytes (VmHWM of
// /proc/self/status), or -1 where that is unknown.
func PeakRSS() int64 { return statusBytes("VmHWM:") }

// AnonRSS returns the process's anonymous resident memory in bytes
// (RssAnon of /proc/self/status: the heap, stacks and anonymous maps, not
// the pages of mapped files, which the kernel reclaims first), or -1
// where that is unknown.
func AnonRSS() int64 { return statusBytes("RssAnon:") }

// statusBytes returns the field of /proc/self/status (its name and
// colon), in kB there, in bytes; -1 where that is unknown.
func statusBytes(field string) int64 {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return -1
	}
	for line := range strings.Lines(string(data)) {
		if v, ok := strings.CutPrefix(line, field); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				return -1
			}
			return kb << 10
		}
	}
	return -1
}

// SampleAnonRSS samples AnonRSS every interval until the function it
// returns is called, which returns the most seen (-1 where unknown).
func SampleAnonRSS(interval time.Duration) func() int64 {
	done := make(chan struct{})
	most := make(chan int64)
	go func() {
		peak := AnonRSS()
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-done:
				most <- max(peak, AnonRSS())
				return
			case <-t.C:
				peak = max(peak, AnonRSS())
			}
		}
	}()
	return func() int64 {
		close(done)
		return <-most
	}
}

// ResetPeakRSS resets the peak resident set to the current one (Linux 4.0
// and later; elsewhere PeakRSS keeps the process's peak).
func ResetPeakRSS() { _ = os.WriteFile("/proc/self/clear_refs", []byte("5"), 0) }

// Gathered returns the sum of the samples of the counter or gauge name in
// reg (0 when reg has none), or fails tb.
func Gathered(tb testing.TB, reg prometheus.Gatherer, name string) float64 {
	tb.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		tb.Fatal(err)
	}
	total := 0.0
	for _, mf := range mfs {
		if mf.GetName() == name {
			total += FamilySum(mf)
		}
	}
	return total
}

// FamilySum returns the sum of mf's counter, gauge and untyped values over
// their labels (a histogram or summary sums to 0).
func FamilySum(mf *dto.MetricFamily) float64 {
	total := 0.0
	for _, m := range mf.GetMetric() {
		total += m.GetCounter().GetValue() + m.GetGauge().GetValue() + m.GetUntyped().GetValue()
	}
	return total
}

// Key writes the key of record i into dst, which must hold 16 bytes: 16
// hexadecimal characters of splitmix64's finalizer of i, a bijection, so
// distinct records have distinct, random-looking keys that share no
// prefix a store could gain from.
func Key(dst []byte, i uint64) {
	z := i + 0x9e3779b97f4a7c15
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	z ^= z >> 31
	var raw [8]byte
	binary.BigEndian.PutUint64(raw[:], z)
	hex.Encode(dst, raw[:])
}
