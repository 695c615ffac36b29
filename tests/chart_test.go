package tests

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/model"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"

	"github.com/kdedup/kdedup/config"
	"github.com/kdedup/kdedup/internal/app"
)

// The chart tests render deploy/helm/kdedup offline with helm template and
// check the manifests: decoded strictly into the Kubernetes API types,
// checked for what the API server would refuse beyond the schema (names,
// labels, selectors, references between fields), and held to what running
// kdedup in Kubernetes needs (state on a volume at the data directory,
// static membership by pod name, secrets only by reference, a hardened pod).
// Every configuration variable must reach the container when its chart
// value is set, and the rendered environment must load with config.LoadFrom.

// TestChartLint runs helm lint --strict with every values file in ci/.
func TestChartLint(t *testing.T) {
	for _, f := range ciValuesFiles(t) {
		t.Run(filepath.Base(f), func(t *testing.T) {
			if out, err := runHelm(t, "lint", "--strict", "--kube-version", kubeVersion, chartDir, "--values", f); err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
		})
	}
}

// TestChartCIValues renders every values file in ci/ and checks the
// manifests strictly, and that the environment they give the worker loads.
func TestChartCIValues(t *testing.T) {
	for _, f := range ciValuesFiles(t) {
		t.Run(filepath.Base(f), func(t *testing.T) {
			out, err := helmTemplate(t, []string{f})
			if err != nil {
				t.Fatal(err)
			}
			r := decodeStrict(t, out)
			checkManifests(t, r)
			values := readValues(t, f)
			c := workerContainer(t, r)
			loadEnv(t, c)

			env := envByName(c)
			k, _ := values["kafka"].(map[string]any)
			delivery, _ := k["delivery"].(string)
			if delivery == "exactly-once" {
				checkPodName(t, env, "KDEDUP_TRANSACTIONAL_ID", str(k["idPrefix"]))
			} else if _, ok := env["KDEDUP_TRANSACTIONAL_ID"]; ok {
				t.Errorf("KDEDUP_TRANSACTIONAL_ID set without exactly-once")
			}
			static := true
			if sm, ok := values["staticMembership"].(map[string]any); ok {
				static, _ = sm["enabled"].(bool)
			}
			if static {
				checkPodName(t, env, "KDEDUP_INSTANCE_ID", str(k["idPrefix"]))
				if got := env["KDEDUP_SESSION_TIMEOUT"].Value; got != "2m" && k["sessionTimeout"] == nil {
					t.Errorf("KDEDUP_SESSION_TIMEOUT = %q with static membership, want the chart's 2m", got)
				}
			} else {
				if _, ok := env["KDEDUP_INSTANCE_ID"]; ok {
					t.Errorf("KDEDUP_INSTANCE_ID set with staticMembership.enabled=false")
				}
				if _, ok := env["KDEDUP_SESSION_TIMEOUT"]; ok && k["sessionTimeout"] == nil {
					t.Errorf("KDEDUP_SESSION_TIMEOUT set without static membership nor kafka.sessionTimeout")
				}
			}
		})
	}
}

// allValues sets every value the chart maps to a KDEDUP_* variable.
const allValues = `
kafka:
  brokers: [b-0.kafka:9092, b-1.kafka:9092]
  inputTopics: [in-a, in-b]
  outputTopic: out
  duplicatesTopic: dropped
  deadLetterTopic: dead
  repartitionTopic: by-key
  maxRecordBytes: 2MiB
  maxDecompressBytes: 128MiB
  group: grp
  startOffset: latest
  metadataMaxAge: 15s
  sessionTimeout: 90s
  delivery: exactly-once
  transactionInterval: 250ms
  rebuild: empty
  tls:
    enabled: true
    existingSecret: kafka-tls
    caKey: ca.pem
    certKey: client.pem
    keyKey: client-key.pem
    serverName: kafka.internal
  sasl:
    mechanism: SCRAM-SHA-256
    existingSecret: kafka-user
    usernameKey: user
    passwordKey: pass
staticMembership:
  enabled: true
dedup:
  key: header:event-id
  deleteHeader: op=delete
  forwardTombstones: false
  maxOccurrences: 2
  window: 1h
  windowGenerations: 4
  windowRefresh: true
filter:
  targetFPR: 0.00001
  fingerprintBits: 20
  bucketSize: 8
  capacity: 20000000
  maxKicks: 1000
  expansion: 4
storage:
  pageBytes: 8KiB
  memoryBytes: 3GiB
  cacheBytes: 512MiB
  flushInterval: 2s
  flushBytes: 16MiB
  writeBackInterval: 3m
log:
  level: debug
  format: text
http:
  port: 9090
  pprof: true
snapshots:
  url: s3://snaps/kdedup?region=eu-west-1
  interval: 2m
  keep: 5
  existingSecret: snapshot-credentials
persistence:
  mountPath: /data/kdedup
shutdownTimeout: 100s
livenessTimeout: 4m
`

// podName marks an env entry that must carry the pod name.
const podName = "(pod name)"

