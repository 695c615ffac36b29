//go:build !amd64

package filter

import "unsafe"

// prefetchLine does nothing where no prefetch instruction is wired up.
func prefetchLine(unsafe.Pointer) {}
