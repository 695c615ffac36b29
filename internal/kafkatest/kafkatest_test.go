package kafkatest

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// needApache skips unless the environment asks for Apache Kafka: a bare
// go test ./... must pass on a machine without Java.
func needApache(t *testing.T) {
	t.Helper()
	if os.Getenv("KDEDUP_TEST_KAFKA") != "apache" {
		t.Skip("starts Apache Kafka (Java 17 and Maven): set KDEDUP_TEST_KAFKA=apache")
	}
}

func client(t *testing.T, c *Cluster, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(c.Addrs()...)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// rssKiB is the resident set size of a process, from /proc (0 elsewhere).
func rssKiB(pid int) int {
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for line := range strings.Lines(string(status)) {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			n, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
			return n
		}
	}
	return 0
}

// TestBroker: one broker starts with the settings the end-to-end suites
// rely on: topics are created only on request, a consumer group accepts a
// 1s session timeout and rebalances at once, and a transaction with a
// 2.25s timeout (the worker's with a 3s session) commits records that a
// read_committed group reads back exactly, in order.
func TestBroker(t *testing.T) {
	needApache(t)
	start := time.Now()
	c := New(t, Options{})
	t.Logf("Apache Kafka %s: one broker up in %s, RSS %d MiB", DefaultVersion, time.Since(start).Round(time.Millisecond), rssKiB(c.Nodes()[0].PID())>>10)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	adm := kadm.NewClient(client(t, c))
	if _, err := adm.CreateTopic(ctx, 2, 1, nil, "t"); err != nil {
		t.Fatalf("creating topic t: %v", err)
	}
	topics, err := adm.ListTopics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := topics.Names(); len(got) != 1 || got[0] != "t" {
		t.Fatalf("topics %v, want only t", got)
	}
	// The suites stamp records at fixed past dates: time-based retention
	// would delete them mid-test.
	cfgs, err := adm.DescribeTopicConfigs(ctx, "t")
	if err != nil {
		t.Fatal(err)
	}
	rc, err := cfgs.On("t", nil)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(rc.Configs, func(c kadm.Config) bool { return c.Key == "retention.ms" && c.MaybeValue() == "-1" }) {
		t.Fatalf("topic t's configs %v: want retention.ms=-1", rc.Configs)
	}

	pr := client(t, c, kgo.TransactionalID("kafkatest"), kgo.TransactionTimeout(2250*time.Millisecond), kgo.DefaultProduceTopic("t"))
	const n = 200
	if err := pr.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		pr.Produce(ctx, &kgo.Record{Key: []byte(strconv.Itoa(i % 2)), Value: []byte(strconv.Itoa(i))}, nil)
	}
	if err := pr.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if err := pr.EndTransaction(ctx, kgo.TryCommit); err != nil {
		t.Fatalf("committing a transaction: %v", err)
	}

	cons := client(t, c, kgo.ConsumeTopics("t"), kgo.ConsumerGroup("g"), kgo.SessionTimeout(time.Second), kgo.HeartbeatInterval(300*time.Millisecond),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	perKey := map[string][]int{}
	for got := 0; got < n; {
		fs := cons.PollFetches(ctx)
		if err := fs.Err0(); err != nil {
			t.Fatalf("consuming after %d records: %v", got, err)
		}
		fs.EachRecord(func(r *kgo.Record) {
			v, _ := strconv.Atoi(string(r.Value))
			perKey[string(r.Key)] = append(perKey[string(r.Key)], v)
			got++
		})
	}
	for k, vs := range perKey {
		for i, v := range vs {
			if want := i*2 + int(k[0]-'0'); v != want {
				t.Fatalf("key %s: record %d is %d, want %d", k, i, v, want)
			}
		}
	}
	if len(perKey["0"])+len(perKey["1"]) != n {
		t.Fatalf("read %d and %d records for keys 0 and 1, want %d in all", len(perKey["0"]), len(perKey["1"]), n)
	}
}

// TestCluster: three nodes form one cluster; a topic replicated three
// times with min.insync.replicas=2 still takes acks=all writes after its
// leader's JVM is SIGKILLed, and the node rejoins after a restart.
func TestCluster(t *testing.T) {
	needApache(t)
	start := time.Now()
	c := NewCluster(t, 3, Options{})
	t.Logf("three nodes up in %s", time.Since(start).Round(time.Millisecond))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	adm := kadm.NewClient(client(t, c))
	minISR := "2"
	if _, err := adm.CreateTopic(ctx, 1, 3, map[string]*string{"min.insync.replicas": &minISR}, "r"); err != nil {
		t.Fatalf("creating topic r: %v", err)
	}
	leader := func() (int32, []int32) {
		t.Helper()
		for {
			md, err := adm.Metadata(ctx, "r")
			if err == nil {
				p := md.Topics["r"].Partitions[0]
				if p.Err == nil && p.Leader >= 0 {
					return p.Leader, p.ISR
				}
				err = p.Err
			}
			if ctx.Err() != nil {
				t.Fatalf("no leader for r: %v", err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	// A new topic's metadata may name its leader before its full ISR.
	first, isr := leader()
	for len(isr) != 3 && ctx.Err() == nil {
		time.Sleep(100 * time.Millisecond)
		first, isr = leader()
	}
	if len(isr) != 3 {
		t.Fatalf("ISR %v, want all three nodes", isr)
	}

	pr := client(t, c, kgo.DefaultProduceTopic("r"), kgo.RequiredAcks(kgo.AllISRAcks()))
	produce := func(v string) {
		t.Helper()
		if err := pr.ProduceSync(ctx, &kgo.Record{Value: []byte(v)}).FirstErr(); err != nil {
			t.Fatalf("producing %s: %v", v, err)
		}
	}
	produce("before")
	c.Node(first).Kill()
	produce("after")
	if l, _ := leader(); l == first {
		t.Fatalf("the killed node %d still leads", first)
	}
	if err := c.Node(first).Restart(ctx); err != nil {
		t.Fatal(err)
	}

	cons := client(t, c, kgo.ConsumeTopics("r"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	var got [][]byte
	for len(got) < 2 {
		fs := cons.PollFetches(ctx)
		if err := fs.Err0(); err != nil {
			t.Fatal(err)
		}
		fs.EachRecord(func(r *kgo.Record) { got = append(got, r.Value) })
	}
	if len(got) != 2 || !bytes.Equal(got[0], []byte("before")) || !bytes.Equal(got[1], []byte("after")) {
		t.Fatalf("read %q, want before and after", got)
	}
}
