package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/kdedup/kdedup/filter"
	"github.com/kdedup/kdedup/store"
)

// checkCmd answers whether a record with dedup key KEY in one
// topic-partition would be dropped by the state in a data directory,
// opened read-only: Contains and Count of the key in the partition's chain,
// the sub-filters holding matching fingerprints (with a window, the
// generation of each copy), and the chain's estimated false-positive rate.
// It exits 0 whether the key is present or not.
func checkCmd(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("check", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var sel stateFlags
	sel.register(fs)
	asJSON := fs.Bool("json", false, "print JSON (the shape is documented in cmd/kdedup/check.go, checkReport)")
	maxOcc := fs.Int("max-occurrences", envInt("KDEDUP_MAX_OCCURRENCES", 1), "KDEDUP_MAX_OCCURRENCES of the worker: a key is dropped once it has this many copies (KDEDUP_MAX_OCCURRENCES when set)")
	fs.Usage = func() {
		fmt.Fprint(stderr, `usage: kdedup check KEY -topic T -partition P [-data-dir DIR] [-json] [-max-occurrences N]

Answers whether the next record with dedup key KEY in topic-partition T/P
would be dropped, according to the state in DIR as of its checkpoint. KEY
is the dedup key as KDEDUP_KEY derives it from a record: the record key by
default, the header's value with header:NAME, the JSON value at PATH with
json:PATH (a JSON string's contents, another value's JSON text). It prints
whether the filter holds the key (no false negatives; a key never seen is
reported present with about the estimated false-positive rate printed), its
copies (what KDEDUP_MAX_OCCURRENCES compares), the sub-filters that hold
them and, with a window, the generation of each copy. Exit code 0 whether
the key is present or not; 1 or 2 on errors.
DIR is opened read-only; a running worker holds it locked: stop the
worker, or check a copy or snapshot (a worker cannot start on DIR while
check reads it). Use -topic=NAME for a topic named "--".

`)
		fs.PrintDefaults()
	}
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	switch {
	case len(pos) != 1:
		return fmt.Errorf("%w: check takes one KEY, got %d arguments (kdedup check -h)", errUsage, len(pos))
	case sel.topic == "" || sel.partition < 0:
		return fmt.Errorf("%w: check needs -topic and -partition (kdedup check -h)", errUsage)
	case *maxOcc < 1:
		return fmt.Errorf("%w: -max-occurrences %d: must be at least 1", errUsage, *maxOcc)
	}
	key := pos[0]
	db, err := openState(sel.dir, stderr)
	if err != nil {
		return err
	}
	defer db.Close()
	rep, err := check(db, store.TopicPartition{Topic: sel.topic, Partition: int32(sel.partition)}, []byte(key), *maxOcc)
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	writeCheckText(stdout, rep)
	return nil
}

// checkReport is the document `kdedup check -json` prints (version 2); see
// inspectReport for the conventions.
type checkReport struct {
	// Version is stateReportVersion.
	Version   int    `json:"version"`
	Topic     string `json:"topic"`
	Partition int32  `json:"partition"`
	// Key is the dedup key checked.
	Key string `json:"key"`
	// KeySpec is the KDEDUP_KEY the state was written with: Key is
	// meant as that spec derives it from a record.
	KeySpec string `json:"key_spec"`
	// Checkpoint is the offset the state reflects: the answer is for the
	// record at that offset, had it this key.
	Checkpoint checkpointReport `json:"checkpoint"`
	// Present is filter.Chain.Contains: false means the key is certainly
	// not held.
	Present bool `json:"present"`
	// Count is filter.Chain.Count: the copies of the key's fingerprint,
	// one per forwarded record of the key since its last delete, plus any
	// of other keys sharing it.
	Count int `json:"count"`
	// MaxOccurrences is the limit Duplicate compares Count with.
	MaxOccurrences int `json:"max_occurrences"`
	// Duplicate is Count >= MaxOccurrences: the next record with this key
	// would be dropped (a duplicate with a limit of 1, over the limit
	// above).
	Duplicate bool `json:"duplicate"`
	// EstimatedFPR is the chain's estimated false-positive rate
	// (filter.Stats.EstimatedFPR): the chance that a key never forwarded
	// is reported present.
	EstimatedFPR float64 `json:"estimated_fpr"`
	// Locations are the sub-filters holding a matching fingerprint, oldest
	// first (filter.Chain.Locate); empty when absent.
	Locations []locationReport `json:"locations"`
}

// locationReport is a sub-filter holding copies of the key's fingerprint
// (filter.Location).
type locationReport struct {
	// SubFilter is the sub-filter's ID, as inspect lists it.
	SubFilter uint32 `json:"sub_filter"`
	// Copies is the matching fingerprints in this sub-filter (1 or more).
	Copies int `json:"copies"`
	// Generations are, with a window, the generation of each copy, oldest
	// first (Copies of them, from the generation tag of each entry);
	// an empty list, never null, without a window.
	Generations []generationRef `json:"generations"`
}

// generationRef names one generation of a window.
type generationRef struct {
	// Generation is the generation number: it holds the record
	// timestamps [Generation*span, (Generation+1)*span) milliseconds since
	// the Unix epoch, span being params.generation_span_ms of inspect.
	Generation int64 `json:"generation"`
	// Start and End are those bounds as record times, [start, end) (null
	// only without a window, where no generation is listed).
	Start *string `json:"generation_start"`
	End   *string `json:"generation_end"`
}

// newGenerationRef is generation gen of a window under p.
func newGenerationRef(p filter.Params, gen int64) generationRef {
	r := generationRef{Generation: gen}
	r.Start, r.End = generationBounds(p, gen)
	return r
}

// check looks key up in the committed state of tp.
func check(db *store.DB, tp store.TopicPartition, key []byte, maxOcc int) (checkReport, error) {
	sp, chain, cp, meta, ok, err := openChain(db, tp)
	if err != nil {
		return checkReport{}, err
	}
	if !ok {
		return checkReport{}, noState(db, tp)
	}
	defer sp.Close()
	present, err := chain.Contains(key)
	if err != nil {
		return checkReport{}, err
	}
	count, err := chain.Count(key)
	if err != nil {
		return checkReport{}, err
	}
	locs, err := chain.Locate(key)
	if err != nil {
		return checkReport{}, err
	}
	rep := checkReport{
		Version: stateReportVersion, Topic: tp.Topic, Partition: tp.Partition, Key: string(key), KeySpec: meta.Params.KeySpec,
		Checkpoint: checkpointReport{Offset: cp.Offset, LeaderEpoch: cp.LeaderEpoch},
		Present:    present, Count: count, MaxOccurrences: maxOcc, Duplicate: count >= maxOcc,
		EstimatedFPR: chain.Stats().EstimatedFPR, Locations: []locationReport{},
	}
	for _, l := range locs {
		lr := locationReport{SubFilter: l.SubFilter.ID, Copies: l.Copies, Generations: []generationRef{}}
		for _, g := range l.Generations {
			lr.Generations = append(lr.Generations, newGenerationRef(meta.Params, g))
		}
		rep.Locations = append(rep.Locations, lr)
	}
	return rep, nil
}

// noState is the error for a topic-partition without committed state; it
// lists those that have some, since a typo is the likely cause.
func noState(db *store.DB, tp store.TopicPartition) error {
	tps, err := db.Partitions()
	if err != nil {
		return err
	}
	names := make([]string, len(tps))
	for i, t := range tps {
		names[i] = t.String()
	}
	have := "none"
	if len(names) > 0 {
		have = strings.Join(names, ", ")
	}
	return fmt.Errorf("no committed state for %s in this data directory (topic-partitions with state: %s)", tp, have)
}

func writeCheckText(w io.Writer, rep checkReport) {
	fmt.Fprintf(w, "%s/%d, key %q, state as of checkpoint offset %d (keys derived as KDEDUP_KEY=%s):\n", rep.Topic, rep.Partition, rep.Key, rep.Checkpoint.Offset, rep.KeySpec)
	switch {
	case !rep.Present:
		fmt.Fprintln(w, "  absent: the next record with this key would be forwarded (the filter has no false negatives)")
	case rep.Duplicate && rep.MaxOccurrences == 1:
		fmt.Fprintln(w, "  present: the next record with this key would be dropped as a duplicate")
	case rep.Duplicate:
		fmt.Fprintf(w, "  present, %d %s: the next record with this key would be dropped as over the limit of %d\n",
			rep.Count, plural(rep.Count, "copy", "copies"), rep.MaxOccurrences)
	default:
		fmt.Fprintf(w, "  present, %d %s: the next record with this key would be forwarded (limit %d)\n",
			rep.Count, plural(rep.Count, "copy", "copies"), rep.MaxOccurrences)
	}
	if rep.Present {
		fmt.Fprintf(w, "  copies of its fingerprint: %d\n", rep.Count)
		for _, l := range rep.Locations {
			fmt.Fprintf(w, "  in sub-filter %d: %d %s%s\n", l.SubFilter, l.Copies, plural(l.Copies, "copy", "copies"), copyGenerations(l.Generations))
		}
		fmt.Fprintf(w, "  estimated false-positive rate of the chain (the chance that a key never seen is reported present): %.3g\n", rep.EstimatedFPR)
	}
}

// copyGenerations describes the generations of a sub-filter's copies:
// ", of generation G (record time A .. B)" when every copy is of G, else
// each copy's in order, ", of generations G1 (...), G2 (...)"; "" without
// a window.
func copyGenerations(gens []generationRef) string {
	if len(gens) == 0 {
		return ""
	}
	same := true
	for _, g := range gens {
		same = same && g.Generation == gens[0].Generation
	}
	if same {
		return ", of generation " + describeGeneration(gens[0])
	}
	parts := make([]string, len(gens))
	for i, g := range gens {
		parts[i] = describeGeneration(g)
	}
	return ", of generations " + strings.Join(parts, ", ")
}

// describeGeneration is "G (record time A .. B)", or "G" without bounds.
func describeGeneration(g generationRef) string {
	if g.Start == nil {
		return strconv.FormatInt(g.Generation, 10)
	}
	return fmt.Sprintf("%d (record time %s .. %s)", g.Generation, *g.Start, *g.End)
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// parseInterspersed parses flags before and after positional arguments
// (the flag package stops at the first one) and returns the positional
// arguments; everything after "--" is positional.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, nil
		}
		if n := len(args) - len(rest); n > 0 && args[n-1] == "--" {
			return append(pos, rest...), nil
		}
		pos, args = append(pos, rest[0]), rest[1:]
	}
}

// envInt is the integer value of environment variable name, or def when it
// is unset or not an integer (the flag it defaults then says so).
func envInt(name string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil {
		return n
	}
	return def
}
