package store

import (
	"encoding/binary"
	"io"
	"log/slog"
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/kdedup/kdedup/filter"
)

func TestMain(m *testing.M) {
	// The crash test re-executes this binary as the process it kills.
	if dir := os.Getenv(crashChildEnv); dir != "" {
		os.Exit(runCrashChild(dir))
	}
	goleak.VerifyTestMain(m)
}

// smallFlush keeps Badger's memtable at its default size for tests with
// tiny pages, whose keys would otherwise dominate the write batch estimate.
const smallFlush = 64 << 10

// quiet drops every log line; tests that look at logs build their own.
var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func openT(t testing.TB, opts Options) *DB {
	t.Helper()
	return openTuned(t, opts, tuning{gcInterval: gcInterval})
}

func openTuned(t testing.TB, opts Options, tn tuning) *DB {
	t.Helper()
	if opts.Logger == nil {
		opts.Logger = quiet
	}
	db, err := open(opts, tn)
	if err != nil {
		t.Fatalf("Open(%+v): %v", opts, err)
	}
	t.Cleanup(func() {
		if err := db.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return db
}

func partitionT(t testing.TB, db *DB, topic string, partition int32) *PartitionState {
	t.Helper()
	p, err := db.Partition(topic, partition)
	if err != nil {
		t.Fatalf("Partition(%q, %d): %v", topic, partition, err)
	}
	t.Cleanup(p.Close)
	return p
}

// pageBytes returns the deterministic content of page id written with
// stamp: every 8-byte word holds stamp, sub-filter and page, so a page of a
// different write or a different place never compares equal.
func pageBytes(size int, id filter.PageID, stamp uint64) []byte {
	b := make([]byte, size)
	var w [8]byte
	binary.BigEndian.PutUint64(w[:], stamp<<32^uint64(id.SubFilter)<<20^uint64(id.Page))
	for i := 0; i < size; i += 8 {
		copy(b[i:], w[:])
	}
	return b
}

// write stores content as page id through the Pager protocol: Page, modify
// in place, MarkDirty.
func write(t testing.TB, p *PartitionState, id filter.PageID, content []byte) {
	t.Helper()
	page, err := p.Page(id)
	if err != nil {
		t.Fatalf("Page(%v): %v", id, err)
	}
	copy(page, content)
	p.MarkDirty(id, page)
}

func mustPage(t testing.TB, p *PartitionState, id filter.PageID) []byte {
	t.Helper()
	page, err := p.Page(id)
	if err != nil {
		t.Fatalf("Page(%v): %v", id, err)
	}
	return page
}
