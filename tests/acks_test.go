package tests

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// produceHold holds, with kfake's request control, the produce requests to
// one topic of the first producer that sends one once the hold begins: the
// broker neither appends nor answers them. Released, it drops them and
// every later request of that producer, closing the connection, so that
// what they carried is never appended; other producers (a restarted
// worker, the test's feeder) are not touched.
type produceHold struct {
	holding atomic.Bool
	release chan struct{}
	once    sync.Once

	mu       sync.Mutex
	producer int64     // guarded by mu: the held producer's id, -1 before its first request
	first    time.Time // guarded by mu: when its first request was held
	requests int       // guarded by mu: requests held or dropped
	records  int       // guarded by mu: records they carried
}

// holdProduce installs the hold on topic; it begins with begin.
func holdProduce(t *testing.T, c *kfake.Cluster, topic string, id [16]byte) *produceHold {
	t.Helper()
	h := &produceHold{release: make(chan struct{}), producer: -1}
	t.Cleanup(h.end) // before the cluster closes: no control function left asleep
	c.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		if !h.holding.Load() {
			return nil, nil, false
		}
		pid, records, ok := producedTo(req.(*kmsg.ProduceRequest), topic, id)
		if !ok {
			return nil, nil, false
		}
		h.mu.Lock()
		if h.producer == -1 {
			h.producer, h.first = pid, time.Now()
		}
		held := pid == h.producer
		if held {
			h.requests++
			h.records += records
		}
		h.mu.Unlock()
		if !held {
			return nil, nil, false
		}
		select {
		case <-h.release:
		default:
			c.SleepControl(func() { <-h.release })
		}
		return nil, errors.New("held produce request dropped"), true
	})
	return h
}

// producedTo returns the producer id of a produce request's batches to
// topic (by name or id) and how many records they hold; ok is false when
// the request writes nothing to topic.
func producedTo(req *kmsg.ProduceRequest, topic string, id [16]byte) (producer int64, records int, ok bool) {
	for _, tp := range req.Topics {
		if tp.Topic != topic && tp.TopicID != id {
			continue
		}
		for _, pp := range tp.Partitions {
			var b kmsg.RecordBatch
			if err := b.ReadFrom(pp.Records); err != nil {
				continue
			}
			producer, ok = b.ProducerID, true
			records += int(b.NumRecords)
		}
	}
	return producer, records, ok
}

// begin starts holding.
func (h *produceHold) begin() { h.holding.Store(true) }

// end releases what is held: dropped, never appended.
func (h *produceHold) end() { h.once.Do(func() { close(h.release) }) }

// held returns when the first request was held and the requests and
// records held so far.
func (h *produceHold) held() (first time.Time, requests, records int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.first, h.requests, h.records
}

// TestKillWhileProduceHeld holds the worker's produce requests to the
// output topic (kfake request control: neither appended nor acknowledged)
// for ten flush intervals while input keeps arriving, then SIGKILLs the
// worker process, drops what was held and restarts the worker on the same
// data directory. At least once a write batch may not pass a record whose
// produce is unacknowledged: its Badger checkpoint and group offset would
// say the record was forwarded, and the restarted worker would resume after
// it. Nothing the model forwards may be missing, and the records forwarded
// again are within the README's bound for one kill, the input rate
// measured before the first held request.
func TestKillWhileProduceHeld(t *testing.T) {
	p := newPipeline(t, 4)
	c := p.b.fake(t)
	topics, err := p.b.admin(t).ListTopics(context.Background(), p.out)
	if err != nil {
		t.Fatal(err)
	}
	h := holdProduce(t, c, p.out, topics[p.out].ID)
	recs := stream(16)
	dir := t.TempDir()
	const chunk, pause = 10, 10 * time.Millisecond
	budget := p.newRepeatBudget(t, chunk)
	pr := p.startProcess(t, dir, "KDEDUP_LOG_LEVEL=info")
	pr.waitReady(t)
	f := p.feed(t, recs, chunk, pause)
	f.until(len(recs) / 8)
	h.begin()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, n, _ := h.held(); n > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the worker sent no produce request to the output within 30s of the hold")
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Ten write batches fall due while the records are unacknowledged.
	time.Sleep(10 * p.flushInterval(t))
	first, requests, records := h.held()
	if n := budget.meter.latest(); n >= int64(len(recs)) {
		t.Fatalf("the input ended (%d records) before the kill: no write batch was due with input arriving", n)
	}
	pr.kill()
	h.end()
	t.Logf("worker killed with %d produce requests (%d records) to the output held for %s", requests, records, time.Since(first).Round(time.Millisecond))
	budget.lose(t, "the kill", first)
	pr = p.startProcess(t, dir, "KDEDUP_LOG_LEVEL=info")
	f.wait(t)
	want, got := p.output(t, recs)
	pr.kill()
	extra := requireNothingMissing(t, want, got)
	t.Logf("%d records expected, %d read: nothing missing, %d extra", want.Stats.Forwarded, got.Stats.Forwarded, extra)
	budget.require(t, extra)
}
