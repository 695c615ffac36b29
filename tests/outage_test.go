package tests

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kdedup/kdedup/internal/scenario"
)

// outage makes brokers of a kfake cluster unreachable and reachable again
// while the cluster keeps its state, as a broker restart or a network
// partition does: while a broker is down, its open connections are closed
// and new ones are closed as soon as they are accepted (clients see EOF on
// their first read).
type outage struct {
	mu    sync.Mutex
	down  map[string]bool     // listener address: cut off
	conns map[net.Conn]string // accepted connection: its listener's address
}

// listen is the cluster's kfake.ListenFn.
func (o *outage) listen(network, addr string) (net.Listener, error) {
	l, err := net.Listen(network, addr)
	if err != nil {
		return nil, err
	}
	return outageListener{Listener: l, o: o, addr: l.Addr().String()}, nil
}

type outageListener struct {
	net.Listener
	o    *outage
	addr string
}

func (l outageListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		l.o.mu.Lock()
		if l.o.down[l.addr] {
			l.o.mu.Unlock()
			c.Close()
			continue
		}
		l.o.conns[c] = l.addr
		l.o.mu.Unlock()
		return c, nil
	}
}

// begin takes the brokers listening on addrs down: their connections are cut.
func (o *outage) begin(addrs ...string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, a := range addrs {
		o.down[a] = true
	}
	for c, a := range o.conns {
		if o.down[a] {
			c.Close()
			delete(o.conns, c)
		}
	}
}

// beginOnProduce takes the broker down when it receives the next produce
// request to topic, which it leaves unanswered: records were decided and
// handed to the producer, and the outage cuts them off mid-flight.
func (o *outage) beginOnProduce(t *testing.T, b *broker, topic string) <-chan struct{} {
	t.Helper()
	topics, err := b.admin(t).ListTopics(context.Background(), topic)
	if err != nil {
		t.Fatal(err)
	}
	id := topics[topic].ID
	begun := make(chan struct{})
	var once sync.Once
	b.cluster.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		for _, tp := range req.(*kmsg.ProduceRequest).Topics {
			if tp.Topic == topic || tp.TopicID == id {
				handled := false
				once.Do(func() {
					o.begin(b.addrs...)
					close(begun)
					handled = true
				})
				if handled {
					return nil, errors.New("broker outage"), true
				}
			}
		}
		b.cluster.KeepControl()
		return nil, nil, false
	})
	return begun
}

// end brings every broker back.
func (o *outage) end() {
	o.mu.Lock()
	defer o.mu.Unlock()
	clear(o.down)
}

// newOutagePipeline is newPipeline on a kfake cluster that can be cut off.
// The test's own clients retry an EOF on a new connection (as the worker
// must): they know their configuration is right.
func newOutagePipeline(t *testing.T, brokers int, partitions int32) (*pipeline, *outage) {
	t.Helper()
	o := &outage{down: map[string]bool{}, conns: map[net.Conn]string{}}
	c, err := kfake.NewCluster(kfake.NumBrokers(brokers), kfake.GroupMinSessionTimeout(time.Second), kfake.ListenFn(o.listen))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	prefix := fmt.Sprintf("kdedup-%s-%08x-", strings.ToLower(strings.ReplaceAll(t.Name(), "/", "-")), rand.Uint32())
	b := &broker{addrs: c.ListenAddrs(), prefix: prefix, cluster: c, conn: []kgo.Opt{kgo.AlwaysRetryEOF()}}
	p := &pipeline{b: b, in: b.name("in"), out: b.name("out"), group: b.name("group"), partitions: partitions, delivery: "at-least-once"}
	b.createTopics(t, partitions, p.in)
	b.createTopics(t, 8*partitions, p.out) // many output partitions: a record decided in the outage often starts a new batch
	return p, o
}

