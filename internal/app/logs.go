package app

import (
	"context"
	"io"
	"log/slog"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/plugin/kslog"
)

// NewLogger is the worker's logger: slog lines to w at level and above, as
// JSON, or as slog's text format when format is "text"
// (KDEDUP_LOG_FORMAT, KDEDUP_LOG_LEVEL). Safe for concurrent use.
func NewLogger(w io.Writer, level slog.Level, format string) *slog.Logger {
	opts := &slog.HandlerOptions{Level: level}
	if format == "text" {
		return slog.New(slog.NewTextHandler(w, opts))
	}
	return slog.New(slog.NewJSONHandler(w, opts))
}

// clientLogger is the franz-go logger of a worker that logs at level:
// franz-go's informational chatter (about 20 lines per start-up: metadata,
// joins, assignments) is kept at debug level only, so below debug the
// client logs warnings and errors.
func clientLogger(log *slog.Logger, level slog.Level) kgo.Opt {
	if level > slog.LevelDebug {
		level = max(level, slog.LevelWarn)
	}
	return kgo.WithLogger(kslog.New(slog.New(atLeast{log.Handler(), level})))
}

// atLeast is a slog.Handler that drops records below min.
type atLeast struct {
	slog.Handler
	min slog.Level
}

func (h atLeast) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= h.min && h.Handler.Enabled(ctx, l)
}

func (h atLeast) Handle(ctx context.Context, r slog.Record) error {
	if r.Level < h.min {
		return nil
	}
	return h.Handler.Handle(ctx, r)
}

func (h atLeast) WithAttrs(attrs []slog.Attr) slog.Handler {
	return atLeast{h.Handler.WithAttrs(attrs), h.min}
}

func (h atLeast) WithGroup(name string) slog.Handler {
	return atLeast{h.Handler.WithGroup(name), h.min}
}
