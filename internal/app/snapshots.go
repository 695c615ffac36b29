package app

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/kdedup/kdedup/config"
	"github.com/kdedup/kdedup/internal/optcheck"
	"github.com/kdedup/kdedup/snapshot"
)

// snapshotProbeTimeout bounds the start-up check that the snapshot store
// answers.
const snapshotProbeTimeout = 10 * time.Second

// openSnapshots opens the snapshot store of KDEDUP_SNAPSHOT_URL (nil when
// unset). A URL that the snapshot package's rule refuses
// (snapshot.CheckURL) or that no driver accepts stops start-up (ErrConfig,
// naming the variable). The rule is asked again here, though build has
// validated cfg, because it refuses a URL holding credentials, and snapshot.Open's errors may quote the URL it is given. A
// store that does not answer is logged at WARN and used anyway: restores
// fall back to replays and uploads are retried, so an object store outage
// never stops the worker.
func openSnapshots(ctx context.Context, cfg config.Config, log *slog.Logger) (*snapshot.Store, error) {
	if cfg.SnapshotURL == "" {
		return nil, nil
	}
	if err := snapshot.CheckURL(cfg.SnapshotURL); err != nil {
		return nil, fmt.Errorf("%w: KDEDUP_SNAPSHOT_URL=%s: %s", ErrConfig, optcheck.RedactURL(cfg.SnapshotURL), optcheck.Reasons(err))
	}
	st, err := snapshot.Open(ctx, cfg.SnapshotURL)
	if err != nil {
		return nil, fmt.Errorf("%w: KDEDUP_SNAPSHOT_URL: %v", ErrConfig, err)
	}
	st = st.In(cfg.Group) // each group its own snapshots
	pctx, cancel := context.WithTimeout(ctx, snapshotProbeTimeout)
	defer cancel()
	if err := st.Probe(pctx); err != nil {
		log.Warn("the snapshot store does not answer; partitions without local state replay their input until it does, and uploads are retried", "snapshot_store", st.String(), "err", err)
	} else {
		log.Info("snapshots", "snapshot_store", st.String(), "interval", cfg.SnapshotInterval, "keep", cfg.SnapshotKeep)
	}
	return st, nil
}

func closeSnapshots(st *snapshot.Store, log *slog.Logger) {
	if st == nil {
		return
	}
	if err := st.Close(); err != nil {
		log.Warn("closing the snapshot store", "err", err)
	}
}
