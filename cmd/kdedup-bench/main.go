// Command kdedup-bench is kdedup's benchmark command for developers. It is
// not part of the product: it starts Apache Kafka from Maven jars
// (internal/kafkatest: Java 17 and Maven), builds VersityGW with the Go
// toolchain (internal/s3test) and builds the Kafka Streams peer with Maven,
// none of which the release image holds. BENCHMARKS.md gives each
// figure's command.
//
//	kdedup-bench peers  compare the worker's records/s with a passthrough on
//	                    an in-process broker (-broker apache: kdedup, the
//	                    passthrough and Kafka Streams, each as a process on
//	                    Apache Kafka, output checked against the model)
//	kdedup-bench move   time a partition's move to an empty disk: from a
//	                    snapshot, with a gap to replay, and by a full replay
//
// Run it from the repository's root: the worker processes run a kdedup
// binary built from ./cmd/kdedup (or -kdedup), and the Kafka Streams peer
// is built from bench/kstreams-peer. Exit codes: 0 success, 1 failure,
// 2 usage.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

// errUsage marks errors that exit with code 2.
var errUsage = errors.New("usage")

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := dispatch(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "kdedup-bench:", err)
	}
	os.Exit(exitCode(err))
}

// exitCode maps the error that ends a command to the process's exit code:
// 2 for usage errors, 1 for any other failure.
func exitCode(err error) int {
	switch {
	case err == nil:
		return 0
	case errors.Is(err, errUsage):
		return 2
	}
	return 1
}

func dispatch(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		usage(stderr)
		return fmt.Errorf("%w: no command", errUsage)
	}
	cmd, args := args[0], args[1:]
	switch cmd {
	case "peers":
		return peersCmd(ctx, args, stdout, stderr)
	case "move":
		return moveCmd(ctx, args, stdout, stderr)
	case "help", "-h", "--help":
		usage(stdout)
		return nil
	}
	usage(stderr)
	return fmt.Errorf("%w: unknown command %q", errUsage, cmd)
}

func usage(w io.Writer) {
	fmt.Fprint(w, `kdedup-bench: kdedup's benchmarks (a developer command; run from the repository's root)

usage:
  kdedup-bench peers  compare the worker's records/s with a passthrough on an in-process broker
                      (-broker apache: kdedup, the passthrough and Kafka Streams on Apache Kafka)
  kdedup-bench move   time moving a partition to a worker with an empty disk: with snapshots
                      (planned, and with a gap to replay) and by full replay

Each command takes -h. BENCHMARKS.md gives each figure's command.
`)
}
