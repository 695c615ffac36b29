package filter

// Overlay is a Pager that stages a chain's page changes over another Pager
// until Commit applies them or Discard drops them. Exactly-once delivery
// needs it: the filter changes decided in a Kafka transaction take effect
// only if the transaction commits; an aborted transaction rewinds the input,
// so its changes must vanish.
//
// The first access to a page in a round copies it (the chain modifies pages
// in place, and the base copy must stay as committed); later accesses reuse
// the copy. Commit copies the changed bytes back into the base pages and
// reports them to the base Pager with MarkChanged (MarkDirty for a page
// marked dirty as a whole), so that a store persisting changed byte ranges
// sees the same ranges with or without staging; pages only read are
// dropped. The ranges held are proportional to the changes of the round.
//
// Not safe for concurrent use.
type Overlay struct {
	base   Pager
	staged map[PageID][]byte
	// modified holds, per page changed this round, the byte ranges changed
	// in the order they were reported; nil means the whole page.
	modified map[PageID][]byteRange
	dropped  []uint32 // sub-filters dropped this round
	spare    [][]byte // page buffers for reuse
}

// byteRange is bytes [off, off+n) of a page.
type byteRange struct{ off, n int }

// NewOverlay returns an Overlay over base with nothing staged.
func NewOverlay(base Pager) *Overlay {
	return &Overlay{base: base, staged: map[PageID][]byte{}, modified: map[PageID][]byteRange{}}
}

// Page returns the staged copy of page id, copying it from the base on first
// access since the last Commit or Discard.
func (o *Overlay) Page(id PageID) ([]byte, error) {
	if pg, ok := o.staged[id]; ok {
		return pg, nil
	}
	pg, err := o.base.Page(id)
	if err != nil {
		return nil, err
	}
	var cp []byte
	if n := len(o.spare); n > 0 && len(o.spare[n-1]) == len(pg) {
		cp, o.spare = o.spare[n-1], o.spare[:n-1]
	} else {
		cp = make([]byte, len(pg))
	}
	copy(cp, pg)
	o.staged[id] = cp
	return cp, nil
}

// MarkDirty records that the staged copy of id was modified as a whole.
func (o *Overlay) MarkDirty(id PageID, page []byte) {
	o.staged[id] = page
	o.modified[id] = nil
}

// MarkChanged records that bytes [off, off+n) of the staged copy of id were
// modified.
func (o *Overlay) MarkChanged(id PageID, page []byte, off, n int) {
	o.staged[id] = page
	rs, ok := o.modified[id]
	if ok && rs == nil {
		return // already dirty as a whole
	}
	if off < 0 || n < 0 || off+n > len(page) {
		o.modified[id] = nil
		return
	}
	o.modified[id] = append(rs, byteRange{off: off, n: n})
}

// Drop forgets the staged pages of subFilter; Commit passes the drop on to
// the base Pager, Discard forgets it (the sub-filter is back in the chain
// the caller restores).
func (o *Overlay) Drop(subFilter uint32) {
	for id := range o.staged {
		if id.SubFilter == subFilter {
			o.release(id)
		}
	}
	o.dropped = append(o.dropped, subFilter)
}

// Modified returns the number of pages modified since the last Commit or
// Discard.
func (o *Overlay) Modified() int { return len(o.modified) }

// Staged returns the number of pages the Overlay holds a copy of: every
// page read or modified since the last Commit or Discard. With
// PageBytes each, it is the memory the round holds besides at most
// maxSparePages buffers kept for reuse.
func (o *Overlay) Staged() int { return len(o.staged) }

// maxSparePages bounds the page buffers an Overlay keeps for reuse after
// a round, so that an idle partition holds at most this many pages
// besides its staged ones.
const maxSparePages = 64

// Commit writes every modified page into the base Pager (marking the changed
// ranges there) and starts a new round. An error comes from the base Pager
// reading a page; pages already applied stay applied, so the caller must
// treat the base as unusable (a storage error stops the partition).
func (o *Overlay) Commit() error {
	for id, rs := range o.modified {
		pg, err := o.base.Page(id)
		if err != nil {
			return err
		}
		staged := o.staged[id]
		if rs == nil {
			copy(pg, staged)
			o.base.MarkDirty(id, pg)
			continue
		}
		for _, r := range rs {
			copy(pg[r.off:r.off+r.n], staged[r.off:r.off+r.n])
			o.base.MarkChanged(id, pg, r.off, r.n)
		}
	}
	for _, sub := range o.dropped {
		o.base.Drop(sub)
	}
	o.reset()
	return nil
}

// Discard drops every staged change and starts a new round.
func (o *Overlay) Discard() { o.reset() }

func (o *Overlay) reset() {
	for id := range o.staged {
		o.release(id)
	}
	o.dropped = o.dropped[:0]
}

// release forgets the staged copy of id and keeps its buffer for reuse.
func (o *Overlay) release(id PageID) {
	if len(o.spare) < maxSparePages {
		o.spare = append(o.spare, o.staged[id])
	}
	delete(o.staged, id)
	delete(o.modified, id)
}
