// Package kafkatest starts Apache Kafka for tests: one combined KRaft
// broker+controller, or a cluster of several, as JVM processes on free
// loopback ports, with settings that suit short tests (replication factor
// 1 for the internal topics of a single broker, no initial rebalance delay,
// session timeouts down to one second, a small heap). The broker's jars are
// resolved with Maven into a cache directory outside the repository (see
// Resolve); each cluster lives in a temporary directory that Close removes.
//
// It needs Java 17 and Maven; without them Start returns ErrNoToolchain.
package kafkatest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"golang.org/x/sync/errgroup"
)

// DefaultVersion is the version of org.apache.kafka:kafka_2.13 that Start
// runs when Options.Version is empty.
const DefaultVersion = "4.4.0"

// Options configure a cluster. The zero value runs DefaultVersion with the
// defaults below.
type Options struct {
	// Version of org.apache.kafka:kafka_2.13 (default DefaultVersion).
	Version string
	// CacheDir holds the resolved jars of Version (default
	// kdedup/kafka-<Version> under os.UserCacheDir: $XDG_CACHE_HOME or
	// ~/.cache).
	CacheDir string
	// Heap is each broker's maximum JVM heap as -Xmx takes it (default
	// "512m").
	Heap string
	// Properties are added to each broker's server.properties, replacing a
	// test setting of the same name.
	Properties map[string]string
}

func (o Options) version() string {
	if o.Version == "" {
		return DefaultVersion
	}
	return o.Version
}

func (o Options) heap() string {
	if o.Heap == "" {
		return "512m"
	}
	return o.Heap
}

// Cluster is a running Apache Kafka cluster. Its methods are safe for
// concurrent use.
type Cluster struct {
	dir   string
	java  string
	libs  string
	opts  Options
	nodes []*Node
}

// Node is one combined broker+controller of a Cluster.
type Node struct {
	// ID is the node.id, 1 to the cluster's size.
	ID int32
	// Addr is host:port of its client listener (PLAINTEXT).
	Addr string

	c   *Cluster
	dir string

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{} // closed when cmd has been waited for
}

// Start starts a cluster of n combined broker+controller nodes (n >= 1)
// and returns once every broker answers metadata requests listing all n.
// With n > 1 the internal topics (consumer offsets, transaction state)
// are replicated n times with min.insync.replicas 2, so that they survive
// the loss of one node.
//
// Returns ErrNoToolchain without Java or Maven, and an error carrying the
// broker's log when a node does not start. Close stops the cluster; Start
// cleans up after itself on error.
func Start(ctx context.Context, n int, opts Options) (*Cluster, error) {
	if n < 1 {
		return nil, fmt.Errorf("kafkatest: a cluster of %d nodes", n)
	}
	java, err := javaPath()
	if err != nil {
		return nil, err
	}
	libs, err := Resolve(ctx, opts)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "kdedup-kafka-")
	if err != nil {
		return nil, fmt.Errorf("kafkatest: creating the cluster directory: %w", err)
	}
	c := &Cluster{dir: dir, java: java, libs: libs, opts: opts}
	if err := c.start(ctx, n); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

func (c *Cluster) start(ctx context.Context, n int) error {
	ports, err := freePorts(2 * n)
	if err != nil {
		return err
	}
	voters := make([]string, n)
	for i := range n {
		voters[i] = fmt.Sprintf("%d@127.0.0.1:%d", i+1, ports[n+i])
	}
	clusterID := newClusterID()
	g, gctx := errgroup.WithContext(ctx)
	for i := range n {
		nd := &Node{ID: int32(i + 1), Addr: fmt.Sprintf("127.0.0.1:%d", ports[i]), c: c, dir: filepath.Join(c.dir, fmt.Sprintf("node-%d", i+1))}
		c.nodes = append(c.nodes, nd)
		props := c.properties(n, nd, ports[n+i], strings.Join(voters, ","))
		g.Go(func() error { return nd.format(gctx, props, clusterID) })
	}
	if err := g.Wait(); err != nil {
		return err
	}
	for _, nd := range c.nodes {
		if err := nd.launch(); err != nil {
			return err
		}
	}
	for _, nd := range c.nodes {
		if err := nd.waitUp(ctx, n); err != nil {
			return err
		}
	}
	return nil
}

