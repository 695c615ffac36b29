// Package app wires kdedup's components from a config.Config: Badger store,
// per-partition deduplicators, the consumer-group worker and the HTTP
// endpoints. The binary and the end-to-end tests run the worker through it.
package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/twmb/franz-go/pkg/kgo"
	"golang.org/x/sync/errgroup"

	"github.com/kdedup/kdedup/config"
	"github.com/kdedup/kdedup/consumer"
	"github.com/kdedup/kdedup/dedup"
	"github.com/kdedup/kdedup/internal/budget"
	"github.com/kdedup/kdedup/snapshot"
	"github.com/kdedup/kdedup/store"
)

// ErrConfig marks errors caused by the configuration (exit code 2).
var ErrConfig = errors.New("invalid configuration")

// ErrShutdownTimeout is returned (wrapped, naming what was still running)
// by Run when the worker has not stopped within KDEDUP_SHUTDOWN_TIMEOUT of
// the start of its shutdown. Goroutines of the worker may still be running:
// the caller should exit.
var ErrShutdownTimeout = errors.New("shutdown timed out")

// Signaled is the cause (context.Cause) of a Run context canceled by a
// signal, so that Run logs which signal stopped it.
type Signaled struct{ Signal os.Signal }

func (s Signaled) Error() string { return "received signal " + s.Signal.String() }

// HTTP server limits: /metrics and the probes need short requests and
// small headers; an idle keep-alive connection is closed after
// httpIdleTimeout, so that clients that leave connections open cannot
// accumulate them.
const (
	httpReadTimeout    = 10 * time.Second
	httpWriteTimeout   = 30 * time.Second // a scrape of many partitions' series
	httpIdleTimeout    = 60 * time.Second
	httpMaxHeaderBytes = 16 << 10
)

// Option changes how Run runs the worker; tests use them.
type Option func(*options)

type options struct {
	httpIdleTimeout   time.Duration
	clientOpts        []kgo.Opt
	maxDirtyPageBytes int64
}

// WithHTTPIdleTimeout sets how long the HTTP server keeps an idle
// keep-alive connection open (default 60s).
func WithHTTPIdleTimeout(d time.Duration) Option {
	return func(o *options) { o.httpIdleTimeout = d }
}

// WithMaxDirtyPageBytes replaces the dirty-page bound the memory budget
// gives the worker (consumer.Options.MaxDirtyPageBytes), so that a test
// reaches it with a small state.
func WithMaxDirtyPageBytes(n int64) Option {
	return func(o *options) { o.maxDirtyPageBytes = n }
}

// WithClientOpts appends franz-go options (hooks) to the worker's Kafka
// client.
func WithClientOpts(opts ...kgo.Opt) Option {
	return func(o *options) { o.clientOpts = append(o.clientOpts, opts...) }
}

// Run runs the worker and its HTTP endpoints until ctx is canceled or
// the worker fails, registering its metrics with reg. started, if not nil,
// receives the HTTP address once listening.
//
// It returns nil after a clean stop, an error wrapping ErrConfig for a
// problem of the configuration found at start-up, and another error for a
// runtime failure. A stop (ctx canceled, or a failure) that takes longer
// than cfg.ShutdownTimeout returns an error wrapping ErrShutdownTimeout
// that names what was still running, and leaves it running.
func Run(ctx context.Context, cfg config.Config, log *slog.Logger, reg *prometheus.Registry, started func(httpAddr string), opts ...Option) error {
	o := options{httpIdleTimeout: httpIdleTimeout}
	for _, opt := range opts {
		opt(&o)
	}
	c, err := build(ctx, cfg, log, reg, o)
	if err != nil {
		return err
	}
	log.Info("starting", "http", c.ln.Addr().String(), "brokers", strings.Join(cfg.Brokers, ","),
		"input_topics", strings.Join(cfg.InputTopics, ","), "output_topic", cfg.OutputTopic, "duplicates_topic", cfg.DuplicatesTopic, "dead_letter_topic", cfg.DeadLetterTopic, "repartition_topic", cfg.RepartitionTopic, "group", cfg.Group, "delivery", cfg.Delivery.String(), "data_dir", cfg.DataDir)
	logBudget(log, c.mem, c.memSource)
	if started != nil {
		started(c.ln.Addr().String())
	}

	return c.run(ctx, cfg)
}

// components are what Run builds before it runs anything: the state, the
// worker and the HTTP server, listening.
type components struct {
	log       *slog.Logger
	db        *store.DB
	dm        *dedup.Metrics
	w         *consumer.Worker
	snaps     *snapshot.Store // nil: no KDEDUP_SNAPSHOT_URL
	srv       *http.Server
	ln        net.Listener
	mem       budget.Split
	memSource string
}