// allValuesEnv is what allValues must give each variable. A variable of
// config.Config.Table missing here fails TestChartEveryVariable: give it a
// chart value, set it in allValues and add it here.
var allValuesEnv = map[string]string{
	"KDEDUP_BROKERS":              "b-0.kafka:9092,b-1.kafka:9092",
	"KDEDUP_INPUT_TOPICS":         "in-a,in-b",
	"KDEDUP_OUTPUT_TOPIC":         "out",
	"KDEDUP_DUPLICATES_TOPIC":     "dropped",
	"KDEDUP_GROUP":                "grp",
	"KDEDUP_INSTANCE_ID":          podName,
	"KDEDUP_START_OFFSET":         "latest",
	"KDEDUP_METADATA_MAX_AGE":     "15s",
	"KDEDUP_SESSION_TIMEOUT":      "90s",
	"KDEDUP_DELIVERY":             "exactly-once",
	"KDEDUP_TRANSACTIONAL_ID":     podName,
	"KDEDUP_TRANSACTION_INTERVAL": "250ms",
	"KDEDUP_REBUILD":              "empty",
	"KDEDUP_KEY":                  "header:event-id",
	"KDEDUP_DELETE_HEADER":        "op=delete",
	"KDEDUP_FORWARD_TOMBSTONES":   "false",
	"KDEDUP_MAX_OCCURRENCES":      "2",
	"KDEDUP_WINDOW":               "1h",
	"KDEDUP_WINDOW_GENERATIONS":   "4",
	"KDEDUP_WINDOW_REFRESH":       "true",
	"KDEDUP_TLS_ENABLED":          "true",
	"KDEDUP_TLS_CA_FILE":          "/etc/kdedup/tls/ca.pem",
	"KDEDUP_TLS_CERT_FILE":        "/etc/kdedup/tls/client.pem",
	"KDEDUP_TLS_KEY_FILE":         "/etc/kdedup/tls/client-key.pem",
	"KDEDUP_TLS_SERVER_NAME":      "kafka.internal",
	"KDEDUP_SASL_MECHANISM":       "SCRAM-SHA-256",
	"KDEDUP_SASL_USERNAME":        "(secret kafka-user/user)",
	"KDEDUP_SASL_PASSWORD_FILE":   "/etc/kdedup/sasl/pass",
	"KDEDUP_TARGET_FPR":           "1e-05",
	"KDEDUP_FINGERPRINT_BITS":     "20",
	"KDEDUP_BUCKET_SIZE":          "8",
	"KDEDUP_CAPACITY":             "20000000",
	"KDEDUP_MAX_KICKS":            "1000",
	"KDEDUP_EXPANSION":            "4",
	"KDEDUP_DATA_DIR":             "/data/kdedup",
	"KDEDUP_PAGE_BYTES":           "8KiB",
	"KDEDUP_MEMORY_BYTES":         "3GiB",
	"KDEDUP_CACHE_BYTES":          "512MiB",
	"KDEDUP_FLUSH_INTERVAL":       "2s",
	"KDEDUP_FLUSH_BYTES":          "16MiB",
	"KDEDUP_WRITE_BACK_INTERVAL":  "3m",
	"KDEDUP_HTTP_ADDR":            ":9090",
	"KDEDUP_PPROF":                "true",
	"KDEDUP_SNAPSHOT_URL":         "s3://snaps/kdedup?region=eu-west-1",
	"KDEDUP_SNAPSHOT_INTERVAL":    "2m",
	"KDEDUP_SNAPSHOT_KEEP":        "5",
	"KDEDUP_LOG_LEVEL":            "debug",
	"KDEDUP_LOG_FORMAT":           "text",
	"KDEDUP_SHUTDOWN_TIMEOUT":     "100s",
	"KDEDUP_LIVENESS_TIMEOUT":     "4m",
	"KDEDUP_DEAD_LETTER_TOPIC":    "dead",
	"KDEDUP_REPARTITION_TOPIC":    "by-key",
	"KDEDUP_MAX_RECORD_BYTES":     "2MiB",
	"KDEDUP_MAX_DECOMPRESS_BYTES": "128MiB",
}

// notInEnv are the variables the chart never sets, and why.
var notInEnv = map[string]string{
	"KDEDUP_SASL_PASSWORD": "the password comes from kafka.sasl.existingSecret as a mounted file (KDEDUP_SASL_PASSWORD_FILE), never through the environment",
}

