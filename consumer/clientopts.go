package consumer

import (
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// GroupClientOpts are the franz-go settings of the worker's group client
// that follow from o alone (after defaults): seed brokers, consumer group
// and input topics, cooperative-sticky balancing, the log start as the reset
// offset (StartAtLatest is the worker's to apply, in its offset plan), read
// committed, session and heartbeat, metadata ages, retried EOFs, rebalances
// blocked while polled records are handled (the caller calls
// AllowRebalance), the output topic, the fetch and decompression bounds; with
// ExactlyOnce the transactional id and timeout (use them in a
// kgo.GroupTransactSession), otherwise marked offsets committed every
// FlushInterval. The worker adds its group callbacks, producer batch limits,
// logger, ConnOpts and ClientOpts. A baseline that consumes as the worker
// does (kdedup-bench peers' passthrough) takes these, so that it cannot drift
// from the worker's settings.
func (o Options) GroupClientOpts() []kgo.Opt {
	o = o.withDefaults()
	opts := []kgo.Opt{
		kgo.SeedBrokers(o.Brokers...),
		kgo.ConsumerGroup(o.Group),
		kgo.ConsumeTopics(o.consumedTopics()...),
		kgo.Balancers(kgo.CooperativeStickyBalancer()),
		// The reset offset is also where franz-go goes when an offset is
		// out of range (retention deleted it): always the log start, so
		// that no retained record is skipped. StartAtLatest is applied by
		// the worker's offset plan, to partitions the group never saw.
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.SessionTimeout(o.SessionTimeout),
		kgo.HeartbeatInterval(min(3*time.Second, o.SessionTimeout/3)),
		// Recover from leadership changes within a second rather than
		// franz-go's default 5s: a stalled produce holds a write batch or
		// a transaction open.
		kgo.MetadataMinAge(time.Second),
		// franz-go's default (5m) is also how long partitions added to an
		// input topic wait for an owner.
		kgo.MetadataMaxAge(o.MetadataMaxAge),
		// A broker restarting accepts connections and closes them: franz-go
		// takes an EOF on a connection's first read for a TLS or SASL
		// mismatch and fails the request, which fails buffered records
		// ("is TLS missing?") and the group session. The start-up access
		// check (KDEDUP_TLS_*, KDEDUP_SASL_*) has already ruled a mismatch
		// out, so such an EOF is an outage and is retried.
		kgo.AlwaysRetryEOF(),
		kgo.BlockRebalanceOnPoll(),
		kgo.DefaultProduceTopic(o.OutputTopic),
		kgo.MaxDecompressBatchBytes(o.MaxDecompressBytes),
	}
	if o.FetchMaxBytes > 0 {
		opts = append(opts, kgo.FetchMaxBytes(o.FetchMaxBytes))
	}
	if o.InstanceID != "" {
		opts = append(opts, kgo.InstanceID(o.InstanceID))
	}
	if o.Delivery == ExactlyOnce {
		return append(opts,
			kgo.TransactionalID(o.TransactionalID),
			// A transaction must end before the session can expire, so
			// that a member kicked from the group cannot commit late.
			kgo.TransactionTimeout(min(40*time.Second, o.SessionTimeout*3/4)),
		)
	}
	return append(opts, kgo.AutoCommitMarks(), kgo.AutoCommitInterval(o.FlushInterval))
}
