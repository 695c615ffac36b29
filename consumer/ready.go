package consumer

import (
	"context"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// A member joining a group with the cooperative-sticky balancer gets its
// partitions in two rounds: the first assigns it only what no member has to
// give up (often nothing), the members that must give partitions up revoke
// them and rejoin, and the second round assigns those. franz-go calls
// OnPartitionsAssigned after each. A member that took the first round for
// its assignment answered ready before it owned anything, and a probe in
// that window let a rolling update or a scale-up move on while the group
// was about to move partitions to it (and it to rebuild them).
//
// So the worker becomes ready only once its group's assignment is
// complete: the group is Stable and its members' assignments together
// cover every partition of the input topics. The first round leaves the
// partitions being moved unassigned, so it never qualifies; a member of a
// group with more members than partitions, which owns nothing once the
// group is complete, still becomes ready. After that, readiness follows
// the partitions (Ready): a later rebalance does not wait for the group.

// assignmentCheckInterval is how often a member that has joined asks the
// group coordinator whether the group's assignment is complete.
const assignmentCheckInterval = 100 * time.Millisecond

// awaitCompleteAssignment starts, unless the worker is ready already or
// one watches cl already, a goroutine that sets ready once the group's
// assignment is complete (assignmentComplete). It ends then or when cl
// closes.
func (w *Worker) awaitCompleteAssignment(cl *kgo.Client) {
	if w.ready.Load() || w.joining.Swap(cl) == cl {
		return
	}
	go func() {
		adm := kadm.NewClient(cl)
		tick := time.NewTicker(assignmentCheckInterval)
		defer tick.Stop()
		for {
			ctx, cancel := context.WithTimeout(context.Background(), w.opts.SessionTimeout)
			complete, err := w.assignmentComplete(ctx, cl, adm)
			cancel()
			switch {
			case complete:
				if w.joining.Load() == cl { // not a client that release has given up
					w.ready.Store(true)
				}
				return
			case err != nil && cl.Context().Err() != nil: // the client closed
				return
			case err != nil:
				w.log.Debug("asking whether the group's assignment is complete", "err", err)
			}
			select {
			case <-tick.C:
			case <-cl.Context().Done():
				return
			}
		}
	}()
}

// assignmentComplete reports whether this member belongs to the group,
// the group is Stable and every partition of the input topics is assigned
// to one of its members.
func (w *Worker) assignmentComplete(ctx context.Context, cl *kgo.Client, adm *kadm.Client) (bool, error) {
	member, _ := cl.GroupMetadata()
	groups, err := adm.DescribeGroups(ctx, w.opts.Group)
	if err != nil {
		return false, err
	}
	g, ok := groups[w.opts.Group]
	if !ok {
		return false, nil
	}
	if g.Err != nil {
		return false, g.Err
	}
	if g.State != "Stable" {
		return false, nil
	}
	found := false
	for _, m := range g.Members {
		found = found || m.MemberID == member
	}
	if !found {
		return false, nil
	}
	topics, err := adm.ListTopics(ctx, w.opts.consumedTopics()...)
	if err != nil {
		return false, err
	}
	if err := topics.Error(); err != nil {
		return false, err
	}
	assigned := g.AssignedPartitions()
	complete := true
	topics.EachPartition(func(p kadm.PartitionDetail) {
		complete = complete && assigned.Lookup(p.Topic, p.Partition)
	})
	return complete, nil
}
