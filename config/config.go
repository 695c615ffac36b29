package config

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/caarlos0/env/v11"

	"github.com/kdedup/kdedup/consumer"
	"github.com/kdedup/kdedup/dedup"
	"github.com/kdedup/kdedup/filter"
	"github.com/kdedup/kdedup/internal/optcheck"
	"github.com/kdedup/kdedup/snapshot"
	"github.com/kdedup/kdedup/store"
)

// Prefix starts the name of every variable kdedup reads.
const Prefix = "KDEDUP_"

// Config is kdedup's whole runtime configuration, one field per KDEDUP_*
// variable. Each field's tags give its variable (env, without [Prefix]), its
// default (envDefault) or that it is required, and its meaning (doc); see
// [Config.Table]. secret:"true" marks a value no problem ever prints, and
// redact:"userinfo" one that may carry user:password@ as in a URL (pasted
// by mistake: credentials belong elsewhere), printed through optcheck.RedactURL. Sizes of the filter apply per topic-partition: each
// partition owns its own chain of sub-filters.
//
// The zero Config is not valid; obtain one from [Load] or [LoadFrom], or
// check a hand-built one with [Config.Validate].
type Config struct {
	// Kafka.
	Brokers             []string          `env:"BROKERS,required" redact:"userinfo" doc:"Kafka seed brokers, comma-separated host:port"`
	InputTopics         []string          `env:"INPUT_TOPICS,required" doc:"Topics to deduplicate, comma-separated, without duplicates and without OUTPUT_TOPIC"`
	OutputTopic         string            `env:"OUTPUT_TOPIC,required" doc:"Topic that receives the first record seen for each key"`
	DuplicatesTopic     string            `env:"DUPLICATES_TOPIC" envDefault:"" doc:"Topic that receives every dropped record (duplicate or over MAX_OCCURRENCES) with headers kdedup-reason and kdedup-source, to audit false drops; not OUTPUT_TOPIC nor an input topic; empty disables it"`
	DeadLetterTopic     string            `env:"DEAD_LETTER_TOPIC" envDefault:"" doc:"Topic that receives each record that cannot be forwarded because of the record itself (larger than its target topic's max.message.bytes, rejected by the broker as invalid, or a batch over MAX_DECOMPRESS_BYTES) with headers kdedup-dead-letter-reason, kdedup-source and kdedup-target, and processing goes on; not OUTPUT_TOPIC, DUPLICATES_TOPIC nor an input topic; empty stops the worker (exit 1) with an error naming the record"`
	RepartitionTopic    string            `env:"REPARTITION_TOPIC" envDefault:"" doc:"Topic the input records pass through keyed by their dedup key (KEY), so that duplicates are caught whichever input partition their producer wrote them to: the workers of GROUP produce each input record to it, with its original key, headers and timestamp, and deduplicate its partitions into OUTPUT_TOPIC; create it beforehand (kdedup does not create topics) with message.timestamp.type=CreateTime, at least as many partitions as the input topics together, and a partition count that never changes; not OUTPUT_TOPIC, DUPLICATES_TOPIC, DEAD_LETTER_TOPIC nor an input topic; empty deduplicates each input partition on its own"`
	MaxRecordBytes      ByteSize          `env:"MAX_RECORD_BYTES" envDefault:"0" doc:"Largest record batch the worker produces to each topic, 512B to 1GiB, as the broker counts it against max.message.bytes; 0 reads each target topic's max.message.bytes from the brokers at start-up (1048588 when they do not tell)"`
	MaxDecompressBytes  ByteSize          `env:"MAX_DECOMPRESS_BYTES" envDefault:"64MiB" doc:"Largest size an input record batch may decompress to, 1MiB to 1GiB; a larger one (a compression bomb) is not decompressed: it goes to DEAD_LETTER_TOPIC as a record without value, or stops the worker naming its offsets"`
	Group               string            `env:"GROUP" envDefault:"kdedup" doc:"Consumer group; the workers of one group share the partitions of INPUT_TOPICS"`
	InstanceID          string            `env:"INSTANCE_ID" envDefault:"" doc:"Static group membership (KIP-345): a member id unique in GROUP and stable across restarts, such as the pod name; a member restarting within SESSION_TIMEOUT gets its partitions, and their local state, back without a rebalance; letters, digits, '.', '_' and '-'; empty joins as a dynamic member"`
	StartOffset         StartOffset       `env:"START_OFFSET" envDefault:"earliest" doc:"Where a partition with no committed offset in the group begins when the group has no committed offset in its topic either (the group's first start, a new input topic): earliest or latest; a partition added to a topic the group has committed offsets in is read from its start whatever this says"`
	MetadataMaxAge      time.Duration     `env:"METADATA_MAX_AGE" envDefault:"30s" doc:"Longest time between Kafka metadata refreshes, 1s to 1h: partitions added to an input topic are assigned within about this long"`
	SessionTimeout      time.Duration     `env:"SESSION_TIMEOUT" envDefault:"45s" doc:"Consumer group session timeout, 1s to 30m (brokers enforce group.min.session.timeout.ms, 6s by default); a worker silent this long loses its partitions to a rebalance"`
	Delivery            consumer.Delivery `env:"DELIVERY" envDefault:"at-least-once" doc:"at-least-once (a crash may forward the records of one flush interval again) or exactly-once (Kafka transactions: output and input offsets commit atomically; read the output with isolation.level=read_committed)"`
	TransactionalID     string            `env:"TRANSACTIONAL_ID" envDefault:"" doc:"Transactional id with DELIVERY=exactly-once; empty means one unique to this process (KIP-447 fences by group generation, so it need not survive restarts)"`
	TransactionInterval time.Duration     `env:"TRANSACTION_INTERVAL" envDefault:"100ms" doc:"With DELIVERY=exactly-once, the longest time one Kafka transaction stays open deciding records, 1ms to 1h, and at most FLUSH_INTERVAL whatever this says (the output becomes visible to read_committed readers when it commits); a transaction also ends early when a partition's changed pages would pass FLUSH_BYTES"`
	Rebuild             Rebuild           `env:"REBUILD" envDefault:"replay" doc:"A partition with no local state: replay (rebuild its filter from the earliest retained input, forwarding nothing, up to the group's offset) or empty (start with an empty filter and accept repeats of keys seen before)"`
	Key                 string            `env:"KEY" envDefault:"" doc:"What makes two records duplicates: empty or key for the record key, header:NAME for the value of header NAME, json:PATH for a gjson path into the JSON record value"`
	DeleteHeader        string            `env:"DELETE_HEADER" envDefault:"" doc:"NAME=VALUE: a record carrying header NAME with value VALUE deletes its key from the filter; empty disables deletes"`
	ForwardTombstones   bool              `env:"FORWARD_TOMBSTONES" envDefault:"true" doc:"Forward tombstones (records with a null value) to OUTPUT_TOPIC: true or false"`
	MaxOccurrences      int               `env:"MAX_OCCURRENCES" envDefault:"1" doc:"Records forwarded per key until it is deleted (or, with WINDOW, within the window), 1 to 2*BUCKET_SIZE; 1 deduplicates, more throttles (later records are dropped as over the limit)"`
	Window              time.Duration     `env:"WINDOW" envDefault:"0s" doc:"How long a key is remembered, in record time (record timestamps, never the wall clock): at least WINDOW and at most WINDOW plus one generation span past its record's timestamp; 0 remembers keys until they are deleted"`
	WindowGenerations   int               `env:"WINDOW_GENERATIONS" envDefault:"8" doc:"Generations a WINDOW is cut into, 1 to 64: keys expire a whole generation (WINDOW/WINDOW_GENERATIONS of record time) at once; more generations forget closer to WINDOW but widen the generation tag in every slot (2 bits for 1 or 2 generations, 3 up to 6, 4 up to 14, 5 up to 30, 6 up to 62, 7 above)"`
	WindowRefresh       bool              `env:"WINDOW_REFRESH" envDefault:"false" doc:"With WINDOW: true re-remembers a key each time one of its records is dropped, so a key keeps being dropped while it recurs at least once per WINDOW (sliding expiry); false forgets it WINDOW after the record that was forwarded"`

	// Kafka security.
	TLSEnabled       bool   `env:"TLS_ENABLED" envDefault:"false" doc:"Connect to the brokers over TLS: true or false"`
	TLSCAFile        string `env:"TLS_CA_FILE" envDefault:"" doc:"PEM file of the certificate authorities that sign the brokers' certificates; empty trusts the system's"`
	TLSCertFile      string `env:"TLS_CERT_FILE" envDefault:"" doc:"PEM client certificate for mutual TLS, with TLS_KEY_FILE"`
	TLSKeyFile       string `env:"TLS_KEY_FILE" envDefault:"" doc:"PEM private key of TLS_CERT_FILE"`
	TLSServerName    string `env:"TLS_SERVER_NAME" envDefault:"" doc:"Name the brokers' certificates must carry, when it is not the host name in BROKERS"`
	SASLMechanism    string `env:"SASL_MECHANISM" envDefault:"" doc:"SASL authentication: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512; empty disables SASL (PLAIN sends the password as is: use it with TLS)"`
	SASLUsername     string `env:"SASL_USERNAME" envDefault:"" doc:"SASL user name, required with SASL_MECHANISM"`
	SASLPassword     string `env:"SASL_PASSWORD" envDefault:"" secret:"true" doc:"SASL password; SASL_PASSWORD_FILE keeps it out of the environment; exactly one of the two with SASL_MECHANISM"`
	SASLPasswordFile string `env:"SASL_PASSWORD_FILE,file" envDefault:"" secret:"true" doc:"Path of a file holding the SASL password (a mounted Secret), read at start-up; one trailing newline is ignored"`

	// Cuckoo filter, per topic-partition.
	TargetFPR       float64 `env:"TARGET_FPR" envDefault:"0.0001" doc:"False-positive rate (false drops) each partition's filter stays under as it grows: a sub-filter grows in place by splitting pages, up to 256 times its first size; each sub-filter appended after that gets half the remaining budget and one more fingerprint bit; between 0 and 1"`
	FingerprintBits int     `env:"FINGERPRINT_BITS" envDefault:"0" doc:"Fixed fingerprint (slot) width for every sub-filter, 4 to 32 bits, overriding TARGET_FPR (the rate then grows with each sub-filter appended; below 17 bits a sub-filter doubles in place only bits-9 times, never below 10 bits); 0 derives widths from TARGET_FPR"`
	BucketSize      int     `env:"BUCKET_SIZE" envDefault:"4" doc:"Fingerprint slots per bucket: 2, 4 or 8"`
	Capacity        uint64  `env:"CAPACITY" envDefault:"1000000" doc:"Keys the first sub-filter of each topic-partition holds before its pages split (it grows in place to 256 times that before another is appended), from 1 to what 2^20 pages of PAGE_BYTES hold (2^32 at most with larger pages)"`
	MaxKicks        int     `env:"MAX_KICKS" envDefault:"500" doc:"Evictions an insert tries in a page that cannot split (once its sub-filter has doubled 8 times) before a new sub-filter is appended to the chain, 1 to 100000; a page that can split does after at most 64 (or this many when lower)"`
	Expansion       int     `env:"EXPANSION" envDefault:"2" doc:"Root pages of a newly appended sub-filter as a multiple of the newest one's, once that one has doubled in place 8 times (or spent its share of TARGET_FPR), 1 to 64"`

	// Storage.
	DataDir       string        `env:"DATA_DIR" envDefault:"./data" doc:"Directory holding the filter state of every topic-partition"`
	PageBytes     ByteSize      `env:"PAGE_BYTES" envDefault:"4KiB" doc:"Size of a filter page on disk and in the cache: a power of two from 512B to 64KiB, and at least one bucket"`
	MemoryBytes   ByteSize      `env:"MEMORY_BYTES" envDefault:"0" doc:"Memory the whole worker may use, resident: the page cache, the dirty pages of all partitions, Badger's memtables, the Kafka fetch buffers and the Go soft memory limit are sized from it and logged at start-up; 0 takes 90% of the container's memory limit (cgroup), or 3GiB without one; too small to leave 16 pages of cache stops start-up naming the least that works"`
	CacheBytes    ByteSize      `env:"CACHE_BYTES" envDefault:"0" doc:"Memory for cached filter pages, shared by all partitions, at least 16*PAGE_BYTES; 0 takes the cache's share of MEMORY_BYTES (what is left after the other parts); a value larger than that share is used as given and logged as a warning, since resident memory may then pass MEMORY_BYTES"`
	FlushInterval time.Duration `env:"FLUSH_INTERVAL" envDefault:"1s" doc:"Longest time a changed page stays unwritten, 10ms to 1h"`
	FlushBytes    ByteSize      `env:"FLUSH_BYTES" envDefault:"8MiB" doc:"Changed bytes that start a flush before FLUSH_INTERVAL ends, PAGE_BYTES to 128MiB; dirty pages of all partitions are bounded together by MEMORY_BYTES"`
	// WriteBackInterval is store.Options.WriteBackInterval.
	WriteBackInterval time.Duration `env:"WRITE_BACK_INTERVAL" envDefault:"1m" doc:"Longest time a page's changes stay only in the partition's log before the page is written whole, 1s to 1h and at least FLUSH_INTERVAL: a restart after a crash applies about this much log, and a page is written whole about once per interval"`

	// Snapshots in object storage.
	SnapshotURL      string        `env:"SNAPSHOT_URL" envDefault:"" redact:"userinfo" doc:"Object store for snapshots of each partition's state, from which a partition moved to a worker without its state restores, replaying only the input after the snapshot: s3://bucket/prefix?region=R (and &endpoint=URL&use_path_style=true for S3-compatible servers), gs://bucket/prefix, azblob://container/prefix, or file:///path (a shared volume); credentials come from the cloud SDK's usual sources (environment, files, pod identity), never from this URL; empty disables snapshots"`
	SnapshotInterval time.Duration `env:"SNAPSHOT_INTERVAL" envDefault:"2m" doc:"How often each partition's state is snapshotted while it changes, 1s to 24h; also when a partition is revoked and at shutdown"`
	SnapshotKeep     int           `env:"SNAPSHOT_KEEP" envDefault:"3" doc:"Snapshots kept per partition, newest first, 1 to 1000; older ones are deleted after each upload"`

	// Operations.
	HTTPAddr  string `env:"HTTP_ADDR" envDefault:":8080" doc:"HTTP listen address for metrics and health probes, host:port; port 0 picks a free port"`
	Pprof     bool   `env:"PPROF" envDefault:"false" doc:"Serve Go's runtime profiles (CPU, heap, allocations, goroutines, execution trace) at /debug/pprof/ on HTTP_ADDR, for profiling the worker where it runs; a CPU profile or trace runs at most 29s (the server's write timeout); off by default: a profile costs CPU while it runs and shows the process's internals to whoever reaches the port"`
	LogLevel  string `env:"LOG_LEVEL" envDefault:"info" doc:"Least severe level logged: debug, info, warn or error"`
	LogFormat string `env:"LOG_FORMAT" envDefault:"json" doc:"Log format: json or text"`
	// ShutdownTimeout and LivenessTimeout bound a worker that stops making
	// progress: the first exits, the second fails /healthz.
	ShutdownTimeout time.Duration `env:"SHUTDOWN_TIMEOUT" envDefault:"70s" doc:"Longest a stop (SIGTERM, or a failure) may take, 1s to 1h: a worker still stopping after it exits with code 1 naming what it was waiting for; keep it under the pod's terminationGracePeriodSeconds (the chart sets it 5s under)"`
	LivenessTimeout time.Duration `env:"LIVENESS_TIMEOUT" envDefault:"0s" doc:"/healthz answers 503 once the worker's poll loop or its shutdown has made no progress for this long (an idle input is progress), 10s to 2h and at least 2*SESSION_TIMEOUT (how long a transaction's end or a produce may wait out a broker outage); 0 derives it: 2*SESSION_TIMEOUT plus 1m, at least 5m"`
}

