package main

import (
	"os/exec"
	"strings"
	"testing"
)

// rigs are the module's test and benchmark rigs: they start Apache Kafka
// from Maven jars, build VersityGW with the Go toolchain, run benchmarks or
// plot their output, none of which the release image can do or needs.
var rigs = []string{
	"github.com/kdedup/kdedup/cmd/kdedup-bench",
	"github.com/kdedup/kdedup/internal/benchenv",
	"github.com/kdedup/kdedup/internal/benchplot",
	"github.com/kdedup/kdedup/internal/harness",
	"github.com/kdedup/kdedup/internal/kafkatest",
	"github.com/kdedup/kdedup/internal/s3test",
}

// TestProductDependencies: the release binary links neither the standard
// library's testing package (which any test helper would bring) nor a test
// or benchmark rig of the module, nor a test-only module (goleak,
// testcontainers). The demo's in-process broker (kfake, through
// internal/embedded) and its exact model (internal/scenario) are the
// product's own.
func TestProductDependencies(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	deps := strings.Fields(string(out))
	if len(deps) < 100 {
		t.Fatalf("go list -deps listed %d packages, want the binary's whole graph: %q", len(deps), out)
	}
	forbidden := func(dep string) bool {
		for _, rig := range rigs {
			if dep == rig || strings.HasPrefix(dep, rig+"/") {
				return true
			}
		}
		return dep == "testing" || strings.HasPrefix(dep, "testing/") ||
			strings.HasPrefix(dep, "go.uber.org/goleak") || strings.HasPrefix(dep, "github.com/testcontainers/")
	}
	for _, dep := range deps {
		if forbidden(dep) {
			t.Errorf("cmd/kdedup depends on %s; `go list -deps ./cmd/kdedup` should not list it", dep)
		}
	}
}