// requireRepeatsWithin fails the test when at-least-once output holds more
// extra records than bound.
func requireRepeatsWithin(t *testing.T, extra, bound int, why string) {
	t.Helper()
	if extra > bound {
		t.Fatalf("%d records forwarded again, more than the %d at-least-once allows for %s", extra, bound, why)
	}
}

// inputMeter samples the end offsets of a pipeline's input topic, every
// meterEvery, from its start until the test ends, so that a test can tell
// the rate at which records were appended before a crash.
type inputMeter struct {
	mu      sync.Mutex
	samples []inputSample // guarded by mu; in time order
}

// inputSample is the sum of the input's end offsets as a ListOffsets
// answered it at a time.
type inputSample struct {
	at      time.Time
	records int64
}

const meterEvery = 20 * time.Millisecond

// meterInput starts an inputMeter on p's input topic. Samples the broker
// does not answer (an outage) are left out.
func (p *pipeline) meterInput(t *testing.T) *inputMeter {
	t.Helper()
	m := &inputMeter{}
	adm := p.b.admin(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	go func() {
		defer close(done)
		tick := time.NewTicker(meterEvery)
		defer tick.Stop()
		for {
			rctx, rcancel := context.WithTimeout(ctx, time.Second)
			ends, err := adm.ListEndOffsets(rctx, p.in)
			rcancel()
			if err == nil && ends.Error() == nil {
				var n int64
				ends.Each(func(o kadm.ListedOffset) { n += o.Offset })
				m.mu.Lock()
				m.samples = append(m.samples, inputSample{at: time.Now(), records: n})
				m.mu.Unlock()
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	return m
}

// rate is the records per second appended to the input over the window
// before at, measured between the last samples taken by at-window and by
// at (the first sample if none is that old). ok is false without two such
// samples.
func (m *inputMeter) rate(at time.Time, window time.Duration) (perSecond float64, ok bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	from, to := -1, -1
	for i, s := range m.samples {
		if s.at.After(at) {
			break
		}
		if !s.at.After(at.Add(-window)) || from < 0 {
			from = i
		}
		to = i
	}
	if from < 0 || to <= from {
		return 0, false
	}
	a, b := m.samples[from], m.samples[to]
	return float64(b.records-a.records) / b.at.Sub(a.at).Seconds(), true
}

// latest is the input's records at the last sample, 0 before the first.
func (m *inputMeter) latest() int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.samples) == 0 {
		return 0
	}
	return m.samples[len(m.samples)-1].records
}

// repeatBudget is what at-least-once may forward again, as the README
// states it: per lost session (a kill, a lost group session) the records
// decided since the last write batch, at most the records of one
// KDEDUP_FLUSH_INTERVAL at the input rate plus one poll per partition. The
// input rate is measured before each loss over rateWindow (records
// appended per second, not the feeder's nominal rate, which a loaded
// machine does not reach). One poll per partition is, over all partitions,
// one feeder chunk: the feeder appends a chunk at once, and a partition
// that keeps up polls what arrived since its previous poll, its share of
// one chunk.
type repeatBudget struct {
	meter   *inputMeter
	flush   time.Duration // KDEDUP_FLUSH_INTERVAL
	poll    int           // records of one poll of every partition
	bound   float64
	perLoss []float64 // each loss's share of bound
	losses  []string
}

// rateWindow is how long before a loss the input rate is measured: ten
// flush intervals, and at least a second.
func (b *repeatBudget) rateWindow() time.Duration { return max(time.Second, 10*b.flush) }

// newRepeatBudget meters p's input from now on; chunk is the feeder's chunk.
// It returns once the meter has two samples, so that a loss at any time
// after has a rate (the first listing of offsets can take longer than a
// test takes to its first kill on Apache Kafka).
func (p *pipeline) newRepeatBudget(t *testing.T, chunk int) *repeatBudget {
	t.Helper()
	m := p.meterInput(t)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		m.mu.Lock()
		n := len(m.samples)
		m.mu.Unlock()
		if n >= 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the input meter took %d samples of %s's end offsets in 30 s", n, p.in)
		}
	}
	return &repeatBudget{meter: m, flush: p.flushInterval(t), poll: chunk}
}

