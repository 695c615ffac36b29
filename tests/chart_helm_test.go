package tests

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// helmVersion is the Helm release the chart tests and .ci/run use, built
// from source through the Go module proxy (keep the two in step).
const helmVersion = "v3.21.4"

// kubeVersion is what helm template is told the cluster runs: the version
// of the k8s.io/api types the rendered objects are decoded into.
const kubeVersion = "1.36.0"

const (
	chartDir    = "../deploy/helm/kdedup"
	releaseName = "kd"
	namespace   = "streams"
)

var (
	helmOnce sync.Once
	helmPath string
	helmErr  error
)

// helmBinary returns a helm of helmVersion's minor release, resolved once
// per test binary: $KDEDUP_HELM, a matching helm on PATH (.ci/run installs
// one into GOPATH/bin), or one go-installed into the user cache directory.
// The first build takes about two minutes on two cores.
func helmBinary(t *testing.T) string {
	t.Helper()
	helmOnce.Do(func() { helmPath, helmErr = resolveHelm() })
	if helmErr != nil {
		t.Fatalf("resolving helm %s: %v", helmVersion, helmErr)
	}
	return helmPath
}

func resolveHelm() (string, error) {
	if p := os.Getenv("KDEDUP_HELM"); p != "" {
		return p, nil
	}
	minor := helmVersion[:strings.LastIndex(helmVersion, ".")]
	matches := func(p string) bool {
		out, err := exec.Command(p, "version", "--template", "{{.Version}}").Output()
		v := string(out)
		return err == nil && (v == minor || strings.HasPrefix(v, minor+"."))
	}
	if p, err := exec.LookPath("helm"); err == nil && matches(p) {
		return p, nil
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	bin := filepath.Join(cache, "kdedup-tests", "helm@"+helmVersion)
	p := filepath.Join(bin, "helm")
	if _, err := os.Stat(p); err == nil && matches(p) {
		return p, nil
	}
	cmd := exec.Command("go", "install", "helm.sh/helm/v3/cmd/helm@"+helmVersion)
	cmd.Dir = os.TempDir() // outside this module: go install pkg@version builds with helm's go.mod
	cmd.Env = append(os.Environ(), "GOBIN="+bin, "GOFLAGS=-mod=mod", "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go install helm: %v\n%s", err, out)
	}
	if !matches(p) {
		return "", fmt.Errorf("%s does not report version %s", p, minor)
	}
	return p, nil
}

// runHelm runs helm with args and returns its standard output, or an error
// carrying its standard error.
func runHelm(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(helmBinary(t), args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("helm %s: %v: %s", strings.Join(args, " "), err, stderr.String())
	}
	return stdout.String(), nil
}

// helmTemplate renders the chart as release "kd" in namespace "streams"
// with the given values files (paths) and YAML values documents.
func helmTemplate(t *testing.T, files []string, values ...string) (string, error) {
	t.Helper()
	args := []string{"template", releaseName, chartDir, "--namespace", namespace, "--kube-version", kubeVersion}
	for _, f := range files {
		args = append(args, "--values", f)
	}
	for i, v := range values {
		p := filepath.Join(t.TempDir(), fmt.Sprintf("values-%d.yaml", i))
		if err := os.WriteFile(p, []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
		args = append(args, "--values", p)
	}
	return runHelm(t, args...)
}

// rendered is one release's manifests decoded into API types.
type rendered struct {
	statefulSets    []*appsv1.StatefulSet
	services        []*corev1.Service
	serviceAccounts []*corev1.ServiceAccount
	pdbs            []*policyv1.PodDisruptionBudget
	serviceMonitors []*monitoringv1.ServiceMonitor
	podMonitors     []*monitoringv1.PodMonitor
	rules           []*monitoringv1.PrometheusRule
	kinds           []string // "Kind/name" of every object, in order
}

// decodeStrict decodes helm's output into the Kubernetes and
// prometheus-operator API types with the API server's own strict decoder
// (sigs.k8s.io/json, case-sensitive, unlike encoding/json): YAML with
// duplicate keys, a field the type does not have (a typo, a wrong case, a
// field at the wrong level) or a value of the wrong type fails, as
// kubectl's strict field validation would; so does a kind the chart is not
// expected to render.
func decodeStrict(t *testing.T, manifests string) *rendered {
	t.Helper()
	r := &rendered{}
	for i, doc := range splitYAML(manifests) {
		js, err := yaml.YAMLToJSONStrict([]byte(doc))
		if err != nil {
			t.Fatalf("document %d: %v\n%s", i, err, doc)
		}
		if string(js) == "null" {
			continue
		}
		var meta struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
		}
		if err := json.Unmarshal(js, &meta); err != nil {
			t.Fatalf("document %d: %v", i, err)
		}
		var obj any
		switch meta.APIVersion + " " + meta.Kind {
		case "apps/v1 StatefulSet":
			o := new(appsv1.StatefulSet)
			r.statefulSets, obj = append(r.statefulSets, o), o
		case "v1 Service":
			o := new(corev1.Service)
			r.services, obj = append(r.services, o), o
		case "v1 ServiceAccount":
			o := new(corev1.ServiceAccount)
			r.serviceAccounts, obj = append(r.serviceAccounts, o), o
		case "policy/v1 PodDisruptionBudget":
			o := new(policyv1.PodDisruptionBudget)
			r.pdbs, obj = append(r.pdbs, o), o
		case "monitoring.coreos.com/v1 ServiceMonitor":
			o := new(monitoringv1.ServiceMonitor)
			r.serviceMonitors, obj = append(r.serviceMonitors, o), o
		case "monitoring.coreos.com/v1 PodMonitor":
			o := new(monitoringv1.PodMonitor)
			r.podMonitors, obj = append(r.podMonitors, o), o
		case "monitoring.coreos.com/v1 PrometheusRule":
			o := new(monitoringv1.PrometheusRule)
			r.rules, obj = append(r.rules, o), o
		default:
			t.Fatalf("document %d: unexpected %s %s\n%s", i, meta.APIVersion, meta.Kind, doc)
		}
		strict, err := kjson.UnmarshalStrict(js, obj)
		if err == nil && len(strict) > 0 {
			err = errors.Join(strict...)
		}
		if err != nil {
			t.Fatalf("document %d (%s): not a valid %s: %v\n%s", i, meta.Kind, meta.APIVersion, err, doc)
		}
		var name struct {
			Metadata struct{ Name string } `json:"metadata"`
		}
		_ = json.Unmarshal(js, &name)
		r.kinds = append(r.kinds, meta.Kind+"/"+name.Metadata.Name)
	}
	return r
}

// splitYAML splits a multi-document YAML stream at its "---" lines.
func splitYAML(s string) []string {
	var docs []string
	var cur strings.Builder
	for line := range strings.SplitSeq(s, "\n") {
		if strings.TrimRight(line, " ") == "---" {
			docs = append(docs, cur.String())
			cur.Reset()
			continue
		}
		cur.WriteString(line)
		cur.WriteByte('\n')
	}
	return append(docs, cur.String())
}

// the returns the only object of a kind, failing when there is not exactly one.
func the[T any](t *testing.T, objs []T, kind string) T {
	t.Helper()
	if len(objs) != 1 {
		t.Fatalf("rendered %d %s objects, want 1", len(objs), kind)
	}
	return objs[0]
}
