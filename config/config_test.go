package config

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kdedup/kdedup/consumer"
)

// required is the smallest valid environment.
func required() map[string]string {
	return map[string]string{
		"KDEDUP_BROKERS":      "kafka-1:9092,kafka-2:9092",
		"KDEDUP_INPUT_TOPICS": "orders,payments",
		"KDEDUP_OUTPUT_TOPIC": "deduped",
	}
}

// with returns required() with kv applied; an empty value deletes the
// variable.
func with(kv ...string) map[string]string {
	environ := required()
	for i := 0; i < len(kv); i += 2 {
		if kv[i+1] == "" {
			delete(environ, kv[i])
			continue
		}
		environ[kv[i]] = kv[i+1]
	}
	return environ
}

func problemsOf(t *testing.T, err error) []Problem {
	t.Helper()
	var cerr *Error
	if !errors.As(err, &cerr) {
		t.Fatalf("error %v (%T) is not *Error", err, err)
	}
	if len(cerr.Problems) == 0 {
		t.Fatal("*Error with no problems")
	}
	return cerr.Problems
}

func TestLoadDefaults(t *testing.T) {
	c, err := LoadFrom(required())
	if err != nil {
		t.Fatalf("LoadFrom: %v", err)
	}
	want := Config{
		Brokers:             []string{"kafka-1:9092", "kafka-2:9092"},
		InputTopics:         []string{"orders", "payments"},
		OutputTopic:         "deduped",
		Group:               "kdedup",
		StartOffset:         StartEarliest,
		MetadataMaxAge:      30 * time.Second,
		SessionTimeout:      45 * time.Second,
		Delivery:            consumer.AtLeastOnce,
		Rebuild:             RebuildReplay,
		Key:                 "",
		DeleteHeader:        "",
		ForwardTombstones:   true,
		MaxOccurrences:      1,
		WindowGenerations:   8,
		TargetFPR:           1e-4,
		BucketSize:          4,
		Capacity:            1_000_000,
		MaxKicks:            500,
		Expansion:           2,
		DataDir:             "./data",
		PageBytes:           4096,
		CacheBytes:          0,
		MemoryBytes:         0,
		FlushInterval:       time.Second,
		TransactionInterval: 100 * time.Millisecond,
		FlushBytes:          8 << 20,
		WriteBackInterval:   time.Minute,
		SnapshotInterval:    2 * time.Minute,
		SnapshotKeep:        3,
		MaxDecompressBytes:  64 << 20,
		HTTPAddr:            ":8080",
		LogLevel:            "info",
		LogFormat:           "json",
		ShutdownTimeout:     70 * time.Second,
	}
	if !reflect.DeepEqual(c, want) {
		t.Errorf("defaults:\n got %+v\nwant %+v", c, want)
	}
	if err := want.Validate(); err != nil {
		t.Errorf("Validate(defaults) = %v", err)
	}
	if _, _, ok := c.DeleteHeaderNameValue(); ok {
		t.Error("DeleteHeaderNameValue() ok with deletes disabled")
	}
	if got := c.SlogLevel(); got != slog.LevelInfo {
		t.Errorf("SlogLevel() = %v, want INFO", got)
	}
}

// An empty variable takes its default, as an unset one does.
func TestLoadEmptyMeansDefault(t *testing.T) {
	environ := required()
	environ["KDEDUP_GROUP"] = ""
	environ["KDEDUP_PAGE_BYTES"] = ""
	c, err := LoadFrom(environ)
	if err != nil {
		t.Fatalf("LoadFrom: %v", err)
	}
	if c.Group != "kdedup" || c.PageBytes != 4*KiB {
		t.Errorf("Group, PageBytes = %q, %v; want kdedup, 4KiB", c.Group, c.PageBytes)
	}
}

