package store

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"

	"github.com/dgraph-io/badger/v4"
)

// writeReserve is the free space a write batch needs before the
// compaction term: the batch as written to the value log (its whole
// pages and log entry, batchDiskBytes) and to the memtable's log, plus
// the flush of every memtable.
func (db *DB) writeReserve() int64 {
	return db.batchDisk + db.batchSize + numMemtables*(db.memTable+db.batchSize)
}

// batchDiskBytes is the most a write batch of FlushBytes writes to the
// value log with pages of pageBytes: its pages written whole (those the
// batch dirtied and those the write-back takes), each with its key and
// header, and a log entry of up to the batch's bytes.
func batchDiskBytes(pageBytes int, flushBytes int64) int64 {
	pb := int64(pageBytes)
	pages := (flushBytes+pb-1)/pb + 1 + writeBackPages(pageBytes, flushBytes)
	return pages*(pb+pageBaseHeader+maxPageKeyBytes) + flushBytes + pb + maxLogKeyBytes
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
		ErrDiskFull, db.where, free, need, db.batchDisk+db.batchSize, numMemtables, db.memTable, need-db.writeReserve())
}

// checkFreeSpace compares the free space, less what restores have
// reserved (ReserveSpace), with what a Commit needs now; an in-memory or
// read-only DB writes nothing to disk and always passes.
func (db *DB) checkFreeSpace() error {
	return db.checkFreeSpaceBut(0)
}

// checkFreeSpaceBut is checkFreeSpace for a writer that holds own of the
// reserved bytes (an Import inside its restore's reservation).
func (db *DB) checkFreeSpaceBut(own int64) error {
	if db.opts.InMemory || db.opts.ReadOnly {
		return nil
	}
	free, err := db.tuning.freeBytes(db.opts.Dir)
	if err != nil {
		return fmt.Errorf("store: checking the free space of %s: %w", db.where, err)
	}
	db.space.Lock()
	others := max(0, db.space.reserved-own)
	db.space.Unlock()
	return db.checkSpace(uint64(max(0, int64(free)-others)), db.requiredFreeBytes())
}

// ReserveSpace reserves bytes of the data directory's free space for one
// restore (its download and the state it imports: snapshot.Manifest's
// RestoreBytes), so that restores running at once cannot all pass a
// check of the same free space and then fill the volume together (a full
// volume is a SIGBUS under Badger's memory maps; see the package doc). It
// returns ErrDiskFull (wrapped, with the figures) when the free space less
// the reservations held and what a Commit needs now is below bytes; else a
// Reservation to Release once the restore's state is committed or
// abandoned. Write batches of other partitions see reserved bytes as
// taken. An in-memory or read-only DB reserves nothing. Safe for
// concurrent use.
func (db *DB) ReserveSpace(bytes int64) (*Reservation, error) {
	r := &Reservation{db: db}
	if db.opts.InMemory || db.opts.ReadOnly || bytes <= 0 {
		return r, nil
	}
	free, err := db.tuning.freeBytes(db.opts.Dir)
	if err != nil {
		return nil, fmt.Errorf("store: checking the free space of %s: %w", db.where, err)
	}
	db.space.Lock()
	defer db.space.Unlock()
	required := db.requiredFreeBytes()
	if avail := int64(free) - db.space.reserved - required; avail < bytes {
		return nil, fmt.Errorf("%w: data directory %s has %d bytes free, %d of them reserved by other restores and %d needed by write batches: %d left, %d needed by this restore",
			ErrDiskFull, db.where, free, db.space.reserved, required, max(0, avail), bytes)
	}
	db.space.reserved += bytes
	r.bytes = bytes
	return r, nil
}

// Reservation is free space ReserveSpace reserved. Not safe for
// concurrent use.
type Reservation struct {
	db    *DB
	bytes int64
}

// Bytes is the space still reserved: not yet consumed (Consume), 0 after
// Release.
func (r *Reservation) Bytes() int64 {
	if r == nil {
		return 0
	}
	return r.bytes
}

// Consume tells that n of the reserved bytes are now written (a download
// finished, pages imported): they are taken from the volume's free space
// itself and no longer held apart, so that they are not counted twice
// against other writers. Safe on a nil Reservation.
func (r *Reservation) Consume(n int64) {
	if r == nil || r.bytes == 0 || n <= 0 {
		return
	}
	n = min(n, r.bytes)
	r.db.space.Lock()
	r.db.space.reserved -= n
	r.db.space.Unlock()
	r.bytes -= n
}

// Release returns the reserved space; later calls do nothing.
func (r *Reservation) Release() {
	if r == nil || r.bytes == 0 {
		return
	}
	r.db.space.Lock()
	r.db.space.reserved -= r.bytes
	r.db.space.Unlock()
	r.bytes = 0
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

// ReserveSpace reserves bytes of free space for a restore of p
// (DB.ReserveSpace) and holds the reservation for p's Import, whose
// checks then count it as p's own, until Release. A reservation held
// already is released first.
func (p *PartitionState) ReserveSpace(bytes int64) (*Reservation, error) {
	p.reservation.Release()
	r, err := p.db.ReserveSpace(bytes)
	if err != nil {
		return nil, fmt.Errorf("store: reserving space to restore %s: %w", p.tp, err)
	}
	p.reservation = r
	return r, nil
}

// importSpaceCheckPages is how often an Import checks the free space
// again: every so many pages written.
const importSpaceCheckPages = 1024