// TestChartEveryVariable sets every chart value and checks that each
// variable of config.Config.Table reaches the worker's env with the value
// expected, and that the worker's configuration loads from it.
func TestChartEveryVariable(t *testing.T) {
	out, err := helmTemplate(t, nil, allValues)
	if err != nil {
		t.Fatal(err)
	}
	r := decodeStrict(t, out)
	checkManifests(t, r)
	c := workerContainer(t, r)
	env := envByName(c)

	for _, row := range (config.Config{}).Table() {
		name := row[0]
		if why, ok := notInEnv[name]; ok {
			if _, set := env[name]; set {
				t.Errorf("%s is in the env; the chart must not set it: %s", name, why)
			}
			continue
		}
		want, ok := allValuesEnv[name]
		if !ok {
			t.Errorf("%s (%s) has no chart value: add one to values.yaml, values.schema.json and the env of templates/_helpers.tpl, and set it in allValues", name, row[2])
			continue
		}
		e, set := env[name]
		switch {
		case !set:
			t.Errorf("%s: not in the env", name)
		case want == podName:
			checkPodName(t, env, name, "")
		case strings.HasPrefix(want, "(secret "):
			ref := e.ValueFrom
			if ref == nil || ref.SecretKeyRef == nil {
				t.Errorf("%s: want %s, got %+v", name, want, e)
			} else if got := "(secret " + ref.SecretKeyRef.Name + "/" + ref.SecretKeyRef.Key + ")"; got != want {
				t.Errorf("%s from %s, want %s", name, got, want)
			}
		case e.Value != want || e.ValueFrom != nil:
			t.Errorf("%s = %q (valueFrom %v), want %q", name, e.Value, e.ValueFrom, want)
		}
	}
	for name := range env {
		if strings.HasPrefix(name, config.Prefix) && !slices.ContainsFunc((config.Config{}).Table(), func(r [3]string) bool { return r[0] == name }) {
			t.Errorf("env sets %s, which kdedup does not read", name)
		}
	}

	if !slices.ContainsFunc(c.EnvFrom, func(e corev1.EnvFromSource) bool {
		return e.SecretRef != nil && e.SecretRef.Name == "snapshot-credentials"
	}) {
		t.Errorf("envFrom %+v lacks snapshots.existingSecret", c.EnvFrom)
	}

	cfg := loadEnv(t, c)
	if cfg.Capacity != 20_000_000 || cfg.TargetFPR != 1e-5 || cfg.SessionTimeout != 90*time.Second || cfg.InstanceID != "kd-kdedup-0" || cfg.SASLUsername != "user-from-secret" {
		t.Errorf("loaded config %+v", cfg)
	}
	if got := pod(t, r).TerminationGracePeriodSeconds; got == nil || *got != 90+2+30+30 {
		t.Errorf("terminationGracePeriodSeconds = %v, want session timeout + flush interval + 30s + 30s for the last snapshots = 152", got)
	}
}

// TestChartIDPrefix checks that kafka.idPrefix prefixes the pod name in
// both member ids, through $(POD_NAME) declared before them.
func TestChartIDPrefix(t *testing.T) {
	out, err := helmTemplate(t, []string{ciFile("default-values.yaml")}, "kafka: {idPrefix: team-a., delivery: exactly-once}\n")
	if err != nil {
		t.Fatal(err)
	}
	r := decodeStrict(t, out)
	c := workerContainer(t, r)
	env := envByName(c)
	checkPodName(t, env, "KDEDUP_INSTANCE_ID", "team-a.")
	checkPodName(t, env, "KDEDUP_TRANSACTIONAL_ID", "team-a.")
	if cfg := loadEnv(t, c); cfg.InstanceID != "team-a.kd-kdedup-0" || cfg.TransactionalID != "team-a.kd-kdedup-0" {
		t.Errorf("instance id %q, transactional id %q", cfg.InstanceID, cfg.TransactionalID)
	}
}

// TestChartMemoryFromTheLimit: with the default values the chart sets only
// the container's memory (3Gi, request = limit) and no variable derived
// from it; the worker's budget is then 90% of it, whose page cache is
// the "about 625MiB" values.yaml promises (within 5%).
func TestChartMemoryFromTheLimit(t *testing.T) {
	out, err := helmTemplate(t, []string{ciFile("default-values.yaml")}, "")
	if err != nil {
		t.Fatal(err)
	}
	c := workerContainer(t, decodeStrict(t, out))
	env := envByName(c)
	for _, name := range []string{"GOMEMLIMIT", "KDEDUP_MEMORY_BYTES", "KDEDUP_CACHE_BYTES"} {
		if e, ok := env[name]; ok {
			t.Errorf("%s=%q with the default values: the worker derives it from the memory limit", name, e.Value)
		}
	}
	limit := c.Resources.Limits[corev1.ResourceMemory]
	if limit.Value() != 3<<30 {
		t.Fatalf("memory limit %s, want the documented 3Gi", limit.String())
	}
	cfg := loadEnv(t, c)
	s, _, err := app.MemoryBudget(cfg, func() (uint64, error) { return uint64(limit.Value()), nil })
	if err != nil {
		t.Fatal(err)
	}
	if want := int64(1400 << 20); s.Cache < want*95/100 || s.Cache > want*105/100 {
		t.Errorf("page cache %d MiB under the default 3Gi limit; values.yaml says about 1400MiB", s.Cache>>20)
	}
}

