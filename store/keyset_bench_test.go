package store_test

import (
	"encoding/binary"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/dgraph-io/badger/v4"

	"github.com/kdedup/kdedup/internal/benchenv"
)

// keySet is the exact key set the filter is meant to beat: one Badger key
// per dedup key, deduplicated by a Get and, for a key not held, a Set, in
// one read-write transaction that also carries each partition's checkpoint
// offset and is committed every flush interval of work (one write batch a
// second by default), as the worker cuts kdedup's write batches. A
// transaction reads its own writes, so a key repeated within a batch is
// found as well. Badger runs with its default options (Snappy
// compression, one version kept) and a 256 MiB block cache.
//
// Keys are 'k', the partition (4 bytes, big endian) and the 16-byte dedup
// key, with an empty value; checkpoints are 'c' and the partition, with the
// next offset (8 bytes) as value.
type keySet struct {
	db        *badger.DB
	txn       *badger.Txn
	next      []int64 // next offset of each partition
	flushed   []int64 // checkpoint offset of each partition's last write batch
	interval  time.Duration
	lastFlush time.Time
	batches   int
	dups      int // keys found held; the benchmark keys are distinct, so 0
	// count and size are the transaction's entries and bytes as Badger's
	// Txn.checkSize counts them, so that a batch is cut before Badger
	// refuses it with ErrTxnTooBig.
	count, size int64
	key         [21]byte
}

const (
	keySetBlockCacheBytes = 256 << 20
	// keySetEntryBytes and keySetCheckpointBytes are what Txn.checkSize
	// adds for a key entry and a checkpoint entry: key, value, two meta
	// bytes and ten for the version.
	keySetEntryBytes      = 21 + 0 + 2 + 10
	keySetCheckpointBytes = 5 + 8 + 2 + 10
	// A new Badger transaction counts one entry of len("!badger!txn") + 10
	// bytes, the end-of-transaction marker.
	keySetTxnCount, keySetTxnBytes = 1, 11 + 10
)

func newKeySet(dir string, partitions int, interval time.Duration) (*keySet, error) {
	db, err := badger.Open(badger.DefaultOptions(dir).WithBlockCacheSize(keySetBlockCacheBytes).WithLogger(nil))
	if err != nil {
		return nil, fmt.Errorf("opening badger at %s: %w", dir, err)
	}
	return &keySet{
		db:        db,
		txn:       db.NewTransaction(true),
		next:      make([]int64, partitions),
		flushed:   make([]int64, partitions),
		interval:  interval,
		lastFlush: time.Now(),
		count:     keySetTxnCount,
		size:      keySetTxnBytes,
	}, nil
}

func (s *keySet) feed(from, to uint64) error {
	n := uint64(len(s.next))
	extra := int64(len(s.next))
	for i := from; i < to; i++ {
		p := i % n
		s.key[0] = 'k'
		binary.BigEndian.PutUint32(s.key[1:], uint32(p))
		benchenv.Key(s.key[5:], i)
		_, err := s.txn.Get(s.key[:])
		switch {
		case err == nil:
			s.dups++
		case errors.Is(err, badger.ErrKeyNotFound):
			if s.count+1+extra >= s.db.MaxBatchCount() ||
				s.size+keySetEntryBytes+extra*keySetCheckpointBytes >= s.db.MaxBatchSize() {
				if err := s.commitAll(); err != nil {
					return err
				}
			}
			// The transaction keeps the key slice until it commits.
			if err := s.txn.Set(append([]byte(nil), s.key[:]...), nil); err != nil {
				return fmt.Errorf("setting key %d: %w", i, err)
			}
			s.count++
			s.size += keySetEntryBytes
		default:
			return fmt.Errorf("getting key %d: %w", i, err)
		}
		s.next[p]++
		if i%1024 == 0 && time.Since(s.lastFlush) >= s.interval {
			if err := s.commitAll(); err != nil {
				return err
			}
		}
	}
	return nil
}

// commitAll commits the transaction with the checkpoint of every partition
// fed since the last one, if any, and starts the next.
func (s *keySet) commitAll() error {
	s.lastFlush = time.Now()
	changed := false
	for p := range s.next {
		if s.next[p] == s.flushed[p] {
			continue
		}
		k := binary.BigEndian.AppendUint32([]byte{'c'}, uint32(p))
		if err := s.txn.Set(k, binary.BigEndian.AppendUint64(nil, uint64(s.next[p]))); err != nil {
			return fmt.Errorf("setting the checkpoint of partition %d: %w", p, err)
		}
		changed = true
	}
	if !changed {
		return nil
	}
	if err := s.txn.Commit(); err != nil {
		return fmt.Errorf("committing a write batch: %w", err)
	}
	copy(s.flushed, s.next)
	s.batches++
	s.txn = s.db.NewTransaction(true)
	s.count, s.size = keySetTxnCount, keySetTxnBytes
	return nil
}

