package main

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"gonum.org/v1/plot/plotter"
)

// scaleOutput is BenchmarkScale output: two points of kdedup at the default
// cache, one of them run twice (-count 2), one at a smaller cache, one of
// the key set, the logged line of a point's own benchmark (not a result
// line) and a line of another benchmark; then BenchmarkPrefetchRate
// output: a point without rounds, one with two rounds of new keys, a dup
// round, and a point without prefetch (not the worker's path, left out).
const scaleOutput = `goos: linux
BenchmarkScale/keys=1000000/store=kdedup/cache=256MiB-2         	       1	         1.5 cpu-us/rec	        20 disk-B/rec	        10 user-B/rec
--- BENCH: BenchmarkScale/keys=1000000/store=kdedup/cache=256MiB-2
    scale_bench_test.go:95: BenchmarkDurableRate/keys=1000000/rate=50000-2         	   20000	     19847 ns/op	        99 cpu-us/rec
BenchmarkScale/keys=20000000/store=kdedup/cache=256MiB-2        	       1	         2.5 cpu-us/rec	        40 disk-B/rec	        12 user-B/rec
BenchmarkScale/keys=20000000/store=kdedup/cache=256MiB-2        	       1	         3.5 cpu-us/rec	        60 disk-B/rec	        14 user-B/rec
BenchmarkScale/keys=20000000/store=kdedup/cache=15MiB-2         	       1	         7 cpu-us/rec	        80 disk-B/rec	        16 user-B/rec
BenchmarkScale/keys=1000000/store=keyset/cache=256MiB-2         	       1	         9 cpu-us/rec	        38 disk-B/rec	        31 user-B/rec
BenchmarkDurableRate/keys=1000000/rate=50000-2         	   20000	     19847 ns/op	        98 cpu-us/rec
BenchmarkPrefetchRate/keys=1000000/rate=50000/cache=256MiB/prefetch=true-2         	 1000000	     20008 ns/op	         2 cpu-us/rec	        17 disk-B/rec	       180 peak-RSS-MiB
BenchmarkPrefetchRate/keys=100000000/rate=50000/cache=256MiB/prefetch=true/round=1-new-2         	 1000000	     20008 ns/op	         80 cpu-us/rec	        2000 disk-B/rec	       2500 peak-RSS-MiB
BenchmarkPrefetchRate/keys=100000000/rate=50000/cache=256MiB/prefetch=true/round=2-new-2         	 1000000	     20008 ns/op	         60 cpu-us/rec	        200 disk-B/rec	       1900 peak-RSS-MiB
BenchmarkPrefetchRate/keys=100000000/rate=50000/cache=768MiB/prefetch=true/round=2-dup-2         	 1000000	     20008 ns/op	         9 cpu-us/rec	        0 disk-B/rec	       1700 peak-RSS-MiB
BenchmarkPrefetchRate/keys=1000000/rate=50000/cache=256MiB/prefetch=false-2         	 1000000	     20008 ns/op	         5 cpu-us/rec	        17 disk-B/rec	       180 peak-RSS-MiB
PASS
`

func TestScaleSeries(t *testing.T) {
	for _, tc := range []struct {
		unit, suffix string
		want         map[string]plotter.XYs
	}{
		{"cpu-us/rec", "", map[string]plotter.XYs{
			"kdedup, 256 MiB page cache":                    {{X: 1e6, Y: 1.5}, {X: 2e7, Y: 3}},
			"kdedup, 15 MiB page cache":                     {{X: 2e7, Y: 7}},
			"exact key set, 256 MiB block cache":            {{X: 1e6, Y: 9}},
			"kdedup, polls, 256 MiB page cache":             {{X: 1e6, Y: 2}, {X: 1e8, Y: 70}},
			"kdedup, polls, 768 MiB page cache, duplicates": {{X: 1e8, Y: 9}},
		}},
		{"peak-RSS-MiB", "", map[string]plotter.XYs{
			"kdedup, polls, 256 MiB page cache":             {{X: 1e6, Y: 180}, {X: 1e8, Y: 2200}},
			"kdedup, polls, 768 MiB page cache, duplicates": {{X: 1e8, Y: 1700}},
		}},
		{"disk-B/rec", ": to disk", map[string]plotter.XYs{
			"kdedup, 256 MiB page cache: to disk":                    {{X: 1e6, Y: 20}, {X: 2e7, Y: 50}},
			"kdedup, 15 MiB page cache: to disk":                     {{X: 2e7, Y: 80}},
			"exact key set, 256 MiB block cache: to disk":            {{X: 1e6, Y: 38}},
			"kdedup, polls, 256 MiB page cache: to disk":             {{X: 1e6, Y: 17}, {X: 1e8, Y: 1100}},
			"kdedup, polls, 768 MiB page cache, duplicates: to disk": {{X: 1e8, Y: 0}},
		}},
	} {
		t.Run(tc.unit, func(t *testing.T) {
			got, err := scaleSeries(strings.NewReader(scaleOutput), tc.unit, tc.suffix)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}

// TestScalePlot draws the three scale plots from the output above and refuses
// an unknown -op and output without BenchmarkScale results.
func TestScalePlot(t *testing.T) {
	dir := t.TempDir()
	in := filepath.Join(dir, "scale.txt")
	if err := os.WriteFile(in, []byte(scaleOutput), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, op := range []string{"cpu", "bytes", "rss"} {
		out := filepath.Join(dir, op+".png")
		if err := run([]string{"-kind", "scale", "-op", op, "-in", in, "-out", out}, io.Discard); err != nil {
			t.Fatalf("-op %s: %v", op, err)
		}
		data, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.HasPrefix(data, []byte("\x89PNG")) {
			t.Errorf("-op %s: %s is not a PNG", op, out)
		}
	}
	if err := run([]string{"-kind", "scale", "-op", "heap", "-in", in, "-out", filepath.Join(dir, "x.png")}, io.Discard); err == nil {
		t.Error("-op heap: no error")
	}
	empty := filepath.Join(dir, "empty.txt")
	if err := os.WriteFile(empty, []byte("PASS\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := run([]string{"-kind", "scale", "-in", empty, "-out", filepath.Join(dir, "y.png")}, io.Discard); err == nil {
		t.Error("no BenchmarkScale results: no error")
	}
}

// TestGrowthPlot draws a CSV of BenchmarkChainGrowth's shape and refuses
// one of another header.
func TestGrowthPlot(t *testing.T) {
	dir := t.TempDir()
	in, out := filepath.Join(dir, "growth.csv"), filepath.Join(dir, "growth.png")
	if err := os.WriteFile(in, []byte("keys,bits_per_key,load,sub_filters,estimated_fpr\n2000000,26.9,0.78,1,2e-5\n4000000,36.1,0.58,1,2.2e-5\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := run([]string{"-kind", "growth", "-in", in, "-out", out}, io.Discard); err != nil {
		t.Fatal(err)
	}
	if data, err := os.ReadFile(out); err != nil || !bytes.HasPrefix(data, []byte("\x89PNG")) {
		t.Fatalf("%s is not a PNG: %v", out, err)
	}
	bad := filepath.Join(dir, "bad.csv")
	if err := os.WriteFile(bad, []byte("growth,x\n1,2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := run([]string{"-kind", "growth", "-in", bad, "-out", out}, io.Discard); err == nil {
		t.Error("a CSV of another header: no error")
	}
}
