package tests

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/testcontainers/testcontainers-go"
	"github.com/testcontainers/testcontainers-go/modules/redpanda"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/goleak"

	"github.com/kdedup/kdedup/internal/kafkatest"
)

// binary is the kdedup binary built by TestMain for tests that kill the
// worker as a process.
var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "kdedup-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary = filepath.Join(dir, "kdedup")
	build := exec.Command("go", "build", "-o", binary, "../cmd/kdedup")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building kdedup:", err)
		os.Exit(1)
	}
	code := m.Run()
	if apache.cluster != nil {
		if err := apache.cluster.Close(); err != nil {
			fmt.Fprintln(os.Stderr, err)
		}
	}
	os.RemoveAll(dir)
	// The workers, brokers, clients and servers the tests start must all
	// be gone once the tests have stopped them (checked after a passing
	// run only, as goleak.VerifyTestMain does, and after the cleanup
	// above, which VerifyTestMain would skip).
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: errors on a successful test run: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// apache is the Apache Kafka broker of KDEDUP_TEST_KAFKA=apache: one for the
// whole package run, started by the first test that asks for a broker
// (tests get unique topic and group names) and stopped by TestMain, so
// that the suites pay a JVM's start-up once.
var apache struct {
	once    sync.Once
	cluster *kafkatest.Cluster
	err     error
}

func apacheBroker(t *testing.T) *kafkatest.Cluster {
	t.Helper()
	apache.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		start := time.Now()
		apache.cluster, apache.err = kafkatest.Start(ctx, 1, kafkatest.Options{})
		if apache.err == nil {
			t.Logf("Apache Kafka %s up in %s at %s", kafkatest.DefaultVersion, time.Since(start).Round(time.Millisecond), apache.cluster.Addrs()[0])
		}
	})
	if apache.err != nil {
		t.Fatalf("KDEDUP_TEST_KAFKA=apache: %v", apache.err)
	}
	return apache.cluster
}

// broker is the Kafka-protocol cluster a test runs against.
type broker struct {
	addrs   []string
	prefix  string         // prepended to topic and group names, unique per test
	cluster *kfake.Cluster // the in-process broker; nil for a real one
	conn    []kgo.Opt      // connection options (TLS, SASL) of every client
}

// fake returns the in-process kfake cluster, skipping the test (saying why)
// when the suite runs against a real broker: fault injection needs kfake.
func (b *broker) fake(t *testing.T) *kfake.Cluster {
	t.Helper()
	if b.cluster == nil {
		t.Skip("needs kfake's fault injection; KDEDUP_TEST_KAFKA, KDEDUP_TEST_BROKERS or KDEDUP_TEST_CONTAINERS selects a real broker")
	}
	return b.cluster
}

// newBroker returns the broker the environment selects: kfake in-process
// (default), Apache Kafka started by the package when
// KDEDUP_TEST_KAFKA=apache, KDEDUP_TEST_BROKERS, or a Redpanda container
// when KDEDUP_TEST_CONTAINERS=1.
func newBroker(t *testing.T) *broker {
	t.Helper()
	prefix := fmt.Sprintf("kdedup-%s-%08x-", strings.ToLower(strings.ReplaceAll(t.Name(), "/", "-")), rand.Uint32())
	switch kafka := os.Getenv("KDEDUP_TEST_KAFKA"); {
	case kafka == "apache":
		c := apacheBroker(t)
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("Apache Kafka's log (WARN and above, since it started):\n%s", c.Log())
			}
		})
		return &broker{addrs: c.Addrs(), prefix: prefix}
	case kafka != "" && kafka != "kfake":
		t.Fatalf("KDEDUP_TEST_KAFKA=%q: want apache, or kfake (the default)", kafka)
	case os.Getenv("KDEDUP_TEST_BROKERS") != "":
		return &broker{addrs: strings.Split(os.Getenv("KDEDUP_TEST_BROKERS"), ","), prefix: prefix}
	case os.Getenv("KDEDUP_TEST_CONTAINERS") == "1":
		testcontainers.SkipIfProviderIsNotHealthy(t)
		ctx := context.Background()
		c, err := redpanda.Run(ctx, "docker.redpanda.com/redpandadata/redpanda:v24.2.4", redpanda.WithAutoCreateTopics())
		if err != nil {
			t.Fatalf("starting a Redpanda container: %v", err)
		}
		t.Cleanup(func() { _ = testcontainers.TerminateContainer(c) })
		seed, err := c.KafkaSeedBroker(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return &broker{addrs: []string{seed}, prefix: prefix}
	}
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.GroupMinSessionTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return &broker{addrs: c.ListenAddrs(), prefix: prefix, cluster: c}
}

