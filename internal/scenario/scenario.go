// Package scenario builds realistic input streams for kdedup (producer
// retries, upstream replays, hot keys, tombstones, keys that reappear after
// deletion, unkeyable records), computes the exact output a deduplicator
// must produce for them, and compares it with what a worker produced. The
// demo command and the end-to-end tests share it.
package scenario

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Options shape a generated stream. Zero fields take the defaults noted.
type Options struct {
	Keys          int     // distinct keys of first events (default 10,000)
	Seed          uint64  // PRNG seed (default 1)
	RetryRate     float64 // share of events immediately repeated by a producer retry (default 0.1)
	HotKeys       int     // keys repeated throughout the stream (default 20)
	HotRate       float64 // share of records that hit a hot key (default 0.1)
	TombstoneRate float64 // share of keys deleted later (default 0.03)
	ReappearRate  float64 // share of deleted keys that come back after the tombstone (default 0.5)
	Replays       int     // upstream replays of an earlier stretch of the stream (default 2)
	UnkeyedRate   float64 // share of records without a key (default 0.005)
}

func (o Options) withDefaults() Options {
	def := func(v *float64, d float64) {
		if *v == 0 {
			*v = d
		}
	}
	if o.Keys == 0 {
		o.Keys = 10_000
	}
	if o.Seed == 0 {
		o.Seed = 1
	}
	if o.HotKeys == 0 {
		o.HotKeys = 20
	}
	if o.Replays == 0 {
		o.Replays = 2
	}
	def(&o.RetryRate, 0.1)
	def(&o.HotRate, 0.1)
	def(&o.TombstoneRate, 0.03)
	def(&o.ReappearRate, 0.5)
	def(&o.UnkeyedRate, 0.005)
	return o
}

// Base is the timestamp of the first generated record.
var Base = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// Generate returns a stream of records (no topic set) with keys, JSON
// values, a header and increasing timestamps. It is a pure function of o.
func Generate(o Options) []*kgo.Record {
	o = o.withDefaults()
	rng := rand.New(rand.NewPCG(o.Seed, o.Seed^0x5eed))
	var out []*kgo.Record
	seq := 0
	emit := func(key []byte, value []byte) *kgo.Record {
		r := &kgo.Record{
			Key:       key,
			Value:     value,
			Headers:   []kgo.RecordHeader{{Key: "source", Value: []byte("scenario")}},
			Timestamp: Base.Add(time.Duration(len(out)) * time.Millisecond),
		}
		out = append(out, r)
		return r
	}
	event := func(key string, kind string) []byte {
		seq++
		return fmt.Appendf(nil, `{"id":%q,"kind":%q,"seq":%d}`, key, kind, seq)
	}
	deleted := map[int]bool{}
	var gone []int // deleted keys not yet recreated, oldest first
	for i := range o.Keys {
		k := fmt.Sprintf("order-%06d", i)
		r := emit([]byte(k), event(k, "created"))
		if rng.Float64() < o.RetryRate { // retry of the same produce: identical record
			emit(r.Key, r.Value)
		}
		if rng.Float64() < o.HotRate {
			h := fmt.Sprintf("hot-%02d", rng.IntN(o.HotKeys))
			emit([]byte(h), event(h, "ping"))
		}
		if rng.Float64() < o.UnkeyedRate {
			emit(nil, event("", "anonymous"))
		}
		if i > 100 && rng.Float64() < o.TombstoneRate {
			j := rng.IntN(i)
			if !deleted[j] {
				deleted[j] = true
				gone = append(gone, j)
				emit(fmt.Appendf(nil, "order-%06d", j), nil)
			}
		}
		if len(gone) > 0 && rng.Float64() < o.TombstoneRate*o.ReappearRate {
			k := fmt.Sprintf("order-%06d", gone[0])
			gone = gone[1:]
			emit([]byte(k), event(k, "recreated"))
		}
		for n := range o.Replays { // replay a stretch seen earlier
			if i == o.Keys*(n+1)/(o.Replays+1) {
				from := rng.IntN(len(out) / 2)
				for _, old := range slices.Clone(out[from : from+min(2000, len(out)/4)]) {
					emit(old.Key, old.Value)
				}
			}
		}
	}
	return out
}

