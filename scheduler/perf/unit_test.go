package perf

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"text/template"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/carve-dra/carve/scheduler/pkg/fixture"
)

// These tests run in every `go test ./...`: they check what the benchmark
// builds and computes without starting a control plane.

// upstreamSample is a config in the upstream form: a template with a
// parameter that has a default and two without, workloads of the plain
// sizes (one lacking a parameter), a variant and a threshold by topic.
const upstreamSample = `
- name: Other
  workloadTemplate: [{opcode: createNodes, countParam: $n}]
  workloads: [{name: empty_100nodes, params: {n: 1}}]
- name: Sample
  featureGates: {DynamicResourceAllocation: true}
  labels: [dra]
  workloadTemplate:
  - opcode: createNodes
    nodeTemplatePath: ../templates/node.yaml
    countParam: $nodesWithDRA
  - opcode: createAny
    templatePath: ../templates/resourceclaimtemplate-consumablecapacity.yaml
    templateParams: {numRequests: $numRequests|1}
  - opcode: createPods
    countParam: $measurePods
    podTemplatePath: /abs/pod.yaml
    collectMetrics: true
  workloads:
  - name: fast
    params: {nodesWithDRA: 1, measurePods: 1}
  - name: half_100nodes
    featureGates: {DRAPartitionableDevices: true}
    params: {nodesWithDRA: 100, measurePods: 10}
  - name: empty_100nodes
    params: {nodesWithDRA: 100}
  - name: full_500nodes
    threshold: {dra: 60}
    params: {nodesWithDRA: 500, measurePods: 10}
  - name: selector_empty_500nodes
    params: {nodesWithDRA: 500, measurePods: 10}
`

func TestLoadUpstream(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "dra", "consumablecapacity")
	if err := os.MkdirAll(dir, 0o750); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "performance-config.yaml")
	if err := os.WriteFile(path, []byte(upstreamSample), 0o600); err != nil {
		t.Fatal(err)
	}
	workloads, skips, err := loadUpstream(path, "Sample", selection{Sizes: []int{100, 500}}, "/carve.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cases, runs := expand(workloads, 2)
	var keys []string
	for _, r := range runs {
		keys = append(keys, r.Key())
		if !r.Shares {
			t.Errorf("%s: a consumable capacity template, but Shares is false", r.Key())
		}
	}
	// Repetitions outermost, the order of the two alternating.
	want := []string{
		"Sample/half_100nodes/stock/1", "Sample/half_100nodes/carve/1", "Sample/full_500nodes/stock/1", "Sample/full_500nodes/carve/1",
		"Sample/half_100nodes/carve/2", "Sample/half_100nodes/stock/2", "Sample/full_500nodes/carve/2", "Sample/full_500nodes/stock/2",
	}
	if strings.Join(keys, " ") != strings.Join(want, " ") {
		t.Fatalf("runs %v, want %v", keys, want)
	}
	if len(skips) != 1 || skips[0].Workload != "Sample/empty_100nodes" || !strings.Contains(skips[0].Reason, "measurePods") {
		t.Errorf("skips %+v, want Sample/empty_100nodes for its measurePods", skips)
	}
	if runs[2].Threshold != 60 || runs[0].Threshold != 0 {
		t.Errorf("thresholds %v, %v; want 0 and 60 (dra)", runs[0].Threshold, runs[2].Threshold)
	}
	for i, c := range cases {
		if c.Name != runs[i].Key() {
			t.Errorf("case %d named %s, its run %s", i, c.Name, runs[i].Key())
		}
		if got, want := c.SchedulerConfigPath != "", runs[i].Scheduler == carve; got != want {
			t.Errorf("%s: scheduler config %q", c.Name, c.SchedulerConfigPath)
		}
		if len(c.Workloads) != 1 || c.Workloads[0]["name"] != runWorkload {
			t.Errorf("%s: workloads %v, want one, %s", c.Name, c.Workloads, runWorkload)
		}
		if _, ok := c.Workloads[0]["threshold"]; ok {
			t.Errorf("%s: threshold kept", c.Name)
		}
		if !c.FeatureGates["DynamicResourceAllocation"] {
			t.Errorf("%s: feature gates %v", c.Name, c.FeatureGates)
		}
	}
	if _, ok := cases[0].Workloads[0]["featureGates"]; !ok {
		t.Errorf("half_100nodes lost its workload feature gates")
	}
	ops := cases[0].WorkloadTemplate
	if got, want := ops[0]["nodeTemplatePath"], filepath.Join(filepath.Dir(dir), "templates", "node.yaml"); got != want {
		t.Errorf("node template path %v, want %v", got, want)
	}
	if got := ops[2]["podTemplatePath"]; got != "/abs/pod.yaml" {
		t.Errorf("absolute path rewritten to %v", got)
	}

	// Narrowed by expression and size.
	workloads, _, err = loadUpstream(path, "Sample", selection{Sizes: []int{500}, Match: regexp.MustCompile("full")}, "/carve.yaml")
	if err != nil || len(workloads) != 1 || workloads[0].Name != "full_500nodes" {
		t.Errorf("narrowed: workloads %v, err %v", workloads, err)
	}
	if _, _, err := loadUpstream(path, "Missing", selection{Sizes: []int{100}}, ""); err == nil {
		t.Error("a missing test case: no error")
	}
}