func TestLoadValid(t *testing.T) {
	for _, tc := range []struct {
		name  string
		kv    []string
		check func(Config) bool
	}{
		{"broker IPv6", []string{"KDEDUP_BROKERS", "[::1]:9092"}, func(c Config) bool { return c.Brokers[0] == "[::1]:9092" }},
		{"start latest", []string{"KDEDUP_START_OFFSET", "latest"}, func(c Config) bool { return c.StartOffset == StartLatest }},
		{"exactly once", []string{"KDEDUP_DELIVERY", "exactly-once"}, func(c Config) bool { return c.Delivery == consumer.ExactlyOnce }},
		{"rebuild empty", []string{"KDEDUP_REBUILD", "empty"}, func(c Config) bool { return c.Rebuild == RebuildEmpty }},
		{"key literal", []string{"KDEDUP_KEY", "key"}, func(c Config) bool { return c.Key == "key" }},
		{"key header", []string{"KDEDUP_KEY", "header:id"}, func(c Config) bool { return c.Key == "header:id" }},
		{"key json", []string{"KDEDUP_KEY", "json:order.id"}, func(c Config) bool { return c.Key == "json:order.id" }},
		{"fingerprint 8", []string{"KDEDUP_FINGERPRINT_BITS", "8"}, func(c Config) bool { return c.FingerprintBits == 8 }},
		{"fingerprint 32", []string{"KDEDUP_FINGERPRINT_BITS", "32"}, func(c Config) bool { return c.FingerprintBits == 32 }},
		{"fingerprint 12", []string{"KDEDUP_FINGERPRINT_BITS", "12"}, func(c Config) bool { return c.FingerprintBits == 12 }},
		{"target fpr", []string{"KDEDUP_TARGET_FPR", "1e-6"}, func(c Config) bool { return c.TargetFPR == 1e-6 }},
		{"bucket 8", []string{"KDEDUP_BUCKET_SIZE", "8"}, func(c Config) bool { return c.BucketSize == 8 }},
		{"capacity max, with 16KiB pages", []string{"KDEDUP_CAPACITY", "4294967296", "KDEDUP_PAGE_BYTES", "16KiB"}, func(c Config) bool { return c.Capacity == 1<<32 }},
		{"capacity max with 4KiB pages", []string{"KDEDUP_CAPACITY", strconv.FormatUint(filterMaxCapacity(t), 10)}, func(c Config) bool { return c.Capacity == filterMaxCapacity(t) }},
		{"flush bytes max with 512B pages", []string{"KDEDUP_FLUSH_BYTES", "99MiB", "KDEDUP_PAGE_BYTES", "512"}, func(c Config) bool { return c.FlushBytes == 99*MiB }},
		{"shutdown timeout", []string{"KDEDUP_SHUTDOWN_TIMEOUT", "10m"}, func(c Config) bool { return c.ShutdownTimeout == 10*time.Minute }},
		{"liveness derived", []string{"KDEDUP_SESSION_TIMEOUT", "10m"}, func(c Config) bool { return c.Liveness() == 21*time.Minute }},
		{"liveness derived minimum", nil, func(c Config) bool { return c.Liveness() == 5*time.Minute }},
		{"liveness set", []string{"KDEDUP_LIVENESS_TIMEOUT", "90s"}, func(c Config) bool { return c.Liveness() == 90*time.Second }},
		{"kubernetes service links", []string{"KDEDUP_METRICS_SERVICE_HOST", "10.0.0.1", "KDEDUP_METRICS_SERVICE_PORT", "8080",
			"KDEDUP_METRICS_SERVICE_PORT_HTTP", "8080", "KDEDUP_METRICS_PORT", "tcp://10.0.0.1:8080", "KDEDUP_METRICS_PORT_8080_TCP", "tcp://10.0.0.1:8080",
			"KDEDUP_METRICS_PORT_8080_TCP_PROTO", "tcp", "KDEDUP_METRICS_PORT_8080_TCP_PORT", "8080", "KDEDUP_METRICS_PORT_8080_TCP_ADDR", "10.0.0.1",
			"KDEDUP_SERVICE_HOST", "10.0.0.2", "KDEDUP_PORT", "tcp://10.0.0.2:8080"}, func(c Config) bool { return c.Group == "kdedup" }},
		{"page min", []string{"KDEDUP_PAGE_BYTES", "512"}, func(c Config) bool { return c.PageBytes == 512 }},
		{"page max", []string{"KDEDUP_PAGE_BYTES", "64KiB"}, func(c Config) bool { return c.PageBytes == 64*KiB }},
		{"cache exactly 16 pages", []string{"KDEDUP_PAGE_BYTES", "64KiB", "KDEDUP_CACHE_BYTES", "1MiB"}, func(c Config) bool { return c.CacheBytes == MiB }},
		{"flush bytes max", []string{"KDEDUP_FLUSH_BYTES", "128 MiB"}, func(c Config) bool { return c.FlushBytes == 128*MiB }},
		{"flush interval min", []string{"KDEDUP_FLUSH_INTERVAL", "10ms"}, func(c Config) bool { return c.FlushInterval == 10*time.Millisecond }},
		{"snapshot s3", []string{"KDEDUP_SNAPSHOT_URL", "s3://bucket/kdedup?region=eu-west-1&endpoint=http://127.0.0.1:9000&use_path_style=true"}, func(c Config) bool { return strings.HasPrefix(c.SnapshotURL, "s3://bucket/") }},
		{"snapshot file", []string{"KDEDUP_SNAPSHOT_URL", "file:///snapshots", "KDEDUP_SNAPSHOT_INTERVAL", "1s", "KDEDUP_SNAPSHOT_KEEP", "1"}, func(c Config) bool { return c.SnapshotInterval == time.Second && c.SnapshotKeep == 1 }},
		{"delete header", []string{"KDEDUP_DELETE_HEADER", "op=delete"}, func(c Config) bool {
			n, v, ok := c.DeleteHeaderNameValue()
			return ok && n == "op" && v == "delete"
		}},
		{"delete header empty value", []string{"KDEDUP_DELETE_HEADER", "deleted="}, func(c Config) bool {
			n, v, ok := c.DeleteHeaderNameValue()
			return ok && n == "deleted" && v == ""
		}},
		{"delete header value with =", []string{"KDEDUP_DELETE_HEADER", "op=a=b"}, func(c Config) bool {
			n, v, ok := c.DeleteHeaderNameValue()
			return ok && n == "op" && v == "a=b"
		}},
		{"tombstones off", []string{"KDEDUP_FORWARD_TOMBSTONES", "false"}, func(c Config) bool { return !c.ForwardTombstones }},
		{"max occurrences 2*b", []string{"KDEDUP_MAX_OCCURRENCES", "8"}, func(c Config) bool { return c.MaxOccurrences == 8 }},
		{"instance id", []string{"KDEDUP_INSTANCE_ID", "kdedup-0"}, func(c Config) bool { return c.InstanceID == "kdedup-0" }},
		{"tls", []string{"KDEDUP_TLS_ENABLED", "true", "KDEDUP_TLS_CA_FILE", "/ca.pem", "KDEDUP_TLS_CERT_FILE", "/c.pem", "KDEDUP_TLS_KEY_FILE", "/k.pem", "KDEDUP_TLS_SERVER_NAME", "kafka"}, func(c Config) bool {
			return c.TLSEnabled && c.TLSCAFile == "/ca.pem" && c.TLSCertFile == "/c.pem" && c.TLSKeyFile == "/k.pem" && c.TLSServerName == "kafka"
		}},
		{"sasl scram, mechanism in lower case", []string{"KDEDUP_SASL_MECHANISM", "scram-sha-512", "KDEDUP_SASL_USERNAME", "u", "KDEDUP_SASL_PASSWORD", "p"}, func(c Config) bool {
			return c.SASLMechanismName() == "SCRAM-SHA-512" && c.SASLUsername == "u" && c.SASLSecret() == "p"
		}},
		{"window", []string{"KDEDUP_WINDOW", "24h", "KDEDUP_WINDOW_GENERATIONS", "24", "KDEDUP_WINDOW_REFRESH", "true"}, func(c Config) bool {
			return c.Window == 24*time.Hour && c.WindowGenerations == 24 && c.WindowRefresh
		}},
		{"window one second per generation", []string{"KDEDUP_WINDOW", "64s", "KDEDUP_WINDOW_GENERATIONS", "64"}, func(c Config) bool { return c.Window == 64*time.Second }},
		{"max occurrences 2*b, b=8", []string{"KDEDUP_MAX_OCCURRENCES", "16", "KDEDUP_BUCKET_SIZE", "8"}, func(c Config) bool { return c.MaxOccurrences == 16 }},
		{"max occurrences 2*b, b=2", []string{"KDEDUP_MAX_OCCURRENCES", "4", "KDEDUP_BUCKET_SIZE", "2"}, func(c Config) bool { return c.MaxOccurrences == 4 }},
		{"duplicates topic", []string{"KDEDUP_DUPLICATES_TOPIC", "orders.dropped"}, func(c Config) bool { return c.DuplicatesTopic == "orders.dropped" }},
		{"dead letter topic", []string{"KDEDUP_DEAD_LETTER_TOPIC", "orders.dead"}, func(c Config) bool { return c.DeadLetterTopic == "orders.dead" }},
		{"max record bytes", []string{"KDEDUP_MAX_RECORD_BYTES", "4MiB"}, func(c Config) bool { return c.MaxRecordBytes == 4*MiB }},
		{"max decompress bytes", []string{"KDEDUP_MAX_DECOMPRESS_BYTES", "256MiB"}, func(c Config) bool { return c.MaxDecompressBytes == 256*MiB }},
		{"session max", []string{"KDEDUP_SESSION_TIMEOUT", "30m"}, func(c Config) bool { return c.SessionTimeout == 30*time.Minute }},
		{"metadata max age", []string{"KDEDUP_METADATA_MAX_AGE", "5s"}, func(c Config) bool { return c.MetadataMaxAge == 5*time.Second }},
		{"http port 0", []string{"KDEDUP_HTTP_ADDR", "127.0.0.1:0"}, func(c Config) bool { return c.HTTPAddr == "127.0.0.1:0" }},
		{"log level upper", []string{"KDEDUP_LOG_LEVEL", "DEBUG"}, func(c Config) bool { return c.SlogLevel() == slog.LevelDebug }},
		{"log level warn", []string{"KDEDUP_LOG_LEVEL", "warn"}, func(c Config) bool { return c.SlogLevel() == slog.LevelWarn }},
		{"log level error", []string{"KDEDUP_LOG_LEVEL", "Error"}, func(c Config) bool { return c.SlogLevel() == slog.LevelError }},
		{"log text", []string{"KDEDUP_LOG_FORMAT", "text"}, func(c Config) bool { return c.LogFormat == "text" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := LoadFrom(with(tc.kv...))
			if err != nil {
				t.Fatalf("LoadFrom: %v", err)
			}
			if !tc.check(c) {
				t.Errorf("unexpected config %+v", c)
			}
		})
	}
}

