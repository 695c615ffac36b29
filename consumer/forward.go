package consumer

import (
	"context"
	"sync"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Producing a record without allocating for it. A forwarded record is
// taken from outputs and the promise franz-go calls for any produced record
// is a delivery's method value bound once, both pooled: at hundreds of
// thousands of records a second the record (its kgo.Record, about 200
// bytes) and the promise closure were the worker's only allocations per
// record, and their collection a share of its CPU.
//
// A record comes back to its pool when its promise reports it produced:
// franz-go no longer refers to it then (kgo.Client.Produce). A record that
// failed is kept by the failure's bookkeeping (the at-least-once retry, the
// exactly-once rejections) and left to the garbage collector.

// outputs pools the records forwarded to Options.OutputTopic (output).
// Only output makes records for that topic (Options.validate keeps the
// duplicates and dead-letter topics apart from it), so a promise that sees
// one produced may put it back.
var outputs = sync.Pool{New: func() any { return new(kgo.Record) }}

// releaseOutput puts out back into outputs if it is a forwarded record,
// or into rekeyedRecords, with its emptied header slice, if it was
// produced to the repartition topic (only rekeyed makes those).
func (w *Worker) releaseOutput(out *kgo.Record) {
	switch out.Topic {
	case w.opts.OutputTopic:
		*out = kgo.Record{}
		outputs.Put(out)
	case w.opts.RepartitionTopic:
		h := out.Headers
		clear(h) // no pooled record keeps an input record's bytes alive
		*out = kgo.Record{Headers: h[:0]}
		rekeyedRecords.Put(out)
	}
}

// producer produces records asynchronously: *kgo.Client, or
// *kgo.GroupTransactSession in a transaction.
type producer interface {
	Produce(ctx context.Context, r *kgo.Record, promise func(*kgo.Record, error))
}

// delivery is the promise of one record produced for an input record: at
// least once for a partition (pw), or in a transaction (txn).
type delivery struct {
	pw      *partitionWorker
	txn     *txnProduce
	in, out *kgo.Record
	done    func(*kgo.Record, error) // d.delivered, bound once
}

var deliveries = sync.Pool{New: func() any { return new(delivery) }}

// newDelivery returns a pooled delivery of out, produced for in.
func newDelivery(in, out *kgo.Record) *delivery {
	d := deliveries.Get().(*delivery)
	if d.done == nil {
		d.done = d.delivered
	}
	d.in, d.out = in, out
	return d
}

// delivered is the promise: it reports out's outcome to its partition or
// transaction, then returns the delivery, and out if it was produced, to
// their pools.
func (d *delivery) delivered(_ *kgo.Record, err error) {
	in, out := d.in, d.out
	if d.txn != nil {
		d.txn.delivered(in, out, err)
	} else {
		d.pw.delivered(in, out, err)
	}
	w := d.worker()
	*d = delivery{done: d.done}
	deliveries.Put(d)
	if err == nil {
		w.releaseOutput(out)
	}
}

func (d *delivery) worker() *Worker {
	if d.txn != nil {
		return d.txn.w
	}
	return d.pw.w
}

// produce produces out, decided from input record in, at least once.
func (pw *partitionWorker) produce(in, out *kgo.Record) {
	pw.produced.inflight.Add(1)
	d := newDelivery(in, out)
	d.pw = pw
	// Not the worker's context: records already decided must be delivered
	// (or fail) before the write batch that covers them, even at shutdown.
	pw.prod.Produce(context.Background(), out, d.done)
}

// delivered records the outcome of producing out at least once.
func (pw *partitionWorker) delivered(in, out *kgo.Record, err error) {
	pw.w.countAcknowledged(out, err)
	if err != nil {
		pw.w.m.produceErrors.Inc()
		pw.produceFailed(in, out, err)
	}
	pw.produced.inflight.Done()
}

// txnProduce is what the records produced in one transaction report to:
// the first error and how many failed.
type txnProduce struct {
	w       *Worker
	prod    producer // the worker's session
	mu      sync.Mutex
	err     error // the first produce error
	nFailed int   // records that failed
}

// produce produces out, decided from input record in, in the transaction.
func (t *txnProduce) produce(in, out *kgo.Record) {
	d := newDelivery(in, out)
	d.txn = t
	// Not the loop's context: a stop must not fail the records of the
	// transaction it lets end (End's deadline bounds them).
	t.prod.Produce(context.Background(), out, d.done)
}

// delivered records the outcome of producing out in the transaction.
func (t *txnProduce) delivered(in, out *kgo.Record, err error) {
	w := t.w
	w.countAcknowledged(out, err)
	if err == nil {
		return
	}
	w.m.produceErrors.Inc()
	w.txnProduceFailed(in, out, err)
	t.mu.Lock()
	if t.err == nil {
		t.err = w.produceError(in, out, err)
	}
	t.nFailed++
	t.mu.Unlock()
}