// build checks cfg (the rules that belong to the packages too), the
// brokers and the topics the worker produces to, opens the state, creates
// the worker and listens for HTTP: everything that can fail before the
// worker runs, with the error Run returns. On error nothing it opened is
// left open.
func build(ctx context.Context, cfg config.Config, log *slog.Logger, reg *prometheus.Registry, o options) (*components, error) {
	// Every rule, the packages' own included (config.Config.Validate asks
	// each), checked before anything connects or opens state.
	own, err := cfg.Options()
	if err != nil {
		return nil, fmt.Errorf("%w:\n%v", ErrConfig, err)
	}
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	mem, memSource, err := MemoryBudget(cfg, budget.CgroupLimit)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrConfig, err)
	}
	maxDirty := mem.MaxDirtyPageBytes()
	if o.maxDirtyPageBytes > 0 {
		maxDirty = o.maxDirtyPageBytes
	}
	kafkaOpts, err := KafkaOpts(cfg)
	if err != nil {
		return nil, err
	}
	if err := checkKafkaAccess(ctx, cfg, kafkaOpts); err != nil {
		return nil, err
	}
	recordLimits, err := checkTargetTopics(ctx, cfg, kafkaOpts, log)
	if err != nil {
		return nil, err
	}

	snaps, err := openSnapshots(ctx, cfg, log)
	if err != nil {
		return nil, err
	}
	sopts := own.Store
	sopts.CacheBytes, sopts.Logger, sopts.Registerer = mem.Cache, log, reg
	dmg := newDamaged(cfg.DataDir, reg, log)
	dmg.measure()
	db, err := store.Open(sopts)
	if errors.Is(err, store.ErrCorrupt) && !errors.Is(err, store.ErrLayoutVersion) && snaps != nil {
		// With snapshots the damaged state need not stop the worker: it
		// is kept, moved aside, and the partitions restore.
		if aside, merr := dmg.moveAside(); merr != nil {
			log.Error("cannot move the corrupt state aside", "dir", cfg.DataDir, "err", merr)
		} else {
			log.Error("the state in KDEDUP_DATA_DIR is corrupt: moved aside (kept for inspection until the next corrupt state replaces it; delete it to free its space), starting without local state; the partitions restore from snapshots (KDEDUP_SNAPSHOT_URL)",
				"dir", cfg.DataDir, "moved_to", aside, "err", err)
			db, err = store.Open(sopts)
		}
	}
	if err != nil {
		closeSnapshots(snaps, log)
	}
	if errors.Is(err, store.ErrInvalidOptions) {
		return nil, fmt.Errorf("%w: %v", ErrConfig, err)
	}
	if err != nil {
		return nil, fmt.Errorf("opening the state in KDEDUP_DATA_DIR=%s: %w", cfg.DataDir, err)
	}
	c := &components{db: db, log: log, snaps: snaps}

	c.dm = dedup.NewMetrics(reg)
	opener, err := dedup.NewOpener(db, own.Dedup, c.dm)
	if err != nil {
		c.closeDB()
		return nil, fmt.Errorf("%w: %v", ErrConfig, err)
	}
	kp := clientMetrics(reg)
	copts := own.Consumer
	copts.MaxRecordBytes = func(topic string) int {
		if n, ok := recordLimits[topic]; ok {
			return n
		}
		return consumer.DefaultMaxRecordBytes
	}
	copts.MaxDirtyPageBytes, copts.FetchMaxBytes, copts.MaxRestores = maxDirty, int32(mem.Fetch), mem.MaxRestores
	copts.Dedup, copts.Snapshots = opener, snaps
	copts.Logger, copts.Registerer = log, reg
	// The logger here replaces the one the worker gives its clients.
	copts.ConnOpts = append(kafkaOpts, clientLogger(log, own.LogLevel))
	copts.ClientOpts = append([]kgo.Opt{kgo.WithHooks(kp)}, o.clientOpts...)
	c.w, err = consumer.New(copts)
	if err != nil {
		c.closeDB()
		return nil, fmt.Errorf("%w: %v", ErrConfig, err)
	}

	c.ln, err = net.Listen("tcp", cfg.HTTPAddr)
	if err != nil {
		c.closeDB()
		return nil, fmt.Errorf("listening on KDEDUP_HTTP_ADDR=%s: %w", cfg.HTTPAddr, err)
	}
	c.srv = &http.Server{
		Handler:           httpHandler(reg, c.w.Ready, liveCheck(c.w, cfg.Liveness()), cfg.Pprof),
		ReadHeaderTimeout: httpReadTimeout,
		ReadTimeout:       httpReadTimeout,
		WriteTimeout:      httpWriteTimeout,
		IdleTimeout:       o.httpIdleTimeout,
		MaxHeaderBytes:    httpMaxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelDebug),
	}
	c.mem, c.memSource = mem, memSource
	return c, nil
}