// Limits config enforces itself (Validate's own rules); the doc tags on
// Config state them for users. The owners' limits (fingerprint width,
// bucket size, kicks, expansion, generations and capacity per page size:
// filter.Params.Validate; the largest write batch: store.Options.Validate;
// the occurrence limit: dedup.Options.Validate) are theirs and are asked
// of them; those below are kdedup's supported ranges.
const (
	maxCapacity = 1 << 32
	// minPageBytes and maxPageBytes are the page sizes kdedup supports,
	// inside what the store and the filter accept (store.MaxPageBytes,
	// filter.MaxPageBytes, filter.MinPageBytes; TestPageLimitsWithinOwners
	// ties them): below 512B a page's Badger key (up to 270 bytes with the
	// longest topic name) outweighs the page, and above 64KiB a cache miss
	// reads, and a page rewrite writes, 16 default pages for one key, while
	// an exactly-once transaction at the default FLUSH_BYTES covers at most
	// 64 records (FLUSH_BYTES/PAGE_BYTES/2).
	minPageBytes           = 512
	maxPageBytes           = 64 * KiB
	minCachePages          = 16
	maxFlushBytes          = 128 * MiB
	minWindowSpan          = time.Second
	minFlushInterval       = 10 * time.Millisecond
	minWriteBackInterval   = time.Second
	maxWriteBackInterval   = time.Hour
	minTransactionInterval = time.Millisecond
	maxFlushInterval       = time.Hour
	minSessionTimeout      = time.Second
	minMetadataMaxAge      = time.Second
	maxMetadataMaxAge      = time.Hour
	maxSessionTimeout      = 30 * time.Minute
	maxTopicNameLength     = 249 // Kafka's limit, from org.apache.kafka.common.internals.Topic.
	minShutdownTimeout     = time.Second
	maxShutdownTimeout     = time.Hour
	minLivenessTimeout     = 10 * time.Second
	maxLivenessTimeout     = 2 * time.Hour
	// minRecordBytes and maxRecordBytes bound a record batch as franz-go
	// accepts them (kgo.ProducerBatchMaxBytes: 512 to 1<<30).
	minRecordBytes = 512
	maxRecordBytes = GiB
	// minDecompressBytes and maxDecompressBytes bound MAX_DECOMPRESS_BYTES:
	// below 1MiB a batch of ordinary records would not fit, and franz-go's
	// own bound is 1GiB.
	minDecompressBytes = MiB
	maxDecompressBytes = GiB
)

