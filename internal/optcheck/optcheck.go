// Package optcheck is how kdedup's packages report the options they cannot
// honour: each owner of an Options type (filter.Params, store.Options,
// dedup.Options, consumer.Options, a snapshot URL) validates its own fields
// and returns an *Error listing every problem at once, each naming the
// field by its Go name. config maps those field names to the KDEDUP_*
// variables that set them, so that a rule lives once, with the code that
// depends on it (Pebble's Options.Validate), and the operator still sees
// every bad variable in one message.
package optcheck

import (
	"errors"
	"fmt"
	"strings"
)

// Problem is one field value an owner cannot honour.
type Problem struct {
	// Field is the Options field's Go name ("PageBytes"), or a name the
	// owner documents for a value that is not a field (snapshot's "URL").
	Field string
	// Value is the field's value as the owner saw it (after its defaults).
	Value any
	// Reason says what the value must be, without naming the field: "must
	// be a power of two from 512B to 64KiB". It may name another of the
	// owner's fields by a plain word ("the page size"), never by a
	// variable.
	Reason string
}

// String formats p as "Field Value: Reason".
func (p Problem) String() string { return fmt.Sprintf("%s %v: %s", p.Field, p.Value, p.Reason) }

// Error is every Problem an owner found in its options. It wraps Kind,
// the owner's sentinel (store.ErrInvalidOptions, filter.ErrParams, ...),
// so errors.Is works on it. Not safe for concurrent mutation.
type Error struct {
	Kind     error
	Problems []Problem
}

// Error formats the problems after Kind, "; "-separated.
func (e *Error) Error() string {
	parts := make([]string, len(e.Problems))
	for i, p := range e.Problems {
		parts[i] = p.String()
	}
	return fmt.Sprintf("%v: %s", e.Kind, strings.Join(parts, "; "))
}

// Reasons is the problems' reasons alone, "; "-separated: for a caller
// that names the option itself (a command-line flag, a variable).
func (e *Error) Reasons() string {
	parts := make([]string, len(e.Problems))
	for i, p := range e.Problems {
		parts[i] = p.Reason
	}
	return strings.Join(parts, "; ")
}

// Reasons is err's problems' reasons when err is an *Error, else
// err.Error().
func Reasons(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Reasons()
	}
	return err.Error()
}

// Unwrap returns Kind.
func (e *Error) Unwrap() error { return e.Kind }

// List collects an owner's problems. The zero List has no Kind; New sets
// it. Not safe for concurrent use.
type List struct {
	kind     error
	problems []Problem
}

// New returns an empty List whose Err wraps kind.
func New(kind error) *List { return &List{kind: kind} }

// Add records that field's value cannot be honoured, and why.
func (l *List) Add(field string, value any, reason string) {
	l.problems = append(l.problems, Problem{Field: field, Value: value, Reason: reason})
}

// Has reports whether a problem names field: a rule that relates field to
// another skips while field is itself invalid, so that one mistake is
// reported once.
func (l *List) Has(field string) bool {
	for _, p := range l.problems {
		if p.Field == field {
			return true
		}
	}
	return false
}

// Err returns nil when no problem was added, else an *Error holding them
// in the order added.
func (l *List) Err() error {
	if len(l.problems) == 0 {
		return nil
	}
	return &Error{Kind: l.kind, Problems: l.problems}
}
