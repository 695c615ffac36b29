package scenario

import (
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"slices"
	"sort"
	"time"

	"github.com/tidwall/gjson"
	"github.com/twmb/franz-go/pkg/kgo"
)

// SpreadKey is the dedup key of the streams GenerateSpread makes, as
// KDEDUP_KEY names it: the event id in the JSON value.
const SpreadKey = "json:event_id"

// SpreadOptions shape a stream whose duplicates are spread over
// partitions. Zero fields take the defaults noted.
type SpreadOptions struct {
	Events     int     // distinct events (default 5,000)
	Seed       uint64  // PRNG seed (default 1)
	Partitions int32   // partitions of the input topic (default 4)
	CopyRate   float64 // chance, for each of the three other producers, that it sends the event again (default 0.4)
	NoIDRate   float64 // share of records without an event id (default 0.01)
}

func (o SpreadOptions) withDefaults() SpreadOptions {
	if o.Events == 0 {
		o.Events = 5000
	}
	if o.Seed == 0 {
		o.Seed = 1
	}
	if o.Partitions == 0 {
		o.Partitions = 4
	}
	if o.CopyRate == 0 {
		o.CopyRate = 0.4
	}
	if o.NoIDRate == 0 {
		o.NoIDRate = 0.01
	}
	return o
}

// GenerateSpread returns a stream of events keyed by a payload field
// (SpreadKey), each sent by up to four producers that partition it apart,
// with its Partition set for a manual partitioner: a Java-like producer
// keying it by user id (murmur2, as Kafka's Java client and franz-go
// partition), one keying it by device id (murmur2 of another key), one
// sending it unkeyed (a partition drawn at random), and a librdkafka-like
// one keying it by user id with CRC32 (librdkafka's consistent_random).
// The copies of one event have the same value, headers and timestamp, and
// the event's first copy comes before the others, which follow within a
// few hundred records. A share of records carries no event id (they
// cannot be keyed). Values are JSON. It is a pure function of o.
func GenerateSpread(o SpreadOptions) []*kgo.Record {
	o = o.withDefaults()
	rng := rand.New(rand.NewPCG(o.Seed, o.Seed^0x5b7ead))
	murmur := kgo.StickyKeyPartitioner(nil).ForTopic("")
	n := int(o.Partitions)
	type pending struct {
		at  int // emitted once the stream reaches this many events
		rec *kgo.Record
	}
	var (
		out   []*kgo.Record
		queue []pending
	)
	emit := func(r *kgo.Record) { out = append(out, r) }
	for i := range o.Events {
		for len(queue) > 0 && queue[0].at <= i {
			emit(queue[0].rec)
			queue = queue[1:]
		}
		ts := Base.Add(time.Duration(i) * time.Millisecond)
		user := fmt.Sprintf("user-%04d", rng.IntN(500))
		value := fmt.Appendf(nil, `{"event_id":"ev-%06d","user":%q,"n":%d}`, i, user, i)
		hdr := []kgo.RecordHeader{{Key: "trace", Value: fmt.Appendf(nil, "t-%d", i)}}
		copyOf := func(key []byte, partition int) *kgo.Record {
			return &kgo.Record{Key: key, Value: value, Headers: hdr, Timestamp: ts, Partition: int32(partition)}
		}
		byUser := copyOf([]byte(user), 0)
		byUser.Partition = int32(murmur.Partition(byUser, n))
		emit(byUser)
		later := func(r *kgo.Record) {
			queue = append(queue, pending{at: i + 1 + rng.IntN(300), rec: r})
		}
		if rng.Float64() < o.CopyRate {
			device := fmt.Appendf(nil, "device-%05d", rng.IntN(5000))
			r := copyOf(device, 0)
			r.Partition = int32(murmur.Partition(r, n))
			later(r)
		}
		if rng.Float64() < o.CopyRate {
			later(copyOf(nil, rng.IntN(n)))
		}
		if rng.Float64() < o.CopyRate {
			later(copyOf([]byte(user), int(crc32.ChecksumIEEE([]byte(user))%uint32(n))))
		}
		if rng.Float64() < o.NoIDRate {
			emit(&kgo.Record{Key: []byte(user), Value: fmt.Appendf(nil, `{"user":%q,"note":"no event id","n":%d}`, user, i),
				Headers: hdr, Timestamp: ts, Partition: int32(rng.IntN(n))})
		}
		sort.SliceStable(queue, func(a, b int) bool { return queue[a].at < queue[b].at })
	}
	for _, p := range queue {
		emit(p.rec)
	}
	return out
}

