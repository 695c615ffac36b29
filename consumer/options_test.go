package consumer

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/kdedup/kdedup/internal/optcheck"
)

// Validate checks the options as given and names each problem's field: a
// required field missing, a topic used for two purposes, an unknown
// delivery, a transactional id without exactly once, a negative duration.
func TestOptionsValidate(t *testing.T) {
	valid := Options{Brokers: []string{"kafka:9092"}, InputTopics: []string{"in"}, OutputTopic: "out", Group: "g"}
	for _, tc := range []struct {
		name   string
		mutate func(*Options)
		want   []string
	}{
		{"valid", func(*Options) {}, nil},
		{"no brokers", func(o *Options) { o.Brokers = nil }, []string{"Brokers"}},
		{"no input topics", func(o *Options) { o.InputTopics = nil }, []string{"InputTopics"}},
		{"no output topic", func(o *Options) { o.OutputTopic = "" }, []string{"OutputTopic"}},
		{"an input topic twice", func(o *Options) { o.InputTopics = []string{"in", "in"} }, []string{"InputTopics"}},
		{"the output topic read", func(o *Options) { o.InputTopics = []string{"in", "out"} }, []string{"InputTopics"}},
		{"duplicates to the output", func(o *Options) { o.DuplicatesTopic = "out" }, []string{"DuplicatesTopic"}},
		{"duplicates read", func(o *Options) { o.DuplicatesTopic = "in" }, []string{"DuplicatesTopic"}},
		{"dead letters to the output", func(o *Options) { o.DeadLetterTopic = "out" }, []string{"DeadLetterTopic"}},
		{"dead letters among the duplicates", func(o *Options) { o.DuplicatesTopic, o.DeadLetterTopic = "dup", "dup" }, []string{"DeadLetterTopic"}},
		{"dead letters read", func(o *Options) { o.DeadLetterTopic = "in" }, []string{"DeadLetterTopic"}},
		{"unknown delivery", func(o *Options) { o.Delivery = Delivery(7) }, []string{"Delivery"}},
		{"transactional id at least once", func(o *Options) { o.TransactionalID = "t" }, []string{"TransactionalID"}},
		{"transactional id exactly once", func(o *Options) { o.TransactionalID, o.Delivery = "t", ExactlyOnce }, nil},
		{"negative interval", func(o *Options) { o.FlushInterval = -time.Second }, []string{"FlushInterval"}},
		{"every problem at once", func(o *Options) { o.Brokers, o.OutputTopic, o.SnapshotKeep = nil, "", -1 }, []string{"Brokers", "OutputTopic", "SnapshotKeep"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := valid
			tc.mutate(&o)
			err := o.Validate()
			var got []string
			var oe *optcheck.Error
			if errors.As(err, &oe) {
				for _, p := range oe.Problems {
					got = append(got, p.Field)
				}
			}
			if !slices.Equal(got, tc.want) || (err != nil && !errors.Is(err, ErrInvalidOptions)) {
				t.Errorf("Validate: %v; want problems naming %v (ErrInvalidOptions)", err, tc.want)
			}
		})
	}
}

// The defaults New applies pass Validate in both delivery modes: at least
// once has no transactional id to refuse, exactly once gets one of its
// own.
func TestDefaultsValidate(t *testing.T) {
	for _, d := range []Delivery{AtLeastOnce, ExactlyOnce} {
		o := Options{Brokers: []string{"kafka:9092"}, InputTopics: []string{"in"}, OutputTopic: "out", Delivery: d}.withDefaults()
		if err := o.Validate(); err != nil {
			t.Errorf("%v: the defaults do not validate: %v", d, err)
		}
		if (o.TransactionalID != "") != (d == ExactlyOnce) {
			t.Errorf("%v: default transactional id %q", d, o.TransactionalID)
		}
	}
}