// TestUpstreamCasesExist reads the pinned module's own configs: a Kubernetes
// bump that renames or drops a case, or all its sized workloads, fails here
// rather than in a long benchmark run.
func TestUpstreamCasesExist(t *testing.T) {
	k8s, err := kubernetesDir()
	if err != nil {
		t.Skipf("no k8s.io/kubernetes module directory: %v", err)
	}
	for _, u := range upstreamCases {
		path := filepath.Join(k8s, "test/integration/scheduler_perf", u.file)
		workloads, _, err := loadUpstream(path, u.name, selection{Sizes: []int{100, 500}}, "/carve.yaml")
		if err != nil {
			t.Fatal(err)
		}
		if len(workloads) == 0 {
			t.Errorf("%s %s: no workload at 100 or 500 nodes", u.file, u.name)
		}
	}
}

func TestCarveCase(t *testing.T) {
	dir := t.TempDir()
	workloads, err := writeCarveCase(dir, selection{Sizes: []int{100}}, "/carve.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cases, runs := expand(workloads, 1)
	if len(cases) != 2 || runs[0].Key() != carveCase+"/1000pods_100nodes/stock/1" || runs[1].Scheduler != carve || cases[1].SchedulerConfigPath != "/carve.yaml" {
		t.Fatalf("runs %+v", runs)
	}
	// Every file an op names exists and is an object of a kind.
	for _, op := range cases[0].WorkloadTemplate {
		for k, v := range op {
			if !strings.HasSuffix(k, "Path") {
				continue
			}
			data, err := os.ReadFile(v.(string))
			if err != nil {
				t.Fatalf("%s: %v", k, err)
			}
			if k == "podTemplatePath" {
				continue
			}
			var obj metav1.TypeMeta
			if err := yaml.Unmarshal(data, &obj); err != nil || obj.Kind == "" || obj.APIVersion == "" {
				t.Errorf("%s: kind %q, apiVersion %q, err %v", v, obj.Kind, obj.APIVersion, err)
			}
		}
	}
	// The slice, with .Index given, is the fixture's server on that node.
	var slice resourceapi.ResourceSlice
	render(t, filepath.Join(dir, "slice.yaml"), 7, &slice)
	if *slice.Spec.NodeName != "carve-perf-7" || slice.Spec.Pool.Name != "carve-perf-7" || len(slice.Spec.Devices) != 4 {
		t.Errorf("slice %s: node %s, pool %s, %d devices", slice.Name, *slice.Spec.NodeName, slice.Spec.Pool.Name, len(slice.Spec.Devices))
	}
	var node v1.Node
	render(t, filepath.Join(dir, "node.yaml"), 7, &node)
	if node.Name != "carve-perf-7" {
		t.Errorf("node %s", node.Name)
	}
	// The pods' mix over 30 indexes: 12 NIC shares, 12 GPU shares, 6 both,
	// each size of each kind equally often.
	counts := map[string]int{}
	for i := range 30 {
		var pod v1.Pod
		render(t, filepath.Join(dir, "pod.yaml"), i, &pod)
		var kinds []string
		for _, c := range pod.Spec.ResourceClaims {
			kinds = append(kinds, c.Name)
			counts[*c.ResourceClaimTemplateName]++
		}
		if len(pod.Spec.Containers[0].Resources.Claims) != len(kinds) {
			t.Errorf("pod %d: container claims %v, pod claims %v", i, pod.Spec.Containers[0].Resources.Claims, kinds)
		}
		counts[strings.Join(kinds, "+")]++
	}
	want := map[string]int{"net": 12, "gpu": 12, "net+gpu": 6, "net-0": 6, "net-1": 6, "net-2": 6, "gpu-0": 6, "gpu-1": 6, "gpu-2": 6}
	for k, n := range want {
		if counts[k] != n {
			t.Errorf("%s: %d pods, want %d (all: %v)", k, counts[k], n, counts)
		}
	}
}

// render renders a template file with .Index as the harness does (its Mod
// takes numbers of any type; ints serve here) and decodes it into obj.
func render(t *testing.T, path string, index int, obj any) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	tmpl, err := template.New("t").Funcs(template.FuncMap{"Mod": func(a, b int) int { return a % b }}).Parse(string(data))
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := tmpl.Execute(&buf, map[string]any{"Index": index}); err != nil {
		t.Fatal(err)
	}
	if err := yaml.UnmarshalStrict(buf.Bytes(), obj); err != nil {
		t.Fatalf("%s (index %d): %v\n%s", path, index, err, buf.String())
	}
}

