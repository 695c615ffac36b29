package store

import (
	"bytes"
	"errors"
	"testing"

	"github.com/kdedup/kdedup/filter"
)

// TestConsolidateStep logs one change to each of 40 pages, then writes
// them back in steps of at most a few pages: each step commits one write
// batch of whole pages within its byte budget, reports more until the
// last, keeps metadata, checkpoint and page bytes as committed, and leaves
// no pending page and no log entry behind; a step with nothing to do
// writes nothing, and a new change makes the next step work again.
func TestConsolidateStep(t *testing.T) {
	const pb, pages = 256, 40
	db := openT(t, Options{InMemory: true, PageBytes: pb, FlushBytes: smallFlush})
	p := partitionT(t, db, "orders", 3)
	defer p.Close()

	model := map[filter.PageID][]byte{}
	write := func(id filter.PageID, off int, b byte, whole bool) {
		t.Helper()
		pg, err := p.Page(id)
		if err != nil {
			t.Fatal(err)
		}
		pg[off] = b
		if whole {
			p.MarkDirty(id, pg)
		} else {
			p.MarkChanged(id, pg, off, 1)
		}
		model[id] = bytes.Clone(pg)
	}
	ids := make([]filter.PageID, pages)
	for i := range ids {
		ids[i] = filter.PageID{SubFilter: uint32(i % 2), Page: uint32(i)}
		write(ids[i], 0, 1, true) // a base
	}
	cp := Checkpoint{Offset: 100, LeaderEpoch: 4}
	if err := p.Commit([]byte("meta-1"), cp); err != nil {
		t.Fatal(err)
	}
	if more, err := p.ConsolidateStep(1); err != nil || more {
		t.Fatalf("ConsolidateStep without pending pages = %t, %v; want false, nil", more, err)
	}
	for i, id := range ids {
		write(id, 1+i%pb, byte(i+2), false) // one logged change each
	}
	cp2 := Checkpoint{Offset: 200, LeaderEpoch: 5}
	if err := p.Commit([]byte("meta-2"), cp2); err != nil {
		t.Fatal(err)
	}
	if n := p.PendingPages(); n != pages {
		t.Fatalf("%d pages pending, want %d", n, pages)
	}

	// Dirty state is refused, untouched.
	write(ids[0], 5, 9, false)
	if _, err := p.ConsolidateStep(1 << 20); !errors.Is(err, ErrDirty) {
		t.Fatalf("ConsolidateStep with a dirty page: %v, want ErrDirty", err)
	}
	p.Discard()
	model[ids[0]][5] = 0

	const perStep = 3
	budget := int64(perStep * pb) // a page rewritten whole counts PageBytes
	commits := counterValue(t, db.metrics.commits)
	var steps int
	for more := true; more; {
		var err error
		if more, err = p.ConsolidateStep(budget); err != nil {
			t.Fatal(err)
		}
		steps++
		left := p.PendingPages()
		if want := max(0, pages-perStep*steps); left != want {
			t.Fatalf("after step %d: %d pages pending, want %d", steps, left, want)
		}
		if more != (left > 0) {
			t.Fatalf("step %d reports more=%t with %d pages left", steps, more, left)
		}
	}
	if want := (pages + perStep - 1) / perStep; steps != want {
		t.Fatalf("%d steps, want %d", steps, want)
	}
	if got := counterValue(t, db.metrics.commits) - commits; got != int64(steps) {
		t.Fatalf("%d write batches for %d steps", got, steps)
	}
	if got := counterValue(t, db.metrics.consolidatedPages); got != pages {
		t.Fatalf("kdedup_store_pages_consolidated_total = %d, want %d", got, pages)
	}
	if got, _ := p.Checkpoint(); got != cp2 || string(p.Meta()) != "meta-2" {
		t.Fatalf("checkpoint %+v meta %q after consolidation, want %+v meta-2", got, p.Meta(), cp2)
	}

	// Nothing left: no write batch, no listing.
	commits = counterValue(t, db.metrics.commits)
	if more, err := p.ConsolidateStep(budget); err != nil || more {
		t.Fatalf("ConsolidateStep after the last = %t, %v", more, err)
	}
	if got := counterValue(t, db.metrics.commits) - commits; got != 0 {
		t.Fatalf("an idle step wrote %d write batches", got)
	}

	// A new change is written back by the next step.
	write(ids[7], 9, 42, false)
	if err := p.Commit([]byte("meta-3"), Checkpoint{Offset: 300}); err != nil {
		t.Fatal(err)
	}
	if more, err := p.ConsolidateStep(budget); err != nil || more {
		t.Fatalf("ConsolidateStep after a new change = %t, %v", more, err)
	}
	if floors, logs := storedState(t, p); len(logs) != 0 || len(floors) != pages || p.PendingPages() != 0 {
		t.Fatalf("%d bases, %d log entries and %d pages pending, want %d, 0 and 0", len(floors), len(logs), p.PendingPages(), pages)
	}

	// Read back from Badger: the pages are the model's.
	p.Close()
	p = partitionT(t, db, "orders", 3)
	for id, want := range model {
		if got := mustPage(t, p, id); !bytes.Equal(got, want) {
			t.Fatalf("page %v after consolidation differs from the model", id)
		}
	}
}
