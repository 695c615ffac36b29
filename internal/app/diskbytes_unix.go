//go:build unix

package app

import (
	"io/fs"
	"syscall"
)

// diskBytes is the space fi takes on disk: its allocated 512-byte blocks
// (st_blocks), which for a sparse file, such as Badger's value log left
// at its preallocated size by a crash, is less than its size.
func diskBytes(fi fs.FileInfo) int64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return int64(st.Blocks) * 512
	}
	return fi.Size()
}
