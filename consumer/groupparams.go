package consumer

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Workers of one consumer group share the input partitions, and with them
// the partitions' state: a partition that moves is opened, or rebuilt by
// replay, by whichever member owns it next. A state is refused when it was
// written with other filter parameters or another key spec (dedup.Open),
// but a member without the state rebuilds it under its own, so two
// members configured apart (say KDEDUP_KEY=key and KDEDUP_KEY=header:id)
// would each run and key a partition one way and then the other as it
// moves. So each member names its state parameters in its Kafka client id
// (clientIDPrefix and a digest, which DescribeGroups shows for every
// member), and a member refuses to decide anything in a group where
// another kdedup member names other parameters: it stops with
// ErrGroupParams before its first fetch, and the members already running
// keep their partitions. Members whose client id is not a kdedup one (a
// custom ClientOpts id) are not compared.

// ErrGroupParams is returned (wrapped) by Run when another member of the
// consumer group runs with other state parameters.
var ErrGroupParams = errors.New("consumer: another member of the consumer group runs with other state parameters")

// clientIDPrefix starts the client id of every kdedup worker.
const clientIDPrefix = "kdedup-"

// clientID is the Kafka client id of a worker whose state parameters print
// as params: clientIDPrefix and 16 hexadecimal digits of their SHA-256.
func clientID(params string) string {
	sum := sha256.Sum256([]byte(params))
	return clientIDPrefix + hex.EncodeToString(sum[:8])
}

// groupParams is what every member of the group must share, as text: the
// state parameters (dedup.Options.StateParams) and, when set, the
// repartition topic (a member without it would deduplicate input
// partitions that the others only repartition).
func (w *Worker) groupParams() string {
	s := w.opts.Dedup.Options().StateParams().String()
	if r := w.opts.RepartitionTopic; r != "" {
		s += " repartition=" + r
	}
	return s
}

// checkGroupParams returns ErrGroupParams (wrapped) when a member of the
// group other than this one has a kdedup client id other than this
// worker's. It asks once per client (checkedParams), until an answer comes.
func (w *Worker) checkGroupParams(ctx context.Context, cl *kgo.Client, adm *kadm.Client) error {
	if w.checkedParams.Load() == cl {
		return nil
	}
	own := clientID(w.groupParams())
	if got, _ := cl.OptValue(kgo.ClientID).(string); got != own {
		return nil // a custom client id: not compared
	}
	member, _ := cl.GroupMetadata()
	groups, err := adm.DescribeGroups(ctx, w.opts.Group)
	if err != nil {
		w.log.Warn("describing the group to compare its members' state parameters; asking again at the next assignment", "err", err)
		return nil
	}
	g := groups[w.opts.Group]
	if g.Err != nil {
		w.log.Warn("describing the group to compare its members' state parameters; asking again at the next assignment", "err", g.Err)
		return nil
	}
	w.checkedParams.Store(cl) // asked: once per client
	for _, m := range g.Members {
		if m.MemberID == member || !strings.HasPrefix(m.ClientID, clientIDPrefix) || m.ClientID == own {
			continue
		}
		return fmt.Errorf("%w: member %s on %s has client id %s, this worker %s (%s); every worker of group %s must run with the same KDEDUP_KEY, filter parameters (KDEDUP_CAPACITY, KDEDUP_TARGET_FPR, KDEDUP_FINGERPRINT_BITS, KDEDUP_BUCKET_SIZE, KDEDUP_PAGE_BYTES, KDEDUP_MAX_KICKS, KDEDUP_EXPANSION, KDEDUP_WINDOW, KDEDUP_WINDOW_GENERATIONS) and KDEDUP_REPARTITION_TOPIC",
			ErrGroupParams, m.MemberID, m.ClientHost, m.ClientID, own, w.groupParams(), w.opts.Group)
	}
	return nil
}