// TestChartRefusesBadValues checks that the schema rejects unknown keys at
// every level and wrong types, and that the templates refuse combinations
// the schema cannot express, each with a message naming the value.
func TestChartRefusesBadValues(t *testing.T) {
	defaults := []string{ciFile("default-values.yaml")}
	for _, tc := range []struct {
		name, values, want string
	}{
		{"unknown top-level key", "replicas: 3\n", "additional properties 'replicas' not allowed"},
		{"unknown nested key", "kafka: {tls: {enable: true}}\n", "additional properties 'enable' not allowed"},
		{"unknown key in a filter value", "filter: {fpr: 0.01}\n", "additional properties 'fpr' not allowed"},
		{"unknown key in securityContext", "securityContext: {runAsUSer: 0}\n", "additional properties 'runAsUSer' not allowed"},
		{"wrong type", "replicaCount: three\n", "replicaCount"},
		{"bad delivery", "kafka: {delivery: exactly_once}\n", "delivery"},
		{"bad duration", "kafka: {sessionTimeout: 2 minutes}\n", "sessionTimeout"},
		{"inline password", "kafka: {sasl: {password: hunter2}}\n", "additional properties 'password' not allowed"},
		{"no brokers", "kafka: {brokers: []}\n", "kafka.brokers is required"},
		{"sasl without secret", "kafka: {sasl: {mechanism: PLAIN, username: u}}\n", "kafka.sasl.existingSecret"},
		{"client cert without key", "kafka: {tls: {enabled: true, existingSecret: s, certKey: tls.crt}}\n", "kafka.tls.keyKey"},
		{"tls secret without tls", "kafka: {tls: {existingSecret: s}}\n", "kafka.tls.enabled"},
		{"bad memory limit", "resources: {limits: {memory: 2 gigs}}\n", "resources.limits.memory"},
		{"shutdown timeout over the grace period", "terminationGracePeriodSeconds: 60\nshutdownTimeout: 1m\n", "must be under terminationGracePeriodSeconds"},
		{"bad liveness timeout", "livenessTimeout: soon\n", "livenessTimeout"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := helmTemplate(t, defaults, tc.values)
			if err == nil {
				t.Fatalf("rendered with %q", tc.values)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error does not mention %q: %v", tc.want, err)
			}
		})
	}
}

// TestChartSchemaClosed checks that every object the values schema declares
// is closed: additionalProperties false, or a schema for the values of a
// free-form map (labels, annotations, resources).
func TestChartSchemaClosed(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(chartDir, "values.schema.json"))
	if err != nil {
		t.Fatal(err)
	}
	var schema any
	if err := json.Unmarshal(raw, &schema); err != nil {
		t.Fatal(err)
	}
	var walk func(node any, path string)
	walk = func(node any, path string) {
		switch n := node.(type) {
		case map[string]any:
			isObject := n["type"] == "object"
			if ts, ok := n["type"].([]any); ok {
				isObject = slices.Contains(ts, any("object"))
			}
			if isObject {
				switch ap := n["additionalProperties"].(type) {
				case bool:
					if ap {
						t.Errorf("%s: additionalProperties true", path)
					}
				case map[string]any:
				default:
					t.Errorf("%s: object without additionalProperties", path)
				}
			}
			for k, v := range n {
				walk(v, path+"/"+k)
			}
		case []any:
			for _, v := range n {
				walk(v, path+"[]")
			}
		}
	}
	walk(schema, "#")

	// Every key of values.yaml is in the schema (the schema validates
	// values.yaml itself, so this is what helm lint checks too), and every
	// property of the schema's top level is in values.yaml, so that none is
	// undocumented.
	var values map[string]any
	raw, err = os.ReadFile(filepath.Join(chartDir, "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(raw, &values); err != nil {
		t.Fatal(err)
	}
	props := schema.(map[string]any)["properties"].(map[string]any)
	for k := range props {
		if _, ok := values[k]; !ok && k != "global" {
			t.Errorf("schema property %s is not in values.yaml", k)
		}
	}
}