// properties is the server.properties of node nd in a cluster of n.
func (c *Cluster) properties(n int, nd *Node, controllerPort int, voters string) map[string]string {
	rf, minISR := strconv.Itoa(n), strconv.Itoa(min(n, 2))
	p := map[string]string{
		"process.roles":                                    "broker,controller",
		"node.id":                                          strconv.Itoa(int(nd.ID)),
		"controller.quorum.voters":                         voters,
		"listeners":                                        fmt.Sprintf("PLAINTEXT://%s,CONTROLLER://127.0.0.1:%d", nd.Addr, controllerPort),
		"advertised.listeners":                             "PLAINTEXT://" + nd.Addr,
		"controller.listener.names":                        "CONTROLLER",
		"inter.broker.listener.name":                       "PLAINTEXT",
		"listener.security.protocol.map":                   "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
		"log.dirs":                                         filepath.Join(nd.dir, "data"),
		"num.partitions":                                   "1",
		"default.replication.factor":                       "1",
		"auto.create.topics.enable":                        "false",
		"offsets.topic.replication.factor":                 rf,
		"offsets.topic.num.partitions":                     "10",
		"transaction.state.log.replication.factor":         rf,
		"transaction.state.log.min.isr":                    minISR,
		"transaction.state.log.num.partitions":             "10",
		"share.coordinator.state.topic.replication.factor": rf,
		"share.coordinator.state.topic.min.isr":            minISR,
		// Records are kept whatever their timestamps: tests produce records
		// stamped at fixed dates long past, which time-based retention
		// (default 7 days, first checked 30s after start-up) would delete
		// while the test runs.
		"log.retention.ms": "-1",
		// A rebalance starts as soon as a member joins; tests use session
		// timeouts of a few seconds.
		"group.initial.rebalance.delay.ms": "0",
		"group.min.session.timeout.ms":     "1000",
		// A transaction whose producer froze is aborted within a second of
		// its timeout (default: checked every 10s), so read_committed
		// readers are not held back longer than the test's timeout says.
		"transaction.abort.timed.out.transaction.cleanup.interval.ms": "1000",
		// Small thread pools and cleaner buffer for a 2-core machine and a
		// small heap (the default dedupe buffer alone is 128 MiB).
		"num.network.threads":               "2",
		"num.io.threads":                    "4",
		"background.threads":                "2",
		"num.recovery.threads.per.data.dir": "1",
		"log.cleaner.threads":               "1",
		"log.cleaner.dedupe.buffer.size":    strconv.Itoa(16 << 20),
	}
	if n > 1 {
		// A killed node is fenced, and its partitions led elsewhere,
		// after 4s instead of 9s. Not for a single node: fencing it
		// (a long pause on a loaded machine) would only stall the test.
		p["broker.heartbeat.interval.ms"] = "1000"
		p["broker.session.timeout.ms"] = "4000"
	}
	maps.Copy(p, c.opts.Properties)
	return p
}