// Stats counts decisions of the exact model.
type Stats struct {
	Consumed, Forwarded, Duplicates, OverLimit, Deletes, Unkeyed int
}

// Model is an expected or observed output: for each key, the signatures of
// its output records in order; for records without a key, their signatures
// sorted (they are spread over output partitions, so have no order).
type Model struct {
	PerKey  map[string][]string
	Unkeyed []string
	Stats   Stats
}

// Signature identifies an output record by value, timestamp and headers.
func Signature(r *kgo.Record) string {
	var b strings.Builder
	if r.Value == nil {
		b.WriteString("<tombstone>")
	} else {
		b.Write(r.Value)
	}
	fmt.Fprintf(&b, "|%d", r.Timestamp.UnixMilli())
	for _, h := range r.Headers {
		fmt.Fprintf(&b, "|%s=%s", h.Key, h.Value)
	}
	return b.String()
}

// ExpectOptions are the worker settings the exact model follows. The zero
// value is the worker's defaults.
type ExpectOptions struct {
	// DropTombstones drops tombstones instead of forwarding them
	// (KDEDUP_FORWARD_TOMBSTONES=false).
	DropTombstones bool
	// MaxOccurrences is how many records of a key are forwarded until its
	// next tombstone (KDEDUP_MAX_OCCURRENCES; 0 means 1).
	MaxOccurrences int
	// Window, Generations and Refresh are the dedup window
	// (KDEDUP_WINDOW, KDEDUP_WINDOW_GENERATIONS, KDEDUP_WINDOW_REFRESH; a
	// zero Window remembers keys until their tombstone).
	Window      time.Duration
	Generations int
	Refresh     bool
}

// Expect runs the exact deduplication model over produced records (Partition
// and Offset set, as Produce leaves them): per topic-partition in offset
// order, a keyed record is forwarded when its key is not in the set and then
// added; a tombstone removes its key and is forwarded when forwardTombstones;
// a record without a key is forwarded.
func Expect(recs []*kgo.Record, forwardTombstones bool) Model {
	out, _ := ExpectWith(recs, ExpectOptions{DropTombstones: !forwardTombstones})
	return out
}

// Reasons a dropped record carries in its kdedup-reason header.
const (
	ReasonDuplicate = "duplicate"
	ReasonLimit     = "occurrence-limit"
)

// ExpectWith runs the exact model with o over produced records (Topic,
// Partition and Offset set, as Produce leaves them): per topic-partition in
// offset order, a keyed record is forwarded while its key was forwarded
// fewer than o.MaxOccurrences times since its last tombstone, and dropped
// otherwise; a tombstone resets its key's count and is forwarded unless
// o.DropTombstones; a record without a key is forwarded.
//
// With o.Window, time is the records' timestamps: generation k holds
// timestamps [k*span, (k+1)*span), span = Window/Generations in whole
// milliseconds; at watermark T (the highest timestamp of the partition so
// far, every record counted) generations from floor(T/span)-Generations on
// are live. Each forwarded record leaves one copy of its key in the
// generation of its timestamp (the oldest live one for older records); the
// count of a key is its copies in live generations; with o.Refresh a
// dropped record moves its key's oldest copy to its own generation when
// that is newer.
//
// out is what the output topic must hold. dropped is what the duplicates
// topic (KDEDUP_DUPLICATES_TOPIC) must hold: each dropped record unchanged
// but for two headers appended, kdedup-reason (ReasonDuplicate with a limit
// of 1, ReasonLimit above) and kdedup-source (topic/partition/offset of the
// input record); its Stats.Forwarded counts those records, as Observe
// counts the records it reads, and its other Stats are zero.
func ExpectWith(recs []*kgo.Record, o ExpectOptions) (out, dropped Model) {
	limit := max(1, o.MaxOccurrences)
	reason := ReasonDuplicate
	if limit > 1 {
		reason = ReasonLimit
	}
	out = Model{PerKey: map[string][]string{}}
	dropped = Model{PerKey: map[string][]string{}}
	span := int64(0)
	if o.Window > 0 {
		span = o.Window.Milliseconds() / int64(o.Generations)
	}
	for _, rs := range byPartition(recs) {
		w := windowModel{span: span, g: int64(o.Generations), watermark: math.MinInt64, copies: map[string][]int64{}}
		for _, r := range rs {
			out.Stats.Consumed++
			k := string(r.Key)
			ts := r.Timestamp.UnixMilli()
			w.advance(ts)
			switch {
			case len(r.Key) == 0:
				out.Stats.Unkeyed++
				out.Stats.Forwarded++
				out.Unkeyed = append(out.Unkeyed, Signature(r))
			case r.Value == nil:
				out.Stats.Deletes++
				delete(w.copies, k)
				if !o.DropTombstones {
					out.Stats.Forwarded++
					out.PerKey[k] = append(out.PerKey[k], Signature(r))
				}
			case w.count(k) >= limit:
				if o.Refresh {
					w.refresh(k, ts)
				}
				if limit > 1 {
					out.Stats.OverLimit++
				} else {
					out.Stats.Duplicates++
				}
				dropped.Stats.Forwarded++
				dropped.PerKey[k] = append(dropped.PerKey[k], Signature(droppedRecord(r, reason)))
			default:
				w.add(k, ts)
				out.Stats.Forwarded++
				out.PerKey[k] = append(out.PerKey[k], Signature(r))
			}
		}
	}
	sort.Strings(out.Unkeyed)
	return out, dropped
}

