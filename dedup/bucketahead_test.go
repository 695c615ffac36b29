package dedup

import (
	"math/rand/v2"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"
)

// TestBucketAheadWindow drives the bucket prefetch window (bucketAhead)
// over polls decided as the worker decides them, some records skipped,
// some decisions of records outside the poll, and checks it against the
// rule: each record of the poll is prefetched at most once, never the one
// being decided, never more than bucketsAhead past it, every record after
// the first one decided is prefetched before it is decided, and the poll
// is released once its last buckets are asked for or a record past it
// comes.
func TestBucketAheadWindow(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 9))
	for round := range 500 {
		n := 1 + rng.IntN(40)
		off := int64(rng.IntN(1000))
		var recs []*kgo.Record
		for range n {
			off += int64(1 + rng.IntN(2)) // offsets rise, with gaps (compaction, transaction markers)
			recs = append(recs, &kgo.Record{Offset: off})
		}
		b := bucketAhead{recs: recs}
		prefetched := map[int]int{} // index -> times
		decided := -1
		for i, r := range recs {
			if rng.IntN(5) == 0 {
				continue // skipped by the caller (decided before a restart)
			}
			if rng.IntN(10) == 0 { // a record below the poll's next one
				from, to := b.advance(r.Offset - 1)
				for k := from; k < to; k++ {
					prefetched[k]++
				}
			}
			if decided >= 0 && i > decided+1 && b.recs != nil && prefetched[i] == 0 && i <= decided+bucketsAhead {
				t.Fatalf("round %d: record %d decided without its buckets prefetched (last decided %d; n %d, at %d, next %d, offsets %v)", round, i, decided, n, b.at, b.next, offsetsOf(recs))
			}
			from, to := b.advance(r.Offset)
			if from < to && (from <= i || to > i+1+bucketsAhead || to > n) {
				t.Fatalf("round %d: deciding %d prefetched [%d, %d): want within (%d, %d]", round, i, from, to, i, min(n, i+1+bucketsAhead))
			}
			for k := from; k < to; k++ {
				if prefetched[k]++; prefetched[k] > 1 {
					t.Fatalf("round %d: record %d prefetched twice", round, k)
				}
			}
			decided = i
			if b.recs != nil && b.next >= n {
				t.Fatalf("round %d: the poll is held after its last buckets were asked for", round)
			}
		}
		if b.recs != nil {
			from, to := b.advance(recs[n-1].Offset + 1) // a record past the poll
			if from != to || b.recs != nil {
				t.Fatalf("round %d: a record past the poll prefetched [%d, %d) and held the poll %v", round, from, to, b.recs != nil)
			}
		}
	}
}

func offsetsOf(recs []*kgo.Record) []int64 {
	var o []int64
	for _, r := range recs {
		o = append(o, r.Offset)
	}
	return o
}