const (
	requiredReason      = "required"
	byteSizeParseReason = "must be a byte size such as 4096, 4KiB or 8MiB"
)

// Load reads the configuration from the process environment, applies
// defaults, and validates it. Every problem, whether a value that does not
// parse, a missing required variable, a broken rule or a KDEDUP_* variable
// that is not a field of Config (a misspelt name, reported with the closest
// known one), is reported in one *[Error]; the Config is then the zero
// value. Variables that Kubernetes sets for Services whose names start with
// "kdedup" (KDEDUP_METRICS_SERVICE_HOST, KDEDUP_PORT=tcp://...) are not
// judged.
func Load() (Config, error) {
	return LoadFrom(env.ToMap(os.Environ()))
}

// LoadFrom is [Load] with environ, mapping full variable names
// ("KDEDUP_BROKERS") to values, in place of the process environment. A nil
// environ is an empty environment.
func LoadFrom(environ map[string]string) (Config, error) {
	if environ == nil {
		environ = map[string]string{}
	}
	fields := describeFields()

	var c Config
	var problems []Problem
	unparsed := map[string]bool{}
	if err := env.ParseWithOptions(&c, env.Options{Prefix: Prefix, Environment: environ}); err != nil {
		var agg env.AggregateError
		if !errors.As(err, &agg) {
			return Config{}, fmt.Errorf("config: parsing environment: %w", err)
		}
		for _, e := range agg.Errors {
			p, ok := parseProblem(e, fields, environ)
			if !ok {
				// Only a broken struct tag gets here, never user input.
				return Config{}, fmt.Errorf("config: parsing environment: %w", e)
			}
			problems = append(problems, p)
			unparsed[p.Var] = true
		}
	}

	problems = append(problems, unknownProblems(environ, fields)...)

	if err := c.Validate(); err != nil {
		var verr *Error
		if !errors.As(err, &verr) {
			return Config{}, err
		}
		for _, p := range verr.Problems {
			// A variable that did not parse holds its zero value; judging
			// that value would only repeat the parse problem.
			if unparsed[p.Var] {
				continue
			}
			if raw := environ[p.Var]; raw != "" {
				p.Value = shown(p.Var, raw, fields)
			}
			problems = append(problems, p)
		}
	}

	if len(problems) > 0 {
		sortProblems(problems, fields)
		return Config{}, &Error{Problems: problems}
	}
	return c, nil
}