// windowModel is the generations of each key's copies in one partition;
// without a window every copy is in generation 0 and never expires.
type windowModel struct {
	span, g   int64
	watermark int64
	copies    map[string][]int64
}

func (w *windowModel) advance(ts int64) { w.watermark = max(w.watermark, ts) }

func (w *windowModel) oldest() int64 {
	if w.span == 0 {
		return 0
	}
	return floorDiv(w.watermark, w.span) - w.g
}

func (w *windowModel) generation(ts int64) int64 {
	if w.span == 0 {
		return 0
	}
	return max(floorDiv(ts, w.span), w.oldest())
}

// count is the copies of k in live generations (expired ones are forgotten).
func (w *windowModel) count(k string) int {
	live := slices.DeleteFunc(w.copies[k], func(g int64) bool { return g < w.oldest() })
	if len(live) == 0 {
		delete(w.copies, k)
		return 0
	}
	w.copies[k] = live
	return len(live)
}

func (w *windowModel) add(k string, ts int64) { w.copies[k] = append(w.copies[k], w.generation(ts)) }

func (w *windowModel) refresh(k string, ts int64) {
	gens := w.copies[k]
	if i := slices.Index(gens, slices.Min(gens)); gens[i] < w.generation(ts) {
		gens[i] = w.generation(ts)
	}
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}

// droppedRecord is r as the duplicates topic holds it.
func droppedRecord(r *kgo.Record, reason string) *kgo.Record {
	d := *r
	d.Headers = append(slices.Clip(r.Headers),
		kgo.RecordHeader{Key: "kdedup-reason", Value: []byte(reason)},
		kgo.RecordHeader{Key: "kdedup-source", Value: fmt.Appendf(nil, "%s/%d/%d", r.Topic, r.Partition, r.Offset)})
	return &d
}

// byPartition groups records by topic-partition, each group in offset order.
func byPartition(recs []*kgo.Record) map[string][]*kgo.Record {
	byTP := map[string][]*kgo.Record{}
	for _, r := range recs {
		tp := fmt.Sprintf("%s/%d", r.Topic, r.Partition)
		byTP[tp] = append(byTP[tp], r)
	}
	for _, rs := range byTP {
		sort.Slice(rs, func(i, j int) bool { return rs[i].Offset < rs[j].Offset })
	}
	return byTP
}

// Observe builds the model of records read from an output topic.
func Observe(recs []*kgo.Record) Model {
	m := Model{PerKey: map[string][]string{}}
	for _, rs := range byPartition(recs) {
		for _, r := range rs {
			m.Stats.Forwarded++
			if len(r.Key) == 0 {
				m.Unkeyed = append(m.Unkeyed, Signature(r))
				continue
			}
			m.PerKey[string(r.Key)] = append(m.PerKey[string(r.Key)], Signature(r))
		}
	}
	sort.Strings(m.Unkeyed)
	return m
}