// Each bad value yields problems that name exactly its variable.
func TestLoadRejects(t *testing.T) {
	for _, tc := range []struct {
		name  string
		env   string
		value string // "" unsets
	}{
		{"brokers unset", "KDEDUP_BROKERS", ""},
		{"brokers empty entry", "KDEDUP_BROKERS", "a:9092,,b:9092"},
		{"brokers no port", "KDEDUP_BROKERS", "kafka"},
		{"brokers no host", "KDEDUP_BROKERS", ":9092"},
		{"brokers port 0", "KDEDUP_BROKERS", "kafka:0"},
		{"brokers port range", "KDEDUP_BROKERS", "kafka:70000"},
		{"brokers space", "KDEDUP_BROKERS", "a:9092, b:9092"},
		{"input unset", "KDEDUP_INPUT_TOPICS", ""},
		{"input empty entry", "KDEDUP_INPUT_TOPICS", "a,,b"},
		{"input duplicate", "KDEDUP_INPUT_TOPICS", "a,b,a"},
		{"input contains output", "KDEDUP_INPUT_TOPICS", "a,deduped"},
		{"input illegal name", "KDEDUP_INPUT_TOPICS", "a b"},
		{"input dot", "KDEDUP_INPUT_TOPICS", ".."},
		{"input too long", "KDEDUP_INPUT_TOPICS", strings.Repeat("t", 250)},
		{"output unset", "KDEDUP_OUTPUT_TOPIC", ""},
		{"output illegal", "KDEDUP_OUTPUT_TOPIC", "out/put"},
		{"duplicates is output", "KDEDUP_DUPLICATES_TOPIC", "deduped"},
		{"duplicates is input", "KDEDUP_DUPLICATES_TOPIC", "payments"},
		{"duplicates illegal", "KDEDUP_DUPLICATES_TOPIC", "dropped records"},
		{"dead letter is output", "KDEDUP_DEAD_LETTER_TOPIC", "deduped"},
		{"dead letter is input", "KDEDUP_DEAD_LETTER_TOPIC", "payments"},
		{"dead letter illegal", "KDEDUP_DEAD_LETTER_TOPIC", "dead letters"},
		{"max record bytes low", "KDEDUP_MAX_RECORD_BYTES", "511"},
		{"max record bytes high", "KDEDUP_MAX_RECORD_BYTES", "2GiB"},
		{"max decompress bytes low", "KDEDUP_MAX_DECOMPRESS_BYTES", "64KiB"},
		{"max decompress bytes high", "KDEDUP_MAX_DECOMPRESS_BYTES", "2GiB"},
		{"start offset", "KDEDUP_START_OFFSET", "newest"},
		{"session parse", "KDEDUP_SESSION_TIMEOUT", "45"},
		{"session low", "KDEDUP_SESSION_TIMEOUT", "900ms"},
		{"delivery unknown", "KDEDUP_DELIVERY", "exactly-twice"},
		{"rebuild unknown", "KDEDUP_REBUILD", "full"},
		{"transactional id without exactly-once", "KDEDUP_TRANSACTIONAL_ID", "kdedup-0"},
		{"session high", "KDEDUP_SESSION_TIMEOUT", "31m"},
		{"key unknown", "KDEDUP_KEY", "value"},
		{"key header empty", "KDEDUP_KEY", "header:"},
		{"key json empty", "KDEDUP_KEY", "json:"},
		{"delete header no =", "KDEDUP_DELETE_HEADER", "op"},
		{"delete header empty name", "KDEDUP_DELETE_HEADER", "=delete"},
		{"tombstones parse", "KDEDUP_FORWARD_TOMBSTONES", "maybe"},
		{"max occurrences 0", "KDEDUP_MAX_OCCURRENCES", "0"},
		{"window negative", "KDEDUP_WINDOW", "-1h"},
		{"window shorter than a second per generation", "KDEDUP_WINDOW", "7s"},
		{"window parse", "KDEDUP_WINDOW", "a day"},
		{"window generations 0", "KDEDUP_WINDOW_GENERATIONS", "0"},
		{"window generations above 64", "KDEDUP_WINDOW_GENERATIONS", "65"},
		{"window refresh without a window", "KDEDUP_WINDOW_REFRESH", "true"},
		{"max occurrences negative", "KDEDUP_MAX_OCCURRENCES", "-2"},
		{"max occurrences above 2*b", "KDEDUP_MAX_OCCURRENCES", "9"},
		{"max occurrences parse", "KDEDUP_MAX_OCCURRENCES", "three"},
		{"fingerprint parse", "KDEDUP_FINGERPRINT_BITS", "abc"},
		{"fingerprint 3", "KDEDUP_FINGERPRINT_BITS", "3"},
		{"fingerprint 64", "KDEDUP_FINGERPRINT_BITS", "64"},
		{"target fpr zero", "KDEDUP_TARGET_FPR", "0"},
		{"target fpr one", "KDEDUP_TARGET_FPR", "1"},
		{"target fpr parse", "KDEDUP_TARGET_FPR", "often"},
		{"bucket 3", "KDEDUP_BUCKET_SIZE", "3"},
		{"bucket 16", "KDEDUP_BUCKET_SIZE", "16"},
		{"capacity 0", "KDEDUP_CAPACITY", "0"},
		{"capacity high", "KDEDUP_CAPACITY", "4294967297"},
		{"capacity negative", "KDEDUP_CAPACITY", "-1"},
		{"capacity overflow", "KDEDUP_CAPACITY", "18446744073709551616"},
		{"kicks 0", "KDEDUP_MAX_KICKS", "0"},
		{"kicks high", "KDEDUP_MAX_KICKS", "100001"},
		{"expansion 0", "KDEDUP_EXPANSION", "0"},
		{"expansion high", "KDEDUP_EXPANSION", "65"},
		{"page not power of two", "KDEDUP_PAGE_BYTES", "3000"},
		{"page SI unit", "KDEDUP_PAGE_BYTES", "4KB"},
		{"page low", "KDEDUP_PAGE_BYTES", "256"},
		{"page high", "KDEDUP_PAGE_BYTES", "128KiB"},
		{"page parse", "KDEDUP_PAGE_BYTES", "4 pages"},
		{"cache below 16 pages", "KDEDUP_CACHE_BYTES", "63KiB"},
		{"flush interval low", "KDEDUP_FLUSH_INTERVAL", "9ms"},
		{"flush interval high", "KDEDUP_FLUSH_INTERVAL", "61m"},
		{"write-back interval low", "KDEDUP_WRITE_BACK_INTERVAL", "999ms"},
		{"write-back interval high", "KDEDUP_WRITE_BACK_INTERVAL", "61m"},
		{"snapshot scheme", "KDEDUP_SNAPSHOT_URL", "http://bucket/prefix"},
		{"snapshot interval low", "KDEDUP_SNAPSHOT_INTERVAL", "999ms"},
		{"snapshot interval high", "KDEDUP_SNAPSHOT_INTERVAL", "25h"},
		{"snapshot keep 0", "KDEDUP_SNAPSHOT_KEEP", "0"},
		{"snapshot keep high", "KDEDUP_SNAPSHOT_KEEP", "1001"},
		{"flush bytes below page", "KDEDUP_FLUSH_BYTES", "2KiB"},
		{"flush bytes high", "KDEDUP_FLUSH_BYTES", "129MiB"},
		{"http no port", "KDEDUP_HTTP_ADDR", "localhost"},
		{"http bad port", "KDEDUP_HTTP_ADDR", ":http"},
		{"http port range", "KDEDUP_HTTP_ADDR", ":65536"},
		{"log level", "KDEDUP_LOG_LEVEL", "trace"},
		{"log format", "KDEDUP_LOG_FORMAT", "logfmt"},
		{"log format case", "KDEDUP_LOG_FORMAT", "JSON"},
		{"instance id illegal", "KDEDUP_INSTANCE_ID", "pod 0"},
		{"tls file without tls", "KDEDUP_TLS_CA_FILE", "/etc/ca.pem"},
		{"tls server name without tls", "KDEDUP_TLS_SERVER_NAME", "kafka"},
		{"sasl mechanism unknown", "KDEDUP_SASL_MECHANISM", "GSSAPI"},
		{"sasl user without mechanism", "KDEDUP_SASL_USERNAME", "kdedup"},
		{"sasl password file missing", "KDEDUP_SASL_PASSWORD_FILE", "/nonexistent/kdedup/password"},
		{"capacity above what 2^20 pages hold", "KDEDUP_CAPACITY", "4294967296"},
		{"shutdown timeout 0", "KDEDUP_SHUTDOWN_TIMEOUT", "0s"},
		{"shutdown timeout high", "KDEDUP_SHUTDOWN_TIMEOUT", "2h"},
		{"liveness timeout low", "KDEDUP_LIVENESS_TIMEOUT", "5s"},
		{"liveness timeout under 2*session", "KDEDUP_LIVENESS_TIMEOUT", "80s"},
		{"liveness timeout high", "KDEDUP_LIVENESS_TIMEOUT", "3h"},
		{"unknown variable", "KDEDUP_DELIVER", "exactly-once"},
		{"unknown variable, far from any", "KDEDUP_FROBNICATE", "1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := LoadFrom(with(tc.env, tc.value))
			if err == nil {
				t.Fatalf("LoadFrom accepted %s=%q: %+v", tc.env, tc.value, c)
			}
			if !reflect.DeepEqual(c, Config{}) {
				t.Errorf("LoadFrom returned a non-zero Config with an error: %+v", c)
			}
			for _, p := range problemsOf(t, err) {
				if p.Var != tc.env {
					t.Errorf("problem names %s, want %s: %v", p.Var, tc.env, p)
				}
				if p.Value != tc.value {
					t.Errorf("problem value %q, want %q as written: %v", p.Value, tc.value, p)
				}
				if p.Reason == "" {
					t.Errorf("problem without a reason: %v", p)
				}
			}
		})
	}
}

