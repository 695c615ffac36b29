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
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/twmb/franz-go/pkg/kgo"
	"golang.org/x/sync/errgroup"

	"github.com/kdedup/kdedup/config"
	"github.com/kdedup/kdedup/consumer"
	"github.com/kdedup/kdedup/dedup"
	"github.com/kdedup/kdedup/filter"
	"github.com/kdedup/kdedup/store"
)

// ErrConfig marks errors caused by the configuration (exit code 2).
var ErrConfig = errors.New("invalid configuration")

// Run runs the worker and its HTTP endpoints until ctx is canceled or
// the worker fails, registering its metrics with reg. started, if not nil,
// receives the HTTP address once listening.
func Run(ctx context.Context, cfg config.Config, log *slog.Logger, reg *prometheus.Registry, started func(httpAddr string)) error {
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	kafkaOpts, err := KafkaOpts(cfg)
	if err != nil {
		return err
	}
	if err := checkKafkaAccess(ctx, cfg, kafkaOpts); err != nil {
		return err
	}
	recordLimits, err := checkTargetTopics(ctx, cfg, kafkaOpts, log)
	if err != nil {
		return err
	}

	db, err := store.Open(store.Options{
		Dir:        cfg.DataDir,
		PageBytes:  int(cfg.PageBytes),
		CacheBytes: int64(cfg.CacheBytes),
		FlushBytes: int64(cfg.FlushBytes),
		Logger:     log,
		Registerer: reg,
	})
	if err != nil {
		return err
	}
	defer func() {
		if err := db.Close(); err != nil {
			log.Error("closing badger", "err", err)
		}
	}()

	dopts, err := DedupOptions(cfg)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrConfig, err)
	}
	dm := dedup.NewMetrics(reg)
	kp := clientMetrics(reg)
	w, err := consumer.New(consumer.Options{
		Brokers:         cfg.Brokers,
		InputTopics:     cfg.InputTopics,
		OutputTopic:     cfg.OutputTopic,
		DuplicatesTopic: cfg.DuplicatesTopic,
		DeadLetterTopic: cfg.DeadLetterTopic,
		MaxRecordBytes: func(topic string) int {
			if n, ok := recordLimits[topic]; ok {
				return n
			}
			return consumer.DefaultMaxRecordBytes
		},
		MaxDecompressBytes: int(cfg.MaxDecompressBytes),
		Group:              cfg.Group,
		InstanceID:         cfg.InstanceID,
		StartAtLatest:      cfg.StartOffset == "latest",
		SessionTimeout:     cfg.SessionTimeout,
		Delivery:           delivery(cfg),
		TransactionalID:    cfg.TransactionalID,
		RebuildEmpty:       cfg.Rebuild == "empty",
		Window:             windowRebuild(cfg),
		WindowGenerations:  cfg.WindowGenerations,
		FlushInterval:      cfg.FlushInterval,
		FlushBytes:         int64(cfg.FlushBytes),
		PageBytes:          int(cfg.PageBytes),
		Open: func(topic string, partition int32) (*dedup.Partition, error) {
			return dedup.Open(db, topic, partition, dopts, dm)
		},
		Forwards:   dopts.Forwards,
		Logger:     log,
		Registerer: reg,
		ClientOpts: append(kafkaOpts, kgo.WithHooks(kp)),
	})
	if err != nil {
		return fmt.Errorf("%w: %v", ErrConfig, err)
	}

	ln, err := net.Listen("tcp", cfg.HTTPAddr)
	if err != nil {
		return fmt.Errorf("listening on KDEDUP_HTTP_ADDR=%s: %w", cfg.HTTPAddr, err)
	}
	srv := &http.Server{Handler: httpHandler(reg, w.Ready), ReadHeaderTimeout: 10 * time.Second}
	log.Info("starting", "http", ln.Addr().String(), "brokers", strings.Join(cfg.Brokers, ","),
		"input_topics", strings.Join(cfg.InputTopics, ","), "output_topic", cfg.OutputTopic, "duplicates_topic", cfg.DuplicatesTopic, "dead_letter_topic", cfg.DeadLetterTopic, "group", cfg.Group, "delivery", cfg.Delivery, "data_dir", cfg.DataDir)
	if started != nil {
		started(ln.Addr().String())
	}

	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("serving http: %w", err)
		}
		return nil
	})
	g.Go(func() error {
		defer func() {
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = srv.Shutdown(sctx)
		}()
		return w.Run(gctx)
	})
	err = g.Wait()
	log.Info("stopped", "err", err)
	return err
}

// DedupOptions translates the configuration into the deduplicator's options.
func DedupOptions(cfg config.Config) (dedup.Options, error) {
	key, err := dedup.ParseKey(cfg.Key)
	if err != nil {
		return dedup.Options{}, err
	}
	name, value, _ := cfg.DeleteHeaderNameValue()
	return dedup.Options{
		Key:            key,
		DeleteHeader:   name,
		DeleteValue:    value,
		DropTombstones: !cfg.ForwardTombstones,
		MaxOccurrences: cfg.MaxOccurrences,
		Refresh:        cfg.WindowRefresh,
		Staged:         delivery(cfg) == consumer.ExactlyOnce,
		Filter: filter.Params{
			TargetFPR:       cfg.TargetFPR,
			FingerprintBits: cfg.FingerprintBits,
			BucketSize:      cfg.BucketSize,
			Capacity:        cfg.Capacity,
			MaxKicks:        cfg.MaxKicks,
			Expansion:       cfg.Expansion,
			PageBytes:       int(cfg.PageBytes),
			Window:          cfg.Window,
			Generations:     cfg.WindowGenerations,
		},
	}, nil
}

// windowRebuild is the window a rebuild may start at (consumer.Options.Window):
// only with refresh and a limit of 1 is the state a function of the window
// alone; otherwise rebuilds replay everything retained.
func windowRebuild(cfg config.Config) time.Duration {
	if cfg.WindowRefresh && cfg.MaxOccurrences == 1 {
		return cfg.Window
	}
	return 0
}

func delivery(cfg config.Config) consumer.Delivery {
	if cfg.Delivery == "exactly-once" {
		return consumer.ExactlyOnce
	}
	return consumer.AtLeastOnce
}

func httpHandler(reg *prometheus.Registry, ready func() bool) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !ready() {
			http.Error(w, "not ready", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ready")
	})
	return mux
}
