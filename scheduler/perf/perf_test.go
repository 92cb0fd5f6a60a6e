// Package perf runs the upstream scheduler_perf harness, from the pinned
// k8s.io/kubernetes module, on DRA workloads with the stock plugin set and
// with carve's plugins enabled, and writes a table of the two side by side.
// BenchmarkSchedulerPerf skips unless CARVE_SCHEDULER_PERF is set (`make
// scheduler-perf` sets it); the harness needs etcd in PATH.
package perf

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	frameworkruntime "k8s.io/kubernetes/pkg/scheduler/framework/runtime"
	perf "k8s.io/kubernetes/test/integration/scheduler_perf"

	"github.com/carve-dra/carve/scheduler/pkg/sharefit"
	"github.com/carve-dra/carve/scheduler/pkg/topology"
)

// Environment that drives the benchmark.
const (
	// enableEnv, set to anything, runs the benchmark; without it, it skips.
	enableEnv = "CARVE_SCHEDULER_PERF"
	// nodesEnv is the cluster sizes to run, comma-separated (100,500).
	nodesEnv = "CARVE_PERF_NODES"
	// runEnv, a regular expression, narrows the workloads to those whose
	// <Case>/<Workload> it matches.
	runEnv = "CARVE_PERF_RUN"
	// outEnv is the directory for the harness's data items, the generated
	// config and table.md (default: a temporary directory).
	outEnv = "CARVE_PERF_OUT"
	// repeatEnv is how many times each workload runs under each scheduler
	// (1); the table shows medians.
	repeatEnv = "CARVE_PERF_REPEAT"
	// k8sDirEnv is the k8s.io/kubernetes module's directory (default: what
	// `go list -m` says).
	k8sDirEnv = "CARVE_PERF_K8S_DIR"
)

// topic is the harness's topic name for this benchmark: it names the data
// items file, and no upstream threshold is keyed by it.
const topic = "carve"