// Validate on a hand-built Config reports the same rules, with values
// formatted from the Config, and catches what the environment cannot
// express (an empty GROUP or DATA_DIR).
func TestValidate(t *testing.T) {
	valid, err := LoadFrom(required())
	if err != nil {
		t.Fatalf("LoadFrom: %v", err)
	}
	for _, tc := range []struct {
		name   string
		mutate func(*Config)
		env    string
		value  string
	}{
		{"group empty", func(c *Config) { c.Group = "" }, "KDEDUP_GROUP", ""},
		{"data dir empty", func(c *Config) { c.DataDir = "" }, "KDEDUP_DATA_DIR", ""},
		{"http empty", func(c *Config) { c.HTTPAddr = "" }, "KDEDUP_HTTP_ADDR", ""},
		{"brokers nil", func(c *Config) { c.Brokers = nil }, "KDEDUP_BROKERS", ""},
		{"page bytes", func(c *Config) { c.PageBytes = 3000 }, "KDEDUP_PAGE_BYTES", "3000B"},
		{"cache bytes", func(c *Config) { c.CacheBytes = 32 * KiB }, "KDEDUP_CACHE_BYTES", "32KiB"},
		{"flush interval", func(c *Config) { c.FlushInterval = 2 * time.Hour }, "KDEDUP_FLUSH_INTERVAL", "2h0m0s"},
		{"write-back interval below the flush interval", func(c *Config) { c.FlushInterval = 2 * time.Minute }, "KDEDUP_WRITE_BACK_INTERVAL", "1m0s"},
		{"session timeout", func(c *Config) { c.SessionTimeout = 500 * time.Millisecond }, "KDEDUP_SESSION_TIMEOUT", "500ms"},
		{"metadata max age", func(c *Config) { c.MetadataMaxAge = 2 * time.Hour }, "KDEDUP_METADATA_MAX_AGE", "2h0m0s"},
		{"input topics", func(c *Config) { c.InputTopics = []string{"a", "a"} }, "KDEDUP_INPUT_TOPICS", "a,a"},
		{"max occurrences", func(c *Config) { c.BucketSize = 2; c.MaxOccurrences = 5 }, "KDEDUP_MAX_OCCURRENCES", "5"},
		{"duplicates topic", func(c *Config) { c.DuplicatesTopic = c.InputTopics[0] }, "KDEDUP_DUPLICATES_TOPIC", "orders"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := valid
			c.Brokers = slices.Clone(valid.Brokers)
			c.InputTopics = slices.Clone(valid.InputTopics)
			tc.mutate(&c)
			ps := problemsOf(t, c.Validate())
			if len(ps) != 1 || ps[0].Var != tc.env || ps[0].Value != tc.value {
				t.Errorf("problems %v, want one for %s=%q", ps, tc.env, tc.value)
			}
		})
	}
	if err := (Config{}).Validate(); err == nil {
		t.Error("zero Config is valid")
	}
}

