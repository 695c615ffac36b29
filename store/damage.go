package store

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/dgraph-io/badger/v4"
	"github.com/dgraph-io/badger/v4/options"
	"github.com/dgraph-io/badger/v4/table"
	"github.com/dgraph-io/badger/v4/y"
	"github.com/dgraph-io/ristretto/v2/z"
)

// recoverHint is how to recover from ErrCorrupt; every such error ends with it.
const recoverHint = "move the data directory aside (keep it for inspection) and restart: the state is rebuilt by replaying the input"

// vlogHeaderBytes is the header Badger writes at the start of every
// value-log file (value.go vlogHeaderSize).
const vlogHeaderBytes = 20

// corruptError returns an ErrCorrupt error for the store in where, saying
// what is wrong and how to recover.
func corruptError(where, what string) error {
	return fmt.Errorf("%w in %s: %s; %s", ErrCorrupt, where, what, recoverHint)
}

// refused logs err at ERROR if it is ErrCorrupt, for an Open that fails
// before metrics exist, and returns it.
func (db *DB) refused(err error) error {
	if errors.Is(err, ErrCorrupt) {
		db.logger.Error("state is corrupt and will not be used", "dir", db.where, "err", err)
	}
	return err
}

// corrupted logs err, found while the DB is open, at ERROR and counts it in
// kdedup_store_corruptions_total; err must wrap ErrCorrupt.
func (db *DB) corrupted(err error) error {
	db.metrics.corruptions.Inc()
	db.logger.Error("state is corrupt and will not be used", "dir", db.where, "err", err)
	return err
}

// isDamaged reports whether err, from reading stored entries, says they
// are damaged: an entry that cannot be right (errBadEntry, or ErrCorrupt
// already), a failed checksum or a lost value-log entry.
func isDamaged(err error) bool {
	return errors.Is(err, errBadEntry) || errors.Is(err, ErrCorrupt) || isChecksumError(err) || isLostValueError(err)
}

// isChecksumError reports whether err from Badger is a failed checksum.
// Badger's y.Wrap formats the cause into the message outside its debug
// builds, so the message is what can be tested.
func isChecksumError(err error) bool {
	return errors.Is(err, y.ErrChecksumMismatch) || strings.Contains(err.Error(), y.ErrChecksumMismatch.Error())
}

// isLostValueError reports whether err from Badger is a value whose
// value-log entry is not there: a pointer past the end of its file
// (y.ErrEOF, "Invalid read") or into a file that does not exist. After a
// power loss the memtable log can keep pointers to the tail of the last
// value-log file that was lost (neither is fsynced), which Badger
// truncates at open.
func isLostValueError(err error) bool {
	msg := err.Error()
	return errors.Is(err, y.ErrEOF) || strings.Contains(msg, y.ErrEOF.Error()) ||
		strings.Contains(msg, "Invalid read") || strings.Contains(msg, "file with ID")
}

// checkDir looks for the damage that Badger would either not report or
// report by crashing, before badger.Open reads or changes anything in dir,
// and returns the bytes of table files per LSM level (nil for a directory
// without a MANIFEST). It refuses (ErrCorrupt):
//
//   - table files without a MANIFEST: Badger would delete every table as an
//     orphan and open what is left in the memtable logs, the latest write
//     batches without the pages of the earlier ones, as if it were whole;
//   - a MANIFEST Badger cannot read;
//   - a table the MANIFEST lists that is missing, cut short (Badger panics
//     in a goroutine of its own while reading the index, which no caller
//     can recover) or fails a block checksum;
//   - a value-log file shorter than its header (Badger refuses it once,
//     then rewrites the header on the next open).
//
// Every table is read in full to verify its checksums, once per Open, so
// Badger itself only verifies the blocks it reads later.
func checkDir(dir string, bo badger.Options) (levelBytes []int64, err error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("store: listing %s: %w", dir, err)
	}
	var hasManifest bool
	var tables []string
	for _, e := range entries {
		name := e.Name()
		switch {
		case name == badger.ManifestFilename:
			hasManifest = true
		case strings.HasSuffix(name, ".sst"):
			tables = append(tables, name)
		case strings.HasSuffix(name, ".vlog"):
			info, err := e.Info()
			if err != nil {
				return nil, fmt.Errorf("store: checking %s: %w", filepath.Join(dir, name), err)
			}
			if info.Size() < vlogHeaderBytes {
				return nil, corruptError(dir, fmt.Sprintf("value-log file %s is %d bytes, shorter than its %d-byte header (cut short)",
					name, info.Size(), vlogHeaderBytes))
			}
		}
	}
	if !hasManifest {
		if len(tables) > 0 {
			return nil, corruptError(dir, fmt.Sprintf("the MANIFEST is missing while %d table files (%s...) are present; Badger would delete them and open the rest as if it were the whole state",
				len(tables), tables[0]))
		}
		return nil, nil
	}

	m, err := readManifest(filepath.Join(dir, badger.ManifestFilename), bo)
	if err != nil {
		return nil, err
	}
	levelBytes = make([]int64, bo.MaxLevels)
	ids := make([]uint64, 0, len(m.Tables))
	for id := range m.Tables {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		tm := m.Tables[id]
		size, err := checkTable(dir, table.NewFilename(id, dir), tm, bo)
		if err != nil {
			return nil, err
		}
		if int(tm.Level) < len(levelBytes) {
			levelBytes[tm.Level] += size
		}
	}
	return levelBytes, nil
}