// checkManifests holds a release's manifests to what the API server
// validates beyond the types and to the chart's invariants.
func checkManifests(t *testing.T, r *rendered) {
	t.Helper()
	sts := the(t, r.statefulSets, "StatefulSet")
	for _, meta := range allMeta(r) {
		checkMeta(t, meta)
	}
	p := &sts.Spec.Template.Spec
	podLabels := labels.Set(sts.Spec.Template.Labels)

	// The selector selects the pod template (the API server refuses it
	// otherwise) and so do the PDB, the Services and the monitors.
	sel, err := metav1.LabelSelectorAsSelector(sts.Spec.Selector)
	if err != nil || !sel.Matches(podLabels) {
		t.Errorf("StatefulSet selector %v does not select its pods %v (%v)", sts.Spec.Selector, podLabels, err)
	}
	for _, pdb := range r.pdbs {
		sel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
		if err != nil || !sel.Matches(podLabels) {
			t.Errorf("PodDisruptionBudget selector does not select the pods")
		}
		if (pdb.Spec.MinAvailable == nil) == (pdb.Spec.MaxUnavailable == nil) {
			t.Errorf("PodDisruptionBudget needs exactly one of minAvailable and maxUnavailable")
		}
	}
	if len(r.pdbs) != 1 {
		t.Errorf("%d PodDisruptionBudgets, want 1 by default", len(r.pdbs))
	}

	// The governing Service exists and is headless.
	var governing bool
	ports := map[string]int32{}
	c := workerContainer(t, r)
	for _, cp := range c.Ports {
		if errs := validation.IsValidPortName(cp.Name); len(errs) > 0 {
			t.Errorf("container port name %q: %v", cp.Name, errs)
		}
		ports[cp.Name] = cp.ContainerPort
	}
	for _, svc := range r.services {
		if errs := validation.IsDNS1035Label(svc.Name); len(errs) > 0 {
			t.Errorf("Service name %q: %v", svc.Name, errs)
		}
		if !labels.SelectorFromSet(svc.Spec.Selector).Matches(podLabels) {
			t.Errorf("Service %s does not select the pods", svc.Name)
		}
		for _, sp := range svc.Spec.Ports {
			if _, ok := ports[sp.TargetPort.String()]; !ok {
				t.Errorf("Service %s targets port %s, which the container does not name", svc.Name, sp.TargetPort.String())
			}
		}
		if svc.Name == sts.Spec.ServiceName {
			governing = svc.Spec.ClusterIP == corev1.ClusterIPNone
		}
	}
	if !governing {
		t.Errorf("no headless Service %s for the StatefulSet", sts.Spec.ServiceName)
	}
	for _, sm := range r.serviceMonitors {
		sel, err := metav1.LabelSelectorAsSelector(&sm.Spec.Selector)
		var n int
		for _, svc := range r.services {
			if err == nil && sel.Matches(labels.Set(svc.Labels)) {
				n++
				for _, ep := range sm.Spec.Endpoints {
					if !slices.ContainsFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool { return p.Name == ep.Port }) {
						t.Errorf("ServiceMonitor port %q is not a port of Service %s", ep.Port, svc.Name)
					}
				}
			}
		}
		if n != 1 {
			t.Errorf("ServiceMonitor selects %d Services, want the metrics Service only", n)
		}
	}
	for _, pm := range r.podMonitors {
		sel, err := metav1.LabelSelectorAsSelector(&pm.Spec.Selector)
		if err != nil || !sel.Matches(podLabels) {
			t.Errorf("PodMonitor does not select the pods")
		}
		for _, ep := range pm.Spec.PodMetricsEndpoints {
			if _, ok := ports[ptrValue(ep.Port)]; !ok {
				t.Errorf("PodMonitor port %q is not a container port", ptrValue(ep.Port))
			}
		}
	}
	for _, pr := range r.rules {
		for _, g := range pr.Spec.Groups {
			if len(g.Rules) == 0 {
				t.Errorf("PrometheusRule group %s has no rules", g.Name)
			}
			for _, rule := range g.Rules {
				if (rule.Alert == "") == (rule.Record == "") || rule.Expr.String() == "" {
					t.Errorf("rule %+v: needs expr and exactly one of alert and record", rule)
				}
				if rule.For != nil {
					if _, err := model.ParseDuration(string(*rule.For)); err != nil {
						t.Errorf("rule %s: for %q: %v", rule.Alert, *rule.For, err)
					}
				}
			}
		}
	}

	// State: one ReadWriteOnce claim per pod, mounted at KDEDUP_DATA_DIR.
	env := envByName(c)
	dataDir := env["KDEDUP_DATA_DIR"].Value
	if !filepath.IsAbs(dataDir) {
		t.Errorf("KDEDUP_DATA_DIR = %q, want an absolute path", dataDir)
	}
	var dataMount string
	for _, m := range c.VolumeMounts {
		if m.MountPath == dataDir {
			dataMount = m.Name
		}
	}
	if dataMount == "" {
		t.Errorf("nothing mounted at KDEDUP_DATA_DIR %s", dataDir)
	}
	if len(sts.Spec.VolumeClaimTemplates) != 1 || sts.Spec.VolumeClaimTemplates[0].Name != dataMount {
		t.Errorf("want one volumeClaimTemplate named %q, mounted at the data dir", dataMount)
	} else {
		pvc := sts.Spec.VolumeClaimTemplates[0]
		if !slices.Equal(pvc.Spec.AccessModes, []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}) {
			t.Errorf("claim access modes %v, want ReadWriteOnce", pvc.Spec.AccessModes)
		}
		if q := pvc.Spec.Resources.Requests[corev1.ResourceStorage]; q.IsZero() {
			t.Errorf("claim requests no storage")
		}
	}
	if sts.Spec.PodManagementPolicy != "Parallel" || sts.Spec.PersistentVolumeClaimRetentionPolicy == nil || sts.Spec.UpdateStrategy.Type != "RollingUpdate" {
		t.Errorf("podManagementPolicy %q, PVC retention %v, update strategy %q", sts.Spec.PodManagementPolicy, sts.Spec.PersistentVolumeClaimRetentionPolicy, sts.Spec.UpdateStrategy.Type)
	}

	// Volumes: every mount names a volume or a claim template; secrets are
	// referenced, never rendered.
	volumes := map[string]corev1.Volume{}
	for _, v := range p.Volumes {
		if errs := validation.IsDNS1123Label(v.Name); len(errs) > 0 {
			t.Errorf("volume name %q: %v", v.Name, errs)
		}
		volumes[v.Name] = v
	}
	checkUnique(t, "volume", p.Volumes, func(v corev1.Volume) string { return v.Name })
	checkUnique(t, "mount path", c.VolumeMounts, func(m corev1.VolumeMount) string { return m.MountPath })
	checkUnique(t, "env variable", c.Env, func(e corev1.EnvVar) string { return e.Name })
	for _, m := range c.VolumeMounts {
		_, isVolume := volumes[m.Name]
		isClaim := slices.ContainsFunc(sts.Spec.VolumeClaimTemplates, func(pvc corev1.PersistentVolumeClaim) bool { return pvc.Name == m.Name })
		if !isVolume && !isClaim {
			t.Errorf("mount %s names no volume", m.Name)
		}
		if v := volumes[m.Name]; v.Secret != nil && !m.ReadOnly {
			t.Errorf("secret volume %s mounted writable", m.Name)
		}
	}
	for _, e := range c.Env {
		if errs := validation.IsEnvVarName(e.Name); len(errs) > 0 {
			t.Errorf("env name %q: %v", e.Name, errs)
		}
		if e.Value != "" && e.ValueFrom != nil {
			t.Errorf("env %s has both value and valueFrom", e.Name)
		}
		if strings.Contains(e.Name, "PASSWORD") && !strings.HasSuffix(e.Name, "_FILE") {
			t.Errorf("env %s carries a password", e.Name)
		}
	}
	for _, k := range r.kinds {
		if strings.HasPrefix(k, "Secret/") || strings.HasPrefix(k, "ConfigMap/") {
			t.Errorf("chart renders %s; credentials must come from existing Secrets", k)
		}
	}
	checkFileEnv(t, env, volumes, c.VolumeMounts)

	checkSecurity(t, p, c)
	checkProbes(t, c, ports)
	checkGrace(t, p, env)
	checkMemory(t, c, env)
}

