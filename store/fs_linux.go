package store

import (
	"errors"
	"fmt"
	"io/fs"
	"os"

	"golang.org/x/sys/unix"
)

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

// lockDir takes the lock Badger takes on dir (flock of the directory:
// shared for a reader, exclusive for a writer) so that checkDir never reads
// the files of a directory another process is changing; the caller
// releases it before badger.Open, which takes its own. A directory that
// does not exist yet needs no lock.
func lockDir(dir string, readOnly bool) (release func(), err error) {
	f, err := os.Open(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return func() {}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("store: opening %s: %w", dir, err)
	}
	how := unix.LOCK_EX
	if readOnly {
		how = unix.LOCK_SH
	}
	if err := unix.Flock(int(f.Fd()), how|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("store: opening %s: %w (another process holds its lock)", dir, ErrLocked)
		}
		return nil, fmt.Errorf("store: locking %s: %w", dir, err)
	}
	return func() { f.Close() }, nil
}
