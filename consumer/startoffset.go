package consumer

import (
	"context"

	"github.com/twmb/franz-go/pkg/kadm"
)

// groupOffsets tells which input topics the group has committed offsets
// for, fetched once per offset adjustment (adjustOffsets) and only when a
// partition without a committed offset needs it.
//
// StartAtLatest is for the partitions the group had never seen when it
// first started. A partition without a committed offset in a topic where
// the group has committed another partition was added to the topic since
// the group started, so every record in it arrived while the group was
// running: it is read from its start, or the records written before its
// first assignment (up to a metadata refresh later) would be skipped. A
// partition that has had no record to decide since the group started has
// no committed offset either, and is read from its start too when it
// changes owner: that can forward records older than the group, never
// lose one.
type groupOffsets struct {
	fetched   bool
	committed map[string]bool
	// ends are the input's end offsets, listed once per adjustment for
	// the partitions that start at the end (startEmpty).
	ends kadm.ListedOffsets
}

// topicCommitted reports whether the group has a committed offset for some
// partition of topic. When the offsets cannot be fetched it reports false,
// so the partition starts at the reset offset as before.
func (g *groupOffsets) topicCommitted(ctx context.Context, w *Worker, adm offsetAdmin, topic string) bool {
	if !g.fetched {
		g.fetched = true
		g.committed = map[string]bool{}
		resp, err := adm.FetchOffsets(ctx, w.opts.Group)
		if err != nil {
			w.log.Warn("fetching the group's committed offsets to tell new partitions from old; partitions without one start at KDEDUP_START_OFFSET", "err", err)
			return false
		}
		resp.Each(func(o kadm.OffsetResponse) {
			if o.Err == nil && o.At >= 0 {
				g.committed[o.Topic] = true
			}
		})
	}
	return g.committed[topic]
}