// parseProblem turns one error from env into a Problem, reporting false for
// errors that do not come from the environment's contents.
func parseProblem(err error, fields []field, environ map[string]string) (Problem, bool) {
	switch e := err.(type) {
	case env.VarIsNotSetError:
		return Problem{Var: e.Key, Reason: requiredReason}, true
	case env.ParseError:
		for _, f := range fields {
			if f.name == e.Name {
				v := shown(f.envVar, environ[f.envVar], fields)
				return Problem{Var: f.envVar, Value: v, Reason: parseReason(e.Type, e.Err)}, true
			}
		}
	case env.LoadFileContentError:
		return Problem{Var: e.Key, Value: e.Filename, Reason: "cannot read the file: " + e.Err.Error()}, true
	}
	return Problem{}, false
}

// shown is raw, the value of variable name as written, as a problem may
// print it: hiddenValue for a secret given in the variable itself (a secret
// read from a file shows the file's path instead), without user info for a
// value that may carry some (redact:"userinfo").
func shown(name, raw string, fields []field) string {
	for _, f := range fields {
		if f.envVar != name {
			continue
		}
		switch {
		case f.secret && !f.file && raw != "":
			return hiddenValue
		case f.redactUserinfo:
			return optcheck.RedactURL(raw)
		}
	}
	return raw
}

func parseReason(t reflect.Type, err error) string {
	if r := choiceReasonOf(t); r != "" {
		return r
	}
	switch {
	case t == reflect.TypeFor[ByteSize]():
		return byteSizeParseReason
	case t == reflect.TypeFor[time.Duration]():
		return "must be a duration such as 500ms, 1s or 5m"
	}
	switch t.Kind() {
	case reflect.Bool:
		return "must be true or false"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		if errors.Is(err, strconv.ErrRange) {
			return "out of range"
		}
		return "must be an integer"
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		if errors.Is(err, strconv.ErrRange) {
			return "out of range"
		}
		return "must be a non-negative integer"
	}
	return err.Error()
}

// choiceReasonOf is the reason for a value of type t that names none of
// its values, from the names the type's owner gives them, or "" when t is
// not such a type.
func choiceReasonOf(t reflect.Type) string {
	switch t {
	case reflect.TypeFor[StartOffset]():
		return choiceReason(StartEarliest, StartLatest)
	case reflect.TypeFor[consumer.Delivery]():
		return choiceReason(consumer.AtLeastOnce, consumer.ExactlyOnce)
	case reflect.TypeFor[Rebuild]():
		return choiceReason(RebuildReplay, RebuildEmpty)
	}
	return ""
}

// Validate checks every variable, including the rules that relate two,
// and returns an *[Error] listing all problems, or nil. Each rule lives
// with its owner: the variables are mapped to the options of the packages
// that use them ([Config.FilterParams], [Config.StoreOptions],
// [Config.DedupOptions], [Config.ConsumerOptions], the snapshot URL), each
// owner's Validate reports what its code cannot honour (naming its own
// fields, internal/optcheck), and Validate names the variables behind
// them. config checks itself only what no owner does: the syntax of its
// variables, the ranges kdedup supports where they are narrower than an
// owner's (page sizes, intervals, timeouts), the settings of the process
// (logging, HTTP, TLS and SASL), and the rules that relate two owners'
// options. A variable is reported once: an owner's problem with a
// variable already reported is left out, and a rule relating a variable
// to another is skipped while the other is itself invalid. Values in the
// problems are formatted from c.
func (c Config) Validate() error {
	fields := describeFields()
	v := validator{vars: map[string]string{}, secrets: map[string]bool{}, redacted: map[string]bool{}, config: reflect.ValueOf(c)}
	for _, f := range fields {
		v.vars[f.name] = f.envVar
		v.secrets[f.name] = f.secret
		v.redacted[f.name] = f.redactUserinfo
	}
	c.validateOwn(&v)

	// The owners' rules.
	p := c.FilterParams()
	p.PageBytes = int(c.PageBytes) // the store's, which the filter's pages take
	p.KeySpec = c.Key
	v.owner(p.Validate(), map[string]string{"Generations": "WindowGenerations", "KeySpec": "Key"})
	v.owner(c.StoreOptions().Validate(), map[string]string{"Dir": "DataDir"})
	if dopts, err := c.DedupOptions(); err != nil {
		v.add("Key", c.Key, `must be empty, "key", "header:NAME" or "json:PATH", with NAME and PATH not empty`)
	} else {
		v.owner(dopts.Validate(), nil)
	}
	v.owner(c.ConsumerOptions().Validate(), nil)
	if c.SnapshotURL != "" {
		v.owner(snapshot.CheckURL(c.SnapshotURL), map[string]string{"URL": "SnapshotURL"})
	}

	if len(v.problems) == 0 {
		return nil
	}
	sortProblems(v.problems, fields)
	return &Error{Problems: v.problems}
}

