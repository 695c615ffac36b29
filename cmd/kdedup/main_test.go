package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/kdedup/kdedup/config"
)

// TestBadConfigurationIsAUsageError: every bad variable is named in one
// error that maps to exit code 2, before anything connects or opens state.
func TestBadConfigurationIsAUsageError(t *testing.T) {
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, config.Prefix) {
			t.Setenv(strings.SplitN(kv, "=", 2)[0], "")
		}
	}
	t.Setenv("KDEDUP_INPUT_TOPICS", "in")
	t.Setenv("KDEDUP_OUTPUT_TOPIC", "out")
	t.Setenv("KDEDUP_BUCKET_SIZE", "3")
	t.Setenv("KDEDUP_FLUSH_INTERVAL", "soon")
	var stderr bytes.Buffer
	err := dispatch(context.Background(), []string{"run"}, &stderr, &stderr)
	if !errors.Is(err, errUsage) {
		t.Fatalf("error %v does not map to exit code 2", err)
	}
	for _, v := range []string{"KDEDUP_BROKERS", "KDEDUP_BUCKET_SIZE=3", "KDEDUP_FLUSH_INTERVAL=soon"} {
		if !strings.Contains(err.Error(), v) {
			t.Errorf("error does not name %s:\n%v", v, err)
		}
	}
}

func TestUnknownCommandIsAUsageError(t *testing.T) {
	var out bytes.Buffer
	if err := dispatch(context.Background(), []string{"frobnicate"}, &out, &out); !errors.Is(err, errUsage) {
		t.Fatalf("unknown command: %v", err)
	}
}

// TestREADMEListsEveryVariable keeps the README's configuration table in
// step with config.Config.
func TestREADMEListsEveryVariable(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, row := range (config.Config{}).Table() {
		if !bytes.Contains(readme, []byte("`"+row[0]+"`")) {
			t.Errorf("README.md does not document %s", row[0])
		}
	}
}

// TestDemo runs the demo on a small stream: it must find the worker's output
// equal to the exact model.
func TestDemo(t *testing.T) {
	var out bytes.Buffer
	if err := dispatch(context.Background(), []string{"demo", "-keys", "3000", "-partitions", "3"}, &out, &out); err != nil {
		t.Fatalf("demo: %v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "output matches the exact model") {
		t.Fatalf("demo output:\n%s", out.String())
	}
}