// checkFileEnv checks that each *_FILE variable names a file of a mounted
// Secret volume, under the key the Secret is asked for.
func checkFileEnv(t *testing.T, env map[string]corev1.EnvVar, volumes map[string]corev1.Volume, mounts []corev1.VolumeMount) {
	t.Helper()
	for name, e := range env {
		if !strings.HasSuffix(name, "_FILE") || !strings.HasPrefix(name, config.Prefix) {
			continue
		}
		var found bool
		for _, m := range mounts {
			rel, err := filepath.Rel(m.MountPath, e.Value)
			if err != nil || strings.HasPrefix(rel, "..") {
				continue
			}
			v := volumes[m.Name]
			if v.Secret == nil {
				t.Errorf("%s=%s is not in a Secret volume", name, e.Value)
				continue
			}
			found = slices.ContainsFunc(v.Secret.Items, func(k corev1.KeyToPath) bool { return k.Path == rel })
		}
		if !found {
			t.Errorf("%s=%s: no Secret key mounted there", name, e.Value)
		}
	}
}

// checkSecurity holds the pod to the restricted Pod Security Standard and
// to the distroless nonroot image's user.
func checkSecurity(t *testing.T, p *corev1.PodSpec, c *corev1.Container) {
	t.Helper()
	psc := p.SecurityContext
	if psc == nil || !ptrValue(psc.RunAsNonRoot) || ptrValue(psc.RunAsUser) != imageUID || ptrValue(psc.RunAsGroup) != imageUID ||
		ptrValue(psc.FSGroup) != imageUID || psc.FSGroupChangePolicy == nil || *psc.FSGroupChangePolicy != corev1.FSGroupChangeOnRootMismatch ||
		psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("pod securityContext %+v", psc)
	}
	sc := c.SecurityContext
	if sc == nil || !ptrValue(sc.RunAsNonRoot) || ptrValue(sc.RunAsUser) != imageUID || ptrValue(sc.RunAsGroup) != imageUID ||
		!ptrValue(sc.ReadOnlyRootFilesystem) || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
		sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) > 0 ||
		sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("container securityContext %+v", sc)
	}
	var tmp bool
	for _, m := range c.VolumeMounts {
		if m.MountPath == "/tmp" {
			for _, v := range p.Volumes {
				tmp = tmp || v.Name == m.Name && v.EmptyDir != nil
			}
		}
	}
	if !tmp {
		t.Errorf("no emptyDir at /tmp under the read-only root filesystem")
	}
	if p.AutomountServiceAccountToken == nil || *p.AutomountServiceAccountToken {
		t.Errorf("service account token mounted; the worker calls no Kubernetes API")
	}
}

