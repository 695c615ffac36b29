package dedup

import "fmt"

// ConsolidateStep writes back whole the pending pages of the partition's
// committed state (those whose changes are only in its log), about
// maxBytes of pages per call, in one write batch that keeps the committed
// checkpoint and chain metadata (store.PartitionState.ConsolidateStep).
// more reports that pending pages remain. The log keeps a write batch
// proportional to the records it holds; writing the pages back while the
// partition is idle brings the state at rest back to its page bytes
// (about f/load bits per key) and an empty log.
//
// It does nothing, and reports no more, while the partition has changes
// not yet committed, staged (Options.Staged) or not: call it between write
// batches of an idle partition. Errors are the store's (a failed write
// batch: the partition must stop, as after a failed Commit).
func (p *Deduplicator) ConsolidateStep(maxBytes int64) (more bool, err error) {
	if p.state.DirtyBytes() > 0 || (p.overlay != nil && p.overlay.Modified() > 0) {
		return false, nil
	}
	more, err = p.state.ConsolidateStep(maxBytes)
	if err != nil {
		return false, fmt.Errorf("consolidating the pages of %s/%d: %w", p.topic, p.partition, err)
	}
	return more, nil
}
