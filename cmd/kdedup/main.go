// Command kdedup is a Kafka deduplication worker: it consumes INPUT_TOPICS as
// a consumer group, drops records whose dedup key it has seen before in the
// same topic-partition, and forwards the rest to OUTPUT_TOPIC.
//
//	kdedup [run]    run the worker, configured by KDEDUP_* variables
//	kdedup demo     run the worker against an in-process broker and check it
//	kdedup inspect  print the filter state of a stopped worker's data directory
//	kdedup check    tell whether a dedup key would be dropped by that state
//	kdedup version  print the version, commit and Go version (also -version, --version)
//
// inspect and check open the data directory read-only (a running worker
// holds it locked) and print a table or, with -json, a versioned JSON
// document. check exits 0 whether the key is present or not.
//
// Exit codes: 0 success, 1 runtime failure (including a stop that outlasts
// KDEDUP_SHUTDOWN_TIMEOUT), 2 bad configuration or usage; nothing else
// exits 2. kdedup run logs the error that ends it as one structured line
// (KDEDUP_LOG_FORMAT) at ERROR level.
//
// The benchmark commands are a developer command of their own,
// cmd/kdedup-bench: this binary links no test or benchmark rig
// (TestProductDependencies).
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/kdedup/kdedup/internal/app"
)

// errUsage marks errors that exit with code 2.
var errUsage = errors.New("usage")

func main() {
	// The first SIGINT or SIGTERM cancels ctx with the signal as its cause,
	// which app.Run logs; later ones are ignored while the stop, bounded by
	// KDEDUP_SHUTDOWN_TIMEOUT, goes on.
	ctx, cancel := context.WithCancelCause(context.Background())
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	go func() {
		for s := range sigs {
			cancel(app.Signaled{Signal: s})
		}
	}()
	err := dispatch(ctx, os.Args[1:], os.Stdout, os.Stderr)
	signal.Stop(sigs)
	var logged loggedError
	if err != nil && !errors.As(err, &logged) {
		fmt.Fprintln(os.Stderr, "kdedup:", err)
	}
	os.Exit(exitCode(err))
}

// exitCode maps the error that ends a command to the process's exit code:
// 2 for usage and configuration errors, 1 for any other failure.
func exitCode(err error) int {
	switch {
	case err == nil:
		return 0
	case errors.Is(err, errUsage), errors.Is(err, app.ErrConfig):
		return 2
	}
	return 1
}

// loggedError is an error that has been logged as a structured line
// already; main does not print it again.
type loggedError struct{ err error }

func (e loggedError) Error() string { return e.err.Error() }
func (e loggedError) Unwrap() error { return e.err }

func dispatch(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cmd := "run"
	if len(args) > 0 {
		cmd, args = args[0], args[1:]
	}
	switch cmd {
	case "run":
		return runCmd(ctx, args, stderr)
	case "demo":
		return demoCmd(ctx, args, stdout, stderr)
	case "inspect":
		return inspectCmd(args, stdout, stderr)
	case "check":
		return checkCmd(args, stdout, stderr)
	case "version", "-version", "--version":
		fmt.Fprintln(stdout, currentBuild())
		return nil
	case "help", "-h", "--help":
		usage(stdout)
		return nil
	case "bench", "bench-move":
		return fmt.Errorf("%w: %q is a developer command now: go run ./cmd/kdedup-bench %s (see BENCHMARKS.md)", errUsage, cmd, map[string]string{"bench": "peers", "bench-move": "move"}[cmd])
	}
	usage(stderr)
	return fmt.Errorf("%w: unknown command %q", errUsage, cmd)
}

func usage(w io.Writer) {
	fmt.Fprint(w, `kdedup: Kafka stream deduplication worker

usage:
  kdedup [run]     run the worker (configured by KDEDUP_* environment variables)
  kdedup demo      run the worker against an in-process broker and check its output
  kdedup inspect [-data-dir DIR] [-json] [-topic T] [-partition P]
                   print each topic-partition's checkpoint, filter parameters, watermark,
                   sub-filters and totals from a stopped worker's data directory (read-only)
  kdedup inspect -snapshots URL [-verify] [-json] [-topic T] [-partition P]
                   list (and verify) the snapshots in an object store
  kdedup check KEY -topic T -partition P [-data-dir DIR] [-json]
                   tell whether a record with dedup key KEY would be dropped (exit code 0 either way)
  kdedup version   print the version, commit and Go version (also -version, --version)

Configuration variables: kdedup run -h. Each command takes -h.
`)
}