// validateOwn checks the rules that are config's own: syntax, the ranges
// kdedup supports inside the owners', the process's settings, and the
// rules that relate two owners' options.
func (c Config) validateOwn(v *validator) {
	// Kafka.
	for _, b := range c.Brokers {
		if reason := brokerProblem(b); reason != "" {
			v.add("Brokers", c.Brokers, reason)
		}
	}
	if reason := topicProblem(c.OutputTopic); c.OutputTopic != "" && reason != "" {
		v.add("OutputTopic", c.OutputTopic, reason)
	}
	for field, t := range map[string]string{"DuplicatesTopic": c.DuplicatesTopic, "DeadLetterTopic": c.DeadLetterTopic, "RepartitionTopic": c.RepartitionTopic} {
		if reason := topicProblem(t); t != "" && reason != "" {
			v.add(field, t, reason)
		}
	}
	for _, t := range c.InputTopics {
		if reason := topicProblem(t); reason != "" {
			v.add("InputTopics", c.InputTopics, reason)
		}
	}
	if c.MaxRecordBytes != 0 && (c.MaxRecordBytes < minRecordBytes || c.MaxRecordBytes > maxRecordBytes) {
		v.add("MaxRecordBytes", c.MaxRecordBytes, fmt.Sprintf("must be 0 (read max.message.bytes from the brokers) or from %v to %v", ByteSize(minRecordBytes), ByteSize(maxRecordBytes)))
	}
	if c.MaxDecompressBytes < minDecompressBytes || c.MaxDecompressBytes > maxDecompressBytes {
		v.add("MaxDecompressBytes", c.MaxDecompressBytes, fmt.Sprintf("must be from %v to %v", ByteSize(minDecompressBytes), ByteSize(maxDecompressBytes)))
	}
	if c.Group == "" {
		v.add("Group", c.Group, "must not be empty")
	}
	if int(c.StartOffset) >= len(startOffsetNames) {
		v.add("StartOffset", c.StartOffset, choiceReasonOf(reflect.TypeFor[StartOffset]()))
	}
	if !c.Delivery.Valid() {
		v.add("Delivery", c.Delivery, choiceReasonOf(reflect.TypeFor[consumer.Delivery]()))
	}
	if int(c.Rebuild) >= len(rebuildNames) {
		v.add("Rebuild", c.Rebuild, choiceReasonOf(reflect.TypeFor[Rebuild]()))
	}
	if c.InstanceID != "" {
		if reason := topicProblem(c.InstanceID); reason != "" {
			v.add("InstanceID", c.InstanceID, strings.Replace(reason, "topic", "instance id", 1))
		}
	}
	c.validateSecurity(v)
	if c.SessionTimeout < minSessionTimeout || c.SessionTimeout > maxSessionTimeout {
		v.add("SessionTimeout", c.SessionTimeout, fmt.Sprintf("must be from %s to %s", formatDuration(minSessionTimeout), formatDuration(maxSessionTimeout)))
	}
	if c.MetadataMaxAge < minMetadataMaxAge || c.MetadataMaxAge > maxMetadataMaxAge {
		v.add("MetadataMaxAge", c.MetadataMaxAge, fmt.Sprintf("must be from %s to %s", formatDuration(minMetadataMaxAge), formatDuration(maxMetadataMaxAge)))
	}
	if _, _, ok := c.DeleteHeaderNameValue(); !ok && c.DeleteHeader != "" {
		v.add("DeleteHeader", c.DeleteHeader, "must be empty or NAME=VALUE, with NAME not empty")
	}

	// Cuckoo filter: the ranges kdedup supports; the filter checks the
	// rest (FilterParams, in Validate).
	if c.Capacity > maxCapacity {
		v.add("Capacity", c.Capacity, fmt.Sprintf("must be from 1 to %d keys", uint64(maxCapacity)))
	}
	switch {
	case c.Window > 0 && c.Window < time.Duration(max(c.WindowGenerations, 1))*minWindowSpan:
		v.add("Window", c.Window, fmt.Sprintf("must be 0 or at least %s per generation (WINDOW_GENERATIONS)", formatDuration(minWindowSpan)))
	}
	if c.Window == 0 && (c.WindowGenerations < 1 || c.WindowGenerations > filter.MaxGenerations) {
		// Unused without a window, yet a value a window could not take
		// is a mistake; with a window the filter checks it.
		v.add("WindowGenerations", c.WindowGenerations, fmt.Sprintf("must be from 1 to %d", filter.MaxGenerations))
	}
	if c.WindowRefresh && c.Window == 0 {
		v.add("WindowRefresh", c.WindowRefresh, "needs KDEDUP_WINDOW: without a window keys are never forgotten")
	}

	// Storage.
	pageOK := c.PageBytes >= minPageBytes && c.PageBytes <= maxPageBytes && c.PageBytes&(c.PageBytes-1) == 0
	if !pageOK {
		v.add("PageBytes", c.PageBytes, fmt.Sprintf("must be a power of two from %v to %v (KB and MB are powers of 1000; use KiB or MiB)", ByteSize(minPageBytes), maxPageBytes))
	}
	if pageOK && c.CacheBytes != 0 && c.CacheBytes < minCachePages*c.PageBytes {
		v.add("CacheBytes", c.CacheBytes, fmt.Sprintf("must be 0 (the share of MEMORY_BYTES) or at least %d pages of PAGE_BYTES, %v", minCachePages, minCachePages*c.PageBytes))
	}
	if c.TransactionInterval < minTransactionInterval || c.TransactionInterval > maxFlushInterval {
		v.add("TransactionInterval", c.TransactionInterval, fmt.Sprintf("must be from %s to %s", formatDuration(minTransactionInterval), formatDuration(maxFlushInterval)))
	}
	if c.WriteBackInterval < minWriteBackInterval || c.WriteBackInterval > maxWriteBackInterval {
		v.add("WriteBackInterval", c.WriteBackInterval, fmt.Sprintf("must be from %s to %s", formatDuration(minWriteBackInterval), formatDuration(maxWriteBackInterval)))
	} else if c.FlushInterval >= minFlushInterval && c.FlushInterval <= maxFlushInterval && c.WriteBackInterval < c.FlushInterval {
		// The store's write-back against the consumer's write batches.
		v.add("WriteBackInterval", c.WriteBackInterval, fmt.Sprintf("must be at least FLUSH_INTERVAL (%s)", formatDuration(c.FlushInterval)))
	}
	if c.FlushInterval < minFlushInterval || c.FlushInterval > maxFlushInterval {
		v.add("FlushInterval", c.FlushInterval, fmt.Sprintf("must be from %s to %s", formatDuration(minFlushInterval), formatDuration(maxFlushInterval)))
	}
	if pageOK && c.FlushBytes < c.PageBytes {
		v.add("FlushBytes", c.FlushBytes, fmt.Sprintf("must be at least PAGE_BYTES, %v", c.PageBytes))
	}
	if c.FlushBytes > maxFlushBytes {
		v.add("FlushBytes", c.FlushBytes, fmt.Sprintf("must be at most %v", ByteSize(maxFlushBytes)))
	}

	// Snapshots.
	if c.SnapshotInterval < time.Second || c.SnapshotInterval > 24*time.Hour {
		v.add("SnapshotInterval", c.SnapshotInterval, "must be from 1s to 24h")
	}
	if c.SnapshotKeep < 1 || c.SnapshotKeep > 1000 {
		v.add("SnapshotKeep", c.SnapshotKeep, "must be from 1 to 1000")
	}

	// Operations.
	if reason := httpAddrProblem(c.HTTPAddr); reason != "" {
		v.add("HTTPAddr", c.HTTPAddr, reason)
	}
	switch strings.ToLower(c.LogLevel) {
	case "debug", "info", "warn", "error":
	default:
		v.add("LogLevel", c.LogLevel, "must be debug, info, warn or error")
	}
	if c.LogFormat != "json" && c.LogFormat != "text" {
		v.add("LogFormat", c.LogFormat, "must be json or text")
	}
	if c.ShutdownTimeout < minShutdownTimeout || c.ShutdownTimeout > maxShutdownTimeout {
		v.add("ShutdownTimeout", c.ShutdownTimeout, fmt.Sprintf("must be from %s to %s", formatDuration(minShutdownTimeout), formatDuration(maxShutdownTimeout)))
	}
	switch {
	case c.LivenessTimeout == 0:
	case c.LivenessTimeout < minLivenessTimeout || c.LivenessTimeout > maxLivenessTimeout:
		v.add("LivenessTimeout", c.LivenessTimeout, fmt.Sprintf("must be 0 (derived) or from %s to %s", formatDuration(minLivenessTimeout), formatDuration(maxLivenessTimeout)))
	case c.SessionTimeout >= minSessionTimeout && c.SessionTimeout <= maxSessionTimeout && c.LivenessTimeout < 2*c.SessionTimeout:
		v.add("LivenessTimeout", c.LivenessTimeout, fmt.Sprintf("must be 0 (derived) or at least 2*SESSION_TIMEOUT, %s: a transaction's end or a produce may wait that long for the brokers", formatDuration(2*c.SessionTimeout)))
	}
}

