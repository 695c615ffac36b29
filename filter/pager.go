package filter

// PageID names one page of a chain: the sub-filter it belongs to (0 is the
// oldest) and its index inside that sub-filter.
type PageID struct {
	SubFilter uint32
	Page      uint32
}

// Pager supplies the pages a Chain reads and writes. The chain never keeps a
// page across operations: it asks for the page, reads or modifies it, and, if
// it modified it, calls MarkChanged (or MarkDirty) before its next call to
// Page. A Pager can therefore evict clean pages at any Page call and persist
// exactly the dirty ones, and, from MarkChanged, exactly the bytes that
// changed in them.
//
// Pager is declared here because the Chain is its only user; store.PartitionState
// is the durable implementation and MemPager the in-memory one.
type Pager interface {
	// Page returns the page id, exactly PageBytes long. A page that was never
	// written reads as all zeros (every slot empty). The chain may modify the
	// returned slice in place; it then calls MarkChanged or MarkDirty.
	Page(id PageID) ([]byte, error)
	// MarkDirty records that page (the slice returned by Page for id) was
	// modified and must be persisted by the next write batch.
	// The whole page counts as changed.
	MarkDirty(id PageID, page []byte)
	// MarkChanged is MarkDirty for a change confined to bytes
	// [off, off+n) of page; a page changed in several places gets one call
	// per place. 0 <= off and off+n <= len(page); a Pager may treat a call
	// outside that as MarkDirty.
	MarkChanged(id PageID, page []byte, off, n int)
	// Drop records that sub-filter subFilter left the chain (a window's
	// oldest, once every key it held expired): none of its pages will be asked for again, and they may be
	// deleted once metadata without the sub-filter is durable, not before
	// (the durable metadata still refers to them until then). Pages of the
	// sub-filter marked dirty and not yet persisted need not be.
	Drop(subFilter uint32)
}
