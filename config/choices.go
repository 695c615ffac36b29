package config

import (
	"errors"
	"fmt"
)

// errChoice is wrapped by the UnmarshalText of StartOffset and Rebuild for
// a name they do not know; Load reports it with the variable's accepted
// names instead.
var errChoice = errors.New("config: unknown value")

// StartOffset is START_OFFSET: where a partition with no committed offset
// begins when the group has none in its topic either.
type StartOffset uint8

const (
	// StartEarliest reads from the earliest retained offset (the default).
	StartEarliest StartOffset = iota
	// StartLatest reads only records produced after the group starts.
	StartLatest
)

var startOffsetNames = [...]string{StartEarliest: "earliest", StartLatest: "latest"}

// String returns "earliest" or "latest", or "StartOffset(n)".
func (s StartOffset) String() string { return choiceString(startOffsetNames[:], "StartOffset", s) }

// MarshalText returns s.String().
func (s StartOffset) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// UnmarshalText sets s from "earliest" or "latest"; other text returns an
// error and leaves s unchanged.
func (s *StartOffset) UnmarshalText(text []byte) error {
	return choiceParse(startOffsetNames[:], text, s)
}

// Rebuild is REBUILD: what a partition with no local state starts from.
type Rebuild uint8

const (
	// RebuildReplay rebuilds the filter from the earliest retained input up
	// to the group's offset, forwarding nothing (the default).
	RebuildReplay Rebuild = iota
	// RebuildEmpty starts with an empty filter.
	RebuildEmpty
)

var rebuildNames = [...]string{RebuildReplay: "replay", RebuildEmpty: "empty"}

// String returns "replay" or "empty", or "Rebuild(n)".
func (r Rebuild) String() string { return choiceString(rebuildNames[:], "Rebuild", r) }

// MarshalText returns r.String().
func (r Rebuild) MarshalText() ([]byte, error) { return []byte(r.String()), nil }

// UnmarshalText sets r from "replay" or "empty"; other text returns an
// error and leaves r unchanged.
func (r *Rebuild) UnmarshalText(text []byte) error {
	return choiceParse(rebuildNames[:], text, r)
}

func choiceString[T ~uint8](names []string, typeName string, v T) string {
	if int(v) < len(names) {
		return names[v]
	}
	return fmt.Sprintf("%s(%d)", typeName, uint8(v))
}

func choiceParse[T ~uint8](names []string, text []byte, v *T) error {
	for i, name := range names {
		if string(text) == name {
			*v = T(i)
			return nil
		}
	}
	return fmt.Errorf("%w %q", errChoice, text)
}

// choiceReason is the reason reported for a value that is none of the
// names of the given values, in the form users read it:
// "must be earliest or latest".
func choiceReason(values ...fmt.Stringer) string {
	s := "must be "
	for i, v := range values {
		switch {
		case i == 0:
		case i == len(values)-1:
			s += " or "
		default:
			s += ", "
		}
		s += v.String()
	}
	return s
}
