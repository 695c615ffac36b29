package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"text/tabwriter"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kdedup/kdedup/config"
	"github.com/kdedup/kdedup/internal/app"
)

func runCmd(ctx context.Context, args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: kdedup run\n\nConfigured by environment variables:")
		tw := tabwriter.NewWriter(stderr, 2, 8, 2, ' ', 0)
		for _, row := range (config.Config{}).Table() {
			fmt.Fprintf(tw, "  %s\t%s\t%s\n", row[0], row[1], row[2])
		}
		tw.Flush()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	cfg, err := config.Load()
	if err != nil {
		// Logged in the format asked for when that much is valid, and
		// printed in full by main for a reader at a terminal.
		format := "json"
		if os.Getenv(config.Prefix+"LOG_FORMAT") == "text" {
			format = "text"
		}
		var problems []string
		var cerr *config.Error
		if errors.As(err, &cerr) {
			for _, p := range cerr.Problems {
				problems = append(problems, p.String())
			}
		}
		app.NewLogger(stderr, slog.LevelError, format).Error("invalid configuration", "problems", problems, "exit_code", 2)
		return fmt.Errorf("%w: invalid configuration:\n%v", errUsage, err)
	}
	log := app.NewLogger(stderr, cfg.SlogLevel(), cfg.LogFormat)
	b := currentBuild()
	log.Info("kdedup", "version", b.Version, "commit", b.Commit, "go", b.GoVersion)
	app.SetMemoryLimit(cfg, log)
	if err := app.Run(ctx, cfg, log, prometheus.NewRegistry(), nil); err != nil {
		log.Error("kdedup stopped on an error", "err", err, "exit_code", exitCode(err))
		return loggedError{err}
	}
	return nil
}
