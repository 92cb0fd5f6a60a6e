package perf

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	schedmetrics "k8s.io/kubernetes/pkg/scheduler/metrics"
	"sigs.k8s.io/yaml"
)

// The upstream test cases this benchmark runs, each from its file under the
// pinned k8s.io/kubernetes module's test/integration/scheduler_perf.
var upstreamCases = []upstreamCase{
	{file: "dra/performance-config.yaml", name: "SchedulingWithResourceClaimTemplate"},
	{file: "dra/consumablecapacity/performance-config.yaml", name: "ConsumableCapacity"},
}

type upstreamCase struct{ file, name string }

// upstreamDriver is the driver of the upstream DRA templates' slices and
// classes. carve's plugins follow one driver (their driverName), so in the
// carve runs of the upstream cases they are pointed at this one: with
// carve.dev they would skip every pod, and the comparison would only measure
// their PreFilter's early return.
const upstreamDriver = "test-driver.cdi.k8s.io"

// sizedWorkload matches the upstream workloads that are one cluster size of
// the plain scenario (empty, half or full cluster, or a fixed pod count),
// not the variants that add selectors, constraints or nodes without DRA.
var sizedWorkload = regexp.MustCompile(`^(empty|half|full|[0-9]+pods)_([0-9]+)nodes$`)

// Scheduler variants, in the order they run for each workload.
const (
	stock = "stock"
	carve = "carve"
)

var variants = []string{stock, carve}

// runWorkload is the name of each test case's one workload.
const runWorkload = "run"

// workload is one workload of a test case, to run under both schedulers.
type workload struct {
	Case, Name string
	Nodes      int
	// Threshold is upstream's CI minimum for the workload's throughput under
	// the "dra" topic (0: none).
	Threshold float64
	// Shares is whether the workload's claims ask for consumable capacity,
	// so that carve's plugins score them.
	Shares bool

	gates  map[string]bool
	ops    []map[string]any
	params map[string]any
	// workloadGates are the workload's own feature gates, as upstream wrote them.
	workloadGates any
	// carveConfig is the carve variant's scheduler configuration file.
	carveConfig string
}

// run is one repetition of a workload under one scheduler. The harness
// wants test case names unique and takes the scheduler's configuration per
// test case, so each run is a test case of its own, named by Key, with one
// workload, runWorkload.
type run struct {
	workload
	Scheduler string
	// Rep counts the workload's repetitions from 1.
	Rep int
}

// Key is the run's test case name: <Case>/<Workload>/<Scheduler>/<Rep>.
func (r run) Key() string { return fmt.Sprintf("%s/%s/%s/%d", r.Case, r.Name, r.Scheduler, r.Rep) }

// workloadKey is the workload's name, <Case>/<Workload>.
func (w workload) workloadKey() string { return w.Case + "/" + w.Name }

// expand makes the harness cases of repeats repetitions of workloads: each
// repetition runs every workload once under each scheduler, back to back,
// stock first in odd repetitions and carve first in even ones, so that
// neither always meets the other's leftovers (the machine's caches, its
// other load) and drift over the whole run touches both alike.
func expand(workloads []workload, repeats int) ([]harnessCase, []run) {
	var cases []harnessCase
	var runs []run
	for rep := 1; rep <= repeats; rep++ {
		order := variants
		if rep%2 == 0 {
			order = []string{carve, stock}
		}
		for _, w := range workloads {
			for _, v := range order {
				r := run{workload: w, Scheduler: v, Rep: rep}
				wl := map[string]any{"name": runWorkload, "labels": []string{perfLabel}, "params": w.params}
				if w.workloadGates != nil {
					wl["featureGates"] = w.workloadGates
				}
				hc := harnessCase{Name: r.Key(), FeatureGates: w.gates, WorkloadTemplate: w.ops, Workloads: []map[string]any{wl}}
				if v == carve {
					hc.SchedulerConfigPath = w.carveConfig
				}
				cases = append(cases, hc)
				runs = append(runs, r)
			}
		}
	}
	return cases, runs
}

// selection says which workloads run.
type selection struct {
	// Sizes are the node counts to run.
	Sizes []int
	// Match, when set, must match <Case>/<Workload>.
	Match *regexp.Regexp
}

