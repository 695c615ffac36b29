package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"text/tabwriter"
	"time"

	"github.com/kdedup/kdedup/filter"
	"github.com/kdedup/kdedup/internal/app"
	"github.com/kdedup/kdedup/store"
)

// reportVersion is the "version" of the JSON document inspect -snapshots
// prints (snapshotsReport), and stateReportVersion that of the documents
// inspect and check print of a data directory (inspectReport,
// checkReport). Each changes only when a field of its documents is
// removed, renamed or changes meaning; new fields may be added under the
// same version. Version 2 of the state documents lists generations per
// partition (inspect) and per copy (check), where version 1 gave each
// sub-filter one.
const (
	reportVersion      = 1
	stateReportVersion = 2
)

// inspectCmd prints the filter state of every topic-partition in a data
// directory, opened read-only: checkpoint, filter parameters, watermark,
// every sub-filter, with a window the live generations, and the
// partition's totals, as a table or as JSON. Every figure is the filter's
// own: its metadata, filter.Chain.Generations and filter.Chain.Stats.
func inspectCmd(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("inspect", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var sel stateFlags
	sel.register(fs)
	asJSON := fs.Bool("json", false, "print JSON (the shape is documented in cmd/kdedup/inspect.go, inspectReport, and cmd/kdedup/snapshots.go, snapshotsReport)")
	snapURL := fs.String("snapshots", "", "list the snapshots in this object store (a KDEDUP_SNAPSHOT_URL) instead of a data directory")
	group := fs.String("group", envOr("KDEDUP_GROUP", "kdedup"), "with -snapshots: the consumer group whose snapshots to list (KDEDUP_GROUP when set)")
	verify := fs.Bool("verify", false, "with -snapshots: download every snapshot and check it against its manifest (size, SHA-256, structure, metadata); exit 1 if any fails")
	fs.Usage = func() {
		fmt.Fprint(stderr, `usage: kdedup inspect [-data-dir DIR] [-json] [-topic T] [-partition P]
       kdedup inspect -snapshots URL [-group G] [-verify] [-json] [-topic T] [-partition P]

Prints the dedup state of each topic-partition in DIR: checkpoint offset,
filter parameters, watermark, every sub-filter (pages, slots, fingerprint
width, items, load factor, estimated false-positive rate, bytes), with a
window the items of each live generation, and the partition's totals. DIR
is opened read-only; a running worker holds it locked: stop the worker, or
inspect a copy or snapshot (a worker cannot start on DIR while inspect
reads it).

With -snapshots, lists the snapshots of consumer group G's topic-partitions
in the object store at URL, newest first (offset, time, bytes), and with -verify checks
each one's object; the store's credentials come from the SDK's usual
sources, as for the worker.

`)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%w: inspect takes no arguments, got %q", errUsage, fs.Args())
	}
	if *snapURL != "" {
		return inspectSnapshots(*snapURL, *group, sel, *verify, *asJSON, stdout)
	}
	if *verify {
		return fmt.Errorf("%w: -verify needs -snapshots", errUsage)
	}
	db, err := openState(sel.dir, stderr)
	if err != nil {
		return err
	}
	defer db.Close()
	tps, err := db.Partitions()
	if err != nil {
		return err
	}
	rep := inspectReport{Version: stateReportVersion, DataDir: sel.dir, Partitions: []partitionReport{}}
	for _, tp := range tps {
		if !sel.matches(tp) {
			continue
		}
		pr, ok, err := inspectPartition(db, tp)
		if err != nil {
			return err
		}
		if !ok {
			fmt.Fprintf(stderr, "kdedup inspect: %s has no committed write batch; skipped\n", tp)
			continue
		}
		rep.Partitions = append(rep.Partitions, pr)
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	writeInspectText(stdout, rep)
	return nil
}

// inspectReport is the document `kdedup inspect -json` prints (version 2).
// Every field is always present; fields documented as null are JSON null
// when the state has no such value. Times are RFC 3339 in UTC with
// milliseconds; record times are the records' timestamps, never the wall
// clock.
type inspectReport struct {
	// Version is stateReportVersion.
	Version int `json:"version"`
	// DataDir is the directory inspected, as given.
	DataDir string `json:"data_dir"`
	// Partitions are the topic-partitions with committed state (after the
	// -topic and -partition selection), sorted by topic and partition.
	Partitions []partitionReport `json:"partitions"`
}

// partitionReport is one topic-partition's state as of its last committed
// write batch.
type partitionReport struct {
	Topic     string `json:"topic"`
	Partition int32  `json:"partition"`
	// Checkpoint is the next input offset the state reflects.
	Checkpoint checkpointReport `json:"checkpoint"`
	// FormatVersion is the filter's metadata and page format version.
	FormatVersion int          `json:"format_version"`
	Params        paramsReport `json:"params"`
	// WatermarkMillis is the highest record timestamp seen, in
	// milliseconds since the Unix epoch; null without a window or before
	// the first record. Watermark is the same time in RFC 3339.
	WatermarkMillis *int64  `json:"watermark_ms"`
	Watermark       *string `json:"watermark"`
	// SubFilters are every sub-filter of the chain, oldest first: the
	// order of the chain metadata. With a window they hold the entries of
	// every generation together, each entry tagged with its own.
	SubFilters []subFilterReport `json:"sub_filters"`
	// Generations are, with a window, the live generations that took an
	// entry since they began, oldest first, with their live entries
	// across all sub-filters (filter.Chain.Generations; as many as
	// Totals.Generations); an empty list without a window.
	Generations []generationReport `json:"generations"`
	// Totals are filter.Chain.Stats.
	Totals totalsReport `json:"totals"`
}

type checkpointReport struct {
	// Offset is the next input offset: every record below it is in the
	// filter, none at or above it.
	Offset int64 `json:"offset"`
	// LeaderEpoch is that of the record before Offset, -1 when unknown.
	LeaderEpoch int32 `json:"leader_epoch"`
}

// paramsReport are the filter parameters stored with the state
// (filter.Params, defaults applied); they are the KDEDUP_* values the
// state was written with.
type paramsReport struct {
	// TargetFPR is KDEDUP_TARGET_FPR; 0 when FingerprintBits fixes the
	// width.
	TargetFPR float64 `json:"target_fpr"`
	// FingerprintBits is KDEDUP_FINGERPRINT_BITS; 0 when widths derive
	// from TargetFPR.
	FingerprintBits int    `json:"fingerprint_bits"`
	BucketSize      int    `json:"bucket_size"`
	Capacity        uint64 `json:"capacity"`
	MaxKicks        int    `json:"max_kicks"`
	Expansion       int    `json:"expansion"`
	PageBytes       int    `json:"page_bytes"`
	// WindowMillis is KDEDUP_WINDOW in milliseconds, 0 without a window.
	WindowMillis int64 `json:"window_ms"`
	// Generations is KDEDUP_WINDOW_GENERATIONS, 0 without a window.
	Generations int `json:"generations"`
	// GenerationSpanMillis is the record time one generation covers
	// (window/generations in whole milliseconds), 0 without a window.
	GenerationSpanMillis int64 `json:"generation_span_ms"`
	// GenerationBits is the width in bits of the generation tag each slot
	// stores beside its fingerprint (filter.Params.GenerationBits), 0
	// without a window: a slot of a sub-filter is its fingerprint_bits
	// plus these.
	GenerationBits int `json:"generation_bits"`
	// Key is KDEDUP_KEY, the dedup key spec ("key", "header:NAME" or
	// "json:PATH"); a worker with another refuses the state.
	Key string `json:"key"`
}

// subFilterReport is one sub-filter (filter.SubFilter).
type subFilterReport struct {
	ID    uint32 `json:"id"`
	Pages uint64 `json:"pages"`
	// RootPages is the pages the sub-filter started with; Pages-RootPages
	// of its pages came from splits.
	RootPages uint64 `json:"root_pages"`
	// Entries counts the entries by fingerprint length in bits (only
	// lengths that have entries).
	Entries map[int]uint64 `json:"entries_by_length"`
	Buckets uint64         `json:"buckets"`
	// Slots is the sub-filter's capacity in fingerprints.
	Slots uint64 `json:"slots"`
	// FingerprintBits is the fingerprint width of the sub-filter's
	// entries, without the generation tag (params.generation_bits).
	FingerprintBits int `json:"fingerprint_bits"`
	// Items is the live entries, of every generation.
	Items uint64 `json:"items"`
	// LoadFactor is Items/Slots.
	LoadFactor float64 `json:"load_factor"`
	// EstimatedFPR is filter.SubFilter.EstimatedFPR: the sub-filter's
	// share of the chain's estimated false-positive rate.
	EstimatedFPR float64 `json:"estimated_fpr"`
	// Bytes is Pages*PageBytes (pages never written take no disk space).
	Bytes uint64 `json:"bytes"`
}

// generationReport is one live generation of a window
// (filter.GenerationItems).
type generationReport struct {
	generationRef
	// Items is the generation's live entries across all sub-filters
	// (those deleted since count no more).
	Items uint64 `json:"items"`
}

// totalsReport is filter.Stats of the chain.
type totalsReport struct {
	SubFilters            int     `json:"sub_filters"`
	Generations           int     `json:"generations"`
	Items                 uint64  `json:"items"`
	Slots                 uint64  `json:"slots"`
	LoadFactor            float64 `json:"load_factor"`
	NewestLoadFactor      float64 `json:"newest_load_factor"`
	EstimatedFPR          float64 `json:"estimated_fpr"`
	Bytes                 uint64  `json:"bytes"`
	NewestFingerprintBits int     `json:"newest_fingerprint_bits"`
	NearFull              bool    `json:"near_full"`
}

// inspectPartition reads one topic-partition's committed state; ok is
// false when it has none.
func inspectPartition(db *store.DB, tp store.TopicPartition) (pr partitionReport, ok bool, err error) {
	sp, chain, cp, meta, ok, err := openChain(db, tp)
	if err != nil || !ok {
		return partitionReport{}, ok, err
	}
	defer sp.Close()
	p := meta.Params
	pr = partitionReport{
		Topic:         tp.Topic,
		Partition:     tp.Partition,
		Checkpoint:    checkpointReport{Offset: cp.Offset, LeaderEpoch: cp.LeaderEpoch},
		FormatVersion: meta.FormatVersion,
		Params: paramsReport{
			TargetFPR: p.TargetFPR, FingerprintBits: p.FingerprintBits, BucketSize: p.BucketSize,
			Capacity: p.Capacity, MaxKicks: p.MaxKicks, Expansion: p.Expansion, PageBytes: p.PageBytes,
			WindowMillis: p.Window.Milliseconds(), Generations: p.Generations, GenerationSpanMillis: p.SpanMillis(),
			GenerationBits: p.GenerationBits(), Key: p.KeySpec,
		},
		SubFilters:  []subFilterReport{},
		Generations: []generationReport{},
	}
	st := chain.Stats()
	if st.Watermark != math.MinInt64 {
		wm, s := st.Watermark, recordTime(st.Watermark)
		pr.WatermarkMillis, pr.Watermark = &wm, &s
	}
	for _, sf := range chain.SubFilters() {
		slots := sf.Slots(p.BucketSize)
		load := float64(sf.Items) / float64(slots)
		r := subFilterReport{
			ID: sf.ID, Pages: sf.Pages, RootPages: sf.RootPages, Entries: map[int]uint64{},
			Buckets: sf.Buckets(), Slots: slots,
			FingerprintBits: sf.FingerprintBits, Items: sf.Items, LoadFactor: load,
			EstimatedFPR: sf.EstimatedFPR(),
			Bytes:        sf.Pages * uint64(p.PageBytes),
		}
		for i, n := range sf.Lengths {
			if n > 0 {
				r.Entries[sf.FingerprintBits-1+i] = n
			}
		}
		pr.SubFilters = append(pr.SubFilters, r)
	}
	for _, g := range chain.Generations() {
		pr.Generations = append(pr.Generations, generationReport{generationRef: newGenerationRef(p, g.Generation), Items: g.Items})
	}
	pr.Totals = totalsReport{
		SubFilters: st.SubFilters, Generations: st.Generations, Items: st.Items, Slots: st.Slots,
		LoadFactor: st.LoadFactor, NewestLoadFactor: st.NewestLoadFactor, EstimatedFPR: st.EstimatedFPR,
		Bytes: st.Bytes, NewestFingerprintBits: st.NewestFingerprintBits, NearFull: st.NearFull,
	}
	return pr, true, nil
}

// writeInspectText prints rep for people: a few lines per topic-partition,
// a table of its sub-filters and, with a window, a line per live
// generation.
func writeInspectText(w io.Writer, rep inspectReport) {
	if len(rep.Partitions) == 0 {
		fmt.Fprintf(w, "no topic-partition with committed state in %s\n", rep.DataDir)
		return
	}
	for i, pr := range rep.Partitions {
		if i > 0 {
			fmt.Fprintln(w)
		}
		p := pr.Params
		fmt.Fprintf(w, "%s/%d: checkpoint offset %d (leader epoch %d)\n", pr.Topic, pr.Partition, pr.Checkpoint.Offset, pr.Checkpoint.LeaderEpoch)
		width := fmt.Sprintf("target FPR %g (fingerprint widths derived from it)", p.TargetFPR)
		if p.FingerprintBits != 0 {
			width = fmt.Sprintf("fixed fingerprint width %d bits", p.FingerprintBits)
		}
		fmt.Fprintf(w, "  filter:    %s, bucket size %d, capacity %d, page bytes %d, expansion %d, max kicks %d, format version %d\n",
			width, p.BucketSize, p.Capacity, p.PageBytes, p.Expansion, p.MaxKicks, pr.FormatVersion)
		fmt.Fprintf(w, "  key:       %s (KDEDUP_KEY)\n", p.Key)
		if p.WindowMillis != 0 {
			fmt.Fprintf(w, "  window:    %s in %d generations of %s, a %d-bit generation tag in each slot\n",
				time.Duration(p.WindowMillis)*time.Millisecond, p.Generations, time.Duration(p.GenerationSpanMillis)*time.Millisecond, p.GenerationBits)
		} else {
			fmt.Fprintln(w, "  window:    none (keys are remembered until deleted)")
		}
		if pr.Watermark != nil {
			fmt.Fprintf(w, "  watermark: %s (record time)\n", *pr.Watermark)
		} else {
			fmt.Fprintln(w, "  watermark: none")
		}
		tw := tabwriter.NewWriter(w, 2, 8, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "\tsub-filter\tpages\tslots\tfp bits\titems\tload\test. FPR\tbytes\t")
		for _, s := range pr.SubFilters {
			fmt.Fprintf(tw, "\t%d\t%d\t%d\t%d\t%d\t%.4f\t%.3g\t%d\t\n",
				s.ID, s.Pages, s.Slots, s.FingerprintBits, s.Items, s.LoadFactor, s.EstimatedFPR, s.Bytes)
		}
		tw.Flush()
		for _, g := range pr.Generations {
			fmt.Fprintf(w, "  generation %s: %d %s\n", describeGeneration(g.generationRef), g.Items, plural(int(g.Items), "item", "items"))
		}
		t := pr.Totals
		fmt.Fprintf(w, "  total:     %d items in %d slots, load %.4f, estimated FPR %.3g, %d bytes, %d sub-filters in %d %s, near full: %s\n",
			t.Items, t.Slots, t.LoadFactor, t.EstimatedFPR, t.Bytes, t.SubFilters, t.Generations, plural(t.Generations, "generation", "generations"), yesNo(t.NearFull))
	}
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// stateFlags select the state inspect and check read.
type stateFlags struct {
	dir       string
	topic     string
	partition int
}

func (s *stateFlags) register(fs *flag.FlagSet) {
	dir := os.Getenv("KDEDUP_DATA_DIR")
	if dir == "" {
		dir = "./data"
	}
	fs.StringVar(&s.dir, "data-dir", dir, "data directory of a stopped worker (KDEDUP_DATA_DIR when set)")
	fs.StringVar(&s.topic, "topic", "", "input topic (required by check; inspect: every topic when empty)")
	fs.IntVar(&s.partition, "partition", -1, "input partition (required by check; inspect: every partition when -1)")
}

func (s *stateFlags) matches(tp store.TopicPartition) bool {
	return (s.topic == "" || tp.Topic == s.topic) && (s.partition < 0 || tp.Partition == int32(s.partition))
}

// openState opens the worker state in dir read-only, with the page size
// its filters were written with (the store needs it to read pages; every
// partition of a directory shares it, as KDEDUP_PAGE_BYTES must not change).
// A missing directory is a usage error; a directory a running worker holds
// (store.ErrLocked) says what to do instead.
func openState(dir string, stderr io.Writer) (*store.DB, error) {
	fi, err := os.Stat(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return nil, fmt.Errorf("%w: data directory %s does not exist (set -data-dir or KDEDUP_DATA_DIR)", errUsage, dir)
	case err != nil:
		return nil, fmt.Errorf("reading data directory %s: %w", dir, err)
	case !fi.IsDir():
		return nil, fmt.Errorf("%w: data directory %s is not a directory", errUsage, dir)
	}
	log := app.NewLogger(stderr, slog.LevelWarn, "text")
	open := func(pageBytes int) (*store.DB, error) {
		// A small cache: inspect reads no page, check one per sub-filter.
		db, err := store.Open(store.Options{Dir: dir, ReadOnly: true, PageBytes: pageBytes, CacheBytes: 1 << 20, Logger: log})
		if errors.Is(err, store.ErrLocked) {
			return nil, fmt.Errorf("data directory %s is locked by a running worker: stop the worker (kdedup run), or inspect a copy or snapshot of the directory: %w", dir, err)
		}
		if err != nil {
			return nil, fmt.Errorf("opening data directory %s read-only: %w", dir, err)
		}
		return db, nil
	}
	db, err := open(0)
	if err != nil {
		return nil, err
	}
	pageBytes, err := statePageBytes(db)
	switch {
	case err != nil:
		db.Close()
		return nil, err
	case pageBytes == 0 || pageBytes == store.DefaultPageBytes:
		return db, nil
	}
	if err := db.Close(); err != nil {
		return nil, err
	}
	return open(pageBytes)
}

// statePageBytes returns the page size in the chain metadata of the first
// topic-partition that has some, 0 when none has.
func statePageBytes(db *store.DB) (int, error) {
	tps, err := db.Partitions()
	if err != nil {
		return 0, err
	}
	for _, tp := range tps {
		sp, err := db.Partition(tp.Topic, tp.Partition)
		if err != nil {
			return 0, err
		}
		meta := sp.Meta()
		sp.Close()
		if len(meta) == 0 {
			continue
		}
		m, err := filter.DecodeMeta(meta)
		if err != nil {
			return 0, fmt.Errorf("decoding the filter metadata of %s: %w", tp, err)
		}
		return m.Params.PageBytes, nil
	}
	return 0, nil
}

// openChain opens the filter of tp as of its last committed write batch;
// the caller closes sp once done with chain. ok is false (and sp nil) when
// tp has no committed state.
func openChain(db *store.DB, tp store.TopicPartition) (sp *store.PartitionState, chain *filter.Chain, cp store.Checkpoint, meta filter.Meta, ok bool, err error) {
	if sp, err = db.Partition(tp.Topic, tp.Partition); err != nil {
		return nil, nil, cp, meta, false, err
	}
	fail := func(err error) (*store.PartitionState, *filter.Chain, store.Checkpoint, filter.Meta, bool, error) {
		sp.Close()
		return nil, nil, cp, meta, false, err
	}
	if cp, ok = sp.Checkpoint(); !ok || len(sp.Meta()) == 0 {
		return fail(nil)
	}
	if meta, err = filter.DecodeMeta(sp.Meta()); err != nil {
		return fail(fmt.Errorf("decoding the filter metadata of %s: %w", tp, err))
	}
	// The stored parameters open the chain: they are what it was written with.
	if chain, err = filter.Open(sp.Meta(), meta.Params, sp); err != nil {
		return fail(fmt.Errorf("opening the filter of %s: %w", tp, err))
	}
	return sp, chain, cp, meta, true, nil
}

// generationBounds returns the record times generation gen covers under
// p, [start, end) (filter.Params.GenerationStart), or nils without a
// window.
func generationBounds(p filter.Params, gen int64) (start, end *string) {
	if p.SpanMillis() == 0 {
		return nil, nil
	}
	s, e := recordTime(p.GenerationStart(gen)), recordTime(p.GenerationStart(gen+1))
	return &s, &e
}

// recordTime formats a record timestamp (ms since the Unix epoch) in RFC
// 3339, UTC, with milliseconds.
func recordTime(ms int64) string {
	return time.UnixMilli(ms).UTC().Format("2006-01-02T15:04:05.000Z07:00")
}

// envOr returns the environment variable name, or def when it is unset or
// empty.
func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
