package consumer

import (
	"reflect"
	"regexp"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// GroupClientOpts gives a client the settings the Options ask for, read
// back from the client franz-go builds from them.
func TestGroupClientOpts(t *testing.T) {
	for _, tc := range []struct {
		name string
		o    Options
		want map[string]any // kgo option name to the value OptValue returns
	}{
		{"at least once, defaults", Options{Brokers: []string{"127.0.0.1:1"}, InputTopics: []string{"a", "b"}, OutputTopic: "out"}, map[string]any{
			"SeedBrokers":             []string{"127.0.0.1:1"},
			"ConsumerGroup":           "kdedup",
			"ConsumeTopics":           map[string]*regexp.Regexp{"a": nil, "b": nil},
			"SessionTimeout":          45 * time.Second,
			"HeartbeatInterval":       3 * time.Second,
			"MetadataMinAge":          time.Second,
			"MetadataMaxAge":          30 * time.Second,
			"BlockRebalanceOnPoll":    true,
			"AlwaysRetryEOF":          true,
			"DefaultProduceTopic":     "out",
			"MaxDecompressBatchBytes": 64 << 20,
			"FetchMaxBytes":           int32(50 << 20), // franz-go's default
			"AutoCommitMarks":         true,
			"AutoCommitInterval":      time.Second,
			"TransactionalID":         "",
		}},
		{"exactly once", Options{Brokers: []string{"127.0.0.1:1"}, InputTopics: []string{"a"}, OutputTopic: "out", Group: "g",
			Delivery: ExactlyOnce, TransactionalID: "tx", SessionTimeout: 6 * time.Second, FlushInterval: 5 * time.Second, InstanceID: "pod-0",
			FetchMaxBytes: 12 << 20}, map[string]any{
			"FetchMaxBytes":      int32(12 << 20),
			"ConsumerGroup":      "g",
			"SessionTimeout":     6 * time.Second,
			"HeartbeatInterval":  2 * time.Second,
			"TransactionalID":    "tx",
			"TransactionTimeout": 4500 * time.Millisecond,
			"InstanceID":         "pod-0",
			"AutoCommitMarks":    false,
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cl, err := kgo.NewClient(tc.o.GroupClientOpts()...)
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			for name, want := range tc.want {
				if got := cl.OptValue(name); !reflect.DeepEqual(got, want) {
					t.Errorf("%s = %#v, want %#v", name, got, want)
				}
			}
		})
	}
}
