package filter

import "unsafe"

// PrefetchesBuckets reports whether Chain.PrefetchBuckets does anything on
// this architecture: it needs a prefetch instruction (amd64's PREFETCHT0).
const PrefetchesBuckets = true

// prefetchLine asks the CPU to bring the cache line holding p into its
// caches (PREFETCHT0) without waiting for it: a hint that never faults and
// changes no memory.
//
//go:noescape
func prefetchLine(p unsafe.Pointer)