// Parse errors, missing required variables and broken rules are all
// reported together, in field order, each once.
func TestLoadReportsEveryProblem(t *testing.T) {
	environ := required()
	delete(environ, "KDEDUP_BROKERS")
	maps.Copy(environ, map[string]string{
		"KDEDUP_FINGERPRINT_BITS": "abc",
		"KDEDUP_BUCKET_SIZE":      "3",
		"KDEDUP_FLUSH_INTERVAL":   "soon",
		"KDEDUP_PAGE_BYTES":       "12XB",
		"KDEDUP_LOG_FORMAT":       "xml",
		"KDEDUP_INPUT_TOPICS":     "a,deduped",
	})
	_, err := LoadFrom(environ)
	var got []string
	for _, p := range problemsOf(t, err) {
		got = append(got, p.Var+"="+p.Value)
	}
	want := []string{
		"KDEDUP_BROKERS=",
		"KDEDUP_INPUT_TOPICS=a,deduped",
		"KDEDUP_FINGERPRINT_BITS=abc",
		"KDEDUP_BUCKET_SIZE=3",
		"KDEDUP_PAGE_BYTES=12XB",
		"KDEDUP_FLUSH_INTERVAL=soon",
		"KDEDUP_LOG_FORMAT=xml",
	}
	if !slices.Equal(got, want) {
		t.Errorf("problems:\n got %q\nwant %q", got, want)
	}

	msg := err.Error()
	for _, line := range []string{
		`KDEDUP_BROKERS="": required`,
		"KDEDUP_FINGERPRINT_BITS=abc: must be an integer",
		"KDEDUP_BUCKET_SIZE=3: must be 2, 4 or 8",
		"KDEDUP_PAGE_BYTES=12XB: " + byteSizeParseReason,
	} {
		if !slices.Contains(strings.Split(msg, "\n"), line) {
			t.Errorf("error message lacks line %q:\n%s", line, msg)
		}
	}
	if n := strings.Count(msg, "\n") + 1; n != len(want) {
		t.Errorf("error message has %d lines, want %d:\n%s", n, len(want), msg)
	}
}

// A rule relating two variables is not applied while the other is invalid,
// so one mistake yields one problem.
func TestLoadNoKnockOnProblems(t *testing.T) {
	for _, tc := range []struct {
		name string
		kv   []string
		want string
	}{
		// 1GiB pages would make the default cache and flush sizes too small.
		{"page too big", []string{"KDEDUP_PAGE_BYTES", "1GiB"}, "KDEDUP_PAGE_BYTES"},
		{"page unparsable", []string{"KDEDUP_PAGE_BYTES", "big"}, "KDEDUP_PAGE_BYTES"},
		{"output illegal", []string{"KDEDUP_OUTPUT_TOPIC", "a b", "KDEDUP_INPUT_TOPICS", "a b"}, ""},
		// MAX_OCCURRENCES=9 is within 2*BUCKET_SIZE for some valid bucket size.
		{"bucket invalid", []string{"KDEDUP_BUCKET_SIZE", "5", "KDEDUP_MAX_OCCURRENCES", "9"}, "KDEDUP_BUCKET_SIZE"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := LoadFrom(with(tc.kv...))
			ps := problemsOf(t, err)
			if tc.want != "" && (len(ps) != 1 || ps[0].Var != tc.want) {
				t.Errorf("problems %v, want one for %s", ps, tc.want)
			}
			for _, p := range ps {
				if strings.Contains(p.Reason, "also the output topic") {
					t.Errorf("unexpected cross-variable problem %v", p)
				}
			}
		})
	}
}

func TestLoadFromNilIsEmpty(t *testing.T) {
	t.Setenv("KDEDUP_BROKERS", "kafka:9092")
	t.Setenv("KDEDUP_INPUT_TOPICS", "in")
	t.Setenv("KDEDUP_OUTPUT_TOPIC", "out")
	if _, err := LoadFrom(nil); err == nil {
		t.Error("LoadFrom(nil) read the process environment")
	}
	c, err := Load()
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if c.OutputTopic != "out" {
		t.Errorf("Load().OutputTopic = %q, want out", c.OutputTopic)
	}
}

func TestByteSizeUnmarshalText(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    ByteSize
		wantErr bool
	}{
		{in: "0", want: 0},
		{in: "4096", want: 4096},
		{in: "8388608", want: 8 * MiB},
		{in: "4KiB", want: 4 * KiB},
		{in: "4kib", want: 4 * KiB},
		{in: "4Ki", want: 4 * KiB},
		{in: "8MiB", want: 8 * MiB},
		{in: "256 MiB", want: 256 * MiB},
		{in: "1GiB", want: GiB},
		{in: "1 GB", want: 1_000_000_000},
		{in: "4KB", want: 4000},
		{in: "1.5KiB", want: 1536},
		{in: "1,024", want: 1024},
		{in: "12XB", wantErr: true},
		{in: "", wantErr: true},
		{in: "-1", wantErr: true},
		{in: "MiB", wantErr: true},
		{in: "9EiB", wantErr: true},
	} {
		t.Run(tc.in, func(t *testing.T) {
			var b ByteSize
			err := b.UnmarshalText([]byte(tc.in))
			if tc.wantErr {
				if err == nil {
					t.Errorf("UnmarshalText(%q) = %v, want an error", tc.in, b)
				}
				return
			}
			if err != nil {
				t.Fatalf("UnmarshalText(%q): %v", tc.in, err)
			}
			if b != tc.want {
				t.Errorf("UnmarshalText(%q) = %d, want %d", tc.in, b, tc.want)
			}
		})
	}
}