type validator struct {
	vars     map[string]string // Config field name to variable name
	secrets  map[string]bool   // Config field names whose values are never printed
	redacted map[string]bool   // Config field names whose values are printed through optcheck.RedactURL
	config   reflect.Value     // the Config validated, whose fields owners' problems print
	problems []Problem
}

// owner adds the problems of an owner's Validate error (an
// *optcheck.Error naming the owner's fields), each under the variable of
// the Config field of the same name, or of renames[field] where the names
// differ, with the value formatted from the Config. A problem with a
// variable already reported is left out: one mistake, one problem. An
// error that is not an *optcheck.Error, or a field no Config field maps
// to, is a fault of this mapping and panics, so that a test finds it.
func (v *validator) owner(err error, renames map[string]string) {
	if err == nil {
		return
	}
	var oe *optcheck.Error
	if !errors.As(err, &oe) {
		panic(fmt.Sprintf("config: an owner's Validate returned %T, not an *optcheck.Error: %v", err, err))
	}
	for _, p := range oe.Problems {
		name := p.Field
		if r, ok := renames[name]; ok {
			name = r
		}
		if _, ok := v.vars[name]; !ok {
			panic(fmt.Sprintf("config: %v names %s, which no variable sets", err, p.Field))
		}
		if slices.ContainsFunc(v.problems, func(q Problem) bool { return q.Var == v.vars[name] }) {
			continue
		}
		v.add(name, v.config.FieldByName(name).Interface(), p.Reason)
	}
}

// hiddenValue stands for the value of a secret variable in problems.
const hiddenValue = "(hidden)"

func (v *validator) add(fieldName string, value any, reason string) {
	var s string
	switch x := value.(type) {
	case []string:
		s = strings.Join(x, ",")
	default:
		s = fmt.Sprint(x)
	}
	switch {
	case v.secrets[fieldName] && s != "":
		s = hiddenValue
	case v.redacted[fieldName]:
		s = optcheck.RedactURL(s)
	}
	v.problems = append(v.problems, Problem{Var: v.vars[fieldName], Value: s, Reason: reason})
}

// brokerProblem is why b cannot be a seed broker, or "". It quotes b
// through RedactURL: a broker pasted as sasl://user:password@host:9092
// must not print its password.
func brokerProblem(b string) string {
	host, port, err := net.SplitHostPort(b)
	q := strconv.Quote(optcheck.RedactURL(b))
	switch {
	case b == "":
		return "empty broker in list"
	case strings.ContainsAny(b, "/@"):
		return fmt.Sprintf("broker %s must be host:port, without a scheme or user name (credentials go in KDEDUP_SASL_USERNAME and KDEDUP_SASL_PASSWORD)", q)
	case err != nil:
		return fmt.Sprintf("broker %s must be host:port", q)
	case host == "":
		return fmt.Sprintf("broker %s has no host", q)
	case strings.ContainsFunc(host, isSpace):
		return fmt.Sprintf("broker %s contains whitespace", q)
	}
	if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
		return fmt.Sprintf("broker %s must have a port from 1 to 65535", q)
	}
	return ""
}

// topicProblem applies Kafka's rules for topic names
// (org.apache.kafka.common.internals.Topic.validate).
func topicProblem(t string) string {
	switch {
	case t == "":
		return "empty topic in list"
	case t == "." || t == "..":
		return fmt.Sprintf("topic %q is not a legal name", t)
	case len(t) > maxTopicNameLength:
		return fmt.Sprintf("topic %q is longer than %d characters", t, maxTopicNameLength)
	}
	for _, r := range t {
		legal := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-'
		if !legal {
			return fmt.Sprintf("topic %q may contain only ASCII letters, digits, '.', '_' and '-'", t)
		}
	}
	return ""
}

