package dedup

import (
	"errors"
	"fmt"

	"github.com/kdedup/kdedup/filter"
	"github.com/kdedup/kdedup/store"
)

// ErrSnapshotParams is returned (wrapped, with filter.ErrParams and the
// parameters that differ) by Restore for a snapshot written with other
// filter parameters, another key spec or another page size than p's.
var ErrSnapshotParams = errors.New("dedup: snapshot written with other parameters")

// Restore replaces p's state, committed or not, by a snapshot's: img's
// metadata and checkpoint and the pages that pages hands to put (see
// store.PartitionState.Import, which makes it durable only after pages
// returns nil). A snapshot written with other filter parameters, another
// key spec or another page size is refused before anything is written
// (ErrSnapshotParams, wrapped, naming each parameter as Open does), like
// local state: p keeps its state.
//
// Any other error is the import's (store.PartitionState.Import): an error
// of pages (a snapshot found damaged while it loads) or of the store. If
// the import had not begun replacing the state, p keeps it and its
// filter; otherwise p has no state (Checkpoint reports none) and an empty
// filter, and the caller replays instead or stops the partition. p's
// staged changes are dropped unless the snapshot is refused.
func (p *Deduplicator) Restore(img store.Image, pages func(put func(filter.PageID, []byte) error) error) error {
	refuse := func(err error) error {
		return fmt.Errorf("restoring %s/%d from a snapshot: %w: %w", p.topic, p.partition, ErrSnapshotParams, err)
	}
	if pb := p.opts.Filter.WithDefaults().PageBytes; img.PageBytes != pb {
		return refuse(fmt.Errorf("%w: pages of %d bytes, configured %d", filter.ErrParams, img.PageBytes, pb))
	}
	if _, err := filter.Open(img.Meta, p.opts.Filter, p.state); err != nil {
		var perr *filter.ParamsError
		if errors.As(err, &perr) {
			err = p.opts.paramsError(perr)
		}
		return refuse(err)
	}
	if p.overlay != nil {
		p.overlay.Discard()
		p.syncStaged()
	}
	p.ahead.recs = nil
	p.buckets, p.hashed = bucketAhead{}, [2 * bucketsAhead]hashedKey{}
	p.tally = tally{}
	if err := p.state.Import(img, pages); err != nil {
		err = fmt.Errorf("restoring %s/%d from a snapshot: %w", p.topic, p.partition, err)
		if _, ok := p.state.Checkpoint(); ok {
			return err // refused before anything was replaced: the filter is the state's
		}
		if cerr := p.reopen(nil); cerr != nil {
			return errors.Join(err, cerr)
		}
		return err
	}
	if err := p.reopen(img.Meta); err != nil {
		return fmt.Errorf("restoring %s/%d from a snapshot: %w", p.topic, p.partition, err)
	}
	return nil
}

// reopen makes p's filter the chain meta describes over p's pages, or a
// new empty one when meta is nil.
func (p *Deduplicator) reopen(meta []byte) error {
	var pager filter.Pager = p.state
	if p.overlay != nil {
		pager = p.overlay
	}
	var chain *filter.Chain
	var err error
	if meta == nil && p.opts.HashSeed != (filter.Seed{}) {
		chain, err = filter.NewWithSeed(p.opts.Filter, p.opts.HashSeed, pager)
	} else {
		chain, err = filter.Open(meta, p.opts.Filter, pager)
	}
	if err != nil {
		return err
	}
	p.chain, p.stableMeta = chain, chain.MarshalMeta()
	p.m.observe(chain.Stats())
	return nil
}

// StateDir is the directory of the store's files, for files that belong
// beside the state (a snapshot's download); the system's temporary
// directory for a store in memory.
func (o *Opener) StateDir() string { return o.db.Dir() }

// Origin is the topic and cluster p's state was built from
// (store.PartitionState.Origin): zero when not recorded.
func (p *Deduplicator) Origin() store.Origin { return p.state.Origin() }

// SetOrigin records o as the origin of p's state
// (store.PartitionState.SetOrigin).
func (p *Deduplicator) SetOrigin(o store.Origin) error {
	if err := p.state.SetOrigin(o); err != nil {
		return fmt.Errorf("recording the origin of %s/%d: %w", p.topic, p.partition, err)
	}
	return nil
}

// Clear deletes p's state, committed or staged, and starts an empty filter
// (a new hash seed unless Options.HashSeed is set): what a partition with
// no state starts with (store.PartitionState.Clear). The caller moves a
// state aside before it clears it; an error leaves p with the state it
// had, or, once the store began deleting it, with none and an empty filter.
func (p *Deduplicator) Clear() error {
	if p.overlay != nil {
		p.overlay.Discard()
		p.syncStaged()
	}
	p.ahead.recs = nil
	p.buckets, p.hashed = bucketAhead{}, [2 * bucketsAhead]hashedKey{}
	p.tally = tally{}
	err := p.state.Clear()
	if _, ok := p.state.Checkpoint(); ok {
		return fmt.Errorf("clearing %s/%d: %w", p.topic, p.partition, err)
	}
	if rerr := p.reopen(nil); rerr != nil {
		err = errors.Join(err, rerr)
	}
	if err != nil {
		return fmt.Errorf("clearing %s/%d: %w", p.topic, p.partition, err)
	}
	return nil
}

// ReserveSpace reserves bytes of the data volume's free space for a
// restore of p (store.PartitionState.ReserveSpace): store.ErrDiskFull
// (wrapped) when they are not free beside other restores' reservations.
// Release the reservation once the restore is committed or abandoned.
func (p *Deduplicator) ReserveSpace(bytes int64) (*store.Reservation, error) {
	return p.state.ReserveSpace(bytes)
}