func TestByteSizeString(t *testing.T) {
	for _, tc := range []struct {
		in   ByteSize
		want string
	}{
		{0, "0B"},
		{512, "512B"},
		{4 * KiB, "4KiB"},
		{1536, "1536B"},
		{3 * MiB / 2, "1536KiB"},
		{256 * MiB, "256MiB"},
		{GiB, "1GiB"},
		{1_000_000_000, "1000000000B"},
	} {
		t.Run(tc.want, func(t *testing.T) {
			if got := tc.in.String(); got != tc.want {
				t.Errorf("String() = %q, want %q", got, tc.want)
			}
			var back ByteSize
			if err := back.UnmarshalText([]byte(tc.in.String())); err != nil || back != tc.in {
				t.Errorf("round trip of %d: %v, %v", tc.in, back, err)
			}
		})
	}
}

func TestTable(t *testing.T) {
	rows := Config{}.Table()
	if n := reflect.TypeFor[Config]().NumField(); len(rows) != n {
		t.Fatalf("Table has %d rows, Config has %d fields", len(rows), n)
	}
	seen := map[string]bool{}
	for _, r := range rows {
		if !strings.HasPrefix(r[0], Prefix) || seen[r[0]] {
			t.Errorf("bad or repeated variable %q", r[0])
		}
		seen[r[0]] = true
		if r[2] == "" {
			t.Errorf("%s has no doc", r[0])
		}
	}
	for _, want := range [][2]string{
		{"KDEDUP_BROKERS", "(required)"},
		{"KDEDUP_BUCKET_SIZE", "4"},
		{"KDEDUP_PAGE_BYTES", "4KiB"},
		{"KDEDUP_KEY", ""},
	} {
		i := slices.IndexFunc(rows, func(r [3]string) bool { return r[0] == want[0] })
		if i < 0 {
			t.Errorf("no row for %s", want[0])
		} else if rows[i][1] != want[1] {
			t.Errorf("row for %s: %q, want default %q", want[0], rows[i], want[1])
		}
	}
	// Setting every variable the table names to its listed default must
	// change nothing: the table names the variables env reads.
	defaults, err := LoadFrom(required())
	if err != nil {
		t.Fatalf("LoadFrom: %v", err)
	}
	environ := required()
	for _, r := range rows {
		if r[1] != "(required)" && r[1] != "" {
			environ[r[0]] = r[1]
		}
	}
	explicit, err := LoadFrom(environ)
	if err != nil {
		t.Fatalf("LoadFrom(table defaults): %v", err)
	}
	if !reflect.DeepEqual(explicit, defaults) {
		t.Errorf("table defaults give %+v, want %+v", explicit, defaults)
	}
}

func TestFormatDuration(t *testing.T) {
	for _, tc := range []struct {
		in   time.Duration
		want string
	}{
		{10 * time.Millisecond, "10ms"},
		{6 * time.Second, "6s"},
		{10 * time.Second, "10s"},
		{30 * time.Minute, "30m"},
		{time.Hour, "1h"},
		{90 * time.Minute, "1h30m"},
		{time.Hour + time.Second, "1h0m1s"},
	} {
		t.Run(tc.want, func(t *testing.T) {
			if got := formatDuration(tc.in); got != tc.want {
				t.Errorf("formatDuration(%v) = %q, want %q", tc.in, got, tc.want)
			}
		})
	}
}

func TestProblemString(t *testing.T) {
	for _, tc := range []struct {
		p    Problem
		want string
	}{
		{Problem{"KDEDUP_BUCKET_SIZE", "3", "must be 2, 4 or 8"}, "KDEDUP_BUCKET_SIZE=3: must be 2, 4 or 8"},
		{Problem{"KDEDUP_BROKERS", "", "required"}, `KDEDUP_BROKERS="": required`},
		{Problem{"KDEDUP_BROKERS", "a:1, b:2", "x"}, `KDEDUP_BROKERS="a:1, b:2": x`},
		{Problem{"KDEDUP_KEY", "json:", "x"}, `KDEDUP_KEY="json:": x`},
	} {
		t.Run(tc.want, func(t *testing.T) {
			if got := tc.p.String(); got != tc.want {
				t.Errorf("String() = %q, want %q", got, tc.want)
			}
		})
	}
}

// The limit's problem names the variable and the bound it exceeds, which
// depends on BUCKET_SIZE.
func TestMaxOccurrencesMessage(t *testing.T) {
	for _, tc := range []struct {
		kv   []string
		want string
	}{
		{[]string{"KDEDUP_MAX_OCCURRENCES", "9"}, "KDEDUP_MAX_OCCURRENCES=9: must be at most twice the bucket size, 8"},
		{[]string{"KDEDUP_MAX_OCCURRENCES", "5", "KDEDUP_BUCKET_SIZE", "2"}, "KDEDUP_MAX_OCCURRENCES=5: must be at most twice the bucket size, 4"},
		{[]string{"KDEDUP_MAX_OCCURRENCES", "0"}, "KDEDUP_MAX_OCCURRENCES=0: must be at least 1"},
	} {
		_, err := LoadFrom(with(tc.kv...))
		if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("LoadFrom(%v): %v; want a problem starting %q", tc.kv, err, tc.want)
		}
	}
}

