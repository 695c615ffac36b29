package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestBenchPeersFlags: a bad -broker, -peers or -delivery is a usage error
// found before anything is built or started.
func TestBenchPeersFlags(t *testing.T) {
	for _, args := range [][]string{
		{"-broker", "redpanda"},
		{"-broker", "apache", "-peers", "kdedup,flink"},
		{"-broker", "apache", "-delivery", "at-most-once"},
		{"-broker", "apache", "-peers", "kdedup,kdedup-local"},
		{"-broker", "apache", "-repartition", "-window", "1m"},
	} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			var out bytes.Buffer
			if err := dispatch(context.Background(), append([]string{"peers"}, args...), &out, &out); !errors.Is(err, errUsage) {
				t.Fatalf("peers %v: %v, want a usage error", args, err)
			}
		})
	}
}

// TestBenchPeers runs `kdedup-bench peers -broker apache` on a small stream: the
// Kafka Streams deduplicator builds with Maven, and kdedup, the passthrough
// and the Kafka Streams deduplicator, each in both delivery modes, produce
// exactly their model (the deduplicated stream; every record for the
// passthrough). With -repartition, on the spread stream, kdedup through its
// repartition topic and Kafka Streams through selectKey and repartition()
// forward each event once in its original form (exactly once). It starts Apache Kafka and
// a JVM, so it runs only with KDEDUP_TEST_KAFKA=apache.
func TestBenchPeers(t *testing.T) {
	if os.Getenv("KDEDUP_TEST_KAFKA") != "apache" {
		t.Skip("starts Apache Kafka and the Kafka Streams peer (Java 17 and Maven): set KDEDUP_TEST_KAFKA=apache")
	}
	// The passthrough runs as a process of this command's binary and the
	// worker as kdedup run, so the test needs both binaries rather than
	// the test executable.
	dir := t.TempDir()
	bench, kdedup := filepath.Join(dir, "kdedup-bench"), filepath.Join(dir, "kdedup")
	for bin, pkg := range map[string]string{bench: ".", kdedup: "../kdedup"} {
		if b, err := exec.Command("go", "build", "-o", bin, pkg).CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v\n%s", pkg, err, b)
		}
	}
	for _, c := range []struct {
		name    string
		args    []string
		systems []string
	}{
		{"dedup by record key", nil, []string{peerKdedup, peerPassthrough, peerKStreams}},
		// Exactly once only, for CI's time: at least once runs the same
		// topology with other client settings.
		{"repartition", []string{"-repartition", "-peers", "kdedup,kstreams", "-delivery", "exactly-once"}, []string{peerKdedup, peerKStreams}},
	} {
		t.Run(c.name, func(t *testing.T) {
			args := append([]string{"peers", "-broker", "apache", "-records", "4000", "-partitions", "2", "-kstreams-dir", "../../bench/kstreams-peer", "-kdedup", kdedup}, c.args...)
			cmd := exec.Command(bench, args...)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("kdedup-bench peers: %v\nstdout:\n%s\nstderr:\n%s", err, out, stderr.String())
			}
			rows := map[string]string{}
			for line := range strings.Lines(string(out)) {
				cells := strings.Split(line, "|")
				if len(cells) < 14 || strings.TrimSpace(cells[1]) != "1" {
					continue
				}
				rows[strings.TrimSpace(cells[2])+" "+strings.TrimSpace(cells[3])] = strings.TrimSpace(cells[12])
			}
			deliveries := []string{"at-least-once", "exactly-once"}
			if slices.Contains(c.args, "-delivery") {
				deliveries = deliveries[1:]
			}
			for _, delivery := range deliveries {
				for _, system := range c.systems {
					if got := rows[delivery+" "+system]; got != "exact" {
						t.Errorf("%s %s: output %q, want exact", delivery, system, got)
					}
				}
			}
			if t.Failed() || len(rows) != len(deliveries)*len(c.systems) {
				t.Fatalf("rows %v; output:\n%s", rows, out)
			}
		})
	}
}