// lose adds a session lost at at (now if zero) to the budget.
func (b *repeatBudget) lose(t *testing.T, what string, at time.Time) {
	t.Helper()
	if at.IsZero() {
		at = time.Now()
	}
	r, ok := b.meter.rate(at, b.rateWindow())
	if !ok {
		t.Fatalf("no input rate measured in the %s before %s", b.rateWindow(), what)
	}
	b.bound += r*b.flush.Seconds() + float64(b.poll)
	b.perLoss = append(b.perLoss, r*b.flush.Seconds()+float64(b.poll))
	b.losses = append(b.losses, fmt.Sprintf("%s at %.0f records/s", what, r))
}

// lossSlack is how far one loss's records forwarded again may pass its own
// share of the budget when each loss is checked apart
// (requireEach): a write batch the loaded machine delays, or input that
// arrived faster in the last flush interval than over the rate window.
// The losses together must stay within the budget itself.
const lossSlack = 2

// requireEach fails the test when the records forwarded again after any
// one loss (extras[i] after loss i, from extrasPerLoss) pass lossSlack
// times that loss's share of the budget. Checked loss by loss, a worker
// whose write batches come k times further apart than the flush interval
// fails unless every loss happened to fall in the first 2/k of its batch's
// interval: with k = 5 and 8 kills, about one run in a thousand.
func (b *repeatBudget) requireEach(t *testing.T, extras []int) {
	t.Helper()
	if len(extras) != len(b.perLoss) {
		t.Fatalf("%d losses with records forwarded again counted, %d losses in the budget", len(extras), len(b.perLoss))
	}
	for i, n := range extras {
		if bound := lossSlack * b.perLoss[i]; float64(n) > bound {
			t.Errorf("%d records forwarded again after %s, more than %d x its one flush interval and poll (%.0f): write batches came further apart than KDEDUP_FLUSH_INTERVAL=%s",
				n, b.losses[i], lossSlack, b.perLoss[i], b.flush)
		}
	}
	t.Logf("records forwarded again after each loss: %v; shares of the budget %.0f", extras, b.perLoss)
}

// extrasPerLoss attributes the records out (an at-least-once output) holds
// beyond want to the loss after which they were forwarded again. A copy
// belongs to the last loss i whose output end offsets ends[i] (listed
// right after the loss) it is at or past in its partition, or to none
// before the first; a record's copies beyond the model's count are those of
// the latest losses (copies of a keyless record may land in any output
// partition, so the order is the loss's, then the offset's). A copy
// before the first loss is listed apart, in before (key, partition,
// offset): nothing should forward a record twice without a loss.
func extrasPerLoss(want scenario.Model, out []*kgo.Record, ends []map[int32]int64) (perLoss []int, before []string) {
	allowed := map[string]int{}
	id := func(key []byte, sig string) string { return fmt.Sprintf("%q/%s", key, sig) }
	for k, sigs := range want.PerKey {
		for _, s := range sigs {
			allowed[id([]byte(k), s)]++
		}
	}
	for _, s := range want.Unkeyed {
		allowed[id(nil, s)]++
	}
	type copyOf struct {
		r    *kgo.Record
		loss int // -1: before the first loss
	}
	copies := make([]copyOf, len(out))
	for i, r := range out {
		loss := -1
		for j, e := range ends {
			if r.Offset >= e[r.Partition] {
				loss = j
			}
		}
		copies[i] = copyOf{r, loss}
	}
	slices.SortFunc(copies, func(a, b copyOf) int {
		return cmp.Or(cmp.Compare(a.loss, b.loss), cmp.Compare(a.r.Partition, b.r.Partition), cmp.Compare(a.r.Offset, b.r.Offset))
	})
	perLoss = make([]int, len(ends))
	for _, c := range copies {
		k := id(c.r.Key, scenario.Signature(c.r))
		if allowed[k] > 0 {
			allowed[k]--
			continue
		}
		if c.loss < 0 {
			before = append(before, fmt.Sprintf("key %q at %d/%d (first loss's end offset %d)", c.r.Key, c.r.Partition, c.r.Offset, ends[0][c.r.Partition]))
			continue
		}
		perLoss[c.loss]++
	}
	return perLoss, before
}