// TestSASLSecrets: a password is never printed in a problem; one read from
// a file loses one trailing newline, and a problem shows the file's path.
func TestSASLSecrets(t *testing.T) {
	dir := t.TempDir()
	file := dir + "/password"
	if err := os.WriteFile(file, []byte("s3cret pass\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := LoadFrom(with("KDEDUP_SASL_MECHANISM", "PLAIN", "KDEDUP_SASL_USERNAME", "kdedup", "KDEDUP_SASL_PASSWORD_FILE", file))
	if err != nil {
		t.Fatal(err)
	}
	if got := c.SASLSecret(); got != "s3cret pass" {
		t.Fatalf("password from file %q, want %q", got, "s3cret pass")
	}

	for _, tc := range []struct {
		env       []string
		wantVar   string
		wantValue string
	}{
		{[]string{"KDEDUP_SASL_PASSWORD", "hunter2"}, "KDEDUP_SASL_PASSWORD", "(hidden)"},
		{[]string{"KDEDUP_SASL_MECHANISM", "PLAIN", "KDEDUP_SASL_USERNAME", "u", "KDEDUP_SASL_PASSWORD", "hunter2", "KDEDUP_SASL_PASSWORD_FILE", file}, "KDEDUP_SASL_PASSWORD_FILE", file},
		{[]string{"KDEDUP_SASL_MECHANISM", "PLAIN", "KDEDUP_SASL_USERNAME", "u"}, "KDEDUP_SASL_PASSWORD", ""},
		{[]string{"KDEDUP_SASL_MECHANISM", "PLAIN", "KDEDUP_SASL_PASSWORD", "hunter2"}, "KDEDUP_SASL_USERNAME", ""},
		{[]string{"KDEDUP_TLS_ENABLED", "true", "KDEDUP_TLS_CERT_FILE", "/c.pem"}, "KDEDUP_TLS_KEY_FILE", ""},
	} {
		_, err := LoadFrom(with(tc.env...))
		ps := problemsOf(t, err)
		if len(ps) != 1 || ps[0].Var != tc.wantVar || ps[0].Value != tc.wantValue {
			t.Errorf("%v: problems %v, want one for %s=%q", tc.env, ps, tc.wantVar, tc.wantValue)
		}
		if strings.Contains(err.Error(), "hunter2") || strings.Contains(err.Error(), "s3cret") {
			t.Errorf("%v: the error shows the password: %v", tc.env, err)
		}
	}
	// Validate on a hand-built Config hides it too.
	c.SASLPassword = "hunter2"
	if err := c.Validate(); err == nil || strings.Contains(err.Error(), "hunter2") || strings.Contains(err.Error(), "s3cret") {
		t.Errorf("Validate: %v", err)
	}
}

// TestCredentialsNeverShown: a URL-like value that carries a password,
// whether it parses or not, is reported naming its variable with the
// password (and, where the URL does not say where its user info ends,
// everything from its authority to its last '@') replaced by xxxxx; the
// reason never quotes the value either (url.Parse's messages do, and an
// "invalid port" is then part of the password). Validate on a hand-built
// Config, as internal/app calls it, shows the same.
func TestCredentialsNeverShown(t *testing.T) {
	const pass = "s3cr3tpass"
	const (
		mustBeURL   = "must be a URL: it "
		scheme      = "must start with s3://, gs://, azblob:// or file://"
		credentials = "must not hold credentials: the store's SDK reads them from its usual sources (environment, files, pod identity)"
	)
	for _, tc := range []struct {
		name, env, value string
		wantValue        string
		wantReason       string
	}{
		{"wrong scheme", "KDEDUP_SNAPSHOT_URL", "https://AKIAIOSFODNN7EXAMPLE:" + pass + "@s3.eu-west-1.amazonaws.com/bucket",
			"https://AKIAIOSFODNN7EXAMPLE:xxxxx@s3.eu-west-1.amazonaws.com/bucket", scheme},
		{"bad escape in the path", "KDEDUP_SNAPSHOT_URL", "s3://AKIAIOSFODNN7EXAMPLE:" + pass + "@bucket/%zz",
			"s3://xxxxx@bucket/%zz", mustBeURL + "has a '%' not followed by two hexadecimal digits (write a literal '%' as %25)"},
		{"bad escape in the password", "KDEDUP_SNAPSHOT_URL", "s3://AKIA:s3cr3t%zzpass@bucket/prefix",
			"s3://xxxxx@bucket/prefix", mustBeURL + "has a '%' not followed by two hexadecimal digits (write a literal '%' as %25)"},
		{"slash in the password", "KDEDUP_SNAPSHOT_URL", "s3://AKIA:s3cr3t/pass@bucket/prefix",
			"s3://xxxxx@bucket/prefix", mustBeURL + "has a host followed by ':' and something other than a port number"},
		{"space in the password", "KDEDUP_SNAPSHOT_URL", "s3://AKIA:s3cr3t pass@bucket/prefix",
			"s3://xxxxx@bucket/prefix", mustBeURL + "has characters before '@' that a user name or password may not hold unescaped"},
		{"newline in the password", "KDEDUP_SNAPSHOT_URL", "s3://AKIA:s3cr3t\npass@bucket/prefix",
			"s3://xxxxx@bucket/prefix", mustBeURL + "holds a control character, such as a newline"},
		{"no scheme", "KDEDUP_SNAPSHOT_URL", "//AKIA:" + pass + "@bucket/prefix",
			"//AKIA:xxxxx@bucket/prefix", scheme},
		{"leading space", "KDEDUP_SNAPSHOT_URL", " s3://AKIA:" + pass + "@bucket/prefix",
			" s3://xxxxx@bucket/prefix", mustBeURL + "has a ':' before its first '/' but no valid scheme before it"},
		{"without //", "KDEDUP_SNAPSHOT_URL", "s3:AKIA:" + pass + "@bucket/prefix",
			"s3:xxxxx@bucket/prefix", scheme},
		{"user and password", "KDEDUP_SNAPSHOT_URL", "s3://AKIA:" + pass + "@bucket/prefix?region=eu-west-1",
			"s3://AKIA:xxxxx@bucket/prefix?region=eu-west-1", credentials},
		{"token as user name", "KDEDUP_SNAPSHOT_URL", "gs://" + pass + "@bucket/prefix",
			"gs://xxxxx@bucket/prefix", credentials},
		{"credentials in the endpoint", "KDEDUP_SNAPSHOT_URL", "s3://bucket/prefix?region=eu-west-1&endpoint=http://minio:" + pass + "@minio:9000&use_path_style=true",
			"s3://xxxxx@minio:9000&use_path_style=true", credentials},
		{"broker with scheme and credentials", "KDEDUP_BROKERS", "kafka-1:9092,sasl://kdedup:" + pass + "@kafka-2:9092",
			"kafka-1:9092,sasl://xxxxx@kafka-2:9092", `broker "sasl://kdedup:xxxxx@kafka-2:9092" must be host:port, without a scheme or user name (credentials go in KDEDUP_SASL_USERNAME and KDEDUP_SASL_PASSWORD)`},
		{"broker with credentials", "KDEDUP_BROKERS", "kdedup:" + pass + "@kafka-1:9092",
			"kdedup:xxxxx@kafka-1:9092", `broker "kdedup:xxxxx@kafka-1:9092" must be host:port, without a scheme or user name (credentials go in KDEDUP_SASL_USERNAME and KDEDUP_SASL_PASSWORD)`},
		{"misspelt variable", "KDEDUP_SNAPSHOT_URI", "s3://AKIA:" + pass + "@bucket/prefix",
			"s3://AKIA:xxxxx@bucket/prefix", "unknown variable: kdedup reads no such setting (did you mean KDEDUP_SNAPSHOT_URL?)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := LoadFrom(with(tc.env, tc.value))
			ps := problemsOf(t, err)
			want := Problem{Var: tc.env, Value: tc.wantValue, Reason: tc.wantReason}
			if len(ps) != 1 || ps[0] != want {
				t.Errorf("LoadFrom: problems %q, want %q", ps, want)
			}
			if strings.Contains(err.Error(), "s3cr3t") {
				t.Errorf("LoadFrom: the error shows the password: %v", err)
			}

			c, err := LoadFrom(required())
			if err != nil {
				t.Fatal(err)
			}
			switch tc.env {
			case "KDEDUP_SNAPSHOT_URL":
				c.SnapshotURL = tc.value
			case "KDEDUP_BROKERS":
				c.Brokers = strings.Split(tc.value, ",")
			default:
				return // not a field
			}
			err = c.Validate()
			if ps := problemsOf(t, err); len(ps) != 1 || ps[0] != want {
				t.Errorf("Validate: problems %q, want %q", ps, want)
			}
			if strings.Contains(err.Error(), "s3cr3t") {
				t.Errorf("Validate: the error shows the password: %v", err)
			}
		})
	}
}

// Values that pass each variable's own rule but that the filter or the
// store would refuse once a partition is assigned are refused at start-up,
// naming the variable whose limit they break.
// maxCapacity is the largest capacity the filter takes with the defaults
// and kv (name, value pairs), asked of the filter itself.
func filterMaxCapacity(t *testing.T, kv ...string) uint64 {
	t.Helper()
	c, err := LoadFrom(with(kv...))
	if err != nil {
		t.Fatal(err)
	}
	return stateParams(c).MaxCapacity()
}

func maxCapacityReason(t *testing.T, kv ...string) string {
	return fmt.Sprintf("at most %d keys", filterMaxCapacity(t, kv...))
}

func TestLoadRejectsWhatTheStateWouldRefuse(t *testing.T) {
	for _, tc := range []struct {
		name    string
		kv      []string
		wantVar string
		want    string
	}{
		{"capacity 2^32 with 4KiB pages", []string{"KDEDUP_CAPACITY", "4294967296"}, "KDEDUP_CAPACITY", maxCapacityReason(t)},
		{"capacity with 512B pages", []string{"KDEDUP_CAPACITY", "300000000", "KDEDUP_PAGE_BYTES", "512"}, "KDEDUP_CAPACITY", maxCapacityReason(t, "KDEDUP_PAGE_BYTES", "512")},
		{"capacity with 32-bit fingerprints", []string{"KDEDUP_CAPACITY", "1500000000", "KDEDUP_FINGERPRINT_BITS", "32"}, "KDEDUP_CAPACITY", maxCapacityReason(t, "KDEDUP_FINGERPRINT_BITS", "32")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := LoadFrom(with(tc.kv...))
			ps := problemsOf(t, err)
			if len(ps) != 1 || ps[0].Var != tc.wantVar || !strings.Contains(ps[0].Reason, tc.want) {
				t.Fatalf("problems %v, want one on %s saying %q", ps, tc.wantVar, tc.want)
			}
		})
	}
	// The limits are the owners': the largest capacity config accepts the
	// filter accepts, and one more it refuses.
	c, err := LoadFrom(with("KDEDUP_CAPACITY", strconv.FormatUint(filterMaxCapacity(t), 10)))
	if err != nil {
		t.Fatal(err)
	}
	if err := stateParams(c).Validate(); err != nil {
		t.Errorf("config accepts capacity %d, the filter refuses it: %v", c.Capacity, err)
	}
	p := stateParams(c)
	p.Capacity++
	if err := p.Validate(); err == nil {
		t.Errorf("the filter accepts capacity %d, one above what config accepts", p.Capacity)
	}
}