// share allocates one share of device on node to a claim for pod, consuming
// the given capacities.
func share(ns, name, pod, node, device string, consumed map[resourceapi.QualifiedName]string) resourceapi.ResourceClaim {
	c := resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	if pod != "" {
		c.OwnerReferences = []metav1.OwnerReference{{Kind: "Pod", Name: pod}}
	}
	q := map[resourceapi.QualifiedName]resource.Quantity{}
	for n, v := range consumed {
		q[n] = resource.MustParse(v)
	}
	c.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{{
		Request: "r", Driver: fixture.Driver, Pool: node, Device: device, ShareID: ptr.To(types.UID("s-" + name)), ConsumedCapacity: q,
	}}}}
	return c
}

func TestComputePlacement(t *testing.T) {
	var slices []resourceapi.ResourceSlice
	for _, n := range []string{"n1", "n2"} {
		slices = append(slices, *fixture.Server(n, "100G", "80Gi"))
	}
	gpu := func(ns, name, pod, node, dev, mem string) resourceapi.ResourceClaim {
		return share(ns, name, pod, node, dev, map[resourceapi.QualifiedName]string{fixture.Memory: mem})
	}
	nic := func(ns, name, pod, node, dev, bw string) resourceapi.ResourceClaim {
		return share(ns, name, pod, node, dev, map[resourceapi.QualifiedName]string{fixture.Egress: bw, fixture.Ingress: bw})
	}
	claims := []resourceapi.ResourceClaim{
		// p1: GPU and NIC under pci0000:17 on n1: aligned.
		gpu("a", "p1-gpu", "p1", "n1", "gpu-0000-18-00-0", "40Gi"),
		nic("a", "p1-net", "p1", "n1", "nic-0000-19-00-0", "60G"),
		// p2: GPU under :17, NIC under :85 on n2: not aligned.
		gpu("a", "p2-gpu", "p2", "n2", "gpu-0000-18-00-0", "40Gi"),
		nic("a", "p2-net", "p2", "n2", "nic-0000-87-00-0", "60G"),
		// The same pod name in another namespace is another pod: a GPU only.
		gpu("b", "p1-gpu", "p1", "n1", "gpu-0000-86-00-0", "8Gi"),
		// No pod: the harness's own allocation, not counted.
		gpu("a", "init", "", "n1", "gpu-0000-86-00-0", "70Gi"),
	}
	p := computePlacement(slices, claims)
	// GPUs: 88Gi on 3 devices, fits 2 of 80Gi; NICs: 120G on 2, needs 2.
	if p.Claims != 5 || p.Used != 5 || p.Minimum != 4 {
		t.Errorf("claims %d, used %d, minimum %d; want 5, 5, 4", p.Claims, p.Used, p.Minimum)
	}
	if p.Pairs != 2 || p.Aligned != 1 {
		t.Errorf("pairs %d, aligned %d; want 2, 1", p.Pairs, p.Aligned)
	}
	if strings.Join(p.Drivers, ",") != fixture.Driver {
		t.Errorf("drivers %v", p.Drivers)
	}

	// A whole device counts one; a claim of two distinct shared devices
	// needs two, however small.
	whole := share("a", "w", "p3", "n1", "nic-0000-87-00-0", nil)
	whole.Status.Allocation.Devices.Results[0].ShareID = nil
	two := gpu("a", "two", "p4", "n2", "gpu-0000-86-00-0", "1Gi")
	two.Status.Allocation.Devices.Results = append(two.Status.Allocation.Devices.Results, gpu("a", "x", "p4", "n1", "gpu-0000-86-00-0", "1Gi").Status.Allocation.Devices.Results...)
	p = computePlacement(slices, []resourceapi.ResourceClaim{whole, two})
	if p.Used != 3 || p.Minimum != 3 || p.Pairs != 0 {
		t.Errorf("used %d, minimum %d, pairs %d; want 3, 3, 0", p.Used, p.Minimum, p.Pairs)
	}
}