func (s selection) wants(testCase, workload string, nodes int) bool {
	if !slices.Contains(s.Sizes, nodes) {
		return false
	}
	return s.Match == nil || s.Match.MatchString(testCase+"/"+workload)
}

// skipped is an upstream workload of a selected size that cannot run, and why.
type skipped struct{ Workload, Reason string }

// harnessCase is one test case of the harness's config file. Ops, params and
// feature gates stay as generic YAML: the harness validates them, and
// keeping them opaque here means an upstream workload runs as upstream
// wrote it.
type harnessCase struct {
	Name                string           `json:"name"`
	FeatureGates        map[string]bool  `json:"featureGates,omitempty"`
	SchedulerConfigPath string           `json:"schedulerConfigPath,omitempty"`
	WorkloadTemplate    []map[string]any `json:"workloadTemplate"`
	Workloads           []map[string]any `json:"workloads"`
	// MetricsCollectorConfig replaces the harness's default metric list,
	// which names its plugins at package initialization, too early for
	// carve's to join.
	MetricsCollectorConfig *metricsConfig `json:"metricsCollectorConfig,omitempty"`
	// Labels and the rest of an upstream case's fields are dropped: the
	// workloads here are picked by selection, not by label.
}

// metricsConfig is the harness's metricsCollectorConfig: histogram metrics
// to report, each by the label values to report apart (none: all in one).
type metricsConfig struct {
	Metrics map[string][]labelValues `json:"metrics"`
}

type labelValues struct {
	Label  string   `json:"label"`
	Values []string `json:"values"`
}

// collectedMetrics are the scheduler metrics each run reports: the time of
// each extension point, and of each plugin at each (the harness's plugins
// and carve's), attempts by result and the pods' scheduling latency.
func collectedMetrics(plugins []string) *metricsConfig {
	points := labelValues{Label: "extension_point", Values: schedmetrics.ExtensionPoints}
	return &metricsConfig{Metrics: map[string][]labelValues{
		"scheduler_framework_extension_point_duration_seconds": {points},
		"scheduler_plugin_execution_duration_seconds":          {{Label: "plugin", Values: plugins}, points},
		"scheduler_scheduling_attempt_duration_seconds": {{Label: "result", Values: []string{
			schedmetrics.ScheduledResult, schedmetrics.UnschedulableResult, schedmetrics.ErrorResult,
		}}},
		"scheduler_pod_scheduling_duration_seconds": nil,
	}}
}

// perfLabel is the label every generated workload carries: the harness's
// default -perf-scheduling-label-filter ("performance") selects it.
const perfLabel = "performance"

// loadUpstream reads test case name from the upstream config file at path
// and returns its selected workloads. Template paths become absolute (the harness reads
// them relative to its working directory, upstream's the config's own
// directory), thresholds are dropped (the table reports them instead of
// failing a run on a 2-core machine), and the carve variant gets
// carveConfig as its scheduler configuration.
func loadUpstream(path, name string, sel selection, carveConfig string) ([]workload, []skipped, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, err
	}
	var cases []map[string]any
	if err := yaml.Unmarshal(data, &cases); err != nil {
		return nil, nil, fmt.Errorf("%s: %w", path, err)
	}
	var tc map[string]any
	for _, c := range cases {
		if c["name"] == name {
			tc = c
		}
	}
	if tc == nil {
		return nil, nil, fmt.Errorf("%s: no test case %s", path, name)
	}
	ops, err := listOfMaps(tc["workloadTemplate"])
	if err != nil {
		return nil, nil, fmt.Errorf("%s %s workloadTemplate: %w", path, name, err)
	}
	dir := filepath.Dir(path)
	for _, op := range ops {
		absolutePaths(op, dir)
	}
	gates, err := featureGates(tc["featureGates"])
	if err != nil {
		return nil, nil, fmt.Errorf("%s %s: %w", path, name, err)
	}
	shares := slices.ContainsFunc(ops, func(op map[string]any) bool {
		p, _ := op["templatePath"].(string)
		return strings.Contains(p, "consumablecapacity")
	})
	needed := templateParams(ops)
	workloads, err := listOfMaps(tc["workloads"])
	if err != nil {
		return nil, nil, fmt.Errorf("%s %s workloads: %w", path, name, err)
	}
	var out []workload
	var skips []skipped
	for _, w := range workloads {
		wname, _ := w["name"].(string)
		m := sizedWorkload.FindStringSubmatch(wname)
		if m == nil {
			continue
		}
		nodes, _ := strconv.Atoi(m[2])
		if !sel.wants(name, wname, nodes) {
			continue
		}
		params, _ := w["params"].(map[string]any)
		if missing := missingParams(needed, params); len(missing) > 0 {
			skips = append(skips, skipped{Workload: name + "/" + wname, Reason: "upstream gives no " + strings.Join(missing, ", ")})
			continue
		}
		out = append(out, workload{
			Case: name, Name: wname, Nodes: nodes, Threshold: thresholdFor(w["threshold"], "dra"), Shares: shares,
			gates: gates, ops: ops, params: params, workloadGates: w["featureGates"], carveConfig: carveConfig,
		})
	}
	return out, skips, nil
}

