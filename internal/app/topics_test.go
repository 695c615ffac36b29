package app

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/kdedup/kdedup/config"
	"github.com/kdedup/kdedup/consumer"
)

// TestNamed checks that the worker's errors reach the user in
// configuration terms: a topic error names the variable of its topic's
// role in front, matches ErrTopic and keeps its cause; a record error
// names the dead-letter variable; any other error is left as it is.
func TestNamed(t *testing.T) {
	cause := errors.New("UNKNOWN_TOPIC_OR_PARTITION")
	cfg := config.Config{OutputTopic: "o", DuplicatesTopic: "d", DeadLetterTopic: "x"}
	want := map[string]string{"o": "KDEDUP_OUTPUT_TOPIC=o: ", "d": "KDEDUP_DUPLICATES_TOPIC=d: ", "x": "KDEDUP_DEAD_LETTER_TOPIC=x: "}
	targets := targetTopics(cfg)
	if len(targets) != len(want) {
		t.Fatalf("target topics %v, want the three of %+v", targets, cfg)
	}
	for _, tt := range targets {
		err := named(fmt.Errorf("deciding: %w", &consumer.TopicError{Role: tt.Role, Topic: tt.Topic, Err: cause}))
		if !strings.HasPrefix(err.Error(), want[tt.Topic]) {
			t.Errorf("%s topic %s: %q, want it to start with %q", tt.Role, tt.Topic, err, want[tt.Topic])
		}
		if !errors.Is(err, ErrTopic) || !errors.Is(err, cause) {
			t.Errorf("%s topic: %v does not match ErrTopic and its cause", tt.Role, err)
		}
	}
	rec := named(&consumer.RecordError{Topic: "in", Reason: consumer.ReasonTooLarge})
	if !strings.Contains(rec.Error(), "set KDEDUP_DEAD_LETTER_TOPIC") {
		t.Errorf("record error %q does not name KDEDUP_DEAD_LETTER_TOPIC", rec)
	}
	if other := errors.New("other"); named(other) != other {
		t.Errorf("named changed an error of neither kind: %v", named(other))
	}
	if got := targetTopics(config.Config{OutputTopic: "o"}); len(got) != 1 || got[0] != (consumer.TargetTopic{Role: consumer.RoleOutput, Topic: "o"}) {
		t.Errorf("target topics without duplicates or dead letters: %v", got)
	}
}