// Diff lists the differences between want and got (at most limit lines):
// keys whose output sequence differs, and unkeyed records missing or extra.
// Empty means got is exactly want.
func Diff(want, got Model, limit int) []string {
	var d []string
	add := func(format string, args ...any) {
		if len(d) < limit {
			d = append(d, fmt.Sprintf(format, args...))
		}
	}
	for _, k := range sortedKeys(want.PerKey, got.PerKey) {
		if w, g := want.PerKey[k], got.PerKey[k]; !slices.Equal(w, g) {
			add("key %q: want %d records %v, got %d records %v", k, len(w), w, len(g), g)
		}
	}
	if !slices.Equal(want.Unkeyed, got.Unkeyed) {
		add("unkeyed records: want %d, got %d", len(want.Unkeyed), len(got.Unkeyed))
	}
	return d
}

// Missing lists what want has that got lacks, counting each signature as a
// multiset per key (at-least-once output may hold extra copies, never fewer),
// and returns how many extra records got has.
func Missing(want, got Model, limit int) (missing []string, extra int) {
	for _, k := range sortedKeys(want.PerKey, got.PerKey) {
		have := map[string]int{}
		for _, s := range got.PerKey[k] {
			have[s]++
		}
		for _, s := range want.PerKey[k] {
			if have[s] > 0 {
				have[s]--
			} else if len(missing) < limit {
				missing = append(missing, fmt.Sprintf("key %q: %s", k, s))
			}
		}
		for _, n := range have {
			extra += n
		}
	}
	have := map[string]int{}
	for _, s := range got.Unkeyed {
		have[s]++
	}
	for _, s := range want.Unkeyed {
		if have[s] > 0 {
			have[s]--
		} else if len(missing) < limit {
			missing = append(missing, "unkeyed: "+s)
		}
	}
	for _, n := range have {
		extra += n
	}
	return missing, extra
}

func sortedKeys(a, b map[string][]string) []string {
	ks := make([]string, 0, len(a)+len(b))
	for k := range a {
		ks = append(ks, k)
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			ks = append(ks, k)
		}
	}
	sort.Strings(ks)
	return ks
}

// Produce writes recs to topic in order, synchronously in batches, and
// leaves each record's Topic, Partition and Offset set. The client's
// default partitioner places keyed records by key.
func Produce(ctx context.Context, cl *kgo.Client, topic string, recs []*kgo.Record) error {
	const batch = 5000
	for i := 0; i < len(recs); i += batch {
		rs := recs[i:min(i+batch, len(recs))]
		for _, r := range rs {
			r.Topic = topic
		}
		if err := cl.ProduceSync(ctx, rs...).FirstErr(); err != nil {
			return fmt.Errorf("producing to %s: %w", topic, err)
		}
	}
	return nil
}