// SpreadEventID returns the event id of a record of GenerateSpread's
// stream (its dedup key), false for a record without one.
func SpreadEventID(r *kgo.Record) (string, bool) {
	if r.Value == nil {
		return "", false
	}
	v := gjson.GetBytes(r.Value, "event_id")
	if v.Type != gjson.String || v.Str == "" {
		return "", false
	}
	return v.Str, true
}

// WholeSignature identifies a record by key (a null key apart from an
// empty one), value, timestamp and headers: two records with the same
// WholeSignature are the same record as far as a consumer can tell.
func WholeSignature(r *kgo.Record) string {
	key := "null"
	if r.Key != nil {
		key = fmt.Sprintf("%q", r.Key)
	}
	return key + " " + Signature(r)
}

// SpreadCheck compares the output of a deduplication of in by event id
// (SpreadEventID) across partitions with the exact model: each event id
// forwarded once, as one of its copies (key, value, headers and timestamp
// equal to that copy's), and each record without an event id forwarded
// unchanged. With exact, anything else is a problem; without (at least
// once), only a missing event or record, or a record that is no copy,
// is; the repeats are counted in extra. It lists at most limit problems.
func SpreadCheck(in, out []*kgo.Record, exact bool, limit int) (problems []string, extra int) {
	return spreadCheck(in, out, exact, false, limit)
}

// SpreadCheckWithin is SpreadCheck for a deduplication by event id within
// each partition of in: each event is forwarded once per input partition
// holding a copy of it.
func SpreadCheckWithin(in, out []*kgo.Record, exact bool, limit int) (problems []string, extra int) {
	return spreadCheck(in, out, exact, true, limit)
}

func spreadCheck(in, out []*kgo.Record, exact, within bool, limit int) (problems []string, extra int) {
	add := func(format string, args ...any) {
		if len(problems) < limit {
			problems = append(problems, fmt.Sprintf(format, args...))
		}
	}
	copies := map[string]map[string]bool{} // event id -> whole signatures of its copies
	parts := map[string]map[int32]bool{}   // event id -> input partitions holding a copy
	noID := map[string]int{}
	for _, r := range in {
		id, ok := SpreadEventID(r)
		if !ok {
			noID[WholeSignature(r)]++
			continue
		}
		if copies[id] == nil {
			copies[id], parts[id] = map[string]bool{}, map[int32]bool{}
		}
		copies[id][WholeSignature(r)] = true
		parts[id][r.Partition] = true
	}
	got := map[string][]string{}
	for _, r := range out {
		id, ok := SpreadEventID(r)
		if !ok {
			s := WholeSignature(r)
			if noID[s] == 0 {
				if exact {
					add("record without event id forwarded more often than sent, or not sent: %s", s)
				}
				extra++
				continue
			}
			noID[s]--
			continue
		}
		got[id] = append(got[id], WholeSignature(r))
	}
	ids := make([]string, 0, len(copies))
	for id := range copies {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		g := got[id]
		delete(got, id)
		want := 1
		if within {
			want = len(parts[id])
		}
		switch {
		case len(g) < want:
			add("event %s: forwarded %d times, want %d (missing)", id, len(g), want)
			continue
		case len(g) > want:
			extra += len(g) - want
			if exact {
				add("event %s: forwarded %d times, want %d (repeated)", id, len(g), want)
			}
		}
		for _, s := range g {
			if !copies[id][s] {
				add("event %s: forwarded as %s, which is none of its copies", id, s)
			}
		}
	}
	for id := range got {
		add("event %s: forwarded but never sent", id)
	}
	for s, n := range noID {
		if n > 0 {
			add("record without event id not forwarded (%d times): %s", n, s)
		}
	}
	return problems, extra
}

// SpreadPartitions returns, of in, how many event ids have copies in more
// than one partition: the duplicates a deduplication within each
// partition cannot catch.
func SpreadPartitions(in []*kgo.Record) int {
	parts := map[string]map[int32]bool{}
	for _, r := range in {
		if id, ok := SpreadEventID(r); ok {
			if parts[id] == nil {
				parts[id] = map[int32]bool{}
			}
			parts[id][r.Partition] = true
		}
	}
	n := 0
	for _, ps := range parts {
		if len(ps) > 1 {
			n++
		}
	}
	return n
}
