package consumer

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kdedup/kdedup/dedup"
	"github.com/kdedup/kdedup/store"
)

// partition is the goroutine that owns one assigned topic-partition.
type partition struct {
	w         *Worker
	topic     string
	partition int32
	d         *dedup.Partition

	in    chan []*kgo.Record
	quit  chan struct{} // finish queued records, commit, exit
	abort chan struct{} // drop uncommitted state, exit
	done  chan struct{}

	next    store.Checkpoint // offset after the last decided record
	pending int              // records decided since the last write batch

	// replayUntil is the group's committed offset when the local state was
	// behind it: records before it were forwarded by an earlier owner, so
	// they update the filter without being forwarded again.
	replayUntil int64

	inflight sync.WaitGroup
	prodErr  atomic.Pointer[error]
	failed   bool
}

func newPartition(w *Worker, topic string, p int32, d *dedup.Partition) *partition {
	return &partition{
		w: w, topic: topic, partition: p, d: d,
		in:    make(chan []*kgo.Record, 4),
		quit:  make(chan struct{}),
		abort: make(chan struct{}),
		done:  make(chan struct{}),
	}
}

func (pw *partition) stop(abort bool) {
	if abort {
		close(pw.abort)
	} else {
		close(pw.quit)
	}
}

func (pw *partition) run() {
	defer close(pw.done)
	defer pw.d.Close()
	tick := time.NewTicker(pw.w.opts.FlushInterval)
	defer tick.Stop()
	for {
		select {
		case recs := <-pw.in:
			pw.process(recs) // dropped once failed: the next owner reads them again from the checkpoint
		case <-tick.C:
			pw.flush()
		case <-pw.abort:
			return
		case <-pw.quit:
			pw.drain()
			pw.flush()
			return
		}
	}
}

// drain processes what is queued. Dispatch never runs during a revocation
// or after polling stopped, so the queue is all this partition will get.
func (pw *partition) drain() {
	for {
		select {
		case recs := <-pw.in:
			pw.process(recs)
		default:
			return
		}
	}
}

func (pw *partition) process(recs []*kgo.Record) {
	if pw.failed {
		return
	}
	forwards := pw.w.opts.Forwards
	for _, r := range recs {
		d, err := pw.d.Decide(r)
		if err != nil {
			pw.fail(err)
			return
		}
		if d == dedup.Unkeyed {
			pw.w.log.Debug("record cannot be keyed; forwarded unchanged", "topic", pw.topic, "partition", pw.partition, "offset", r.Offset, "reason", pw.d.LastKeyError())
		}
		switch {
		case r.Offset < pw.replayUntil:
			pw.w.m.replayed.Inc()
		case forwards(d):
			pw.produce(r)
		}
		pw.next = store.Checkpoint{Offset: r.Offset + 1, LeaderEpoch: r.LeaderEpoch}
		pw.pending++
		if pw.d.DirtyBytes() >= pw.w.opts.FlushBytes {
			pw.flush()
			if pw.failed {
				return
			}
		}
	}
}

// produce forwards r, keeping its key, value, headers and timestamp; the
// default partitioner places it by key.
func (pw *partition) produce(r *kgo.Record) {
	out := &kgo.Record{Key: r.Key, Value: r.Value, Headers: r.Headers, Timestamp: r.Timestamp}
	pw.inflight.Add(1)
	// Not the worker's context: records already decided must be delivered
	// (or fail) before the write batch that covers them, even at shutdown.
	pw.w.cl.Produce(context.Background(), out, func(_ *kgo.Record, err error) {
		if err != nil {
			pw.w.m.produceErrors.Inc()
			err = fmt.Errorf("producing record of %s/%d offset %d to %s: %w", pw.topic, pw.partition, r.Offset, pw.w.opts.OutputTopic, err)
			pw.prodErr.CompareAndSwap(nil, &err)
		}
		pw.inflight.Done()
	})
}

// flush cuts a write batch: wait for every forwarded record's ack, commit
// pages, metadata and checkpoint in one Badger transaction, then mark the
// offset for the group commit.
func (pw *partition) flush() {
	if pw.failed || pw.pending == 0 {
		return
	}
	pw.inflight.Wait()
	if err := pw.prodErr.Load(); err != nil {
		pw.fail(*err)
		return
	}
	if err := pw.d.Commit(pw.next); err != nil {
		pw.fail(err)
		return
	}
	pw.pending = 0
	pw.w.m.batches.Inc()
	pw.w.cl.MarkCommitOffsets(map[string]map[int32]kgo.EpochOffset{
		pw.topic: {pw.partition: {Epoch: pw.next.LeaderEpoch, Offset: pw.next.Offset}},
	})
}

func (pw *partition) fail(err error) {
	pw.failed = true
	pw.w.fail(err)
}
