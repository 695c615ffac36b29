package consumer

import (
	"errors"
	"fmt"
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