func TestMain(m *testing.M) {
	// The harness takes over the flag set (its logging and label filter
	// flags) and parses it; every test binary that links it must.
	if err := perf.InitTests(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Exit(m.Run())
}

// BenchmarkSchedulerPerf runs each selected workload twice in a row, stock
// then carve, each on a fresh etcd, API server and scheduler, so that both
// see the same machine load as nearly as can be.
func BenchmarkSchedulerPerf(b *testing.B) {
	if os.Getenv(enableEnv) == "" {
		b.Skipf("set %s=1 to run the scheduler_perf comparison (make scheduler-perf)", enableEnv)
	}
	if _, err := exec.LookPath("etcd"); err != nil {
		b.Fatalf("the harness starts etcd from PATH: %v", err)
	}
	sel, err := selectionFromEnv()
	if err != nil {
		b.Fatal(err)
	}
	k8sDir, err := kubernetesDir()
	if err != nil {
		b.Fatal(err)
	}
	out := os.Getenv(outEnv)
	if out == "" {
		out = b.TempDir()
	}
	out, err = filepath.Abs(out)
	if err != nil {
		b.Fatal(err)
	}
	// The data items file is found by topic; one run's directory holds one.
	if old, _ := filepath.Glob(filepath.Join(out, "*_benchmark_"+topic+"_*.json")); len(old) > 0 {
		b.Fatalf("%s already holds a data items file (%s): use an empty directory", out, old[0])
	}
	workloads, skips, err := buildConfig(out, k8sDir, sel)
	if err != nil {
		b.Fatal(err)
	}
	repeats, err := repeatsFromEnv()
	if err != nil {
		b.Fatal(err)
	}
	cases, runs := expand(workloads, repeats)
	if len(cases) == 0 {
		b.Fatalf("no workload selected (%s=%v, %s=%q)", nodesEnv, sel.Sizes, runEnv, os.Getenv(runEnv))
	}
	// The harness collects plugin metrics for the plugins it names; carve's
	// join them, so the data items show their time too.
	metrics := collectedMetrics(append(slices.Clone(perf.PluginNames), sharefit.Name, topology.Name))
	for i := range cases {
		cases[i].MetricsCollectorConfig = metrics
	}
	config, err := writeConfig(out, cases)
	if err != nil {
		b.Fatal(err)
	}
	if err := flag.Set("data-items-dir", out); err != nil {
		b.Fatal(err)
	}
	registry := frameworkruntime.Registry{sharefit.Name: sharefit.New, topology.Name: topology.New}
	rec := newRecorder()
	perf.RunBenchmarkPerfScheduling(b, config, topic, registry, perf.WithPrepareFn(rec.prepare))

	items, err := readDataItems(out, topic)
	if err != nil {
		b.Fatal(err)
	}
	results := collect(runs, items, rec)
	for _, p := range check(results) {
		b.Error(p)
	}
	var table strings.Builder
	writeTable(&table, results, skips)
	if err := os.WriteFile(filepath.Join(out, "table.md"), []byte(table.String()), 0o600); err != nil {
		b.Fatal(err)
	}
	b.Logf("%s\n%s", filepath.Join(out, "table.md"), table.String())
}

// buildConfig writes the carve scheduler configurations and carve's own
// case's templates under out, and returns the selected workloads of the
// upstream cases and carve's, in order, and the upstream ones that cannot run.
func buildConfig(out, k8sDir string, sel selection) ([]workload, []skipped, error) {
	upstreamConfig := filepath.Join(out, "carve-scheduler-upstream.yaml")
	if err := os.WriteFile(upstreamConfig, []byte(carveSchedulerConfig(upstreamDriver)), 0o600); err != nil {
		return nil, nil, err
	}
	var workloads []workload
	var skips []skipped
	for _, u := range upstreamCases {
		path := filepath.Join(k8sDir, "test/integration/scheduler_perf", u.file)
		w, s, err := loadUpstream(path, u.name, sel, upstreamConfig)
		if err != nil {
			return nil, nil, err
		}
		workloads, skips = append(workloads, w...), append(skips, s...)
	}
	carveDir := filepath.Join(out, "carve-templates")
	if err := os.MkdirAll(carveDir, 0o750); err != nil {
		return nil, nil, err
	}
	carveConfig := filepath.Join(out, "carve-scheduler.yaml")
	if err := os.WriteFile(carveConfig, []byte(carveSchedulerConfig(carveDriver)), 0o600); err != nil {
		return nil, nil, err
	}
	w, err := writeCarveCase(carveDir, sel, carveConfig)
	if err != nil {
		return nil, nil, err
	}
	return append(workloads, w...), skips, nil
}

func repeatsFromEnv() (int, error) {
	v := os.Getenv(repeatEnv)
	if v == "" {
		return 1, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		return 0, fmt.Errorf("%s=%q: not a positive count", repeatEnv, v)
	}
	return n, nil
}

func selectionFromEnv() (selection, error) {
	var sel selection
	sizes := os.Getenv(nodesEnv)
	if sizes == "" {
		sizes = "100,500"
	}
	for _, s := range strings.Split(sizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n <= 0 {
			return sel, fmt.Errorf("%s=%q: %q is not a node count", nodesEnv, sizes, s)
		}
		sel.Sizes = append(sel.Sizes, n)
	}
	if m := os.Getenv(runEnv); m != "" {
		re, err := regexp.Compile(m)
		if err != nil {
			return sel, fmt.Errorf("%s: %w", runEnv, err)
		}
		sel.Match = re
	}
	return sel, nil
}

// kubernetesDir is the pinned k8s.io/kubernetes module's directory, where
// the upstream configs and templates are.
func kubernetesDir() (string, error) {
	if d := os.Getenv(k8sDirEnv); d != "" {
		return d, nil
	}
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "k8s.io/kubernetes").Output()
	if err != nil {
		return "", fmt.Errorf("go list -m k8s.io/kubernetes (or set %s): %w", k8sDirEnv, err)
	}
	return strings.TrimSpace(string(out)), nil
}
