package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kdedup/kdedup/config"
	"github.com/kdedup/kdedup/consumer"
)

// ErrTopic is matched by the error Run returns when a topic the worker
// produces to (KDEDUP_OUTPUT_TOPIC, KDEDUP_DUPLICATES_TOPIC,
// KDEDUP_DEAD_LETTER_TOPIC) does not exist or may not be written, at
// start-up or later (a *consumer.TopicError). The error names the variable.
// It is a runtime failure (exit 1), not a configuration error: the name may
// be right and the topic not created yet.
var ErrTopic = consumer.ErrTopic

// topicVariables maps the role of each topic the worker produces to onto
// the variable that names it: the one place where the worker's topic
// roles become configuration names.
var topicVariables = map[consumer.TopicRole]string{
	consumer.RoleOutput:      config.Prefix + "OUTPUT_TOPIC",
	consumer.RoleDuplicates:  config.Prefix + "DUPLICATES_TOPIC",
	consumer.RoleDeadLetter:  config.Prefix + "DEAD_LETTER_TOPIC",
	consumer.RoleRepartition: config.Prefix + "REPARTITION_TOPIC",
}

// targetTopics returns the topics a worker with cfg produces to, by role.
func targetTopics(cfg config.Config) []consumer.TargetTopic {
	return consumer.Options{OutputTopic: cfg.OutputTopic, DuplicatesTopic: cfg.DuplicatesTopic, DeadLetterTopic: cfg.DeadLetterTopic, RepartitionTopic: cfg.RepartitionTopic}.TargetTopics()
}

// named tells an error of the worker in configuration terms: a
// *consumer.TopicError gets the variable naming its topic in front
// (KDEDUP_OUTPUT_TOPIC=orders-dedup: ...), a *consumer.RecordError the
// variable that sends such records to a dead-letter topic after it.
func named(err error) error {
	var te *consumer.TopicError
	if errors.As(err, &te) {
		return fmt.Errorf("%s=%s: %w", topicVariables[te.Role], te.Topic, err)
	}
	var re *consumer.RecordError
	if errors.As(err, &re) {
		return fmt.Errorf("%w (set %s to send such records there and go on)", err, topicVariables[consumer.RoleDeadLetter])
	}
	return err
}

// checkTargetTopics checks that every topic the worker produces to exists
// and, when the brokers report authorized operations (KIP-430), that the
// worker may write it; it returns an error wrapping ErrTopic naming the
// variable otherwise. It returns each topic's largest record batch in
// bytes (consumer.Options.MaxRecordBytes): KDEDUP_MAX_RECORD_BYTES when
// set, else the topic's max.message.bytes as DescribeConfigs reports it,
// else (not reported, or DescribeConfigs not authorized)
// consumer.DefaultMaxRecordBytes.
func checkTargetTopics(ctx context.Context, cfg config.Config, opts []kgo.Opt, log *slog.Logger) (map[string]int, error) {
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(cfg.Brokers...)}, opts...)...)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrConfig, err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()

	targets := targetTopics(cfg)
	names := make([]string, len(targets))
	for i, t := range targets {
		names[i] = t.Topic
	}
	// A topic created a moment ago may not be in every broker's metadata
	// yet: ask again for a few seconds before calling it missing.
	var md kadm.Metadata
	for unknownUntil := time.Now().Add(topicPropagation); ; {
		md, err = adm.Metadata(kadm.WithAuthorizedOps(ctx), names...)
		if err != nil {
			return nil, fmt.Errorf("checking the topics the worker produces to: %w", err)
		}
		if !anyUnknown(md, names) || time.Now().After(unknownUntil) {
			break
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("checking the topics the worker produces to: %w", ctx.Err())
		case <-time.After(250 * time.Millisecond):
		}
	}
	var errs []error
	for _, t := range targets {
		var problem string
		d, ok := md.Topics[t.Topic]
		switch {
		case !ok || errors.Is(d.Err, kerr.UnknownTopicOrPartition):
			problem = "the topic does not exist"
		case errors.Is(d.Err, kerr.TopicAuthorizationFailed):
			problem = "not authorized to describe the topic"
		case d.Err != nil:
			problem = d.Err.Error()
		case len(d.AuthorizedOperations) > 0 && !slices.Contains(d.AuthorizedOperations, kadm.OpWrite) && !slices.Contains(d.AuthorizedOperations, kadm.OpAll):
			problem = "not authorized to write to the topic"
		default:
			continue
		}
		errs = append(errs, named(&consumer.TopicError{Role: t.Role, Topic: t.Topic, Err: errors.New(problem)}))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	rcs, err := adm.DescribeTopicConfigs(ctx, names...)
	if r := cfg.RepartitionTopic; r != "" {
		if err := checkRepartitionTopic(md.Topics[r], rcs, log); err != nil {
			return nil, named(&consumer.TopicError{Role: consumer.RoleRepartition, Topic: r, Err: err})
		}
	}

	limits := map[string]int{}
	if cfg.MaxRecordBytes != 0 {
		for _, n := range names {
			limits[n] = int(cfg.MaxRecordBytes)
		}
		return limits, nil
	}
	if err != nil {
		log.Warn("cannot read max.message.bytes of the topics the worker produces to; assuming Kafka's default (set KDEDUP_MAX_RECORD_BYTES to choose)",
			"default", consumer.DefaultMaxRecordBytes, "err", err)
	}
	for _, n := range names {
		limits[n] = consumer.DefaultMaxRecordBytes
		rc, err := rcs.On(n, nil)
		if err != nil || rc.Err != nil {
			continue
		}
		for _, c := range rc.Configs {
			if c.Key != "max.message.bytes" || c.Value == nil {
				continue
			}
			if v, err := strconv.Atoi(*c.Value); err == nil && v > 0 {
				limits[n] = v
			}
		}
	}
	return limits, nil
}

// checkRepartitionTopic states the repartition topic's partition count
// and refuses a topic whose broker stamps its own time on records
// (message.timestamp.type=LogAppendTime): the dedup stage keys, windows
// and forwards each record with the timestamp its producer gave it. A
// configuration the brokers do not describe is not checked.
func checkRepartitionTopic(d kadm.TopicDetail, rcs kadm.ResourceConfigs, log *slog.Logger) error {
	if rc, err := rcs.On(d.Topic, nil); err == nil && rc.Err == nil {
		for _, c := range rc.Configs {
			if c.Key == "message.timestamp.type" && c.Value != nil && *c.Value == "LogAppendTime" {
				return errors.New("message.timestamp.type is LogAppendTime: the broker would replace each record's timestamp, which the output and the dedup window keep; set it to CreateTime")
			}
		}
	}
	log.Info("repartitioning by the dedup key", "repartition_topic", d.Topic, "partitions", len(d.Partitions),
		"note", "every record of one dedup key goes to one of these partitions; their count must never change")
	return nil
}

// topicPropagation is how long checkTargetTopics waits for a topic the
// brokers do not know yet: a new topic reaches each broker's metadata from
// the controller within a second or so.
const topicPropagation = 3 * time.Second

// anyUnknown reports whether md lacks one of names or says it does not exist.
func anyUnknown(md kadm.Metadata, names []string) bool {
	for _, n := range names {
		if d, ok := md.Topics[n]; !ok || errors.Is(d.Err, kerr.UnknownTopicOrPartition) {
			return true
		}
	}
	return false
}