// outputEnds lists the end offset of every partition of p's output topic.
func (p *pipeline) outputEnds(t *testing.T) map[int32]int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	listed, err := p.b.admin(t).ListEndOffsets(ctx, p.out)
	if err != nil {
		t.Fatal(err)
	}
	ends := map[int32]int64{}
	listed.Each(func(o kadm.ListedOffset) {
		if o.Err != nil {
			t.Fatalf("end offset of %s/%d: %v", o.Topic, o.Partition, o.Err)
		}
		ends[o.Partition] = o.Offset
	})
	return ends
}

// require fails the test when extra, the records at-least-once output
// holds beyond the model, passes the budget.
func (b *repeatBudget) require(t *testing.T, extra int) {
	t.Helper()
	bound := int(b.bound)
	why := fmt.Sprintf("%d lost session(s) (%s; one %s flush interval and a poll of %d records each)",
		len(b.losses), strings.Join(b.losses, ", "), b.flush, b.poll)
	requireRepeatsWithin(t, extra, bound, why)
	t.Logf("%d records forwarded again, within the %d allowed for %s", extra, bound, why)
}

// flushInterval is the pipeline's KDEDUP_FLUSH_INTERVAL.
func (p *pipeline) flushInterval(t *testing.T) time.Duration {
	t.Helper()
	d, err := time.ParseDuration(p.env("")["KDEDUP_FLUSH_INTERVAL"])
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// TestBrokerOutage cuts the worker off from the broker for more than two
// session timeouts, beginning as it produces forwarded records, while input
// keeps arriving (the broker keeps its state, as after a restart): produces
// stall, the group expires the worker's membership, and the worker must
// keep running, rejoin and take its partitions back. Exactly once the output
// equals the model; at least once nothing is missing and the records
// forwarded again stay within the bound of one lost session.
func TestBrokerOutage(t *testing.T) {
	deliveries(t, func(t *testing.T, delivery string) {
		p, o := newOutagePipeline(t, 1, 4)
		p.delivery = delivery
		const session = 3 * time.Second
		p.extraEnv = map[string]string{"KDEDUP_SESSION_TIMEOUT": session.String()}
		recs := stream(10)
		w := p.startWorker(t, t.TempDir())
		const chunk, pause = 20, 10 * time.Millisecond
		budget := p.newRepeatBudget(t, chunk)
		f := p.feed(t, recs, chunk, pause)
		f.until(len(recs) / 3)
		<-o.beginOnProduce(t, p.b, p.out)
		budget.lose(t, "the outage", time.Now())
		time.Sleep(2*session + time.Second)
		o.end()
		f.wait(t)
		want, got := p.output(t, recs)
		w.running(t)
		// Exactly once the transaction times out first, and the worker
		// restarts its Kafka session instead of losing the partitions.
		if n := w.metric(t, "kdedup_partitions_lost_total") + w.metric(t, "kdedup_session_restarts_total"); n == 0 {
			t.Error("no partition was lost and no session restarted: the outage did not outlast the group session")
		}
		w.stop(t)
		if delivery == "exactly-once" {
			requireExact(t, want, got)
			return
		}
		extra := requireNothingMissing(t, want, got)
		t.Logf("at-least-once across the outage: %d records expected, nothing missing, %d extra", want.Stats.Forwarded, extra)
		budget.require(t, extra)
	})
}

// TestBrokerBlip cuts the worker process off from the broker for one
// second, a third of its session timeout, three times while input keeps
// arriving, as a broker restart does: connections see EOF on their first
// read. Within the session timeout the group session must survive (no
// partition lost, so nothing repeated), the process keeps running and
// exits 0 on SIGTERM; the output equals the model.
func TestBrokerBlip(t *testing.T) {
	p, o := newOutagePipeline(t, 1, 4)
	p.extraEnv = map[string]string{"KDEDUP_LOG_LEVEL": "info"}
	recs := stream(11)
	pr := p.startProcess(t, t.TempDir())
	pr.waitReady(t)
	f := p.feed(t, recs, 20, 10*time.Millisecond)
	for i := range 3 {
		f.until((i + 1) * len(recs) / 4)
		o.begin(p.b.addrs...)
		time.Sleep(time.Second)
		o.end()
	}
	f.wait(t)
	want, got := p.output(t, recs)
	if err := pr.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatalf("the worker is gone: %v", err)
	}
	if err := pr.cmd.Wait(); err != nil {
		t.Fatalf("after SIGTERM: %v", err)
	}
	if n := strings.Count(pr.logText(t), "lost=true"); n > 0 {
		t.Errorf("%d partitions lost to outages shorter than the session timeout", n)
	}
	requireExact(t, want, got)
}