// format writes the node's configuration and formats its KRaft storage.
func (nd *Node) format(ctx context.Context, props map[string]string, clusterID string) error {
	if err := os.MkdirAll(nd.dir, 0o755); err != nil {
		return fmt.Errorf("kafkatest: creating %s: %w", nd.dir, err)
	}
	var sp bytes.Buffer
	for _, k := range slices.Sorted(maps.Keys(props)) {
		fmt.Fprintf(&sp, "%s=%s\n", k, props[k])
	}
	if err := os.WriteFile(nd.path("server.properties"), sp.Bytes(), 0o644); err != nil {
		return fmt.Errorf("kafkatest: writing server.properties: %w", err)
	}
	// WARN and above to broker.log in the node's directory: quiet, and
	// there to read when a test fails.
	log4j := strings.Join([]string{
		"status = error",
		"appender.file.type = File",
		"appender.file.name = file",
		"appender.file.fileName = " + nd.path("broker.log"),
		"appender.file.layout.type = PatternLayout",
		"appender.file.layout.pattern = [%d] %p %m (%c)%n",
		"rootLogger.level = WARN",
		"rootLogger.appenderRef.file.ref = file",
		"",
	}, "\n")
	if err := os.WriteFile(nd.path("log4j2.properties"), []byte(log4j), 0o644); err != nil {
		return fmt.Errorf("kafkatest: writing log4j2.properties: %w", err)
	}
	cmd := exec.CommandContext(ctx, nd.c.java, append(nd.jvmArgs("256m", "-XX:TieredStopAtLevel=1"),
		"kafka.tools.StorageTool", "format", "-t", clusterID, "-c", nd.path("server.properties"))...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("kafkatest: formatting node %d's storage (%s): %w\n%s", nd.ID, cmd, err, tail(out, 4096))
	}
	return nil
}

func (nd *Node) path(name string) string { return filepath.Join(nd.dir, name) }

func (nd *Node) jvmArgs(heap string, extra ...string) []string {
	args := []string{"-Xms64m", "-Xmx" + heap, "-XX:+UseSerialGC", "-XX:+ExitOnOutOfMemoryError",
		"-Djava.awt.headless=true", "-Dlog4j2.configurationFile=" + nd.path("log4j2.properties")}
	args = append(args, extra...)
	return append(args, "-cp", filepath.Join(nd.c.libs, "*"))
}