func TestRunKey(t *testing.T) {
	if got := runKey("BenchmarkSchedulerPerf/CarveShares/1000pods_100nodes/carve/1/" + runWorkload); got != "CarveShares/1000pods_100nodes/carve/1" {
		t.Errorf("runKey: %s", got)
	}
}

func TestReport(t *testing.T) {
	w := workload{Case: "C", Name: "half_100nodes", Nodes: 100, Threshold: 56, Shares: true}
	var runs []run
	for rep := 1; rep <= 3; rep++ {
		runs = append(runs, run{workload: w, Scheduler: stock, Rep: rep}, run{workload: w, Scheduler: carve, Rep: rep})
	}
	through := func(name string, v float64) dataItem {
		return dataItem{Labels: map[string]string{"Metric": "SchedulingThroughput", "Name": name}, Data: map[string]float64{"Average": v}}
	}
	items := []dataItem{
		// Paired carve/stock: 0.75, 0.5, 1.0; median 0.75.
		through("BenchmarkSchedulerPerf/C/half_100nodes/stock/1/run/test", 80),
		through("BenchmarkSchedulerPerf/C/half_100nodes/carve/1/run/test", 60),
		through("C/half_100nodes/stock/2/run/test", 100),
		through("C/half_100nodes/carve/2/run/test", 50),
		through("C/half_100nodes/stock/3/run/test", 40),
		through("C/half_100nodes/carve/3/run/test", 40),
		// Repetition 10's name extends 1's: it must not match it.
		through("C/half_100nodes/carve/10/run/test", 1),
		{Labels: map[string]string{"Metric": "scheduler_plugin_execution_duration_seconds", "plugin": "DynamicResources", "extension_point": "Filter", "Name": "C/half_100nodes/carve/1/run/test"}, Data: map[string]float64{"Average": 0.25}},
		// Score was sampled in carve's first and second runs, ShareFit's
		// in the second only; in the third no Score was.
		{Labels: map[string]string{"Metric": "scheduler_plugin_execution_duration_seconds", "plugin": "DynamicResources", "extension_point": "Score", "Name": "C/half_100nodes/carve/1/run/test"}, Data: map[string]float64{"Average": 0.001}},
		{Labels: map[string]string{"Metric": "scheduler_plugin_execution_duration_seconds", "plugin": "DynamicResources", "extension_point": "Score", "Name": "C/half_100nodes/carve/2/run/test"}, Data: map[string]float64{"Average": 0.001}},
		{Labels: map[string]string{"Metric": "scheduler_plugin_execution_duration_seconds", "plugin": "ShareFit", "extension_point": "Score", "Name": "C/half_100nodes/carve/2/run/test"}, Data: map[string]float64{"Average": 0.002}},
	}
	rec := newRecorder()
	for rep, used := range []int{12, 11, 15} {
		rec.runs[fmt.Sprintf("C/half_100nodes/stock/%d", rep+1)] = placement{Claims: 10, Used: used, Minimum: 10, Drivers: []string{upstreamDriver}}
	}
	rec.runs["C/half_100nodes/carve/1"] = placement{Claims: 10, Used: 10, Minimum: 10, Drivers: []string{"other.driver"}}
	results := collect(runs, items, rec)
	if results[1].PodsPerSec != 60 || results[1].FilterMs != 0.25 || results[0].FilterMs != 0 {
		t.Errorf("results %+v", results)
	}
	problems := strings.Join(check(results), "\n")
	for _, want := range []string{"C/half_100nodes/carve/1: no ShareFit Score", "devices of driver other.driver", "C/half_100nodes/carve/2: placement not measured"} {
		if !strings.Contains(problems, want) {
			t.Errorf("problems %q lack %q", problems, want)
		}
	}
	for _, unwanted := range []string{"carve/2: no ShareFit", "carve/3: no ShareFit", "stock/1: no ShareFit"} {
		if strings.Contains(problems, unwanted) {
			t.Errorf("problems %q hold %q", problems, unwanted)
		}
	}
	var b strings.Builder
	writeTable(&b, results, []skipped{{Workload: "C/empty_100nodes", Reason: "upstream gives no measurePods"}})
	for _, want := range []string{
		"| C/half_100nodes | 100 | 3 | 80.0 | 50.0 | 0.75 | 1.20 (12 / 10) | 1.00 (10 / 10) | — | — | — | 0.250 | 56 |",
		"Not run: C/empty_100nodes",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, b.String())
		}
	}
}
