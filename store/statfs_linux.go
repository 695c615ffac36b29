package store

import "golang.org/x/sys/unix"

// statfsFree returns the bytes of the filesystem holding dir that the
// process may still allocate (f_bavail blocks of f_frsize bytes, as
// statvfs(3) counts them).
func statfsFree(dir string) (uint64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 0, err
	}
	size := uint64(st.Frsize)
	if size == 0 {
		size = uint64(st.Bsize)
	}
	return st.Bavail * size, nil
}
