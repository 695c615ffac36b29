package app

import (
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"

	"github.com/kdedup/kdedup/consumer"
)

// damagedPrefix names the directories moveAside creates in the data
// directory.
const damagedPrefix = "damaged-"

// damaged owns the damaged-* directories of a data directory, where a
// state found corrupt at start is moved aside, and the gauge of the bytes
// they take on disk. It is used by build alone, before anything else runs:
// not safe for concurrent use.
type damaged struct {
	dir   string
	bytes prometheus.Gauge
	log   *slog.Logger
}

// newDamaged returns the damaged-* directories of data directory dir, with
// their gauge, kdedup_damaged_state_bytes, registered on reg. The gauge is
// 0 until measure or moveAside sets it.
func newDamaged(dir string, reg prometheus.Registerer, log *slog.Logger) *damaged {
	return &damaged{
		dir: dir,
		log: log,
		bytes: promauto.With(reg).NewGauge(prometheus.GaugeOpts{
			Name: "kdedup_damaged_state_bytes",
			Help: "Bytes on disk of the damaged-* directories in KDEDUP_DATA_DIR (corrupt state moved aside at start; at most one, the newest), measured at start-up and after a move.",
		}),
	}
}

// measure sets the gauge to the bytes on disk of the damaged-* directories
// (0 when the data directory does not exist yet). A directory deleted by
// hand while the worker runs shows at its next start. A directory that
// cannot be measured is logged at WARN and leaves the gauge as it was: the
// measure is for operators, never a reason to stop.
func (d *damaged) measure() {
	n, err := damagedBytes(d.dir)
	if err != nil {
		d.log.Warn("cannot measure the damaged state; kdedup_damaged_state_bytes keeps its value", "dir", d.dir, "err", err)
		return
	}
	d.bytes.Set(float64(n))
}

// moveAside moves every entry of the data directory (whose state is
// corrupt) into a new subdirectory of it, damaged-<UTC time>, which it
// returns, so that the state is kept for inspection while the partitions
// restore, and the data directory can be a mount point (which cannot itself
// be renamed). lost+found, a filesystem's own directory at a volume's root,
// stays, and so does consumer.ForeignStatesDir: the states of other topics
// moved aside are not the damaged state's, and the next damage would
// delete them with it. The gauge is measured again afterwards, whether the move
// succeeded or not.
//
// Only the newest damage is kept: every earlier damaged-* directory is
// deleted first, before the new one is made. A corruption that recurs at
// every restart then holds one copy of the state instead of one per
// restart, and the space of the earlier copies is free before the restores
// that follow need it (renames within the volume take no space, so the
// restores need room for one state besides the damaged one, not for one
// per earlier failure). Deleting before the move, rather than pruning all
// but the newest name after it, keeps the state just found corrupt however
// the clock has moved since the earlier ones were named. A stop between the
// deletion and the move leaves the corrupt state in place, where the next
// start finds it and moves it aside; a stop in the middle of the move
// leaves part of it in damaged-*, which the next move deletes.
func (d *damaged) moveAside() (string, error) {
	defer d.measure()
	entries, err := os.ReadDir(d.dir)
	if err != nil {
		return "", fmt.Errorf("reading the data directory %s: %w", d.dir, err)
	}
	var moved []os.DirEntry
	for _, e := range entries {
		switch {
		case strings.HasPrefix(e.Name(), damagedPrefix):
			if err := os.RemoveAll(filepath.Join(d.dir, e.Name())); err != nil {
				return "", fmt.Errorf("deleting the earlier damaged state %s: %w", e.Name(), err)
			}
		case e.Name() != "lost+found" && e.Name() != consumer.ForeignStatesDir:
			moved = append(moved, e)
		}
	}
	aside := filepath.Join(d.dir, damagedPrefix+time.Now().UTC().Format("20060102T150405.000Z"))
	if err := os.Mkdir(aside, 0o755); err != nil {
		return "", fmt.Errorf("creating %s: %w", aside, err)
	}
	for _, e := range moved {
		if err := os.Rename(filepath.Join(d.dir, e.Name()), filepath.Join(aside, e.Name())); err != nil {
			return "", fmt.Errorf("moving %s into %s: %w", e.Name(), aside, err)
		}
	}
	return aside, nil
}

// damagedBytes is the bytes on disk (diskBytes) of every damaged-*
// directory in dir and everything under them, 0 when dir does not exist.
func damagedBytes(dir string) (int64, error) {
	entries, err := os.ReadDir(dir)
	if os.IsNotExist(err) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("reading the data directory %s: %w", dir, err)
	}
	var n int64
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), damagedPrefix) {
			continue
		}
		err := filepath.WalkDir(filepath.Join(dir, e.Name()), func(path string, de fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			info, err := de.Info()
			if err != nil {
				return err
			}
			n += diskBytes(info)
			return nil
		})
		if err != nil {
			return 0, fmt.Errorf("measuring the damaged state %s: %w", e.Name(), err)
		}
	}
	return n, nil
}