// WaitCaughtUp waits until group has committed, for every partition of
// topic, the end offset the partition had when WaitCaughtUp was called (a
// partition that has never held a record needs no commit).
func WaitCaughtUp(ctx context.Context, adm *kadm.Client, group, topic string) error {
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err != nil {
		return fmt.Errorf("listing end offsets of %s: %w", topic, err)
	}
	var behind []string // partitions not caught up at the last look
	for {
		committed, err := adm.FetchOffsets(ctx, group)
		if err == nil {
			behind = behind[:0]
			ends.Each(func(e kadm.ListedOffset) {
				c, ok := committed.Lookup(e.Topic, e.Partition)
				if e.Offset == 0 {
					return
				}
				if !ok {
					behind = append(behind, fmt.Sprintf("%d: nothing committed of %d", e.Partition, e.Offset))
				} else if c.At < e.Offset {
					behind = append(behind, fmt.Sprintf("%d: %d of %d", e.Partition, c.At, e.Offset))
				}
			})
			if len(behind) == 0 {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for group %s to commit the end of %s (behind: %s): %w", group, topic, strings.Join(behind, ", "), ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// EndMarkerKey is the key of the marker records ReadAll appends to each
// partition of the topic it reads; readers of a topic ReadAll has read must
// skip them.
const EndMarkerKey = "__kdedup_scenario_end__"

// ReadAll reads every record of topic with read_committed isolation, up to
// what was there when it was called. It appends a marker record to each
// partition and reads until it has seen all of them: under transactions the
// last offset of a partition is a commit marker that no consumer sees, so
// end offsets alone cannot tell when the reading is done. Marker records
// (earlier calls' too) are left out of the result. conn are connection
// options (TLS, SASL) for its clients.
func ReadAll(ctx context.Context, brokers []string, topic string, conn ...kgo.Opt) ([]*kgo.Record, error) {
	prod, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner())}, conn...)...)
	if err != nil {
		return nil, err
	}
	ends, err := kadm.NewClient(prod).ListEndOffsets(ctx, topic)
	if err != nil {
		prod.Close()
		return nil, fmt.Errorf("listing partitions of %s: %w", topic, err)
	}
	marker := fmt.Appendf(nil, "%d", time.Now().UnixNano())
	var markers []*kgo.Record
	ends.Each(func(e kadm.ListedOffset) {
		markers = append(markers, &kgo.Record{Topic: topic, Partition: e.Partition, Key: []byte(EndMarkerKey), Value: marker})
	})
	err = prod.ProduceSync(ctx, markers...).FirstErr()
	prod.Close()
	if err != nil {
		return nil, fmt.Errorf("appending end markers to %s: %w", topic, err)
	}

	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchIsolationLevel(kgo.ReadCommitted())}, conn...)...)
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	var out []*kgo.Record
	for open := len(markers); open > 0; {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("reading %s: %w", topic, err)
		}
		fs.EachRecord(func(r *kgo.Record) {
			if string(r.Key) != EndMarkerKey {
				out = append(out, r)
			} else if string(r.Value) == string(marker) {
				open--
			}
		})
	}
	return out, nil
}

// WaitDecided waits until group has decided every record of topic, read
// read_committed: for each partition, nothing is left to read from the
// group's committed offset on. Unlike WaitCaughtUp it suits a topic
// written in transactions (the repartition topic exactly once), whose end
// offset is past a commit marker that no consumer reads or commits. conn
// are connection options (TLS, SASL) for its clients.
func WaitDecided(ctx context.Context, brokers []string, group, topic string, conn ...kgo.Opt) error {
	adm, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(brokers...)}, conn...)...)
	if err != nil {
		return err
	}
	defer adm.Close()
	for {
		committed, err := kadm.NewClient(adm).FetchOffsets(ctx, group)
		if err != nil {
			return fmt.Errorf("fetching the offsets of group %s: %w", group, err)
		}
		ends, err := kadm.NewClient(adm).ListEndOffsets(ctx, topic)
		if err != nil {
			return fmt.Errorf("listing the end offsets of %s: %w", topic, err)
		}
		from := map[int32]kgo.Offset{}
		ends.Each(func(e kadm.ListedOffset) {
			at := int64(0)
			if c, ok := committed.Lookup(e.Topic, e.Partition); ok && c.At >= 0 {
				at = c.At
			}
			if at < e.Offset {
				from[e.Partition] = kgo.NewOffset().At(at)
			}
		})
		if len(from) == 0 {
			return nil
		}
		left, err := anyRecordFrom(ctx, brokers, topic, from, conn)
		if err != nil {
			return err
		}
		if !left {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for group %s to decide every record of %s: %w", group, topic, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// anyRecordFrom reports whether topic holds a committed record at or
// after the given offsets of its partitions.
func anyRecordFrom(ctx context.Context, brokers []string, topic string, from map[int32]kgo.Offset, conn []kgo.Opt) (bool, error) {
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(brokers...),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: from}), kgo.FetchIsolationLevel(kgo.ReadCommitted())}, conn...)...)
	if err != nil {
		return false, err
	}
	defer cl.Close()
	pctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	return cl.PollFetches(pctx).NumRecords() > 0, nil
}
