package consumer

import (
	"context"
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kdedup/kdedup/store"
)

// Delivery is the delivery guarantee of forwarded records.
type Delivery uint8

const (
	// AtLeastOnce produces forwarded records, and commits the filter state
	// and offsets after their acks: a crash forwards again at most the
	// records of one flush interval.
	AtLeastOnce Delivery = iota
	// ExactlyOnce produces forwarded records and commits input offsets in
	// one Kafka transaction (franz-go GroupTransactSession, KIP-447
	// fencing); filter changes are staged until the transaction commits and
	// reach Badger after it.
	ExactlyOnce
)

// ErrDelivery is returned (wrapped) by Delivery.UnmarshalText for a name
// that is not a delivery guarantee.
var ErrDelivery = errors.New("consumer: unknown delivery guarantee")

// deliveryNames are the names of the Delivery values, by value: what
// KDEDUP_DELIVERY accepts.
var deliveryNames = [...]string{AtLeastOnce: "at-least-once", ExactlyOnce: "exactly-once"}

// String returns "at-least-once" or "exactly-once", or "Delivery(n)" for a
// value that is neither.
func (d Delivery) String() string {
	if int(d) < len(deliveryNames) {
		return deliveryNames[d]
	}
	return fmt.Sprintf("Delivery(%d)", uint8(d))
}

// Valid reports whether d is AtLeastOnce or ExactlyOnce.
func (d Delivery) Valid() bool { return int(d) < len(deliveryNames) }

// MarshalText returns d.String(), so that logs and JSON show the name.
func (d Delivery) MarshalText() ([]byte, error) { return []byte(d.String()), nil }

// UnmarshalText sets d from its name, "at-least-once" or "exactly-once"
// (exact match); any other text returns an error wrapping ErrDelivery and
// leaves d unchanged.
func (d *Delivery) UnmarshalText(text []byte) error {
	for v, name := range deliveryNames {
		if string(text) == name {
			*d = Delivery(v)
			return nil
		}
	}
	return fmt.Errorf("%w: %q: want %s or %s", ErrDelivery, text, AtLeastOnce, ExactlyOnce)
}

// mode is everything the two delivery modes do differently. New picks one
// from Options.Delivery (atLeastOnce in atleastonce.go, exactlyOnce in
// exactlyonce.go); the rest of the package asks it, never which mode
// runs. Its methods run on the goroutines named in each.
type mode interface {
	// connect creates the client of a connect from opts (exactly once,
	// a transactional session) and publishes it (Worker.publish). It
	// runs on the goroutine running Run.
	connect(opts []kgo.Opt) error
	// loop polls and decides until ctx ends (the poll loop, or the
	// transaction loop). An error means the Kafka session is unusable
	// and must be restarted. It runs on the goroutine running Run.
	loop(ctx context.Context) error
	// opened starts a partition the group just assigned (at least once,
	// its goroutine). It runs in the assignment callback.
	opened(pw *partitionWorker)
	// release stops the partitions tps of the group client cl and
	// returns how many it stopped (Worker.stopPartitions): lost (the
	// session ended) decides nothing more and commits nothing to the
	// group (at least once a last write batch keeps what was acknowledged,
	// settle; exactly once the open transaction's changes are dropped),
	// otherwise (revoked) each commits a last write batch first. It runs
	// in the group callbacks.
	release(ctx context.Context, cl *kgo.Client, tps map[string][]int32, lost bool) int
	// stop ends one partition for stopPartitions, as release says, and
	// closes its done channel once it has ended, or has it closed.
	stop(pw *partitionWorker, abort bool)
	// closing runs at shutdown once every partition has stopped, before
	// the client closes.
	closing(ctx context.Context)
	// batchEnd is the checkpoint a write batch of pw may commit now and
	// the count of records decided up to it: never past a record whose
	// output is not acknowledged (at least once, it waits for the acks)
	// or not committed in a transaction (exactly once). An error (a
	// failed produce) fails the partition. It runs where the loop owns
	// pw (flush).
	batchEnd(pw *partitionWorker) (cp store.Checkpoint, decided int64, err error)
	// committed runs after a write batch of pw committed cp (at least
	// once, the offset is marked for the group commit).
	committed(pw *partitionWorker, cp store.Checkpoint)
	// cutsPerRecord reports whether process cuts a write batch whenever
	// one is due after a record (at least once), rather than the
	// transaction loop between transactions (exactly once).
	cutsPerRecord() bool
	// refused handles out, decided from in, if the broker refused it
	// before (exactly once: in an aborted transaction, txnRejections);
	// handled false leaves it to send. sent false: the partition failed.
	refused(pw *partitionWorker, in, out *kgo.Record, produce func(in, out *kgo.Record)) (handled, sent bool)
	// produceCompressed produces out, which fits its topic only
	// compressed.
	produceCompressed(pw *partitionWorker, in, out *kgo.Record, produce func(in, out *kgo.Record))
	// skipped records that a batch of tp over MaxDecompressBytes was
	// skipped in the current poll (skipRecords).
	skipped(tp store.TopicPartition)
	// offsetsApart reports whether the group's offsets are committed
	// apart from the output, after the write batch that covers them (at
	// least once); exactly once each transaction commits them.
	offsetsApart() bool
}

// newMode returns w's mode for d.
func newMode(w *Worker, d Delivery) mode {
	if d == ExactlyOnce {
		return newExactlyOnce(w)
	}
	return atLeastOnce{w}
}