func listOfMaps(v any) ([]map[string]any, error) {
	list, ok := v.([]any)
	if !ok {
		return nil, fmt.Errorf("not a list: %T", v)
	}
	out := make([]map[string]any, 0, len(list))
	for i, e := range list {
		m, ok := e.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("item %d: not a map: %T", i, e)
		}
		out = append(out, m)
	}
	return out, nil
}

// absolutePaths makes op's file paths (every field named *Path) absolute
// against dir.
func absolutePaths(op map[string]any, dir string) {
	for k, v := range op {
		if p, ok := v.(string); ok && strings.HasSuffix(k, "Path") && p != "" && !filepath.IsAbs(p) {
			op[k] = filepath.Join(dir, p)
		}
	}
}

func featureGates(v any) (map[string]bool, error) {
	if v == nil {
		return nil, nil
	}
	m, ok := v.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("featureGates: not a map: %T", v)
	}
	out := map[string]bool{}
	for k, b := range m {
		on, ok := b.(bool)
		if !ok {
			return nil, fmt.Errorf("featureGates %s: not a bool: %T", k, b)
		}
		out[k] = on
	}
	return out, nil
}

// paramRef is a workload parameter an op refers to: $name, or $name|default,
// which needs no value.
var paramRef = regexp.MustCompile(`^\$([A-Za-z0-9_]+)(\|.*)?$`)

// templateParams are the parameters the ops need a workload to give: those
// they name without a default.
func templateParams(ops []map[string]any) []string {
	var out []string
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case string:
			if m := paramRef.FindStringSubmatch(v); m != nil && m[2] == "" && !slices.Contains(out, m[1]) {
				out = append(out, m[1])
			}
		case map[string]any:
			for _, e := range v {
				walk(e)
			}
		case []any:
			for _, e := range v {
				walk(e)
			}
		}
	}
	for _, op := range ops {
		walk(op)
	}
	slices.Sort(out)
	return out
}

// missingParams are the needed parameters params lacks. The harness would
// fail such a workload; upstream has a few (RCT's empty_100nodes gives no
// measurePods).
func missingParams(needed []string, params map[string]any) []string {
	var out []string
	for _, n := range needed {
		if _, ok := params[n]; !ok {
			out = append(out, n)
		}
	}
	return out
}

// thresholdFor is a workload's threshold for topic: a plain number, or a map
// from topic to number, as the harness reads it.
func thresholdFor(v any, topic string) float64 {
	switch t := v.(type) {
	case float64:
		return t
	case map[string]any:
		f, _ := t[topic].(float64)
		return f
	}
	return 0
}

// carveSchedulerConfig is the carve variant's KubeSchedulerConfiguration:
// the default profile (which the stock variant runs) plus ShareFit and
// Topology at the chart's weights, following driver.
func carveSchedulerConfig(driver string) string {
	return fmt.Sprintf(`apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
profiles:
- schedulerName: default-scheduler
  plugins:
    multiPoint:
      enabled:
      - name: ShareFit
        weight: 3
      - name: Topology
        weight: 3
  pluginConfig:
  - name: ShareFit
    args:
      strategy: MostAllocated
      driverName: %[1]s
  - name: Topology
    args:
      driverName: %[1]s
`, driver)
}

// writeConfig writes the harness's config file of cases into dir.
func writeConfig(dir string, cases []harnessCase) (string, error) {
	data, err := yaml.Marshal(cases)
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, "performance-config.yaml")
	return path, os.WriteFile(path, data, 0o600)
}
