package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"github.com/kdedup/kdedup/config"
	"github.com/kdedup/kdedup/internal/app"
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

// TestUnknownVariableIsAUsageError: a misspelt variable stops start-up
// with exit code 2, naming it and the variable meant, instead of running
// with the default (here at least once instead of exactly once).
func TestUnknownVariableIsAUsageError(t *testing.T) {
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, config.Prefix) {
			t.Setenv(strings.SplitN(kv, "=", 2)[0], "")
		}
	}
	t.Setenv("KDEDUP_BROKERS", "127.0.0.1:1")
	t.Setenv("KDEDUP_INPUT_TOPICS", "in")
	t.Setenv("KDEDUP_OUTPUT_TOPIC", "out")
	t.Setenv("KDEDUP_DATA_DIR", t.TempDir())
	t.Setenv("KDEDUP_HTTP_ADDR", "127.0.0.1:0")
	t.Setenv("KDEDUP_DELIVER", "exactly-once")
	// Were the variable ignored, the worker would run until canceled.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var stderr bytes.Buffer
	err := dispatch(ctx, []string{"run"}, &stderr, &stderr)
	if exitCode(err) != 2 {
		t.Fatalf("error %v maps to exit code %d, want 2", err, exitCode(err))
	}
	for _, v := range []string{"KDEDUP_DELIVER=exactly-once", "did you mean KDEDUP_DELIVERY?"} {
		if !strings.Contains(err.Error(), v) {
			t.Errorf("error does not say %s:\n%v", v, err)
		}
	}
	var line struct{ Level, Msg string }
	if err := json.Unmarshal(bytes.TrimSpace(stderr.Bytes()), &line); err != nil || line.Level != "ERROR" {
		t.Errorf("stderr %q: want one JSON log line at ERROR (%v)", stderr.String(), err)
	}
}

// TestExitCodes: 2 is for usage and configuration errors only; every
// runtime failure, however it is wrapped, exits 1.
func TestExitCodes(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want int
	}{
		{nil, 0},
		{fmt.Errorf("%w: unknown command", errUsage), 2},
		{fmt.Errorf("%w: KDEDUP_TLS_CA_FILE=/x: no PEM certificate", app.ErrConfig), 2},
		{loggedError{fmt.Errorf("%w: bad", app.ErrConfig)}, 2},
		{loggedError{fmt.Errorf("%w: SASL PLAIN authentication failed", app.ErrKafkaAccess)}, 1},
		{loggedError{fmt.Errorf("%w: still running: closing Badger", app.ErrShutdownTimeout)}, 1},
		{errors.New("store: opening badger at /data: permission denied"), 1},
	} {
		if got := exitCode(tc.err); got != tc.want {
			t.Errorf("exitCode(%v) = %d, want %d", tc.err, got, tc.want)
		}
	}
}

func TestUnknownCommandIsAUsageError(t *testing.T) {
	var out bytes.Buffer
	if err := dispatch(context.Background(), []string{"frobnicate"}, &out, &out); !errors.Is(err, errUsage) {
		t.Fatalf("unknown command: %v", err)
	}
}

// TestConfigurationDocListsEveryVariable keeps the configuration reference,
// docs/configuration.md, in step with config.Config.
func TestConfigurationDocListsEveryVariable(t *testing.T) {
	doc, err := os.ReadFile("../../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, row := range (config.Config{}).Table() {
		if !bytes.Contains(doc, []byte("`"+row[0]+"`")) {
			t.Errorf("docs/configuration.md does not document %s", row[0])
		}
	}
}

// TestDemo runs the demo on a small stream: it must find the worker's output
// equal to the exact model, and print the filter's parameters the worker
// ran with: the default bucket size (KDEDUP_BUCKET_SIZE, 4) and the one
// -bucket-size sets.
func TestDemo(t *testing.T) {
	for _, tc := range []struct {
		name   string
		args   []string
		filter string
	}{
		{"default", nil, "filter (3 partitions, f=32, b=4)"},
		{"bucket size 2", []string{"-bucket-size", "2"}, "filter (3 partitions, f=32, b=2)"},
		// The spread scenario's line without the repartition topic: its
		// own check (scenario.SpreadCheck) finds the escapes there and
		// the exact output through the topic.
		{"spread", []string{"-scenario", "spread", "-delivery", "exactly-once"}, "of them copies of an event forwarded already (escaped duplicates)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			args := append([]string{"demo", "-keys", "3000", "-partitions", "3"}, tc.args...)
			if err := dispatch(context.Background(), args, &out, &out); err != nil {
				t.Fatalf("demo: %v\n%s", err, out.String())
			}
			for _, want := range []string{tc.filter, "output matches the exact model"} {
				if !strings.Contains(out.String(), want) {
					t.Fatalf("demo output lacks %q:\n%s", want, out.String())
				}
			}
		})
	}
}