func checkProbes(t *testing.T, c *corev1.Container, ports map[string]int32) {
	t.Helper()
	for _, pr := range []struct {
		name  string
		probe *corev1.Probe
		path  string
	}{{"liveness", c.LivenessProbe, "/healthz"}, {"readiness", c.ReadinessProbe, "/readyz"}, {"startup", c.StartupProbe, "/healthz"}} {
		if pr.probe == nil || pr.probe.HTTPGet == nil {
			t.Errorf("no HTTP %s probe", pr.name)
			continue
		}
		if pr.probe.HTTPGet.Path != pr.path {
			t.Errorf("%s probe on %s, want %s", pr.name, pr.probe.HTTPGet.Path, pr.path)
		}
		if _, ok := ports[pr.probe.HTTPGet.Port.String()]; !ok {
			t.Errorf("%s probe on port %s, which the container does not name", pr.name, pr.probe.HTTPGet.Port.String())
		}
	}
	if sp := c.StartupProbe; sp != nil && time.Duration(sp.PeriodSeconds*sp.FailureThreshold)*time.Second < 5*time.Minute {
		t.Errorf("startup probe allows %ds, want at least 5 minutes for Badger to open after a crash", sp.PeriodSeconds*sp.FailureThreshold)
	}
	env := envByName(c)
	if want := ":" + strconv.Itoa(int(ports["http"])); env["KDEDUP_HTTP_ADDR"].Value != want {
		t.Errorf("KDEDUP_HTTP_ADDR = %q, want %q (the http port)", env["KDEDUP_HTTP_ADDR"].Value, want)
	}
}

// checkGrace checks that SIGKILL cannot come before the worker has had the
// session timeout and a flush interval to commit its partitions.
func checkGrace(t *testing.T, p *corev1.PodSpec, env map[string]corev1.EnvVar) {
	t.Helper()
	session, flush := 45*time.Second, time.Second // the worker's defaults
	if v := env["KDEDUP_SESSION_TIMEOUT"].Value; v != "" {
		session = mustDuration(t, v)
	}
	if v := env["KDEDUP_FLUSH_INTERVAL"].Value; v != "" {
		flush = mustDuration(t, v)
	}
	if p.TerminationGracePeriodSeconds == nil || time.Duration(*p.TerminationGracePeriodSeconds)*time.Second <= session+flush {
		t.Errorf("terminationGracePeriodSeconds %v, want more than session timeout %v + flush interval %v", p.TerminationGracePeriodSeconds, session, flush)
		return
	}
	// A stop that hangs must end with the worker's own error (exit 1,
	// naming what it waited for), not the kubelet's SIGKILL.
	shutdown := 70 * time.Second // the worker's default
	if v := env["KDEDUP_SHUTDOWN_TIMEOUT"].Value; v != "" {
		shutdown = mustDuration(t, v)
	}
	if grace := time.Duration(*p.TerminationGracePeriodSeconds) * time.Second; shutdown >= grace || shutdown < grace/2 {
		t.Errorf("KDEDUP_SHUTDOWN_TIMEOUT %v against terminationGracePeriodSeconds %v: want a little under it", shutdown, grace)
	}
	if p.EnableServiceLinks == nil || *p.EnableServiceLinks {
		t.Errorf("service links enabled: Services named kdedup-* would put KDEDUP_* variables the worker does not know in its env")
	}
}

// checkMemory: the container has a memory limit, its request equals it
// (the worker's budget is 90% of the limit, used, not a peak), and the
// chart derives nothing from it: no GOMEMLIMIT, KDEDUP_MEMORY_BYTES or
// KDEDUP_CACHE_BYTES unless the values ask, since the worker reads the
// limit from its cgroup (internal/budget).
func checkMemory(t *testing.T, c *corev1.Container, env map[string]corev1.EnvVar) {
	t.Helper()
	limit, ok := c.Resources.Limits[corev1.ResourceMemory]
	if !ok {
		t.Errorf("no memory limit")
		return
	}
	if req, ok := c.Resources.Requests[corev1.ResourceMemory]; ok && req.Cmp(limit) != 0 {
		t.Errorf("memory request %s, limit %s: the worker's budget is a share of the limit, so request it", req.String(), limit.String())
	}
	if e, ok := env["GOMEMLIMIT"]; ok {
		t.Errorf("GOMEMLIMIT=%q set by the chart: the worker derives it from the memory limit", e.Value)
	}
}

// checkMeta applies the API server's rules for names and labels.
func checkMeta(t *testing.T, m metav1.ObjectMeta) {
	t.Helper()
	if errs := validation.IsDNS1123Subdomain(m.Name); len(errs) > 0 {
		t.Errorf("name %q: %v", m.Name, errs)
	}
	if m.Namespace != namespace {
		t.Errorf("%s: namespace %q, want the release's %q", m.Name, m.Namespace, namespace)
	}
	for k, v := range m.Labels {
		if errs := append(validation.IsQualifiedName(k), validation.IsValidLabelValue(v)...); len(errs) > 0 {
			t.Errorf("%s: label %s=%s: %v", m.Name, k, v, errs)
		}
	}
	for k := range m.Annotations {
		if errs := validation.IsQualifiedName(k); len(errs) > 0 {
			t.Errorf("%s: annotation %s: %v", m.Name, k, errs)
		}
	}
}