func (b *broker) name(s string) string { return b.prefix + s }

func (b *broker) client(t *testing.T, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(append(append([]kgo.Opt{kgo.SeedBrokers(b.addrs...)}, b.conn...), opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

func (b *broker) admin(t *testing.T) *kadm.Client { return kadm.NewClient(b.client(t)) }

// createTopics creates each topic with the given partitions.
func (b *broker) createTopics(t *testing.T, partitions int32, topics ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := b.admin(t).CreateTopics(ctx, partitions, 1, nil, topics...)
	if err == nil {
		err = resp.Error()
	}
	if err != nil {
		t.Fatalf("creating topics %v: %v", topics, err)
	}
	// A real broker lists a new topic in its metadata a moment after
	// CreateTopics answers; a worker started before would find no topic.
	for {
		md, err := b.admin(t).Metadata(ctx, topics...)
		known := err == nil
		for _, topic := range topics {
			d, ok := md.Topics[topic]
			known = known && ok && d.Err == nil && len(d.Partitions) == int(partitions)
			for _, p := range d.Partitions {
				known = known && p.Err == nil && p.Leader >= 0
			}
		}
		if known {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("topics %v not in the brokers' metadata within 30s (last error %v)", topics, err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// TestBrokerSelection: the suites run on the broker the environment
// selects. With KDEDUP_TEST_KAFKA=apache that is the package's one Apache
// Kafka broker (a KRaft cluster id, not kfake's "kfake"), and a test that
// needs fault injection skips; by default it is an in-process kfake.
func TestBrokerSelection(t *testing.T) {
	b := newBroker(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	md, err := b.admin(t).BrokerMetadata(ctx)
	if err != nil {
		t.Fatal(err)
	}
	switch {
	case os.Getenv("KDEDUP_TEST_KAFKA") == "apache":
		if b.cluster != nil || md.Cluster == "kfake" {
			t.Fatalf("KDEDUP_TEST_KAFKA=apache: the suite runs on kfake (cluster %q at %v)", md.Cluster, b.addrs)
		}
		if apache.cluster == nil || len(md.Brokers) != 1 || md.Brokers[0].Port != int32(mustPort(t, apache.cluster.Addrs()[0])) {
			t.Fatalf("KDEDUP_TEST_KAFKA=apache: cluster %q at %v is not the one launched Apache Kafka broker", md.Cluster, b.addrs)
		}
		ranOn := false
		t.Run("fault injection skips", func(t *testing.T) { b.fake(t); ranOn = true })
		if ranOn {
			t.Fatal("a test needing fault injection ran on Apache Kafka")
		}
	case os.Getenv("KDEDUP_TEST_BROKERS") != "" || os.Getenv("KDEDUP_TEST_CONTAINERS") == "1":
		if b.cluster != nil {
			t.Fatal("a real broker was selected, but the test runs on kfake")
		}
	default:
		if b.cluster == nil || md.Cluster != "kfake" {
			t.Fatalf("default: cluster %q (kfake in-process: %t), want kfake", md.Cluster, b.cluster != nil)
		}
	}
	t.Logf("cluster %q at %v", md.Cluster, b.addrs)
}

func mustPort(t *testing.T, addr string) int {
	t.Helper()
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(port)
	if err != nil {
		t.Fatal(err)
	}
	return n
}