// closeDB closes the state and the snapshot store, logging a failure.
func (c *components) closeDB() {
	if err := c.db.Close(); err != nil {
		c.log.Error("closing badger", "err", err)
	}
	closeSnapshots(c.snaps, c.log)
}

// run serves HTTP and runs the worker until ctx is canceled or the worker
// fails, then stops both within cfg.ShutdownTimeout and closes the state
// (see Run).
func (c *components) run(ctx context.Context, cfg config.Config) error {
	log := c.log
	var closing atomic.Bool // the worker has returned; Badger is closing
	done := make(chan error, 1)
	go func() {
		g, gctx := errgroup.WithContext(ctx)
		g.Go(func() error {
			if err := c.srv.Serve(c.ln); !errors.Is(err, http.ErrServerClosed) {
				return fmt.Errorf("serving http: %w", err)
			}
			return nil
		})
		// Stopped when the worker returns, whatever its reason.
		watchCtx, stopWatch := context.WithCancel(gctx)
		g.Go(func() error {
			watchState(watchCtx, &cacheWatch{log: log}, c.dm.StateBytes, c.db.CacheBytes())
			return nil
		})
		g.Go(func() error {
			defer stopWatch()
			defer func() {
				sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				_ = c.srv.Shutdown(sctx)
			}()
			return c.w.Run(gctx)
		})
		err := named(g.Wait())
		if errors.Is(err, store.ErrDiskFull) || errors.Is(err, store.ErrCorrupt) {
			err = fmt.Errorf("KDEDUP_DATA_DIR=%s: %w", cfg.DataDir, err)
		}
		closing.Store(true)
		c.closeDB()
		done <- err
	}()

	select {
	case err := <-done:
		log.Info("stopped", "err", err)
		return err
	case <-ctx.Done():
		var sig Signaled
		if errors.As(context.Cause(ctx), &sig) {
			log.Info("received signal, shutting down", "signal", sig.Signal.String(), "shutdown_timeout", cfg.ShutdownTimeout)
		} else {
			log.Info("shutting down", "cause", context.Cause(ctx), "shutdown_timeout", cfg.ShutdownTimeout)
		}
	case <-c.w.Stopping():
		log.Info("shutting down", "shutdown_timeout", cfg.ShutdownTimeout)
	}
	begun := time.Now()
	timer := time.NewTimer(cfg.ShutdownTimeout)
	defer timer.Stop()
	select {
	case err := <-done:
		log.Info("stopped", "err", err, "shutdown_seconds", time.Since(begun).Seconds())
		return err
	case <-timer.C:
		what := fmt.Sprintf("closing Badger at KDEDUP_DATA_DIR=%s", cfg.DataDir)
		if p := c.w.Progress(); !closing.Load() {
			what = fmt.Sprintf("the worker, %s since %s", p.Stage, time.Since(p.Since).Round(time.Second))
		}
		return fmt.Errorf("%w: not stopped within KDEDUP_SHUTDOWN_TIMEOUT=%s; still running: %s", ErrShutdownTimeout, cfg.ShutdownTimeout, what)
	}
}

// liveCheck is what /healthz asks: nil while w's loops, or its shutdown,
// progress within bound; otherwise an error naming the stalled stage.
func liveCheck(w *consumer.Worker, bound time.Duration) func() error {
	return func() error {
		p := w.Progress()
		if !p.Stalled(time.Now(), bound) {
			return nil
		}
		return fmt.Errorf("stuck: %s for %s (KDEDUP_LIVENESS_TIMEOUT=%s)", p.Stage, time.Since(p.Since).Round(time.Second), bound)
	}
}

// httpHandler serves /metrics from reg, /readyz from ready and /healthz
// from live (503 with live's error), and with profiles Go's runtime
// profiles under /debug/pprof/ (KDEDUP_PPROF).
func httpHandler(reg *prometheus.Registry, ready func() bool, live func() error, profiles bool) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		if err := live(); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !ready() {
			http.Error(w, "not ready", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ready")
	})
	if profiles {
		// Go's runtime profiles, as net/http/pprof serves them on
		// http.DefaultServeMux, here on this mux only.
		mux.HandleFunc("GET /debug/pprof/", pprof.Index)
		mux.HandleFunc("GET /debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
	}
	return mux
}
