//go:build !unix

package app

import "io/fs"

// diskBytes is the space fi takes on disk; where the platform does not
// tell its allocated blocks, its size.
func diskBytes(fi fs.FileInfo) int64 { return fi.Size() }
