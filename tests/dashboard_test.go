package tests

import (
	"encoding/json"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"go.yaml.in/yaml/v3"
)

const (
	dashboardFile = "../deploy/grafana/kdedup.json"
	rulesFile     = "../deploy/helm/kdedup/files/prometheus-rules.yaml"
)

// metricNameRE finds the worker's metric names in a PromQL expression:
// kdedup's own and the Go and process collectors'. Series Prometheus makes
// itself (up) are not the worker's and are not checked.
var metricNameRE = regexp.MustCompile(`\b(?:kdedup|go|process)_[a-zA-Z0-9_:]*`)

// TestDashboardMetrics checks the Grafana dashboard and the alerting rules
// against what running workers export (every metricConfigs configuration,
// after they consumed their input): every metric name in a dashboard
// expression (panels and template variables) or a rule expression must be
// an exported family, a histogram's _bucket, _sum and _count standing for
// the histogram. It also checks the shape of both files: the dashboard's
// datasource, topic and partition variables and panels on the datasource
// variable; the rules as a YAML list of alerts with severity, summary and
// description.
func TestDashboardMetrics(t *testing.T) {
	dashExprs := dashboardExprs(t)
	ruleExprs := ruleExprs(t)

	exported := map[string]dto.MetricType{}
	for _, c := range metricConfigs {
		p := newPipeline(t, 2)
		c.setup(t, p)
		mfs, w := p.gatherRunning(t, c.input())
		for _, mf := range mfs {
			exported[mf.GetName()] = mf.GetType()
		}
		w.stop(t)
	}

	check := func(file string, exprs []string) {
		seen := 0
		for _, e := range exprs {
			if strings.Count(e, "(") != strings.Count(e, ")") || strings.Count(e, "{") != strings.Count(e, "}") || strings.Count(e, "[") != strings.Count(e, "]") {
				t.Errorf("%s: unbalanced brackets in %q", file, e)
			}
			for _, name := range metricNameRE.FindAllString(e, -1) {
				seen++
				if !isExported(exported, name) {
					t.Errorf("%s: %s is not exported by a running worker (in %q)", file, name, e)
				}
			}
		}
		if seen == 0 {
			t.Errorf("%s: no metric found in %d expressions", file, len(exprs))
		}
		t.Logf("%s: %d expressions, %d metric references checked", file, len(exprs), seen)
	}
	check(dashboardFile, dashExprs)
	check(rulesFile, ruleExprs)
}

func isExported(exported map[string]dto.MetricType, name string) bool {
	if _, ok := exported[name]; ok {
		return true
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, suffix); ok {
			if typ, ok := exported[base]; ok && (typ == dto.MetricType_HISTOGRAM || (suffix != "_bucket" && typ == dto.MetricType_SUMMARY)) {
				return true
			}
		}
	}
	return false
}

// dashboardExprs returns the PromQL expressions of the dashboard's panels
// (rows' nested panels included) and template variables.
func dashboardExprs(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	type target struct {
		Expr       string `json:"expr"`
		Datasource struct {
			UID string `json:"uid"`
		} `json:"datasource"`
	}
	type panel struct {
		ID         int    `json:"id"`
		Type       string `json:"type"`
		Title      string `json:"title"`
		Datasource *struct {
			Type string `json:"type"`
			UID  string `json:"uid"`
		} `json:"datasource"`
		Targets []target          `json:"targets"`
		Panels  []json.RawMessage `json:"panels"`
	}
	var dash struct {
		UID        string            `json:"uid"`
		Title      string            `json:"title"`
		Panels     []json.RawMessage `json:"panels"`
		Templating struct {
			List []struct {
				Name  string          `json:"name"`
				Type  string          `json:"type"`
				Query json.RawMessage `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	if dash.UID == "" || dash.Title == "" {
		t.Errorf("%s: no uid or title", dashboardFile)
	}
	var exprs, vars []string
	for _, v := range dash.Templating.List {
		vars = append(vars, v.Name+":"+v.Type)
		if v.Type != "query" {
			continue
		}
		var q struct {
			Query string `json:"query"`
		}
		if err := json.Unmarshal(v.Query, &q); err != nil || q.Query == "" {
			var s string
			if json.Unmarshal(v.Query, &s) != nil {
				t.Errorf("%s: variable %s has no query", dashboardFile, v.Name)
			}
			q.Query = s
		}
		exprs = append(exprs, q.Query)
	}
	for _, want := range []string{"datasource:datasource", "topic:query", "partition:query"} {
		if !slices.Contains(vars, want) {
			t.Errorf("%s: no variable %s (has %v)", dashboardFile, want, vars)
		}
	}
	ids := map[int]bool{}
	var walk func([]json.RawMessage)
	walk = func(raws []json.RawMessage) {
		for _, raw := range raws {
			var p panel
			if err := json.Unmarshal(raw, &p); err != nil {
				t.Fatalf("%s: %v", dashboardFile, err)
			}
			if ids[p.ID] {
				t.Errorf("%s: panel id %d used twice", dashboardFile, p.ID)
			}
			ids[p.ID] = true
			walk(p.Panels)
			if p.Type == "row" {
				continue
			}
			if p.Datasource == nil || p.Datasource.UID != "${datasource}" {
				t.Errorf("%s: panel %q does not use the datasource variable", dashboardFile, p.Title)
			}
			if len(p.Targets) == 0 {
				t.Errorf("%s: panel %q has no query", dashboardFile, p.Title)
			}
			for _, tg := range p.Targets {
				if tg.Expr == "" {
					t.Errorf("%s: panel %q has an empty query", dashboardFile, p.Title)
				}
				exprs = append(exprs, tg.Expr)
			}
		}
	}
	walk(dash.Panels)
	return exprs
}

// ruleExprs returns the expressions of the alerting rules, checking that
// the file is a YAML list of alerts as the chart's PrometheusRule expects.
func ruleExprs(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	var rules []struct {
		Alert       string            `yaml:"alert"`
		Expr        string            `yaml:"expr"`
		For         string            `yaml:"for"`
		Labels      map[string]string `yaml:"labels"`
		Annotations map[string]string `yaml:"annotations"`
	}
	if err := yaml.Unmarshal(b, &rules); err != nil {
		t.Fatalf("%s is not a YAML list of rules: %v", rulesFile, err)
	}
	if strings.Contains(string(b), "{{ .") || strings.Contains(string(b), "{{- ") {
		t.Errorf("%s holds Helm templating; it must be plain rules", rulesFile)
	}
	var exprs, names []string
	for _, r := range rules {
		if r.Alert == "" || strings.TrimSpace(r.Expr) == "" {
			t.Errorf("%s: a rule without alert or expr: %+v", rulesFile, r)
		}
		if slices.Contains(names, r.Alert) {
			t.Errorf("%s: alert %s twice", rulesFile, r.Alert)
		}
		names = append(names, r.Alert)
		if s := r.Labels["severity"]; s != "critical" && s != "warning" && s != "info" {
			t.Errorf("%s: alert %s has severity %q, want critical, warning or info", rulesFile, r.Alert, s)
		}
		if r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
			t.Errorf("%s: alert %s lacks a summary or description", rulesFile, r.Alert)
		}
		exprs = append(exprs, r.Expr)
	}
	t.Logf("%s: alerts %s", rulesFile, strings.Join(names, ", "))
	return exprs
}