func httpAddrProblem(addr string) string {
	if addr == "" {
		return "must not be empty"
	}
	if _, port, err := net.SplitHostPort(addr); err != nil {
		return "must be host:port, e.g. :8080 or 127.0.0.1:0"
	} else if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return "must have a port from 0 to 65535"
	}
	return ""
}

// formatDuration is d.String() without trailing zero units: "30m", not
// "30m0s".
func formatDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

func isSpace(r rune) bool { return r == ' ' || r == '\t' || r == '\n' || r == '\r' }

// FilterParams are the filter parameters of every topic-partition's chain,
// from TARGET_FPR, FINGERPRINT_BITS, BUCKET_SIZE, CAPACITY, MAX_KICKS,
// EXPANSION, WINDOW and WINDOW_GENERATIONS. PageBytes is left 0: the page
// size is the store's (StoreOptions), and the deduplicators take it from
// the store they open (dedup.Opener.PageBytes).
func (c Config) FilterParams() filter.Params {
	return filter.Params{
		TargetFPR:       c.TargetFPR,
		FingerprintBits: c.FingerprintBits,
		BucketSize:      c.BucketSize,
		Capacity:        c.Capacity,
		MaxKicks:        c.MaxKicks,
		Expansion:       c.Expansion,
		Window:          c.Window,
		Generations:     c.WindowGenerations,
	}
}

// Options are the options of each package kdedup runs, mapped from one
// validated Config (Config.Options): what the worker's wiring
// (internal/app) hands each package, with what the process provides
// (the memory budget's shares, the Kafka connection, the logger, the
// metrics registry) filled in there.
type Options struct {
	// Store: StoreOptions.
	Store store.Options
	// Dedup: DedupOptions, the filter parameters (FilterParams) inside.
	Dedup dedup.Options
	// Consumer: ConsumerOptions.
	Consumer consumer.Options
	// LogLevel: LOG_LEVEL (SlogLevel).
	LogLevel slog.Level
}

// Options validates c (Validate) and returns each package's options from
// it, or Validate's *[Error].
func (c Config) Options() (Options, error) {
	if err := c.Validate(); err != nil {
		return Options{}, err
	}
	d, err := c.DedupOptions()
	if err != nil { // Validate refused it already
		return Options{}, err
	}
	return Options{Store: c.StoreOptions(), Dedup: d, Consumer: c.ConsumerOptions(), LogLevel: c.SlogLevel()}, nil
}

// StoreOptions are the store's options from DATA_DIR, PAGE_BYTES,
// CACHE_BYTES, FLUSH_BYTES and WRITE_BACK_INTERVAL. CacheBytes 0 is the
// share of the memory budget (internal/budget), which the caller fills
// in, with the Logger and the Registerer.
func (c Config) StoreOptions() store.Options {
	return store.Options{
		Dir:               c.DataDir,
		PageBytes:         int(c.PageBytes),
		CacheBytes:        int64(c.CacheBytes),
		FlushBytes:        int64(c.FlushBytes),
		WriteBackInterval: c.WriteBackInterval,
	}
}

// DedupOptions are the deduplicators' options from KEY, DELETE_HEADER,
// FORWARD_TOMBSTONES, MAX_OCCURRENCES, WINDOW_REFRESH, DELIVERY (exactly
// once stages changes) and the filter parameters (FilterParams). The
// error is dedup.ParseKey's, for a KEY it cannot parse.
func (c Config) DedupOptions() (dedup.Options, error) {
	key, err := dedup.ParseKey(c.Key)
	if err != nil {
		return dedup.Options{}, err
	}
	name, value, _ := c.DeleteHeaderNameValue()
	return dedup.Options{
		Key:            key,
		DeleteHeader:   name,
		DeleteValue:    value,
		DropTombstones: !c.ForwardTombstones,
		MaxOccurrences: c.MaxOccurrences,
		Refresh:        c.WindowRefresh,
		Staged:         c.Delivery == consumer.ExactlyOnce,
		Filter:         c.FilterParams(),
		ParamNames:     FilterVariables(),
	}, nil
}

// ConsumerOptions are the worker's options that variables set: the
// brokers, topics and group, the delivery, the intervals and the snapshot
// schedule. The caller fills in what the process provides: Dedup,
// Snapshots, the record and memory limits, Logger, Registerer and the
// client options.
func (c Config) ConsumerOptions() consumer.Options {
	return consumer.Options{
		Brokers:             c.Brokers,
		InputTopics:         c.InputTopics,
		OutputTopic:         c.OutputTopic,
		DuplicatesTopic:     c.DuplicatesTopic,
		DeadLetterTopic:     c.DeadLetterTopic,
		RepartitionTopic:    c.RepartitionTopic,
		MaxDecompressBytes:  int(c.MaxDecompressBytes),
		Group:               c.Group,
		InstanceID:          c.InstanceID,
		StartAtLatest:       c.StartOffset == StartLatest,
		SessionTimeout:      c.SessionTimeout,
		ShutdownTimeout:     c.ShutdownTimeout,
		MetadataMaxAge:      c.MetadataMaxAge,
		Delivery:            c.Delivery,
		TransactionalID:     c.TransactionalID,
		RebuildEmpty:        c.Rebuild == RebuildEmpty,
		FlushInterval:       c.FlushInterval,
		TransactionInterval: c.TransactionInterval,
		SnapshotInterval:    c.SnapshotInterval,
		SnapshotKeep:        c.SnapshotKeep,
	}
}

// filterFields are the Config fields that set each filter parameter:
// FilterParams' fields, and Key, which dedup stores as the key spec.
var filterFields = map[filter.Param]string{
	filter.ParamTargetFPR:       "TargetFPR",
	filter.ParamFingerprintBits: "FingerprintBits",
	filter.ParamBucketSize:      "BucketSize",
	filter.ParamCapacity:        "Capacity",
	filter.ParamMaxKicks:        "MaxKicks",
	filter.ParamExpansion:       "Expansion",
	filter.ParamPageBytes:       "PageBytes",
	filter.ParamWindow:          "Window",
	filter.ParamGenerations:     "WindowGenerations",
	filter.ParamKeySpec:         "Key",
}

