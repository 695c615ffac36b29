//go:build !amd64

package filter

import "unsafe"

// PrefetchesBuckets reports whether Chain.PrefetchBuckets does anything on
// this architecture: no prefetch instruction is wired up here.
const PrefetchesBuckets = false

// prefetchLine does nothing where no prefetch instruction is wired up.
func prefetchLine(unsafe.Pointer) {}