func readManifest(path string, bo badger.Options) (m badger.Manifest, err error) {
	f, err := os.Open(path)
	if err != nil {
		return m, fmt.Errorf("store: opening %s: %w", path, err)
	}
	defer f.Close()
	defer func() {
		if r := recover(); r != nil {
			err = corruptError(filepath.Dir(path), fmt.Sprintf("reading the MANIFEST panicked: %v", r))
		}
	}()
	if m, _, err = badger.ReplayManifestFile(f, bo.ExternalMagicVersion, bo); err != nil {
		return m, corruptError(filepath.Dir(path), fmt.Sprintf("the MANIFEST is unreadable: %v", err))
	}
	return m, nil
}

// checkTable opens the table file path read-only, reads its index and
// verifies the checksum of every block, and returns its size.
func checkTable(dir, path string, tm badger.TableManifest, bo badger.Options) (size int64, err error) {
	name := filepath.Base(path)
	info, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, corruptError(dir, fmt.Sprintf("table %s, listed in the MANIFEST, is missing", name))
	}
	if err != nil {
		return 0, fmt.Errorf("store: checking table %s: %w", path, err)
	}
	if info.Size() == 0 {
		return 0, corruptError(dir, fmt.Sprintf("table %s is empty", name))
	}
	mf, err := z.OpenMmapFile(path, os.O_RDONLY, 0)
	if err != nil {
		return 0, fmt.Errorf("store: checking table %s: %w", path, err)
	}
	var t *table.Table
	defer func() {
		r := recover()
		if t != nil {
			_ = t.Close(-1)
		} else {
			// OpenTable leaves the file open when reading the index fails.
			_ = mf.Close(-1)
		}
		if r != nil {
			err = corruptError(dir, fmt.Sprintf("table %s is damaged or cut short (%d bytes): reading its index failed: %s",
				name, info.Size(), strings.Join(strings.Fields(fmt.Sprint(r)), " ")))
		}
	}()
	// NoVerification: OpenTable then verifies nothing beyond the index, so
	// that VerifyChecksum checks every block itself.
	t, err = table.OpenTable(mf, table.Options{
		ReadOnly:           true,
		TableSize:          uint64(bo.BaseTableSize),
		BlockSize:          bo.BlockSize,
		BloomFalsePositive: bo.BloomFalsePositive,
		ChkMode:            options.NoVerification,
		Compression:        tm.Compression,
	})
	if err != nil {
		return 0, corruptError(dir, fmt.Sprintf("table %s is damaged or cut short (%d bytes): %v", name, info.Size(), err))
	}
	if err := t.VerifyChecksum(); err != nil {
		return 0, corruptError(dir, fmt.Sprintf("table %s fails its checksum: %v", name, err))
	}
	return info.Size(), nil
}

// badgerOpenError maps an error of badger.Open: damage Badger reports
// itself (a checksum, a value-log file it cannot open) becomes ErrCorrupt.
func badgerOpenError(where string, err error) error {
	msg := err.Error()
	switch {
	case strings.Contains(msg, "Cannot acquire directory lock"):
		return fmt.Errorf("store: opening badger at %s: %w: %v", where, ErrLocked, err)
	case isChecksumError(err):
		return fmt.Errorf("store: opening badger at %s: %w: a checksum does not match: %w; %s", where, ErrCorrupt, err, recoverHint)
	case strings.Contains(msg, "Open existing file"), strings.Contains(msg, "During db.vlog.open"):
		return fmt.Errorf("store: opening badger at %s: %w: a value-log file is damaged: %w; %s", where, ErrCorrupt, err, recoverHint)
	}
	return fmt.Errorf("store: opening badger at %s: %w", where, err)
}