// launch starts the node's JVM; its standard output and error go to
// jvm.log in the node's directory.
func (nd *Node) launch() error {
	nd.mu.Lock()
	defer nd.mu.Unlock()
	if nd.cmd != nil {
		return fmt.Errorf("kafkatest: node %d is already running", nd.ID)
	}
	out, err := os.OpenFile(nd.path("jvm.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("kafkatest: opening node %d's jvm.log: %w", nd.ID, err)
	}
	cmd := exec.Command(nd.c.java, append(nd.jvmArgs(nd.c.opts.heap()), "kafka.Kafka", nd.path("server.properties"))...)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		out.Close()
		return fmt.Errorf("kafkatest: starting node %d (%s): %w", nd.ID, cmd, err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		out.Close()
		close(exited)
	}()
	nd.cmd, nd.exited = cmd, exited
	return nil
}

// waitUp waits until the node answers a metadata request listing itself
// and at least want brokers.
func (nd *Node) waitUp(ctx context.Context, want int) error {
	nd.mu.Lock()
	exited := nd.exited
	nd.mu.Unlock()
	cl, err := kgo.NewClient(kgo.SeedBrokers(nd.Addr), kgo.DialTimeout(time.Second))
	if err != nil {
		return fmt.Errorf("kafkatest: a client of node %d: %w", nd.ID, err)
	}
	defer cl.Close()
	var last error
	for {
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		req := kmsg.NewPtrMetadataRequest()
		req.Topics = []kmsg.MetadataRequestTopic{}
		resp, err := req.RequestWith(rctx, cl)
		cancel()
		if err == nil {
			if len(resp.Brokers) >= want && slices.ContainsFunc(resp.Brokers, func(b kmsg.MetadataResponseBroker) bool { return b.NodeID == nd.ID }) {
				return nil
			}
			err = fmt.Errorf("metadata lists %d brokers", len(resp.Brokers))
		}
		last = err
		select {
		case <-exited:
			return fmt.Errorf("kafkatest: node %d exited while starting; its log:\n%s", nd.ID, nd.Log())
		case <-ctx.Done():
			return fmt.Errorf("kafkatest: waiting for node %d at %s to answer metadata with %d brokers (last: %v): %w; its log:\n%s",
				nd.ID, nd.Addr, want, last, ctx.Err(), nd.Log())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// Kill stops the node's JVM with SIGKILL, as a crash would, and waits for
// it to exit. Killing a stopped node does nothing.
func (nd *Node) Kill() {
	nd.mu.Lock()
	defer nd.mu.Unlock()
	if nd.cmd == nil {
		return
	}
	_ = nd.cmd.Process.Kill()
	<-nd.exited
	nd.cmd, nd.exited = nil, nil
}

// Restart starts a killed node again on its directory and ports, and
// returns once it answers metadata listing itself.
func (nd *Node) Restart(ctx context.Context) error {
	if err := nd.launch(); err != nil {
		return err
	}
	return nd.waitUp(ctx, 1)
}

// PID is the process id of the node's JVM, 0 when it is not running.
func (nd *Node) PID() int {
	nd.mu.Lock()
	defer nd.mu.Unlock()
	if nd.cmd == nil {
		return 0
	}
	return nd.cmd.Process.Pid
}

// Log returns the node's broker log (WARN and above) and the JVM's own
// output, each cut to its last 64 KiB.
func (nd *Node) Log() string {
	var b strings.Builder
	for _, name := range []string{"broker.log", "jvm.log"} {
		data, err := os.ReadFile(nd.path(name))
		if err != nil || len(data) == 0 {
			continue
		}
		fmt.Fprintf(&b, "--- node %d %s\n%s", nd.ID, name, tail(data, 64<<10))
	}
	return b.String()
}

// Addrs are the client listeners of every node.
func (c *Cluster) Addrs() []string {
	addrs := make([]string, len(c.nodes))
	for i, nd := range c.nodes {
		addrs[i] = nd.Addr
	}
	return addrs
}

// Nodes are the cluster's nodes, by node.id.
func (c *Cluster) Nodes() []*Node { return c.nodes }

// Node returns the node with the given node.id, or nil.
func (c *Cluster) Node(id int32) *Node {
	for _, nd := range c.nodes {
		if nd.ID == id {
			return nd
		}
	}
	return nil
}

// Log returns the logs of every node (see Node.Log).
func (c *Cluster) Log() string {
	var b strings.Builder
	for _, nd := range c.nodes {
		b.WriteString(nd.Log())
	}
	return b.String()
}

// Close kills every node (the data is thrown away, so there is nothing to
// shut down gracefully) and removes the cluster's directory.
func (c *Cluster) Close() error {
	for _, nd := range c.nodes {
		nd.Kill()
	}
	if err := os.RemoveAll(c.dir); err != nil {
		return fmt.Errorf("kafkatest: removing %s: %w", c.dir, err)
	}
	return nil
}

// New starts a single broker for the test (see Start), failing the test
// if it does not start. When the test has failed, the broker's log is
// written to the test log; the broker is then stopped and its directory
// removed.
func New(t testing.TB, opts Options) *Cluster { return NewCluster(t, 1, opts) }

// NewCluster is New with n nodes.
func NewCluster(t testing.TB, n int, opts Options) *Cluster {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c, err := Start(ctx, n, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("Apache Kafka's log:\n%s", c.Log())
		}
		if err := c.Close(); err != nil {
			t.Error(err)
		}
	})
	return c
}

func javaPath() (string, error) {
	if home := os.Getenv("JAVA_HOME"); home != "" {
		if p := filepath.Join(home, "bin", "java"); fileExists(p) {
			return p, nil
		}
	}
	p, err := exec.LookPath("java")
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrNoToolchain, err)
	}
	return p, nil
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// freePorts returns n distinct loopback ports that were free a moment ago.
// All are held open together so none repeats.
func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	ports := make([]int, n)
	for i := range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("kafkatest: finding a free loopback port: %w", err)
		}
		ls = append(ls, l)
		ports[i] = l.Addr().(*net.TCPAddr).Port
	}
	return ports, nil
}

// newClusterID returns a random cluster id as Kafka's Uuid.randomUuid
// makes one: 16 bytes in URL-safe base64 without padding, never starting
// with '-' (the command line would read it as an option).
func newClusterID() string {
	for {
		var b [16]byte
		_, _ = rand.Read(b[:])
		id := base64.RawURLEncoding.EncodeToString(b[:])
		if !strings.HasPrefix(id, "-") {
			return id
		}
	}
}