func (s *keySet) batchCount() int { return s.batches }

func (s *keySet) close() error {
	s.txn.Discard()
	if err := s.db.Close(); err != nil {
		return fmt.Errorf("closing badger: %w", err)
	}
	return nil
}

// TestKeySetExact checks the anchor against a map: a key fed again is
// found held whether or not its first write was committed, a new key is
// not, and every partition's checkpoint is its next offset.
func TestKeySetExact(t *testing.T) {
	const partitions = 3
	s, err := newKeySet(t.TempDir(), partitions, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := s.close(); err != nil {
			t.Error(err)
		}
	}()
	seen := map[uint64]bool{}
	wantDups := 0
	for _, r := range []struct{ from, to uint64 }{{0, 500}, {250, 750}, {0, 100}, {1000, 1100}} {
		for i := r.from; i < r.to; i++ {
			if seen[i] {
				wantDups++
			}
			seen[i] = true
		}
		if err := s.feed(r.from, r.to); err != nil {
			t.Fatal(err)
		}
		if s.dups != wantDups {
			t.Fatalf("after [%d, %d): %d keys found held, want %d", r.from, r.to, s.dups, wantDups)
		}
		if r.from == 250 { // one range found in a committed batch, the next in the open one
			if err := s.commitAll(); err != nil {
				t.Fatal(err)
			}
		}
	}
	// More keys than one Badger transaction takes: the batch is cut before
	// Badger refuses it, although the flush interval has not passed.
	batches := s.batches
	big := uint64(s.db.MaxBatchCount()) + 1000
	for i := uint64(2000); i < 2000+big; i++ {
		seen[i] = true
	}
	if err := s.feed(2000, 2000+big); err != nil {
		t.Fatal(err)
	}
	if s.batches == batches {
		t.Fatalf("%d keys fed in one open transaction, over Badger's %d", big, s.db.MaxBatchCount())
	}
	if err := s.commitAll(); err != nil {
		t.Fatal(err)
	}
	var held int
	err = s.db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: []byte{'k'}})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			held++
		}
		for p := range partitions {
			item, err := txn.Get(binary.BigEndian.AppendUint32([]byte{'c'}, uint32(p)))
			if err != nil {
				return fmt.Errorf("checkpoint of partition %d: %w", p, err)
			}
			v, err := item.ValueCopy(nil)
			if err != nil {
				return err
			}
			if got := int64(binary.BigEndian.Uint64(v)); got != s.next[p] {
				return fmt.Errorf("checkpoint of partition %d: %d, want %d", p, got, s.next[p])
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if held != len(seen) {
		t.Fatalf("%d keys held, want %d", held, len(seen))
	}
}

// BenchmarkKeySetRate is BenchmarkDurableRate's anchor: the same records
// (benchKey, over KDEDUP_BENCH_PARTITIONS partitions, default 4) at the
// same rate (KDEDUP_BENCH_RATE, default 50,000 per second) after the same
// preload (KDEDUP_BENCH_KEYS, default 1,000,000), deduplicated by an exact
// key set in Badger (keySet) instead of kdedup, with write batches every
// second. The metrics are atRate's; dups, the keys found already held, is
// 0 unless the key set is wrong.
//
//	KDEDUP_BENCH_KEYS=1000000 go test -run '^$' -bench 'KeySetRate' -benchtime 1000000x -timeout 60m ./store
func BenchmarkKeySetRate(b *testing.B) {
	keys := benchenv.Int(b, "KDEDUP_BENCH_KEYS", 1_000_000)
	partitions := benchenv.Int(b, "KDEDUP_BENCH_PARTITIONS", 4)
	rate := benchenv.Int(b, "KDEDUP_BENCH_RATE", 50_000)
	s, err := newKeySet(b.TempDir(), partitions, time.Second)
	if err != nil {
		b.Fatal(err)
	}
	defer func() {
		if err := s.close(); err != nil {
			b.Error(err)
		}
	}()
	benchenv.ResetPeakRSS()
	start := time.Now()
	if err := s.feed(0, uint64(keys)); err != nil {
		b.Fatal(err)
	}
	if err := s.commitAll(); err != nil {
		b.Fatal(err)
	}
	preload := time.Since(start)
	fed := uint64(keys)
	b.Run(fmt.Sprintf("keys=%d/rate=%d", keys, rate), func(b *testing.B) {
		fed = atRate(b, s, fed, rate, preload)
		b.ReportMetric(float64(s.dups), "dups")
	})
}