func allMeta(r *rendered) []metav1.ObjectMeta {
	var ms []metav1.ObjectMeta
	for _, o := range r.statefulSets {
		ms = append(ms, o.ObjectMeta, o.Spec.Template.ObjectMeta)
	}
	for _, o := range r.services {
		ms = append(ms, o.ObjectMeta)
	}
	for _, o := range r.serviceAccounts {
		ms = append(ms, o.ObjectMeta)
	}
	for _, o := range r.pdbs {
		ms = append(ms, o.ObjectMeta)
	}
	for _, o := range r.serviceMonitors {
		ms = append(ms, o.ObjectMeta)
	}
	for _, o := range r.podMonitors {
		ms = append(ms, o.ObjectMeta)
	}
	for _, o := range r.rules {
		ms = append(ms, o.ObjectMeta)
	}
	// The pod template has no name nor namespace of its own.
	ms[1].Name, ms[1].Namespace = "template", namespace
	return ms
}

// checkPodName checks that variable name carries prefix + the pod name:
// from the downward API, or through $(POD_NAME) declared earlier from it.
func checkPodName(t *testing.T, env map[string]corev1.EnvVar, name, prefix string) {
	t.Helper()
	e, ok := env[name]
	fromPod := func(e corev1.EnvVar) bool {
		return e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.name"
	}
	switch {
	case !ok:
		t.Errorf("%s: not in the env", name)
	case prefix == "" && fromPod(e):
	case e.Value == prefix+"$(POD_NAME)" && fromPod(env["POD_NAME"]) && env["POD_NAME"].Value == "":
	default:
		t.Errorf("%s = %+v, want %s + the pod name", name, e, prefix)
	}
}

// loadEnv resolves the container's env as the kubelet would for pod
// kd-kdedup-0 (secret keys read "user-from-secret"; the password file is a
// temporary file) and loads it with config.LoadFrom, as the worker does.
func loadEnv(t *testing.T, c *corev1.Container) config.Config {
	t.Helper()
	const pod = releaseName + "-kdedup-0"
	environ := map[string]string{}
	for _, e := range c.Env {
		v := e.Value
		switch {
		case e.ValueFrom != nil && e.ValueFrom.FieldRef != nil:
			v = pod
		case e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil:
			v = "user-from-secret"
		case e.ValueFrom != nil:
			t.Errorf("env %s: unexpected valueFrom %+v", e.Name, e.ValueFrom)
		}
		environ[e.Name] = strings.ReplaceAll(v, "$(POD_NAME)", environ["POD_NAME"])
	}
	if _, ok := environ["KDEDUP_SASL_PASSWORD_FILE"]; ok {
		p := filepath.Join(t.TempDir(), "password")
		if err := os.WriteFile(p, []byte("secret\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		environ["KDEDUP_SASL_PASSWORD_FILE"] = p
	}
	cfg, err := config.LoadFrom(environ)
	if err != nil {
		t.Fatalf("the worker refuses the chart's env: %v\nenv: %v", err, environ)
	}
	return cfg
}

func workerContainer(t *testing.T, r *rendered) *corev1.Container {
	t.Helper()
	p := pod(t, r)
	for i := range p.Containers {
		if p.Containers[i].Name == "kdedup" {
			return &p.Containers[i]
		}
	}
	t.Fatalf("no container named kdedup")
	return nil
}

func pod(t *testing.T, r *rendered) *corev1.PodSpec {
	t.Helper()
	return &the(t, r.statefulSets, "StatefulSet").Spec.Template.Spec
}

func envByName(c *corev1.Container) map[string]corev1.EnvVar {
	m := make(map[string]corev1.EnvVar, len(c.Env))
	for _, e := range c.Env {
		m[e.Name] = e
	}
	return m
}

func ciValuesFiles(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(chartDir, "ci", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no values files in %s/ci: %v", chartDir, err)
	}
	return files
}

func ciFile(name string) string { return filepath.Join(chartDir, "ci", name) }

func readValues(t *testing.T, path string) map[string]any {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var v map[string]any
	if err := yaml.Unmarshal(raw, &v); err != nil {
		t.Fatal(err)
	}
	return v
}

func mustDuration(t *testing.T, s string) time.Duration {
	t.Helper()
	d, err := time.ParseDuration(s)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func str(v any) string {
	s, _ := v.(string)
	return s
}

func ptrValue[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

// checkUnique fails on two items with the same key, which the API server
// refuses (volumes, mount paths) or resolves silently to the last one (env).
func checkUnique[T any](t *testing.T, what string, items []T, key func(T) string) {
	t.Helper()
	seen := map[string]bool{}
	for _, it := range items {
		k := key(it)
		if seen[k] {
			t.Errorf("%s %q appears twice", what, k)
		}
		seen[k] = true
	}
}
