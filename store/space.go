package store

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"

	"github.com/dgraph-io/badger/v4"
)

// writeReserve is the free space a write batch needs before the
// compaction term: the batch plus the flush of every memtable.
func (db *DB) writeReserve() int64 {
	return db.batchSize + numMemtables*(db.memTable+db.batchSize)
}

// compactionBytes estimates the output of the next level-0 compaction from
// the bytes per LSM level: level 0 plus the first lower level holding
// tables (Badger's base level once the tree has grown).
func compactionBytes(levelBytes []int64) int64 {
	if len(levelBytes) == 0 {
		return 0
	}
	n := levelBytes[0]
	for _, b := range levelBytes[1:] {
		if b > 0 {
			return n + b
		}
	}
	return n
}

func levelBytes(levels []badger.LevelInfo) []int64 {
	var b []int64
	for _, l := range levels {
		for len(b) <= l.Level {
			b = append(b, 0)
		}
		b[l.Level] += l.Size
	}
	return b
}

// requiredFreeBytes returns the free space Commit needs now.
func (db *DB) requiredFreeBytes() int64 {
	return db.writeReserve() + compactionBytes(levelBytes(db.bdb.Levels()))
}

// checkSpace returns ErrDiskFull when free, the bytes available on the
// filesystem of the data directory, is below need.
func (db *DB) checkSpace(free uint64, need int64) error {
	if need <= 0 || free >= uint64(need) {
		return nil
	}
	return fmt.Errorf("%w: data directory %s has %d bytes free, %d needed (a write batch of up to %d bytes, the level-0 tables of %d memtables of %d bytes, a compaction of %d bytes); free space on the volume or enlarge it",
		ErrDiskFull, db.where, free, need, db.batchSize, numMemtables, db.memTable, need-db.writeReserve())
}

// checkFreeSpace compares the free space with what a Commit needs now;
// an in-memory or read-only DB writes nothing to disk and always passes.
func (db *DB) checkFreeSpace() error {
	if db.opts.InMemory || db.opts.ReadOnly {
		return nil
	}
	free, err := db.tuning.freeBytes(db.opts.Dir)
	if err != nil {
		return fmt.Errorf("store: checking the free space of %s: %w", db.where, err)
	}
	return db.checkSpace(free, db.requiredFreeBytes())
}

// freeBytesAt returns the free space of the filesystem that holds dir, or
// will hold it once created: it asks for the nearest existing ancestor.
func freeBytesAt(dir string, statfs func(string) (uint64, error)) (uint64, error) {
	for d := filepath.Clean(dir); ; d = filepath.Dir(d) {
		free, err := statfs(d)
		if !errors.Is(err, fs.ErrNotExist) || d == filepath.Dir(d) {
			return free, err
		}
	}
}
