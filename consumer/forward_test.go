package consumer

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// ackProducer acknowledges every record at once, as franz-go's promise
// would once the broker replied, failing those whose value is in fail, and
// keeps what each produced record held when it was produced.
type ackProducer struct {
	fail map[string]error
	keep bool
	seen []string // with keep, "topic key value" of each record produced
}

func (p *ackProducer) Produce(_ context.Context, r *kgo.Record, promise func(*kgo.Record, error)) {
	if p.keep {
		p.seen = append(p.seen, fmt.Sprintf("%s %s %s", r.Topic, r.Key, r.Value))
	}
	promise(r, p.fail[string(r.Value)])
}

// laterProducer holds every record produced, with what it held when it was
// produced, until ack acknowledges them all, newest first, from another
// goroutine, as franz-go's promise goroutine would once the broker
// replied: a record released to its pool before its promise, and reused by
// a later output, no longer holds what it was produced with.
type laterProducer struct {
	held []heldRecord
}

type heldRecord struct {
	r       *kgo.Record
	was     string // "topic key value" when produced
	promise func(*kgo.Record, error)
}

func recordString(r *kgo.Record) string { return fmt.Sprintf("%s %s %s", r.Topic, r.Key, r.Value) }

func (p *laterProducer) Produce(_ context.Context, r *kgo.Record, promise func(*kgo.Record, error)) {
	p.held = append(p.held, heldRecord{r, recordString(r), promise})
}

// ack acknowledges every held record and returns those that changed
// between their produce and their promise.
func (p *laterProducer) ack() []string {
	var changed []string
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := len(p.held) - 1; i >= 0; i-- {
			h := p.held[i]
			if now := recordString(h.r); now != h.was {
				changed = append(changed, fmt.Sprintf("produced as %q, acknowledged as %q", h.was, now))
			}
			h.promise(h.r, nil)
		}
	}()
	<-done
	p.held = p.held[:0]
	return changed
}

// TestForwardedRecordHeldUntilItsPromise forwards records whose promises
// run later, out of order, on another goroutine, between further
// forwards, at least once and in a transaction: every record still holds
// its own key and value when its promise runs, and a delivery taken from
// the pool afterwards reports to no partition and no transaction.
func TestForwardedRecordHeldUntilItsPromise(t *testing.T) {
	r := newPartitionRig(t, AtLeastOnce, Options{OutputTopic: "out"})
	pw := r.pw
	later := &laterProducer{}
	pw.prod = later
	txn := &txnProduce{w: r.w, prod: later}
	for round := range 20 {
		produce := pw.produce
		if round%2 == 1 {
			produce = txn.produce
		}
		for i := range 50 {
			in := &kgo.Record{Topic: "in", Key: fmt.Appendf(nil, "k%d-%d", round, i), Value: fmt.Appendf(nil, "v%d-%d", round, i)}
			produce(in, pw.output(in))
		}
		if changed := later.ack(); len(changed) > 0 {
			t.Fatalf("round %d: %d records changed before their promise, e.g. %s", round, len(changed), changed[0])
		}
	}
	settled := make(chan struct{})
	go func() { pw.produced.inflight.Wait(); close(settled) }()
	select {
	case <-settled:
	case <-time.After(10 * time.Second):
		t.Fatal("at-least-once records acknowledged but the partition still waits for them: their promises reported elsewhere")
	}
	if txn.nFailed != 0 || txn.err != nil {
		t.Errorf("transaction saw %d failed records (%v), want none", txn.nFailed, txn.err)
	}
	d := newDelivery(nil, nil)
	if d.pw != nil || d.txn != nil {
		t.Errorf("a delivery from the pool reports to partition %p, transaction %p: want neither", d.pw, d.txn)
	}
}

// TestForwardAllocatesNothing: forwarding a record (output, then produce,
// at least once and in a transaction, until its promise reports it
// produced) allocates nothing once the pools are warm: the record and the
// promise come back to their pools when the record is produced.
func TestForwardAllocatesNothing(t *testing.T) {
	r := newPartitionRig(t, AtLeastOnce, Options{OutputTopic: "out"})
	pw := r.pw
	ack := &ackProducer{}
	pw.prod = ack
	in := &kgo.Record{Topic: "in", Key: []byte("k"), Value: []byte("v")}
	txn := &txnProduce{w: r.w, prod: ack}
	for _, tc := range []struct {
		name    string
		produce func(in, out *kgo.Record)
	}{
		{"at least once", pw.produce},
		{"in a transaction", txn.produce},
	} {
		t.Run(tc.name, func(t *testing.T) {
			forward := func() { tc.produce(in, pw.output(in)) }
			forward() // the pools' first objects
			if n := testing.AllocsPerRun(1000, forward); n != 0 {
				t.Errorf("%.2f allocations a forwarded record, want 0", n)
			}
		})
	}
	pw.produced.inflight.Wait() // every at-least-once record acknowledged
}

// TestForwardedRecordsReusedOnlyOnceProduced forwards records through
// pooled records and promises, at least once and in a transaction, with
// the broker refusing some: each record produced carried its own input's
// key and value (a record reused while still produced would carry
// another's), and a refused record is kept whole by the failure's
// bookkeeping (the at-least-once retry list, the transaction's rejections)
// while later records are forwarded.
func TestForwardedRecordsReusedOnlyOnceProduced(t *testing.T) {
	refused := kerr.MessageTooLarge
	for _, mode := range []Delivery{AtLeastOnce, ExactlyOnce} {
		t.Run(mode.String(), func(t *testing.T) {
			r := newPartitionRig(t, mode, Options{OutputTopic: "out"})
			pw := r.pw
			ack := &ackProducer{fail: map[string]error{}, keep: true}
			pw.prod = ack
			txn := &txnProduce{w: r.w, prod: ack}
			produce := pw.produce
			if mode == ExactlyOnce {
				produce = txn.produce
			}
			var want, wantRefused []string
			for i := range 2000 {
				in := &kgo.Record{Topic: "in", Offset: int64(i), Key: fmt.Appendf(nil, "k%d", i), Value: fmt.Appendf(nil, "v%d", i)}
				if i%97 == 5 {
					ack.fail[string(in.Value)] = refused
					wantRefused = append(wantRefused, fmt.Sprintf("out k%d v%d", i, i))
				}
				want = append(want, fmt.Sprintf("out k%d v%d", i, i))
				produce(in, pw.output(in))
			}
			if fmt.Sprint(ack.seen) != fmt.Sprint(want) {
				t.Fatalf("records produced differ from their inputs:\n got %v\nwant %v", ack.seen, want)
			}
			var kept []rejected
			if mode == ExactlyOnce {
				kept = r.w.txn.rejections.refused
			} else {
				pw.produced.inflight.Wait()
				kept = pw.produced.mu.rejected
			}
			var got []string
			for _, x := range kept {
				if !errors.Is(x.err, refused) || x.out == nil || string(x.in.Value) != string(x.out.Value) {
					t.Fatalf("refused record kept as %+v", x)
				}
				got = append(got, fmt.Sprintf("%s %s %s", x.out.Topic, x.out.Key, x.out.Value))
			}
			if fmt.Sprint(got) != fmt.Sprint(wantRefused) {
				t.Errorf("refused records kept:\n got %v\nwant %v", got, wantRefused)
			}
			if mode == ExactlyOnce && (txn.nFailed != len(wantRefused) || !errors.Is(txn.err, refused)) {
				t.Errorf("transaction saw %d failed records, first error %v; want %d, %v", txn.nFailed, txn.err, len(wantRefused), refused)
			}
		})
	}
}
