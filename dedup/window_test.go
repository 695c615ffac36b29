package dedup

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kdedup/kdedup/filter"
	"github.com/kdedup/kdedup/store"
)

// windowDecisionModel is the exact model of deduplication over a window:
// per key, the generations of its fingerprint copies. Generation k holds
// timestamps [k*span, (k+1)*span); G+1 generations are live at watermark
// T, from floor(T/span)-G; a record older than that goes to the oldest live
// one. A key with as many live copies as the limit is dropped (Duplicate at
// limit 1, OverLimit above), and with refresh its oldest copy moves to the
// record's generation.
type windowDecisionModel struct {
	span, g   int64
	limit     int
	refresh   bool
	watermark int64
	copies    map[string][]int64
	counts    map[Decision]int
	expired   int
	live      map[int64]bool // generations holding copies, for counting expiries
}

func (m *windowDecisionModel) clone() *windowDecisionModel {
	c := *m
	c.copies = maps.Clone(m.copies)
	for k, v := range c.copies {
		c.copies[k] = slices.Clone(v)
	}
	c.counts, c.live = maps.Clone(m.counts), maps.Clone(m.live)
	return &c
}

func (m *windowDecisionModel) oldest() int64 { return floorDiv(m.watermark, m.span) - m.g }

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}

// prune forgets the expired copies of key.
func (m *windowDecisionModel) prune(key string) {
	gens := slices.DeleteFunc(m.copies[key], func(g int64) bool { return g < m.oldest() })
	if len(gens) == 0 {
		delete(m.copies, key)
	} else {
		m.copies[key] = gens
	}
}

func (m *windowDecisionModel) decide(kind recordKind, key string, ts int64) Decision {
	if ts > m.watermark {
		m.watermark = ts
		for g := range m.live {
			if g < m.oldest() {
				delete(m.live, g)
				m.expired++
			}
		}
	}
	m.prune(key)
	gen := max(floorDiv(ts, m.span), m.oldest())
	d := Forward
	switch {
	case kind == unkeyed:
		d = Unkeyed
	case kind == tombstone || kind == marker:
		delete(m.copies, key)
		d = Delete
	case len(m.copies[key]) >= m.limit:
		d = Duplicate
		if m.limit > 1 {
			d = OverLimit
		}
		if gens := m.copies[key]; m.refresh && slices.Min(gens) < gen {
			gens[slices.Index(gens, slices.Min(gens))] = gen
			m.live[gen] = true
		}
	default:
		m.copies[key] = append(m.copies[key], gen)
		m.live[gen] = true
	}
	m.counts[d]++
	return d
}

// streamKind draws the kind of a record of a random stream: 1% unkeyed, 2%
// tombstones, the rest puts.
func streamKind(rng *rand.Rand) recordKind {
	switch x := rng.IntN(100); {
	case x < 1:
		return unkeyed
	case x < 3:
		return tombstone
	}
	return put
}

// TestWindowDecisionsAgainstExactModel decides a random stream with record
// timestamps (mostly increasing, 10% out of order, 2% older than the
// window) through a windowed Deduplicator, with and without refresh, at
// occurrence limits 1 and 3, staged with a third of transactions aborted
// and not, and compares every decision with the exact model. 32-bit
// fingerprints keep false positives out (about 2e-9 per sub-filter per
// lookup; the seeds are fixed). It also checks that generations expired
// (the expiry counter equals the model's) and that the run covered
// forwards and drops of previously seen keys.
func TestWindowDecisionsAgainstExactModel(t *testing.T) {
	const window = 4 * time.Second
	for _, limit := range []int{1, 3} {
		for _, refresh := range []bool{false, true} {
			for _, staged := range []bool{false, true} {
				t.Run(fmt.Sprintf("max=%d/refresh=%t/staged=%t", limit, refresh, staged), func(t *testing.T) {
					const (
						records   = 40_000
						keySpace  = 3_000
						batchSize = 500
						topic     = "orders"
					)
					fp := filter.Params{FingerprintBits: 29, Capacity: 512, PageBytes: 512, Window: window, Generations: 4}
					opts := Options{DeleteHeader: deleteHeader, DeleteValue: deleteValue, Filter: fp,
						MaxOccurrences: limit, Refresh: refresh, Staged: staged}
					db := openDB(t, "", store.Options{PageBytes: 512, CacheBytes: 64 * 512})
					reg := prometheus.NewRegistry()
					p := openPartition(t, db, topic, 0, opts, NewMetrics(reg))
					defer p.Close()

					span := window.Milliseconds() / 4
					m := &windowDecisionModel{span: span, g: 4, limit: limit, refresh: refresh, watermark: -1 << 63,
						copies: map[string][]int64{}, counts: map[Decision]int{}, live: map[int64]bool{}}
					rng := rand.New(rand.NewPCG(uint64(limit), 11))
					ts := int64(1_750_000_000_000)
					committed, aborts := m.clone(), 0
					for start := 0; start < records; {
						end := min(start+batchSize, records)
						// A batch replayed after an abort sees the same records.
						brng := rand.New(rand.NewPCG(uint64(start), 3))
						bts := ts
						for off := start; off < end; off++ {
							bts += brng.Int64N(2) // 0.5 ms per record: 20 s in all, five windows
							rts := bts
							switch x := brng.IntN(100); {
							case x < 10:
								rts -= brng.Int64N(2 * span)
							case x < 12:
								rts -= window.Milliseconds() + brng.Int64N(span)
							}
							kind := streamKind(brng)
							k := fmt.Sprintf("user-%d", brng.IntN(keySpace))
							r := keyModes["key"].render(kind, k)
							r.Topic, r.Offset, r.Timestamp = topic, int64(off), time.UnixMilli(rts)
							want := m.decide(kind, k, rts)
							got, err := p.Decide(r)
							if err != nil {
								t.Fatalf("offset %d: Decide: %v", off, err)
							}
							if got != want {
								t.Fatalf("offset %d (key %q, ts %d, watermark %d): Decide = %v, model %v (copies %v)",
									off, k, rts, m.watermark, got, want, m.copies[k])
							}
						}
						if staged && rng.IntN(3) == 0 {
							aborts++
							if err := p.DiscardStaged(); err != nil {
								t.Fatal(err)
							}
							m = committed.clone()
							continue
						}
						if err := p.CommitStaged(); err != nil {
							t.Fatal(err)
						}
						if err := p.Commit(store.Checkpoint{Offset: int64(end)}); err != nil {
							t.Fatal(err)
						}
						ts, start, committed = bts, end, m.clone()
					}
					if staged && aborts == 0 {
						t.Fatal("no transaction aborted")
					}
					drop := Duplicate
					if limit > 1 {
						drop = OverLimit
					}
					if m.counts[Forward] == 0 || m.counts[drop] == 0 || m.expired == 0 {
						t.Fatalf("the run did not cover forwards, drops and expiries: %v, %d expired", m.counts, m.expired)
					}
					if got := counterValue(t, reg, "kdedup_filter_generations_expired_total", topic, "0"); got != float64(m.expired) {
						t.Errorf("kdedup_filter_generations_expired_total = %v, model %d", got, m.expired)
					}
					copies := 0
					for k := range m.copies {
						m.prune(k)
						copies += len(m.copies[k])
					}
					if st := p.Stats(); st.Items != uint64(copies) || st.Generations != len(m.live) {
						t.Errorf("filter holds %d fingerprints in %d generations, model %d copies in %d", st.Items, st.Generations, copies, len(m.live))
					}
					t.Logf("%v, %d generations expired, %d aborted transactions", m.counts, m.expired, aborts)
				})
			}
		}
	}
}