// An unknown KDEDUP_ variable names the closest known one, hides a value
// that may be a secret, and is ignored when empty.
func TestLoadUnknownVariables(t *testing.T) {
	for _, tc := range []struct {
		name, value, want, wantValue string
	}{
		{"KDEDUP_DELIVER", "exactly-once", "did you mean KDEDUP_DELIVERY?", "exactly-once"},
		{"KDEDUP_INPUT_TOPIC", "orders", "did you mean KDEDUP_INPUT_TOPICS?", "orders"},
		{"KDEDUP_BROKER", "k:9092", "did you mean KDEDUP_BROKERS?", "k:9092"},
		{"KDEDUP_SASL_PASSWROD", "hunter2", "did you mean KDEDUP_SASL_PASSWORD?", hiddenValue},
		{"KDEDUP_API_TOKEN", "t0ken", "did you mean", hiddenValue},
		{"KDEDUP_FLUSHBYTES", "1MiB", "did you mean KDEDUP_FLUSH_BYTES?", "1MiB"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := LoadFrom(with(tc.name, tc.value))
			ps := problemsOf(t, err)
			if len(ps) != 1 || ps[0].Var != tc.name || ps[0].Value != tc.wantValue || !strings.Contains(ps[0].Reason, tc.want) {
				t.Fatalf("problems %v, want one on %s=%s saying %q", ps, tc.name, tc.wantValue, tc.want)
			}
		})
	}
	environ := with("KDEDUP_DELIVER", "exactly-once", "KDEDUP_BUCKET_SIZE", "3")
	environ["KDEDUP_UNUSED"] = ""
	environ["OTHER_DELIVERY"] = "exactly-once"
	_, err := LoadFrom(environ)
	var vars []string
	for _, p := range problemsOf(t, err) {
		vars = append(vars, p.Var)
	}
	slices.Sort(vars)
	if !slices.Equal(vars, []string{"KDEDUP_BUCKET_SIZE", "KDEDUP_DELIVER"}) {
		t.Errorf("problems on %v, want KDEDUP_BUCKET_SIZE and KDEDUP_DELIVER (an empty or unprefixed variable is no problem)", vars)
	}
}
