// Command benchplot draws the figures of BENCHMARKS.md as PNG files from
// benchmark output saved as text or CSV:
//
//	go run ./internal/benchplot -kind fpr -in docs/bench/fpr-growth.csv -out docs/bench/fpr-growth.png
//	go run ./internal/benchplot -kind growth -in docs/bench/growth-in-place-200m.csv -out docs/bench/growth-in-place.png
//	go run ./internal/benchplot -kind load -op contains -in docs/bench/peers.txt -out docs/bench/contains-load.png
//	go run ./internal/benchplot -kind load -op insert -in docs/bench/peers.txt -out docs/bench/insert-load.png
//	go run ./internal/benchplot -kind throughput -in docs/bench/bench.txt -out docs/bench/throughput.png
//	go run ./internal/benchplot -kind scale -op cpu -in docs/bench/scale.txt -out docs/bench/scale-cpu.png
//	go run ./internal/benchplot -kind scale -op bytes -in docs/bench/scale.txt -out docs/bench/scale-bytes.png
//	go run ./internal/benchplot -kind scale -op rss -in docs/bench/scale-100m.txt -out docs/bench/scale-100m-rss.png
//
// Inputs:
//   - fpr: the CSV written by the filter's TestGrowthFPRData (columns
//     growth, sub_filters, keys, then FPR columns; an empty cell is no point).
//   - load: `go test -bench Peer` output of filter/peer_bench_test.go; with
//     -count above 1 each point is the median.
//   - throughput: `kdedup-bench peers` output (its "round N: name: ... records/s"
//     lines and the "steady state" line after each); each bar is the median
//     over rounds.
//   - scale: `go test -bench Scale` output of store/scale_bench_test.go
//     (its "BenchmarkScale/keys=K/store=S/cache=CMiB" result lines), or
//     `go test -bench PrefetchRate` output (the worker's path through
//     polls; its dup rounds a series of their own). With -op cpu, CPU µs
//     per record against keys held; with -op bytes, bytes per record
//     handed to Badger (user) and written to disk against keys held; with
//     -op rss, the peak resident memory of the measured phase. The x axis is logarithmic, and so is the y axis when the
//     largest value is over 20 times the smallest; one series per store and cache size
//     (and per kind of bytes); with -count above 1 each point is the median.
package main

import (
	"bufio"
	"bytes"
	"cmp"
	"encoding/csv"
	"errors"
	"flag"
	"fmt"
	"image/color"
	"io"
	"maps"
	"math"
	"os"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

func main() {
	if err := run(os.Args[1:], os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "benchplot:", err)
		os.Exit(1)
	}
}

func run(args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("benchplot", flag.ContinueOnError)
	fs.SetOutput(stderr)
	kind := fs.String("kind", "", "fpr, growth, load, throughput or scale")
	op := fs.String("op", "", "with -kind load: contains (default), insert or insert+delete; with -kind scale: cpu (default), bytes or rss")
	in := fs.String("in", "", "input file")
	out := fs.String("out", "", "output PNG file")
	title := fs.String("title", "", "plot title (default: one per kind)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *in == "" || *out == "" {
		return errors.New("-in and -out are required")
	}
	f, err := os.Open(*in)
	if err != nil {
		return err
	}
	defer f.Close()
	var p *plot.Plot
	switch *kind {
	case "fpr":
		p, err = fprPlot(f)
	case "growth":
		p, err = growthPlot(f)
	case "load":
		p, err = loadPlot(f, cmp.Or(*op, "contains"))
	case "throughput":
		p, err = throughputPlot(f)
	case "scale":
		p, err = scalePlot(f, cmp.Or(*op, "cpu"))
	default:
		return fmt.Errorf("-kind %q: want fpr, growth, load, throughput or scale", *kind)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", *in, err)
	}
	if *title != "" {
		p.Title.Text = *title
	}
	return p.Save(22*vg.Centimeter, 14*vg.Centimeter, *out)
}

