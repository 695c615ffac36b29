package filter

import "unsafe"

// prefetchLine asks the CPU to bring the cache line holding p into its
// caches (PREFETCHT0) without waiting for it: a hint that never faults and
// changes no memory.
//
//go:noescape
func prefetchLine(p unsafe.Pointer)
