package dedup

import (
	"errors"
	"fmt"

	"github.com/kdedup/kdedup/filter"
	"github.com/kdedup/kdedup/store"
)

// ErrSnapshotParams is returned (wrapped, with filter.ErrParams and the
// parameters that differ) by Restore for a snapshot written with other
// filter parameters or another key spec than p's.
var ErrSnapshotParams = errors.New("dedup: snapshot written with other parameters")

// Restore replaces p's state, committed or not, by a snapshot's: img's
// metadata and checkpoint and the pages that pages hands to put (see
// store.PartitionState.Import, which makes it durable only after pages
// returns nil). A snapshot whose metadata was written with other filter
// parameters or another key spec is refused before anything is written
// (ErrSnapshotParams and filter.ErrParams, wrapped, naming each parameter
// as Open does), like local state: p then keeps its state. Any other error
// leaves p with no state (Checkpoint reports none) and an empty filter:
// the caller replays instead. p's staged changes are dropped either way
// but for the refusal.
func (p *Deduplicator) Restore(img store.Image, pages func(put func(filter.PageID, []byte) error) error) error {
	if _, err := filter.Open(img.Meta, p.opts.Filter, p.state); err != nil {
		var perr *filter.ParamsError
		if errors.As(err, &perr) {
			err = p.opts.paramsError(perr)
		}
		return fmt.Errorf("restoring %s/%d from a snapshot: %w: %w", p.topic, p.partition, ErrSnapshotParams, err)
	}
	if p.overlay != nil {
		p.overlay.Discard()
		p.syncStaged()
	}
	p.ahead.recs = nil
	p.buckets = bucketAhead{}
	p.tally = tally{}
	err := p.state.Import(img, pages)
	meta := img.Meta
	if err != nil {
		meta = nil // no state: an empty chain under p's parameters
	}
	var pager filter.Pager = p.state
	if p.overlay != nil {
		pager = p.overlay
	}
	var chain *filter.Chain
	var cerr error
	switch {
	case meta == nil && p.opts.HashSeed != (filter.Seed{}):
		chain, cerr = filter.NewWithSeed(p.opts.Filter, p.opts.HashSeed, pager)
	default:
		chain, cerr = filter.Open(meta, p.opts.Filter, pager)
	}
	if cerr != nil {
		return fmt.Errorf("restoring %s/%d from a snapshot: %w", p.topic, p.partition, errors.Join(err, cerr))
	}
	p.chain, p.stableMeta = chain, chain.MarshalMeta()
	p.m.observe(chain.Stats())
	if err != nil {
		return fmt.Errorf("restoring %s/%d from a snapshot: %w", p.topic, p.partition, err)
	}
	return nil
}
