package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

var (
	metricName = regexp.MustCompile(`\bcarve_[a-z_]+\b`)
	byClause   = regexp.MustCompile(`by \(([^)]*)\)`)
)

// dashboardMetrics reads the chart's dashboard: every metric its queries
// use, with the labels they group or match by (instance is Prometheus's,
// not the agent's).
func dashboardMetrics(t testing.TB) map[string][]string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot(), "deploy/chart/carve/dashboards/carve.json"))
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("dashboard JSON: %v", err)
	}
	out := map[string][]string{}
	for _, p := range d.Panels {
		for _, q := range p.Targets {
			var labels []string
			for _, m := range byClause.FindAllStringSubmatch(q.Expr, -1) {
				for _, l := range strings.Split(m[1], ",") {
					if l = strings.TrimSpace(l); l != "instance" && !slices.Contains(labels, l) {
						labels = append(labels, l)
					}
				}
			}
			for _, name := range metricName.FindAllString(q.Expr, -1) {
				for _, l := range labels {
					if !slices.Contains(out[name], l) {
						out[name] = append(out[name], l)
					}
				}
				if _, ok := out[name]; !ok {
					out[name] = nil
				}
			}
		}
	}
	if len(out) == 0 {
		t.Fatal("the dashboard queries no carve metric")
	}
	return out
}

// checkDashboardMetrics checks that every metric the dashboard queries is in
// a scrape of the agent, each with every label the dashboard uses; the GPU
// share metrics only where the node has GPU shares (skip names them).
func checkDashboardMetrics(t testing.TB, scrape string, skip func(string) bool) {
	t.Helper()
	// The label names of each series, by metric, from the text format.
	series := map[string][]map[string]bool{}
	for _, line := range strings.Split(scrape, "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, rest, _ := strings.Cut(line, "{")
		labels := map[string]bool{}
		if body, _, ok := strings.Cut(rest, "}"); ok {
			for _, kv := range strings.Split(body, ",") {
				if k, _, ok := strings.Cut(kv, "="); ok {
					labels[strings.TrimSpace(k)] = true
				}
			}
		} else {
			name, _, _ = strings.Cut(line, " ")
		}
		series[name] = append(series[name], labels)
	}
	for name, labels := range dashboardMetrics(t) {
		if skip(name) {
			t.Logf("dashboard metric %s: not checked here (no such shares on this node)", name)
			continue
		}
		if len(series[name]) == 0 {
			t.Errorf("the dashboard queries %s, which the agent does not export now", name)
			continue
		}
		have := series[name][0]
		for _, l := range labels {
			if !have[l] {
				t.Errorf("the dashboard groups %s by %s, which it does not have (labels %v)", name, l, have)
			}
		}
		t.Logf("dashboard metric %s: exported, with %v", name, labels)
	}
}

// The chart ships the dashboard only when asked, as a ConfigMap with the
// sidecar's label holding the dashboard file as it is.
func TestChartGrafanaDashboard(t *testing.T) {
	for _, o := range decodeObjects(t, renderChart(t)) {
		if o.GetKind() == "ConfigMap" && strings.HasSuffix(o.GetName(), "-dashboard") {
			t.Fatalf("dashboard %s rendered by default", o.GetName())
		}
	}
	want, err := os.ReadFile(filepath.Join(repoRoot(), "deploy/chart/carve/dashboards/carve.json"))
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, o := range decodeObjects(t, renderChart(t, "grafanaDashboard.enabled=true")) {
		if o.GetKind() != "ConfigMap" || o.GetName() != "carve-dashboard" {
			continue
		}
		found = true
		if o.GetLabels()["grafana_dashboard"] != "1" {
			t.Errorf("labels %v, want grafana_dashboard: \"1\"", o.GetLabels())
		}
		data, _, _ := unstructured.NestedString(o.Object, "data", "carve.json")
		if strings.TrimSpace(data) != strings.TrimSpace(string(want)) || !json.Valid([]byte(data)) {
			t.Errorf("the ConfigMap's carve.json is not the dashboard file")
		}
	}
	if !found {
		t.Fatal("no carve-dashboard ConfigMap with grafanaDashboard.enabled=true")
	}
	t.Logf("dashboard queries: %v", dashboardMetrics(t))
}