// fprPlot draws every FPR column of the CSV against growth (log-log).
func fprPlot(r io.Reader) (*plot.Plot, error) {
	rows, err := csv.NewReader(r).ReadAll()
	if err != nil {
		return nil, err
	}
	if len(rows) < 2 || len(rows[0]) < 4 || rows[0][0] != "growth" {
		return nil, errors.New("want a CSV with a header growth,sub_filters,keys,<fpr columns>")
	}
	header := rows[0]
	p := plot.New()
	p.Title.Text = "False-positive rate as the chain grows"
	p.X.Label.Text = "growth (keys / capacity of the first sub-filter)"
	p.Y.Label.Text = "false-positive rate per lookup"
	p.X.Scale, p.X.Tick.Marker = plot.LogScale{}, plot.LogTicks{Prec: -1}
	p.Y.Scale, p.Y.Tick.Marker = plot.LogScale{}, plot.LogTicks{Prec: -1}
	p.Legend.Top, p.Legend.Left = true, true
	var lines []any
	for c := 3; c < len(header); c++ {
		var xys plotter.XYs
		for _, row := range rows[1:] {
			if c >= len(row) || row[c] == "" {
				continue
			}
			x, err1 := strconv.ParseFloat(row[0], 64)
			y, err2 := strconv.ParseFloat(row[c], 64)
			if err := errors.Join(err1, err2); err != nil {
				return nil, err
			}
			if y > 0 {
				xys = append(xys, plotter.XY{X: x, Y: y})
			}
		}
		if len(xys) > 0 {
			lines = append(lines, strings.ReplaceAll(header[c], "_", " "), xys)
		}
	}
	if err := plotutil.AddLinePoints(p, lines...); err != nil {
		return nil, err
	}
	p.Add(plotter.NewGrid())
	return p, nil
}

// growthPlot draws bits of pages per key against keys held (log x), from
// the CSV BenchmarkChainGrowth writes (keys,bits_per_key,...).
func growthPlot(r io.Reader) (*plot.Plot, error) {
	rows, err := csv.NewReader(r).ReadAll()
	if err != nil {
		return nil, err
	}
	if len(rows) < 2 || len(rows[0]) < 2 || rows[0][0] != "keys" || rows[0][1] != "bits_per_key" {
		return nil, errors.New("want a CSV with a header keys,bits_per_key,...")
	}
	var xys plotter.XYs
	for _, row := range rows[1:] {
		x, err1 := strconv.ParseFloat(row[0], 64)
		y, err2 := strconv.ParseFloat(row[1], 64)
		if err := errors.Join(err1, err2); err != nil {
			return nil, err
		}
		xys = append(xys, plotter.XY{X: x, Y: y})
	}
	p := plot.New()
	p.Title.Text = "Bits of pages per key as one chain grows"
	p.X.Label.Text = "keys held"
	p.Y.Label.Text = "bits of pages per key"
	p.X.Scale, p.X.Tick.Marker = plot.LogScale{}, plot.LogTicks{Prec: -1}
	if err := plotutil.AddLinePoints(p, "bits per key", xys); err != nil {
		return nil, err
	}
	p.Add(plotter.NewGrid())
	return p, nil
}

// benchLine matches one result line of go test -bench output.
var benchLine = regexp.MustCompile(`^(Benchmark\S+?)(?:-\d+)?\s+\d+\s+(.*)$`)

// benchResults returns, for each benchmark name (without the GOMAXPROCS
// suffix), every value of unit it reported.
func benchResults(r io.Reader, unit string) (map[string][]float64, error) {
	res := map[string][]float64{}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		m := benchLine.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		fields := strings.Fields(m[2])
		for i := 0; i+1 < len(fields); i += 2 {
			if fields[i+1] != unit {
				continue
			}
			v, err := strconv.ParseFloat(fields[i], 64)
			if err != nil {
				return nil, fmt.Errorf("%q: %w", sc.Text(), err)
			}
			res[m[1]] = append(res[m[1]], v)
		}
	}
	return res, sc.Err()
}

var peerName = regexp.MustCompile(`^BenchmarkPeer(Contains|Insert)/load=(\d+)/(?:(insert|insert\+delete)/)?(\w+)$`)

// loadPlot draws ns/op against load for each filter, for one operation of
// the peer benchmarks.
func loadPlot(r io.Reader, op string) (*plot.Plot, error) {
	res, err := benchResults(r, "ns/op")
	if err != nil {
		return nil, err
	}
	series := map[string]plotter.XYs{}
	for name, vs := range res {
		m := peerName.FindStringSubmatch(name)
		if m == nil {
			continue
		}
		got := strings.ToLower(m[1])
		if m[3] != "" {
			got = m[3]
		}
		if got != op {
			continue
		}
		load, _ := strconv.Atoi(m[2])
		series[m[4]] = append(series[m[4]], plotter.XY{X: float64(load), Y: median(vs)})
	}
	if len(series) == 0 {
		return nil, fmt.Errorf("no BenchmarkPeer results for op %q", op)
	}
	p := plot.New()
	p.Title.Text = fmt.Sprintf("%s: ns/op against load factor, 2^20 slots, same keys", op)
	p.X.Label.Text = "load factor (%)"
	p.Y.Label.Text = "ns/op"
	p.Y.Min = 0
	p.Legend.Top, p.Legend.Left = true, true
	names := make([]string, 0, len(series))
	for n := range series {
		names = append(names, n)
	}
	sort.Strings(names)
	var lines []any
	for _, n := range names {
		xys := series[n]
		sort.Slice(xys, func(i, j int) bool { return xys[i].X < xys[j].X })
		lines = append(lines, n, xys)
	}
	if err := plotutil.AddLinePoints(p, lines...); err != nil {
		return nil, err
	}
	p.Add(plotter.NewGrid())
	return p, nil
}