// FilterVariables names the variable that sets each filter parameter
// (KDEDUP_CAPACITY for filter.ParamCapacity, KDEDUP_KEY for the key spec),
// for an error about a state written with other values
// (dedup.Options.ParamNames). The names come from Config's env tags.
func FilterVariables() map[filter.Param]string {
	vars := make(map[string]string)
	for _, f := range describeFields() {
		vars[f.name] = f.envVar
	}
	names := make(map[filter.Param]string, len(filterFields))
	for p, field := range filterFields {
		names[p] = vars[field]
	}
	return names
}

// Liveness is LIVENESS_TIMEOUT, or when it is 0 the value it derives:
// 2*SESSION_TIMEOUT plus a minute, at least 5 minutes.
func (c Config) Liveness() time.Duration {
	if c.LivenessTimeout > 0 {
		return c.LivenessTimeout
	}
	return max(5*time.Minute, 2*c.SessionTimeout+time.Minute)
}

// DeleteHeaderNameValue splits DELETE_HEADER at its first '='. ok is false
// when deletes are disabled (DELETE_HEADER is empty) or the value is
// invalid. The value may be empty: "NAME=" matches a header NAME whose value
// is empty.
func (c Config) DeleteHeaderNameValue() (name, value string, ok bool) {
	name, value, found := strings.Cut(c.DeleteHeader, "=")
	if !found || name == "" {
		return "", "", false
	}
	return name, value, true
}

// SASL mechanisms accepted in SASL_MECHANISM (matched case-insensitively).
var saslMechanisms = []string{"PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"}

func (c Config) validateSecurity(v *validator) {
	if !c.TLSEnabled {
		for field, value := range map[string]string{"TLSCAFile": c.TLSCAFile, "TLSCertFile": c.TLSCertFile, "TLSKeyFile": c.TLSKeyFile, "TLSServerName": c.TLSServerName} {
			if value != "" {
				v.add(field, value, "needs KDEDUP_TLS_ENABLED=true")
			}
		}
	} else if (c.TLSCertFile == "") != (c.TLSKeyFile == "") {
		if c.TLSCertFile == "" {
			v.add("TLSCertFile", "", "required with KDEDUP_TLS_KEY_FILE: a client certificate needs its key and the key its certificate")
		} else {
			v.add("TLSKeyFile", "", "required with KDEDUP_TLS_CERT_FILE: a client certificate needs its key and the key its certificate")
		}
	}
	switch {
	case c.SASLMechanism == "":
		for field, value := range map[string]string{"SASLUsername": c.SASLUsername, "SASLPassword": c.SASLPassword, "SASLPasswordFile": c.SASLPasswordFile} {
			if value != "" {
				v.add(field, value, "needs KDEDUP_SASL_MECHANISM")
			}
		}
	case c.SASLMechanismName() == "":
		v.add("SASLMechanism", c.SASLMechanism, "must be PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512")
	default:
		if c.SASLUsername == "" {
			v.add("SASLUsername", "", "required with KDEDUP_SASL_MECHANISM")
		}
		switch {
		case c.SASLPassword == "" && c.SASLPasswordFile == "":
			v.add("SASLPassword", "", "required with KDEDUP_SASL_MECHANISM, or KDEDUP_SASL_PASSWORD_FILE")
		case c.SASLPassword != "" && c.SASLPasswordFile != "":
			v.add("SASLPasswordFile", c.SASLPasswordFile, "set KDEDUP_SASL_PASSWORD or KDEDUP_SASL_PASSWORD_FILE, not both")
		}
	}
}

// SASLMechanismName is SASL_MECHANISM in upper case when it names a
// mechanism kdedup supports, otherwise "".
func (c Config) SASLMechanismName() string {
	m := strings.ToUpper(c.SASLMechanism)
	if slices.Contains(saslMechanisms, m) {
		return m
	}
	return ""
}

// SASLSecret is the SASL password: SASL_PASSWORD, or the content of the file
// SASL_PASSWORD_FILE names, without one trailing newline.
func (c Config) SASLSecret() string {
	if c.SASLPassword != "" {
		return c.SASLPassword
	}
	p := strings.TrimSuffix(c.SASLPasswordFile, "\n")
	return strings.TrimSuffix(p, "\r")
}

// SlogLevel is LOG_LEVEL as a slog.Level, matched case-insensitively;
// slog.LevelInfo for a value Validate rejects.
func (c Config) SlogLevel() slog.Level {
	switch strings.ToLower(c.LogLevel) {
	case "debug":
		return slog.LevelDebug
	case "warn":
		return slog.LevelWarn
	case "error":
		return slog.LevelError
	}
	return slog.LevelInfo
}

// Table describes every variable as rows of (variable, default, meaning), in
// the order of the fields of Config, for --help and the docs. A required
// variable's default reads "(required)"; an empty default is "". It is
// derived from the struct tags and does not depend on c.
func (c Config) Table() [][3]string {
	fields := describeFields()
	rows := make([][3]string, 0, len(fields))
	for _, f := range fields {
		def := f.def
		if f.required {
			def = "(required)"
		}
		rows = append(rows, [3]string{f.envVar, def, f.doc})
	}
	return rows
}

// field is what the struct tags say about one field of Config.
type field struct {
	name     string // Go field name
	envVar   string // full variable name, with Prefix
	def      string
	required bool
	secret   bool // never printed in problems
	file     bool // the variable names a file whose content is the value
	// redactUserinfo: printed in problems through RedactURL.
	redactUserinfo bool
	doc            string
}

func describeFields() []field {
	t := reflect.TypeFor[Config]()
	fields := make([]field, 0, t.NumField())
	for sf := range t.Fields() {
		key, opts, _ := strings.Cut(sf.Tag.Get("env"), ",")
		if key == "" || key == "-" {
			continue
		}
		fields = append(fields, field{
			name:           sf.Name,
			envVar:         Prefix + key,
			def:            sf.Tag.Get("envDefault"),
			required:       slices.Contains(strings.Split(opts, ","), "required"),
			secret:         sf.Tag.Get("secret") == "true",
			file:           slices.Contains(strings.Split(opts, ","), "file"),
			redactUserinfo: sf.Tag.Get("redact") == "userinfo",
			doc:            sf.Tag.Get("doc"),
		})
	}
	return fields
}

func sortProblems(problems []Problem, fields []field) {
	order := make(map[string]int, len(fields))
	for i, f := range fields {
		order[f.envVar] = i
	}
	slices.SortStableFunc(problems, func(a, b Problem) int {
		return order[a.Var] - order[b.Var]
	})
}
