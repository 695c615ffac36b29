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

	"github.com/kdedup/kdedup/store"
)

// checkCmd answers whether a record with dedup key KEY in one
// topic-partition would be dropped by the state in a data directory,
// opened read-only: Contains and Count of the key in the partition's chain,
// the sub-filters holding matching fingerprints, and the chain's estimated
// false-positive rate. It exits 0 whether the key is present or not.
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
copies (what
KDEDUP_MAX_OCCURRENCES compares) and the generations and sub-filters that
hold them. Exit code 0 whether the key is present or not; 1 or 2 on errors.
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

// checkReport is the document `kdedup check -json` prints (version 1); see
// inspectReport for the conventions.
type checkReport struct {
	// Version is reportVersion.
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

type locationReport struct {
	SubFilter  uint32 `json:"sub_filter"`
	Generation int64  `json:"generation"`
	// GenerationStart and GenerationEnd bound the generation's record
	// timestamps, [start, end); null without a window.
	GenerationStart *string `json:"generation_start"`
	GenerationEnd   *string `json:"generation_end"`
	// Copies is the matching fingerprints in this sub-filter.
	Copies int `json:"copies"`
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
		Version: reportVersion, Topic: tp.Topic, Partition: tp.Partition, Key: string(key), KeySpec: meta.Params.KeySpec,
		Checkpoint: checkpointReport{Offset: cp.Offset, LeaderEpoch: cp.LeaderEpoch},
		Present:    present, Count: count, MaxOccurrences: maxOcc, Duplicate: count >= maxOcc,
		EstimatedFPR: chain.Stats().EstimatedFPR, Locations: []locationReport{},
	}
	for _, l := range locs {
		lr := locationReport{SubFilter: l.SubFilter.ID, Generation: l.SubFilter.Generation, Copies: l.Copies}
		lr.GenerationStart, lr.GenerationEnd = generationBounds(meta.Params, l.SubFilter.Generation)
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
			span := ""
			if l.GenerationStart != nil {
				span = fmt.Sprintf(" (record time %s .. %s)", *l.GenerationStart, *l.GenerationEnd)
			}
			fmt.Fprintf(w, "  in generation %d%s, sub-filter %d: %d %s\n", l.Generation, span, l.SubFilter, l.Copies, plural(l.Copies, "copy", "copies"))
		}
		fmt.Fprintf(w, "  estimated false-positive rate of the chain (the chance that a key never seen is reported present): %.3g\n", rep.EstimatedFPR)
	}
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