// TestBuildInfo: the link-time version and commit win; unset, the module
// version and the VCS settings Go stamps are used, and "devel" / "unknown"
// when there are none.
func TestBuildInfo(t *testing.T) {
	const rev = "5cc47a6f0e1d2c3b4a5968778695a4b3c2d1e0f9"
	stamped := &debug.BuildInfo{
		Main: debug.Module{Path: "github.com/kdedup/kdedup", Version: "(devel)"},
		Settings: []debug.BuildSetting{
			{Key: "vcs", Value: "git"},
			{Key: "vcs.revision", Value: rev},
			{Key: "vcs.modified", Value: "true"},
		},
	}
	installed := &debug.BuildInfo{Main: debug.Module{Path: "github.com/kdedup/kdedup", Version: "v0.2.0"}}
	for _, tc := range []struct {
		name            string
		version, commit string
		info            *debug.BuildInfo
		want            build
	}{
		{"link time", "v0.1.0", "abc123", stamped, build{Version: "v0.1.0", Commit: "abc123", GoVersion: "go1.26.8"}},
		{"link-time version, stamped commit", "v0.1.0", "", stamped, build{Version: "v0.1.0", Commit: rev, Modified: true, GoVersion: "go1.26.8"}},
		{"checkout build", "", "", stamped, build{Version: "devel", Commit: rev, Modified: true, GoVersion: "go1.26.8"}},
		{"go install @version", "", "", installed, build{Version: "v0.2.0", Commit: "unknown", GoVersion: "go1.26.8"}},
		{"link-time commit, module version", "", "abc123", installed, build{Version: "v0.2.0", Commit: "abc123", GoVersion: "go1.26.8"}},
		{"no build info", "", "", nil, build{Version: "devel", Commit: "unknown", GoVersion: "go1.26.8"}},
		{"modified without revision", "", "", &debug.BuildInfo{Settings: []debug.BuildSetting{{Key: "vcs.modified", Value: "true"}}},
			build{Version: "devel", Commit: "unknown", GoVersion: "go1.26.8"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := buildInfo(tc.version, tc.commit, "go1.26.8", tc.info); got != tc.want {
				t.Errorf("buildInfo = %+v, want %+v", got, tc.want)
			}
		})
	}
	platform := runtime.GOOS + "/" + runtime.GOARCH
	for _, tc := range []struct {
		b    build
		want string
	}{
		{build{Version: "v0.1.0", Commit: "abc123", GoVersion: "go1.26.8"}, "kdedup v0.1.0 commit abc123 go1.26.8 " + platform},
		{build{Version: "devel", Commit: rev, Modified: true, GoVersion: "go1.26.8"}, "kdedup devel commit " + rev + " (modified) go1.26.8 " + platform},
	} {
		if got := tc.b.String(); got != tc.want {
			t.Errorf("%+v prints %q, want %q", tc.b, got, tc.want)
		}
	}
}

// TestVersionCommand: version, -version and --version print the same line,
// which names the Go version the binary runs on.
func TestVersionCommand(t *testing.T) {
	want := currentBuild().String() + "\n"
	if !strings.Contains(want, " "+runtime.Version()+" ") {
		t.Fatalf("version line %q lacks the Go version %s", want, runtime.Version())
	}
	for _, arg := range []string{"version", "-version", "--version"} {
		var out bytes.Buffer
		if err := dispatch(context.Background(), []string{arg}, &out, &out); err != nil {
			t.Fatalf("kdedup %s: %v", arg, err)
		}
		if out.String() != want {
			t.Errorf("kdedup %s printed %q, want %q", arg, out.String(), want)
		}
	}
}

// TestVersionLinkTime builds the binary as the release workflow and the
// Dockerfile do, with -X main.buildVersion and -X main.buildCommit, and
// checks that --version prints exactly those values.
func TestVersionLinkTime(t *testing.T) {
	const version, commit = "v9.8.7-test", "0123456789abcdef0123456789abcdef01234567"
	bin := filepath.Join(t.TempDir(), "kdedup")
	build := exec.Command("go", "build", "-trimpath",
		"-ldflags", "-s -w -X main.buildVersion="+version+" -X main.buildCommit="+commit,
		"-o", bin, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("%v: %v\n%s", build.Args, err, out)
	}
	out, err := exec.Command(bin, "--version").Output()
	if err != nil {
		t.Fatalf("%s --version: %v", bin, err)
	}
	want := fmt.Sprintf("kdedup %s commit %s %s %s/%s\n", version, commit, runtime.Version(), runtime.GOOS, runtime.GOARCH)
	if string(out) != want {
		t.Errorf("--version printed %q, want %q", out, want)
	}
}

// The benchmark commands left this binary: asking for them is a usage
// error (exit 2) that names the developer command to run instead.
func TestBenchCommandsMoved(t *testing.T) {
	for cmd, want := range map[string]string{"bench": "kdedup-bench peers", "bench-move": "kdedup-bench move"} {
		var out bytes.Buffer
		err := dispatch(context.Background(), []string{cmd}, &out, &out)
		if !errors.Is(err, errUsage) || !strings.Contains(err.Error(), want) {
			t.Errorf("kdedup %s: %v, want a usage error naming %q", cmd, err, want)
		}
	}
}