var (
	roundLine  = regexp.MustCompile(`^round \d+: (\S+): \d+ records in \S+: (\d+) records/s$`)
	steadyLine = regexp.MustCompile(`^steady state .*: (\d+) records/s$`)
)

// throughputPlot draws, for each run kind of kdedup-bench peers, a bar of its
// records/s from group join to last commit and one of its steady-state
// records/s (each the median over rounds), values written above the bars.
func throughputPlot(r io.Reader) (*plot.Plot, error) {
	rates := map[string][]float64{}
	var order []string
	last := ""
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if m := roundLine.FindStringSubmatch(line); m != nil {
			v, _ := strconv.ParseFloat(m[2], 64)
			last = m[1] + "\njoin to last commit"
			if _, ok := rates[last]; !ok {
				order = append(order, last)
			}
			rates[last] = append(rates[last], v)
			continue
		}
		if m := steadyLine.FindStringSubmatch(line); m != nil && last != "" {
			v, _ := strconv.ParseFloat(m[1], 64)
			name := strings.Replace(last, "join to last commit", "steady state", 1)
			if _, ok := rates[name]; !ok {
				order = append(order, name)
			}
			rates[name] = append(rates[name], v)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(order) == 0 {
		return nil, errors.New("no \"round N: name: ... records/s\" lines")
	}
	sort.SliceStable(order, func(i, j int) bool {
		return strings.Contains(order[i], "join") && !strings.Contains(order[j], "join")
	})
	vals := make(plotter.Values, len(order))
	var labels plotter.XYLabels
	for i, n := range order {
		vals[i] = median(rates[n])
		labels.XYs = append(labels.XYs, plotter.XY{X: float64(i), Y: vals[i]})
		labels.Labels = append(labels.Labels, fmt.Sprintf("%.0f", vals[i]))
	}
	p := plot.New()
	p.Title.Text = fmt.Sprintf("kdedup-bench peers: records/s, median of %d rounds", len(rates[order[0]]))
	p.Y.Label.Text = "records/s"
	p.Y.Min = 0
	bars, err := plotter.NewBarChart(vals, 2*vg.Centimeter)
	if err != nil {
		return nil, err
	}
	bars.Color = color.RGBA{R: 70, G: 110, B: 180, A: 255}
	p.Add(bars)
	lbl, err := plotter.NewLabels(labels)
	if err != nil {
		return nil, err
	}
	for i := range lbl.TextStyle {
		lbl.TextStyle[i].XAlign = -0.5 // centered on the bar
		lbl.TextStyle[i].YAlign = 0    // above the value
	}
	p.Add(lbl)
	p.NominalX(order...)
	p.X.Min, p.X.Max = -0.7, float64(len(order))-0.3 // room for the outer bars
	p.Y.Max = slices.Max(vals) * 1.15
	return p, nil
}

var scaleName = regexp.MustCompile(`^BenchmarkScale/keys=(\d+)/store=(\w+)/cache=(\d+)MiB$`)

// pollsName matches BenchmarkPrefetchRate's result lines (the worker's
// path: polls prefetched, then decided), with or without a round.
var pollsName = regexp.MustCompile(`^BenchmarkPrefetchRate/keys=(\d+)/rate=\d+/cache=(\d+)MiB/prefetch=true(?:/round=\d+-(new|dup))?$`)

// scaleStoreNames are the legend names of BenchmarkScale's stores.
var scaleStoreNames = map[string]string{"kdedup": "kdedup", "keyset": "exact key set"}

// scaleSeries returns, for each store and cache size of BenchmarkScale
// output, the median of unit at each number of keys held, sorted by keys;
// series are named "<store>, <cache> MiB cache", with suffix after it.
// BenchmarkPrefetchRate's results (with prefetch) are series "kdedup,
// polls, <cache> MiB page cache" (new keys; several rounds at one point:
// their median) and "kdedup, polls, <cache> MiB page cache, duplicates"
// (dup rounds).
func scaleSeries(r io.Reader, unit, suffix string) (map[string]plotter.XYs, error) {
	res, err := benchResults(r, unit)
	if err != nil {
		return nil, err
	}
	points := map[string]map[float64][]float64{}
	add := func(s string, keys float64, vs []float64) {
		if points[s] == nil {
			points[s] = map[float64][]float64{}
		}
		points[s][keys] = append(points[s][keys], vs...)
	}
	for name, vs := range res {
		if m := scaleName.FindStringSubmatch(name); m != nil {
			keys, _ := strconv.ParseFloat(m[1], 64)
			store := cmp.Or(scaleStoreNames[m[2]], m[2])
			cache := "page"
			if m[2] == "keyset" {
				cache = "block"
			}
			add(fmt.Sprintf("%s, %s MiB %s cache%s", store, m[3], cache, suffix), keys, vs)
		} else if m := pollsName.FindStringSubmatch(name); m != nil {
			keys, _ := strconv.ParseFloat(m[1], 64)
			dup := ""
			if m[3] == "dup" {
				dup = ", duplicates"
			}
			add(fmt.Sprintf("kdedup, polls, %s MiB page cache%s%s", m[2], dup, suffix), keys, vs)
		}
	}
	series := map[string]plotter.XYs{}
	for s, byKeys := range points {
		for _, keys := range slices.Sorted(maps.Keys(byKeys)) {
			series[s] = append(series[s], plotter.XY{X: keys, Y: median(byKeys[keys])})
		}
	}
	return series, nil
}

// scalePlot draws BenchmarkScale's cost per record against keys held: CPU
// µs (op cpu) or bytes handed to Badger and written to disk (op bytes).
func scalePlot(r io.Reader, op string) (*plot.Plot, error) {
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, err
	}
	series := map[string]plotter.XYs{}
	p := plot.New()
	p.X.Label.Text = "keys held"
	switch op {
	case "cpu":
		if series, err = scaleSeries(bytes.NewReader(data), "cpu-us/rec", ""); err != nil {
			return nil, err
		}
		p.Title.Text = "CPU per record against keys held, at a fixed record rate"
		p.Y.Label.Text = "CPU µs per record"
	case "rss":
		if series, err = scaleSeries(bytes.NewReader(data), "peak-RSS-MiB", ""); err != nil {
			return nil, err
		}
		p.Title.Text = "Peak resident memory of the measured phase against keys held"
		p.Y.Label.Text = "peak RSS (VmHWM), MiB"
	case "bytes":
		for unit, suffix := range map[string]string{"user-B/rec": ": to Badger", "disk-B/rec": ": to disk"} {
			s, err := scaleSeries(bytes.NewReader(data), unit, suffix)
			if err != nil {
				return nil, err
			}
			maps.Copy(series, s)
		}
		p.Title.Text = "Bytes per record against keys held, at a fixed record rate"
		p.Y.Label.Text = "bytes per record"
	default:
		return nil, fmt.Errorf("-op %q: want cpu, bytes or rss", op)
	}
	if len(series) == 0 {
		return nil, errors.New("no BenchmarkScale/keys=K/store=S/cache=CMiB or BenchmarkPrefetchRate results")
	}
	p.X.Scale, p.X.Tick.Marker = plot.LogScale{}, plot.LogTicks{Prec: -1}
	p.Legend.Top, p.Legend.Left = true, true
	top, bottom := 0.0, math.Inf(1)
	for _, xys := range series {
		for _, xy := range xys {
			top = max(top, xy.Y)
			if xy.Y > 0 {
				bottom = min(bottom, xy.Y)
			}
		}
	}
	logY := top > 20*bottom
	var lines []any
	for _, n := range slices.Sorted(maps.Keys(series)) {
		xys := series[n]
		if logY {
			// A log axis has no place for zero (a round of duplicates
			// writes no bytes): such points are left out.
			xys = slices.DeleteFunc(slices.Clone(xys), func(xy plotter.XY) bool { return xy.Y <= 0 })
			if len(xys) == 0 {
				continue
			}
		}
		lines = append(lines, n, xys)
	}
	if logY {
		// Points far apart (a state larger than the cache costs far more
		// per record): a log axis keeps the small ones readable, with a
		// decade or more above the points for the legend.
		p.Y.Scale, p.Y.Tick.Marker = plot.LogScale{}, plot.LogTicks{Prec: -1}
		p.Y.Min = math.Pow(10, math.Floor(math.Log10(bottom)))
		p.Y.Max = math.Pow(10, math.Ceil(math.Log10(top*2)))
	} else {
		// Room above the points for the legend, one line per series, rounded
		// up to half a power of ten so that the default ticks label it.
		p.Y.Min, p.Y.Max = 0, top*(1.1+0.06*float64(len(series)))
		if p.Y.Max > 0 {
			half := math.Pow(10, math.Floor(math.Log10(p.Y.Max))) / 2
			p.Y.Max = math.Ceil(p.Y.Max/half) * half
		}
	}
	if err := plotutil.AddLinePoints(p, lines...); err != nil {
		return nil, err
	}
	p.Add(plotter.NewGrid())
	return p, nil
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