// TestPartitionsAdded adds partitions to the input topic of a group whose
// workers run with KDEDUP_START_OFFSET=latest, once while no worker runs and
// once while one does, and produces to them at once: as the group was
// reading the topic before they existed, they are read from their start,
// and a running worker picks them up within its metadata age. The output
// is exactly the model's.
func TestPartitionsAdded(t *testing.T) {
	deliveries(t, func(t *testing.T, delivery string) {
		p := newPipeline(t, 2)
		p.delivery = delivery
		dir := t.TempDir()
		part1 := stream(12)[:1000]
		p.runPart(t, dir, part1) // the group commits offsets in the topic
		part2 := p.addPartitions(t, 1, "added-", stream(13)[:1000])
		p.extraEnv = map[string]string{"KDEDUP_START_OFFSET": "latest", "KDEDUP_METADATA_MAX_AGE": "1s"}
		w := p.startWorker(t, dir)
		part3 := p.addPartitions(t, 1, "later-", stream(14)[:1000])
		want, got := p.output(t, slices.Concat(part1, part2, part3))
		w.stop(t)
		requireExact(t, want, got)
	})
}

// addPartitions adds n partitions to the input topic and produces recs,
// their keys prefixed (a key's partition changes with the partition count,
// and the filter is per partition), once the producer sees the new
// partitions. It fails the test unless some records go to them.
func (p *pipeline) addPartitions(t *testing.T, n int, prefix string, recs []*kgo.Record) []*kgo.Record {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	before := p.partitions
	resp, err := p.b.admin(t).CreatePartitions(ctx, n, p.in)
	if err == nil {
		err = resp.Error()
	}
	if err != nil {
		t.Fatalf("adding %d partitions to %s: %v", n, p.in, err)
	}
	p.partitions += int32(n)
	for _, r := range recs {
		if len(r.Key) > 0 {
			r.Key = append([]byte(prefix), r.Key...)
		}
	}
	cl := p.b.client(t, kgo.MetadataMinAge(50*time.Millisecond), kgo.MetadataMaxAge(100*time.Millisecond))
	for {
		topics, err := kadm.NewClient(cl).ListTopics(ctx, p.in)
		if err == nil && int32(len(topics[p.in].Partitions)) == p.partitions {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("%s does not list its %d partitions", p.in, p.partitions)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := scenario.Produce(ctx, cl, p.in, recs); err != nil {
		t.Fatal(err)
	}
	added := 0
	for _, r := range recs {
		if r.Partition >= before {
			added++
		}
	}
	if added == 0 {
		t.Fatal("no record went to the added partitions")
	}
	t.Logf("%d of %d records went to the %d added partitions", added, len(recs), n)
	return recs
}
